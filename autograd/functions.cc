// functions.cc: every differentiable op, its forward and its derivative rule side
// by side (micrograd style). Read an entry as
//
//   name: forward  ->  gradient of each input, given g = dL/d(output)
//
// Conventions: `c.needs(i)` skips the work for inputs that need no gradient;
// `c.saved(i)` reads a saved tensor (checked for in-place modification since the
// forward); intermediates only the rule needs (masks, indices) are captured by the
// lambda directly, since no user code can touch them. Tensors the caller passed in (an
// embedding's indices, where's condition) or gets back (max's indices) are saved, never
// captured: the caller may write to them before backward. The norms' xhat is saved too:
// without weight and bias it is the output itself, which user code can modify in place.
// Gradients of broadcasting ops are summed back to each input's shape (unbroadcast).
// Everything inside a rule uses the plain tensor ops (grad mode is off in backward).
#include "autograd/functions.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>

#include "autograd/autocast.h"
#include "autograd/graph.h"
#include "tensor/checks.h"

namespace ringtrain::ag {

namespace rt = ::ringtrain;
using autograd::NoGradGuard;
using autograd::record;
using Ctx = autograd::BackwardContext;

namespace {
// Autocast (autograd/autocast.h): the dtype `t` should enter an op in. Tensors that
// are undefined, not floating point, or already right pass through unchanged.
Tensor autocast_input(const Tensor& t, DType dtype);
}  // namespace

// Under autocast, `op` reruns itself once with its floating inputs cast (half for
// GEMM-like ops, float32 for softmax and losses); the rerun has autocast suspended.
#define RT_AUTOCAST_HALF(...)                                               \
  if (autograd::autocast_enabled()) {                                       \
    const DType rt_cast_dtype_ = autograd::autocast_dtype();                \
    autograd::AutocastSuspend rt_suspend_;                                  \
    auto C = [&](const Tensor& t) { return autocast_input(t, rt_cast_dtype_); }; \
    return __VA_ARGS__;                                                     \
  }
#define RT_AUTOCAST_FLOAT32(...)                                            \
  if (autograd::autocast_enabled()) {                                       \
    autograd::AutocastSuspend rt_suspend_;                                  \
    auto C = [&](const Tensor& t) { return autocast_input(t, DType::kFloat32); }; \
    return __VA_ARGS__;                                                     \
  }
// Under autocast a half-precision GEMM output meets float32 tensors (a residual
// connection, a concatenation). PyTorch's type promotion computes such ops in the wider
// dtype; ringtrain's ops do not promote (tensor/ops.h), so under autocast only, the
// elementwise binary ops and the joins cast their floating inputs to the widest one.
namespace {
DType autocast_widest(const std::vector<Tensor>& tensors) {
  int rank = -1;  // f16/bf16 = 0, f32 = 1, f64 = 2; f16 with bf16 promotes to f32
  bool f16 = false, bf16 = false;
  for (const Tensor& t : tensors) {
    if (!t.defined() || !is_floating_point(t.dtype())) continue;
    const DType d = t.dtype();
    f16 |= d == DType::kFloat16;
    bf16 |= d == DType::kBFloat16;
    rank = std::max(rank, d == DType::kFloat64 ? 2 : d == DType::kFloat32 ? 1 : 0);
  }
  if (rank == 2) return DType::kFloat64;
  if (rank == 1 || (f16 && bf16)) return DType::kFloat32;
  return f16 ? DType::kFloat16 : DType::kBFloat16;
}
bool autocast_mixed(const std::vector<Tensor>& tensors) {
  if (!autograd::autocast_enabled()) return false;
  const Tensor* first = nullptr;
  for (const Tensor& t : tensors) {
    if (!t.defined() || !is_floating_point(t.dtype())) continue;
    if (first != nullptr && first->dtype() != t.dtype()) return true;
    if (first == nullptr) first = &t;
  }
  return false;
}
std::vector<Tensor> autocast_promoted(const std::vector<Tensor>& tensors) {
  const DType widest = autocast_widest(tensors);
  std::vector<Tensor> out;
  for (const Tensor& t : tensors) out.push_back(autocast_input(t, widest));
  return out;
}
}  // namespace
#define RT_AUTOCAST_PROMOTE2(op, a, b)                     \
  if (autocast_mixed({a, b})) {                             \
    std::vector<Tensor> rt_promoted_ = autocast_promoted({a, b}); \
    return ag::op(rt_promoted_[0], rt_promoted_[1]);        \
  }

using Grads = std::vector<Tensor>;

namespace {

// Sums a broadcast gradient back to the input's shape (no-op when equal).
Tensor unbroadcast(const Tensor& g, const Shape& shape) {
  return g.shape() == shape ? g : rt::sum_to(g, shape);
}

// The shape of a reduction's output with keepdim=true (dims empty: all dims). A 0-d input
// keeps its shape: it takes dim 0 or -1, which the tensor op checks.
Shape keepdim_shape(const Shape& shape, const std::vector<int64_t>& dims, const char* op) {
  Shape out = shape;
  if (dims.empty() || shape.empty()) {
    for (auto& s : out) s = 1;
  } else {
    for (int64_t d : dims) out[wrap_dim(d, static_cast<int64_t>(shape.size()), op)] = 1;
  }
  return out;
}

// A gradient of a reduction's output, reshaped to keepdim layout and expanded to the input.
Tensor expand_reduced(const Tensor& g, const Shape& kept, const Shape& input_shape) {
  return g.reshape(kept).expand(input_shape);
}

Tensor zero_like_scalar(const Tensor& g) { return rt::scalar_tensor(0.0, g.dtype(), g.device()); }

// A gradient that is zero except for the `view` of it, which is g (narrow/select/slice).
template <typename ViewFn>
Tensor scatter_into_zeros(const Tensor& g, const Shape& shape, ViewFn view) {
  Tensor out = rt::zeros(shape, g.dtype(), g.device());
  Tensor part = view(out);
  part.copy_(g);
  return out;
}

Tensor maybe(bool needed, const std::function<Tensor()>& f) { return needed ? f() : Tensor(); }

// The gradients of maximum (is_max) or minimum: each input gets g where it alone is the
// result, nothing where the other one is, and g / 2 at a tie, where both are. NaN compares
// false both ways, so where either is NaN both get g (PyTorch's rule too).
Grads max_min_grads(const Tensor& g, const Ctx& c, const Shape& sa, const Shape& sb, bool is_max) {
  const Tensor& a = c.saved(0);
  const Tensor& b = c.saved(1);
  Tensor zero = zero_like_scalar(g);
  Tensor shared = rt::where(rt::eq(a, b), rt::mul(g, 0.5), g);
  auto part = [&](const Tensor& loses, const Shape& shape) {
    return unbroadcast(rt::where(loses, zero, shared), shape);
  };
  return {maybe(c.needs(0), [&] { return part(is_max ? rt::lt(a, b) : rt::gt(a, b), sa); }),
          maybe(c.needs(1), [&] { return part(is_max ? rt::gt(a, b) : rt::lt(a, b), sb); })};
}

}  // namespace

// ============================================================ elementwise, binary

// add: a + b  ->  g, g
Tensor add(const Tensor& a, const Tensor& b) {
  RT_AUTOCAST_PROMOTE2(add, a, b)
  return record("add", {a, b}, rt::add(a, b), {},
                [sa = a.shape(), sb = b.shape()](const Tensor& g, Ctx& c) -> Grads {
                  return {c.needs(0) ? unbroadcast(g, sa) : Tensor(),
                          c.needs(1) ? unbroadcast(g, sb) : Tensor()};
                });
}

// sub: a - b  ->  g, -g
Tensor sub(const Tensor& a, const Tensor& b) {
  RT_AUTOCAST_PROMOTE2(sub, a, b)
  return record("sub", {a, b}, rt::sub(a, b), {},
                [sa = a.shape(), sb = b.shape()](const Tensor& g, Ctx& c) -> Grads {
                  return {c.needs(0) ? unbroadcast(g, sa) : Tensor(),
                          c.needs(1) ? unbroadcast(rt::neg(g), sb) : Tensor()};
                });
}

// mul: a * b  ->  g * b, g * a
Tensor mul(const Tensor& a, const Tensor& b) {
  RT_AUTOCAST_PROMOTE2(mul, a, b)
  return record("mul", {a, b}, rt::mul(a, b), {a, b},
                [sa = a.shape(), sb = b.shape()](const Tensor& g, Ctx& c) -> Grads {
                  return {maybe(c.needs(0), [&] { return unbroadcast(rt::mul(g, c.saved(1)), sa); }),
                          maybe(c.needs(1), [&] { return unbroadcast(rt::mul(g, c.saved(0)), sb); })};
                });
}

// div: y = a / b  ->  g / b, -g * y / b
Tensor div(const Tensor& a, const Tensor& b) {
  RT_AUTOCAST_PROMOTE2(div, a, b)
  Tensor y = rt::div(a, b);
  return record("div", {a, b}, y, {b, y},
                [sa = a.shape(), sb = b.shape()](const Tensor& g, Ctx& c) -> Grads {
                  Tensor g_over_b = rt::div(g, c.saved(0));
                  return {c.needs(0) ? unbroadcast(g_over_b, sa) : Tensor(),
                          maybe(c.needs(1), [&] {
                            return unbroadcast(rt::neg(rt::mul(g_over_b, c.saved(1))), sb);
                          })};
                });
}

// pow: y = a ^ b  ->  g * b * a^(b-1), g * y * log(a)
// As in PyTorch, the limits are taken where the formulas give 0 * inf: d/da is 0 where b == 0
// (b * a^(b-1) at a = 0), and d/db is 0 where a == 0 and b >= 0 (y * log(a) = 0 * -inf).
Tensor pow(const Tensor& a, const Tensor& b) {
  RT_AUTOCAST_FLOAT32(ag::pow(C(a), C(b)))  // PyTorch's fp32 list: pow, exp, log, sum
  Tensor y = rt::pow(a, b);
  return record("pow", {a, b}, y, {a, b, y},
                [sa = a.shape(), sb = b.shape()](const Tensor& g, Ctx& c) -> Grads {
                  const Tensor& a = c.saved(0);
                  const Tensor& b = c.saved(1);
                  return {maybe(c.needs(0), [&] {
                            Tensor local = rt::masked_fill(rt::mul(b, rt::pow(a, rt::sub(b, 1.0))),
                                                           rt::eq(b, 0.0), 0.0);
                            return unbroadcast(rt::mul(g, local), sa);
                          }),
                          maybe(c.needs(1), [&] {
                            Tensor at_zero = rt::mul(rt::eq(a, 0.0), rt::ge(b, rt::zeros_like(b)));
                            Tensor local = rt::masked_fill(rt::mul(c.saved(2), rt::log(a)), at_zero, 0.0);
                            return unbroadcast(rt::mul(g, local), sb);
                          })};
                });
}

// maximum: max(a, b)  ->  g where a > b, g where a < b, g / 2 to each where a == b
// (PyTorch's rule: at a tie the subgradient is split, so maximum(x, x) has gradient 1).
// Where either is NaN the output is NaN and both get g, as in PyTorch.
Tensor maximum(const Tensor& a, const Tensor& b) {
  RT_AUTOCAST_PROMOTE2(maximum, a, b)
  return record("maximum", {a, b}, rt::maximum(a, b), {a, b},
                [sa = a.shape(), sb = b.shape()](const Tensor& g, Ctx& c) -> Grads {
                  return max_min_grads(g, c, sa, sb, /*is_max=*/true);
                });
}

// minimum: min(a, b)  ->  g where a < b, g where a > b, g / 2 to each where a == b
Tensor minimum(const Tensor& a, const Tensor& b) {
  RT_AUTOCAST_PROMOTE2(minimum, a, b)
  return record("minimum", {a, b}, rt::minimum(a, b), {a, b},
                [sa = a.shape(), sb = b.shape()](const Tensor& g, Ctx& c) -> Grads {
                  return max_min_grads(g, c, sa, sb, /*is_max=*/false);
                });
}

// ============================================================ elementwise with a scalar

// a + s -> g ;  a - s -> g ;  a * s -> g * s ;  a / s -> g / s
Tensor add(const Tensor& a, double s) {
  return record("add", {a}, rt::add(a, s), {}, [](const Tensor& g, Ctx&) -> Grads { return {g}; });
}
Tensor sub(const Tensor& a, double s) {
  return record("sub", {a}, rt::sub(a, s), {}, [](const Tensor& g, Ctx&) -> Grads { return {g}; });
}
Tensor mul(const Tensor& a, double s) {
  return record("mul", {a}, rt::mul(a, s), {},
                [s](const Tensor& g, Ctx&) -> Grads { return {rt::mul(g, s)}; });
}
Tensor div(const Tensor& a, double s) {
  return record("div", {a}, rt::div(a, s), {},
                [s](const Tensor& g, Ctx&) -> Grads { return {rt::div(g, s)}; });
}

// pow: a ^ p  ->  g * p * a^(p-1); for p == 0 the derivative is 0 everywhere (PyTorch's
// masked_fill), where the formula would give 0 * inf = NaN at a = 0.
Tensor pow(const Tensor& a, double p) {
  RT_AUTOCAST_FLOAT32(ag::pow(C(a), p))
  return record("pow", {a}, rt::pow(a, p), {a}, [p](const Tensor& g, Ctx& c) -> Grads {
    if (p == 0.0) return {rt::mul(g, 0.0)};
    return {rt::mul(g, rt::mul(rt::pow(c.saved(0), p - 1.0), p))};
  });
}

// ============================================================ elementwise, unary

// neg: -a  ->  -g
Tensor neg(const Tensor& a) {
  return record("neg", {a}, rt::neg(a), {}, [](const Tensor& g, Ctx&) -> Grads { return {rt::neg(g)}; });
}

// exp: y = e^a  ->  g * y
Tensor exp(const Tensor& a) {
  RT_AUTOCAST_FLOAT32(ag::exp(C(a)))
  Tensor y = rt::exp(a);
  return record("exp", {a}, y, {y},
                [](const Tensor& g, Ctx& c) -> Grads { return {rt::mul(g, c.saved(0))}; });
}

// log: log a  ->  g / a
Tensor log(const Tensor& a) {
  RT_AUTOCAST_FLOAT32(ag::log(C(a)))
  return record("log", {a}, rt::log(a), {a},
                [](const Tensor& g, Ctx& c) -> Grads { return {rt::div(g, c.saved(0))}; });
}

// sqrt: y = sqrt(a)  ->  g / (2 y)
Tensor sqrt(const Tensor& a) {
  Tensor y = rt::sqrt(a);
  return record("sqrt", {a}, y, {y}, [](const Tensor& g, Ctx& c) -> Grads {
    return {rt::div(g, rt::mul(c.saved(0), 2.0))};
  });
}

// abs: |a|  ->  g * sign(a)
Tensor abs(const Tensor& a) {
  return record("abs", {a}, rt::abs(a), {a}, [](const Tensor& g, Ctx& c) -> Grads {
    const Tensor& a = c.saved(0);
    return {rt::mul(g, rt::sub(rt::gt(a, 0.0), rt::lt(a, 0.0)))};
  });
}

// relu: y = max(a, 0)  ->  g where y > 0 (y itself is the mask: one pass, no mask tensor)
Tensor relu(const Tensor& a) {
  Tensor y = rt::relu(a);
  return record("relu", {a}, y, {y}, [](const Tensor& g, Ctx& c) -> Grads {
    return {rt::where(c.saved(0), g, zero_like_scalar(g))};
  });
}

// gelu (exact, erf form): gelu(a)  ->  g * gelu'(a)
Tensor gelu(const Tensor& a) {
  return record("gelu", {a}, rt::gelu(a), {a},
                [](const Tensor& g, Ctx& c) -> Grads { return {rt::mul(g, rt::gelu_grad(c.saved(0)))}; });
}

// tanh: y = tanh(a)  ->  g * (1 - y^2)
Tensor tanh(const Tensor& a) {
  Tensor y = rt::tanh(a);
  return record("tanh", {a}, y, {y}, [](const Tensor& g, Ctx& c) -> Grads {
    const Tensor& y = c.saved(0);
    return {rt::mul(g, rt::add(rt::neg(rt::mul(y, y)), 1.0))};
  });
}

// sigmoid: y = 1 / (1 + e^-a)  ->  g * y * (1 - y)
Tensor sigmoid(const Tensor& a) {
  Tensor y = rt::sigmoid(a);
  return record("sigmoid", {a}, y, {y}, [](const Tensor& g, Ctx& c) -> Grads {
    const Tensor& y = c.saved(0);
    return {rt::mul(rt::mul(g, y), rt::add(rt::neg(y), 1.0))};
  });
}

// where: cond ? a : b  ->  g where cond, g where !cond (cond gets none)
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b) {
  if (autocast_mixed({a, b})) {
    std::vector<Tensor> promoted = autocast_promoted({a, b});
    return ag::where(cond, promoted[0], promoted[1]);
  }
  return record("where", {Tensor(), a, b}, rt::where(cond, a, b), {cond},
                [sa = a.shape(), sb = b.shape()](const Tensor& g, Ctx& c) -> Grads {
                  const Tensor& cond = c.saved(0);
                  Tensor zero = zero_like_scalar(g);
                  return {Tensor(), c.needs(1) ? unbroadcast(rt::where(cond, g, zero), sa) : Tensor(),
                          c.needs(2) ? unbroadcast(rt::where(cond, zero, g), sb) : Tensor()};
                });
}

