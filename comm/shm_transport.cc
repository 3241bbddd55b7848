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
// It is a byte stream, like TCP (transport.h): slots carry no message boundaries.
// A receive takes at most what remains of its message, so it may end inside a
// slot; the receiver keeps its read offset in that slot, and the next receive
// starts there. A slot goes back to the sender only once it is read to its end.
// Sends and receives need not be cut the same way: the broadcast's root sends its
// buffer as one message while a middle rank receives it in 1 MiB segments, which
// any slot size that does not divide 1 MiB (196608, 2 MiB) splits inside a slot.
// (Until that was so, such a broadcast failed with "the peer sent N bytes where M
// were expected".) The sink still gets whole 8-byte groups except at a message's
// end: a group split across two slots is put together in an 8-byte carry first.
// Collectives that ranks issue differently are not detected here (TCP cannot
// either): RINGTRAIN_DEBUG_COLLECTIVES=1 compares them, and a timeout says to.
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
#include <cstring>

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
    next_slot_ = known_head_ = in_->tail.load(std::memory_order_relaxed);
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

  // The byte stream's receiving half. A receive takes what has arrived, up to
  // `remaining`, and a slot is handed back to the sender only once every byte of it
  // has been consumed: a receive may end inside a slot, and the next receive starts
  // where it ended. The sender's slots and the receiver's messages need not line up
  // (the broadcast's root sends its whole buffer as one message; a middle rank
  // receives it in 1 MiB segments, which a slot of 192 KiB does not divide).
  size_t try_recv(size_t offset, size_t remaining, const RecvSink& sink) override {
    size_t received = 0;
    while (received < remaining) {
      const size_t left = remaining - received;  // counts the carried bytes too
      if (carried_ > 0) {
        // An 8-byte group (or the message's last < 8 bytes) that straddles slots:
        // complete it in carry_ and hand it over whole.
        const size_t group = std::min<size_t>(8, left);
        carried_ += take(carry_ + carried_, group - carried_);
        if (carried_ < group) break;  // the rest has not arrived yet
        sink(carry_, offset + received, group);
        received += group;
        carried_ = 0;
        continue;
      }
      const char* piece = nullptr;
      const size_t available = peek(&piece);
      if (available == 0) break;
      // Whole 8-byte groups, except at the message's end (the RecvSink contract).
      size_t n = std::min(available, left);
      if (n < left) n &= ~size_t{7};
      if (n == 0) {
        // fewer than 8 bytes left in this slot and more to come after them
        carried_ = take(carry_, available);
        continue;
      }
      sink(piece, offset + received, n);
      consume(n);
      received += n;
    }
    return received;
  }

  const char* kind() const override { return "shm"; }

 private:
  // The unread bytes of the oldest published slot, or 0 when none has arrived.
  size_t peek(const char** piece) {
    if (next_slot_ == known_head_) {
      known_head_ = in_->head.load(std::memory_order_acquire);
      if (next_slot_ == known_head_) return 0;
    }
    const uint64_t slot = next_slot_ % static_cast<uint64_t>(layout_.slots);
    const uint64_t length = slot_lengths(in_)[slot];
    if (length == 0 || length > layout_.slot_bytes) {
      // the sender writes 1..slot_bytes: a hang (0) or a read past the slot otherwise
      throw CommError(detail::concat("shared-memory transport: slot ", next_slot_, " of a channel has length ",
                                     length, ", not in [1, ", layout_.slot_bytes,
                                     "]: the channel was overwritten (memory corruption in this process or "
                                     "its peer)"));
    }
    *piece = in_slots_ + slot * layout_.slot_bytes + read_offset_;
    return length - read_offset_;
  }
  // Marks n bytes of the current slot read; a slot read to its end goes back to the sender.
  void consume(size_t n) {
    read_offset_ += n;
    const uint64_t slot = next_slot_ % static_cast<uint64_t>(layout_.slots);
    if (read_offset_ < slot_lengths(in_)[slot]) return;
    read_offset_ = 0;
    in_->tail.store(++next_slot_, std::memory_order_release);
  }
  // Copies up to n bytes out of the slots (across slot boundaries); returns how many.
  size_t take(char* into, size_t n) {
    size_t taken = 0;
    const char* piece = nullptr;
    while (taken < n) {
      const size_t available = peek(&piece);
      if (available == 0) break;
      const size_t k = std::min(available, n - taken);
      std::memcpy(into + taken, piece, k);
      consume(k);
      taken += k;
    }
    return taken;
  }

  std::shared_ptr<ShmSegment> inbox_;   // our segment: the peer writes our channel in it
  std::shared_ptr<ShmSegment> outbox_;  // the peer's segment: we write our channel in it
  ShmLayout layout_;
  ChannelHeader* in_;
  ChannelHeader* out_;
  char* in_slots_;
  char* out_slots_;
  // Receiving side (this object is the channel's only reader):
  uint64_t next_slot_ = 0;   // the slot being read: the tail we publish once it is read
  uint64_t known_head_ = 0;  // the sender's head as last loaded (reloaded when caught up)
  size_t read_offset_ = 0;   // bytes of slot next_slot_ already handed over
  char carry_[8];            // an 8-byte group being completed across slots
  size_t carried_ = 0;       // bytes of it in carry_
};

}  // namespace

std::unique_ptr<Transport> make_shm_transport(std::shared_ptr<ShmSegment> inbox, int peer_local,
                                              std::shared_ptr<ShmSegment> outbox, int my_local,
                                              const ShmLayout& layout) {
  return std::make_unique<ShmTransport>(std::move(inbox), peer_local, std::move(outbox), my_local,
                                        layout);
}

}  // namespace ringtrain::comm
