// ops.cc: argument checking, output allocation and device dispatch for every op
// in ops.h. The arithmetic itself is in the device kernels (tensor/kernels.h).
//
// The pattern of every op:
//   1. check operands (defined, same device, dtype rules, shapes) and throw an
//      Error naming the op and each operand's dtype[shape] on device;
//   2. compute the output shape and allocate it contiguous on the operands' device;
//   3. broadcast inputs to the output shape with expand() (stride-0 views, no copy);
//   4. call the kernel of that device: cpu::f or cuda::f (same signature).
#include "tensor/ops.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <tuple>
#include <utility>

#include "tensor/kernels.h"
#include "tensor/memory_overlap.h"

namespace ringtrain {

// The kernel of `name` for the device of tensor `t`: RT_KERNEL(t, copy)(dst, src).
#define RT_KERNEL(t, name) ((t).device().is_cuda() ? &kernels::cuda::name : &kernels::cpu::name)

namespace kernels {
const char* unary_op_name(UnaryOp op) {
  switch (op) {
    case UnaryOp::kNeg: return "neg";
    case UnaryOp::kExp: return "exp";
    case UnaryOp::kLog: return "log";
    case UnaryOp::kSqrt: return "sqrt";
    case UnaryOp::kAbs: return "abs";
    case UnaryOp::kRelu: return "relu";
    case UnaryOp::kGelu: return "gelu";
    case UnaryOp::kGeluGrad: return "gelu_grad";
    case UnaryOp::kTanh: return "tanh";
    case UnaryOp::kSigmoid: return "sigmoid";
    case UnaryOp::kIsFinite: return "isfinite";
  }
  return "unary";
}
const char* binary_op_name(BinaryOp op) {
  switch (op) {
    case BinaryOp::kAdd: return "add";
    case BinaryOp::kSub: return "sub";
    case BinaryOp::kMul: return "mul";
    case BinaryOp::kDiv: return "div";
    case BinaryOp::kPow: return "pow";
    case BinaryOp::kMax: return "maximum";
    case BinaryOp::kMin: return "minimum";
    case BinaryOp::kEq: return "eq";
    case BinaryOp::kNe: return "ne";
    case BinaryOp::kLt: return "lt";
    case BinaryOp::kLe: return "le";
    case BinaryOp::kGt: return "gt";
    case BinaryOp::kGe: return "ge";
  }
  return "binary";
}
}  // namespace kernels

namespace {
using kernels::BinaryOp;
using kernels::ReduceOp;
using kernels::UnaryOp;

void check_defined(const Tensor& t, const char* op, const char* what) {
  RT_CHECK(t.defined(), op, ": ", what, " is an undefined tensor");
}

void check_same_device(const Tensor& a, const Tensor& b, const char* op) {
  RT_CHECK(a.device() == b.device(), op, ": operands are on different devices: ", a.describe(),
           " and ", b.describe(), "; move one with .to(device) first");
}

void check_same_dtype(const Tensor& a, const Tensor& b, const char* op) {
  RT_CHECK(a.dtype() == b.dtype(), op, ": operands have different dtypes: ", a.describe(), " and ",
           b.describe(), "; convert one with .to(dtype) first");
}

void check_floating(const Tensor& a, const char* op) {
  RT_CHECK(is_floating_point(a.dtype()), op, ": needs a floating-point tensor, got ", a.describe());
}

void check_int64(const Tensor& index, const char* op, const char* what) {
  RT_CHECK(index.dtype() == DType::kInt64, op, ": ", what, " must be int64, got ", index.describe());
}

Tensor unary_op(UnaryOp op, const Tensor& a) {
  const char* name = kernels::unary_op_name(op);
  check_defined(a, name, "input");
  if (op != UnaryOp::kNeg && op != UnaryOp::kAbs && op != UnaryOp::kRelu) check_floating(a, name);
  Tensor out = Tensor::empty(a.shape(), a.dtype(), a.device());
  if (out.numel() > 0) RT_KERNEL(a, unary)(op, a, out);
  return out;
}

Tensor binary_op(BinaryOp op, const Tensor& a, const Tensor& b) {
  const char* name = kernels::binary_op_name(op);
  check_defined(a, name, "first operand");
  check_defined(b, name, "second operand");
  check_same_device(a, b, name);
  check_same_dtype(a, b, name);
  Shape shape = broadcast_shapes(a.shape(), b.shape(), name);
  Tensor out = Tensor::empty(shape, a.dtype(), a.device());
  if (out.numel() > 0) RT_KERNEL(a, binary)(op, a.expand(shape), b.expand(shape), out);
  return out;
}

bool is_comparison(BinaryOp op) {
  return op == BinaryOp::kEq || op == BinaryOp::kNe || op == BinaryOp::kLt || op == BinaryOp::kLe ||
         op == BinaryOp::kGt || op == BinaryOp::kGe;
}

// An integer tensor compared with a scalar that is not one of its values (2.5, -0.5, NaN,
// 1e30): the kernels convert the scalar to the tensor's dtype, truncating and saturating,
// so lt(int{2}, 2.5) was 0 and eq(int{2}, 2.5) was 1. PyTorch compares in a floating dtype.
// Here the comparison is rewritten into an exact one against an integer the dtype holds
// (x < 2.5 <=> x <= 2, x > -0.5 <=> x > -1, x == 2.5 never), which gives the answer of
// comparing the exact values, on every device, without int64's rounding in double.
std::pair<BinaryOp, double> exact_integer_comparison(BinaryOp op, double s, DType dtype) {
  // [lo, -lo) is the dtype's range; both ends are powers of two, exact in double.
  RT_CHECK(dtype == DType::kInt32 || dtype == DType::kInt64, "exact_integer_comparison: no range known for ",
           dtype_name(dtype), "; add it here");
  const double lo = dtype == DType::kInt32 ? -2147483648.0 : -9223372036854775808.0;
  if (s >= lo && s < -lo && s == std::floor(s)) return {op, s};  // a value of the dtype: exact already
  const std::pair<BinaryOp, double> always_true{BinaryOp::kGe, lo}, always_false{BinaryOp::kLt, lo};
  if (std::isnan(s)) return op == BinaryOp::kNe ? always_true : always_false;
  if (op == BinaryOp::kEq) return always_false;  // no value of the dtype equals s
  if (op == BinaryOp::kNe) return always_true;
  const bool below = op == BinaryOp::kLt || op == BinaryOp::kLe;  // asks "x < s" or "x <= s"
  if (s >= -lo) return below ? always_true : always_false;        // above the range, +inf too
  if (s < lo) return below ? always_false : always_true;          // below the range, -inf too
  // A fraction inside the range: floor(s) is a value of the dtype, and for an integer x,
  // x < s and x <= s mean x <= floor(s); x > s and x >= s mean x > floor(s).
  return {below ? BinaryOp::kLe : BinaryOp::kGt, std::floor(s)};
}

Tensor scalar_op(BinaryOp op, const Tensor& a, double b) {
  const char* name = kernels::binary_op_name(op);
  check_defined(a, name, "operand");
  if (!is_floating_point(a.dtype()) && is_comparison(op))
    std::tie(op, b) = exact_integer_comparison(op, b, a.dtype());
  Tensor out = Tensor::empty(a.shape(), a.dtype(), a.device());
  if (out.numel() > 0) RT_KERNEL(a, binary_scalar)(op, a, b, out);
  return out;
}

// A dim of `a` for an op that runs along one (a reduction, softmax, gather), wrapped. A 0-d
// tensor accepts dim 0 and -1, as PyTorch (the op sees its one element); the wrapped value is
// then 0.
int64_t wrap_reduction_dim(int64_t dim, const Tensor& a, const char* op) {
  if (a.dim() > 0) return wrap_dim(dim, a.dim(), op);
  RT_CHECK(dim == 0 || dim == -1, op, ": dim ", dim, " is out of range for the 0-d tensor ", a.describe(),
           " (a 0-d tensor takes dim 0 or -1, or no dims)");
  return 0;
}

// reduce_mask[d] for the given dims (all dims when empty); throws on repeats. A 0-d tensor
// takes dim 0 (or -1) and has an empty mask whatever the dims.
std::vector<bool> reduction_mask(const Tensor& a, const std::vector<int64_t>& dims, const char* op) {
  std::vector<bool> mask(std::max<int64_t>(a.dim(), 1), dims.empty());
  for (int64_t d : dims) {
    int64_t w = wrap_reduction_dim(d, a, op);
    RT_CHECK(!mask[w], op, ": dim ", d, " appears twice in the reduction dims");
    mask[w] = true;
  }
  mask.resize(a.dim());
  return mask;
}

Tensor reduce_op(ReduceOp op, const Tensor& a, const std::vector<int64_t>& dims, bool keepdim,
                 const char* name) {
  check_defined(a, name, "input");
  std::vector<bool> mask = reduction_mask(a, dims, name);
  Shape kept = a.shape();
  for (int64_t d = 0; d < a.dim(); ++d) {
    if (!mask[d]) continue;
    RT_CHECK(op == ReduceOp::kSum || a.shape()[d] > 0, name, ": cannot reduce over the empty dim ", d,
             " of ", a.describe(), " (max/min of nothing is undefined)");
    kept[d] = 1;
  }
  Tensor out = Tensor::empty(kept, a.dtype(), a.device());
  if (out.numel() > 0) {
    if (a.numel() == 0) fill_(out, 0.0);  // sum over an empty dim
    else RT_KERNEL(a, reduce)(op, a, mask, out);
  }
  if (keepdim) return out;
  Shape squeezed;
  for (int64_t d = 0; d < a.dim(); ++d)
    if (!mask[d]) squeezed.push_back(a.shape()[d]);
  return out.view(squeezed);
}

// Positions a window of `window` elements takes along an axis of `extent` (padding included)
// in steps of `stride`: (extent - window) / stride + 1, and 0 when the window does not fit.
// (C++ division rounds toward zero, so without the check a window one larger than the input
// would give (-1) / 2 + 1 = 1 position.)
int64_t window_positions(int64_t extent, int64_t window, int64_t stride) {
  return extent < window ? 0 : (extent - window) / stride + 1;
}

// a * b + c with int64 overflow checked; `what` names the quantity in the error.
int64_t checked_mul_add(int64_t a, int64_t b, int64_t c, const char* op, const char* what) {
  int64_t r = 0;
  RT_CHECK(!__builtin_mul_overflow(a, b, &r) && !__builtin_add_overflow(r, c, &r), op, ": the ", what,
           " (", a, " * ", b, " + ", c, ") overflows int64; use smaller sizes, padding or dilation");
  return r;
}

// Padded extent (size + 2 * pad) and dilated kernel extent (dilation * (k - 1) + 1), overflow
// checked; params must already be validated (pad >= 0, dilation >= 1, k >= 0).
int64_t padded_extent(int64_t size, int64_t pad, const char* op) {
  return checked_mul_add(pad, 2, size, op, "padded input size");
}
int64_t dilated_kernel(int64_t k, int64_t dilation, const char* op) {
  return checked_mul_add(dilation, k - 1, 1, op, "dilated kernel size");
}

Shape conv_output_shape(const Shape& in, const Shape& w, const Conv2dParams& p,
                        const char* op = "conv2d") {
  int64_t ho = window_positions(padded_extent(in[2], p.pad_h, op), dilated_kernel(w[2], p.dilation_h, op),
                                p.stride_h);
  int64_t wo = window_positions(padded_extent(in[3], p.pad_w, op), dilated_kernel(w[3], p.dilation_w, op),
                                p.stride_w);
  return {in[0], w[0], ho, wo};
}

void check_conv(const Tensor& input, const Shape& weight_shape, const Conv2dParams& p, const char* op) {
  RT_CHECK(input.dim() == 4, op, ": input must be [N, C, H, W], got ", input.describe());
  RT_CHECK(weight_shape.size() == 4, op, ": weight must be [O, C/groups, kh, kw], got ",
           shape_str(weight_shape));
  RT_CHECK(p.groups >= 1 && input.size(1) % p.groups == 0 && weight_shape[0] % p.groups == 0, op,
           ": groups=", p.groups, " must divide input channels ", input.size(1), " and output channels ",
           weight_shape[0]);
  RT_CHECK(weight_shape[1] * p.groups == input.size(1), op, ": input ", input.describe(), " has ",
           input.size(1), " channels but weight ", shape_str(weight_shape), " with groups=", p.groups,
           " expects ", weight_shape[1] * p.groups);
  RT_CHECK(p.stride_h >= 1 && p.stride_w >= 1, op, ": stride must be at least 1, got ", p.stride_h,
           "x", p.stride_w);
  RT_CHECK(p.dilation_h >= 1 && p.dilation_w >= 1, op, ": dilation must be at least 1, got ",
           p.dilation_h, "x", p.dilation_w, " (1 means no dilation)");
  RT_CHECK(p.pad_h >= 0 && p.pad_w >= 0, op, ": padding must be non-negative, got ", p.pad_h, "x",
           p.pad_w);
  RT_CHECK(weight_shape[2] >= 1 && weight_shape[3] >= 1, op, ": kernel size must be at least 1x1, got ",
           shape_str(weight_shape));
  Shape out = conv_output_shape(input.shape(), weight_shape, p, op);
  RT_CHECK(out[2] > 0 && out[3] > 0, op, ": kernel ", weight_shape[2], "x", weight_shape[3],
           " (dilated) is larger than the padded input ", input.describe());
}

Shape pool_output_shape(const Tensor& input, const Pool2dParams& p, const char* op) {
  RT_CHECK(input.dim() == 4, op, ": input must be [N, C, H, W], got ", input.describe());
  RT_CHECK(p.kernel_h >= 1 && p.kernel_w >= 1, op, ": kernel size must be at least 1, got ", p.kernel_h,
           "x", p.kernel_w);
  RT_CHECK(p.stride_h >= 1 && p.stride_w >= 1, op, ": stride must be at least 1, got ", p.stride_h,
           "x", p.stride_w);
  RT_CHECK(p.pad_h >= 0 && p.pad_w >= 0, op, ": padding must be non-negative, got ", p.pad_h, "x",
           p.pad_w);
  // pad <= kernel / 2 (PyTorch's rule), written without overflowing 2 * pad.
  RT_CHECK(p.pad_h <= p.kernel_h / 2 && p.pad_w <= p.kernel_w / 2, op, ": padding ", p.pad_h, "x",
           p.pad_w, " must be at most half the kernel size ", p.kernel_h, "x", p.kernel_w);
  int64_t ho = window_positions(padded_extent(input.size(2), p.pad_h, op), p.kernel_h, p.stride_h);
  int64_t wo = window_positions(padded_extent(input.size(3), p.pad_w, op), p.kernel_w, p.stride_w);
  RT_CHECK(ho > 0 && wo > 0, op, ": window ", p.kernel_h, "x", p.kernel_w, " is larger than ",
           input.describe());
  return {input.size(0), input.size(1), ho, wo};
}
}  // namespace

// ------------------------------------------------------------------ factories

Tensor& fill_(Tensor& t, double value) {
  check_defined(t, "fill_", "tensor");
  if (t.numel() > 0) RT_KERNEL(t, fill)(t, value);
  t.bump_version();
  return t;
}
Tensor& zero_(Tensor& t) { return fill_(t, 0.0); }

Tensor full(const Shape& shape, double value, DType dtype, Device device) {
  Tensor t = Tensor::empty(shape, dtype, device);
  return fill_(t, value);
}
Tensor zeros(const Shape& shape, DType dtype, Device device) { return full(shape, 0.0, dtype, device); }
Tensor ones(const Shape& shape, DType dtype, Device device) { return full(shape, 1.0, dtype, device); }
Tensor zeros_like(const Tensor& t) { return zeros(t.shape(), t.dtype(), t.device()); }
Tensor ones_like(const Tensor& t) { return ones(t.shape(), t.dtype(), t.device()); }
Tensor full_like(const Tensor& t, double value) { return full(t.shape(), value, t.dtype(), t.device()); }
Tensor scalar_tensor(double value, DType dtype, Device device) { return full({}, value, dtype, device); }

Tensor arange(double start, double end, double step, DType dtype, Device device) {
  RT_CHECK(std::isfinite(start) && std::isfinite(end) && std::isfinite(step), "arange: start ", start,
           ", end ", end, " and step ", step, " must all be finite");
  RT_CHECK(step != 0, "arange: step must be nonzero (start ", start, ", end ", end, ")");
  // 2^53: beyond it doubles skip integers, and no memory holds that many elements anyway.
  constexpr double kMaxCount = 9007199254740992.0;
  if (!is_floating_point(dtype)) {
    // Integer dtypes, exactly in int64 (as PyTorch's int64 arange): start, end and step are
    // truncated toward zero first. Values computed in double and then truncated repeated
    // themselves (arange(-2.5, 2) gave -2, -1, 0, 0, 1) and skipped past 2^53 (2^53, 2^53, ...).
    const int64_t lo = saturating_float_to_int<int64_t>(start), hi = saturating_float_to_int<int64_t>(end);
    const int64_t st = saturating_float_to_int<int64_t>(step);
    RT_CHECK(st != 0, "arange: step ", step, " truncates to 0 for the integer dtype ", dtype_name(dtype),
             "; use a step of magnitude at least 1, or a floating dtype");
    const __int128 span = static_cast<__int128>(hi) - lo;
    __int128 count = span / st;  // rounded toward zero; up to the ceiling below
    if (span % st != 0 && (span % st > 0) == (st > 0)) ++count;
    if (count < 0) count = 0;
    RT_CHECK(count <= static_cast<__int128>(kMaxCount), "arange: start ", start, ", end ", end, ", step ",
             step, " give ", static_cast<double>(count), " elements, too many; use a larger step or a smaller range");
    const int64_t n = static_cast<int64_t>(count);
    Tensor values = Tensor::empty({n}, DType::kInt64, Device::cpu());
    int64_t* v = values.data<int64_t>();
    // Each value lies between lo and hi; i * st alone may not fit an int64 (lo < 0 < hi).
    for (int64_t i = 0; i < n; ++i) v[i] = static_cast<int64_t>(lo + static_cast<__int128>(i) * st);
    if (dtype == DType::kInt32 && n > 0) {
      const int64_t smallest = std::min(v[0], v[n - 1]), largest = std::max(v[0], v[n - 1]);
      RT_CHECK(smallest >= std::numeric_limits<int32_t>::min() && largest <= std::numeric_limits<int32_t>::max(),
               "arange: values from ", v[0], " to ", v[n - 1], " do not fit int32; use DType::kInt64");
    }
    return values.to(device, dtype);
  }
  const double count = std::ceil((end - start) / step);
  RT_CHECK(std::isfinite(count) && count <= kMaxCount, "arange: start ", start, ", end ", end,
           ", step ", step, " give ", count, " elements, too many; use a larger step or a smaller range");
  const int64_t n = count > 0 ? static_cast<int64_t>(count) : 0;
  Tensor values = Tensor::empty({n}, DType::kFloat64, Device::cpu());
  double* v = values.data<double>();
  for (int64_t i = 0; i < n; ++i) v[i] = start + static_cast<double>(i) * step;
  return values.to(device, dtype);
}

// ------------------------------------------------------------------ elementwise

Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op) {
  size_t n = std::max(a.size(), b.size());
  Shape out(n);
  for (size_t i = 0; i < n; ++i) {
    int64_t da = i + a.size() >= n ? a[i + a.size() - n] : 1;
    int64_t db = i + b.size() >= n ? b[i + b.size() - n] : 1;
    RT_CHECK(da == db || da == 1 || db == 1, op, ": shapes ", shape_str(a), " and ", shape_str(b),
             " cannot be broadcast together (dim ", i, ": ", da, " vs ", db, ")");
    out[i] = da == 1 ? db : da;
  }
  return out;
}

