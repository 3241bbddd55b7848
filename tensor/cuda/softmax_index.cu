// softmax_index.cu: softmax / log_softmax (forward and backward) and the
// indexing kernels: gather, index_select (embedding lookup), index_add
// (embedding gradient).
//
// defines: kernels::cuda::softmax, softmax_backward, gather, index_select,
//          index_add (declared in tensor/kernels.h).
//
// Softmax works on a contiguous [outer, n, inner] view of its operand (the
// softmax dim in the middle). When inner == 1 (the usual "last dim" case, the
// logits of a classifier) a row is contiguous and one block owns it: the block
// finds the row max, sums exp(x - max) and writes the result, each step a
// strided sweep plus a block reduction. When inner > 1 one thread owns one
// (outer, inner) column and walks its n elements; neighbouring threads read
// neighbouring addresses, so loads still coalesce. Math runs in float for
// 16-bit dtypes and in double for float64; subtracting the max keeps exp() in
// range (the numerically stable form every framework uses).
//
// Backward, with y the forward output and g = dL/dy:
//   softmax:     dL/dx = y * (g - sum(g * y))
//   log_softmax: dL/dx = g - exp(y) * sum(g)
//
// Indexing. Indices are int64 on the device. A kernel cannot throw, so an
// out-of-range index is skipped (gather/index_select write 0 there, index_add
// adds nothing) rather than reading or writing out of bounds; ops.cc validates
// indices where it can. index_add uses atomicAdd because an index may repeat
// (a token that appears twice in a batch).
#include <cuda_runtime.h>

#include <algorithm>
#include <type_traits>

#include "tensor/cuda/internal.cuh"
#include "tensor/cuda/kernel_utils.cuh"
#include "tensor/kernels.h"

namespace ringtrain::kernels::cuda {

namespace {

using ringtrain::cuda::detail::AccType;
using ringtrain::cuda::detail::atomic_add;
using ringtrain::cuda::detail::block_reduce;
using ringtrain::cuda::detail::check_launch;
using ringtrain::cuda::detail::check_same_device;
using ringtrain::cuda::detail::convert;
using ringtrain::cuda::detail::cuda_device_of;
using ringtrain::cuda::detail::DeviceGuard;
using ringtrain::cuda::detail::dispatch_cuda_dtype;
using ringtrain::cuda::detail::dispatch_float_dtype;
using ringtrain::cuda::detail::grid_for;
using ringtrain::cuda::detail::kMaxDims;
using ringtrain::cuda::detail::kThreads;
using ringtrain::cuda::detail::lowest_value;
using ringtrain::cuda::detail::make_indexer;
using ringtrain::cuda::detail::make_indexers;
using ringtrain::cuda::detail::raw_stream;
using ringtrain::cuda::detail::require_cuda;
using ringtrain::cuda::detail::StridedIndexer;

template <typename A> __device__ __forceinline__ A d_exp(A x) {
  if constexpr (std::is_same_v<A, float>) return ::expf(x); else return ::exp(x);
}
template <typename A> __device__ __forceinline__ A d_log(A x) {
  if constexpr (std::is_same_v<A, float>) return ::logf(x); else return ::log(x);
}

struct Max {
  template <typename A> __device__ __forceinline__ A operator()(A a, A b) const {
    return a > b || ::isnan(a) ? a : b;
  }
};
struct Sum {
  template <typename A> __device__ __forceinline__ A operator()(A a, A b) const { return a + b; }
};

// The [outer, n, inner] view of a contiguous tensor around `dim`.
struct SoftmaxShape {
  int64_t outer = 1, n = 1, inner = 1;
};
SoftmaxShape softmax_shape(const Tensor& t, int64_t dim) {
  SoftmaxShape s;
  for (int64_t d = 0; d < dim; ++d) s.outer *= t.shape()[d];
  s.n = t.shape()[dim];
  for (int64_t d = dim + 1; d < t.dim(); ++d) s.inner *= t.shape()[d];
  return s;
}

// inner == 1: one block per row.
template <typename T, bool kLog>
__global__ void softmax_row_kernel(const T* in, T* out, int64_t rows, int64_t n) {
  using A = AccType<T>;
  __shared__ A shared[32];
  __shared__ A row_max, row_sum;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* x = in + row * n;
    T* y = out + row * n;
    A m = lowest_value<A>();
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) m = Max()(m, convert<A>(x[j]));
    m = block_reduce(m, Max(), shared);
    if (threadIdx.x == 0) row_max = m;
    __syncthreads();
    m = row_max;
    A s = 0;
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) s += d_exp(convert<A>(x[j]) - m);
    s = block_reduce(s, Sum(), shared);
    if (threadIdx.x == 0) row_sum = s;
    __syncthreads();
    s = row_sum;
    if constexpr (kLog) {
      A log_s = d_log(s);
      for (int64_t j = threadIdx.x; j < n; j += blockDim.x) y[j] = convert<T>(convert<A>(x[j]) - m - log_s);
    } else {
      A inv = A(1) / s;
      for (int64_t j = threadIdx.x; j < n; j += blockDim.x) y[j] = convert<T>(d_exp(convert<A>(x[j]) - m) * inv);
    }
    __syncthreads();  // row_max/row_sum are rewritten by the next row
  }
}

