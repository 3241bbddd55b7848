// reduce.cu: CUDA reductions: sum/max/min over any set of dims, and max-with-index along one dim.
//
// defines: kernels::cuda::reduce, max_along (declared in tensor/kernels.h).
//
// reduce() splits the input's dims into kept dims (they index the output) and
// reduced dims (they are summed over). Each side gets its own coalesced
// StridedIndexer, so element (o, r) lives at kept.offset(o) + reduced.offset(r)
// whatever the input's strides. Three shapes of work cover the cases:
//
//  * thread per output: one thread loops over all n_red elements of its output.
//    Used when n_red is small, or when the reduced dims are outer ones (a
//    column sum of [N, C], the bias gradient): neighbouring threads then read
//    neighbouring addresses, so the loads coalesce.
//  * block per output: the block's threads stride over the reduced range and
//    combine with warp shuffles. Used when the reduced dims are the innermost
//    (a row sum of [N, C]): the threads of a block read consecutive addresses.
//  * block per (output, chunk) + a second pass: when there are few outputs and
//    many elements each (a whole-tensor sum), the reduced range is cut into
//    chunks so the whole GPU works; partials go to a scratch buffer from the
//    caching allocator and a thread-per-output pass combines them.
//
// Accumulators: sums of float16/bfloat16/float32 accumulate in float32, float64
// in float64, integers in int64 (ops.h's promise); max/min compare in the
// element's arithmetic type and propagate NaN (as torch.amax does).
//
// max_along() is the argmax/max(dim) kernel on a contiguous [outer, n, inner]
// view; ties resolve to the first index, and a NaN counts as the maximum.
#include <cuda_runtime.h>

#include <algorithm>
#include <type_traits>
#include <vector>

#include "tensor/cuda/internal.cuh"
#include "tensor/cuda/kernel_utils.cuh"
#include "tensor/kernels.h"

