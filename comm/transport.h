// transport.h: how the ring backend moves bytes between two ranks.
//
// defines: RecvSink, Transport (one peer's byte pipe, non-blocking halves),
//          TcpTransport / ShmTransport (made by make_tcp_transport /
//          make_shm_transport), PeerMesh (a connection to every other member
//          of a group and the exchange() loop the algorithms are written in).
//
// A Transport is a pair of ordered byte streams (to and from one peer). It
// never blocks: try_send pushes what fits, try_recv hands what has arrived to a
// RecvSink. The sink sees the message in order, in pieces whose sizes are
// multiples of 8 bytes except the last one, so a sink can reduce whole elements
// straight out of the transport's buffer (the shared-memory slot itself: no
// extra copy on that path).
//
// Streams, not messages: neither transport keeps the boundaries of the sends. A
// receive of m bytes takes the next m bytes of the stream however the peer cut
// them into sends (and slots, or TCP segments), so the two sides may cut a
// message differently: the broadcast's root sends its buffer whole while a middle
// rank receives and forwards it in 1 MiB segments. The flip side: ranks that
// issue different collectives are not caught here (their bytes are read by the
// wrong receive, or never); RINGTRAIN_DEBUG_COLLECTIVES=1 compares the collectives
// themselves, and a collective's timeout message points to it.
//
// PeerMesh::exchange(send to A, receive from B) drives both halves until both
// are done; it is the only blocking primitive the ring algorithms use, so the
// ring can send to next while it receives from prev without deadlock. While it
// waits it checks the deadline and whether the peers it waits on are still
// alive (their TCP socket: a process that dies has its sockets closed by the
// kernel, even a kill -9), and throws PeerLostError naming the rank.
//
// Choice of transport per peer ("auto"): ShmTransport when both ranks have the
// same host_identity() (hostname + boot id + /dev/shm mount), TcpTransport otherwise. The TCP
// mesh is built in either case: it carries the handshake (job token) and is the
// liveness signal for shared-memory peers.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "comm/socket.h"
#include "comm/store.h"
#include "comm/wait_in_slices.h"