// inner > 1: one thread per (outer, inner) column.
template <typename T, bool kLog>
__global__ void softmax_column_kernel(const T* in, T* out, int64_t n, int64_t inner,
                                      int64_t columns) {
  using A = AccType<T>;
  RT_GRID_STRIDE_LOOP(c, columns) {
    int64_t o = c / inner, i = c - (c / inner) * inner;
    const T* x = in + o * n * inner + i;
    T* y = out + o * n * inner + i;
    A m = lowest_value<A>();
    for (int64_t j = 0; j < n; ++j) m = Max()(m, convert<A>(x[j * inner]));
    A s = 0;
    for (int64_t j = 0; j < n; ++j) s += d_exp(convert<A>(x[j * inner]) - m);
    if constexpr (kLog) {
      A log_s = d_log(s);
      for (int64_t j = 0; j < n; ++j) y[j * inner] = convert<T>(convert<A>(x[j * inner]) - m - log_s);
    } else {
      for (int64_t j = 0; j < n; ++j) y[j * inner] = convert<T>(d_exp(convert<A>(x[j * inner]) - m) / s);
    }
  }
}

// dot = sum(g * y) (softmax) or sum(g) (log_softmax), then the formula in the header.
template <typename T, bool kLog>
__device__ __forceinline__ AccType<T> softmax_grad_term(T g, T y) {
  using A = AccType<T>;
  if constexpr (kLog) return convert<A>(g);
  else return convert<A>(g) * convert<A>(y);
}
template <typename T, bool kLog>
__device__ __forceinline__ T softmax_grad(T g, T y, AccType<T> dot) {
  using A = AccType<T>;
  if constexpr (kLog) return convert<T>(convert<A>(g) - d_exp(convert<A>(y)) * dot);
  else return convert<T>(convert<A>(y) * (convert<A>(g) - dot));
}

template <typename T, bool kLog>
__global__ void softmax_backward_row_kernel(const T* g, const T* y, T* gi, int64_t rows,
                                            int64_t n) {
  using A = AccType<T>;
  __shared__ A shared[32];
  __shared__ A row_dot;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    int64_t base = row * n;
    A dot = 0;
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x)
      dot += softmax_grad_term<T, kLog>(g[base + j], y[base + j]);
    dot = block_reduce(dot, Sum(), shared);
    if (threadIdx.x == 0) row_dot = dot;
    __syncthreads();
    dot = row_dot;
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x)
      gi[base + j] = softmax_grad<T, kLog>(g[base + j], y[base + j], dot);
    __syncthreads();
  }
}

template <typename T, bool kLog>
__global__ void softmax_backward_column_kernel(const T* g, const T* y, T* gi, int64_t n,
                                               int64_t inner, int64_t columns) {
  using A = AccType<T>;
  RT_GRID_STRIDE_LOOP(c, columns) {
    int64_t o = c / inner, i = c - (c / inner) * inner;
    int64_t base = o * n * inner + i;
    A dot = 0;
    for (int64_t j = 0; j < n; ++j) dot += softmax_grad_term<T, kLog>(g[base + j * inner], y[base + j * inner]);
    for (int64_t j = 0; j < n; ++j)
      gi[base + j * inner] = softmax_grad<T, kLog>(g[base + j * inner], y[base + j * inner], dot);
  }
}

unsigned row_grid(int64_t rows) { return static_cast<unsigned>(std::min<int64_t>(rows, 1 << 20)); }