Tensor add(const Tensor& a, const Tensor& b) { return binary_op(BinaryOp::kAdd, a, b); }
Tensor sub(const Tensor& a, const Tensor& b) { return binary_op(BinaryOp::kSub, a, b); }
Tensor mul(const Tensor& a, const Tensor& b) { return binary_op(BinaryOp::kMul, a, b); }
Tensor div(const Tensor& a, const Tensor& b) { return binary_op(BinaryOp::kDiv, a, b); }
Tensor pow(const Tensor& a, const Tensor& b) { return binary_op(BinaryOp::kPow, a, b); }
Tensor maximum(const Tensor& a, const Tensor& b) { return binary_op(BinaryOp::kMax, a, b); }
Tensor minimum(const Tensor& a, const Tensor& b) { return binary_op(BinaryOp::kMin, a, b); }
Tensor eq(const Tensor& a, const Tensor& b) { return binary_op(BinaryOp::kEq, a, b); }
Tensor ne(const Tensor& a, const Tensor& b) { return binary_op(BinaryOp::kNe, a, b); }
Tensor lt(const Tensor& a, const Tensor& b) { return binary_op(BinaryOp::kLt, a, b); }
Tensor le(const Tensor& a, const Tensor& b) { return binary_op(BinaryOp::kLe, a, b); }
Tensor gt(const Tensor& a, const Tensor& b) { return binary_op(BinaryOp::kGt, a, b); }
Tensor ge(const Tensor& a, const Tensor& b) { return binary_op(BinaryOp::kGe, a, b); }

