// cuda_ipc_allreduce.h: CudaIpcAllreduce, the ring backend's allreduce of CUDA
// buffers when every rank is on this host: device memory shared through CUDA IPC,
// no trip through host memory. See cuda_ipc_allreduce.cc for the algorithm.
//
// defines: CudaIpcAllreduce, launch_reduce_into_all.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "comm/ring_algorithms.h"
#include "comm/store.h"
#include "tensor/cuda/runtime.h"

namespace ringtrain::comm {

class CudaIpcAllreduce {
 public:
  static constexpr int kMaxRanks = 8;              // ranks of one host it serves
  static constexpr size_t kBufferBytes = 32 << 20;  // device buffer per rank; larger inputs go in pieces

  // Collective over args.mesh (every rank calls it, all on this host): each rank
  // allocates its device buffer and two interprocess events on `device` and opens
  // every peer's. Returns nullptr
  // on every rank when any rank could not (no P2P between two GPUs, too many ranks,
  // out of memory); `why` then names that rank and its reason.
  static std::unique_ptr<CudaIpcAllreduce> create(RingArgs& args, Store& store, const std::string& key,
                                                  int device, std::string* why);
  ~CudaIpcAllreduce();
  CudaIpcAllreduce(const CudaIpcAllreduce&) = delete;
  CudaIpcAllreduce& operator=(const CudaIpcAllreduce&) = delete;

  // In place on `data` (count elements of args.dtype on device()), after the work
  // behind `ready_event` (Collective::ready_event; may be null).
  void allreduce(RingArgs& args, void* data, size_t count, const std::shared_ptr<void>& ready_event);
  int device() const;

 private:
  struct Shared;  // what one rank exports and what it opened of the others (.cc)
  explicit CudaIpcAllreduce(std::unique_ptr<Shared> shared);

  std::unique_ptr<Shared> shared_;
  cuda::Stream stream_;
};

// Elements [offset, offset + count) of the p buffers: reduce them (in rank order)
// and store the result into all p buffers. Queued on `stream` (cuda_ipc_reduce.cu).
void launch_reduce_into_all(void* const* buffers, int p, size_t offset, size_t count, DType dtype,
                            ReduceOp op, void* stream);

}  // namespace ringtrain::comm
