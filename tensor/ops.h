// ops.h: every computation on tensors, device-independent entry points.
//
// defines: factories, seeded random generation, broadcasting elementwise math,
//          reductions, matmul, conv/pool (forward and the backward kernels autograd
//          needs), softmax family, cross-entropy, indexing, cat/stack, finiteness.
//
// Each function here validates its arguments (shapes, dtypes, devices; errors
// name the op and the operands via Tensor::describe()), computes the output shape
// and dtype, and hands the work to the device kernels declared in
// tensor/kernels.h (CPU: tensor/cpu/*.cc, CUDA: tensor/cuda/*.cu). None of these
// record autograd history: the differentiable versions live in autograd/.
//
// Rules shared by all ops:
//  * Operands must be on the same device; mixing throws (no implicit copies).
//  * Binary ops broadcast by numpy rules; incompatible shapes throw (never a
//    silent broadcast of mismatched sizes).
//  * Binary ops need equal dtypes (no implicit promotion) except a Tensor-scalar
//    op, where the scalar takes the tensor's dtype.
//  * Comparisons return 1/0 in the operands' dtype; `where` treats nonzero as true.
//  * Float16/bfloat16 math is computed in float32 and rounded on store.
//  * Integer add/sub/mul/div/neg/abs/pow wrap around (two's complement, as PyTorch
//    and numpy): INT_MIN / -1 == INT_MIN, and pow is exact integer arithmetic (a
//    negative exponent gives the truncated real result: 1, +-1 for base -1, else 0).
//    The CPU and CUDA kernels share the wrapping_* helpers of dtype.h. Integer
//    division by zero throws on the CPU and gives 0 on CUDA (a kernel cannot throw).
//  * A float value stored into an integer tensor (to(), full/fill_, masked_fill,
//    a tensor-scalar op's scalar) is truncated toward zero and saturated to the
//    dtype's range; NaN becomes 0 (saturating_float_to_int, dtype.h). Comparisons
//    with a scalar are the exception: they compare the exact values, as PyTorch
//    does (lt(int64{2}, 2.5) is 1, eq(int64{2}, 2.5) is 0).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "tensor/tensor.h"

namespace ringtrain {

// ---------------------------------------------------------------- factories
Tensor zeros(const Shape& shape, DType dtype = DType::kFloat32, Device device = Device::cpu());
Tensor ones(const Shape& shape, DType dtype = DType::kFloat32, Device device = Device::cpu());
Tensor full(const Shape& shape, double value, DType dtype = DType::kFloat32,
            Device device = Device::cpu());
Tensor zeros_like(const Tensor& t);
Tensor ones_like(const Tensor& t);
Tensor full_like(const Tensor& t, double value);
// [start, end) with `step`; the dtype decides integer or float values. The bounds and
// step must be finite, step nonzero, and the count at most 2^53. For an integer dtype,
// start, end and step are first truncated toward zero (a step that becomes 0 throws) and
// the values computed exactly in int64 (int32: they must fit, else it throws), as PyTorch's
// int64 arange: arange(-2.5, 2) is -2, -1, 0, 1.
Tensor arange(double start, double end, double step = 1.0, DType dtype = DType::kInt64,
              Device device = Device::cpu());
Tensor scalar_tensor(double value, DType dtype = DType::kFloat32, Device device = Device::cpu());
Tensor& fill_(Tensor& t, double value);  // in place, any view
Tensor& zero_(Tensor& t);

// ---------------------------------------------------------------- random
// A seeded counter-based generator (Philox 4x32-10, as cuRAND and PyTorch use):
// the same seed gives the same numbers on every run and every device, because
// values are produced on the host and copied. State is (seed, offset) so it can
// be saved in checkpoints and restored exactly.
class Generator {
 public:
  explicit Generator(uint64_t seed = 0) : seed_(seed) {}
  void manual_seed(uint64_t seed) { seed_ = seed; offset_ = 0; }
  uint64_t seed() const { return seed_; }
  uint64_t offset() const { return offset_; }
  void set_state(uint64_t seed, uint64_t offset) { seed_ = seed; offset_ = offset; }
  // Next `n` uniform 32-bit words; advances the offset.
  void next_uint32(uint32_t* out, size_t n);
  double next_uniform();  // in [0, 1)