namespace ringtrain::kernels::cuda {

namespace {

using ringtrain::cuda::detail::AccType;
using ringtrain::cuda::detail::block_reduce;
using ringtrain::cuda::detail::check_launch;
using ringtrain::cuda::detail::check_same_device;
using ringtrain::cuda::detail::convert;
using ringtrain::cuda::detail::cuda_device_of;
using ringtrain::cuda::detail::DeviceGuard;
using ringtrain::cuda::detail::dispatch_cuda_dtype;
using ringtrain::cuda::detail::grid_for;
using ringtrain::cuda::detail::highest_value;
using ringtrain::cuda::detail::is_nan;
using ringtrain::cuda::detail::kThreads;
using ringtrain::cuda::detail::lowest_value;
using ringtrain::cuda::detail::make_indexers;
using ringtrain::cuda::detail::raw_stream;
using ringtrain::cuda::detail::require_cuda;
using ringtrain::cuda::detail::shfl_down;
using ringtrain::cuda::detail::StridedIndexer;

// The accumulator of a reduction of T with op kOp.
template <ReduceOp kOp, typename T>
using ReduceAcc = std::conditional_t<kOp == ReduceOp::kSum && std::is_integral_v<T>, int64_t,
                                     AccType<T>>;

template <ReduceOp kOp, typename R>
struct Combine {
  __device__ __forceinline__ R identity() const {
    if constexpr (kOp == ReduceOp::kSum) return R(0);
    else if constexpr (kOp == ReduceOp::kMax) return lowest_value<R>();
    else return highest_value<R>();
  }
  __device__ __forceinline__ R operator()(R a, R b) const {
    if constexpr (kOp == ReduceOp::kSum) {
      return wrapping_add(a, b);  // integer sums wrap in int64, as on the CPU (dtype.h)
    } else {
      if (is_nan(a)) return a;
      if (is_nan(b)) return b;
      if constexpr (kOp == ReduceOp::kMax) return a > b ? a : b;
      else return a < b ? a : b;
    }
  }
};

// One thread per output: out[o] = combine over r of in[kept(o) + red(r)].
template <ReduceOp kOp, typename T, typename R, typename Out>
__global__ void reduce_thread_kernel(const T* in, StridedIndexer kept, StridedIndexer red,
                                     int64_t n_red, Out* out, StridedIndexer out_ix,
                                     int64_t n_out) {
  Combine<kOp, R> combine;
  RT_GRID_STRIDE_LOOP(o, n_out) {
    const T* base = in + kept.offset(o);
    R acc = combine.identity();
    for (int64_t r = 0; r < n_red; ++r) acc = combine(acc, convert<R>(base[red.offset(r)]));
    out[out_ix.offset(o)] = convert<Out>(acc);
  }
}

// gridDim.y chunks per output; block (x, y) reduces chunk y of output x (grid-strided over x).
// With one chunk it writes the output, otherwise partial[o * chunks + y].
template <ReduceOp kOp, typename T, typename R, typename Out>
__global__ void reduce_block_kernel(const T* in, StridedIndexer kept, StridedIndexer red,
                                    int64_t n_red, int64_t chunk_len, Out* out,
                                    StridedIndexer out_ix, R* partial, int64_t n_out) {
  __shared__ R shared[32];
  Combine<kOp, R> combine;
  int64_t chunks = gridDim.y;
  int64_t begin = blockIdx.y * chunk_len;
  int64_t end = begin + chunk_len < n_red ? begin + chunk_len : n_red;
  for (int64_t o = blockIdx.x; o < n_out; o += gridDim.x) {
    const T* base = in + kept.offset(o);
    R acc = combine.identity();
    for (int64_t r = begin + threadIdx.x; r < end; r += blockDim.x)
      acc = combine(acc, convert<R>(base[red.offset(r)]));
    acc = block_reduce(acc, combine, shared);
    if (threadIdx.x == 0) {
      if (chunks == 1) out[out_ix.offset(o)] = convert<Out>(acc);
      else partial[o * chunks + blockIdx.y] = acc;
    }
  }
}

template <typename R>
R* as_ptr(const DataPtr& p) {
  return static_cast<R*>(p.get());
}

template <ReduceOp kOp, typename T>
void launch_reduce(const Tensor& in, const StridedIndexer& kept, const StridedIndexer& red,
                   int64_t n_red, const Tensor& out, const StridedIndexer& out_ix, int64_t n_out,
                   int device, cudaStream_t stream) {
  using R = ReduceAcc<kOp, T>;
  const T* in_data = static_cast<const T*>(in.data_ptr());
  T* out_data = static_cast<T*>(out.data_ptr());
  bool red_innermost = red.ndim > 0 && red.strides[red.ndim - 1] == 1;
  if (n_red <= 32 || (!red_innermost && n_out >= 1024)) {
    reduce_thread_kernel<kOp, T, R, T><<<grid_for(n_out), kThreads, 0, stream>>>(
        in_data, kept, red, n_red, out_data, out_ix, n_out);
    return;
  }
  // Enough blocks to fill the GPU (~1024), but no chunk shorter than 4 elements per thread.
  int64_t max_chunks = std::max<int64_t>(1, (n_red + kThreads * 4 - 1) / (kThreads * 4));
  int64_t chunks = std::clamp<int64_t>(1024 / std::max<int64_t>(n_out, 1), 1,
                                       std::min<int64_t>(max_chunks, 65535));
  int64_t chunk_len = (n_red + chunks - 1) / chunks;
  dim3 grid(static_cast<unsigned>(std::min<int64_t>(n_out, 1 << 20)),
            static_cast<unsigned>(chunks));
  if (chunks == 1) {
    reduce_block_kernel<kOp, T, R, T><<<grid, kThreads, 0, stream>>>(
        in_data, kept, red, n_red, chunk_len, out_data, out_ix, nullptr, n_out);
    return;
  }
  DataPtr partial = ringtrain::cuda::caching_allocate(
      static_cast<size_t>(n_out * chunks) * sizeof(R), device);
  reduce_block_kernel<kOp, T, R, T><<<grid, kThreads, 0, stream>>>(
      in_data, kept, red, n_red, chunk_len, out_data, out_ix, as_ptr<R>(partial), n_out);
  check_launch("cuda::reduce");
  // Second pass: partial is a contiguous [n_out, chunks] array of R.
  StridedIndexer p_kept;
  p_kept.ndim = 1;
  p_kept.sizes[0] = n_out;
  p_kept.strides[0] = chunks;
  StridedIndexer p_red;
  p_red.ndim = 1;
  p_red.sizes[0] = chunks;
  p_red.strides[0] = 1;
  reduce_thread_kernel<kOp, R, R, T><<<grid_for(n_out), kThreads, 0, stream>>>(
      as_ptr<R>(partial), p_kept, p_red, chunks, out_data, out_ix, n_out);
  // `partial` returns to the cache now; the allocator's per-stream reuse keeps
  // the next user of its memory queued behind this kernel.
}

// ---------------------------------------------------------------- max along one dim

template <typename A>
__device__ __forceinline__ bool better(A v, int64_t i, A best, int64_t best_i) {
  // NaN beats everything; among equal values the smaller index wins.
  if (is_nan(best)) return is_nan(v) && i < best_i;
  if (is_nan(v)) return true;
  return v > best || (v == best && i < best_i);
}

template <typename T>
__global__ void max_along_thread_kernel(const T* in, int64_t n, int64_t inner, int64_t n_out,
                                        T* values, int64_t* indices) {
  using A = AccType<T>;
  RT_GRID_STRIDE_LOOP(o, n_out) {
    int64_t outer_i = o / inner;
    int64_t inner_i = o - outer_i * inner;
    const T* base = in + outer_i * n * inner + inner_i;
    A best = convert<A>(base[0]);
    int64_t best_i = 0;
    for (int64_t j = 1; j < n; ++j) {
      A v = convert<A>(base[j * inner]);
      if (better(v, j, best, best_i)) {
        best = v;
        best_i = j;
      }
    }
    values[o] = convert<T>(best);
    indices[o] = best_i;
  }
}

// One block per output (long rows, few outputs): (value, index) pairs reduced in the block.
template <typename T>
__global__ void max_along_block_kernel(const T* in, int64_t n, int64_t inner, int64_t n_out,
                                       T* values, int64_t* indices) {
  using A = AccType<T>;
  __shared__ A shared_v[32];
  __shared__ int64_t shared_i[32];
  for (int64_t o = blockIdx.x; o < n_out; o += gridDim.x) {
    int64_t outer_i = o / inner;
    int64_t inner_i = o - outer_i * inner;
    const T* base = in + outer_i * n * inner + inner_i;
    A best = lowest_value<A>();
    int64_t best_i = n;  // "none yet": any real element is better (n > every index)
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
      A v = convert<A>(base[j * inner]);
      if (best_i == n || better(v, j, best, best_i)) {
        best = v;
        best_i = j;
      }
    }
    auto merge = [&](A v, int64_t i) {
      if (i < n && (best_i == n || better(v, i, best, best_i))) {
        best = v;
        best_i = i;
      }
    };
    for (int delta = 16; delta > 0; delta /= 2) {
      A v = shfl_down(best, delta);
      int64_t i = shfl_down(best_i, delta);
      merge(v, i);
    }
    int lane = threadIdx.x % 32;
    int warp = threadIdx.x / 32;
    if (lane == 0) {
      shared_v[warp] = best;
      shared_i[warp] = best_i;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      for (int w = 1; w < static_cast<int>(blockDim.x / 32); ++w) merge(shared_v[w], shared_i[w]);
      values[o] = convert<T>(best);
      indices[o] = best_i;
    }
    __syncthreads();
  }
}

}  // namespace