Tensor add(const Tensor& a, double b) { return scalar_op(BinaryOp::kAdd, a, b); }
Tensor sub(const Tensor& a, double b) { return scalar_op(BinaryOp::kSub, a, b); }
Tensor mul(const Tensor& a, double b) { return scalar_op(BinaryOp::kMul, a, b); }
Tensor div(const Tensor& a, double b) { return scalar_op(BinaryOp::kDiv, a, b); }
Tensor pow(const Tensor& a, double exponent) { return scalar_op(BinaryOp::kPow, a, exponent); }
Tensor gt(const Tensor& a, double b) { return scalar_op(BinaryOp::kGt, a, b); }
Tensor lt(const Tensor& a, double b) { return scalar_op(BinaryOp::kLt, a, b); }
Tensor eq(const Tensor& a, double b) { return scalar_op(BinaryOp::kEq, a, b); }
Tensor ne(const Tensor& a, double b) { return scalar_op(BinaryOp::kNe, a, b); }
Tensor le(const Tensor& a, double b) { return scalar_op(BinaryOp::kLe, a, b); }
Tensor ge(const Tensor& a, double b) { return scalar_op(BinaryOp::kGe, a, b); }

Tensor neg(const Tensor& a) { return unary_op(UnaryOp::kNeg, a); }
Tensor exp(const Tensor& a) { return unary_op(UnaryOp::kExp, a); }
Tensor log(const Tensor& a) { return unary_op(UnaryOp::kLog, a); }
Tensor sqrt(const Tensor& a) { return unary_op(UnaryOp::kSqrt, a); }
Tensor abs(const Tensor& a) { return unary_op(UnaryOp::kAbs, a); }
Tensor relu(const Tensor& a) { return unary_op(UnaryOp::kRelu, a); }
Tensor gelu(const Tensor& a) { return unary_op(UnaryOp::kGelu, a); }
Tensor gelu_grad(const Tensor& a) { return unary_op(UnaryOp::kGeluGrad, a); }
Tensor tanh(const Tensor& a) { return unary_op(UnaryOp::kTanh, a); }
Tensor sigmoid(const Tensor& a) { return unary_op(UnaryOp::kSigmoid, a); }
Tensor isfinite(const Tensor& a) { return unary_op(UnaryOp::kIsFinite, a); }