// masked_fill: mask ? value : a  ->  g where !mask, summed back to a's shape (a mask with
// more or larger dims broadcasts a, as in PyTorch)
Tensor masked_fill(const Tensor& a, const Tensor& mask, double value) {
  return record("masked_fill", {a}, rt::masked_fill(a, mask, value), {mask},
                [sa = a.shape()](const Tensor& g, Ctx& c) -> Grads {
                  return {unbroadcast(rt::masked_fill(g, c.saved(0), 0.0), sa)};
                });
}

// ============================================================ reductions

// sum: sum over dims  ->  g broadcast back over the reduced dims
Tensor sum(const Tensor& a, const std::vector<int64_t>& dims, bool keepdim) {
  RT_AUTOCAST_FLOAT32(ag::sum(C(a), dims, keepdim))
  return record("sum", {a}, rt::sum(a, dims, keepdim), {},
                [shape = a.shape(), kept = keepdim_shape(a.shape(), dims, "sum")](const Tensor& g,
                                                                                   Ctx&) -> Grads {
                  return {expand_reduced(g, kept, shape)};
                });
}

// mean: sum / n  ->  g / n broadcast back
Tensor mean(const Tensor& a, const std::vector<int64_t>& dims, bool keepdim) {
  Tensor y = rt::mean(a, dims, keepdim);
  double n = y.numel() == 0 ? 1.0 : static_cast<double>(a.numel()) / static_cast<double>(y.numel());
  return record("mean", {a}, y, {},
                [n, shape = a.shape(), kept = keepdim_shape(a.shape(), dims, "mean")](const Tensor& g,
                                                                                       Ctx&) -> Grads {
                  return {rt::div(expand_reduced(g, kept, shape), n)};
                });
}

