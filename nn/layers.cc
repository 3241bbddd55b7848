// layers.cc: constructors (parameter registration + PyTorch's initialisation)
// and forward() of the standard layers. Backward needs nothing here: each
// forward is built from autograd/functions.h ops, which record their own rules.
#include "nn/layers.h"

#include <cmath>
#include <sstream>

#include "autograd/autocast.h"
#include "autograd/autograd.h"
#include "autograd/functions.h"
#include "tensor/checks.h"

namespace ringtrain::nn {

namespace {
// U(-bound, bound) with bound = 1/sqrt(fan_in): both kaiming_uniform_(a=sqrt(5))
// for weights (gain sqrt(2/(1+5)) * sqrt(3/fan_in)) and PyTorch's bias init.
Tensor uniform_fan_in(const Shape& shape, int64_t fan_in, Generator& gen) {
  Tensor t = Tensor::empty(shape);
  double bound = fan_in > 0 ? 1.0 / std::sqrt(static_cast<double>(fan_in)) : 0.0;
  uniform_(t, -bound, bound, gen);
  return t;
}

std::string bool_str(bool b) { return b ? "true" : "false"; }

const char* dtype_enum(DType d) {
  switch (d) {
    case DType::kFloat32: return "DType::kFloat32";
    case DType::kFloat64: return "DType::kFloat64";
    case DType::kFloat16: return "DType::kFloat16";
    case DType::kBFloat16: return "DType::kBFloat16";
    case DType::kInt32: return "DType::kInt32";
    case DType::kInt64: return "DType::kInt64";
  }
  return "DType::?";
}

// A layer's input must be floating point and, outside autocast (whose casts make
// half inputs meet float32 weights on purpose), of the dtype of the layer's
// parameters (`like`: a weight or a running statistic), on their device. Checked
// up front so the error names the layer, not the first kernel that trips over it.
void check_layer_input(const std::string& layer, const Tensor& input, const Tensor& like) {
  RT_CHECK(input.defined(), layer, ": the input is an undefined Tensor");
  RT_CHECK(is_floating_point(input.dtype()), layer, ": the input is ", input.describe(), ", but ", layer,
           " computes in floating point; convert the input (input.to(",
           dtype_enum(like.defined() ? like.dtype() : DType::kFloat32), "))");
  if (!like.defined()) return;
  RT_CHECK(input.device() == like.device(), layer, ": the input ", input.describe(), " is on ",
           input.device().str(), " but the layer's parameters are on ", like.device().str(),
           "; move the module there (module->to(Device)) or the input (input.to(", like.device().str(), "))");
  if (autograd::autocast_enabled()) return;
  RT_CHECK(input.dtype() == like.dtype(), layer, ": the input is ", input.describe(), " but the layer's "
           "parameters are ", dtype_name(like.dtype()), "; move the module to the input's dtype (module->to(",
           dtype_enum(input.dtype()), ")) or convert the input (input.to(", dtype_enum(like.dtype()), "))");
}
}  // namespace

// ---------------------------------------------------------------- Linear

Linear::Linear(int64_t in_features, int64_t out_features, bool bias, Generator& gen)
    : Cloneable("Linear"), in_features_(in_features), out_features_(out_features), has_bias_(bias) {
  RT_CHECK(in_features > 0 && out_features > 0, "Linear: features must be positive, got in=",
           in_features, " out=", out_features);
  weight_ = register_parameter("weight", uniform_fan_in({out_features, in_features}, in_features, gen));
  if (bias) bias_ = register_parameter("bias", uniform_fan_in({out_features}, in_features, gen));
}

Tensor Linear::forward(const Tensor& input) {
  check_layer_input(type_name(), input, param(weight_));
  return ag::linear(input, param(weight_), has_bias_ ? param(bias_) : Tensor());
}

Tensor& Linear::bias() {
  RT_CHECK(has_bias_, "Linear: this layer was built with bias=false");
  return param(bias_);
}

std::string Linear::extra_repr() const {
  std::ostringstream os;
  os << "in_features=" << in_features_ << ", out_features=" << out_features_
     << ", bias=" << bool_str(has_bias_);
  return os.str();
}

// ---------------------------------------------------------------- Conv2d

Conv2d::Conv2d(int64_t in_channels, int64_t out_channels, int64_t kernel_size, int64_t stride,
               int64_t padding, bool bias, Generator& gen, int64_t dilation, int64_t groups)
    : Cloneable("Conv2d"), in_channels_(in_channels), out_channels_(out_channels),
      kernel_size_(kernel_size), has_bias_(bias) {
  RT_CHECK(in_channels > 0 && out_channels > 0 && kernel_size > 0 && groups > 0 &&
               in_channels % groups == 0 && out_channels % groups == 0,
           "Conv2d: invalid sizes in=", in_channels, " out=", out_channels, " kernel=", kernel_size,
           " groups=", groups, " (all must be positive, and groups must divide in and out)");
  RT_CHECK(stride > 0 && padding >= 0 && dilation > 0, "Conv2d: invalid stride=", stride, " padding=", padding,
           " dilation=", dilation, " (need stride >= 1, padding >= 0, dilation >= 1)");
  params_.stride_h = params_.stride_w = stride;
  params_.pad_h = params_.pad_w = padding;
  params_.dilation_h = params_.dilation_w = dilation;
  params_.groups = groups;
  int64_t fan_in = in_channels / groups * kernel_size * kernel_size;
  weight_ = register_parameter(
      "weight", uniform_fan_in({out_channels, in_channels / groups, kernel_size, kernel_size}, fan_in, gen));
  if (bias) bias_ = register_parameter("bias", uniform_fan_in({out_channels}, fan_in, gen));
}

Tensor Conv2d::forward(const Tensor& input) {
  check_layer_input(type_name(), input, param(weight_));
  return ag::conv2d(input, param(weight_), has_bias_ ? param(bias_) : Tensor(), params_);
}

std::string Conv2d::extra_repr() const {
  std::ostringstream os;
  os << in_channels_ << ", " << out_channels_ << ", kernel_size=" << kernel_size_
     << ", stride=" << params_.stride_h << ", padding=" << params_.pad_h;
  // Like PyTorch's repr, the settings left at their defaults are not shown.
  if (params_.dilation_h != 1) os << ", dilation=" << params_.dilation_h;
  if (params_.groups != 1) os << ", groups=" << params_.groups;
  if (!has_bias_) os << ", bias=false";
  return os.str();
}

// ---------------------------------------------------------------- pooling

namespace {
Pool2dParams pool_params(const char* name, int64_t kernel, int64_t stride, int64_t padding) {
  RT_CHECK(kernel > 0 && stride >= 0 && padding >= 0 && padding * 2 <= kernel, name,
           ": invalid kernel_size=", kernel, " stride=", stride, " padding=", padding);
  Pool2dParams p;
  p.kernel_h = p.kernel_w = kernel;
  p.stride_h = p.stride_w = stride == 0 ? kernel : stride;
  p.pad_h = p.pad_w = padding;
  return p;
}
std::string pool_repr(const Pool2dParams& p) {
  std::ostringstream os;
  os << "kernel_size=" << p.kernel_h << ", stride=" << p.stride_h << ", padding=" << p.pad_h;
  return os.str();
}
}  // namespace

MaxPool2d::MaxPool2d(int64_t kernel_size, int64_t stride, int64_t padding)
    : Cloneable("MaxPool2d"), params_(pool_params("MaxPool2d", kernel_size, stride, padding)) {}
Tensor MaxPool2d::forward(const Tensor& input) { return ag::max_pool2d(input, params_); }
std::string MaxPool2d::extra_repr() const { return pool_repr(params_); }

AvgPool2d::AvgPool2d(int64_t kernel_size, int64_t stride, int64_t padding)
    : Cloneable("AvgPool2d"), params_(pool_params("AvgPool2d", kernel_size, stride, padding)) {}
Tensor AvgPool2d::forward(const Tensor& input) { return ag::avg_pool2d(input, params_); }
std::string AvgPool2d::extra_repr() const { return pool_repr(params_); }

// ---------------------------------------------------------------- BatchNorm

BatchNorm::BatchNorm(std::string type_name, int64_t num_features, int64_t dim_min, int64_t dim_max,
                     double eps, double momentum, bool affine)
    : Cloneable(std::move(type_name)), num_features_(num_features), dim_min_(dim_min), dim_max_(dim_max),
      eps_(eps), momentum_(momentum), affine_(affine) {
  RT_CHECK(num_features > 0, this->type_name(), ": num_features must be positive, got ", num_features);
  RT_CHECK(std::isfinite(eps) && eps >= 0, this->type_name(), ": eps (added to the variance) must be finite "
           "and >= 0, got ", eps, " (PyTorch's default: 1e-5)");
  RT_CHECK(momentum >= 0 && momentum <= 1, this->type_name(), ": momentum (the running statistics' update "
           "weight) must be in [0, 1], got ", momentum, " (PyTorch's default: 0.1)");
  if (affine) {
    weight_ = register_parameter("weight", ones({num_features}));
    bias_ = register_parameter("bias", zeros({num_features}));
  }
  running_mean_ = register_buffer("running_mean", zeros({num_features}));
  running_var_ = register_buffer("running_var", ones({num_features}));
  num_batches_tracked_ = register_buffer("num_batches_tracked", zeros({}, DType::kInt64));
}

Tensor BatchNorm::forward(const Tensor& input) {
  check_layer_input(type_name(), input, buffer(running_mean_));
  RT_CHECK(input.dim() >= dim_min_ && input.dim() <= dim_max_ && input.size(1) == num_features_,
           type_name(), ": expected input of rank ", dim_min_, dim_min_ == dim_max_ ? "" : " or ",
           dim_min_ == dim_max_ ? "" : std::to_string(dim_max_), " with ", num_features_,
           " channels in dim 1, got ", input.describe());
  if (is_training()) {
    Tensor& count = buffer(num_batches_tracked_);
    add_(count, ones({}, DType::kInt64, count.device()));
  }
  return ag::batch_norm(input, affine_ ? param(weight_) : Tensor(), affine_ ? param(bias_) : Tensor(),
                        buffer(running_mean_), buffer(running_var_), is_training(), momentum_, eps_);
}

std::string BatchNorm::extra_repr() const {
  std::ostringstream os;
  os << num_features_ << ", eps=" << eps_ << ", momentum=" << momentum_ << ", affine=" << bool_str(affine_);
  return os.str();
}

// ---------------------------------------------------------------- LayerNorm

LayerNorm::LayerNorm(Shape normalized_shape, double eps, bool elementwise_affine)
    : Cloneable("LayerNorm"), normalized_shape_(std::move(normalized_shape)), eps_(eps),
      affine_(elementwise_affine) {
  RT_CHECK(!normalized_shape_.empty(), "LayerNorm: normalized_shape must not be empty");
  for (int64_t d : normalized_shape_)
    RT_CHECK(d > 0, "LayerNorm: every size in normalized_shape must be positive, got ",
             shape_str(normalized_shape_), " (the sizes of the input's last dims)");
  RT_CHECK(std::isfinite(eps) && eps >= 0, "LayerNorm: eps (added to the variance) must be finite and >= 0, "
           "got ", eps, " (PyTorch's default: 1e-5)");
  if (affine_) {
    weight_ = register_parameter("weight", ones(normalized_shape_));
    bias_ = register_parameter("bias", zeros(normalized_shape_));
  }
}

Tensor LayerNorm::forward(const Tensor& input) {
  check_layer_input(type_name(), input, affine_ ? param(weight_) : Tensor());
  return ag::layer_norm(input, normalized_shape_, affine_ ? param(weight_) : Tensor(),
                        affine_ ? param(bias_) : Tensor(), eps_);
}

std::string LayerNorm::extra_repr() const {
  std::ostringstream os;
  os << shape_str(normalized_shape_) << ", eps=" << eps_ << ", elementwise_affine=" << bool_str(affine_);
  return os.str();
}

// ---------------------------------------------------------------- Dropout

Dropout::Dropout(double p) : Cloneable("Dropout"), p_(p), own_generator_(false) {
  RT_CHECK(p >= 0.0 && p <= 1.0, "Dropout: p must be in [0, 1], got ", p);
}
Dropout::Dropout(double p, uint64_t seed)
    : Cloneable("Dropout"), p_(p), own_generator_(true), generator_(seed) {
  RT_CHECK(p >= 0.0 && p <= 1.0, "Dropout: p must be in [0, 1], got ", p);
}
Tensor Dropout::forward(const Tensor& input) { return ag::dropout(input, p_, is_training(), generator()); }
std::string Dropout::extra_repr() const {
  std::ostringstream os;  // not std::to_string: its fixed 6 decimals print p = 1e-7 as 0.000000
  os << "p=" << p_;
  return os.str();
}
std::vector<std::pair<std::string, Generator*>> Dropout::own_generators() {
  if (!own_generator_) return {};
  return {{"generator", &generator_}};
}

// ---------------------------------------------------------------- Embedding

Embedding::Embedding(int64_t num_embeddings, int64_t embedding_dim, Generator& gen)
    : Cloneable("Embedding"), num_embeddings_(num_embeddings), embedding_dim_(embedding_dim) {
  RT_CHECK(num_embeddings > 0 && embedding_dim > 0, "Embedding: sizes must be positive, got ",
           num_embeddings, " x ", embedding_dim);
  Tensor w = Tensor::empty({num_embeddings, embedding_dim});
  normal_(w, 0.0, 1.0, gen);
  weight_ = register_parameter("weight", w);
}
Tensor Embedding::forward(const Tensor& indices) { return ag::embedding(param(weight_), indices); }
std::string Embedding::extra_repr() const {
  return std::to_string(num_embeddings_) + ", " + std::to_string(embedding_dim_);
}

// ---------------------------------------------------------------- activations, Flatten

Tensor ReLU::forward(const Tensor& input) { return ag::relu(input); }
Tensor GELU::forward(const Tensor& input) { return ag::gelu(input); }
Tensor Tanh::forward(const Tensor& input) { return ag::tanh(input); }
Tensor Flatten::forward(const Tensor& input) { return ag::flatten(input, start_dim_, end_dim_); }

// ---------------------------------------------------------------- Sequential

Sequential::Sequential(std::vector<std::shared_ptr<Module>> modules) : Cloneable("Sequential") {
  for (auto& m : modules) push_back(std::move(m));
}

Sequential& Sequential::push_back(std::shared_ptr<Module> module) {
  register_module(std::to_string(num_children()), std::move(module));
  return *this;
}

Tensor Sequential::forward(const Tensor& input) {
  Tensor x = input;
  for (size_t i = 0; i < num_children(); ++i) x = child_at(i).forward(x);
  return x;
}

}  // namespace ringtrain::nn
