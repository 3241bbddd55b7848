// kernel_utils.cuh: device-side building blocks for the tensor library's own CUDA kernels.
//
// defines: DeviceType<T> (ringtrain storage type -> CUDA type: Half -> __half,
//          BFloat16 -> __nv_bfloat16), AccType<T> (what arithmetic runs in),
//          convert<To>(from) (any dtype to any dtype, through float for 16-bit
//          types), StridedIndexer + make_indexers (coalesced shape/strides passed
//          by value to kernels, up to kMaxDims dims), launch configuration helpers,
//          dispatch_cuda_dtype / dispatch_float_dtype, warp/block reductions,
//          atomic_add for every dtype.
//
// Strided tensors. Kernels see a tensor as (pointer, shape, strides) with
// strides in elements, 0 meaning broadcast. Before a launch, make_indexers
// coalesces the dims of all operands together: size-1 dims are dropped and two
// neighbouring dims merge when every operand can step over both with one stride.
// A contiguous elementwise op thus becomes a single dim of stride 1 and the
// per-element offset is one multiply; a transposed or broadcast operand keeps
// only the dims it really needs. At most kMaxDims dims survive; more throws.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "tensor/checks.h"
#include "tensor/cuda/internal.cuh"
#include "tensor/dtype.h"
#include "tensor/tensor.h"

namespace ringtrain::cuda::detail {

// ---------------------------------------------------------------- types

template <typename T> struct DeviceTypeOf { using type = T; };
template <> struct DeviceTypeOf<Half> { using type = __half; };
template <> struct DeviceTypeOf<BFloat16> { using type = __nv_bfloat16; };
template <typename T> using DeviceType = typename DeviceTypeOf<T>::type;

template <typename T> struct AccTypeOf { using type = T; };
template <> struct AccTypeOf<__half> { using type = float; };
template <> struct AccTypeOf<__nv_bfloat16> { using type = float; };
template <typename T> using AccType = typename AccTypeOf<T>::type;

template <typename T>
inline constexpr bool kIsReduced = std::is_same_v<T, __half> || std::is_same_v<T, __nv_bfloat16>;
template <typename T>
inline constexpr bool kIsFloat = kIsReduced<T> || std::is_floating_point_v<T>;

// Any dtype to any dtype. 16-bit floats go through float (round to nearest even on store).
template <typename To, typename From>
__host__ __device__ __forceinline__ To convert(From v) {
  if constexpr (std::is_same_v<To, From>) {
    return v;
  } else if constexpr (std::is_same_v<From, __half>) {
    return convert<To>(__half2float(v));
  } else if constexpr (std::is_same_v<From, __nv_bfloat16>) {
    return convert<To>(__bfloat162float(v));
  } else if constexpr (std::is_same_v<To, __half>) {
    return __float2half_rn(static_cast<float>(v));
  } else if constexpr (std::is_same_v<To, __nv_bfloat16>) {
    return __float2bfloat16_rn(static_cast<float>(v));
  } else if constexpr (std::is_integral_v<To> && std::is_floating_point_v<From>) {
    // The CPU's conversion (dtype.h): NaN -> 0, out of range saturates. Device code's
    // cvt.rzi already does this; calling it makes host code agree and defined.
    return saturating_float_to_int<To>(v);
  } else {
    return static_cast<To>(v);
  }
}

// Calls fn(T{}) with T the CUDA type of `dtype` (all six dtypes).
template <typename Fn>
decltype(auto) dispatch_cuda_dtype(DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::kFloat32: return fn(float{});
    case DType::kFloat64: return fn(double{});
    case DType::kFloat16: return fn(__half{});
    case DType::kBFloat16: return fn(__nv_bfloat16{});
    case DType::kInt32: return fn(int32_t{});
    case DType::kInt64: return fn(int64_t{});
  }
  throw Error("dispatch_cuda_dtype: unknown dtype");
}

// The floating dtypes only; `op` names the caller in the error for integer dtypes.
template <typename Fn>
decltype(auto) dispatch_float_dtype(DType dtype, const char* op, Fn&& fn) {
  switch (dtype) {
    case DType::kFloat32: return fn(float{});
    case DType::kFloat64: return fn(double{});
    case DType::kFloat16: return fn(__half{});
    case DType::kBFloat16: return fn(__nv_bfloat16{});
    default: break;
  }
  throw Error(::ringtrain::detail::concat(op, ": CUDA kernel supports float32/float64/float16/bfloat16, got ",
                     dtype_name(dtype)));
}

// ---------------------------------------------------------------- strided indexing

inline constexpr int kMaxDims = 8;

// Maps a linear index over the (coalesced) iteration shape to an element offset.
struct StridedIndexer {
  int ndim = 0;
  int64_t sizes[kMaxDims] = {};
  int64_t strides[kMaxDims] = {};

  __host__ __device__ __forceinline__ int64_t offset(int64_t linear) const {
    int64_t off = 0;
    // Innermost dims first; the outermost needs no modulo.
    for (int d = ndim - 1; d > 0; --d) {
      int64_t size = sizes[d];
      int64_t q = linear / size;
      off += (linear - q * size) * strides[d];
      linear = q;
    }
    if (ndim > 0) off += linear * strides[0];
    return off;
  }
};

