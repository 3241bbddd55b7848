// reference.cc: naive float64 reference implementations for the tensor tests.
// See reference.h. Every function is a direct transcription of the op's definition
// over multi-indices; speed is irrelevant (test shapes are small).
#include "tests/tensor/reference.h"

#include <algorithm>
#include <cmath>
#include <exception>
#include <limits>
#include <numeric>
#include <random>
#include <sstream>

namespace ringtrain::ref {

namespace {

int64_t wrap(int64_t dim, int64_t ndim) {
  if (dim < 0) dim += ndim;
  if (dim < 0 || dim >= std::max<int64_t>(ndim, 1)) {
    throw std::out_of_range("reference: dim " + std::to_string(dim) + " out of range for rank " +
                            std::to_string(ndim));
  }
  return dim;
}

std::string index_str(const Index& index) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < index.size(); ++i) os << (i ? ", " : "") << index[i];
  os << "]";
  return os.str();
}

const double kInf = std::numeric_limits<double>::infinity();

}  // namespace

// ---------------------------------------------------------------- RefTensor

RefTensor::RefTensor(Shape s, double value)
    : shape(std::move(s)), data(static_cast<size_t>(shape_numel(shape)), value) {}

RefTensor::RefTensor(Shape s, std::vector<double> values) : shape(std::move(s)), data(std::move(values)) {
  if (static_cast<int64_t>(data.size()) != shape_numel(shape)) {
    throw std::invalid_argument("RefTensor: " + std::to_string(data.size()) +
                                " values do not fill shape " + shape_str(shape));
  }
}

int64_t RefTensor::linear(const Index& index) const {
  int64_t off = 0;
  for (size_t d = 0; d < shape.size(); ++d) off = off * shape[d] + index[d];
  return off;
}

void for_each_index(const Shape& shape, const std::function<void(const Index&)>& fn) {
  if (shape_numel(shape) == 0) return;
  Index index(shape.size(), 0);
  while (true) {
    fn(index);
    int64_t d = static_cast<int64_t>(shape.size()) - 1;
    for (; d >= 0; --d) {
      if (++index[static_cast<size_t>(d)] < shape[static_cast<size_t>(d)]) break;
      index[static_cast<size_t>(d)] = 0;
    }
    if (d < 0) return;
  }
}

double round_to_dtype(double value, DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return static_cast<float>(value);
    case DType::kFloat64: return value;
    case DType::kFloat16: return half_bits_to_float(float_to_half_bits(static_cast<float>(value)));
    case DType::kBFloat16:
      return bfloat16_bits_to_float(float_to_bfloat16_bits(static_cast<float>(value)));
    case DType::kInt32: return static_cast<double>(static_cast<int32_t>(value));
    case DType::kInt64: return static_cast<double>(static_cast<int64_t>(value));
  }
  return value;
}

// ---------------------------------------------------------------- element access

namespace {
char* element_address(const Tensor& t, const Index& index) {
  if (!t.device().is_cpu()) {
    throw std::invalid_argument("reference get/set_element: tensor is on " + t.device().str() +
                                ", not the CPU");
  }
  if (static_cast<int64_t>(index.size()) != t.dim()) {
    throw std::invalid_argument("reference get/set_element: index " + index_str(index) +
                                " for a " + t.describe());
  }
  int64_t off = 0;
  for (size_t d = 0; d < index.size(); ++d) {
    if (index[d] < 0 || index[d] >= t.shape()[d]) {
      throw std::out_of_range("reference get/set_element: index " + index_str(index) +
                              " out of range for " + t.describe());
    }
    off += index[d] * t.strides()[d];
  }
  return static_cast<char*>(t.data_ptr()) + off * static_cast<int64_t>(dtype_size(t.dtype()));
}
}  // namespace

double get_element(const Tensor& t, const Index& index) {
  const char* p = element_address(t, index);
  switch (t.dtype()) {
    case DType::kFloat32: return *reinterpret_cast<const float*>(p);
    case DType::kFloat64: return *reinterpret_cast<const double*>(p);
    case DType::kFloat16: return half_bits_to_float(*reinterpret_cast<const uint16_t*>(p));
    case DType::kBFloat16: return bfloat16_bits_to_float(*reinterpret_cast<const uint16_t*>(p));
    case DType::kInt32: return *reinterpret_cast<const int32_t*>(p);
    case DType::kInt64: return static_cast<double>(*reinterpret_cast<const int64_t*>(p));
  }
  return 0.0;
}

void set_element(const Tensor& t, const Index& index, double value) {
  char* p = element_address(t, index);
  switch (t.dtype()) {
    case DType::kFloat32: *reinterpret_cast<float*>(p) = static_cast<float>(value); break;
    case DType::kFloat64: *reinterpret_cast<double*>(p) = value; break;
    case DType::kFloat16:
      *reinterpret_cast<uint16_t*>(p) = float_to_half_bits(static_cast<float>(value));
      break;
    case DType::kBFloat16:
      *reinterpret_cast<uint16_t*>(p) = float_to_bfloat16_bits(static_cast<float>(value));
      break;
    case DType::kInt32: *reinterpret_cast<int32_t*>(p) = static_cast<int32_t>(value); break;
    case DType::kInt64: *reinterpret_cast<int64_t*>(p) = static_cast<int64_t>(value); break;
  }
}

