// internal.cuh: host-side helpers shared by the CUDA translation units of the
// tensor library (runtime.cc, caching_allocator.cc and the *.cu kernel files).
//
// defines: DeviceGuard, QuietDeviceGuard (runtime.h's, under detail:: names),
//          raw_stream(device) (the cudaStream_t that ops launch on),
//          require_cuda(op, device) (a clear error when no GPU is usable),
//          cuda_device_of(tensor...) (the device index of CUDA operands).
//
// This header is private to tensor/cuda/: it includes <cuda_runtime.h>, which
// public headers never do (runtime.h exposes handles as void*). It is named
// .cuh so that the install rule for public *.h headers does not ship it.
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "tensor/checks.h"
#include "tensor/cuda/runtime.h"
#include "tensor/tensor.h"

namespace ringtrain::cuda::detail {

// The public guards (runtime.h), under the names the kernel files use.
using DeviceGuard = ::ringtrain::cuda::DeviceGuard;
using QuietDeviceGuard = ::ringtrain::cuda::QuietDeviceGuard;

// Throws ringtrain::Error naming `op` when CUDA is unusable or `device` is out of range.
inline void require_cuda(const char* op, int device) {
  RT_CHECK(is_available(), op, ": CUDA is not usable: ", unavailable_reason());
  RT_CHECK(device >= 0 && device < device_count(), op, ": cuda:", device,
           " does not exist (this machine has ", device_count(), " CUDA device(s))");
}

// The stream kernels for `device` are launched on: this thread's current stream.
inline cudaStream_t raw_stream(int device) {
  return static_cast<cudaStream_t>(current_stream(device).handle());
}

// The CUDA device of `t`, with a clear error when it is on the CPU.
inline int cuda_device_of(const Tensor& t, const char* op) {
  RT_CHECK(t.device().is_cuda(), op, ": expected a CUDA tensor, got ", t.describe());
  return t.device().index;
}

// Checks that every defined operand lives on `device` (kernels never copy across devices).
template <typename... Ts>
void check_same_device(const char* op, int device, const Ts&... tensors) {
  auto check_one = [&](const Tensor& t) {
    if (!t.defined()) return;
    RT_CHECK(t.device().is_cuda() && t.device().index == device, op,
             ": all operands must be on cuda:", device, ", got ", t.describe());
  };
  (check_one(tensors), ...);
}

}  // namespace ringtrain::cuda::detail