void reduce(ReduceOp op, const Tensor& in, const std::vector<bool>& reduce_mask,
            const Tensor& out) {
  constexpr const char* kOp = "cuda::reduce";
  int device = cuda_device_of(out, kOp);
  check_same_device(kOp, device, in);
  RT_CHECK(reduce_mask.size() == in.shape().size() && out.dim() == in.dim(), kOp,
           ": reduce_mask has ", reduce_mask.size(), " entries for in ", in.describe(), ", out ",
           out.describe(), " (out must keep in's rank)");
  RT_CHECK(in.dtype() == out.dtype(), kOp, ": in ", in.describe(), " and out ", out.describe(),
           " must have one dtype");
  Shape kept_shape, kept_in_strides, kept_out_strides, red_shape, red_strides;
  for (size_t d = 0; d < reduce_mask.size(); ++d) {
    if (reduce_mask[d]) {
      RT_CHECK(out.shape()[d] == 1, kOp, ": reduced dim ", d, " of out ", out.describe(),
               " must have size 1");
      red_shape.push_back(in.shape()[d]);
      red_strides.push_back(in.strides()[d]);
    } else {
      RT_CHECK(out.shape()[d] == in.shape()[d], kOp, ": kept dim ", d, " differs: in ",
               in.describe(), ", out ", out.describe());
      kept_shape.push_back(in.shape()[d]);
      kept_in_strides.push_back(in.strides()[d]);
      kept_out_strides.push_back(out.strides()[d]);
    }
  }
  int64_t n_out = shape_numel(kept_shape);
  int64_t n_red = shape_numel(red_shape);
  if (n_out == 0) return;
  require_cuda(kOp, device);
  if (n_red == 0) {  // an empty reduction gives the identity: 0, -inf or +inf
    double identity = op == ReduceOp::kSum ? 0.0 : (op == ReduceOp::kMax ? -HUGE_VAL : HUGE_VAL);
    fill(out, identity);
    return;
  }
  DeviceGuard guard(device);
  cudaStream_t stream = raw_stream(device);
  auto kept = make_indexers<2>(kept_shape, {&kept_in_strides, &kept_out_strides}, kOp);
  auto red = make_indexers<1>(red_shape, {&red_strides}, kOp);
  dispatch_cuda_dtype(in.dtype(), [&](auto tag) {
    using T = decltype(tag);
    switch (op) {
      case ReduceOp::kSum:
        launch_reduce<ReduceOp::kSum, T>(in, kept[0], red[0], n_red, out, kept[1], n_out, device,
                                         stream);
        break;
      case ReduceOp::kMax:
        launch_reduce<ReduceOp::kMax, T>(in, kept[0], red[0], n_red, out, kept[1], n_out, device,
                                         stream);
        break;
      case ReduceOp::kMin:
        launch_reduce<ReduceOp::kMin, T>(in, kept[0], red[0], n_red, out, kept[1], n_out, device,
                                         stream);
        break;
    }
  });
  check_launch(kOp);
}