RefTensor to_ref(const Tensor& t_in) {
  Tensor t = t_in.device().is_cpu() ? t_in : t_in.to(Device::cpu());
  RefTensor r(t.shape());
  int64_t i = 0;
  for_each_index(t.shape(), [&](const Index& idx) { r.data[static_cast<size_t>(i++)] = get_element(t, idx); });
  return r;
}

Tensor from_ref(const RefTensor& r, DType dtype, Device device) {
  Tensor t = Tensor::empty(r.shape, dtype, Device::cpu());
  int64_t i = 0;
  for_each_index(r.shape, [&](const Index& idx) { set_element(t, idx, r.data[static_cast<size_t>(i++)]); });
  return device.is_cpu() ? t : t.to(device);
}

// ---------------------------------------------------------------- seeded inputs

namespace {
// Fills every element of a CPU tensor (through its strides) with seeded values.
void fill_random(const Tensor& t, uint64_t seed, double lo, double hi) {
  std::mt19937_64 rng(seed);
  if (is_floating_point(t.dtype())) {
    std::uniform_real_distribution<double> dist(lo, hi);
    for_each_index(t.shape(), [&](const Index& idx) { set_element(t, idx, dist(rng)); });
  } else {
    std::uniform_int_distribution<int64_t> dist(static_cast<int64_t>(std::ceil(lo)),
                                                static_cast<int64_t>(std::floor(hi)));
    for_each_index(t.shape(), [&](const Index& idx) {
      set_element(t, idx, static_cast<double>(dist(rng)));
    });
  }
}
}  // namespace

Tensor random_tensor(const Shape& shape, DType dtype, uint64_t seed, double lo, double hi,
                     Device device) {
  Tensor t = Tensor::empty(shape, dtype, Device::cpu());
  fill_random(t, seed, lo, hi);
  return device.is_cpu() ? t : t.to(device);
}

const char* layout_name(Layout layout) {
  switch (layout) {
    case Layout::kContiguous: return "contiguous";
    case Layout::kTransposed: return "transposed";
    case Layout::kSliced: return "sliced";
    case Layout::kOffset: return "offset";
    case Layout::kPermuted: return "permuted";
  }
  return "?";
}

Tensor random_view(const Shape& shape, DType dtype, uint64_t seed, Layout layout, double lo,
                   double hi, Device device) {
  const int64_t n = static_cast<int64_t>(shape.size());
  if (n == 0) layout = Layout::kContiguous;
  if (n < 2 && (layout == Layout::kTransposed || layout == Layout::kPermuted)) layout = Layout::kSliced;
  Tensor view;
  switch (layout) {
    case Layout::kContiguous:
      return random_tensor(shape, dtype, seed, lo, hi, device);
    case Layout::kTransposed: {
      Shape stored = shape;
      std::swap(stored[n - 1], stored[n - 2]);
      view = Tensor::empty(stored, dtype).transpose(n - 1, n - 2);
      break;
    }
    case Layout::kSliced: {
      Shape stored = shape;
      for (auto& s : stored) s *= 2;
      view = Tensor::empty(stored, dtype);
      for (int64_t d = 0; d < n; ++d) view = view.slice(d, 0, stored[d], 2);
      break;
    }
    case Layout::kOffset: {
      Shape stored = shape;
      if (n == 1) {
        stored[0] += 3;
        view = Tensor::empty(stored, dtype).narrow(0, 2, shape[0]);
      } else {
        stored[0] += 1;
        stored[n - 1] += 3;
        view = Tensor::empty(stored, dtype).narrow(0, 1, shape[0]).narrow(n - 1, 2, shape[n - 1]);
      }
      break;
    }
    case Layout::kPermuted: {
      Shape stored(shape.rbegin(), shape.rend());
      std::vector<int64_t> dims(static_cast<size_t>(n));
      for (int64_t d = 0; d < n; ++d) dims[d] = n - 1 - d;
      view = Tensor::empty(stored, dtype).permute(dims);
      break;
    }
  }
  if (view.shape() != shape) {
    throw std::logic_error("random_view: built " + shape_str(view.shape()) + " instead of " +
                           shape_str(shape) + " for layout " + layout_name(layout));
  }
  // Put garbage in the whole buffer first so a kernel that reads outside the view is caught.
  {
    Tensor whole = Tensor::from_storage(view.storage(), {static_cast<int64_t>(
                                                            view.storage()->nbytes() / dtype_size(dtype))},
                                        {1}, 0, dtype);
    fill_random(whole, seed ^ 0x5bd1e995ULL, 1e3, 2e3);
  }
  fill_random(view, seed, lo, hi);
  return device.is_cpu() ? view : view.to(device);
}

Tensor random_expanded(const Shape& small, const Shape& shape, DType dtype, uint64_t seed,
                       double lo, double hi, Device device) {
  return random_tensor(small, dtype, seed, lo, hi, device).expand(shape);
}

