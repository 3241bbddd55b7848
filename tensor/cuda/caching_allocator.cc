// caching_allocator.cc: the CUDA caching allocator and the cached pinned-host allocator.
//
// defines: caching_allocate, record_stream, pinned_host_allocate, allocator_stats,
//          empty_cache (declared in tensor/cuda/runtime.h).
//
// Why cache. cudaMalloc and cudaFree are slow (hundreds of microseconds) and
// cudaFree synchronises the whole device. A training step allocates and frees
// the same set of activation and gradient buffers every iteration, so after the
// first step every request can be served from memory we already hold. This is
// the design PyTorch's CUDACachingAllocator made standard, reduced to its core:
//
//  * Size classes. Requests are rounded up to a multiple of 512 bytes. Requests
//    of at most 1 MiB come from the small pool, carved out of 2 MiB segments;
//    larger ones from the large pool, carved out of 20 MiB segments (requests
//    under 10 MiB) or a segment of the request rounded up to 2 MiB.
//  * Split and merge. A cached block bigger than the request is split; the
//    remainder stays cached (small pool: when at least 512 bytes remain; large
//    pool: when more than 1 MiB remains, so big blocks are not shredded). When a
//    block is freed it merges with free neighbours of the same segment, so a
//    segment that is entirely free is one block again.
//  * Streams. A block belongs to the stream that was current when it was
//    allocated and is only reused for requests on that stream. Work on one
//    stream runs in order, so a block freed on the host while its kernels are
//    still queued can be handed to the next kernel on the same stream without
//    any synchronisation: that kernel runs after the old ones. A buffer that is
//    also used on another stream (DDP's communication stream reading a
//    gradient) is declared with record_stream(ptr, stream): when such a block is
//    freed we record an event on every stream that used it, and the block
//    returns to the cache only once all those events have completed (checked,
//    without blocking, at the next allocation). This is PyTorch's recordStream.
//  * Best fit. Free blocks sit in a std::set ordered by (stream, size, address);
//    lower_bound finds the smallest block of this stream that is big enough.
//  * Out of memory. When cudaMalloc fails we return every wholly-free cached
//    segment to the driver and try once more, then throw an Error naming the
//    device, the request and the allocator's state.
//
// The stats (cuda_malloc_calls in particular) let a test assert that a
// training-like loop performs no cudaMalloc after its first iteration.
//
// Pinned host memory (cudaHostAlloc) is cached too: sizes rounded up to a power
// of two, exact-size free lists, no splitting. A pinned buffer may still be the
// source or target of an async copy when its owner drops it. The code that
// queues such a copy calls record_host_stream right after, which records an
// event on that stream (one per stream, the newest); free hands the block out
// again only once all of them have completed. (An event on "the current stream
// of the current device" at free time, the first design, guarded the wrong
// stream whenever the copy ran elsewhere, and made a thread that never chose a
// device create a context on GPU 0. Keeping the stream handles and recording at
// free time, the second, would record on streams their owners may have
// destroyed by then.)
//
// Lifetime. The allocator objects are created on first use and deliberately
// never destroyed: DataPtr deleters may run during static destruction (a global
// Tensor), after which a destroyed allocator would be a use-after-free. The
// memory itself goes back to the driver at process exit.
//
// Thread safety: one mutex per allocator; deleters may run on any thread.
#include <cuda_runtime.h>

#include <cstdio>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>
#include <unordered_map>
#include <vector>

#include "tensor/checks.h"
#include "tensor/cuda/internal.cuh"
#include "tensor/cuda/runtime.h"