// Threads per row block: enough warps for the row, at most kThreads.
int row_threads(int64_t n) {
  int64_t warps = std::clamp<int64_t>((n + 31) / 32, 1, kThreads / 32);
  return static_cast<int>(warps * 32);
}

// ---------------------------------------------------------------- indexing kernels

// Raw (uncoalesced) geometry: gather needs each element's coordinates, not just its offset.
struct Geometry {
  int ndim = 0;
  int64_t sizes[kMaxDims] = {};
  int64_t a_strides[kMaxDims] = {};
  int64_t index_strides[kMaxDims] = {};
};

template <typename T>
__global__ void gather_kernel(const T* a, const int64_t* index, Geometry geo, int dim,
                              int64_t dim_size, T* out, int64_t n) {
  RT_GRID_STRIDE_LOOP(lin, n) {
    int64_t rest = lin, a_off = 0, idx_off = 0;
    int64_t coord_dim_stride = 0;
    for (int d = geo.ndim - 1; d >= 0; --d) {
      int64_t c = rest % geo.sizes[d];
      rest /= geo.sizes[d];
      idx_off += c * geo.index_strides[d];
      if (d == dim) coord_dim_stride = geo.a_strides[d];
      else a_off += c * geo.a_strides[d];
    }
    int64_t k = index[idx_off];
    out[lin] = (k >= 0 && k < dim_size) ? a[a_off + k * coord_dim_stride] : convert<T>(0);
  }
}

// out[o, j, i] = a[o, index[j], i]; a_rest maps o * inner + i to a's offset without `dim`.
template <typename T>
__global__ void index_select_kernel(const T* a, StridedIndexer a_rest, int64_t a_dim_stride,
                                    int64_t dim_size, const int64_t* index, int64_t m,
                                    int64_t inner, T* out, int64_t n) {
  RT_GRID_STRIDE_LOOP(lin, n) {
    int64_t i = lin % inner;
    int64_t j = (lin / inner) % m;
    int64_t o = lin / (inner * m);
    int64_t k = index[j];
    out[lin] = (k >= 0 && k < dim_size) ? a[a_rest.offset(o * inner + i) + k * a_dim_stride]
                                        : convert<T>(0);
  }
}

// a[o, index[j], i] += src[o, j, i] (src read through its own indexer in row-major order).
template <typename T>
__global__ void index_add_kernel(T* a, StridedIndexer a_rest, int64_t a_dim_stride,
                                 int64_t dim_size, const int64_t* index, int64_t m, int64_t inner,
                                 const T* src, StridedIndexer src_ix, int64_t n) {
  RT_GRID_STRIDE_LOOP(lin, n) {
    int64_t i = lin % inner;
    int64_t j = (lin / inner) % m;
    int64_t o = lin / (inner * m);
    int64_t k = index[j];
    if (k < 0 || k >= dim_size) continue;
    atomic_add(a + a_rest.offset(o * inner + i) + k * a_dim_stride, src[src_ix.offset(lin)]);
  }
}

// The indexer of `a` with `dim` removed, iterated row-major.
StridedIndexer indexer_without_dim(const Tensor& a, int64_t dim, const char* op) {
  Shape shape, strides;
  for (int64_t d = 0; d < a.dim(); ++d) {
    if (d == dim) continue;
    shape.push_back(a.shape()[d]);
    strides.push_back(a.strides()[d]);
  }
  return make_indexers<1>(shape, {&strides}, op)[0];
}

}  // namespace

// ---------------------------------------------------------------- softmax