bool all_finite(const Tensor& a) {
  check_defined(a, "all_finite", "input");
  if (a.numel() == 0 || !is_floating_point(a.dtype())) return true;
  return RT_KERNEL(a, all_finite)(a);
}

Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b) {
  check_defined(cond, "where", "condition");
  check_defined(a, "where", "first value");
  check_defined(b, "where", "second value");
  check_same_device(cond, a, "where");
  check_same_device(a, b, "where");
  check_same_dtype(a, b, "where");
  Shape shape = broadcast_shapes(broadcast_shapes(cond.shape(), a.shape(), "where"), b.shape(), "where");
  Tensor out = Tensor::empty(shape, a.dtype(), a.device());
  if (out.numel() > 0) RT_KERNEL(a, where)(cond.expand(shape), a.expand(shape), b.expand(shape), out);
  return out;
}

Tensor masked_fill(const Tensor& a, const Tensor& mask, double value) {
  check_defined(a, "masked_fill", "input");
  return where(mask, full({}, value, a.dtype(), a.device()), a);
}

Tensor& add_(Tensor& a, const Tensor& b, double alpha) {
  check_defined(a, "add_", "destination");
  check_defined(b, "add_", "source");
  check_same_device(a, b, "add_");
  check_same_dtype(a, b, "add_");
  Shape shape = broadcast_shapes(a.shape(), b.shape(), "add_");
  RT_CHECK(shape == a.shape(), "add_: cannot add ", b.describe(), " into ", a.describe(),
           " in place: the result would have shape ", shape_str(shape));
  if (a.numel() == 0) return a;
  check_in_place(a, b.expand(shape), "add_");
  if (!is_floating_point(a.dtype()))  // as PyTorch: an integer add takes an integer alpha
    RT_CHECK(std::trunc(alpha) == alpha && std::abs(alpha) <= 9.2e18, "add_: alpha ", alpha,
             " must be an integer for the integer tensor ", a.describe(),
             " (convert it to a floating dtype for a fractional alpha)");
  if (alpha == 1.0) {
    RT_KERNEL(a, binary)(BinaryOp::kAdd, a, b.expand(shape), a);
  } else {
    RT_KERNEL(a, axpy)(alpha, b.expand(shape), a);  // one pass, no temporary
  }
  a.bump_version();
  return a;
}

Tensor& mul_(Tensor& a, const Tensor& b) {
  check_defined(a, "mul_", "destination");
  check_defined(b, "mul_", "source");
  check_same_device(a, b, "mul_");
  check_same_dtype(a, b, "mul_");
  Shape shape = broadcast_shapes(a.shape(), b.shape(), "mul_");
  RT_CHECK(shape == a.shape(), "mul_: cannot multiply ", a.describe(), " by ", b.describe(),
           " in place: the result would have shape ", shape_str(shape));
  if (a.numel() > 0) {
    check_in_place(a, b.expand(shape), "mul_");
    RT_KERNEL(a, binary)(BinaryOp::kMul, a, b.expand(shape), a);
  }
  a.bump_version();
  return a;
}

Tensor& mul_(Tensor& a, double b) {
  check_defined(a, "mul_", "destination");
  if (a.numel() > 0) {
    check_in_place(a, a, "mul_");  // rejects an expanded (stride-0) destination
    RT_KERNEL(a, binary_scalar)(BinaryOp::kMul, a, b, a);
  }
  a.bump_version();
  return a;
}

Tensor& div_(Tensor& a, double b) {
  check_defined(a, "div_", "destination");
  if (a.numel() > 0) {
    check_in_place(a, a, "div_");  // rejects an expanded (stride-0) destination
    RT_KERNEL(a, binary_scalar)(BinaryOp::kDiv, a, b, a);
  }
  a.bump_version();
  return a;
}

Tensor operator+(const Tensor& a, const Tensor& b) { return add(a, b); }
Tensor operator-(const Tensor& a, const Tensor& b) { return sub(a, b); }
Tensor operator*(const Tensor& a, const Tensor& b) { return mul(a, b); }
Tensor operator/(const Tensor& a, const Tensor& b) { return div(a, b); }
Tensor operator-(const Tensor& a) { return neg(a); }
Tensor operator+(const Tensor& a, double b) { return add(a, b); }
Tensor operator-(const Tensor& a, double b) { return sub(a, b); }
Tensor operator*(const Tensor& a, double b) { return mul(a, b); }
Tensor operator/(const Tensor& a, double b) { return div(a, b); }

