// shm_transport.cc: ShmTransport, byte streams between two processes on one host.
//
// Each rank owns one POSIX shared-memory segment, its inbox, with one channel
// per local sender. A channel is a single-producer single-consumer ring of
// `slots` fixed-size slots:
//
//   [ head (written by the sender) | tail (written by the receiver) | bytes[slots] | slot 0 | slot 1 | ... ]
//
// The sender copies into slot head % slots, records its length, then publishes
// head + 1 with a release store; the receiver sees it with an acquire load,
// hands the slot to its sink (which reduces or copies straight out of shared
// memory), then publishes tail + 1. head and tail live on their own cache lines
// so the two processes do not false-share. With several slots in flight the
// sender fills slot k+1 while the receiver reduces slot k: that is the
// pipelining of the ring, at slot granularity.
//
// The sender's copy uses non-temporal stores from 4 KiB (ShmLayout::streaming_stores):
// the slot's lines go to memory rather than staying dirty in the sender's cache, where
// the receiver would have to fetch them from and the sender's next write into the slot
// take them back; on the Zen 5 VM that made the slot stream 5x faster.
//
// Cost per byte: one copy in (sender) + one read by the receiver's sink; versus
// TCP over loopback (copy to kernel, copy out of kernel, then the sink) it saves
// a copy and two system calls per slot.
//
// Lifetime: the segment is created by its owner, opened by the local peers, and
// unlinked by the owner as soon as everyone has mapped it, so a crash leaves no
// file in /dev/shm; the mapping itself lives until the last process unmaps it
// (share_shm_segments in shm_segment.h, called by PeerMesh).
#include <algorithm>
#include <atomic>

#include "comm/launch_env.h"
#include "comm/reduce.h"
#include "comm/shm_segment.h"
#include "comm/transport.h"

namespace ringtrain::comm {

namespace {

constexpr size_t kCacheLine = 64;

struct ChannelHeader {
  alignas(kCacheLine) std::atomic<uint64_t> head;  // slots published by the sender
  alignas(kCacheLine) std::atomic<uint64_t> tail;  // slots consumed by the receiver
  // followed, on the next cache line, by uint64_t slot_bytes[slots]: each slot's payload length
};

uint64_t* slot_lengths(ChannelHeader* header) {
  return reinterpret_cast<uint64_t*>(reinterpret_cast<char*>(header) + sizeof(ChannelHeader));
}

size_t header_bytes(int slots) {
  size_t bytes = sizeof(ChannelHeader) + sizeof(uint64_t) * slots;
  return (bytes + 4095) / 4096 * 4096;  // slots start page aligned
}

}  // namespace

size_t ShmLayout::channel_bytes() const {
  return header_bytes(slots) + slot_bytes * static_cast<size_t>(slots);
}

ShmLayout ShmLayout::from_env(int channels) {
  ShmLayout layout;
  // Bounded before anything is cast or multiplied: RINGTRAIN_SHM_SLOTS=4294967296
  // would become 0 slots as an int (a hang), and a huge slot size would wrap the
  // segment size (a short segment, then a SIGSEGV past its end).
  layout.slot_bytes = env_size("RINGTRAIN_SHM_SLOT_BYTES", layout.slot_bytes, 64);
  RT_CHECK(layout.slot_bytes <= kMaxSlotBytes && layout.slot_bytes % kCacheLine == 0,
           "RINGTRAIN_SHM_SLOT_BYTES=", layout.slot_bytes, " must be a multiple of 64 in [64, ",
           kMaxSlotBytes, "] (1 GiB); unset it or give one such as 131072");
  const size_t slots = env_size("RINGTRAIN_SHM_SLOTS", layout.slots, 1);
  RT_CHECK(slots <= static_cast<size_t>(kMaxSlots), "RINGTRAIN_SHM_SLOTS=", slots,
           " is not in [1, ", kMaxSlots, "]; unset it or give one such as 8");
  layout.slots = static_cast<int>(slots);
  layout.streaming_stores = env_size("RINGTRAIN_SHM_STREAMING_STORES", 1, 0, 1) == 1;
  RT_CHECK(channels >= 1, "shared-memory transport: ", channels, " local ranks");
  layout.channels = channels;
  // Within the caps a channel is at most 1 TiB, but the local rank count multiplies it.
  size_t segment = 0;
  RT_CHECK(!__builtin_mul_overflow(layout.channel_bytes(), static_cast<size_t>(channels), &segment),
           "shared-memory transport: RINGTRAIN_SHM_SLOT_BYTES=", layout.slot_bytes,
           " x RINGTRAIN_SHM_SLOTS=", layout.slots, " x ", channels,
           " local ranks overflows the segment size; make the slots smaller or fewer");
  return layout;
}

namespace {

class ShmTransport final : public Transport {
 public:
  ShmTransport(std::shared_ptr<ShmSegment> inbox, int peer_local,
               std::shared_ptr<ShmSegment> outbox, int my_local, const ShmLayout& layout)
      : inbox_(std::move(inbox)), outbox_(std::move(outbox)), layout_(layout) {
    in_ = reinterpret_cast<ChannelHeader*>(inbox_->base() + layout.channel_bytes() * peer_local);
    out_ = reinterpret_cast<ChannelHeader*>(outbox_->base() + layout.channel_bytes() * my_local);
    in_slots_ = reinterpret_cast<char*>(in_) + header_bytes(layout.slots);
    out_slots_ = reinterpret_cast<char*>(out_) + header_bytes(layout.slots);
  }