namespace {
// amax/amin: the gradient is shared equally by the elements equal to the extreme.
Tensor extreme_reduce(const char* name, bool is_max, const Tensor& a, const std::vector<int64_t>& dims,
                      bool keepdim) {
  Tensor y = is_max ? rt::amax(a, dims, keepdim) : rt::amin(a, dims, keepdim);
  Shape kept = keepdim_shape(a.shape(), dims, name);
  return record(name, {a}, y, {a, y}, [kept, dims](const Tensor& g, Ctx& c) -> Grads {
    const Tensor& a = c.saved(0);
    Tensor hit = rt::eq(a, c.saved(1).reshape(kept).expand(a.shape()));
    Tensor count = rt::sum(hit, dims, /*keepdim=*/true);
    return {rt::div(rt::mul(hit, g.reshape(kept)), count)};
  });
}
}  // namespace

Tensor amax(const Tensor& a, const std::vector<int64_t>& dims, bool keepdim) {
  return extreme_reduce("amax", true, a, dims, keepdim);
}
Tensor amin(const Tensor& a, const std::vector<int64_t>& dims, bool keepdim) {
  return extreme_reduce("amin", false, a, dims, keepdim);
}

// max along dim: (values, indices)  ->  g at the returned index, 0 elsewhere
// The indices are returned to the caller, so they are saved (not captured): an in-place
// write to them before backward throws instead of moving the gradient (PyTorch too).
std::pair<Tensor, Tensor> max(const Tensor& a, int64_t dim, bool keepdim) {
  auto [values, indices] = rt::max(a, dim, keepdim);  // checks dim (a 0-d input takes 0 or -1)
  if (a.dim() == 0) return {reshape(a, {}), indices};  // its one element: g passes straight through
  int64_t d = wrap_dim(dim, a.dim(), "max");
  Shape kept = keepdim_shape(a.shape(), {d}, "max");
  values = record("max", {a}, values, {indices},
                  [kept, d, shape = a.shape()](const Tensor& g, Ctx& c) -> Grads {
                    Tensor idx_kept = c.saved(0).reshape(kept);
                    Shape positions_shape(shape.size(), 1);
                    positions_shape[d] = shape[d];
                    Tensor positions = rt::arange(0, static_cast<double>(shape[d]), 1.0, DType::kInt64,
                                                  g.device()).reshape(positions_shape);
                    // where, not a one-hot product: an inf or NaN in g stays at the index (0 * inf
                    // would put NaN in every other element of its row, where PyTorch has 0).
                    Tensor hit = rt::eq(positions, idx_kept);  // one-hot along d
                    return {rt::where(hit, g.reshape(kept), zero_like_scalar(g))};
                  });
  return {values, indices};
}