namespace ringtrain::cuda {

namespace {

constexpr size_t kMinBlockSize = 512;               // every size is a multiple of this
constexpr size_t kSmallSize = 1 << 20;              // largest request served by the small pool
constexpr size_t kSmallSegment = 2 << 20;           // small-pool segments are 2 MiB
constexpr size_t kLargeSegment = 20 << 20;          // large requests under kMinLargeAlloc share 20 MiB
constexpr size_t kMinLargeAlloc = 10 << 20;         // at or above this, a segment of its own
constexpr size_t kLargeRound = 2 << 20;             // own segments are rounded to 2 MiB

size_t round_size(size_t nbytes) {
  if (nbytes < kMinBlockSize) return kMinBlockSize;
  return (nbytes + kMinBlockSize - 1) / kMinBlockSize * kMinBlockSize;
}

size_t segment_size(size_t size) {
  if (size <= kSmallSize) return kSmallSegment;
  if (size < kMinLargeAlloc) return kLargeSegment;
  return (size + kLargeRound - 1) / kLargeRound * kLargeRound;
}

std::string bytes_str(size_t n) {
  std::ostringstream os;
  if (n >= (size_t{1} << 30)) os << static_cast<double>(n) / (1 << 30) << " GiB";
  else if (n >= (size_t{1} << 20)) os << static_cast<double>(n) / (1 << 20) << " MiB";
  else os << n << " bytes";
  return os.str();
}

// One contiguous piece of a cudaMalloc'd segment. Blocks of a segment form a
// doubly linked list in address order (prev/next), which is what merging walks.
struct Block {
  int device = 0;
  cudaStream_t stream = nullptr;  // the stream this block is reused on
  size_t size = 0;
  void* ptr = nullptr;
  bool allocated = false;
  bool small = false;             // which pool it belongs to
  Block* prev = nullptr;          // neighbour at lower address in the same segment
  Block* next = nullptr;          // neighbour at higher address in the same segment
  std::vector<cudaStream_t> stream_uses;  // other streams that used it (record_stream)
};

struct BlockLess {
  bool operator()(const Block* a, const Block* b) const {
    if (a->stream != b->stream) return std::less<cudaStream_t>()(a->stream, b->stream);
    if (a->size != b->size) return a->size < b->size;
    return std::less<void*>()(a->ptr, b->ptr);
  }
};
using BlockPool = std::set<Block*, BlockLess>;

// A freed block that other streams used, waiting for their events.
struct PendingFree {
  Block* block;
  std::vector<cudaEvent_t> events;
};

struct DeviceState {
  BlockPool small_pool;                        // free blocks <= 1 MiB
  BlockPool large_pool;                        // free blocks > 1 MiB
  std::unordered_map<void*, Block*> active;    // allocated blocks by address
  std::vector<PendingFree> pending;            // freed, not yet safe to reuse
  AllocatorStats stats;
};

class CachingAllocator {
 public:
  void* allocate(size_t nbytes, int device) {
    detail::require_cuda("cuda::caching_allocate", device);
    cudaStream_t stream = detail::raw_stream(device);
    size_t size = round_size(nbytes);
    std::lock_guard<std::mutex> lock(mutex_);
    DeviceState& state = device_state(device);
    if (!state.pending.empty()) process_pending(state, /*wait=*/false);
    BlockPool& pool = size <= kSmallSize ? state.small_pool : state.large_pool;
    ++state.stats.allocations;

    Block* block = take_cached(pool, stream, size);
    if (block != nullptr) {
      ++state.stats.cache_hits;
    } else {
      block = new_segment(state, device, stream, size);
    }
    maybe_split(pool, block, size);
    block->allocated = true;
    state.active.emplace(block->ptr, block);
    state.stats.bytes_in_use += block->size;
    return block->ptr;
  }