Tensor random_index(const Shape& shape, int64_t bound, uint64_t seed, Device device) {
  return random_tensor(shape, DType::kInt64, seed, 0.0, static_cast<double>(bound - 1), device);
}

// ---------------------------------------------------------------- tolerances

Tolerance tolerance_for(DType dtype) {
  switch (dtype) {
    case DType::kFloat64: return {1e-10, 1e-12};
    case DType::kFloat32: return {2e-5, 1e-6};
    case DType::kFloat16: return {2e-3, 1e-3};
    case DType::kBFloat16: return {1.6e-2, 1e-2};
    case DType::kInt32:
    case DType::kInt64: return {0.0, 0.0};
  }
  return {0.0, 0.0};
}

Tolerance accumulate_tolerance_for(DType dtype, int64_t terms) {
  Tolerance tol = tolerance_for(dtype);
  double acc_eps = dtype == DType::kFloat64 ? 2.3e-16 : 1.2e-7;  // f16/bf16 accumulate in f32
  if (dtype == DType::kInt32 || dtype == DType::kInt64) return tol;
  tol.atol += acc_eps * static_cast<double>(std::max<int64_t>(terms, 1)) * 4.0;
  return tol;
}

// ---------------------------------------------------------------- comparisons

::testing::AssertionResult expect_close(const RefTensor& actual, const RefTensor& expected,
                                        Tolerance tol) {
  if (actual.shape != expected.shape) {
    return ::testing::AssertionFailure() << "shape " << shape_str(actual.shape) << " != expected "
                                         << shape_str(expected.shape);
  }
  int64_t bad = 0;
  std::ostringstream first;
  int64_t i = 0;
  double worst = 0.0;
  for_each_index(expected.shape, [&](const Index& idx) {
    double a = actual.data[static_cast<size_t>(i)];
    double e = expected.data[static_cast<size_t>(i)];
    ++i;
    bool ok;
    if (std::isnan(e)) {
      ok = std::isnan(a);
    } else if (std::isinf(e)) {
      ok = a == e;
    } else {
      double err = std::fabs(a - e);
      ok = err <= tol.atol + tol.rtol * std::fabs(e);  // false for NaN a
      if (std::isfinite(err)) worst = std::max(worst, err);
    }
    if (!ok) {
      if (bad < 5) first << "\n  at " << index_str(idx) << ": got " << a << ", expected " << e;
      ++bad;
    }
  });
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << bad << " of " << expected.numel()
                                       << " elements differ (rtol " << tol.rtol << ", atol "
                                       << tol.atol << ", max finite |err| " << worst << "):"
                                       << first.str();
}

::testing::AssertionResult expect_close(const Tensor& actual, const RefTensor& expected,
                                        Tolerance tol) {
  return expect_close(to_ref(actual), expected, tol);
}

::testing::AssertionResult expect_equal(const Tensor& actual, const RefTensor& expected) {
  return expect_close(to_ref(actual), expected, Tolerance{0.0, 0.0});
}

::testing::AssertionResult throws_with(const std::function<void()>& fn,
                                       const std::vector<std::string>& needles) {
  try {
    fn();
  } catch (const std::exception& e) {
    std::string what = e.what();
    for (const auto& needle : needles) {
      if (what.find(needle) == std::string::npos) {
        return ::testing::AssertionFailure() << "message \"" << what << "\" does not contain \""
                                             << needle << "\"";
      }
    }
    return ::testing::AssertionSuccess();
  }
  return ::testing::AssertionFailure() << "no exception was thrown";
}

// ---------------------------------------------------------------- elementwise

Shape ref_broadcast_shape(const Shape& a, const Shape& b) {
  size_t n = std::max(a.size(), b.size());
  Shape out(n);
  for (size_t i = 0; i < n; ++i) {
    int64_t da = i < n - a.size() ? 1 : a[i - (n - a.size())];
    int64_t db = i < n - b.size() ? 1 : b[i - (n - b.size())];
    if (da != db && da != 1 && db != 1) {
      throw std::invalid_argument("ref_broadcast_shape: " + shape_str(a) + " vs " + shape_str(b));
    }
    out[i] = da == 1 ? db : da;
  }
  return out;
}

RefTensor ref_expand(const RefTensor& r, const Shape& shape) {
  RefTensor out(shape);
  const size_t lead = shape.size() - r.shape.size();
  int64_t i = 0;
  for_each_index(shape, [&](const Index& idx) {
    Index src(r.shape.size());
    for (size_t d = 0; d < r.shape.size(); ++d) src[d] = r.shape[d] == 1 ? 0 : idx[d + lead];
    out.data[static_cast<size_t>(i++)] = r.at(src);
  });
  return out;
}

double ref_unary_value(kernels::UnaryOp op, double x) {
  using kernels::UnaryOp;
  switch (op) {
    case UnaryOp::kNeg: return -x;
    case UnaryOp::kExp: return std::exp(x);
    case UnaryOp::kLog: return std::log(x);
    case UnaryOp::kSqrt: return std::sqrt(x);
    case UnaryOp::kAbs: return std::fabs(x);
    case UnaryOp::kRelu: return x < 0 ? 0.0 : x;  // NaN stays NaN
    case UnaryOp::kGelu: return 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0)));
    case UnaryOp::kGeluGrad:
      return 0.5 * (1.0 + std::erf(x / std::sqrt(2.0))) +
             x * std::exp(-0.5 * x * x) / std::sqrt(2.0 * M_PI);
    case UnaryOp::kTanh: return std::tanh(x);
    case UnaryOp::kSigmoid: return 1.0 / (1.0 + std::exp(-x));
    case UnaryOp::kIsFinite: return std::isfinite(x) ? 1.0 : 0.0;
  }
  return 0.0;
}

