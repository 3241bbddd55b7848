// elementwise.cc: CPU unary, binary (broadcasting), binary-with-scalar, where,
// all_finite.
//
// Every kernel is a StridedLoop (tensor/cpu/loops.h) over the output and its
// inputs; the output is contiguous and the inputs are views expanded to its
// shape (0 strides on broadcast dims), so after dim coalescing the common cases
// are one long run. Innermost runs pick:
//   * a tight loop over contiguous pointers (GCC vectorises it at -O3
//     -march=native), or a contiguous-op-scalar loop when one input has stride 0
//     (a row broadcast against a matrix is a sequence of such runs);
//   * for transcendental ops on f32/f64, Eigen's vectorised array functions
//     (exp, log, tanh, logistic, erf from unsupported/SpecialFunctions);
//   * for f16/bf16, blocks of kBlock elements converted to f32 into a stack
//     buffer, computed by the f32 path, rounded once on store (F16C converts 8 at
//     a time);
//   * a scalar strided loop otherwise.
// Cost model: memory bound for everything but pow and the transcendental ops on
// f64; one read per input and one write per output element.
//
// Integer semantics: comparisons return 1/0, division truncates toward zero and a
// zero divisor throws (never SIGFPE), exp/log/sqrt/gelu/tanh/sigmoid are float-only.
#include <cmath>
#include <cstring>
#include <limits>

#include <Eigen/Core>
#include <unsupported/Eigen/SpecialFunctions>

#include "tensor/checks.h"
#include "tensor/cpu/loops.h"
#include "tensor/kernels.h"