void max_along(const Tensor& in_arg, int64_t dim, const Tensor& values, const Tensor& indices) {
  constexpr const char* kOp = "cuda::max_along";
  int device = cuda_device_of(values, kOp);
  check_same_device(kOp, device, in_arg, indices);
  RT_CHECK(indices.dtype() == DType::kInt64 && values.dtype() == in_arg.dtype(), kOp,
           ": values ", values.describe(), " must have in's dtype and indices ",
           indices.describe(), " must be int64; in ", in_arg.describe());
  RT_CHECK(values.is_contiguous() && indices.is_contiguous(), kOp,
           ": values and indices must be contiguous");
  dim = wrap_dim(dim, in_arg.dim(), kOp);
  int64_t outer = 1, inner = 1;
  for (int64_t d = 0; d < dim; ++d) outer *= in_arg.shape()[d];
  for (int64_t d = dim + 1; d < in_arg.dim(); ++d) inner *= in_arg.shape()[d];
  int64_t n = in_arg.shape()[dim];
  int64_t n_out = outer * inner;
  RT_CHECK(values.numel() == n_out && indices.numel() == n_out, kOp, ": values ",
           values.describe(), " / indices ", indices.describe(), " need ", n_out, " elements");
  if (n_out == 0) return;
  RT_CHECK(n > 0, kOp, ": cannot take the max over an empty dim ", dim, " of ", in_arg.describe());
  require_cuda(kOp, device);
  Tensor in = in_arg.contiguous();
  DeviceGuard guard(device);
  cudaStream_t stream = raw_stream(device);
  dispatch_cuda_dtype(in.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* in_data = static_cast<const T*>(in.data_ptr());
    T* v = static_cast<T*>(values.data_ptr());
    int64_t* idx = static_cast<int64_t*>(indices.data_ptr());
    if (n >= 2048 && n_out <= 4096) {
      unsigned grid = static_cast<unsigned>(std::min<int64_t>(n_out, 1 << 20));
      max_along_block_kernel<T><<<grid, kThreads, 0, stream>>>(in_data, n, inner, n_out, v, idx);
    } else {
      max_along_thread_kernel<T><<<grid_for(n_out), kThreads, 0, stream>>>(in_data, n, inner,
                                                                           n_out, v, idx);
    }
  });
  check_launch(kOp);
}

}  // namespace ringtrain::kernels::cuda