namespace ringtrain::comm {

// Called with consecutive pieces of the message being received.
using RecvSink = std::function<void(const void* piece, size_t offset, size_t nbytes)>;

class Transport {
 public:
  virtual ~Transport() = default;
  // Pushes a prefix of [data, data + nbytes) that fits now; returns its length (may be 0).
  virtual size_t try_send(const void* data, size_t nbytes) = 0;
  // Receives what has arrived of the current message, at most `remaining` bytes, and
  // hands it to sink with offsets starting at `offset`. Returns the bytes handed over.
  virtual size_t try_recv(size_t offset, size_t remaining, const RecvSink& sink) = 0;
  // A descriptor to poll() while waiting, or -1 (shared memory: spin, then yield).
  virtual int poll_fd() const { return -1; }
  virtual const char* kind() const = 0;
};

// TCP: the peer's mesh socket carries the data (non-blocking send/recv).
std::unique_ptr<Transport> make_tcp_transport(const Socket& socket);

// Shared memory on one host: one segment per receiving rank, holding a ring of
// slots per local sender. See shm_transport.cc.
class ShmSegment;
struct ShmLayout {
  // 128 KiB x 8 (1 MiB per channel): on the 2-core EPYC VM, 2 ranks, 128 KiB
  // slots were the best of 64, 128, 256 and 512 KiB; 8 of them against 16 ran
  // 6-12% faster at 16-32 MiB and the same elsewhere in three alternating sweeps
  // (the inbox stays in cache), with half the shared memory
  // (docs/collective-benchmark.md).
  static constexpr size_t kMaxSlotBytes = size_t{1} << 30;  // 1 GiB
  static constexpr int kMaxSlots = 1024;
  size_t slot_bytes = 128 << 10;  // multiple of 64 in [64, kMaxSlotBytes]; RINGTRAIN_SHM_SLOT_BYTES
  int slots = 8;                  // in [1, kMaxSlots]; RINGTRAIN_SHM_SLOTS
  int channels = 1;               // local ranks (one channel per local sender)
  // Copies into a slot of at least kStreamingMinBytes use non-temporal stores
  // (copy_bytes_streaming in reduce.h); RINGTRAIN_SHM_STREAMING_STORES=0 turns them off.
  // Below 4 KiB they gained nothing in the probe and the data is better left in cache.
  static constexpr size_t kStreamingMinBytes = 4096;
  bool streaming_stores = true;
  size_t channel_bytes() const;
  size_t segment_bytes() const { return channel_bytes() * channels; }
  // Reads RINGTRAIN_SHM_SLOT_BYTES, RINGTRAIN_SHM_SLOTS and RINGTRAIN_SHM_STREAMING_STORES
  // (0 or 1; it changes no byte on the wire, so ranks may differ); throws naming the
  // variable and its allowed range when a value is outside it.
  static ShmLayout from_env(int channels);
};
// inbox: this rank's own segment, channel `peer_local` (the peer writes there);
// outbox: the peer's segment, channel `my_local` (we write there).
std::unique_ptr<Transport> make_shm_transport(std::shared_ptr<ShmSegment> inbox, int peer_local,
                                              std::shared_ptr<ShmSegment> outbox, int my_local,
                                              const ShmLayout& layout);

class PeerMesh {
 public:
  // Collective over the group: listens, publishes its address in the store,
  // connects to every member (token-checked handshake), and maps shared memory
  // with the members on this host. `transport`: "auto", "tcp" or "shm".
  // Every wait on another member goes in short slices (wait_in_slices.h); between
  // them `check_members(what)` throws if a member published a failure (it will never
  // come), so one rank failing during setup ends the others' waits within a second
  // instead of at the deadline. `what` names what this rank is waiting for.
  PeerMesh(Store& store, const std::string& prefix, int rank, int size,
           const std::vector<int>& world_ranks, const std::string& token,
           const std::string& transport, Deadline deadline, const MemberCheck& check_members);
  ~PeerMesh();
  PeerMesh(const PeerMesh&) = delete;
  PeerMesh& operator=(const PeerMesh&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  int world_rank(int peer) const { return peers_.at(peer).world_rank; }

  // A second message for send_peer that exchange() starts streaming right behind the
  // first while the sink is still producing it: bytes [0, ready) of data may go,
  // and the sink advances ready. exchange() returns when its own two messages are
  // done; `sent` says how much of the follow-up went with them, and the caller
  // sends the rest. The ring allreduce forwards each piece of its reduce-scatter
  // result this way the moment it is reduced (ring_allreduce.cc).
  struct FollowUp {
    const char* data = nullptr;
    size_t ready = 0;  // advanced by the sink
    size_t sent = 0;   // advanced by exchange()
  };

  // Sends send_bytes to send_peer while receiving recv_bytes from recv_peer into
  // sink (and, with follow_up, streams what is ready of it to send_peer once
  // send_data is out). A peer of -1 (or 0 bytes) means that half is idle. Throws
  // PeerLostError (naming the world rank) or CommTimeoutError.
  void exchange(int send_peer, const void* send_data, size_t send_bytes, int recv_peer,
                size_t recv_bytes, const RecvSink& sink, Deadline deadline,
                FollowUp* follow_up = nullptr);
  void send(int peer, const void* data, size_t nbytes, Deadline deadline) {
    exchange(peer, data, nbytes, -1, 0, nullptr, deadline);
  }
  // Receives straight into dst.
  void recv(int peer, void* dst, size_t nbytes, Deadline deadline);

  // "shm" or "tcp": what carries the bytes to `peer`.
  const char* transport_kind(int peer) const;
  // True when `peer`'s connection is closed (it died or gave up); no data is consumed.
  bool peer_closed(int peer) const { return peer != rank_ && peers_[peer].socket.peer_closed(); }
  // True when every member shares memory with this rank (symmetric memory works).
  bool all_shared_memory() const { return size_ > 1 && shm_peers_ == size_ - 1; }
  // A prefix for shared-memory segment names unique to this group and process.
  const std::string& shm_name_prefix() const { return shm_name_prefix_; }
  // Throws PeerLostError when a member published a failure or died (the
  // constructor's check_members: the store's record, which names a killed rank's
  // pid and host) or its mesh connection is closed; `what` names what this rank
  // waits for. For waits on members outside exchange(): the shared-memory
  // rendezvous of symmetric memory (share_shm_segments).
  void check_members(const std::string& what) const;
  // Blocks until ready() returns true, with exchange()'s waiting policy (spin,
  // yield, sleep), checking the deadline and that every peer is still alive.
  // `what` says what is awaited, for the timeout message.
  void wait_until(const std::function<bool()>& ready, Deadline deadline, const char* what);
  // Shuts every socket and flags the shared-memory loops: every blocked exchange,
  // here and on the peers, fails promptly.
  void close();

 private:
  struct Peer {
    Socket socket;                         // TCP mesh connection (data or liveness)
    std::unique_ptr<Transport> transport;  // what exchange() moves bytes with
    int world_rank = -1;
  };
  [[noreturn]] void lost(int peer, const char* what) const;
  int wait_for_progress(int send_peer, int recv_peer, uint64_t idle_rounds, Deadline deadline);

  int rank_;
  int size_;
  std::vector<Peer> peers_;  // indexed by group rank; peers_[rank_] unused
  std::vector<std::shared_ptr<ShmSegment>> segments_;  // keeps mappings alive
  int shm_peers_ = 0;            // peers reached through shared memory
  std::string shm_name_prefix_;  // "/ringtrain-<group hash>-r<rank>-p<pid>"
  MemberCheck check_published_;  // the constructor's check_members
  std::atomic<bool> closed_{false};
};

}  // namespace ringtrain::comm