  size_t try_send(const void* data, size_t nbytes) override {
    const uint64_t slots = static_cast<uint64_t>(layout_.slots);
    uint64_t head = out_->head.load(std::memory_order_relaxed);
    uint64_t tail = out_->tail.load(std::memory_order_acquire);
    size_t sent = 0;
    // fill every free slot we have data for
    while (sent < nbytes && head - tail < slots) {
      size_t n = std::min(layout_.slot_bytes, nbytes - sent);
      uint64_t slot = head % slots;
      char* into = out_slots_ + slot * layout_.slot_bytes;
      const char* from = static_cast<const char*>(data) + sent;
      if (layout_.streaming_stores && n >= ShmLayout::kStreamingMinBytes) {
        copy_bytes_streaming(into, from, n);  // ends with an sfence: ordered before the head store
      } else {
        copy_bytes(into, from, n);
      }
      slot_lengths(out_)[slot] = n;
      out_->head.store(++head, std::memory_order_release);
      sent += n;
    }
    return sent;
  }

  size_t try_recv(size_t offset, size_t remaining, const RecvSink& sink) override {
    const uint64_t slots = static_cast<uint64_t>(layout_.slots);
    uint64_t tail = in_->tail.load(std::memory_order_relaxed);
    uint64_t head = in_->head.load(std::memory_order_acquire);
    size_t received = 0;
    while (received < remaining && tail < head) {
      uint64_t slot = tail % slots;
      size_t n = slot_lengths(in_)[slot];
      if (n > remaining - received) {
        throw CommError(detail::concat(
            "shared-memory transport: the peer sent ", n, " bytes where ", remaining - received,
            " were expected (the ranks issued different collectives; run with "
            "RINGTRAIN_DEBUG_COLLECTIVES=1 to find which)"));
      }
      sink(in_slots_ + slot * layout_.slot_bytes, offset + received, n);
      in_->tail.store(++tail, std::memory_order_release);
      received += n;
    }
    return received;
  }

  const char* kind() const override { return "shm"; }

 private:
  std::shared_ptr<ShmSegment> inbox_;   // our segment: the peer writes our channel in it
  std::shared_ptr<ShmSegment> outbox_;  // the peer's segment: we write our channel in it
  ShmLayout layout_;
  ChannelHeader* in_;
  ChannelHeader* out_;
  char* in_slots_;
  char* out_slots_;
};

}  // namespace

std::unique_ptr<Transport> make_shm_transport(std::shared_ptr<ShmSegment> inbox, int peer_local,
                                              std::shared_ptr<ShmSegment> outbox, int my_local,
                                              const ShmLayout& layout) {
  return std::make_unique<ShmTransport>(std::move(inbox), peer_local, std::move(outbox), my_local,
                                        layout);
}

}  // namespace ringtrain::comm