  // Called from DataPtr deleters: must not throw.
  void free(void* ptr) noexcept {
    if (ptr == nullptr) return;
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& state : devices_) {
      if (!state) continue;
      auto it = state->active.find(ptr);
      if (it == state->active.end()) continue;
      Block* block = it->second;
      state->active.erase(it);
      if (!block->stream_uses.empty()) {
        PendingFree pending{block, {}};
        if (record_use_events(*block, &pending.events)) {
          state->pending.push_back(std::move(pending));
          return;
        }
        // Could not record the events (runtime failing): wait for the block's device
        // instead (not the caller's current one, which may be another GPU or none).
        for (cudaEvent_t e : pending.events) (void)cudaEventDestroy(e);
        {
          detail::QuietDeviceGuard on_device(block->device);
          if (on_device.ok()) (void)cudaDeviceSynchronize();
        }
        (void)cudaGetLastError();
      }
      release(*state, block);
      return;
    }
    std::fprintf(stderr, "ringtrain: cuda caching allocator asked to free unknown pointer %p\n", ptr);
  }

  void record_stream(void* ptr, const Stream& stream) {
    std::lock_guard<std::mutex> lock(mutex_);
    int device = stream.device();
    Block* block = nullptr;
    if (device >= 0 && static_cast<size_t>(device) < devices_.size() && devices_[device]) {
      auto it = devices_[device]->active.find(ptr);
      if (it != devices_[device]->active.end()) block = it->second;
    }
    RT_CHECK(block != nullptr, "cuda::record_stream: ", ptr,
             " is not the start of a live block allocated on cuda:", device,
             " (pass Storage::data() of a tensor on the stream's device)");
    auto handle = static_cast<cudaStream_t>(stream.handle());
    if (handle == block->stream) return;  // its own stream is always ordered
    for (cudaStream_t s : block->stream_uses)
      if (s == handle) return;
    block->stream_uses.push_back(handle);
  }

  AllocatorStats stats(int device) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (device < 0 || static_cast<size_t>(device) >= devices_.size() || !devices_[device]) return {};
    return devices_[device]->stats;
  }

  void empty_cache() {
    std::lock_guard<std::mutex> lock(mutex_);
    for (size_t d = 0; d < devices_.size(); ++d) {
      if (!devices_[d]) continue;
      process_pending(*devices_[d], /*wait=*/true);
      release_cached_segments(*devices_[d], static_cast<int>(d));
    }
  }

 private:
  DeviceState& device_state(int device) {
    if (devices_.size() <= static_cast<size_t>(device)) devices_.resize(device + 1);
    if (!devices_[device]) devices_[device] = std::make_unique<DeviceState>();
    return *devices_[device];
  }

  // Marks `block` free and returns it to its pool, merged with free neighbours
  // of the same segment (they share the stream).
  static void release(DeviceState& state, Block* block) {
    block->allocated = false;
    block->stream_uses.clear();
    state.stats.bytes_in_use -= block->size;
    BlockPool& pool = block->small ? state.small_pool : state.large_pool;
    if (block->prev != nullptr && !block->prev->allocated) block = merge(pool, block->prev, block);
    if (block->next != nullptr && !block->next->allocated) block = merge(pool, block, block->next);
    pool.insert(block);
  }

  // Records an event on every stream in block.stream_uses (on the block's device).
  // Returns false if the runtime refused; never throws (called from deleters).
  static bool record_use_events(const Block& block, std::vector<cudaEvent_t>* events) {
    detail::QuietDeviceGuard on_device(block.device);
    bool ok = on_device.ok();
    for (cudaStream_t s : block.stream_uses) {
      if (!ok) break;
      cudaEvent_t e = nullptr;
      ok = cudaEventCreateWithFlags(&e, cudaEventDisableTiming) == cudaSuccess;
      if (!ok) break;
      events->push_back(e);
      ok = cudaEventRecord(e, s) == cudaSuccess;
    }
    if (!ok) (void)cudaGetLastError();
    return ok;
  }

