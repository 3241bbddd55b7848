// The build without CUDA: no CUDA buffer can exist, so reaching these is a caller bug.
#include "comm/cuda_staging.h"

#include "tensor/checks.h"

namespace ringtrain::comm {

namespace {
[[noreturn]] void no_cuda() {
  throw Error("comm: a CUDA buffer was passed to a collective, but this build has no CUDA; "
              "rebuild with -DRINGTRAIN_CUDA=ON");
}
}  // namespace

void copy_device_to_host(void*, const void*, size_t, int) { no_cuda(); }
void copy_host_to_device(void*, const void*, size_t, int) { no_cuda(); }
std::shared_ptr<void> record_stream_event(int) { no_cuda(); }
void wait_for_stream_event(const std::shared_ptr<void>& event) {
  if (event) no_cuda();
}
void stream_wait_event(void*, const std::shared_ptr<void>& event) {
  if (event) no_cuda();
}

}  // namespace ringtrain::comm