// ------------------------------------------------------------------ reductions

Tensor sum(const Tensor& a, const std::vector<int64_t>& dims, bool keepdim) {
  return reduce_op(ReduceOp::kSum, a, dims, keepdim, "sum");
}

Tensor mean(const Tensor& a, const std::vector<int64_t>& dims, bool keepdim) {
  check_defined(a, "mean", "input");
  check_floating(a, "mean");
  std::vector<bool> mask = reduction_mask(a, dims, "mean");
  int64_t count = 1;
  for (int64_t d = 0; d < a.dim(); ++d)
    if (mask[d]) count *= a.shape()[d];
  // float16/bfloat16: sum and divide in float32, round once (the sum of 10000 half tens is
  // inf; their mean is 10). to() is free when the dtype is already the one asked for.
  Tensor total = sum(a.to(accumulation_dtype(a.dtype())), dims, keepdim);
  Tensor result = count == 0 ? full_like(total, std::nan("")) : div(total, static_cast<double>(count));
  return result.to(a.dtype());
}

Tensor amax(const Tensor& a, const std::vector<int64_t>& dims, bool keepdim) {
  return reduce_op(ReduceOp::kMax, a, dims, keepdim, "amax");
}
Tensor amin(const Tensor& a, const std::vector<int64_t>& dims, bool keepdim) {
  return reduce_op(ReduceOp::kMin, a, dims, keepdim, "amin");
}

std::pair<Tensor, Tensor> max(const Tensor& a, int64_t dim, bool keepdim) {
  check_defined(a, "max", "input");
  // A 0-d tensor takes dim 0 or -1 (as PyTorch) and gives a 0-d value and index 0, keepdim or not.
  if (a.dim() == 0) {
    wrap_reduction_dim(dim, a, "max");
    auto [values, indices] = max(a.reshape({1}), 0, /*keepdim=*/false);
    return {values, indices};
  }
  int64_t d = wrap_dim(dim, a.dim(), "max");
  RT_CHECK(a.shape()[d] > 0, "max: cannot take the max over the empty dim ", d, " of ", a.describe());
  Shape kept = a.shape();
  kept[d] = 1;
  Tensor values = Tensor::empty(kept, a.dtype(), a.device());
  Tensor indices = Tensor::empty(kept, DType::kInt64, a.device());
  if (values.numel() > 0) RT_KERNEL(a, max_along)(a.contiguous(), d, values, indices);
  if (!keepdim) {
    values = values.squeeze(d);
    indices = indices.squeeze(d);
  }
  return {values, indices};
}

Tensor argmax(const Tensor& a, int64_t dim, bool keepdim) { return max(a, dim, keepdim).second; }
Tensor argmax(const Tensor& a) { return argmax(a.reshape({-1}), 0, false); }

Tensor sum_to(const Tensor& a, const Shape& shape) {
  check_defined(a, "sum_to", "input");
  if (a.shape() == shape) return a;
  RT_CHECK(shape.size() <= a.shape().size(), "sum_to: cannot sum ", a.describe(), " to larger rank ",
           shape_str(shape));
  size_t lead = a.shape().size() - shape.size();
  std::vector<int64_t> dims;
  for (size_t i = 0; i < a.shape().size(); ++i) {
    if (i < lead) {
      dims.push_back(static_cast<int64_t>(i));
    } else if (shape[i - lead] == 1 && a.shape()[i] != 1) {
      dims.push_back(static_cast<int64_t>(i));
    } else {
      RT_CHECK(shape[i - lead] == a.shape()[i], "sum_to: ", a.describe(), " is not broadcast from ",
               shape_str(shape));
    }
  }
  return sum(a, dims, true).reshape(shape);
}

// ------------------------------------------------------------------ linear algebra

namespace {
// [B, m, k] view of a batched operand without copying when its batch dims allow.
Tensor as_batched_3d(const Tensor& t) {
  if (t.dim() == 3) return t;
  int64_t rows = t.size(-2), cols = t.size(-1);
  if (t.dim() == 2) return t.unsqueeze(0);
  return t.reshape({-1, rows, cols});
}

// out3 [B,m,n] = a3 [B,m,k] @ b3 [B,k,n]; k == 0 gives zeros (an empty sum).
void batched_matmul_into(const Tensor& a3, const Tensor& b3, Tensor out3) {
  if (out3.numel() == 0) return;
  if (a3.size(-1) == 0) {
    fill_(out3, 0.0);
  } else {
    RT_KERNEL(a3, batched_matmul)(a3, b3, out3);
  }
}
}  // namespace

Tensor matmul(const Tensor& a, const Tensor& b) {
  check_defined(a, "matmul", "first operand");
  check_defined(b, "matmul", "second operand");
  check_same_device(a, b, "matmul");
  check_same_dtype(a, b, "matmul");
  check_floating(a, "matmul");
  RT_CHECK(a.dim() >= 1 && b.dim() >= 1, "matmul: operands must have at least one dim, got ",
           a.describe(), " and ", b.describe());
  Tensor lhs = a.dim() == 1 ? a.unsqueeze(0) : a;
  Tensor rhs = b.dim() == 1 ? b.unsqueeze(1) : b;
  int64_t m = lhs.size(-2), k = lhs.size(-1), n = rhs.size(-1);
  RT_CHECK(rhs.size(-2) == k, "matmul: inner dimensions differ: ", a.describe(), " @ ", b.describe(),
           " (", k, " vs ", rhs.size(-2), ")");
  Shape batch_a(lhs.shape().begin(), lhs.shape().end() - 2);
  Shape batch_b(rhs.shape().begin(), rhs.shape().end() - 2);
  Shape batch = broadcast_shapes(batch_a, batch_b, "matmul");
  Shape full_a = batch, full_b = batch, out_shape = batch;
  full_a.insert(full_a.end(), {m, k});
  full_b.insert(full_b.end(), {k, n});
  out_shape.insert(out_shape.end(), {m, n});
  Tensor out = Tensor::empty(out_shape, a.dtype(), a.device());
  if (out.numel() > 0)
    batched_matmul_into(as_batched_3d(lhs.expand(full_a)), as_batched_3d(rhs.expand(full_b)), as_batched_3d(out));
  if (a.dim() == 1) out = out.squeeze(-2);
  if (b.dim() == 1) out = out.squeeze(-1);
  return out;
}

