// storage.h: reference-counted, device-tagged memory that tensors view.
//
// defines: DataPtr (owning pointer with a per-allocator deleter), Storage,
//          allocate_bytes() which picks the allocator for a device:
//            cpu    -> 64-byte aligned host memory (aligned for AVX-512 loads)
//            cuda:N -> the CUDA caching allocator (tensor/cuda/caching_allocator.h)
//          allocate_pinned_host_bytes() for page-locked staging buffers.
//
// A Storage is shared by every Tensor viewing it (std::shared_ptr<Storage>); the
// memory goes back to its allocator when the last view is gone.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>

#include "tensor/device.h"

namespace ringtrain {

using DataPtr = std::unique_ptr<void, std::function<void(void*)>>;

inline constexpr size_t kCpuAlignment = 64;

// Allocates `nbytes` on `device`. nbytes == 0 gives a null DataPtr (a valid empty buffer).
// Throws ringtrain::Error when the device is unavailable or memory runs out.
DataPtr allocate_bytes(size_t nbytes, Device device);
// Page-locked host memory when a CUDA runtime is usable, ordinary aligned memory otherwise.
DataPtr allocate_pinned_host_bytes(size_t nbytes);

class Storage {
 public:
  Storage(size_t nbytes, Device device)
      : data_(allocate_bytes(nbytes, device)), nbytes_(nbytes), device_(device) {}
  // Adopts memory allocated elsewhere (pinned buffers, user memory).
  Storage(DataPtr data, size_t nbytes, Device device)
      : data_(std::move(data)), nbytes_(nbytes), device_(device) {}
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const { return data_.get(); }
  size_t nbytes() const { return nbytes_; }
  Device device() const { return device_; }

  // The version counter: bumped by every in-place write through any tensor over this
  // storage. Views, aliases and detached tensors share their storage, so they share the
  // counter, as they share PyTorch's: autograd compares it to catch a tensor saved for
  // backward that was modified in place through another view. Atomic: DDP's communication
  // thread writes buckets while autograd writes gradients into other views of them.
  uint64_t version() const { return version_.load(std::memory_order_relaxed); }
  void bump_version() { version_.fetch_add(1, std::memory_order_relaxed); }

 private:
  DataPtr data_;
  size_t nbytes_;
  Device device_;
  std::atomic<uint64_t> version_{0};
};

}  // namespace ringtrain