// ============================================================ linear algebra

// matmul: y = a @ b  ->  g @ b^T, a^T @ g (summed over broadcast batch dims;
// 1-D operands are treated as [1, k] / [k, 1] and squeezed back)
Tensor matmul(const Tensor& a, const Tensor& b) {
  RT_AUTOCAST_HALF(ag::matmul(C(a), C(b)))
  return record("matmul", {a, b}, rt::matmul(a, b), {a, b},
                [sa = a.shape(), sb = b.shape()](const Tensor& g, Ctx& c) -> Grads {
                  Tensor a = c.saved(0), b = c.saved(1);
                  Tensor lhs = a.dim() == 1 ? a.unsqueeze(0) : a;
                  Tensor rhs = b.dim() == 1 ? b.unsqueeze(1) : b;
                  Tensor g2 = g;
                  if (a.dim() == 1 && b.dim() == 1) g2 = g2.reshape({1, 1});  // a dot product: g is 0-d
                  else if (a.dim() == 1) g2 = g2.unsqueeze(-2);
                  else if (b.dim() == 1) g2 = g2.unsqueeze(-1);
                  Grads out(2);
                  if (c.needs(0)) {
                    Tensor ga = rt::matmul(g2, rhs.transpose(-1, -2));
                    out[0] = unbroadcast(ga, lhs.shape()).reshape(sa);
                  }
                  if (c.needs(1)) {
                    Tensor gb = rt::matmul(lhs.transpose(-1, -2), g2);
                    out[1] = unbroadcast(gb, rhs.shape()).reshape(sb);
                  }
                  return out;
                });
}

// linear: y = x W^T + b  ->  g @ W, g^T @ x, sum_rows(g)
// (two GEMMs on transposed views: the kernels take strides, so nothing is copied)
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  RT_AUTOCAST_HALF(ag::linear(C(x), C(weight), C(bias)))
  return record("linear", {x, weight, bias}, rt::linear(x, weight, bias), {x, weight},
                [](const Tensor& g, Ctx& c) -> Grads {
                  const Tensor& x = c.saved(0);
                  const Tensor& w = c.saved(1);
                  Tensor g2 = g.dim() == 2 ? g : g.reshape({-1, w.size(0)});
                  Grads out(3);
                  if (c.needs(0)) out[0] = rt::matmul(g2, w).reshape(x.shape());
                  if (c.needs(1)) {
                    Tensor x2 = x.dim() == 2 ? x : x.reshape({-1, w.size(1)});
                    // The weight gradient straight into its preallocated slot (DDP's
                    // bucket) when it has one, saving a copy of the largest gradients.
                    if (Tensor slot = c.destination(1); slot.defined()) {
                      rt::matmul_out(g2.t(), x2, slot);
                      out[1] = slot;
                    } else {
                      out[1] = rt::matmul(g2.t(), x2);
                    }
                  }
                  if (c.needs(2)) out[2] = rt::sum(g2, {0});
                  return out;
                });
}

// ============================================================ views and joins

// reshape/view/flatten/unsqueeze/squeeze: same elements, new shape  ->  g reshaped back
namespace {
Tensor reshape_like(const char* name, const Tensor& a, Tensor out) {
  return record(name, {a}, std::move(out), {},
                [shape = a.shape()](const Tensor& g, Ctx&) -> Grads { return {g.reshape(shape)}; });
}
}  // namespace

Tensor reshape(const Tensor& a, const Shape& shape) { return reshape_like("reshape", a, a.reshape(shape)); }
Tensor view(const Tensor& a, const Shape& shape) { return reshape_like("view", a, a.view(shape)); }
Tensor flatten(const Tensor& a, int64_t s, int64_t e) { return reshape_like("flatten", a, a.flatten(s, e)); }
Tensor unsqueeze(const Tensor& a, int64_t dim) { return reshape_like("unsqueeze", a, a.unsqueeze(dim)); }
Tensor squeeze(const Tensor& a, int64_t dim) { return reshape_like("squeeze", a, a.squeeze(dim)); }

// transpose: swap dims  ->  g with the same dims swapped
Tensor transpose(const Tensor& a, int64_t dim0, int64_t dim1) {
  return record("transpose", {a}, a.transpose(dim0, dim1), {},
                [dim0, dim1](const Tensor& g, Ctx&) -> Grads { return {g.transpose(dim0, dim1)}; });
}

// permute: reorder dims  ->  g permuted by the inverse permutation
Tensor permute(const Tensor& a, const std::vector<int64_t>& dims) {
  std::vector<int64_t> inverse(dims.size());
  for (size_t i = 0; i < dims.size(); ++i)
    inverse[wrap_dim(dims[i], a.dim(), "permute")] = static_cast<int64_t>(i);
  return record("permute", {a}, a.permute(dims), {},
                [inverse](const Tensor& g, Ctx&) -> Grads { return {g.permute(inverse)}; });
}