void softmax(const Tensor& in_arg, int64_t dim, bool log, const Tensor& out) {
  constexpr const char* kOp = "cuda::softmax";
  int device = cuda_device_of(out, kOp);
  check_same_device(kOp, device, in_arg);
  RT_CHECK(in_arg.shape() == out.shape() && in_arg.dtype() == out.dtype() && out.is_contiguous(),
           kOp, ": in ", in_arg.describe(), " and contiguous out ", out.describe(),
           " must match");
  dim = wrap_dim(dim, out.dim(), kOp);
  if (out.numel() == 0) return;
  require_cuda(kOp, device);
  Tensor in = in_arg.contiguous();
  SoftmaxShape s = softmax_shape(out, dim);
  DeviceGuard guard(device);
  cudaStream_t stream = raw_stream(device);
  dispatch_float_dtype(out.dtype(), kOp, [&](auto tag) {
    using T = decltype(tag);
    const T* x = static_cast<const T*>(in.data_ptr());
    T* y = static_cast<T*>(out.data_ptr());
    auto launch = [&](auto log_tag) {
      constexpr bool kLog = decltype(log_tag)::value;
      if (s.inner == 1) {
        softmax_row_kernel<T, kLog><<<row_grid(s.outer), row_threads(s.n), 0, stream>>>(x, y, s.outer, s.n);
      } else {
        softmax_column_kernel<T, kLog><<<grid_for(s.outer * s.inner), kThreads, 0, stream>>>(
            x, y, s.n, s.inner, s.outer * s.inner);
      }
    };
    if (log) launch(std::true_type{});
    else launch(std::false_type{});
  });
  check_launch(kOp);
}

void softmax_backward(const Tensor& grad_out_arg, const Tensor& output_arg, int64_t dim, bool log,
                      const Tensor& grad_in) {
  constexpr const char* kOp = "cuda::softmax_backward";
  int device = cuda_device_of(grad_in, kOp);
  check_same_device(kOp, device, grad_out_arg, output_arg);
  RT_CHECK(grad_out_arg.shape() == grad_in.shape() && output_arg.shape() == grad_in.shape() &&
               grad_out_arg.dtype() == grad_in.dtype() && output_arg.dtype() == grad_in.dtype() &&
               grad_in.is_contiguous(),
           kOp, ": grad_out ", grad_out_arg.describe(), ", output ", output_arg.describe(),
           " and contiguous grad_in ", grad_in.describe(), " must match");
  dim = wrap_dim(dim, grad_in.dim(), kOp);
  if (grad_in.numel() == 0) return;
  require_cuda(kOp, device);
  Tensor g = grad_out_arg.contiguous();
  Tensor y = output_arg.contiguous();
  SoftmaxShape s = softmax_shape(grad_in, dim);
  DeviceGuard guard(device);
  cudaStream_t stream = raw_stream(device);
  dispatch_float_dtype(grad_in.dtype(), kOp, [&](auto tag) {
    using T = decltype(tag);
    const T* gp = static_cast<const T*>(g.data_ptr());
    const T* yp = static_cast<const T*>(y.data_ptr());
    T* gi = static_cast<T*>(grad_in.data_ptr());
    auto launch = [&](auto log_tag) {
      constexpr bool kLog = decltype(log_tag)::value;
      if (s.inner == 1) {
        softmax_backward_row_kernel<T, kLog><<<row_grid(s.outer), row_threads(s.n), 0, stream>>>(
            gp, yp, gi, s.outer, s.n);
      } else {
        softmax_backward_column_kernel<T, kLog><<<grid_for(s.outer * s.inner), kThreads, 0, stream>>>(
            gp, yp, gi, s.n, s.inner, s.outer * s.inner);
      }
    };
    if (log) launch(std::true_type{});
    else launch(std::false_type{});
  });
  check_launch(kOp);
}

// ---------------------------------------------------------------- indexing

void gather(const Tensor& a, int64_t dim, const Tensor& index, const Tensor& out) {
  constexpr const char* kOp = "cuda::gather";
  int device = cuda_device_of(out, kOp);
  check_same_device(kOp, device, a, index);
  dim = wrap_dim(dim, a.dim(), kOp);
  RT_CHECK(index.dtype() == DType::kInt64 && index.dim() == a.dim() &&
               out.shape() == index.shape() && out.dtype() == a.dtype() && out.is_contiguous(),
           kOp, ": expected int64 index of a's rank and contiguous out of index's shape; a ",
           a.describe(), ", index ", index.describe(), ", out ", out.describe());
  RT_CHECK(a.dim() <= kMaxDims, kOp, ": CUDA gather supports at most ", kMaxDims, " dims, got ",
           a.describe());
  int64_t n = out.numel();
  if (n == 0) return;
  require_cuda(kOp, device);
  Geometry geo;
  geo.ndim = static_cast<int>(a.dim());
  for (int64_t d = 0; d < a.dim(); ++d) {
    geo.sizes[d] = index.shape()[d];
    geo.a_strides[d] = a.strides()[d];
    geo.index_strides[d] = index.strides()[d];
  }
  DeviceGuard guard(device);
  cudaStream_t stream = raw_stream(device);
  dispatch_cuda_dtype(a.dtype(), [&](auto tag) {
    using T = decltype(tag);
    gather_kernel<T><<<grid_for(n), kThreads, 0, stream>>>(
        static_cast<const T*>(a.data_ptr()), static_cast<const int64_t*>(index.data_ptr()), geo,
        static_cast<int>(dim), a.shape()[dim], static_cast<T*>(out.data_ptr()), n);
  });
  check_launch(kOp);
}