  // Releases pending blocks whose events have all completed (wait: block until they have).
  static void process_pending(DeviceState& state, bool wait) {
    for (auto it = state.pending.begin(); it != state.pending.end();) {
      bool done = true;
      for (cudaEvent_t e : it->events) {
        cudaError_t status = wait ? cudaEventSynchronize(e) : cudaEventQuery(e);
        if (status == cudaErrorNotReady) {
          (void)cudaGetLastError();
          done = false;
          break;
        }
        (void)cudaGetLastError();  // a failed event cannot be waited on: treat as done
      }
      if (!done) {
        ++it;
        continue;
      }
      for (cudaEvent_t e : it->events) (void)cudaEventDestroy(e);
      release(state, it->block);
      it = state.pending.erase(it);
    }
  }

  // The smallest free block of `stream` holding at least `size` bytes, removed from the pool.
  static Block* take_cached(BlockPool& pool, cudaStream_t stream, size_t size) {
    Block key;
    key.stream = stream;
    key.size = size;
    key.ptr = nullptr;
    auto it = pool.lower_bound(&key);
    if (it == pool.end() || (*it)->stream != stream) return nullptr;
    Block* block = *it;
    pool.erase(it);
    return block;
  }

  Block* new_segment(DeviceState& state, int device, cudaStream_t stream, size_t size) {
    size_t bytes = segment_size(size);
    void* ptr = nullptr;
    {
      detail::DeviceGuard guard(device);
      cudaError_t status = cudaMalloc(&ptr, bytes);
      if (status == cudaErrorMemoryAllocation) {
        (void)cudaGetLastError();
        release_cached_segments(state, device);  // give the cache back, then try once more
        status = cudaMalloc(&ptr, bytes);
      }
      if (status != cudaSuccess) {
        (void)cudaGetLastError();
        throw Error(::ringtrain::detail::concat(
            "CUDA out of memory: cannot allocate ", bytes_str(bytes), " (request ",
            bytes_str(size), ") on cuda:", device, ": ", cudaGetErrorString(status), "; ",
            bytes_str(state.stats.bytes_in_use), " in use by tensors, ",
            bytes_str(state.stats.bytes_reserved), " reserved by ringtrain. Reduce the batch "
            "size, or free tensors you no longer need."));
      }
    }
    ++state.stats.cuda_malloc_calls;
    state.stats.bytes_reserved += bytes;
    auto* block = new Block;
    block->device = device;
    block->stream = stream;
    block->size = bytes;
    block->ptr = ptr;
    block->small = size <= kSmallSize;
    return block;
  }

  // Splits `block` so that it is `size` bytes, putting the remainder back in `pool`.
  static void maybe_split(BlockPool& pool, Block* block, size_t size) {
    size_t remaining = block->size - size;
    bool split = block->small ? remaining >= kMinBlockSize : remaining > kSmallSize;
    if (!split) return;
    auto* rest = new Block;
    rest->device = block->device;
    rest->stream = block->stream;
    rest->size = remaining;
    rest->ptr = static_cast<char*>(block->ptr) + size;
    rest->small = block->small;
    rest->prev = block;
    rest->next = block->next;
    if (block->next != nullptr) block->next->prev = rest;
    block->next = rest;
    block->size = size;
    pool.insert(rest);
  }

  // Merges free neighbours `lo` and `hi` (lo->next == hi) into `lo`; `hi` is deleted.
  // Whichever of them is in the pool is taken out first.
  static Block* merge(BlockPool& pool, Block* lo, Block* hi) {
    if (!lo->allocated) pool.erase(lo);
    if (!hi->allocated) pool.erase(hi);
    lo->size += hi->size;
    lo->next = hi->next;
    if (hi->next != nullptr) hi->next->prev = lo;
    delete hi;
    return lo;
  }

  // cudaFree's every cached segment that is entirely free (one block, no neighbours).
  static void release_cached_segments(DeviceState& state, int device) {
    detail::DeviceGuard guard(device);
    for (BlockPool* pool : {&state.small_pool, &state.large_pool}) {
      for (auto it = pool->begin(); it != pool->end();) {
        Block* block = *it;
        if (block->prev == nullptr && block->next == nullptr) {
          CUDA_CHECK(cudaFree(block->ptr));
          state.stats.bytes_reserved -= block->size;
          delete block;
          it = pool->erase(it);
        } else {
          ++it;
        }
      }
    }
  }

