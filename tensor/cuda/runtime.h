// runtime.h: CUDA devices, streams, events and the caching allocator, as plain C++
// types that compile without CUDA headers.
//
// defines: is_available, device_count, DeviceGuard, QuietDeviceGuard, Stream, Event, current_stream /
//          set_current_stream / StreamGuard, CachingAllocator entry points.
//
// Handles are stored as opaque pointers so that code which never touches a GPU
// (comm, ddp, the CPU-only build) can still name these types. With CUDA the
// definitions are in tensor/cuda/runtime.cc and caching_allocator.cc; without it,
// tensor/cuda/cuda_unavailable.cc defines them to report "no GPU" and to throw
// a clear error ("this build has no CUDA; rebuild with -DRINGTRAIN_CUDA=ON") if
// a GPU resource is actually requested.
//
// Streams: every device has a "current stream" per host thread (the legacy
// default stream until set). Kernels and copies launched by ops run on it. DDP
// runs its allreduces on a stream of its own and orders them after the backward
// kernels with Event::record + Stream::wait, never with a host sync.
#pragma once

#include <cstddef>
#include <cstdint>

#include "tensor/device.h"
#include "tensor/storage.h"

namespace ringtrain::cuda {

// True when this build has CUDA and the runtime reports at least one device.
// Any runtime error (no driver, no device) reads as false; never throws.
bool is_available();
int device_count();  // 0 when !is_available()
// Why CUDA is not usable, for skip messages: "this build has no CUDA", or the runtime's error.
const char* unavailable_reason();
void set_device(int index);
void synchronize_device(int index);
// True when `device`'s primary context exists in this process, i.e. something has
// already used that GPU here. Asking never creates a context. false without CUDA.
bool has_primary_context(int device);

// Makes `index` the current CUDA device for this scope and, on exit, restores the
// previous one if that device has a context (PyTorch's rule, MaybeSetDevice). A
// thread that never chose a device reads as "device 0"; restoring that would make
// CUDA create a context on GPU 0 in every process that only ever uses another GPU,
// so such a thread stays on `index`. Not copyable or movable: it guards one scope.
class DeviceGuard {
 public:
  explicit DeviceGuard(int index);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = 0;
  int current_ = 0;
};

// DeviceGuard for code that must not throw (destructors, deleters, abort paths): it
// sets the device if it can, ok() says whether it did, and it restores the previous
// device under DeviceGuard's rule. Without CUDA it does nothing and ok() is false.
class QuietDeviceGuard {
 public:
  explicit QuietDeviceGuard(int index) noexcept;
  ~QuietDeviceGuard();
  QuietDeviceGuard(const QuietDeviceGuard&) = delete;
  QuietDeviceGuard& operator=(const QuietDeviceGuard&) = delete;
  bool ok() const { return ok_; }

 private:
  int previous_ = 0;
  int current_ = 0;
  bool ok_ = false;
};

class Stream {
 public:
  // The legacy default stream of `device`.
  static Stream default_stream(int device);
  // A new non-blocking stream owned by this object (destroyed with it).
  static Stream create(int device, int priority = 0);
  Stream() = default;
  ~Stream();
  Stream(Stream&& other) noexcept;
  Stream& operator=(Stream&& other) noexcept;
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  // A non-owning copy of this stream's handle (for current_stream and queues).
  Stream borrow() const;
  // A non-owning Stream for a cudaStream_t owned elsewhere (nullptr = legacy default stream).
  static Stream borrowed(void* handle, int device);

  void* handle() const { return handle_; }  // cudaStream_t
  int device() const { return device_; }
  void synchronize() const;
  bool query() const;  // true when all work queued so far has finished
  // Make future work on this stream wait for `event` (device-side, no host sync).
  void wait(const class Event& event) const;

 private:
  void* handle_ = nullptr;
  int device_ = 0;
  bool owned_ = false;
};

class Event {
 public:
  Event() = default;
  static Event create(int device, bool enable_timing = false);
  ~Event();
  Event(Event&& other) noexcept;
  Event& operator=(Event&& other) noexcept;
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;

  void record(const Stream& stream);
  void synchronize() const;
  bool query() const;
  float elapsed_ms(const Event& end) const;  // both created with timing enabled
  void* handle() const { return handle_; }  // cudaEvent_t

 private:
  void* handle_ = nullptr;
  int device_ = 0;
};

// The stream ops launch on for `device` in this thread.
Stream current_stream(int device);
void set_current_stream(const Stream& stream);

// Sets the current stream for a scope and restores the previous one after.
class StreamGuard {
 public:
  explicit StreamGuard(const Stream& stream);
  ~StreamGuard();
  StreamGuard(const StreamGuard&) = delete;
  StreamGuard& operator=(const StreamGuard&) = delete;

 private:
  void* previous_ = nullptr;
  int device_ = 0;
};

// ---- caching allocator (PyTorch-style): blocks are kept per (device, stream) and
// reused, so a training step performs no cudaMalloc after its first iteration.
DataPtr caching_allocate(size_t nbytes, int device);
// Declares that the block starting at `ptr` (Storage::data() of a CUDA tensor) is
// also used by work on `stream`, not only on the stream it was allocated on: when
// the block is freed it is reused only after the work queued on `stream` so far
// has finished (PyTorch's Tensor.record_stream). (DDP does not need it: every
// backend completes a Work only after its own stream has drained, and the Reducer
// keeps a failed bucket's memory, see ~Reducer.) As in PyTorch, the events are recorded when the block
// is freed (so work queued on `stream` after this call is covered too): `stream` must
// outlive the block. A stream destroyed before that makes the free fall back to a
// device-wide synchronize; its handle reused by a new stream would be guarded instead.
void record_stream(void* ptr, const Stream& stream);
// Page-locked host memory (cudaHostAlloc), cached the same way.
DataPtr pinned_host_allocate(size_t nbytes);
// The pinned counterpart of record_stream: declares that the pinned block holding
// `ptr` (any address inside a pinned_host_allocate buffer) is read or written by
// work queued on `stream` so far: call it right AFTER queuing the copy (it records
// an event on the stream now). When the buffer is freed, it is handed out again
// only after that work has finished. Every async copy from or to a pinned buffer
// calls it (memcpy_bytes does); a buffer nobody recorded is reused at once. Returns
// false, and does nothing, when `ptr` is not in a pinned block (pageable memory).
bool record_host_stream(const void* ptr, const Stream& stream);

struct AllocatorStats {
  uint64_t cuda_malloc_calls = 0;  // cudaMalloc calls made since start
  uint64_t allocations = 0;        // caching_allocate calls served
  uint64_t cache_hits = 0;         // served from a cached block
  size_t bytes_reserved = 0;       // held from cudaMalloc, in use or cached
  size_t bytes_in_use = 0;
};
AllocatorStats allocator_stats(int device);
void empty_cache();  // returns cached (unused) blocks to the driver

}  // namespace ringtrain::cuda