double ref_binary_value(kernels::BinaryOp op, double a, double b) {
  using kernels::BinaryOp;
  switch (op) {
    case BinaryOp::kAdd: return a + b;
    case BinaryOp::kSub: return a - b;
    case BinaryOp::kMul: return a * b;
    case BinaryOp::kDiv: return a / b;
    case BinaryOp::kPow: return std::pow(a, b);
    case BinaryOp::kMax: return std::max(a, b);
    case BinaryOp::kMin: return std::min(a, b);
    case BinaryOp::kEq: return a == b;
    case BinaryOp::kNe: return a != b;
    case BinaryOp::kLt: return a < b;
    case BinaryOp::kLe: return a <= b;
    case BinaryOp::kGt: return a > b;
    case BinaryOp::kGe: return a >= b;
  }
  return 0.0;
}

RefTensor ref_unary(kernels::UnaryOp op, const RefTensor& a) {
  RefTensor out = a;
  for (auto& v : out.data) v = ref_unary_value(op, v);
  return out;
}

RefTensor ref_binary(kernels::BinaryOp op, const RefTensor& a, const RefTensor& b) {
  Shape shape = ref_broadcast_shape(a.shape, b.shape);
  RefTensor ea = ref_expand(a, shape), eb = ref_expand(b, shape);
  RefTensor out(shape);
  for (size_t i = 0; i < out.data.size(); ++i) out.data[i] = ref_binary_value(op, ea.data[i], eb.data[i]);
  return out;
}

RefTensor ref_binary_scalar(kernels::BinaryOp op, const RefTensor& a, double scalar) {
  RefTensor out = a;
  for (auto& v : out.data) v = ref_binary_value(op, v, scalar);
  return out;
}

RefTensor ref_where(const RefTensor& cond, const RefTensor& a, const RefTensor& b) {
  Shape shape = ref_broadcast_shape(ref_broadcast_shape(cond.shape, a.shape), b.shape);
  RefTensor ec = ref_expand(cond, shape), ea = ref_expand(a, shape), eb = ref_expand(b, shape);
  RefTensor out(shape);
  for (size_t i = 0; i < out.data.size(); ++i) out.data[i] = ec.data[i] != 0 ? ea.data[i] : eb.data[i];
  return out;
}

// ---------------------------------------------------------------- reductions

namespace {
std::vector<bool> dims_mask(const std::vector<int64_t>& dims, int64_t ndim) {
  std::vector<bool> mask(static_cast<size_t>(ndim), dims.empty());
  for (int64_t d : dims) mask[static_cast<size_t>(wrap(d, ndim))] = true;
  return mask;
}
Shape reduced_shape(const Shape& shape, const std::vector<bool>& mask, bool keepdim) {
  Shape out;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (!mask[d]) out.push_back(shape[d]);
    else if (keepdim) out.push_back(1);
  }
  return out;
}
}  // namespace

RefTensor ref_reduce(kernels::ReduceOp op, const RefTensor& a, const std::vector<int64_t>& dims,
                     bool keepdim) {
  using kernels::ReduceOp;
  auto mask = dims_mask(dims, a.dim());
  Shape keep_shape = reduced_shape(a.shape, mask, true);
  double init = op == ReduceOp::kSum ? 0.0 : (op == ReduceOp::kMax ? -kInf : kInf);
  RefTensor acc(keep_shape, init);
  for_each_index(a.shape, [&](const Index& idx) {
    Index o = idx;
    for (size_t d = 0; d < o.size(); ++d) if (mask[d]) o[d] = 0;
    double& s = acc.at(o);
    double v = a.at(idx);
    if (op == ReduceOp::kSum) s += v;
    else if (op == ReduceOp::kMax) s = (std::isnan(v) || v > s) ? v : s;
    else s = (std::isnan(v) || v < s) ? v : s;
  });
  acc.shape = reduced_shape(a.shape, mask, keepdim);
  return acc;
}

RefTensor ref_mean(const RefTensor& a, const std::vector<int64_t>& dims, bool keepdim) {
  auto mask = dims_mask(dims, a.dim());
  int64_t count = 1;
  for (size_t d = 0; d < a.shape.size(); ++d) if (mask[d]) count *= a.shape[d];
  RefTensor s = ref_reduce(kernels::ReduceOp::kSum, a, dims, keepdim);
  for (auto& v : s.data) v /= static_cast<double>(count);
  return s;
}

