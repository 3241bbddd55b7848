// The build without CUDA: there are no CUDA buffers, so CUDA IPC is never set up.
#include "comm/cuda_ipc_allreduce.h"

#include "tensor/checks.h"

namespace ringtrain::comm {

std::unique_ptr<CudaIpcAllreduce> CudaIpcAllreduce::create(RingArgs&, Store&, const std::string&, int,
                                                           std::string* why) {
  if (why) *why = "this build has no CUDA";
  return nullptr;
}

struct CudaIpcAllreduce::Shared {};
CudaIpcAllreduce::~CudaIpcAllreduce() = default;
int CudaIpcAllreduce::device() const { return -1; }

void CudaIpcAllreduce::allreduce(RingArgs&, void*, size_t, const std::shared_ptr<void>&) {
  throw Error("CudaIpcAllreduce: this build has no CUDA; rebuild with -DRINGTRAIN_CUDA=ON");
}

}  // namespace ringtrain::comm