 private:
  uint64_t seed_ = 0;
  uint64_t offset_ = 0;  // number of 32-bit words consumed
};

// The process-wide generator (seed 0 until manual_seed), or, on a thread inside a
// ScopedDefaultGenerator, that scope's generator.
Generator& default_generator();

// Makes default_generator() return `gen` on this thread until the scope ends. Threads that
// run model code concurrently (DataParallel's replicas) each get their own stream this way:
// sharing the process-wide one would be a data race, and the order the threads draw in would
// decide who gets which numbers.
class ScopedDefaultGenerator {
 public:
  explicit ScopedDefaultGenerator(Generator& gen);
  ~ScopedDefaultGenerator();
  ScopedDefaultGenerator(const ScopedDefaultGenerator&) = delete;
  ScopedDefaultGenerator& operator=(const ScopedDefaultGenerator&) = delete;

 private:
  Generator* previous_;
};

Tensor& uniform_(Tensor& t, double low, double high, Generator& gen);
Tensor& normal_(Tensor& t, double mean, double stddev, Generator& gen);
Tensor& bernoulli_(Tensor& t, double p, Generator& gen);  // 1 with probability p, else 0
Tensor rand(const Shape& shape, Generator& gen, DType dtype = DType::kFloat32,
            Device device = Device::cpu());   // U[0, 1)
Tensor randn(const Shape& shape, Generator& gen, DType dtype = DType::kFloat32,
             Device device = Device::cpu());  // N(0, 1)
Tensor randperm(int64_t n, Generator& gen);   // int64 permutation of [0, n) on the CPU

// ---------------------------------------------------------------- elementwise
Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op);

Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);
Tensor pow(const Tensor& a, const Tensor& b);
Tensor maximum(const Tensor& a, const Tensor& b);
Tensor minimum(const Tensor& a, const Tensor& b);
Tensor eq(const Tensor& a, const Tensor& b);
Tensor ne(const Tensor& a, const Tensor& b);
Tensor lt(const Tensor& a, const Tensor& b);
Tensor le(const Tensor& a, const Tensor& b);
Tensor gt(const Tensor& a, const Tensor& b);
Tensor ge(const Tensor& a, const Tensor& b);

Tensor add(const Tensor& a, double b);
Tensor sub(const Tensor& a, double b);
Tensor mul(const Tensor& a, double b);
Tensor div(const Tensor& a, double b);
Tensor pow(const Tensor& a, double exponent);
Tensor gt(const Tensor& a, double b);
Tensor lt(const Tensor& a, double b);
Tensor eq(const Tensor& a, double b);
Tensor ne(const Tensor& a, double b);
Tensor le(const Tensor& a, double b);
Tensor ge(const Tensor& a, double b);

Tensor neg(const Tensor& a);
Tensor exp(const Tensor& a);
Tensor log(const Tensor& a);
Tensor sqrt(const Tensor& a);
Tensor abs(const Tensor& a);
Tensor relu(const Tensor& a);
Tensor gelu(const Tensor& a);       // exact (erf) form, PyTorch's default
Tensor gelu_grad(const Tensor& a);  // d gelu(a) / d a, for autograd
Tensor tanh(const Tensor& a);
Tensor sigmoid(const Tensor& a);
Tensor isfinite(const Tensor& a);   // 1/0 in a's dtype
bool all_finite(const Tensor& a);   // no inf/NaN anywhere (one pass, one host sync on CUDA)

Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b);  // broadcasting
Tensor masked_fill(const Tensor& a, const Tensor& mask, double value);