// Coalesces `shape` with the strides of N operands into N indexers that share
// one iteration shape. Throws naming `op` when more than kMaxDims dims remain.
template <size_t N>
std::array<StridedIndexer, N> make_indexers(const Shape& shape,
                                            const std::array<const Shape*, N>& strides,
                                            const char* op) {
  std::vector<int64_t> sizes;
  std::array<std::vector<int64_t>, N> st;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 1) continue;  // a size-1 dim never moves the offset
    sizes.push_back(shape[d]);
    for (size_t i = 0; i < N; ++i) st[i].push_back((*strides[i])[d]);
  }
  // Merge dim k-1 into dim k (inner) when for every operand stride[k-1] == stride[k] * size[k].
  std::vector<int64_t> out_sizes;
  std::array<std::vector<int64_t>, N> out_st;
  for (size_t d = 0; d < sizes.size(); ++d) {
    bool merge = !out_sizes.empty();
    if (merge) {
      for (size_t i = 0; i < N; ++i) {
        if (out_st[i].back() != st[i][d] * sizes[d]) {
          merge = false;
          break;
        }
      }
    }
    if (merge) {
      out_sizes.back() *= sizes[d];
      for (size_t i = 0; i < N; ++i) out_st[i].back() = st[i][d];
    } else {
      out_sizes.push_back(sizes[d]);
      for (size_t i = 0; i < N; ++i) out_st[i].push_back(st[i][d]);
    }
  }
  RT_CHECK(out_sizes.size() <= static_cast<size_t>(kMaxDims), op, ": CUDA kernels support at most ",
           kMaxDims, " non-mergeable dims, got ", out_sizes.size(), " for shape ", shape_str(shape),
           "; make the operands contiguous first");
  std::array<StridedIndexer, N> result;
  for (size_t i = 0; i < N; ++i) {
    result[i].ndim = static_cast<int>(out_sizes.size());
    for (size_t d = 0; d < out_sizes.size(); ++d) {
      result[i].sizes[d] = out_sizes[d];
      result[i].strides[d] = out_st[i][d];
    }
  }
  return result;
}

// An indexer for one tensor over its own shape.
inline StridedIndexer make_indexer(const Tensor& t, const char* op) {
  return make_indexers<1>(t.shape(), {&t.strides()}, op)[0];
}

// ---------------------------------------------------------------- launch helpers

inline constexpr int kThreads = 256;

// Grid size for a grid-stride loop over n elements (capped; the loop covers the rest).
inline unsigned grid_for(int64_t n, int threads = kThreads) {
  int64_t blocks = (n + threads - 1) / threads;
  return static_cast<unsigned>(std::clamp<int64_t>(blocks, 1, int64_t{1} << 20));
}

// Throws if the last launch failed (bad configuration, missing kernel image for this GPU).
inline void check_launch(const char* op) {
  cudaError_t status = cudaGetLastError();
  if (status != cudaSuccess)
    throw Error(::ringtrain::detail::concat(op, ": CUDA kernel launch failed: ", cudaGetErrorString(status)));
}

#define RT_GRID_STRIDE_LOOP(i, n)                                                          \
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < (n); \
       i += static_cast<int64_t>(blockDim.x) * gridDim.x)

// ---------------------------------------------------------------- math helpers

template <typename T>
__device__ __forceinline__ bool is_nan(T v) {
  if constexpr (std::is_floating_point_v<T>) return ::isnan(v);
  else return false;
}

template <typename T>
__device__ __forceinline__ T lowest_value() {
  if constexpr (std::is_same_v<T, float>) return -INFINITY;
  else if constexpr (std::is_same_v<T, double>) return -static_cast<double>(INFINITY);
  else if constexpr (std::is_same_v<T, int32_t>) return INT32_MIN;
  else return INT64_MIN;
}

template <typename T>
__device__ __forceinline__ T highest_value() {
  if constexpr (std::is_same_v<T, float>) return INFINITY;
  else if constexpr (std::is_same_v<T, double>) return static_cast<double>(INFINITY);
  else if constexpr (std::is_same_v<T, int32_t>) return INT32_MAX;
  else return INT64_MAX;
}

template <typename T>
__device__ __forceinline__ T shfl_down(T v, int delta) {
  if constexpr (std::is_same_v<T, int64_t>) {
    return static_cast<int64_t>(__shfl_down_sync(0xffffffffu, static_cast<long long>(v), delta));
  } else {
    return __shfl_down_sync(0xffffffffu, v, delta);
  }
}

// atomicAdd for every dtype (int64 through the unsigned 64-bit overload: two's
// complement addition is the same operation). 16-bit floats need sm_70/sm_80+.
template <typename T>
__device__ __forceinline__ void atomic_add(T* address, T value) {
  if constexpr (std::is_same_v<T, int64_t>) {
    atomicAdd(reinterpret_cast<unsigned long long*>(address),
              static_cast<unsigned long long>(value));
  } else {
    atomicAdd(address, value);
  }
}

// Reduces `v` across the block with `combine`; the result is valid in thread 0.
// blockDim.x must be a multiple of 32 and at most 1024. `shared` holds 32 T.
template <typename T, typename Combine>
__device__ __forceinline__ T block_reduce(T v, Combine combine, T* shared) {
  int lane = threadIdx.x % 32;
  int warp = threadIdx.x / 32;
  for (int delta = 16; delta > 0; delta /= 2) v = combine(v, shfl_down(v, delta));
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  int warps = blockDim.x / 32;
  if (warp == 0) {
    v = lane < warps ? shared[lane] : shared[0];
    // Lanes past `warps` hold a copy of shared[0]; only combine real partials.
    for (int delta = 16; delta > 0; delta /= 2) {
      T other = shfl_down(v, delta);
      if (lane + delta < warps) v = combine(v, other);
    }
  }
  __syncthreads();  // `shared` may be reused by the caller after this
  return v;
}

}  // namespace ringtrain::cuda::detail