std::pair<RefTensor, RefTensor> ref_max_along(const RefTensor& a, int64_t dim, bool keepdim) {
  dim = wrap(dim, a.dim());
  std::vector<bool> mask(a.shape.size(), false);
  if (!a.shape.empty()) mask[static_cast<size_t>(dim)] = true;
  Shape keep_shape = reduced_shape(a.shape, mask, true);
  RefTensor values(keep_shape, -kInf), indices(keep_shape, -1.0);
  for_each_index(a.shape, [&](const Index& idx) {
    Index o = idx;
    int64_t k = 0;
    if (!o.empty()) { k = o[static_cast<size_t>(dim)]; o[static_cast<size_t>(dim)] = 0; }
    double v = a.at(idx);
    double& best = values.at(o);
    double& bi = indices.at(o);
    if (bi < 0 || (!std::isnan(best) && (v > best || std::isnan(v)))) {
      best = v;
      bi = static_cast<double>(k);
    }
  });
  Shape out_shape = reduced_shape(a.shape, mask, keepdim);
  values.shape = out_shape;
  indices.shape = out_shape;
  return {values, indices};
}

// ---------------------------------------------------------------- linear algebra

RefTensor ref_transpose(const RefTensor& a, int64_t d0, int64_t d1) {
  std::vector<int64_t> dims(a.shape.size());
  std::iota(dims.begin(), dims.end(), 0);
  std::swap(dims[static_cast<size_t>(wrap(d0, a.dim()))], dims[static_cast<size_t>(wrap(d1, a.dim()))]);
  return ref_permute(a, dims);
}

RefTensor ref_permute(const RefTensor& a, const std::vector<int64_t>& dims) {
  Shape shape(dims.size());
  for (size_t i = 0; i < dims.size(); ++i) shape[i] = a.shape[static_cast<size_t>(dims[i])];
  RefTensor out(shape);
  int64_t i = 0;
  for_each_index(shape, [&](const Index& idx) {
    Index src(idx.size());
    for (size_t d = 0; d < dims.size(); ++d) src[static_cast<size_t>(dims[d])] = idx[d];
    out.data[static_cast<size_t>(i++)] = a.at(src);
  });
  return out;
}

RefTensor ref_matmul(const RefTensor& a_in, const RefTensor& b_in) {
  RefTensor a = a_in, b = b_in;
  bool squeeze_m = false, squeeze_n = false;
  if (a.dim() == 1) { a.shape = {1, a.shape[0]}; squeeze_m = true; }
  if (b.dim() == 1) { b.shape = {b.shape[0], 1}; squeeze_n = true; }
  const int64_t m = a.shape[a.shape.size() - 2], k = a.shape.back();
  const int64_t k2 = b.shape[b.shape.size() - 2], n = b.shape.back();
  if (k != k2) throw std::invalid_argument("ref_matmul: inner dims differ");
  Shape batch_a(a.shape.begin(), a.shape.end() - 2), batch_b(b.shape.begin(), b.shape.end() - 2);
  Shape batch = ref_broadcast_shape(batch_a, batch_b);
  Shape sa = batch, sb = batch;
  sa.push_back(m); sa.push_back(k);
  sb.push_back(k); sb.push_back(n);
  RefTensor ea = ref_expand(a, sa), eb = ref_expand(b, sb);
  const int64_t nb = shape_numel(batch);
  Shape out_shape = batch;
  out_shape.push_back(m);
  out_shape.push_back(n);
  RefTensor out(out_shape);
  for (int64_t bi = 0; bi < nb; ++bi)
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        double s = 0;
        for (int64_t p = 0; p < k; ++p) s += ea.data[(bi * m + i) * k + p] * eb.data[(bi * k + p) * n + j];
        out.data[(bi * m + i) * n + j] = s;
      }
  if (squeeze_n) out.shape.erase(out.shape.end() - 1);
  if (squeeze_m) out.shape.erase(out.shape.end() - (squeeze_n ? 1 : 2));
  return out;
}

RefTensor ref_linear(const RefTensor& x, const RefTensor& w, const std::optional<RefTensor>& bias) {
  RefTensor y = ref_matmul(x, ref_transpose(w, 0, 1));
  if (bias) y = ref_binary(kernels::BinaryOp::kAdd, y, *bias);
  return y;
}

// ---------------------------------------------------------------- convolution, pooling

int64_t ref_conv_out_size(int64_t in, int64_t kernel, int64_t stride, int64_t pad, int64_t dilation) {
  return (in + 2 * pad - dilation * (kernel - 1) - 1) / stride + 1;
}