void matmul_out(const Tensor& a, const Tensor& b, const Tensor& out) {
  check_defined(a, "matmul_out", "first operand");
  check_defined(b, "matmul_out", "second operand");
  check_defined(out, "matmul_out", "output");
  check_same_device(a, b, "matmul_out");
  check_same_device(a, out, "matmul_out");
  check_same_dtype(a, b, "matmul_out");
  check_same_dtype(a, out, "matmul_out");
  check_floating(a, "matmul_out");
  RT_CHECK(a.dim() == 2 && b.dim() == 2 && a.size(1) == b.size(0), "matmul_out: needs [m,k] @ [k,n], got ",
           a.describe(), " @ ", b.describe());
  RT_CHECK(out.dim() == 2 && out.size(0) == a.size(0) && out.size(1) == b.size(1) && out.is_contiguous(),
           "matmul_out: the output must be a contiguous [", a.size(0), ", ", b.size(1), "] tensor, got ",
           out.describe());
  check_no_overlap(out, a, "matmul_out");
  check_no_overlap(out, b, "matmul_out");
  batched_matmul_into(as_batched_3d(a), as_batched_3d(b), as_batched_3d(out));
  out.bump_version();
}

Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  check_defined(x, "linear", "input");
  check_defined(weight, "linear", "weight");
  RT_CHECK(weight.dim() == 2, "linear: weight must be [out_features, in_features], got ",
           weight.describe());
  RT_CHECK(x.dim() >= 1 && x.size(-1) == weight.size(1), "linear: input ", x.describe(),
           " does not end in in_features=", weight.size(1), " of weight ", weight.describe());
  check_same_device(x, weight, "linear");
  check_same_dtype(x, weight, "linear");
  if (bias.defined()) {
    RT_CHECK(bias.dim() == 1 && bias.size(0) == weight.size(0), "linear: bias ", bias.describe(),
             " must be [", weight.size(0), "]");
    check_same_device(x, bias, "linear");
    check_same_dtype(x, bias, "linear");
  }
  Tensor y = matmul(x, weight.t());
  if (bias.defined()) {
    add_(y, bias);
  }
  return y;
}

// ------------------------------------------------------------------ convolution, pooling

Tensor conv2d(const Tensor& input, const Tensor& weight, const Tensor& bias, const Conv2dParams& p) {
  check_defined(input, "conv2d", "input");
  check_defined(weight, "conv2d", "weight");
  check_same_device(input, weight, "conv2d");
  check_same_dtype(input, weight, "conv2d");
  check_floating(input, "conv2d");
  check_conv(input, weight.shape(), p, "conv2d");
  if (bias.defined()) {
    check_same_device(input, bias, "conv2d");
    check_same_dtype(input, bias, "conv2d");
    RT_CHECK(bias.dim() == 1 && bias.size(0) == weight.size(0), "conv2d: bias ", bias.describe(),
             " must be [", weight.size(0), "]");
  }
  Tensor out = Tensor::empty(conv_output_shape(input.shape(), weight.shape(), p, "conv2d"), input.dtype(),
                             input.device());
  if (out.numel() > 0)
    RT_KERNEL(input, conv2d)(input.contiguous(), weight.contiguous(),
                             bias.defined() ? bias.contiguous() : bias, p, out);
  return out;
}

Tensor conv2d_backward_input(const Tensor& grad_out, const Tensor& weight, const Shape& input_shape,
                             const Conv2dParams& p) {
  check_same_device(grad_out, weight, "conv2d_backward_input");
  check_same_dtype(grad_out, weight, "conv2d_backward_input");
  Tensor grad_input = Tensor::empty(input_shape, grad_out.dtype(), grad_out.device());
  check_conv(grad_input, weight.shape(), p, "conv2d_backward_input");
  RT_CHECK(grad_out.shape() == conv_output_shape(input_shape, weight.shape(), p, "conv2d_backward_input"),
           "conv2d_backward_input: grad_out ", grad_out.describe(), " does not match the output shape");
  if (grad_input.numel() > 0)
    RT_KERNEL(grad_out, conv2d_backward_input)(grad_out.contiguous(), weight.contiguous(), p, grad_input);
  return grad_input;
}

Tensor conv2d_backward_weight(const Tensor& grad_out, const Tensor& input, const Shape& weight_shape,
                              const Conv2dParams& p) {
  check_same_device(grad_out, input, "conv2d_backward_weight");
  check_same_dtype(grad_out, input, "conv2d_backward_weight");
  check_conv(input, weight_shape, p, "conv2d_backward_weight");
  RT_CHECK(grad_out.shape() == conv_output_shape(input.shape(), weight_shape, p, "conv2d_backward_weight"),
           "conv2d_backward_weight: grad_out ", grad_out.describe(), " does not match the output shape");
  Tensor grad_weight = Tensor::empty(weight_shape, grad_out.dtype(), grad_out.device());
  if (grad_weight.numel() > 0) {
    if (grad_out.numel() == 0) fill_(grad_weight, 0.0);
    else RT_KERNEL(grad_out, conv2d_backward_weight)(grad_out.contiguous(), input.contiguous(), p,
                                                     grad_weight);
  }
  return grad_weight;
}

std::pair<Tensor, Tensor> max_pool2d(const Tensor& input, const Pool2dParams& p) {
  check_defined(input, "max_pool2d", "input");
  check_floating(input, "max_pool2d");
  Shape shape = pool_output_shape(input, p, "max_pool2d");
  Tensor out = Tensor::empty(shape, input.dtype(), input.device());
  Tensor indices = Tensor::empty(shape, DType::kInt64, input.device());
  if (out.numel() > 0) RT_KERNEL(input, max_pool2d)(input.contiguous(), p, out, indices);
  return {out, indices};
}

Tensor max_pool2d_backward(const Tensor& grad_out, const Tensor& indices, const Shape& input_shape) {
  check_same_device(grad_out, indices, "max_pool2d_backward");
  check_int64(indices, "max_pool2d_backward", "indices");
  RT_CHECK(grad_out.shape() == indices.shape() && input_shape.size() == 4,
           "max_pool2d_backward: grad_out ", grad_out.describe(), " and indices ", indices.describe(),
           " must match, input shape ", shape_str(input_shape), " must be 4-D");
  Tensor grad_input = zeros(input_shape, grad_out.dtype(), grad_out.device());
  if (grad_out.numel() > 0)
    RT_KERNEL(grad_out, max_pool2d_backward)(grad_out.contiguous(), indices.contiguous(), grad_input);
  return grad_input;
}

Tensor avg_pool2d(const Tensor& input, const Pool2dParams& p) {
  check_defined(input, "avg_pool2d", "input");
  check_floating(input, "avg_pool2d");
  Tensor out = Tensor::empty(pool_output_shape(input, p, "avg_pool2d"), input.dtype(), input.device());
  if (out.numel() > 0) RT_KERNEL(input, avg_pool2d)(input.contiguous(), p, out);
  return out;
}

Tensor avg_pool2d_backward(const Tensor& grad_out, const Shape& input_shape, const Pool2dParams& p) {
  Tensor grad_input = zeros(input_shape, grad_out.dtype(), grad_out.device());
  RT_CHECK(grad_out.shape() == pool_output_shape(grad_input, p, "avg_pool2d_backward"),
           "avg_pool2d_backward: grad_out ", grad_out.describe(), " does not match the output shape");
  if (grad_out.numel() > 0)
    RT_KERNEL(grad_out, avg_pool2d_backward)(grad_out.contiguous(), p, grad_input);
  return grad_input;
}

