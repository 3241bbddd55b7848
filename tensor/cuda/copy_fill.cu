// copy_fill.cu: CUDA kernels that move bytes: strided copy with dtype
// conversion, fill, and host<->device / device<->device memcpy.
//
// defines: kernels::cuda::copy, fill, memcpy_bytes (declared in tensor/kernels.h).
//
// copy() handles every (dst dtype, src dtype) pair and any strides on either
// side. When both sides are contiguous and of one dtype it is a single
// cudaMemcpyAsync; otherwise one grid-stride kernel per pair of types reads
// src through its (coalesced) strides and writes dst through its own.
//
// memcpy_bytes() is what cross-device Tensor::to() and to_vector() use, on
// contiguous staging buffers:
//   host -> device: cudaMemcpyAsync on the device's current stream. For
//     pageable host memory the call returns once the source has been staged,
//     so the caller may free its buffer at once. A pinned source is read later,
//     by the stream, so the copy is recorded on its block (record_host_stream).
//   device -> host: cudaMemcpyAsync, then the stream is synchronised: the
//     caller reads the bytes as soon as we return (to_vector, printing).
//   device -> device, same GPU: cudaMemcpyAsync on the current stream.
//   device -> device, two GPUs: cudaMemcpyPeerAsync on the destination's
//     current stream, after an event makes it wait for the source's current
//     stream (so the copy sees every kernel already queued that writes src).
//   host -> host: std::memcpy.
// All run on current streams, so they are ordered with the ops around them.
#include <cuda_runtime.h>

#include <cmath>
#include <cstring>

#include "tensor/cuda/internal.cuh"
#include "tensor/cuda/kernel_utils.cuh"
#include "tensor/kernels.h"