RefTensor ref_conv2d(const RefTensor& input, const RefTensor& weight,
                     const std::optional<RefTensor>& bias, const Conv2dParams& p) {
  const int64_t N = input.shape[0], C = input.shape[1], H = input.shape[2], W = input.shape[3];
  const int64_t O = weight.shape[0], Cg = weight.shape[1], KH = weight.shape[2], KW = weight.shape[3];
  const int64_t G = p.groups, Og = O / G;
  const int64_t Ho = ref_conv_out_size(H, KH, p.stride_h, p.pad_h, p.dilation_h);
  const int64_t Wo = ref_conv_out_size(W, KW, p.stride_w, p.pad_w, p.dilation_w);
  (void)C;
  RefTensor out({N, O, Ho, Wo});
  for (int64_t n = 0; n < N; ++n)
    for (int64_t o = 0; o < O; ++o)
      for (int64_t y = 0; y < Ho; ++y)
        for (int64_t x = 0; x < Wo; ++x) {
          double s = bias ? bias->data[static_cast<size_t>(o)] : 0.0;
          const int64_t g = o / Og;
          for (int64_t c = 0; c < Cg; ++c)
            for (int64_t i = 0; i < KH; ++i)
              for (int64_t j = 0; j < KW; ++j) {
                int64_t h = y * p.stride_h - p.pad_h + i * p.dilation_h;
                int64_t w = x * p.stride_w - p.pad_w + j * p.dilation_w;
                if (h < 0 || h >= H || w < 0 || w >= W) continue;
                s += input.at({n, g * Cg + c, h, w}) * weight.at({o, c, i, j});
              }
          out.at({n, o, y, x}) = s;
        }
  return out;
}

RefTensor ref_conv2d_backward_input(const RefTensor& grad_out, const RefTensor& weight,
                                    const Shape& input_shape, const Conv2dParams& p) {
  const int64_t H = input_shape[2], W = input_shape[3];
  const int64_t O = weight.shape[0], Cg = weight.shape[1], KH = weight.shape[2], KW = weight.shape[3];
  const int64_t Og = O / p.groups;
  const int64_t N = grad_out.shape[0], Ho = grad_out.shape[2], Wo = grad_out.shape[3];
  RefTensor gi(input_shape);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t o = 0; o < O; ++o)
      for (int64_t y = 0; y < Ho; ++y)
        for (int64_t x = 0; x < Wo; ++x) {
          const double g = grad_out.at({n, o, y, x});
          const int64_t grp = o / Og;
          for (int64_t c = 0; c < Cg; ++c)
            for (int64_t i = 0; i < KH; ++i)
              for (int64_t j = 0; j < KW; ++j) {
                int64_t h = y * p.stride_h - p.pad_h + i * p.dilation_h;
                int64_t w = x * p.stride_w - p.pad_w + j * p.dilation_w;
                if (h < 0 || h >= H || w < 0 || w >= W) continue;
                gi.at({n, grp * Cg + c, h, w}) += g * weight.at({o, c, i, j});
              }
        }
  return gi;
}

RefTensor ref_conv2d_backward_weight(const RefTensor& grad_out, const RefTensor& input,
                                     const Shape& weight_shape, const Conv2dParams& p) {
  const int64_t H = input.shape[2], W = input.shape[3];
  const int64_t O = weight_shape[0], Cg = weight_shape[1], KH = weight_shape[2], KW = weight_shape[3];
  const int64_t Og = O / p.groups;
  const int64_t N = grad_out.shape[0], Ho = grad_out.shape[2], Wo = grad_out.shape[3];
  RefTensor gw(weight_shape);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t o = 0; o < O; ++o)
      for (int64_t y = 0; y < Ho; ++y)
        for (int64_t x = 0; x < Wo; ++x) {
          const double g = grad_out.at({n, o, y, x});
          const int64_t grp = o / Og;
          for (int64_t c = 0; c < Cg; ++c)
            for (int64_t i = 0; i < KH; ++i)
              for (int64_t j = 0; j < KW; ++j) {
                int64_t h = y * p.stride_h - p.pad_h + i * p.dilation_h;
                int64_t w = x * p.stride_w - p.pad_w + j * p.dilation_w;
                if (h < 0 || h >= H || w < 0 || w >= W) continue;
                gw.at({o, c, i, j}) += g * input.at({n, grp * Cg + c, h, w});
              }
        }
  return gw;
}

std::pair<RefTensor, RefTensor> ref_max_pool2d(const RefTensor& input, const Pool2dParams& p) {
  const int64_t N = input.shape[0], C = input.shape[1], H = input.shape[2], W = input.shape[3];
  const int64_t Ho = ref_conv_out_size(H, p.kernel_h, p.stride_h, p.pad_h, 1);
  const int64_t Wo = ref_conv_out_size(W, p.kernel_w, p.stride_w, p.pad_w, 1);
  RefTensor out({N, C, Ho, Wo}), idx({N, C, Ho, Wo});
  for (int64_t n = 0; n < N; ++n)
    for (int64_t c = 0; c < C; ++c)
      for (int64_t y = 0; y < Ho; ++y)
        for (int64_t x = 0; x < Wo; ++x) {
          double best = -kInf;
          int64_t bi = -1;
          for (int64_t i = 0; i < p.kernel_h; ++i)
            for (int64_t j = 0; j < p.kernel_w; ++j) {
              int64_t h = y * p.stride_h - p.pad_h + i, w = x * p.stride_w - p.pad_w + j;
              if (h < 0 || h >= H || w < 0 || w >= W) continue;
              double v = input.at({n, c, h, w});
              if (bi < 0 || v > best || std::isnan(v)) {
                if (bi >= 0 && std::isnan(best)) continue;
                best = v;
                bi = h * W + w;
              }
            }
          out.at({n, c, y, x}) = best;
          idx.at({n, c, y, x}) = static_cast<double>(bi);
        }
  return {out, idx};
}

