// elementwise.cu: CUDA kernels for unary and binary elementwise math, where, and
// the all-finite check that loss scaling runs on every gradient.
//
// defines: kernels::cuda::unary, binary, binary_scalar, where, all_finite
//          (declared in tensor/kernels.h).
//
// One kernel template per (dtype, op): the op is a template parameter so the
// per-element switch disappears at compile time. Every operand, the output
// included, goes through a StridedIndexer; make_indexers coalesces them
// together, so the common case (everything contiguous, or a contiguous output
// with a broadcast row) costs a multiply per element, and in-place calls on
// strided views (out == a, a view) are just as valid.
//
// Arithmetic runs in AccType<T>: float for float16/bfloat16 (rounded once on
// store, as ops.h promises), T itself otherwise. Integer dtypes support every op;
// transcendental ones (exp, log, ...) are computed in double and truncated back,
// integer division by zero gives 0 (a GPU cannot throw from a kernel). max/min
// propagate NaN, as PyTorch's maximum/minimum do. Comparisons write 1 or 0 in
// the operands' dtype. binary_scalar is binary with b replaced by one value:
// the same kernels, with a flag that is uniform across the grid.
#include <cuda_runtime.h>

#include <cmath>
#include <type_traits>

#include "tensor/cuda/internal.cuh"
#include "tensor/cuda/kernel_utils.cuh"
#include "tensor/kernels.h"