namespace ringtrain::kernels::cuda {

namespace {

using ringtrain::cuda::detail::check_launch;
using ringtrain::cuda::detail::convert;
using ringtrain::cuda::detail::DeviceGuard;
using ringtrain::cuda::detail::dispatch_cuda_dtype;
using ringtrain::cuda::detail::grid_for;
using ringtrain::cuda::detail::kThreads;
using ringtrain::cuda::detail::make_indexers;
using ringtrain::cuda::detail::raw_stream;
using ringtrain::cuda::detail::require_cuda;
using ringtrain::cuda::detail::StridedIndexer;

template <typename DstT, typename SrcT>
__global__ void copy_kernel(DstT* dst, StridedIndexer dst_ix, const SrcT* src,
                            StridedIndexer src_ix, int64_t n) {
  RT_GRID_STRIDE_LOOP(i, n) { dst[dst_ix.offset(i)] = convert<DstT>(src[src_ix.offset(i)]); }
}

template <typename T>
__global__ void fill_kernel(T* dst, StridedIndexer ix, T value, int64_t n) {
  RT_GRID_STRIDE_LOOP(i, n) { dst[ix.offset(i)] = value; }
}

}  // namespace

void copy(const Tensor& dst, const Tensor& src) {
  constexpr const char* kOp = "cuda::copy";
  RT_CHECK(dst.shape() == src.shape(), kOp, ": shapes differ: dst ", dst.describe(), ", src ",
           src.describe());
  int device = ringtrain::cuda::detail::cuda_device_of(dst, kOp);
  RT_CHECK(src.device() == dst.device(), kOp, ": dst ", dst.describe(), " and src ",
           src.describe(), " must be on the same CUDA device (cross-device copies go through "
           "memcpy_bytes)");
  int64_t n = dst.numel();
  if (n == 0) return;
  require_cuda(kOp, device);
  DeviceGuard guard(device);
  cudaStream_t stream = raw_stream(device);
  if (dst.dtype() == src.dtype() && dst.is_contiguous() && src.is_contiguous()) {
    if (dst.data_ptr() != src.data_ptr())
      CUDA_CHECK(cudaMemcpyAsync(dst.data_ptr(), src.data_ptr(), dst.nbytes(),
                                 cudaMemcpyDeviceToDevice, stream));
    return;
  }
  auto ix = make_indexers<2>(dst.shape(), {&dst.strides(), &src.strides()}, kOp);
  dispatch_cuda_dtype(dst.dtype(), [&](auto dst_tag) {
    using DstT = decltype(dst_tag);
    dispatch_cuda_dtype(src.dtype(), [&](auto src_tag) {
      using SrcT = decltype(src_tag);
      copy_kernel<DstT, SrcT><<<grid_for(n), kThreads, 0, stream>>>(
          static_cast<DstT*>(dst.data_ptr()), ix[0], static_cast<const SrcT*>(src.data_ptr()),
          ix[1], n);
    });
  });
  check_launch(kOp);
}

void fill(const Tensor& dst, double value) {
  constexpr const char* kOp = "cuda::fill";
  int device = ringtrain::cuda::detail::cuda_device_of(dst, kOp);
  int64_t n = dst.numel();
  if (n == 0) return;
  require_cuda(kOp, device);
  DeviceGuard guard(device);
  cudaStream_t stream = raw_stream(device);
  if (value == 0.0 && !std::signbit(value) && dst.is_contiguous()) {
    // All-zero bits are 0 in every dtype we have.
    CUDA_CHECK(cudaMemsetAsync(dst.data_ptr(), 0, dst.nbytes(), stream));
    return;
  }
  auto ix = make_indexers<1>(dst.shape(), {&dst.strides()}, kOp);
  dispatch_cuda_dtype(dst.dtype(), [&](auto tag) {
    using T = decltype(tag);
    fill_kernel<T><<<grid_for(n), kThreads, 0, stream>>>(static_cast<T*>(dst.data_ptr()), ix[0],
                                                         convert<T>(value), n);
  });
  check_launch(kOp);
}

void memcpy_bytes(void* dst, Device dst_device, const void* src, Device src_device, size_t n) {
  constexpr const char* kOp = "cuda::memcpy_bytes";
  if (n == 0) return;
  RT_CHECK(dst != nullptr && src != nullptr, kOp, ": null pointer for a copy of ", n, " bytes");
  if (dst_device.is_cpu() && src_device.is_cpu()) {
    std::memcpy(dst, src, n);
    return;
  }
  if (dst_device.is_cuda() && src_device.is_cpu()) {
    require_cuda(kOp, dst_device.index);
    DeviceGuard guard(dst_device.index);
    ringtrain::cuda::Stream stream = ringtrain::cuda::current_stream(dst_device.index);
    CUDA_CHECK(cudaMemcpyAsync(dst, src, n, cudaMemcpyHostToDevice,
                               static_cast<cudaStream_t>(stream.handle())));
    // A pinned source is read when the stream gets to the copy, not now: its
    // buffer must not be handed out again before then (a no-op for pageable memory).
    ringtrain::cuda::record_host_stream(src, stream);
    return;
  }
  if (dst_device.is_cpu() && src_device.is_cuda()) {
    require_cuda(kOp, src_device.index);
    DeviceGuard guard(src_device.index);
    cudaStream_t stream = raw_stream(src_device.index);
    CUDA_CHECK(cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToHost, stream));
    CUDA_CHECK(cudaStreamSynchronize(stream));  // the caller reads dst right away
    return;
  }
  require_cuda(kOp, dst_device.index);
  require_cuda(kOp, src_device.index);
  if (dst_device.index == src_device.index) {
    DeviceGuard guard(dst_device.index);
    CUDA_CHECK(cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToDevice,
                               raw_stream(dst_device.index)));
    return;
  }
  // Two GPUs: order the copy after the source device's queued work, then copy peer to peer.
  ringtrain::cuda::Event ready;
  ready.record(ringtrain::cuda::current_stream(src_device.index));
  ringtrain::cuda::Stream dst_stream = ringtrain::cuda::current_stream(dst_device.index);
  dst_stream.wait(ready);
  DeviceGuard guard(dst_device.index);
  CUDA_CHECK(cudaMemcpyPeerAsync(dst, dst_device.index, src, src_device.index, n,
                                 static_cast<cudaStream_t>(dst_stream.handle())));
  // And the reverse: src's stream may reuse src's memory only after the copy has read it.
  ringtrain::cuda::Event copied;
  copied.record(dst_stream);
  ringtrain::cuda::current_stream(src_device.index).wait(copied);
}

}  // namespace ringtrain::kernels::cuda
