#include "comm/cuda_staging.h"

#include <cuda_runtime.h>

#include "tensor/checks.h"
#include "tensor/cuda/runtime.h"

namespace ringtrain::comm {

void copy_device_to_host(void* host, const void* device_ptr, size_t nbytes, int device) {
  if (nbytes == 0) return;
  CUDA_CHECK(cudaSetDevice(device));
  CUDA_CHECK(cudaMemcpy(host, device_ptr, nbytes, cudaMemcpyDeviceToHost));
}

void copy_host_to_device(void* device_ptr, const void* host, size_t nbytes, int device) {
  if (nbytes == 0) return;
  CUDA_CHECK(cudaSetDevice(device));
  CUDA_CHECK(cudaMemcpy(device_ptr, host, nbytes, cudaMemcpyHostToDevice));
}

std::shared_ptr<void> record_stream_event(int device) {
  auto event = std::make_shared<cuda::Event>(cuda::Event::create(device));
  event->record(cuda::current_stream(device));
  return event;
}

void wait_for_stream_event(const std::shared_ptr<void>& event) {
  if (event) static_cast<cuda::Event*>(event.get())->synchronize();
}

}  // namespace ringtrain::comm