namespace ringtrain::kernels::cuda {

namespace {

using ringtrain::cuda::detail::AccType;
using ringtrain::cuda::detail::check_launch;
using ringtrain::cuda::detail::convert;
using ringtrain::cuda::detail::cuda_device_of;
using ringtrain::cuda::detail::DeviceGuard;
using ringtrain::cuda::detail::dispatch_cuda_dtype;
using ringtrain::cuda::detail::grid_for;
using ringtrain::cuda::detail::check_same_device;
using ringtrain::cuda::detail::kThreads;
using ringtrain::cuda::detail::make_indexers;
using ringtrain::cuda::detail::raw_stream;
using ringtrain::cuda::detail::require_cuda;
using ringtrain::cuda::detail::StridedIndexer;

// ---------------------------------------------------------------- float math by type

template <typename A> __device__ __forceinline__ A d_exp(A x) {
  if constexpr (std::is_same_v<A, float>) return ::expf(x); else return ::exp(x);
}
template <typename A> __device__ __forceinline__ A d_log(A x) {
  if constexpr (std::is_same_v<A, float>) return ::logf(x); else return ::log(x);
}
template <typename A> __device__ __forceinline__ A d_sqrt(A x) {
  if constexpr (std::is_same_v<A, float>) return ::sqrtf(x); else return ::sqrt(x);
}
template <typename A> __device__ __forceinline__ A d_tanh(A x) {
  if constexpr (std::is_same_v<A, float>) return ::tanhf(x); else return ::tanh(x);
}
template <typename A> __device__ __forceinline__ A d_erf(A x) {
  if constexpr (std::is_same_v<A, float>) return ::erff(x); else return ::erf(x);
}
template <typename A> __device__ __forceinline__ A d_pow(A x, A y) {
  if constexpr (std::is_same_v<A, float>) return ::powf(x, y); else return ::pow(x, y);
}

// Floating-point unary math in F (float or double).
template <UnaryOp kOp, typename F>
__device__ __forceinline__ F unary_float(F x) {
  constexpr F kInvSqrt2 = F(0.70710678118654752440);
  constexpr F kInvSqrt2Pi = F(0.39894228040143267794);
  if constexpr (kOp == UnaryOp::kNeg) return -x;
  else if constexpr (kOp == UnaryOp::kExp) return d_exp(x);
  else if constexpr (kOp == UnaryOp::kLog) return d_log(x);
  else if constexpr (kOp == UnaryOp::kSqrt) return d_sqrt(x);
  else if constexpr (kOp == UnaryOp::kAbs) return x < F(0) ? -x : x;
  else if constexpr (kOp == UnaryOp::kRelu) return x < F(0) ? F(0) : x;  // NaN stays NaN
  else if constexpr (kOp == UnaryOp::kGelu) return F(0.5) * x * (F(1) + d_erf(x * kInvSqrt2));
  else if constexpr (kOp == UnaryOp::kGeluGrad)
    return F(0.5) * (F(1) + d_erf(x * kInvSqrt2)) + x * kInvSqrt2Pi * d_exp(F(-0.5) * x * x);
  else if constexpr (kOp == UnaryOp::kTanh) return d_tanh(x);
  else if constexpr (kOp == UnaryOp::kSigmoid) return F(1) / (F(1) + d_exp(-x));
  else return ::isfinite(x) ? F(1) : F(0);  // kIsFinite
}

template <UnaryOp kOp, typename T>
__device__ __forceinline__ T apply_unary(T v) {
  using A = AccType<T>;
  if constexpr (std::is_integral_v<A>) {
    // Two's complement as on the CPU: -INT_MIN == |INT_MIN| == INT_MIN (dtype.h).
    if constexpr (kOp == UnaryOp::kNeg) return wrapping_neg(v);
    else if constexpr (kOp == UnaryOp::kAbs) return wrapping_abs(v);
    else if constexpr (kOp == UnaryOp::kRelu) return v < 0 ? T(0) : v;
    else if constexpr (kOp == UnaryOp::kIsFinite) return T(1);
    else return static_cast<T>(unary_float<kOp, double>(static_cast<double>(v)));
  } else {
    return convert<T>(unary_float<kOp, A>(convert<A>(v)));
  }
}

template <BinaryOp kOp, typename A>
__device__ __forceinline__ A apply_binary(A a, A b) {
  // Integer add/sub/mul/div wrap around as on the CPU (wrapping_* in dtype.h); an integer
  // division by zero gives 0 (a kernel cannot throw; ops.h documents it).
  if constexpr (kOp == BinaryOp::kAdd) return wrapping_add(a, b);
  else if constexpr (kOp == BinaryOp::kSub) return wrapping_sub(a, b);
  else if constexpr (kOp == BinaryOp::kMul) return wrapping_mul(a, b);
  else if constexpr (kOp == BinaryOp::kDiv) {
    if constexpr (std::is_integral_v<A>) return b == 0 ? A(0) : wrapping_div(a, b);
    else return a / b;
  } else if constexpr (kOp == BinaryOp::kPow) {
    if constexpr (std::is_integral_v<A>) return wrapping_pow(a, b);  // exact, as on the CPU
    else return d_pow(a, b);
  } else if constexpr (kOp == BinaryOp::kMax) {
    if constexpr (std::is_floating_point_v<A>) {
      if (::isnan(a) || ::isnan(b)) return a + b;  // NaN
    }
    return a > b ? a : b;
  } else if constexpr (kOp == BinaryOp::kMin) {
    if constexpr (std::is_floating_point_v<A>) {
      if (::isnan(a) || ::isnan(b)) return a + b;
    }
    return a < b ? a : b;
  }
  else if constexpr (kOp == BinaryOp::kEq) return a == b ? A(1) : A(0);
  else if constexpr (kOp == BinaryOp::kNe) return a != b ? A(1) : A(0);
  else if constexpr (kOp == BinaryOp::kLt) return a < b ? A(1) : A(0);
  else if constexpr (kOp == BinaryOp::kLe) return a <= b ? A(1) : A(0);
  else if constexpr (kOp == BinaryOp::kGt) return a > b ? A(1) : A(0);
  else return a >= b ? A(1) : A(0);  // kGe
}

// ---------------------------------------------------------------- kernels

template <UnaryOp kOp, typename T>
__global__ void unary_kernel(const T* in, StridedIndexer in_ix, T* out, StridedIndexer out_ix,
                             int64_t n) {
  RT_GRID_STRIDE_LOOP(i, n) { out[out_ix.offset(i)] = apply_unary<kOp>(in[in_ix.offset(i)]); }
}

// b_is_scalar selects `scalar` instead of b[...]; it is the same for every thread.
template <BinaryOp kOp, typename T>
__global__ void binary_kernel(const T* a, StridedIndexer a_ix, const T* b, StridedIndexer b_ix,
                              AccType<T> scalar, bool b_is_scalar, T* out, StridedIndexer out_ix,
                              int64_t n) {
  using A = AccType<T>;
  RT_GRID_STRIDE_LOOP(i, n) {
    A x = convert<A>(a[a_ix.offset(i)]);
    A y = b_is_scalar ? scalar : convert<A>(b[b_ix.offset(i)]);
    out[out_ix.offset(i)] = convert<T>(apply_binary<kOp, A>(x, y));
  }
}

template <typename C, typename T>
__global__ void where_kernel(const C* cond, StridedIndexer c_ix, const T* a, StridedIndexer a_ix,
                             const T* b, StridedIndexer b_ix, T* out, StridedIndexer out_ix,
                             int64_t n) {
  RT_GRID_STRIDE_LOOP(i, n) {
    bool take_a;
    if constexpr (std::is_integral_v<C>) take_a = cond[c_ix.offset(i)] != 0;
    else take_a = convert<float>(cond[c_ix.offset(i)]) != 0.0f;  // NaN counts as true
    out[out_ix.offset(i)] = take_a ? a[a_ix.offset(i)] : b[b_ix.offset(i)];
  }
}

template <typename T>
__global__ void nonfinite_kernel(const T* in, StridedIndexer ix, int64_t n, int* found) {
  using A = AccType<T>;
  RT_GRID_STRIDE_LOOP(i, n) {
    if (!::isfinite(convert<A>(in[ix.offset(i)]))) *found = 1;  // benign race: all write 1
  }
}

// ---------------------------------------------------------------- runtime op -> template

template <typename Fn>
void dispatch_unary(UnaryOp op, Fn&& fn) {
  switch (op) {
#define RT_CASE(name) \
  case UnaryOp::name: fn(std::integral_constant<UnaryOp, UnaryOp::name>{}); return;
    RT_CASE(kNeg) RT_CASE(kExp) RT_CASE(kLog) RT_CASE(kSqrt) RT_CASE(kAbs) RT_CASE(kRelu)
    RT_CASE(kGelu) RT_CASE(kGeluGrad) RT_CASE(kTanh) RT_CASE(kSigmoid) RT_CASE(kIsFinite)
#undef RT_CASE
  }
  throw Error("cuda::unary: unknown UnaryOp");
}

template <typename Fn>
void dispatch_binary(BinaryOp op, Fn&& fn) {
  switch (op) {
#define RT_CASE(name) \
  case BinaryOp::name: fn(std::integral_constant<BinaryOp, BinaryOp::name>{}); return;
    RT_CASE(kAdd) RT_CASE(kSub) RT_CASE(kMul) RT_CASE(kDiv) RT_CASE(kPow) RT_CASE(kMax)
    RT_CASE(kMin) RT_CASE(kEq) RT_CASE(kNe) RT_CASE(kLt) RT_CASE(kLe) RT_CASE(kGt) RT_CASE(kGe)
#undef RT_CASE
  }
  throw Error("cuda::binary: unknown BinaryOp");
}

// Shared body of binary and binary_scalar (b undefined = scalar).
void launch_binary(BinaryOp op, const Tensor& a, const Tensor* b, double scalar, const Tensor& out,
                   const char* name) {
  int device = cuda_device_of(out, name);
  check_same_device(name, device, a);
  RT_CHECK(a.shape() == out.shape() && a.dtype() == out.dtype(), name, ": a ", a.describe(),
           " must have out's shape and dtype, out ", out.describe());
  if (b != nullptr) {
    check_same_device(name, device, *b);
    RT_CHECK(b->shape() == out.shape() && b->dtype() == out.dtype(), name, ": b ", b->describe(),
             " must have out's shape and dtype, out ", out.describe());
  }
  int64_t n = out.numel();
  if (n == 0) return;
  require_cuda(name, device);
  DeviceGuard guard(device);
  cudaStream_t stream = raw_stream(device);
  const Shape& b_strides = b != nullptr ? b->strides() : a.strides();
  auto ix = make_indexers<3>(out.shape(), {&a.strides(), &b_strides, &out.strides()}, name);
  dispatch_cuda_dtype(out.dtype(), [&](auto tag) {
    using T = decltype(tag);
    using A = AccType<T>;
    const T* b_data = b != nullptr ? static_cast<const T*>(b->data_ptr()) : nullptr;
    // The scalar in the compute type as the CPU converts it: for integers truncated and
    // saturated, NaN -> 0 (a static_cast of 1e30 or NaN to int is undefined behaviour).
    // Integer comparisons arrive rewritten by ops.cc (scalar_op) against a value the dtype
    // holds (x < 2.5 as x <= 2), so they are exact here too, as on the CPU.
    const A scalar_a = convert<A>(scalar);
    if constexpr (std::is_integral_v<A>)
      RT_CHECK(b != nullptr || op != BinaryOp::kDiv || scalar_a != A(0), name, ": integer division of ",
               a.describe(), " by the scalar ", scalar, " (zero as an integer)");
    dispatch_binary(op, [&](auto op_tag) {
      binary_kernel<decltype(op_tag)::value, T><<<grid_for(n), kThreads, 0, stream>>>(
          static_cast<const T*>(a.data_ptr()), ix[0], b_data, ix[1], scalar_a,
          b == nullptr, static_cast<T*>(out.data_ptr()), ix[2], n);
    });
  });
  check_launch(name);
}

}  // namespace

void unary(UnaryOp op, const Tensor& in, const Tensor& out) {
  constexpr const char* kOp = "cuda::unary";
  int device = cuda_device_of(out, kOp);
  check_same_device(kOp, device, in);
  RT_CHECK(in.shape() == out.shape() && in.dtype() == out.dtype(), kOp, "(", unary_op_name(op),
           "): in ", in.describe(), " must have out's shape and dtype, out ", out.describe());
  int64_t n = out.numel();
  if (n == 0) return;
  require_cuda(kOp, device);
  DeviceGuard guard(device);
  cudaStream_t stream = raw_stream(device);
  auto ix = make_indexers<2>(out.shape(), {&in.strides(), &out.strides()}, kOp);
  dispatch_cuda_dtype(out.dtype(), [&](auto tag) {
    using T = decltype(tag);
    dispatch_unary(op, [&](auto op_tag) {
      unary_kernel<decltype(op_tag)::value, T><<<grid_for(n), kThreads, 0, stream>>>(
          static_cast<const T*>(in.data_ptr()), ix[0], static_cast<T*>(out.data_ptr()), ix[1], n);
    });
  });
  check_launch(kOp);
}

void binary(BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& out) {
  launch_binary(op, a, &b, 0.0, out, "cuda::binary");
}

void binary_scalar(BinaryOp op, const Tensor& a, double scalar, const Tensor& out) {
  launch_binary(op, a, nullptr, scalar, out, "cuda::binary_scalar");
}

// y += alpha * x as two of the launches above (scale into a temporary, add); the
// CPU kernel is fused, a fused CUDA kernel is a later optimisation. Float16/bfloat16
// go through float32 copies, so alpha * x is not rounded to half before the add (the
// CPU rounds once; 60000 * 2 - 60000 would be inf otherwise). Integers are exact:
// alpha is integral (ops.cc checks) and mul/add wrap.
void axpy(double alpha, const Tensor& x, const Tensor& y) {
  if (is_reduced_precision_float(y.dtype())) {
    Tensor y32 = Tensor::empty(y.shape(), DType::kFloat32, y.device());
    Tensor x32 = Tensor::empty(x.shape(), DType::kFloat32, x.device());
    copy(y32, y);
    copy(x32, x);
    axpy(alpha, x32, y32);
    copy(y, y32);
    return;
  }
  Tensor scaled = Tensor::empty(x.shape(), x.dtype(), x.device());
  binary_scalar(BinaryOp::kMul, x, alpha, scaled);
  binary(BinaryOp::kAdd, y, scaled, y);
}

void where(const Tensor& cond, const Tensor& a, const Tensor& b, const Tensor& out) {
  constexpr const char* kOp = "cuda::where";
  int device = cuda_device_of(out, kOp);
  check_same_device(kOp, device, cond, a, b);
  RT_CHECK(cond.shape() == out.shape() && a.shape() == out.shape() && b.shape() == out.shape(),
           kOp, ": cond ", cond.describe(), ", a ", a.describe(), ", b ", b.describe(),
           " must all be expanded to out ", out.describe());
  RT_CHECK(a.dtype() == out.dtype() && b.dtype() == out.dtype(), kOp, ": a ", a.describe(),
           " and b ", b.describe(), " must have out's dtype ", dtype_name(out.dtype()));
  int64_t n = out.numel();
  if (n == 0) return;
  require_cuda(kOp, device);
  DeviceGuard guard(device);
  cudaStream_t stream = raw_stream(device);
  auto ix = make_indexers<4>(out.shape(),
                             {&cond.strides(), &a.strides(), &b.strides(), &out.strides()}, kOp);
  dispatch_cuda_dtype(out.dtype(), [&](auto tag) {
    using T = decltype(tag);
    dispatch_cuda_dtype(cond.dtype(), [&](auto cond_tag) {
      using C = decltype(cond_tag);
      where_kernel<C, T><<<grid_for(n), kThreads, 0, stream>>>(
          static_cast<const C*>(cond.data_ptr()), ix[0], static_cast<const T*>(a.data_ptr()),
          ix[1], static_cast<const T*>(b.data_ptr()), ix[2], static_cast<T*>(out.data_ptr()),
          ix[3], n);
    });
  });
  check_launch(kOp);
}

bool all_finite(const Tensor& a) {
  constexpr const char* kOp = "cuda::all_finite";
  int device = cuda_device_of(a, kOp);
  int64_t n = a.numel();
  if (n == 0 || !is_floating_point(a.dtype())) return true;  // integers are always finite
  require_cuda(kOp, device);
  DeviceGuard guard(device);
  cudaStream_t stream = raw_stream(device);
  // One int on the device, cleared, set by any thread that sees inf/NaN, read back once.
  DataPtr flag = ringtrain::cuda::caching_allocate(sizeof(int), device);
  CUDA_CHECK(cudaMemsetAsync(flag.get(), 0, sizeof(int), stream));
  auto ix = make_indexers<1>(a.shape(), {&a.strides()}, kOp);
  dispatch_cuda_dtype(a.dtype(), [&](auto tag) {
    using T = decltype(tag);
    if constexpr (!std::is_integral_v<T>) {
      nonfinite_kernel<T><<<grid_for(n), kThreads, 0, stream>>>(
          static_cast<const T*>(a.data_ptr()), ix[0], n, static_cast<int*>(flag.get()));
    }
  });
  check_launch(kOp);
  int found = 0;
  CUDA_CHECK(cudaMemcpyAsync(&found, flag.get(), sizeof(int), cudaMemcpyDeviceToHost, stream));
  CUDA_CHECK(cudaStreamSynchronize(stream));
  return found == 0;
}

}  // namespace ringtrain::kernels::cuda
