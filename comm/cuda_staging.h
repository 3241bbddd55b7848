// cuda_staging.h: device <-> pinned host copies for backends that move host memory.
//
// defines: copy_device_to_host, copy_host_to_device, record_stream_event,
//          wait_for_stream_event, stream_wait_event.
//
// With CUDA these are cudaMemcpy calls (comm/cuda_staging.cc, a CUDA_SOURCES
// file); in a build without CUDA, comm/cuda_staging_unavailable.cc defines them
// to throw, which can only happen if someone hands the group a CUDA buffer.
#pragma once

#include <cstddef>
#include <memory>

namespace ringtrain::comm {

void copy_device_to_host(void* host, const void* device_ptr, size_t nbytes, int device);
void copy_host_to_device(void* device_ptr, const void* host, size_t nbytes, int device);
// Records an event on `device`'s current stream (caller's thread) ...
std::shared_ptr<void> record_stream_event(int device);
// ... and blocks the comm thread until that work has finished, ...
void wait_for_stream_event(const std::shared_ptr<void>& event);
// ... or makes later work on `stream` (a cudaStream_t) wait for it, on the device.
void stream_wait_event(void* stream, const std::shared_ptr<void>& event);

}  // namespace ringtrain::comm