// ------------------------------------------------------------------ softmax, losses

namespace {
Tensor softmax_impl(const Tensor& a, int64_t dim, bool log, const char* op) {
  check_defined(a, op, "input");
  check_floating(a, op);
  // A 0-d tensor is softmaxed as its one-element 1-d view (the kernels want a dim to run along);
  // its dim must still be 0 or -1.
  if (a.dim() == 0) {
    wrap_reduction_dim(dim, a, op);
    return softmax_impl(a.reshape({1}), 0, log, op).reshape({});
  }
  int64_t d = wrap_dim(dim, a.dim(), op);
  Tensor out = Tensor::empty(a.shape(), a.dtype(), a.device());
  if (out.numel() > 0) RT_KERNEL(a, softmax)(a.contiguous(), d, log, out);
  return out;
}

Tensor softmax_backward_impl(const Tensor& grad_out, const Tensor& output, int64_t dim, bool log,
                             const char* op) {
  check_same_device(grad_out, output, op);
  check_same_dtype(grad_out, output, op);
  RT_CHECK(grad_out.shape() == output.shape(), op, ": grad_out ", grad_out.describe(),
           " and output ", output.describe(), " differ in shape");
  if (output.dim() == 0) {
    wrap_reduction_dim(dim, output, op);
    return softmax_backward_impl(grad_out.reshape({1}), output.reshape({1}), 0, log, op).reshape({});
  }
  int64_t d = wrap_dim(dim, output.dim(), op);
  Tensor grad_in = Tensor::empty(output.shape(), output.dtype(), output.device());
  if (grad_in.numel() > 0)
    RT_KERNEL(output, softmax_backward)(grad_out.contiguous(), output.contiguous(), d, log, grad_in);
  return grad_in;
}
}  // namespace

Tensor softmax(const Tensor& a, int64_t dim) { return softmax_impl(a, dim, false, "softmax"); }
Tensor log_softmax(const Tensor& a, int64_t dim) { return softmax_impl(a, dim, true, "log_softmax"); }
Tensor softmax_backward(const Tensor& grad_out, const Tensor& output, int64_t dim) {
  return softmax_backward_impl(grad_out, output, dim, false, "softmax_backward");
}
Tensor log_softmax_backward(const Tensor& grad_out, const Tensor& output, int64_t dim) {
  return softmax_backward_impl(grad_out, output, dim, true, "log_softmax_backward");
}

Tensor cross_entropy(const Tensor& logits, const Tensor& targets, int64_t ignore_index,
                     double label_smoothing) {
  check_defined(logits, "cross_entropy", "logits");
  check_defined(targets, "cross_entropy", "targets");
  check_same_device(logits, targets, "cross_entropy");
  check_floating(logits, "cross_entropy");
  check_int64(targets, "cross_entropy", "targets");
  RT_CHECK(logits.dim() == 2 && targets.dim() == 1 && targets.size(0) == logits.size(0),
           "cross_entropy: expects logits [N, C] and targets [N], got ", logits.describe(), " and ",
           targets.describe());
  RT_CHECK(label_smoothing >= 0.0 && label_smoothing <= 1.0,
           "cross_entropy: label_smoothing must be in [0, 1], got ", label_smoothing);
  // loss_i = (1 - eps) * -logp[i, t_i] + eps * mean_c(-logp[i, c]), averaged over
  // the samples whose target is not ignore_index.
  Tensor logp = log_softmax(logits, 1);
  Tensor valid = ne(targets, full({}, static_cast<double>(ignore_index), DType::kInt64, targets.device()));
  Tensor safe_targets = mul(targets, valid);  // ignored targets read class 0, then get weight 0
  check_class_targets(safe_targets, logits.size(1), ignore_index, "cross_entropy");
  Tensor picked = gather(logp, 1, safe_targets.unsqueeze(1)).squeeze(1);
  Tensor per_sample = mul(picked, -(1.0 - label_smoothing));
  if (label_smoothing > 0) per_sample = sub(per_sample, mul(mean(logp, {1}), label_smoothing));
  // The sums over samples (the loss total and the count of valid targets) in float32 at least,
  // rounded once at the end: in float16 either passes 65504 with a large enough batch.
  const DType acc = accumulation_dtype(logits.dtype());
  Tensor weight = valid.to(acc);
  return div(sum(mul(per_sample.to(acc), weight)), sum(weight)).to(logits.dtype());
}

// ------------------------------------------------------------------ indexing, joining

Tensor gather(const Tensor& a, int64_t dim, const Tensor& index) {
  check_defined(a, "gather", "input");
  check_defined(index, "gather", "index");
  check_same_device(a, index, "gather");
  check_int64(index, "gather", "index");
  int64_t d = wrap_reduction_dim(dim, a, "gather");  // a 0-d input takes dim 0 or -1
  RT_CHECK(index.dim() == a.dim(), "gather: index ", index.describe(), " must have the rank of ",
           a.describe());
  // 0-d: gathered as one-element 1-d views, so every device's kernel sees a dim to run along.
  if (a.dim() == 0) return gather(a.reshape({1}), 0, index.reshape({1})).reshape({});
  for (int64_t i = 0; i < a.dim(); ++i)
    RT_CHECK(i == d || index.size(i) <= a.size(i), "gather: index ", index.describe(),
             " is larger than input ", a.describe(), " in dim ", i);
  Tensor out = Tensor::empty(index.shape(), a.dtype(), a.device());
  if (out.numel() > 0) RT_KERNEL(a, gather)(a, d, index.contiguous(), out);
  return out;
}

Tensor index_select(const Tensor& a, int64_t dim, const Tensor& index) {
  check_defined(a, "index_select", "input");
  check_defined(index, "index_select", "index");
  check_same_device(a, index, "index_select");
  check_int64(index, "index_select", "index");
  int64_t d = wrap_reduction_dim(dim, a, "index_select");  // a 0-d input takes dim 0 or -1
  if (a.dim() == 0) {  // as PyTorch: one index, and the result is 0-d
    RT_CHECK(index.dim() <= 1 && index.numel() == 1, "index_select: the 0-d input ", a.describe(),
             " takes exactly one index (a 0-d or one-element 1-d tensor), got ", index.describe());
    return index_select(a.reshape({1}), 0, index.reshape({1})).reshape({});
  }
  Shape shape(a.shape().begin(), a.shape().begin() + d);
  shape.insert(shape.end(), index.shape().begin(), index.shape().end());
  shape.insert(shape.end(), a.shape().begin() + d + 1, a.shape().end());
  Tensor out = Tensor::empty(shape, a.dtype(), a.device());
  if (out.numel() > 0) RT_KERNEL(a, index_select)(a.contiguous(), d, index.contiguous(), out);
  return out;
}