RefTensor ref_max_pool2d_backward(const RefTensor& grad_out, const RefTensor& indices,
                                  const Shape& input_shape) {
  RefTensor gi(input_shape);
  const int64_t W = input_shape[3];
  for_each_index(grad_out.shape, [&](const Index& idx) {
    int64_t flat = static_cast<int64_t>(indices.at(idx));
    gi.at({idx[0], idx[1], flat / W, flat % W}) += grad_out.at(idx);
  });
  return gi;
}

RefTensor ref_avg_pool2d(const RefTensor& input, const Pool2dParams& p) {
  const int64_t N = input.shape[0], C = input.shape[1], H = input.shape[2], W = input.shape[3];
  const int64_t Ho = ref_conv_out_size(H, p.kernel_h, p.stride_h, p.pad_h, 1);
  const int64_t Wo = ref_conv_out_size(W, p.kernel_w, p.stride_w, p.pad_w, 1);
  RefTensor out({N, C, Ho, Wo});
  const double count = static_cast<double>(p.kernel_h * p.kernel_w);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t c = 0; c < C; ++c)
      for (int64_t y = 0; y < Ho; ++y)
        for (int64_t x = 0; x < Wo; ++x) {
          double s = 0;
          for (int64_t i = 0; i < p.kernel_h; ++i)
            for (int64_t j = 0; j < p.kernel_w; ++j) {
              int64_t h = y * p.stride_h - p.pad_h + i, w = x * p.stride_w - p.pad_w + j;
              if (h < 0 || h >= H || w < 0 || w >= W) continue;
              s += input.at({n, c, h, w});
            }
          out.at({n, c, y, x}) = s / count;
        }
  return out;
}

RefTensor ref_avg_pool2d_backward(const RefTensor& grad_out, const Shape& input_shape,
                                  const Pool2dParams& p) {
  const int64_t H = input_shape[2], W = input_shape[3];
  const double count = static_cast<double>(p.kernel_h * p.kernel_w);
  RefTensor gi(input_shape);
  for_each_index(grad_out.shape, [&](const Index& idx) {
    double g = grad_out.at(idx) / count;
    for (int64_t i = 0; i < p.kernel_h; ++i)
      for (int64_t j = 0; j < p.kernel_w; ++j) {
        int64_t h = idx[2] * p.stride_h - p.pad_h + i, w = idx[3] * p.stride_w - p.pad_w + j;
        if (h < 0 || h >= H || w < 0 || w >= W) continue;
        gi.at({idx[0], idx[1], h, w}) += g;
      }
  });
  return gi;
}

// ---------------------------------------------------------------- softmax, losses

namespace {
// Calls fn(line) for every 1-D line of `shape` along `dim`, where line is the vector of flat
// offsets of that line's elements.
void for_each_line(const Shape& shape, int64_t dim, const std::function<void(const std::vector<int64_t>&)>& fn) {
  Shape outer = shape;
  outer[static_cast<size_t>(dim)] = 1;
  RefTensor probe(shape);
  for_each_index(outer, [&](const Index& idx) {
    std::vector<int64_t> line;
    Index j = idx;
    for (int64_t k = 0; k < shape[static_cast<size_t>(dim)]; ++k) {
      j[static_cast<size_t>(dim)] = k;
      line.push_back(probe.linear(j));
    }
    fn(line);
  });
}
}  // namespace

RefTensor ref_softmax(const RefTensor& a, int64_t dim, bool log) {
  if (a.dim() == 0) return RefTensor({}, log ? 0.0 : 1.0);
  dim = wrap(dim, a.dim());
  RefTensor out(a.shape);
  for_each_line(a.shape, dim, [&](const std::vector<int64_t>& line) {
    double m = -kInf;
    for (int64_t o : line) m = std::max(m, a.data[o]);
    double s = 0;
    for (int64_t o : line) s += std::exp(a.data[o] - m);
    for (int64_t o : line) {
      out.data[o] = log ? (a.data[o] - m - std::log(s)) : std::exp(a.data[o] - m) / s;
    }
  });
  return out;
}

RefTensor ref_softmax_backward(const RefTensor& grad_out, const RefTensor& output, int64_t dim,
                               bool log) {
  if (output.dim() == 0) return RefTensor({}, log ? grad_out.data[0] - std::exp(output.data[0]) * grad_out.data[0] : 0.0);
  dim = wrap(dim, output.dim());
  RefTensor gi(output.shape);
  for_each_line(output.shape, dim, [&](const std::vector<int64_t>& line) {
    double s = 0;
    for (int64_t o : line) s += log ? grad_out.data[o] : grad_out.data[o] * output.data[o];
    for (int64_t o : line) {
      gi.data[o] = log ? grad_out.data[o] - std::exp(output.data[o]) * s
                       : output.data[o] * (grad_out.data[o] - s);
    }
  });
  return gi;
}

