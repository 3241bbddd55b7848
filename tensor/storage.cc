// storage.cc: device memory for Storage.
//
// CPU memory comes from a small caching allocator. Training allocates the same
// sizes every step (activations, gradients, optimizer temporaries); glibc hands
// large blocks back to the kernel on free (mmap/munmap, heap trimming), so each
// step would pay fresh page faults on megabytes of memory — measured as the
// difference between an elementwise kernel at memcpy speed and the same op
// through the public API at a quarter of it. Freed blocks of kMinCachedBytes or
// more are kept in a free list keyed by size and handed out again for a request of
// the same rounded size; at most kMaxCachedBytes stay cached (older blocks beyond
// that are released). Small blocks go straight to malloc, which already reuses
// them well. CUDA memory has its own caching allocator (tensor/cuda/).
#include "tensor/storage.h"

#include <cstdlib>
#include <map>
#include <mutex>
#include <new>

#include "tensor/checks.h"
#include "tensor/cuda/runtime.h"

namespace ringtrain {

namespace {
constexpr size_t kMinCachedBytes = 64 << 10;   // below this, malloc's own bins are fine
constexpr size_t kMaxCachedBytes = 1ull << 30; // cap on idle cached memory
constexpr size_t kPageBytes = 4096;

class HostCache {
 public:
  static HostCache& instance() {
    static HostCache* cache = new HostCache();  // never destroyed: frees may come from static dtors
    return *cache;
  }

  void* allocate(size_t bytes) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto it = free_.find(bytes);
      if (it != free_.end()) {
        void* ptr = it->second;
        free_.erase(it);
        cached_bytes_ -= bytes;
        return ptr;
      }
    }
    void* ptr = std::aligned_alloc(kCpuAlignment, bytes);
    if (ptr == nullptr) {
      release_all();  // maybe the cache holds what we need
      ptr = std::aligned_alloc(kCpuAlignment, bytes);
    }
    RT_CHECK(ptr != nullptr, "allocate_bytes: out of host memory allocating ", bytes, " bytes");
    return ptr;
  }

  void free(void* ptr, size_t bytes) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (cached_bytes_ + bytes > kMaxCachedBytes) {
      std::free(ptr);
      return;
    }
    free_.emplace(bytes, ptr);
    cached_bytes_ += bytes;
  }

  void release_all() {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& [bytes, ptr] : free_) std::free(ptr);
    free_.clear();
    cached_bytes_ = 0;
  }

 private:
  std::mutex mutex_;
  std::multimap<size_t, void*> free_;  // rounded size -> idle block of exactly that size
  size_t cached_bytes_ = 0;            // sum of the idle blocks' sizes
};

DataPtr allocate_cpu(size_t nbytes) {
  if (nbytes == 0) return DataPtr(nullptr, [](void*) {});
  if (nbytes < kMinCachedBytes) {
    // aligned_alloc wants a size that is a multiple of the alignment.
    size_t rounded = (nbytes + kCpuAlignment - 1) / kCpuAlignment * kCpuAlignment;
    void* ptr = std::aligned_alloc(kCpuAlignment, rounded);
    RT_CHECK(ptr != nullptr, "allocate_bytes: out of host memory allocating ", nbytes, " bytes");
    return DataPtr(ptr, [](void* p) { std::free(p); });
  }
  size_t rounded = (nbytes + kPageBytes - 1) / kPageBytes * kPageBytes;
  void* ptr = HostCache::instance().allocate(rounded);
  return DataPtr(ptr, [rounded](void* p) { HostCache::instance().free(p, rounded); });
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
