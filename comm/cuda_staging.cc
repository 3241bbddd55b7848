// cuda_staging.cc: the copies a host-memory backend makes for CUDA buffers.
//
// They run on a non-blocking stream of the calling thread's own (the comm thread's),
// then wait for it. On the legacy default stream, which the training thread's
// kernels use by default, a copy would queue behind every kernel already queued
// there (usually the rest of backward) and hold back the kernels queued after it,
// so a bucket's copy could not overlap the backward that follows it. Ordering with
// the producer is the caller's event (record_stream_event / wait_for_stream_event).
#include "comm/cuda_staging.h"

#include <cuda_runtime.h>

#include <map>

#include "tensor/checks.h"
#include "tensor/cuda/runtime.h"

namespace ringtrain::comm {

namespace {

const cuda::Stream& copy_stream(int device) {
  thread_local std::map<int, cuda::Stream> streams;
  auto it = streams.find(device);
  if (it == streams.end()) it = streams.emplace(device, cuda::Stream::create(device)).first;
  return it->second;
}

void copy_and_wait(void* dst, const void* src, size_t nbytes, cudaMemcpyKind kind, int device) {
  if (nbytes == 0) return;
  cuda::DeviceGuard on_device(device);
  const cuda::Stream& stream = copy_stream(device);
  CUDA_CHECK(cudaMemcpyAsync(dst, src, nbytes, kind, static_cast<cudaStream_t>(stream.handle())));
  stream.synchronize();
}

}  // namespace

void copy_device_to_host(void* host, const void* device_ptr, size_t nbytes, int device) {
  copy_and_wait(host, device_ptr, nbytes, cudaMemcpyDeviceToHost, device);
}

void copy_host_to_device(void* device_ptr, const void* host, size_t nbytes, int device) {
  copy_and_wait(device_ptr, host, nbytes, cudaMemcpyHostToDevice, device);
}

std::shared_ptr<void> record_stream_event(int device) {
  auto event = std::make_shared<cuda::Event>(cuda::Event::create(device));
  event->record(cuda::current_stream(device));
  return event;
}

void wait_for_stream_event(const std::shared_ptr<void>& event) {
  if (event) static_cast<cuda::Event*>(event.get())->synchronize();
}

void stream_wait_event(void* stream, const std::shared_ptr<void>& event) {
  if (!event) return;
  CUDA_CHECK(cudaStreamWaitEvent(static_cast<cudaStream_t>(stream),
                                 static_cast<cudaEvent_t>(static_cast<cuda::Event*>(event.get())->handle()), 0));
}

}  // namespace ringtrain::comm