// narrow/slice/select: a part of a  ->  zeros with g written into that part
Tensor narrow(const Tensor& a, int64_t dim, int64_t start, int64_t length) {
  return record("narrow", {a}, a.narrow(dim, start, length), {},
                [=, shape = a.shape()](const Tensor& g, Ctx&) -> Grads {
                  return {scatter_into_zeros(g, shape, [&](const Tensor& z) { return z.narrow(dim, start, length); })};
                });
}
Tensor slice(const Tensor& a, int64_t dim, int64_t start, int64_t end, int64_t step) {
  return record("slice", {a}, a.slice(dim, start, end, step), {},
                [=, shape = a.shape()](const Tensor& g, Ctx&) -> Grads {
                  return {scatter_into_zeros(g, shape, [&](const Tensor& z) { return z.slice(dim, start, end, step); })};
                });
}
Tensor select(const Tensor& a, int64_t dim, int64_t index) {
  return record("select", {a}, a.select(dim, index), {},
                [=, shape = a.shape()](const Tensor& g, Ctx&) -> Grads {
                  return {scatter_into_zeros(g, shape, [&](const Tensor& z) { return z.select(dim, index); })};
                });
}

// expand: broadcast view  ->  g summed over the broadcast dims
Tensor expand(const Tensor& a, const Shape& shape) {
  return record("expand", {a}, a.expand(shape), {},
                [sa = a.shape()](const Tensor& g, Ctx&) -> Grads { return {unbroadcast(g, sa)}; });
}

// contiguous/clone: same values  ->  g
Tensor contiguous(const Tensor& a) {
  return record("contiguous", {a}, a.contiguous(), {}, [](const Tensor& g, Ctx&) -> Grads { return {g}; });
}
Tensor clone(const Tensor& a) {
  return record("clone", {a}, a.clone(), {}, [](const Tensor& g, Ctx&) -> Grads { return {g}; });
}

// to(dtype): converted values  ->  g converted back
Tensor to(const Tensor& a, DType dtype) {
  // A cast to an integer dtype ends the graph (record() keeps no node for integer outputs).
  return record("to", {a}, a.to(dtype), {},
                [from = a.dtype()](const Tensor& g, Ctx&) -> Grads { return {g.to(from)}; });
}

// cat: join along dim  ->  each input gets its slice of g (a view, no copy)
Tensor cat(const std::vector<Tensor>& tensors, int64_t dim) {
  if (autocast_mixed(tensors)) return ag::cat(autocast_promoted(tensors), dim);
  Tensor out = rt::cat(tensors, dim);
  int64_t d = wrap_dim(dim, out.dim(), "cat");
  // A 1-d empty input beside tensors of another rank (rt::cat skips it, as PyTorch) takes
  // no slice of g: its gradient is an empty [0]. sizes[i] < 0 marks it.
  std::vector<int64_t> sizes;
  for (const Tensor& t : tensors) sizes.push_back(t.dim() == out.dim() ? t.size(d) : -1);
  return record("cat", tensors, out, {}, [d, sizes](const Tensor& g, Ctx& c) -> Grads {
    Grads out(sizes.size());
    int64_t offset = 0;
    for (size_t i = 0; i < sizes.size(); ++i) {
      if (sizes[i] < 0) {
        if (c.needs(i)) out[i] = rt::zeros({0}, g.dtype(), g.device());
        continue;
      }
      if (c.needs(i)) out[i] = g.narrow(d, offset, sizes[i]);
      offset += sizes[i];
    }
    return out;
  });
}

// stack: join along a new dim  ->  each input gets g.select(dim, i)
Tensor stack(const std::vector<Tensor>& tensors, int64_t dim) {
  if (autocast_mixed(tensors)) return ag::stack(autocast_promoted(tensors), dim);
  Tensor out = rt::stack(tensors, dim);
  int64_t d = wrap_dim(dim, out.dim(), "stack");
  return record("stack", tensors, out, {}, [d, n = tensors.size()](const Tensor& g, Ctx& c) -> Grads {
    Grads out(n);
    for (size_t i = 0; i < n; ++i)
      if (c.needs(i)) out[i] = g.select(d, static_cast<int64_t>(i));
    return out;
  });
}

// chunk/split: one narrow per piece (each piece is its own node)
std::vector<Tensor> chunk(const Tensor& a, int64_t chunks, int64_t dim) {
  std::vector<Tensor> pieces = a.chunk(chunks, dim);
  int64_t d = wrap_dim(dim, a.dim(), "chunk");
  std::vector<Tensor> out;
  int64_t offset = 0;
  for (const Tensor& p : pieces) {
    out.push_back(narrow(a, d, offset, p.size(d)));
    offset += p.size(d);
  }
  return out;
}
std::vector<Tensor> split(const Tensor& a, int64_t split_size, int64_t dim) {
  std::vector<Tensor> pieces = a.split(split_size, dim);
  int64_t d = wrap_dim(dim, a.dim(), "split");
  std::vector<Tensor> out;
  int64_t offset = 0;
  for (const Tensor& p : pieces) {
    out.push_back(narrow(a, d, offset, p.size(d)));
    offset += p.size(d);
  }
  return out;
}

// ============================================================ convolution, pooling

// conv2d: y = x * W + b  ->  conv_transpose(g, W), corr(x, g), sum_{n,h,w}(g)
Tensor conv2d(const Tensor& input, const Tensor& weight, const Tensor& bias, const Conv2dParams& p) {
  RT_AUTOCAST_HALF(ag::conv2d(C(input), C(weight), C(bias), p))
  return record("conv2d", {input, weight, bias}, rt::conv2d(input, weight, bias, p), {input, weight},
                [p](const Tensor& g, Ctx& c) -> Grads {
                  const Tensor& x = c.saved(0);
                  const Tensor& w = c.saved(1);
                  return {maybe(c.needs(0), [&] { return rt::conv2d_backward_input(g, w, x.shape(), p); }),
                          maybe(c.needs(1), [&] { return rt::conv2d_backward_weight(g, x, w.shape(), p); }),
                          maybe(c.needs(2), [&] { return rt::sum(g, {0, 2, 3}); })};
                });
}

// max_pool2d: max over each window  ->  g routed to each window's argmax
Tensor max_pool2d(const Tensor& input, const Pool2dParams& p) {
  auto [out, indices] = rt::max_pool2d(input, p);
  return record("max_pool2d", {input}, out, {},
                [indices = indices, shape = input.shape()](const Tensor& g, Ctx&) -> Grads {
                  return {rt::max_pool2d_backward(g, indices, shape)};
                });
}