  std::mutex mutex_;
  std::vector<std::unique_ptr<DeviceState>> devices_;
};

CachingAllocator& device_allocator() {
  static auto* allocator = new CachingAllocator;  // never destroyed: see "Lifetime" above
  return *allocator;
}

// ---------------------------------------------------------------- pinned host memory

class PinnedHostAllocator {
 public:
  void* allocate(size_t nbytes) {
    RT_CHECK(is_available(), "cuda::pinned_host_allocate: CUDA is not usable: ",
             unavailable_reason());
    size_t size = round_pow2(nbytes);
    std::lock_guard<std::mutex> lock(mutex_);
    reclaim_completed();
    auto& free_list = free_[size];
    if (!free_list.empty()) {
      char* ptr = free_list.back();
      free_list.pop_back();
      live_[ptr] = LiveBlock{size, {}};
      return ptr;
    }
    // cudaHostAlloc works in the current device's context, creating it if need
    // be: on a thread that never chose a device (the DataLoader's prefetch
    // thread) that would be a new context on GPU 0. Pinned memory serves every
    // device alike (unified addressing), so borrow one that has a context already.
    std::optional<DeviceGuard> in_existing_context;
    if (int current = 0; cudaGetDevice(&current) == cudaSuccess && !has_primary_context(current)) {
      for (int d = 0; d < device_count(); ++d) {
        if (!has_primary_context(d)) continue;
        in_existing_context.emplace(d);
        break;
      }
    }
    void* ptr = nullptr;
    cudaError_t status = cudaHostAlloc(&ptr, size, cudaHostAllocDefault);
    if (status != cudaSuccess) {
      (void)cudaGetLastError();
      throw Error(::ringtrain::detail::concat("cudaHostAlloc of ", bytes_str(size),
                                 " pinned host bytes failed: ", cudaGetErrorString(status)));
    }
    live_[static_cast<char*>(ptr)] = LiveBlock{size, {}};
    return ptr;
  }

  bool record_stream(const void* ptr, const Stream& stream) {
    if (find_live(ptr) == nullptr) return false;
    // The event is recorded now, right behind the copy the caller just queued:
    // an event outlives its stream, while a stream handle kept until free() could
    // be destroyed (or reused for another stream) by then.
    cudaEvent_t event = nullptr;
    {
      detail::QuietDeviceGuard on_device(stream.device());
      const auto handle = static_cast<cudaStream_t>(stream.handle());
      const bool ok = on_device.ok() &&
                      cudaEventCreateWithFlags(&event, cudaEventDisableTiming) == cudaSuccess &&
                      cudaEventRecord(event, handle) == cudaSuccess;
      if (!ok) {
        // No event: wait for the stream here instead, so the copy is done.
        (void)cudaGetLastError();
        if (event != nullptr) (void)cudaEventDestroy(event);
        if (on_device.ok()) (void)cudaStreamSynchronize(handle);
        (void)cudaGetLastError();
        return true;
      }
    }
    std::lock_guard<std::mutex> lock(mutex_);
    LiveBlock* block = find_live_locked(ptr);
    if (block == nullptr) {  // freed meanwhile by another thread: the caller's bug, but no leak
      (void)cudaEventDestroy(event);
      return true;
    }
    // One event per stream is enough: work on a stream runs in order, so the newest
    // event covers the older copies on the same stream.
    const auto handle = static_cast<cudaStream_t>(stream.handle());
    for (StreamUse& use : block->uses) {
      if (use.device != stream.device() || use.stream != handle) continue;
      (void)cudaEventDestroy(use.event);
      use.event = event;
      return true;
    }
    block->uses.push_back({stream.device(), handle, event});
    return true;
  }