namespace ringtrain::kernels::cpu {

using detail::byte_ptr;
using detail::Compute;
using detail::StridedLoop;

namespace {

constexpr int64_t kBlock = 512;  // elements per f16/bf16 conversion block (2 KiB of f32)
constexpr double kInvSqrt2 = 0.70710678118654752440;
constexpr double kInvSqrt2Pi = 0.39894228040143267794;

template <typename T>
constexpr int64_t isz() {
  return static_cast<int64_t>(sizeof(T));
}

// ---------------------------------------------------------------- unary

bool unary_is_float_only(UnaryOp op) {
  switch (op) {
    case UnaryOp::kExp: case UnaryOp::kLog: case UnaryOp::kSqrt: case UnaryOp::kGelu:
    case UnaryOp::kGeluGrad: case UnaryOp::kTanh: case UnaryOp::kSigmoid:
      return true;
    default:
      return false;
  }
}

// y[0..n) = op(x[0..n)), both contiguous, C = float or double.
template <typename C>
void unary_contiguous(UnaryOp op, const C* x, C* y, int64_t n) {
  using detail::apply_vectorized;
  switch (op) {
    case UnaryOp::kNeg:
      for (int64_t i = 0; i < n; ++i) y[i] = -x[i];
      break;
    case UnaryOp::kAbs:
      for (int64_t i = 0; i < n; ++i) y[i] = std::fabs(x[i]);
      break;
    case UnaryOp::kRelu:  // NaN stays NaN (NaN < 0 is false)
      for (int64_t i = 0; i < n; ++i) y[i] = x[i] < C(0) ? C(0) : x[i];
      break;
    case UnaryOp::kExp:
      detail::apply_packet_fixing_low<Eigen::internal::scalar_exp_op<C>>(
          x, y, n, detail::kExpNormalLow<C>, [](C v) { return std::exp(v); });
      break;
    case UnaryOp::kLog:
      apply_vectorized(x, y, n, [](auto X, auto Y) { Y = X.log(); });
      // Eigen's plog treats subnormal inputs as the smallest normal (log(1e-45f) came out as
      // -87.3 instead of -103.3): recompute those by value.
      for (int64_t i = 0; i < n; ++i)
        if (x[i] > C(0) && x[i] < std::numeric_limits<C>::min()) y[i] = std::log(x[i]);
      break;
    case UnaryOp::kSqrt:
      // Correctly rounded, as IEEE sqrt (and PyTorch) is. Eigen's float psqrt is, under its
      // default EIGEN_FAST_MATH, an approximate rsqrt plus one Newton step (off by up to 2 ulp,
      // subnormals flushed to 0): Adam's denominator would differ from PyTorch's. Its double
      // psqrt is the exact vsqrtpd, and rounding an exact-in-double sqrt of a float to float is
      // correctly rounded (53 >= 2 * 24 + 2 bits), so floats go through double.
      apply_vectorized(x, y, n, [](auto X, auto Y) { Y = X.template cast<double>().sqrt().template cast<C>(); });
      break;
    case UnaryOp::kTanh: apply_vectorized(x, y, n, [](auto X, auto Y) { Y = X.tanh(); }); break;
    case UnaryOp::kSigmoid:
      // Far below 0, sigmoid(x) = e^x / (1 + e^x) rounds to e^x, which Eigen's logistic
      // clamps like exp (sigmoid(-inf) was 2.9e-39 for float): recompute those by value.
      detail::apply_packet_fixing_low<Eigen::internal::scalar_logistic_op<C>>(
          x, y, n, detail::kExpNormalLow<C>, [](C v) { return std::exp(v); });
      break;
    case UnaryOp::kGelu:
      apply_vectorized(x, y, n, [](auto X, auto Y) { Y = C(0.5) * X * (C(1) + (X * C(kInvSqrt2)).erf()); });
      break;
    case UnaryOp::kGeluGrad:
      // Phi(x) + x * phi(x). Where -x^2/2 is below exp's normal range, Eigen's clamped exp left a
      // tiny non-zero x * phi(x) (and inf * 2.9e-39 = inf at x = +-inf for float, inf * 0 = NaN
      // for double): those elements are recomputed with std functions, and x = +-inf gets the
      // limits 1 and 0.
      apply_vectorized(x, y, n, [](auto X, auto Y) {
        Y = C(0.5) * (C(1) + (X * C(kInvSqrt2)).erf()) + X * (C(-0.5) * X.square()).exp() * C(kInvSqrt2Pi);
      });
      for (int64_t i = 0; i < n; ++i) {
        const C v = x[i];
        if (!(C(-0.5) * v * v < detail::kExpNormalLow<C>)) continue;  // also skips NaN
        if (std::isinf(v)) {
          y[i] = v > C(0) ? C(1) : C(0);
        } else {
          y[i] = C(0.5) * (C(1) + std::erf(v * C(kInvSqrt2))) + v * std::exp(C(-0.5) * v * v) * C(kInvSqrt2Pi);
        }
      }
      break;
    case UnaryOp::kIsFinite:  // x - x is 0 for finite x, NaN for inf and NaN
      for (int64_t i = 0; i < n; ++i) y[i] = (x[i] - x[i]) == C(0) ? C(1) : C(0);
      break;
  }
}

template <typename T>
void unary_integer(UnaryOp op, const T* x, int64_t xs, T* y, int64_t n) {
  switch (op) {
    case UnaryOp::kNeg:
      for (int64_t i = 0; i < n; ++i) y[i] = wrapping_neg(x[i * xs]);
      break;
    case UnaryOp::kAbs:
      for (int64_t i = 0; i < n; ++i) y[i] = wrapping_abs(x[i * xs]);
      break;
    case UnaryOp::kRelu:
      for (int64_t i = 0; i < n; ++i) y[i] = x[i * xs] < 0 ? T(0) : x[i * xs];
      break;
    case UnaryOp::kIsFinite:
      std::fill_n(y, n, T(1));
      break;
    default:
      throw Error(std::string("unary ") + unary_op_name(op) + " (cpu kernel): not defined for integer dtypes");
  }
}

template <typename T>
void unary_typed(UnaryOp op, const Tensor& in, const Tensor& out) {
  StridedLoop<2> loop(out.shape(), {&out.strides(), &in.strides()}, {isz<T>(), isz<T>()});
  loop.run({byte_ptr(out), byte_ptr(in)}, [op](std::array<char*, 2> p,
                                                const std::array<int64_t, 2>& s, int64_t n) {
    T* y = reinterpret_cast<T*>(p[0]);
    const T* x = reinterpret_cast<const T*>(p[1]);
    const int64_t ys = s[0] / isz<T>(), xs = s[1] / isz<T>();
    if constexpr (!detail::kIsFloat<T>) {
      if (ys == 1) {
        unary_integer(op, x, xs, y, n);
      } else {
        for (int64_t i = 0; i < n; ++i) unary_integer(op, x + i * xs, 1, y + i * ys, 1);
      }
    } else {
      using C = Compute<T>;
      if constexpr (std::is_same_v<T, C>) {
        if (ys == 1 && xs == 1) {
          unary_contiguous<C>(op, x, y, n);
          return;
        }
      }
      // Blocks through a compute-type buffer: converts 16-bit floats, gathers strided inputs.
      alignas(64) C xb[kBlock];
      alignas(64) C yb[kBlock];
      for (int64_t i0 = 0; i0 < n; i0 += kBlock) {
        const int64_t m = std::min(kBlock, n - i0);
        detail::load_run(x + i0 * xs, xs, xb, m);
        unary_contiguous<C>(op, xb, yb, m);
        detail::store_run(yb, y + i0 * ys, ys, m);
      }
    }
  });
}

// ---------------------------------------------------------------- binary

// Integer add/sub/mul/div wrap around (two's complement) as in PyTorch and numpy, computed
// without signed overflow (wrapping_* in dtype.h; INT_MIN / -1 would even trap on x86).
template <BinaryOp OP, typename C>
inline C binop(C a, C b) {
  if constexpr (OP == BinaryOp::kAdd) return wrapping_add(a, b);
  else if constexpr (OP == BinaryOp::kSub) return wrapping_sub(a, b);
  else if constexpr (OP == BinaryOp::kMul) return wrapping_mul(a, b);
  else if constexpr (OP == BinaryOp::kDiv) return wrapping_div(a, b);  // zero divisors: checked by the caller
  else if constexpr (OP == BinaryOp::kPow) {
    if constexpr (std::is_integral_v<C>) {
      return wrapping_pow(a, b);  // exact, wraps like mul (dtype.h)
    } else {
      return std::pow(a, b);
    }
  }
  else if constexpr (OP == BinaryOp::kMax) return (a != a || a > b) ? a : b;  // NaN propagates
  else if constexpr (OP == BinaryOp::kMin) return (a != a || a < b) ? a : b;
  else if constexpr (OP == BinaryOp::kEq) return a == b ? C(1) : C(0);
  else if constexpr (OP == BinaryOp::kNe) return a != b ? C(1) : C(0);
  else if constexpr (OP == BinaryOp::kLt) return a < b ? C(1) : C(0);
  else if constexpr (OP == BinaryOp::kLe) return a <= b ? C(1) : C(0);
  else if constexpr (OP == BinaryOp::kGt) return a > b ? C(1) : C(0);
  else return a >= b ? C(1) : C(0);
}

template <BinaryOp OP, typename T>
void check_divisor(const T* b, int64_t bs, int64_t n) {
  if constexpr (OP == BinaryOp::kDiv && std::is_integral_v<T>) {
    for (int64_t i = 0; i < n; ++i) {
      RT_CHECK(b[i * bs] != 0, "div (cpu kernel): integer division by zero");
    }
  }
}

// out[i] = op(a[i], b[i]) over one run; strides in elements, C the compute type (== T here).
template <BinaryOp OP, typename T>
void binary_run_native(T* y, int64_t ys, const T* a, int64_t as, const T* b, int64_t bs,
                       int64_t n) {
  check_divisor<OP>(b, bs, n);
  if (ys == 1 && as == 1 && bs == 1) {
    for (int64_t i = 0; i < n; ++i) y[i] = binop<OP, T>(a[i], b[i]);
  } else if (ys == 1 && as == 1 && bs == 0) {
    const T bv = *b;
    for (int64_t i = 0; i < n; ++i) y[i] = binop<OP, T>(a[i], bv);
  } else if (ys == 1 && as == 0 && bs == 1) {
    const T av = *a;
    for (int64_t i = 0; i < n; ++i) y[i] = binop<OP, T>(av, b[i]);
  } else {
    for (int64_t i = 0; i < n; ++i) y[i * ys] = binop<OP, T>(a[i * as], b[i * bs]);
  }
}

// Same for f16/bf16: blocks converted to f32. `b == nullptr` means the scalar `bscalar`.
template <BinaryOp OP, typename T>
void binary_run_reduced(T* y, int64_t ys, const T* a, int64_t as, const T* b, int64_t bs,
                        float bscalar, int64_t n) {
  alignas(64) float ab[kBlock];
  alignas(64) float bb[kBlock];
  alignas(64) float yb[kBlock];
  if (b != nullptr && bs == 0) {
    bscalar = detail::load(*b);
    b = nullptr;
  }
  for (int64_t i0 = 0; i0 < n; i0 += kBlock) {
    const int64_t m = std::min(kBlock, n - i0);
    detail::load_run(a + i0 * as, as, ab, m);
    if (b != nullptr) {
      detail::load_run(b + i0 * bs, bs, bb, m);
      for (int64_t i = 0; i < m; ++i) yb[i] = binop<OP, float>(ab[i], bb[i]);
    } else {
      for (int64_t i = 0; i < m; ++i) yb[i] = binop<OP, float>(ab[i], bscalar);
    }
    detail::store_run(yb, y + i0 * ys, ys, m);
  }
}

template <BinaryOp OP, typename T>
void binary_typed(const Tensor& a, const Tensor& b, const Tensor& out) {
  StridedLoop<3> loop(out.shape(), {&out.strides(), &a.strides(), &b.strides()},
                      {isz<T>(), isz<T>(), isz<T>()});
  loop.run({byte_ptr(out), byte_ptr(a), byte_ptr(b)},
           [](std::array<char*, 3> p, const std::array<int64_t, 3>& s, int64_t n) {
             T* y = reinterpret_cast<T*>(p[0]);
             const T* x = reinterpret_cast<const T*>(p[1]);
             const T* z = reinterpret_cast<const T*>(p[2]);
             const int64_t ys = s[0] / isz<T>(), xs = s[1] / isz<T>(), zs = s[2] / isz<T>();
             if constexpr (detail::kIsReduced<T>) {
               binary_run_reduced<OP, T>(y, ys, x, xs, z, zs, 0.0f, n);
             } else {
               binary_run_native<OP, T>(y, ys, x, xs, z, zs, n);
             }
           });
}

template <BinaryOp OP, typename T>
void binary_scalar_typed(const Tensor& a, double scalar, const Tensor& out) {
  StridedLoop<2> loop(out.shape(), {&out.strides(), &a.strides()}, {isz<T>(), isz<T>()});
  // The scalar takes the tensor's dtype; f16/bf16 compute in f32, so it stays an f32.
  // Integer dtypes: saturating, NaN -> 0 (detail::store), never an undefined cast. A
  // comparison of an integer tensor reaches here already rewritten by ops.cc (scalar_op)
  // against a value the dtype holds (x < 2.5 as x <= 2), so the truncation is exact.
  const Compute<T> sv = [scalar] {
    if constexpr (detail::kIsFloat<T>) return static_cast<Compute<T>>(scalar);
    else return detail::store<T>(scalar);
  }();
  loop.run({byte_ptr(out), byte_ptr(a)},
           [sv](std::array<char*, 2> p, const std::array<int64_t, 2>& s, int64_t n) {
             T* y = reinterpret_cast<T*>(p[0]);
             const T* x = reinterpret_cast<const T*>(p[1]);
             const int64_t ys = s[0] / isz<T>(), xs = s[1] / isz<T>();
             if constexpr (detail::kIsReduced<T>) {
               binary_run_reduced<OP, T>(y, ys, x, xs, nullptr, 0, sv, n);
             } else {
               binary_run_native<OP, T>(y, ys, x, xs, &sv, 0, n);
             }
           });
}

// Turns a runtime BinaryOp into the template argument of fn.
template <typename Fn>
void dispatch_binary(BinaryOp op, Fn&& fn) {
  switch (op) {
    case BinaryOp::kAdd: return fn(std::integral_constant<BinaryOp, BinaryOp::kAdd>{});
    case BinaryOp::kSub: return fn(std::integral_constant<BinaryOp, BinaryOp::kSub>{});
    case BinaryOp::kMul: return fn(std::integral_constant<BinaryOp, BinaryOp::kMul>{});
    case BinaryOp::kDiv: return fn(std::integral_constant<BinaryOp, BinaryOp::kDiv>{});
    case BinaryOp::kPow: return fn(std::integral_constant<BinaryOp, BinaryOp::kPow>{});
    case BinaryOp::kMax: return fn(std::integral_constant<BinaryOp, BinaryOp::kMax>{});
    case BinaryOp::kMin: return fn(std::integral_constant<BinaryOp, BinaryOp::kMin>{});
    case BinaryOp::kEq: return fn(std::integral_constant<BinaryOp, BinaryOp::kEq>{});
    case BinaryOp::kNe: return fn(std::integral_constant<BinaryOp, BinaryOp::kNe>{});
    case BinaryOp::kLt: return fn(std::integral_constant<BinaryOp, BinaryOp::kLt>{});
    case BinaryOp::kLe: return fn(std::integral_constant<BinaryOp, BinaryOp::kLe>{});
    case BinaryOp::kGt: return fn(std::integral_constant<BinaryOp, BinaryOp::kGt>{});
    case BinaryOp::kGe: return fn(std::integral_constant<BinaryOp, BinaryOp::kGe>{});
  }
  throw Error("binary (cpu kernel): unknown BinaryOp value " + std::to_string(static_cast<int>(op)));
}

void check_out(const char* op, const Tensor& in, const Tensor& out) {
  RT_CHECK(in.shape() == out.shape() && in.dtype() == out.dtype(), op, " (cpu kernel): input ",
           in.describe(), " does not match output ", out.describe());
}

}  // namespace

void unary(UnaryOp op, const Tensor& in, const Tensor& out) {
  check_out(unary_op_name(op), in, out);
  RT_CHECK(is_floating_point(in.dtype()) || !unary_is_float_only(op), unary_op_name(op),
           " (cpu kernel): needs a floating-point tensor, got ", in.describe());
  if (out.numel() == 0) return;
  dispatch_dtype(in.dtype(), [&](auto tag) { unary_typed<decltype(tag)>(op, in, out); });
}

void binary(BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& out) {
  check_out(binary_op_name(op), a, out);
  check_out(binary_op_name(op), b, out);
  if (out.numel() == 0) return;
  dispatch_dtype(out.dtype(), [&](auto tag) {
    using T = decltype(tag);
    dispatch_binary(op, [&](auto opc) { binary_typed<decltype(opc)::value, T>(a, b, out); });
  });
}

void binary_scalar(BinaryOp op, const Tensor& a, double scalar, const Tensor& out) {
  check_out(binary_op_name(op), a, out);
  if (out.numel() == 0) return;
  if (op == BinaryOp::kDiv && !is_floating_point(a.dtype())) {
    RT_CHECK(detail::store<int64_t>(scalar) != 0, "div (cpu kernel): integer division of ",
             a.describe(), " by zero (the scalar ", scalar, " converts to 0)");
  }
  dispatch_dtype(out.dtype(), [&](auto tag) {
    using T = decltype(tag);
    dispatch_binary(op, [&](auto opc) { binary_scalar_typed<decltype(opc)::value, T>(a, scalar, out); });
  });
}

void axpy(double alpha, const Tensor& x, const Tensor& y) {
  check_out("axpy", x, y);
  if (y.numel() == 0) return;
  dispatch_dtype(y.dtype(), [&](auto tag) {
    using T = decltype(tag);
    using C = std::conditional_t<detail::kIsFloat<T>, Compute<T>, double>;
    const C a = static_cast<C>(alpha);  // C is a float type: no undefined cast
    StridedLoop<2> loop(y.shape(), {&y.strides(), &x.strides()}, {isz<T>(), isz<T>()});
    loop.run({byte_ptr(y), byte_ptr(x)}, [a](std::array<char*, 2> p, const std::array<int64_t, 2>& s, int64_t n) {
      T* yp = reinterpret_cast<T*>(p[0]);
      const T* xp = reinterpret_cast<const T*>(p[1]);
      const int64_t ys = s[0] / isz<T>(), xs = s[1] / isz<T>();
      if constexpr (std::is_same_v<T, C>) {
        if (ys == 1 && xs == 1) {  // the common case: one vectorisable pass, no temporary
          for (int64_t i = 0; i < n; ++i) yp[i] += a * xp[i];
          return;
        }
        for (int64_t i = 0; i < n; ++i) yp[i * ys] += a * xp[i * xs];
      } else if constexpr (std::is_integral_v<T>) {  // exact and wrapping (alpha is integral: ops.cc)
        const T ai = saturating_float_to_int<T>(a);
        for (int64_t i = 0; i < n; ++i) yp[i * ys] = wrapping_add(yp[i * ys], wrapping_mul(ai, xp[i * xs]));
      } else {  // 16-bit floats through float, rounded once
        for (int64_t i = 0; i < n; ++i)
          yp[i * ys] = detail::store<T>(static_cast<C>(yp[i * ys]) + a * static_cast<C>(xp[i * xs]));
      }
    });
  });
}

void where(const Tensor& cond, const Tensor& a, const Tensor& b, const Tensor& out) {
  check_out("where", a, out);
  check_out("where", b, out);
  RT_CHECK(cond.shape() == out.shape(), "where (cpu kernel): condition ", cond.describe(),
           " does not match output ", out.describe());
  if (out.numel() == 0) return;
  dispatch_dtype(out.dtype(), [&](auto tag) {
    using T = decltype(tag);
    dispatch_dtype(cond.dtype(), [&](auto ctag) {
      using K = decltype(ctag);
      StridedLoop<4> loop(out.shape(), {&out.strides(), &cond.strides(), &a.strides(), &b.strides()},
                          {isz<T>(), isz<K>(), isz<T>(), isz<T>()});
      loop.run({byte_ptr(out), byte_ptr(cond), byte_ptr(a), byte_ptr(b)},
               [](std::array<char*, 4> p, const std::array<int64_t, 4>& s, int64_t n) {
                 T* y = reinterpret_cast<T*>(p[0]);
                 const K* c = reinterpret_cast<const K*>(p[1]);
                 const T* x = reinterpret_cast<const T*>(p[2]);
                 const T* z = reinterpret_cast<const T*>(p[3]);
                 const int64_t ys = s[0] / isz<T>(), cs = s[1] / isz<K>(), xs = s[2] / isz<T>(),
                               zs = s[3] / isz<T>();
                 for (int64_t i = 0; i < n; ++i) {
                   y[i * ys] = detail::load(c[i * cs]) != 0 ? x[i * xs] : z[i * zs];
                 }
               });
    });
  });
}

bool all_finite(const Tensor& a) {
  RT_CHECK(a.device().is_cpu(), "all_finite (cpu kernel): ", a.describe(), " is not on the cpu");
  if (a.numel() == 0 || !is_floating_point(a.dtype())) return true;
  bool finite = true;
  dispatch_dtype(a.dtype(), [&](auto tag) {
    using T = decltype(tag);
    if constexpr (detail::kIsFloat<T>) {
      StridedLoop<1> loop(a.shape(), {&a.strides()}, {isz<T>()}, 0);
      loop.run({byte_ptr(a)}, [&](std::array<char*, 1> p, const std::array<int64_t, 1>& s,
                                   int64_t n) {
        if (!finite) return;
        const T* x = reinterpret_cast<const T*>(p[0]);
        const int64_t xs = s[0] / isz<T>();
        if constexpr (std::is_same_v<T, float>) {
          if (xs == 1) {  // exponent all ones <=> inf or NaN; OR-reduce vectorises
            const uint32_t* u = reinterpret_cast<const uint32_t*>(x);
            uint32_t bad = 0;
            for (int64_t i = 0; i < n; ++i) bad |= ((u[i] & 0x7f800000u) == 0x7f800000u);
            finite = finite && bad == 0;
            return;
          }
        }
        for (int64_t i = 0; i < n; ++i) {
          if (!std::isfinite(detail::load(x[i * xs]))) {
            finite = false;
            return;
          }
        }
      });
    }
  });
  return finite;
}

}  // namespace ringtrain::kernels::cpu