// avg_pool2d: mean over each window  ->  g / window spread over each window
Tensor avg_pool2d(const Tensor& input, const Pool2dParams& p) {
  return record("avg_pool2d", {input}, rt::avg_pool2d(input, p), {},
                [p, shape = input.shape()](const Tensor& g, Ctx&) -> Grads {
                  return {rt::avg_pool2d_backward(g, shape, p)};
                });
}

// ============================================================ softmax, normalisation

// softmax: y = e^a / sum e^a  ->  y * (g - sum(g * y))
Tensor softmax(const Tensor& a, int64_t dim) {
  RT_AUTOCAST_FLOAT32(ag::softmax(C(a), dim))
  Tensor y = rt::softmax(a, dim);
  return record("softmax", {a}, y, {y}, [dim](const Tensor& g, Ctx& c) -> Grads {
    return {rt::softmax_backward(g, c.saved(0), dim)};
  });
}

// log_softmax: y = a - log sum e^a  ->  g - e^y * sum(g)
Tensor log_softmax(const Tensor& a, int64_t dim) {
  RT_AUTOCAST_FLOAT32(ag::log_softmax(C(a), dim))
  Tensor y = rt::log_softmax(a, dim);
  return record("log_softmax", {a}, y, {y}, [dim](const Tensor& g, Ctx& c) -> Grads {
    return {rt::log_softmax_backward(g, c.saved(0), dim)};
  });
}

// The normalisations (batch_norm, layer_norm) compute their statistics, xhat and the output
// in the accumulation dtype (tensor/dtype.h: float32 for float16/bfloat16 input, the input's
// own dtype otherwise) and round the output back once, as PyTorch does: in half, the
// squares of centred values overflow (300^2 > 65504: f16 {0, 600, 0, 600} gave a variance
// of inf, an output of 0) and a half mean loses the low bits the centring needs. For
// float32/float64 every to() below returns the tensor itself, so nothing changes there.
//
// xhat is saved in the input's dtype (the output's memory; its values are O(1), so half's
// precision is enough for the rule, whose sums run in the accumulation dtype again) and,
// unlike other intermediates, through the SavedTensor check: without weight and bias the
// output *is* xhat, so an in-place write to the output (y.mul_(2)) would otherwise change
// the gradient silently; now the backward throws instead, naming the op.
namespace {

// stat = (1 - momentum) * stat + alpha * value, in place, computed in value's dtype (the
// accumulation dtype) and rounded into stat once: float16 running statistics would
// otherwise see value rounded to half first (a variance of 90000 is inf in float16).
void update_running_stat(const Tensor& stat, const Tensor& value, double momentum, double alpha) {
  if (!stat.defined()) return;
  Tensor acc = stat.to(value.dtype());  // stat itself when the dtypes already match
  rt::mul_(acc, 1.0 - momentum);
  rt::add_(acc, value, alpha);
  if (!acc.is_same(stat)) {
    Tensor target = stat;
    target.copy_(acc);
  }
}

// Checks that weight and bias (when given) have the input's dtype: the norms compute in
// the accumulation dtype, so a mismatch would otherwise pass silently.
void check_affine_dtypes(const char* op, const Tensor& x, const Tensor& weight, const Tensor& bias) {
  for (const Tensor* t : {&weight, &bias})
    RT_CHECK(!t->defined() || t->dtype() == x.dtype(), op, ": ", t->describe(),
             " must have the input's dtype, input ", x.describe(),
             "; convert the parameters (module->to(dtype)) or the input");
}

// dx = rstd * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat)) over `dims`, everything
// in rstd's dtype (the accumulation dtype), returned in `dtype`.
Tensor normalized_input_grad(const Tensor& dxhat, const Tensor& xhat, const Tensor& rstd,
                             const std::vector<int64_t>& dims, DType dtype) {
  Tensor mean_dxhat = rt::mean(dxhat, dims, true);
  Tensor mean_dxhat_xhat = rt::mean(rt::mul(dxhat, xhat), dims, true);
  return rt::mul(rt::sub(rt::sub(dxhat, mean_dxhat), rt::mul(xhat, mean_dxhat_xhat)), rstd).to(dtype);
}

}  // namespace

// batch_norm (training): xhat = (x - mean) * rstd, y = xhat * w + b, statistics over
// every dim but 1  ->  dx = rstd * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat)),
// dxhat = g * w, dw = sum(g * xhat), db = sum(g)
// (eval): y = (x - running_mean) * rstd_running * w + b  ->  dx = g * w * rstd_running
Tensor batch_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& running_mean,
                  const Tensor& running_var, bool training, double momentum, double eps) {
  // Under autocast: in float32, as PyTorch's cuDNN batch norm computes half input with
  // float32 statistics (here the output is float32 too). The running statistics are
  // updated in place, so only when they are float32 already (or absent).
  if ((!running_mean.defined() || running_mean.dtype() == DType::kFloat32) &&
      (!running_var.defined() || running_var.dtype() == DType::kFloat32)) {
    RT_AUTOCAST_FLOAT32(ag::batch_norm(C(x), C(weight), C(bias), running_mean, running_var, training, momentum, eps))
  }
  RT_CHECK(x.dim() >= 2, "batch_norm: input must be [N, C, ...], got ", x.describe());
  int64_t channels = x.size(1);
  for (const Tensor* t : {&weight, &bias, &running_mean, &running_var})
    RT_CHECK(!t->defined() || (t->dim() == 1 && t->size(0) == channels), "batch_norm: ", t->describe(),
             " must be [", channels, "] for input ", x.describe());
  check_affine_dtypes("batch_norm", x, weight, bias);
  std::vector<int64_t> dims;
  for (int64_t d = 0; d < x.dim(); ++d)
    if (d != 1) dims.push_back(d);
  Shape channel_shape(x.dim(), 1);
  channel_shape[1] = channels;
  int64_t n = x.numel() / std::max<int64_t>(channels, 1);

  const DType acc = accumulation_dtype(x.dtype());
  Tensor xhat, rstd, y;  // xhat, y: [N, C, ...] in x's dtype; rstd: [1, C, 1, ...] in acc
  {
    NoGradGuard no_grad;
    const Tensor xa = x.to(acc);
    Tensor xhat_acc;
    if (training) {
      RT_CHECK(n > 1, "batch_norm: training needs more than one value per channel, got input ",
               x.describe());
      Tensor mean = rt::mean(xa, dims, /*keepdim=*/true);
      Tensor centered = rt::sub(xa, mean);
      Tensor var = rt::mean(rt::mul(centered, centered), dims, /*keepdim=*/true);
      rstd = rt::pow(rt::add(var, eps), -0.5);
      xhat_acc = rt::mul(centered, rstd);
      update_running_stat(running_mean, mean.reshape({channels}), momentum, momentum);
      update_running_stat(running_var, var.reshape({channels}), momentum,
                          momentum * static_cast<double>(n) / static_cast<double>(n - 1));
    } else {
      RT_CHECK(running_mean.defined() && running_var.defined(),
               "batch_norm: eval mode needs running_mean and running_var");
      rstd = rt::pow(rt::add(running_var.to(acc).reshape(channel_shape), eps), -0.5);
      xhat_acc = rt::mul(rt::sub(xa, running_mean.to(acc).reshape(channel_shape)), rstd);
    }
    Tensor y_acc = weight.defined() ? rt::mul(xhat_acc, weight.to(acc).reshape(channel_shape)) : xhat_acc;
    if (bias.defined()) y_acc = rt::add(y_acc, bias.to(acc).reshape(channel_shape));
    xhat = xhat_acc.to(x.dtype());
    y = y_acc.is_same(xhat_acc) ? xhat : y_acc.to(x.dtype());
  }
  return record("batch_norm", {x, weight, bias}, y, {weight, xhat},
                [training, rstd, dims, channels, x_dtype = x.dtype(),
                 bias_dtype = bias.defined() ? bias.dtype() : x.dtype()](const Tensor& g, Ctx& c) -> Grads {
                  const DType acc = rstd.dtype();
                  Shape channel_shape(rstd.dim(), 1);
                  channel_shape[1] = channels;
                  const Tensor& weight = c.saved(0);
                  const Tensor ga = g.to(acc);
                  Grads out(3);
                  if (c.needs(0) || c.needs(1)) {
                    const Tensor xhat = c.saved(1).to(acc);
                    Tensor dxhat = weight.defined() ? rt::mul(ga, weight.to(acc).reshape(channel_shape)) : ga;
                    if (c.needs(0))
                      out[0] = training ? normalized_input_grad(dxhat, xhat, rstd, dims, x_dtype)
                                        : rt::mul(dxhat, rstd).to(x_dtype);
                    if (c.needs(1)) out[1] = rt::sum(rt::mul(ga, xhat), dims).to(weight.dtype());
                  }
                  if (c.needs(2)) out[2] = rt::sum(ga, dims).to(bias_dtype);
                  return out;
                });
}