  // Called from DataPtr deleters: must not throw.
  void free(void* ptr) noexcept {
    if (ptr == nullptr) return;
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = live_.find(static_cast<char*>(ptr));
    if (it == live_.end()) return;
    char* block = it->first;
    LiveBlock live = std::move(it->second);
    live_.erase(it);
    if (live.uses.empty()) {
      free_[live.size].push_back(block);
      return;
    }
    // A copy recorded on the block may still read or write it: hand it out again
    // only once every recorded event has completed (checked at the next allocate).
    Pending pending{{}, block, live.size};
    for (const StreamUse& use : live.uses) pending.events.push_back(use.event);
    pending_.push_back(std::move(pending));
  }

 private:
  struct StreamUse {
    int device;
    cudaStream_t stream;  // only compared, never used after record_stream returned
    cudaEvent_t event;    // recorded on `stream` after the newest copy there
  };
  struct LiveBlock {
    size_t size;
    std::vector<StreamUse> uses;  // streams whose queued work touches the block
  };
  struct Pending {
    std::vector<cudaEvent_t> events;  // one per recorded stream
    char* ptr;
    size_t size;
  };

  // The live block holding `ptr` (any address inside it), or nullptr.
  LiveBlock* find_live_locked(const void* ptr) {
    auto it = live_.upper_bound(static_cast<char*>(const_cast<void*>(ptr)));
    if (it == live_.begin()) return nullptr;
    --it;
    if (static_cast<const char*>(ptr) >= it->first + it->second.size) return nullptr;
    return &it->second;
  }
  LiveBlock* find_live(const void* ptr) {
    std::lock_guard<std::mutex> lock(mutex_);
    return find_live_locked(ptr);
  }

  static size_t round_pow2(size_t n) {
    size_t size = kMinBlockSize;
    while (size < n) size <<= 1;
    return size;
  }

  void reclaim_completed() {
    for (auto it = pending_.begin(); it != pending_.end();) {
      bool done = true;
      for (cudaEvent_t e : it->events) {
        cudaError_t status = cudaEventQuery(e);
        (void)cudaGetLastError();  // not ready is an answer; an error means the event is unusable
        if (status == cudaErrorNotReady) {
          done = false;
          break;
        }
      }
      if (!done) {
        ++it;
        continue;
      }
      for (cudaEvent_t e : it->events) (void)cudaEventDestroy(e);
      free_[it->size].push_back(it->ptr);
      it = pending_.erase(it);
    }
  }

  std::mutex mutex_;
  std::map<size_t, std::vector<char*>> free_;  // size class -> cached buffers
  std::map<char*, LiveBlock> live_;            // buffers handed out, by start address
  std::vector<Pending> pending_;               // freed, waiting for their events
};

PinnedHostAllocator& host_allocator() {
  static auto* allocator = new PinnedHostAllocator;  // never destroyed, as above
  return *allocator;
}

}  // namespace

DataPtr caching_allocate(size_t nbytes, int device) {
  if (nbytes == 0) return DataPtr(nullptr, [](void*) {});
  void* ptr = device_allocator().allocate(nbytes, device);
  return DataPtr(ptr, [](void* p) { device_allocator().free(p); });
}

DataPtr pinned_host_allocate(size_t nbytes) {
  if (nbytes == 0) return DataPtr(nullptr, [](void*) {});
  void* ptr = host_allocator().allocate(nbytes);
  return DataPtr(ptr, [](void* p) { host_allocator().free(p); });
}

void record_stream(void* ptr, const Stream& stream) {
  if (ptr == nullptr) return;  // empty tensors own no block
  device_allocator().record_stream(ptr, stream);
}

bool record_host_stream(const void* ptr, const Stream& stream) {
  if (ptr == nullptr || !is_available()) return false;
  return host_allocator().record_stream(ptr, stream);
}

AllocatorStats allocator_stats(int device) { return device_allocator().stats(device); }

void empty_cache() { device_allocator().empty_cache(); }

}  // namespace ringtrain::cuda