RefTensor ref_cross_entropy(const RefTensor& logits, const RefTensor& targets, int64_t ignore_index,
                            double label_smoothing) {
  RefTensor lsm = ref_softmax(logits, 1, true);
  const int64_t N = logits.shape[0], C = logits.shape[1];
  double total = 0;
  int64_t count = 0;
  for (int64_t n = 0; n < N; ++n) {
    int64_t t = static_cast<int64_t>(targets.data[static_cast<size_t>(n)]);
    if (t == ignore_index) continue;
    double nll = -lsm.at({n, t});
    double smooth = 0;
    for (int64_t c = 0; c < C; ++c) smooth -= lsm.at({n, c});
    total += (1.0 - label_smoothing) * nll + label_smoothing / static_cast<double>(C) * smooth;
    ++count;
  }
  return RefTensor({}, total / static_cast<double>(count));
}

// ---------------------------------------------------------------- indexing, joining

RefTensor ref_gather(const RefTensor& a, int64_t dim, const RefTensor& index) {
  dim = wrap(dim, a.dim());
  RefTensor out(index.shape);
  int64_t i = 0;
  for_each_index(index.shape, [&](const Index& idx) {
    Index src = idx;
    src[static_cast<size_t>(dim)] = static_cast<int64_t>(index.at(idx));
    out.data[static_cast<size_t>(i++)] = a.at(src);
  });
  return out;
}

RefTensor ref_index_select(const RefTensor& a, int64_t dim, const RefTensor& index) {
  dim = wrap(dim, a.dim());
  Shape shape(a.shape.begin(), a.shape.begin() + dim);
  shape.insert(shape.end(), index.shape.begin(), index.shape.end());
  shape.insert(shape.end(), a.shape.begin() + dim + 1, a.shape.end());
  RefTensor out(shape);
  const size_t ni = index.shape.size();
  int64_t i = 0;
  for_each_index(shape, [&](const Index& idx) {
    Index src(idx.begin(), idx.begin() + dim);
    Index iidx(idx.begin() + dim, idx.begin() + dim + static_cast<int64_t>(ni));
    src.push_back(static_cast<int64_t>(index.at(iidx)));
    src.insert(src.end(), idx.begin() + dim + static_cast<int64_t>(ni), idx.end());
    out.data[static_cast<size_t>(i++)] = a.at(src);
  });
  return out;
}

RefTensor ref_index_add(const RefTensor& a, int64_t dim, const RefTensor& index,
                        const RefTensor& src) {
  dim = wrap(dim, a.dim());
  const int64_t ni = index.dim();
  RefTensor out = a;
  for_each_index(src.shape, [&](const Index& idx) {
    Index iidx(idx.begin() + dim, idx.begin() + dim + ni);
    Index dst(idx.begin(), idx.begin() + dim);
    dst.push_back(static_cast<int64_t>(index.at(iidx)));
    dst.insert(dst.end(), idx.begin() + dim + ni, idx.end());
    out.at(dst) += src.at(idx);
  });
  return out;
}

RefTensor ref_one_hot(const RefTensor& index, int64_t num_classes) {
  Shape shape = index.shape;
  shape.push_back(num_classes);
  RefTensor out(shape);
  for (int64_t i = 0; i < index.numel(); ++i) {
    out.data[static_cast<size_t>(i * num_classes + static_cast<int64_t>(index.data[static_cast<size_t>(i)]))] = 1.0;
  }
  return out;
}

RefTensor ref_cat(const std::vector<RefTensor>& parts, int64_t dim) {
  dim = wrap(dim, parts.at(0).dim());
  Shape shape = parts[0].shape;
  shape[static_cast<size_t>(dim)] = 0;
  for (const auto& p : parts) shape[static_cast<size_t>(dim)] += p.shape[static_cast<size_t>(dim)];
  RefTensor out(shape);
  int64_t base = 0;
  for (const auto& p : parts) {
    for_each_index(p.shape, [&](const Index& idx) {
      Index dst = idx;
      dst[static_cast<size_t>(dim)] += base;
      out.at(dst) = p.at(idx);
    });
    base += p.shape[static_cast<size_t>(dim)];
  }
  return out;
}

RefTensor ref_stack(const std::vector<RefTensor>& parts, int64_t dim) {
  std::vector<RefTensor> expanded;
  const int64_t ndim = parts.at(0).dim() + 1;
  if (dim < 0) dim += ndim;
  for (auto p : parts) {
    p.shape.insert(p.shape.begin() + dim, 1);
    expanded.push_back(std::move(p));
  }
  return ref_cat(expanded, dim);
}

RefTensor ref_slice(const RefTensor& a, int64_t dim, int64_t start, int64_t end, int64_t step) {
  dim = wrap(dim, a.dim());
  const int64_t n = a.shape[static_cast<size_t>(dim)];
  if (start < 0) start += n;
  if (end < 0) end += n;
  start = std::clamp<int64_t>(start, 0, n);
  end = std::clamp<int64_t>(end, start, n);
  Shape shape = a.shape;
  shape[static_cast<size_t>(dim)] = (end - start + step - 1) / step;
  RefTensor out(shape);
  int64_t i = 0;
  for_each_index(shape, [&](const Index& idx) {
    Index src = idx;
    src[static_cast<size_t>(dim)] = start + idx[static_cast<size_t>(dim)] * step;
    out.data[static_cast<size_t>(i++)] = a.at(src);
  });
  return out;
}

}  // namespace ringtrain::ref