// layer_norm: xhat = (x - mean) * rstd over the last k dims, y = xhat * w + b
//   ->  dx = rstd * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat)), dxhat = g * w,
//       dw = sum over leading dims of g * xhat, db = sum over leading dims of g
Tensor layer_norm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight,
                  const Tensor& bias, double eps) {
  RT_AUTOCAST_FLOAT32(ag::layer_norm(C(x), normalized_shape, C(weight), C(bias), eps))  // PyTorch's fp32 list
  int64_t k = static_cast<int64_t>(normalized_shape.size());
  RT_CHECK(k >= 1 && x.dim() >= k &&
               Shape(x.shape().end() - k, x.shape().end()) == normalized_shape,
           "layer_norm: input ", x.describe(), " does not end in normalized_shape ",
           shape_str(normalized_shape));
  for (const Tensor* t : {&weight, &bias})
    RT_CHECK(!t->defined() || t->shape() == normalized_shape, "layer_norm: ", t->describe(),
             " must have normalized_shape ", shape_str(normalized_shape));
  check_affine_dtypes("layer_norm", x, weight, bias);
  std::vector<int64_t> dims;
  for (int64_t d = x.dim() - k; d < x.dim(); ++d) dims.push_back(d);
  const DType acc = accumulation_dtype(x.dtype());
  Tensor xhat, rstd, y;  // as in batch_norm: xhat and y in x's dtype, rstd in acc
  {
    NoGradGuard no_grad;
    const Tensor xa = x.to(acc);
    Tensor mean = rt::mean(xa, dims, true);
    Tensor centered = rt::sub(xa, mean);
    rstd = rt::pow(rt::add(rt::mean(rt::mul(centered, centered), dims, true), eps), -0.5);
    Tensor xhat_acc = rt::mul(centered, rstd);
    Tensor y_acc = weight.defined() ? rt::mul(xhat_acc, weight.to(acc)) : xhat_acc;
    if (bias.defined()) y_acc = rt::add(y_acc, bias.to(acc));
    xhat = xhat_acc.to(x.dtype());
    y = y_acc.is_same(xhat_acc) ? xhat : y_acc.to(x.dtype());
  }
  return record("layer_norm", {x, weight, bias}, y, {weight, xhat},
                [rstd, dims, ns = normalized_shape, x_dtype = x.dtype(),
                 bias_dtype = bias.defined() ? bias.dtype() : x.dtype()](const Tensor& g, Ctx& c) -> Grads {
                  const DType acc = rstd.dtype();
                  const Tensor& weight = c.saved(0);
                  const Tensor ga = g.to(acc);
                  Grads out(3);
                  if (c.needs(0) || c.needs(1)) {
                    const Tensor xhat = c.saved(1).to(acc);
                    Tensor dxhat = weight.defined() ? rt::mul(ga, weight.to(acc)) : ga;
                    if (c.needs(0)) out[0] = normalized_input_grad(dxhat, xhat, rstd, dims, x_dtype);
                    if (c.needs(1)) out[1] = rt::sum_to(rt::mul(ga, xhat), ns).to(weight.dtype());
                  }
                  if (c.needs(2)) out[2] = rt::sum_to(ga, ns).to(bias_dtype);
                  return out;
                });
}

// dropout: y = x * mask, mask = Bernoulli(1 - p) / (1 - p)  ->  g * mask
Tensor dropout(const Tensor& x, double p, bool training, Generator& gen) {
  RT_CHECK(p >= 0.0 && p <= 1.0, "dropout: p must be in [0, 1], got ", p);
  if (!training || p == 0.0) return x;
  Tensor mask = Tensor::empty(x.shape(), x.dtype(), x.device());
  rt::bernoulli_(mask, 1.0 - p, gen);
  if (p < 1.0) rt::mul_(mask, 1.0 / (1.0 - p));
  return record("dropout", {x}, rt::mul(x, mask), {},
                [mask](const Tensor& g, Ctx&) -> Grads { return {rt::mul(g, mask)}; });
}

// index_select: rows of a at index (1-D) along dim  ->  zeros with g added at those rows
// The index is the caller's tensor, so it is saved through the version check (not captured):
// an in-place write to it after the forward would otherwise send the gradient to other rows.
Tensor index_select(const Tensor& a, int64_t dim, const Tensor& index) {
  RT_CHECK(index.dim() == 1, "ag::index_select: index must be 1-D, got ", index.describe());
  int64_t d = wrap_dim(dim, a.dim(), "index_select");
  return record("index_select", {a}, rt::index_select(a, d, index), {index},
                [d, shape = a.shape()](const Tensor& g, Ctx& c) -> Grads {
                  Tensor ga = rt::zeros(shape, g.dtype(), g.device());
                  rt::index_add_(ga, d, c.saved(0), g);
                  return {ga};
                });
}