// In-place: a op= b, b broadcast to a's shape (a's shape never changes). The
// destination may not be an expanded (stride-0) view (fill_ alone allows one).
Tensor& add_(Tensor& a, const Tensor& b, double alpha = 1.0);  // a += alpha * b
Tensor& mul_(Tensor& a, const Tensor& b);
Tensor& mul_(Tensor& a, double b);
Tensor& div_(Tensor& a, double b);

Tensor operator+(const Tensor& a, const Tensor& b);
Tensor operator-(const Tensor& a, const Tensor& b);
Tensor operator*(const Tensor& a, const Tensor& b);
Tensor operator/(const Tensor& a, const Tensor& b);
Tensor operator-(const Tensor& a);
Tensor operator+(const Tensor& a, double b);
Tensor operator-(const Tensor& a, double b);
Tensor operator*(const Tensor& a, double b);
Tensor operator/(const Tensor& a, double b);

// ---------------------------------------------------------------- reductions
// `dims` empty means all dims. Sums of integers accumulate in int64, floats in
// at least float32 (float64 stays float64); the output keeps the input dtype
// (unlike PyTorch, whose integer sums return int64): an int32 sum that leaves the
// int32 range is cast back with two's-complement wrap-around, and an int64 sum
// wraps the same way. Convert with .to(DType::kInt64) first to get the full sum.
// As PyTorch, a 0-d tensor takes dim 0 or -1 (its one element; the result is 0-d, keepdim too).
Tensor sum(const Tensor& a, const std::vector<int64_t>& dims = {}, bool keepdim = false);
Tensor mean(const Tensor& a, const std::vector<int64_t>& dims = {}, bool keepdim = false);
Tensor amax(const Tensor& a, const std::vector<int64_t>& dims = {}, bool keepdim = false);
Tensor amin(const Tensor& a, const std::vector<int64_t>& dims = {}, bool keepdim = false);
// Max along one dim: (values, int64 indices of the first maximum).
std::pair<Tensor, Tensor> max(const Tensor& a, int64_t dim, bool keepdim = false);
Tensor argmax(const Tensor& a, int64_t dim, bool keepdim = false);
Tensor argmax(const Tensor& a);  // over the flattened tensor, int64 scalar
// Sums `a` down to `shape` (the inverse of broadcasting; autograd uses it).
Tensor sum_to(const Tensor& a, const Shape& shape);

// ---------------------------------------------------------------- linear algebra
// 2-D [m,k]x[k,n], batched [...,m,k]x[...,k,n] with broadcast batch dims, and
// 1-D operands as in numpy. Float dtypes only; f16/bf16 accumulate in f32.
Tensor matmul(const Tensor& a, const Tensor& b);
// 2-D a [m,k] @ b [k,n] written into `out` (contiguous [m,n], same dtype and device;
// its old values are overwritten, never read). Lets a caller choose where a GEMM's
// result lives: autograd writes a weight gradient straight into DDP's bucket.
void matmul_out(const Tensor& a, const Tensor& b, const Tensor& out);
// y = x W^T + b, the Linear layer's forward in one call (bias may be undefined).
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias);

// ---------------------------------------------------------------- convolution, pooling
struct Conv2dParams {
  int64_t stride_h = 1, stride_w = 1;
  int64_t pad_h = 0, pad_w = 0;
  int64_t dilation_h = 1, dilation_w = 1;
  int64_t groups = 1;
};
// input [N,C,H,W], weight [O,C/groups,kh,kw], bias [O] or undefined -> [N,O,Ho,Wo].
Tensor conv2d(const Tensor& input, const Tensor& weight, const Tensor& bias, const Conv2dParams& p);
Tensor conv2d_backward_input(const Tensor& grad_out, const Tensor& weight, const Shape& input_shape,
                             const Conv2dParams& p);
Tensor conv2d_backward_weight(const Tensor& grad_out, const Tensor& input, const Shape& weight_shape,
                              const Conv2dParams& p);