Tensor& index_add_(Tensor& a, int64_t dim, const Tensor& index, const Tensor& src) {
  check_defined(a, "index_add_", "destination");
  check_same_device(a, index, "index_add_");
  check_same_device(a, src, "index_add_");
  check_same_dtype(a, src, "index_add_");
  check_int64(index, "index_add_", "index");
  int64_t d = wrap_dim(dim, a.dim(), "index_add_");
  Shape expected(a.shape().begin(), a.shape().begin() + d);
  expected.insert(expected.end(), index.shape().begin(), index.shape().end());
  expected.insert(expected.end(), a.shape().begin() + d + 1, a.shape().end());
  RT_CHECK(src.shape() == expected, "index_add_: source ", src.describe(), " must have shape ",
           shape_str(expected), " for index ", index.describe(), " into ", a.describe());
  RT_CHECK(a.is_contiguous(), "index_add_: destination must be contiguous, got strides ",
           shape_str(a.strides()));
  check_in_place(a, src, "index_add_");   // an expanded destination
  check_no_overlap(a, src, "index_add_");  // a scatter: even a == src reads updated rows
  // An int64 destination sharing memory with the index would rewrite indices it has yet to
  // read, after they were range-checked: the writes would land elsewhere, even out of bounds.
  check_no_overlap(a, index, "index_add_");
  if (src.numel() > 0) RT_KERNEL(a, index_add)(a, d, index.contiguous(), src.contiguous());
  a.bump_version();
  return a;
}

void check_index_range(const Tensor& index, int64_t size, const char* op, const char* what,
                       const std::string& fix) {
  if (index.numel() == 0) return;
  // Both bounds in one copy to the host: on a GPU, one wait instead of two.
  const std::vector<int64_t> bounds = stack({amin(index), amax(index)}).to_vector<int64_t>();
  const int64_t lo = bounds[0], hi = bounds[1];
  RT_CHECK(lo >= 0 && hi < size, op, ": ", what, " ", index.describe(), " holds values in [", lo, ", ",
           hi, "] but must lie in [0, ", size - 1, "]; ", fix);
}

void check_class_targets(const Tensor& targets, int64_t classes, int64_t ignore_index, const char* op) {
  check_index_range(targets, classes, op, "targets",
                    "they are class indices into the " + std::to_string(classes) +
                        " columns of the logits; fix the labels, or give samples to skip the "
                        "ignore_index (now " + std::to_string(ignore_index) + ")");
}

Tensor one_hot(const Tensor& index, int64_t num_classes, DType dtype) {
  check_defined(index, "one_hot", "index");
  check_int64(index, "one_hot", "index");
  RT_CHECK(num_classes > 0, "one_hot: num_classes must be positive, got ", num_classes);
  check_index_range(index, num_classes, "one_hot", "index",
                    "fix the labels or raise num_classes (now " + std::to_string(num_classes) + ")");
  Tensor classes = arange(0, static_cast<double>(num_classes), 1, DType::kInt64, index.device());
  return eq(index.unsqueeze(-1), classes).to(dtype);
}

Tensor cat(const std::vector<Tensor>& tensors, int64_t dim) {
  RT_CHECK(!tensors.empty(), "cat: needs at least one tensor");
  for (const Tensor& t : tensors) check_defined(t, "cat", "an input");
  // As PyTorch, a 1-d empty tensor (shape [0]) joins tensors of any rank, adding nothing: the
  // empty start of an accumulation (parts = cat({parts, next})) is such a tensor. The shape
  // comes from the first other tensor.
  const auto skipped = [](const Tensor& t) { return t.dim() == 1 && t.size(0) == 0; };
  size_t ref = 0;
  while (ref + 1 < tensors.size() && skipped(tensors[ref])) ++ref;
  const Tensor& first = tensors[ref];
  for (size_t i = 0; i < tensors.size(); ++i)
    RT_CHECK(tensors[i].dim() > 0, "cat: tensor ", i, " ", tensors[i].describe(),
             " is 0-d and cannot be concatenated; stack() the 0-d tensors, or unsqueeze(0) them first");
  int64_t d = wrap_dim(dim, first.dim(), "cat");
  Shape shape = first.shape();
  shape[d] = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    check_same_device(first, t, "cat");
    check_same_dtype(first, t, "cat");
    if (skipped(t)) continue;
    RT_CHECK(t.dim() == first.dim(), "cat: tensor ", i, " ", t.describe(), " has a different rank than ",
             first.describe());
    for (int64_t j = 0; j < t.dim(); ++j)
      RT_CHECK(j == d || t.size(j) == first.size(j), "cat: tensor ", i, " ", t.describe(),
               " differs from ", first.describe(), " in dim ", j, " (only dim ", d, " may differ)");
    shape[d] += t.size(d);
  }
  Tensor out = Tensor::empty(shape, first.dtype(), first.device());
  int64_t offset = 0;
  for (const Tensor& t : tensors) {
    if (skipped(t)) continue;
    out.narrow(d, offset, t.size(d)).copy_(t);
    offset += t.size(d);
  }
  return out;
}

Tensor stack(const std::vector<Tensor>& tensors, int64_t dim) {
  RT_CHECK(!tensors.empty(), "stack: needs at least one tensor");
  int64_t d = wrap_dim(dim, tensors[0].dim() + 1, "stack");
  std::vector<Tensor> expanded;
  for (size_t i = 0; i < tensors.size(); ++i) {
    RT_CHECK(tensors[i].shape() == tensors[0].shape(), "stack: tensor ", i, " ", tensors[i].describe(),
             " differs in shape from ", tensors[0].describe());
    expanded.push_back(tensors[i].unsqueeze(d));
  }
  return cat(expanded, d);
}

// ------------------------------------------------------------------ test helpers

double max_abs_diff(const Tensor& a, const Tensor& b) {
  RT_CHECK(a.shape() == b.shape(), "max_abs_diff: shapes differ: ", a.describe(), " vs ", b.describe());
  std::vector<double> x = a.to_vector<double>(), y = b.to_vector<double>();
  double worst = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    // Equal values differ by 0, infinities too (inf - inf is NaN); a NaN differs by inf.
    double diff = x[i] == y[i] ? 0.0 : std::abs(x[i] - y[i]);
    if (std::isnan(diff)) return std::numeric_limits<double>::infinity();
    worst = std::max(worst, diff);
  }
  return worst;
}

bool allclose(const Tensor& a, const Tensor& b, double rtol, double atol) {
  if (a.shape() != b.shape()) return false;
  std::vector<double> x = a.to_vector<double>(), y = b.to_vector<double>();
  // As torch.isclose: equal values are close (inf and inf of the same sign too, where the
  // difference is NaN), otherwise the difference must be finite and within the tolerance: an
  // infinite b makes the tolerance infinite, and 1 (or -inf) was close to inf. NaN is close to
  // nothing.
  for (size_t i = 0; i < x.size(); ++i) {
    const double diff = std::abs(x[i] - y[i]);
    if (!(x[i] == y[i] || (std::isfinite(diff) && diff <= atol + rtol * std::abs(y[i])))) return false;
  }
  return true;
}

}  // namespace ringtrain
