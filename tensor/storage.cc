#include "tensor/storage.h"

#include <cstdlib>
#include <new>

#include "tensor/checks.h"
#include "tensor/cuda/runtime.h"

namespace ringtrain {

namespace {
DataPtr allocate_cpu(size_t nbytes) {
  if (nbytes == 0) return DataPtr(nullptr, [](void*) {});
  // aligned_alloc wants a size that is a multiple of the alignment.
  size_t rounded = (nbytes + kCpuAlignment - 1) / kCpuAlignment * kCpuAlignment;
  void* ptr = std::aligned_alloc(kCpuAlignment, rounded);
  RT_CHECK(ptr != nullptr, "allocate_bytes: out of host memory allocating ", nbytes, " bytes");
  return DataPtr(ptr, [](void* p) { std::free(p); });
}
}  // namespace

DataPtr allocate_bytes(size_t nbytes, Device device) {
  if (device.is_cpu()) return allocate_cpu(nbytes);
  if (nbytes == 0) return DataPtr(nullptr, [](void*) {});
  return cuda::caching_allocate(nbytes, device.index);
}

DataPtr allocate_pinned_host_bytes(size_t nbytes) {
  if (nbytes == 0 || !cuda::is_available()) return allocate_cpu(nbytes);
  return cuda::pinned_host_allocate(nbytes);
}

}  // namespace ringtrain
