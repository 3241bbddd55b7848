// cuda_ipc_reduce.cu: the kernel of CudaIpcAllreduce (cuda_ipc_allreduce.cc).
//
// One thread per element i of this rank's chunk: load element i from all p
// buffers (rank 0's first, so every rank's chunk is reduced in the same order),
// combine them in the accumulation type (float for fp16/bf16), divide by p for
// avg (integer division for integer dtypes, as the host reduction does), round once
// and store the result into all p buffers. Memory-bound: p loads and p stores per
// element; the buffers of the other ranks are reached through their IPC mappings.
#include <cuda_runtime.h>

#include "comm/cuda_ipc_allreduce.h"
#include "tensor/cuda/kernel_utils.cuh"

namespace ringtrain::comm {

namespace {

using cuda::detail::AccType;
using cuda::detail::convert;

// The p buffer pointers travel by value in the kernel's parameters.
struct BufferTable {
  void* at[CudaIpcAllreduce::kMaxRanks];
};

template <ReduceOp kOp, typename A>
__device__ __forceinline__ A combine(A acc, A v) {
  // Integers wrap around as on the CPU and in NCCL (wrapping_* in dtype.h).
  if constexpr (kOp == ReduceOp::kSum || kOp == ReduceOp::kAvg) return wrapping_add(acc, v);
  if constexpr (kOp == ReduceOp::kProd) return wrapping_mul(acc, v);
  // max/min propagate NaN from either side, as the host's reduce.cc does.
  if constexpr (kOp == ReduceOp::kMax || kOp == ReduceOp::kMin) {
    if (acc != acc) return acc;
    if (v != v) return v;
    if constexpr (kOp == ReduceOp::kMax) return v > acc ? v : acc;
    else return v < acc ? v : acc;
  }
}

template <typename T, ReduceOp kOp>
__global__ void reduce_into_all(BufferTable table, int p, size_t offset, size_t count) {
  using A = AccType<T>;
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += stride) {
    const size_t at = offset + i;
    A acc = convert<A>(static_cast<const T*>(table.at[0])[at]);
    for (int q = 1; q < p; ++q) acc = combine<kOp>(acc, convert<A>(static_cast<const T*>(table.at[q])[at]));
    if constexpr (kOp == ReduceOp::kAvg) acc = acc / static_cast<A>(p);
    const T result = convert<T>(acc);
    for (int q = 0; q < p; ++q) static_cast<T*>(table.at[q])[at] = result;
  }
}

template <typename T>
void launch_for_op(const BufferTable& table, int p, size_t offset, size_t count, ReduceOp op, cudaStream_t stream) {
  // enough blocks to fill the GPU, few enough that each thread loops a little
  const unsigned blocks = std::min(cuda::detail::grid_for(static_cast<int64_t>(count)), 4096u);
  const int threads = cuda::detail::kThreads;
  switch (op) {
    case ReduceOp::kSum: reduce_into_all<T, ReduceOp::kSum><<<blocks, threads, 0, stream>>>(table, p, offset, count); break;
    case ReduceOp::kAvg: reduce_into_all<T, ReduceOp::kAvg><<<blocks, threads, 0, stream>>>(table, p, offset, count); break;
    case ReduceOp::kMax: reduce_into_all<T, ReduceOp::kMax><<<blocks, threads, 0, stream>>>(table, p, offset, count); break;
    case ReduceOp::kMin: reduce_into_all<T, ReduceOp::kMin><<<blocks, threads, 0, stream>>>(table, p, offset, count); break;
    case ReduceOp::kProd: reduce_into_all<T, ReduceOp::kProd><<<blocks, threads, 0, stream>>>(table, p, offset, count); break;
  }
}

}  // namespace

void launch_reduce_into_all(void* const* buffers, int p, size_t offset, size_t count, DType dtype, ReduceOp op,
                            void* stream) {
  if (count == 0) return;
  RT_CHECK(p >= 1 && p <= CudaIpcAllreduce::kMaxRanks, "launch_reduce_into_all: ", p, " buffers");
  BufferTable table{};
  for (int q = 0; q < p; ++q) table.at[q] = buffers[q];
  cuda::detail::dispatch_cuda_dtype(dtype, [&](auto tag) {
    launch_for_op<decltype(tag)>(table, p, offset, count, op, static_cast<cudaStream_t>(stream));
  });
  cuda::detail::check_launch("CUDA IPC allreduce");
}

}  // namespace ringtrain::comm