struct Pool2dParams {
  int64_t kernel_h = 2, kernel_w = 2;
  int64_t stride_h = 2, stride_w = 2;
  int64_t pad_h = 0, pad_w = 0;
};
// (output, int64 argmax indices into each H*W plane) for the backward pass.
std::pair<Tensor, Tensor> max_pool2d(const Tensor& input, const Pool2dParams& p);
Tensor max_pool2d_backward(const Tensor& grad_out, const Tensor& indices, const Shape& input_shape);
// Average over the window; padding counts as zeros (count_include_pad = true, PyTorch's default).
Tensor avg_pool2d(const Tensor& input, const Pool2dParams& p);
Tensor avg_pool2d_backward(const Tensor& grad_out, const Shape& input_shape, const Pool2dParams& p);

// ---------------------------------------------------------------- softmax, losses
Tensor softmax(const Tensor& a, int64_t dim);
Tensor log_softmax(const Tensor& a, int64_t dim);
// Given y = softmax(x) (resp. log_softmax) and dL/dy, returns dL/dx.
Tensor softmax_backward(const Tensor& grad_out, const Tensor& output, int64_t dim);
Tensor log_softmax_backward(const Tensor& grad_out, const Tensor& output, int64_t dim);
// Throws unless every value of the int64 `index` lies in [0, size); the message names `op`,
// `what` the tensor is, the values found, and ends with `fix`. One small copy to the host
// (a wait on a GPU, where gather/index_select cannot throw and read 0 out of range).
void check_index_range(const Tensor& index, int64_t size, const char* op, const char* what,
                       const std::string& fix);
// check_index_range for class-index targets (ignored ones already replaced by 0).
void check_class_targets(const Tensor& targets, int64_t classes, int64_t ignore_index, const char* op);
// logits [N,C], int64 targets [N]; mean over the non-ignored targets. Targets outside
// [0, C) that are not ignore_index are an error on every device.
Tensor cross_entropy(const Tensor& logits, const Tensor& targets, int64_t ignore_index = -100,
                     double label_smoothing = 0.0);

// ---------------------------------------------------------------- indexing, joining
// Out-of-range indices: the CPU kernels throw naming the index (index_add_ checks them all
// before it writes, so a throw leaves the destination unchanged); the CUDA kernels cannot
// throw, so gather and index_select read 0 there and index_add_ skips it. Validate indices
// that come from data with check_index_range (cross_entropy and one_hot do).
// out[i][j] = a[i][index[i][j]] along `dim` (index int64, same rank as a).
Tensor gather(const Tensor& a, int64_t dim, const Tensor& index);
// Rows of `a` chosen by int64 `index` (any shape) along `dim`: embedding lookup.
Tensor index_select(const Tensor& a, int64_t dim, const Tensor& index);
// a.select(dim, index[i]) += src.select(dim, i): the embedding gradient.
Tensor& index_add_(Tensor& a, int64_t dim, const Tensor& index, const Tensor& src);
// Every index must lie in [0, num_classes) (checked: reads the min/max back to the host).
Tensor one_hot(const Tensor& index, int64_t num_classes, DType dtype = DType::kFloat32);
// Joins along `dim`; the other dims must match. As PyTorch, a 1-d empty tensor ([0]) is skipped
// whatever the others' rank (an empty accumulator), and 0-d tensors are refused (stack them).
Tensor cat(const std::vector<Tensor>& tensors, int64_t dim = 0);
Tensor stack(const std::vector<Tensor>& tensors, int64_t dim = 0);

// ---------------------------------------------------------------- comparison helpers for tests
// max |a - b| computed in float64 on the host; shapes must match. Equal values (equal
// infinities too) differ by 0; a NaN on either side makes the result inf.
double max_abs_diff(const Tensor& a, const Tensor& b);
// |a - b| <= atol + rtol * |b| or a == b everywhere, as torch.allclose (inf is close to inf of
// the same sign; NaN to nothing). Shapes must be equal (false otherwise).
bool allclose(const Tensor& a, const Tensor& b, double rtol = 1e-5, double atol = 1e-8);

}  // namespace ringtrain