void index_select(const Tensor& a, int64_t dim, const Tensor& index_arg, const Tensor& out) {
  constexpr const char* kOp = "cuda::index_select";
  int device = cuda_device_of(out, kOp);
  check_same_device(kOp, device, a, index_arg);
  dim = wrap_dim(dim, a.dim(), kOp);
  RT_CHECK(index_arg.dtype() == DType::kInt64 && out.dtype() == a.dtype() && out.is_contiguous(),
           kOp, ": expected int64 index and contiguous out of a's dtype; a ", a.describe(),
           ", index ", index_arg.describe(), ", out ", out.describe());
  int64_t outer = 1, inner = 1;
  for (int64_t d = 0; d < dim; ++d) outer *= a.shape()[d];
  for (int64_t d = dim + 1; d < a.dim(); ++d) inner *= a.shape()[d];
  int64_t m = index_arg.numel();
  int64_t n = outer * m * inner;
  RT_CHECK(out.numel() == n, kOp, ": out ", out.describe(), " must hold ", n, " elements");
  if (n == 0) return;
  require_cuda(kOp, device);
  Tensor index = index_arg.contiguous();
  StridedIndexer a_rest = indexer_without_dim(a, dim, kOp);
  DeviceGuard guard(device);
  cudaStream_t stream = raw_stream(device);
  dispatch_cuda_dtype(a.dtype(), [&](auto tag) {
    using T = decltype(tag);
    index_select_kernel<T><<<grid_for(n), kThreads, 0, stream>>>(
        static_cast<const T*>(a.data_ptr()), a_rest, a.strides()[dim], a.shape()[dim],
        static_cast<const int64_t*>(index.data_ptr()), m, inner, static_cast<T*>(out.data_ptr()),
        n);
  });
  check_launch(kOp);
}

void index_add(const Tensor& a, int64_t dim, const Tensor& index_arg, const Tensor& src_arg) {
  constexpr const char* kOp = "cuda::index_add";
  int device = cuda_device_of(a, kOp);
  check_same_device(kOp, device, index_arg, src_arg);
  dim = wrap_dim(dim, a.dim(), kOp);
  int64_t m = index_arg.numel();
  Shape expected = a.shape();
  expected[dim] = m;
  // As the CPU kernel: any index shape counts as its flattened list, and src as m slices
  // (ops.cc allows a[:d] + index.shape + a[d+1:]).
  RT_CHECK(index_arg.dtype() == DType::kInt64 && src_arg.dtype() == a.dtype() &&
               src_arg.numel() == shape_numel(expected),
           kOp, ": expected int64 index and src of shape ", shape_str(expected), " and a's dtype; a ",
           a.describe(), ", index ", index_arg.describe(), ", src ", src_arg.describe());
  const Tensor src = src_arg.reshape(expected);
  int64_t n = src.numel();
  if (n == 0) return;
  require_cuda(kOp, device);
  int64_t inner = 1;
  for (int64_t d = dim + 1; d < a.dim(); ++d) inner *= a.shape()[d];
  Tensor index = index_arg.reshape({-1}).contiguous();
  StridedIndexer a_rest = indexer_without_dim(a, dim, kOp);
  StridedIndexer src_ix = make_indexer(src, kOp);
  DeviceGuard guard(device);
  cudaStream_t stream = raw_stream(device);
  dispatch_cuda_dtype(a.dtype(), [&](auto tag) {
    using T = decltype(tag);
    index_add_kernel<T><<<grid_for(n), kThreads, 0, stream>>>(
        static_cast<T*>(a.data_ptr()), a_rest, a.strides()[dim], a.shape()[dim],
        static_cast<const int64_t*>(index.data_ptr()), m, inner,
        static_cast<const T*>(src.data_ptr()), src_ix, n);
  });
  check_launch(kOp);
}

}  // namespace ringtrain::kernels::cuda