// embedding: weight rows at indices  ->  zeros with each g row added at its index
Tensor embedding(const Tensor& weight, const Tensor& indices) {
  RT_CHECK(weight.dim() == 2, "embedding: weight must be [num_embeddings, dim], got ", weight.describe());
  RT_CHECK(indices.dtype() == DType::kInt64, "embedding: indices must be int64 token ids, got ",
           indices.describe(), "; convert them with .to(DType::kInt64)");
  Tensor flat = indices.reshape({-1});
  // Checked here on every device, so the error names embedding and the table's size (the CPU
  // kernel would name index_select; the CUDA kernel cannot throw and would read 0). One pass
  // over the indices, small beside the rows they copy; on a GPU one small copy to the host.
  rt::check_index_range(flat, weight.size(0), "embedding", "indices",
                        "they must lie in [0, num_embeddings) = [0, " + std::to_string(weight.size(0)) +
                            "); fix the token ids or enlarge the table");
  Shape out_shape = indices.shape();
  out_shape.push_back(weight.size(1));
  Tensor y = rt::index_select(weight, 0, flat).view(out_shape);
  // flat is a view of the caller's indices (when contiguous): saved, not captured, so that an
  // in-place write to the indices before backward throws instead of moving the gradient.
  return record("embedding", {weight}, y, {flat},
                [shape = weight.shape()](const Tensor& g, Ctx& c) -> Grads {
                  Tensor gw = rt::zeros(shape, g.dtype(), g.device());
                  rt::index_add_(gw, 0, c.saved(0), g.reshape({-1, shape[1]}));
                  return {gw};
                });
}

// ============================================================ losses

// cross_entropy: loss = sum_i w_i * sum_c -q_ic log p_ic / sum_i w_i, with
// q = (1 - eps) onehot(t) + eps / C, w_i = [t_i != ignore_index]
//   ->  dlogits = (p - q) * w_i * g / sum_i w_i
Tensor cross_entropy(const Tensor& logits, const Tensor& targets, int64_t ignore_index,
                     double label_smoothing) {
  RT_AUTOCAST_FLOAT32(ag::cross_entropy(C(logits), targets, ignore_index, label_smoothing))
  RT_CHECK(logits.dim() == 2 && targets.dim() == 1 && targets.size(0) == logits.size(0),
           "cross_entropy: expects logits [N, C] and targets [N], got ", logits.describe(), " and ",
           targets.describe());
  RT_CHECK(targets.dtype() == DType::kInt64, "cross_entropy: targets must be int64 class indices, got ",
           targets.describe());
  RT_CHECK(label_smoothing >= 0.0 && label_smoothing <= 1.0,
           "cross_entropy: label_smoothing must be in [0, 1], got ", label_smoothing);
  int64_t classes = logits.size(1);
  Tensor logp = rt::log_softmax(logits, 1);
  Tensor valid = rt::ne(targets, rt::full({}, static_cast<double>(ignore_index), DType::kInt64,
                                          targets.device()));
  Tensor safe = rt::mul(targets, valid);  // ignored rows read class 0, then get weight 0
  rt::check_class_targets(safe, classes, ignore_index, "cross_entropy");
  // Sums over samples (the loss total, the count of valid targets) in float32 at least, rounded
  // once: in float16 either passes 65504 with a large enough batch.
  const DType acc = accumulation_dtype(logits.dtype());
  Tensor weight = valid.to(acc);
  Tensor count = rt::sum(weight);
  Tensor picked = rt::gather(logp, 1, safe.unsqueeze(1)).squeeze(1);
  Tensor per_sample = rt::mul(picked, -(1.0 - label_smoothing));
  if (label_smoothing > 0) per_sample = rt::sub(per_sample, rt::mul(rt::mean(logp, {1}), label_smoothing));
  Tensor loss = rt::div(rt::sum(rt::mul(per_sample.to(acc), weight)), count).to(logits.dtype());
  return record("cross_entropy", {logits, Tensor()}, loss, {},
                [logp, safe, weight, count, classes, label_smoothing](const Tensor& g, Ctx&) -> Grads {
                  Tensor q = rt::one_hot(safe, classes, logp.dtype());
                  if (label_smoothing > 0)
                    q = rt::add(rt::mul(q, 1.0 - label_smoothing), label_smoothing / static_cast<double>(classes));
                  // Over max(count, 1): when every target is ignored the loss is 0/0 = NaN (as in
                  // PyTorch) but the gradient is 0, not 0 * inf = NaN in every weight.
                  Tensor divisor = rt::maximum(count, rt::full({}, 1.0, count.dtype(), count.device()));
                  Tensor row_scale = rt::mul(weight.unsqueeze(1), rt::div(g.to(count.dtype()), divisor));
                  return {rt::mul(rt::sub(rt::exp(logp), q), row_scale.to(logp.dtype())), Tensor()};
                });
}

// mse_loss: mean((x - t)^2)  ->  2 (x - t) g / n, -2 (x - t) g / n
Tensor mse_loss(const Tensor& input, const Tensor& target) {
  RT_AUTOCAST_FLOAT32(ag::mse_loss(C(input), C(target)))
  RT_CHECK(input.shape() == target.shape(), "mse_loss: input ", input.describe(), " and target ",
           target.describe(), " must have the same shape");
  RT_CHECK(input.dtype() == target.dtype() && input.device() == target.device(), "mse_loss: input ",
           input.describe(), " and target ", target.describe(),
           " must have the same dtype and device; convert the target with .to(input's device, dtype)");
  Tensor diff = rt::sub(input, target);
  Tensor loss = rt::mean(rt::mul(diff, diff));
  double n = static_cast<double>(std::max<int64_t>(input.numel(), 1));
  return record("mse_loss", {input, target}, loss, {}, [diff, n](const Tensor& g, Ctx& c) -> Grads {
    Tensor gi = rt::mul(diff, rt::mul(g, 2.0 / n));
    return {gi, c.needs(1) ? rt::neg(gi) : Tensor()};
  });
}

namespace {
Tensor autocast_input(const Tensor& t, DType dtype) {
  // float64 is never cast down (PyTorch's autocast leaves double tensors alone), only
  // promoted to (autocast_promoted picks float64 when any input is).
  if (!t.defined() || !is_floating_point(t.dtype()) || t.dtype() == dtype) return t;
  if (t.dtype() == DType::kFloat64 && dtype != DType::kFloat64) return t;
  return ag::to(t, dtype);
}
}  // namespace

}  // namespace ringtrain::ag
