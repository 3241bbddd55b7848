// ring_process_group.cc: RingProcessGroup, our own backend.
//
// It owns a PeerMesh (a TCP connection to every member, shared memory with the
// members on this host) and maps each queued collective onto an algorithm of
// ring_algorithms.h. Everything runs on the comm thread of the base class, one
// collective at a time, each under its deadline. CUDA buffers are staged through
// pinned host memory by the base class, except an allreduce among ranks that all
// share this host, which goes through CUDA IPC (cuda_ipc_allreduce.cc) unless
// RINGTRAIN_CUDA_IPC=0 or some rank cannot map its peers' device memory.
#include <cstdio>
#include <cstring>
#include <mutex>

#include "comm/backends.h"
#include "comm/cuda_ipc_allreduce.h"
#include "comm/launch_env.h"
#include "comm/ring_algorithms.h"
#include "comm/shm_segment.h"
#include "comm/symmetric_memory.h"
#include "comm/transport.h"
#include "comm/wait_in_slices.h"

namespace ringtrain::comm {

namespace {

constexpr uint32_t kPointToPointMagic = 0x52545032;  // "RTP2"
constexpr size_t kDirectMinBytes = 2048;  // smallest allreduce that takes direct_allreduce

// RINGTRAIN_CUDA_IPC: 1 (default) lets the ring allreduce CUDA buffers through CUDA
// IPC when every rank is on this host; 0 stages them through pinned host memory.
bool cuda_ipc_enabled() { return env_size("RINGTRAIN_CUDA_IPC", 1, 0) != 0; }

// Sent ahead of every send() payload, so that recv() can check it matches.
struct PointToPointHeader {
  uint32_t magic;
  int32_t tag;
  uint64_t nbytes;
};

class RingProcessGroup final : public ProcessGroup {
 public:
  explicit RingProcessGroup(GroupContext context)
      : ProcessGroup(std::move(context)),
        mesh_(store(), this->context().prefix + "/ring", rank(), size(),
              this->context().world_ranks, this->context().token, options().transport,
              Clock::now() + setup_timeout(),
              [this](const std::string& what) { throw_if_member_published_failure(what); }) {
    check_same_algorithm_settings();
    start();
  }
  ~RingProcessGroup() override { stop(); }

  const char* backend_name() const override { return "ring"; }

  std::shared_ptr<SymmetricBuffer> allocate_symmetric(size_t bytes) override {
    if (!mesh_.all_shared_memory()) return nullptr;
    std::string key = detail::concat(context().prefix, "/symmetric/", symmetric_count_++);
    std::shared_ptr<SymmetricBuffer> buffer;
    try {
      buffer = SymmetricBuffer::allocate(mesh_, store(), key, bytes, Clock::now() + options().timeout);
    } catch (const ShmCreateError& e) {
      // Every rank of the group gets this same error (share_shm_segments), so all of
      // them fall back together, to private memory and the ring.
      std::fprintf(stderr, "ringtrain: warning: no symmetric memory for %zu bytes, using private memory: %s\n",
                   bytes, e.what());
      return nullptr;
    } catch (const CommError& e) {
      // A member died or failed while the others waited for it, or this rank gave up
      // (a timeout: some rank never called allocate_symmetric; a peer's segment that
      // would not open): the ranks no longer agree on where the group is, so it is
      // failed as split() fails it. The peers then fail at once with this reason
      // (comm.fault.allocate_symmetric_timeout_fails_the_group_np3), not later with
      // "rank N died", and rank 0, at exit, does not wait a minute for a dead member
      // to check out.
      abort(e.what());
      throw;
    }
    std::lock_guard<std::mutex> lock(symmetric_mutex_);
    std::erase_if(symmetric_, [](const auto& weak) { return weak.expired(); });
    symmetric_.push_back(buffer);
    return buffer;
  }

 protected:
  void run(const Collective& c, Deadline deadline) override {
    RingArgs args{mesh_, c.input.dtype, c.reduce_op, deadline, scratch_};
    switch (c.op) {
      case CollectiveOp::kAllreduce:
        // Symmetric memory: direct loads and stores. Below 2 KiB one recursive-
        // doubling exchange beats the direct path's two barriers (measured with
        // comm_sweep --buffers symmetric: 0.5 vs 0.7 us at 8 B, equal at 2 KiB).
        if (auto [buffer, offset] = find_symmetric(c.input);
            buffer && c.input.nbytes() >= kDirectMinBytes) {
          direct_allreduce(args, *buffer, static_cast<size_t>(offset), c.input.count);
        } else if (c.input.nbytes() < ring_latency_threshold_bytes() ||
            c.input.count < static_cast<size_t>(size())) {
          recursive_doubling_allreduce(args, c.input.data, c.input.count);
        } else {
          ring_allreduce(args, c.input.data, c.input.count);
        }
        return;
      case CollectiveOp::kBroadcast:
        ring_broadcast(args, c.input.data, c.input.nbytes(), c.peer);
        return;
      case CollectiveOp::kReduce:
        ring_reduce(args, c.input.data, c.input.count, c.peer);
        return;
      case CollectiveOp::kAllgather:
        ring_allgather(args, c.input.data, c.output.data, c.input.count);
        return;
      case CollectiveOp::kReduceScatter:
        ring_reduce_scatter(args, c.input.data, c.output.data, c.output.count);
        return;
      case CollectiveOp::kAllToAll:
        pairwise_all_to_all(args, c.input.data, c.output.data, c.input.count);
        return;
      case CollectiveOp::kBarrier:
        dissemination_barrier(args);
        return;
      case CollectiveOp::kSend: {
        PointToPointHeader header{kPointToPointMagic, c.tag, c.input.nbytes()};
        mesh_.send(c.peer, &header, sizeof(header), deadline);
        mesh_.send(c.peer, c.input.data, c.input.nbytes(), deadline);
        return;
      }
      case CollectiveOp::kRecv: {
        PointToPointHeader header{};
        mesh_.recv(c.peer, &header, sizeof(header), deadline);
        if (header.magic != kPointToPointMagic || header.tag != c.tag ||
            header.nbytes != c.input.nbytes()) {
          throw CommError(detail::concat(
              "recv from rank ", context().world_ranks[c.peer], " expected tag ", c.tag, " with ", c.input.nbytes(),
              " bytes, but the peer sent ",
              header.magic == kPointToPointMagic
                  ? detail::concat("tag ", header.tag, " with ", header.nbytes, " bytes")
                  : std::string("something that is not a send() (a collective?)")));
        }
        mesh_.recv(c.peer, c.input.data, c.input.nbytes(), deadline);
        return;
      }
    }
  }

  bool try_run_on_device(const Collective& c, Deadline deadline) override {
    if (c.op != CollectiveOp::kAllreduce || !mesh_.all_shared_memory() || !cuda_ipc_enabled()) return false;
    RingArgs args{mesh_, c.input.dtype, c.reduce_op, deadline, scratch_};
    const int device = c.input.device.index;
    if (!ipc_set_up_) {  // the first CUDA allreduce sets it up, on every rank at once
      std::string why;
      ipc_ = CudaIpcAllreduce::create(args, store(), context().prefix + "/cuda_ipc", device, &why);
      ipc_set_up_ = true;
      if (!ipc_ && rank() == 0) {
        std::fprintf(stderr, "ringtrain: ring backend: CUDA buffers go through host memory, not CUDA IPC (%s)\n",
                     why.c_str());
      }
    }
    if (!ipc_) return false;
    RT_CHECK(device == ipc_->device(), "ring backend: this rank's CUDA buffers were on cuda:", ipc_->device(),
             " at its first allreduce and are on cuda:", device,
             " now; keep one device per rank (cuda::set_device(local_rank))");
    ipc_->allreduce(args, c.input.data, c.input.count, c.ready_event);
    return true;
  }

  std::shared_ptr<ProcessGroup> create_subgroup(GroupContext context, int color, int) override {
    if (color < 0) return nullptr;
    return std::make_shared<RingProcessGroup>(std::move(context));
  }

  void close_transports() override { mesh_.close(); }

  int lost_member() const override {
    for (int peer = 0; peer < size(); ++peer) {
      if (mesh_.peer_closed(peer)) return peer;
    }
    return -1;
  }

 private:
  // The ranks must cut every allreduce the same way, or their messages stop
  // matching mid-collective: rank 0 publishes its settings, the others compare.
  void check_same_algorithm_settings() {
    const std::string mine = detail::concat("RINGTRAIN_RING_LATENCY_BYTES=",
                                            ring_latency_threshold_bytes(),
                                            " RINGTRAIN_RING_CHUNK_BYTES=", ring_chunk_bytes(),
                                            " RINGTRAIN_CUDA_IPC=", cuda_ipc_enabled() ? 1 : 0);
    const std::string key = context().prefix + "/ring/settings";
    if (rank() == 0) {
      store().set(key, mine);
      return;
    }
    // In slices, looking at the members between them: rank 0 fails right here when one
    // of its own settings is malformed (RINGTRAIN_RING_CHUNK_BYTES=junk on rank 0 only),
    // and publishes why. One plain get sat until rank 0 left with the store, and this
    // rank then said only "the store ... is gone".
    const std::string rank0 = wait_in_slices(
        Clock::now() + setup_timeout(), [this](const std::string& what) { throw_if_member_published_failure(what); },
        detail::concat("rank ", context().world_ranks[0], "'s ring settings"),
        [&](Deadline slice) { return store().get(key, std::chrono::milliseconds(millis_until(slice))); },
        LastLook::kYes);
    if (rank0 != mine) {
      throw CommError(detail::concat("ring backend: rank ", context().world_ranks[rank()], " has ",
                                     mine, " but rank ", context().world_ranks[0], " has ", rank0,
                                     "; set them the same on every rank (or unset them)"));
    }
  }

  // The symmetric buffer holding all of `buffer` (host memory), and the offset in it.
  std::pair<std::shared_ptr<SymmetricBuffer>, int64_t> find_symmetric(const BufferRef& buffer) {
    if (!buffer.device.is_cpu()) return {nullptr, -1};
    std::lock_guard<std::mutex> lock(symmetric_mutex_);
    for (const auto& weak : symmetric_) {
      auto symmetric = weak.lock();
      if (!symmetric) continue;
      int64_t offset = symmetric->offset_of(buffer.data, buffer.nbytes());
      if (offset >= 0) return {symmetric, offset};
    }
    return {nullptr, -1};
  }

  PeerMesh mesh_;
  std::unique_ptr<CudaIpcAllreduce> ipc_;  // built by the first CUDA allreduce on one host
  bool ipc_set_up_ = false;
  std::vector<char> scratch_;  // grows to the largest recursive-doubling / reduce_scatter need
  uint64_t symmetric_count_ = 0;                         // allocations so far (store keys)
  std::mutex symmetric_mutex_;                           // guards symmetric_ (caller vs comm thread)
  std::vector<std::weak_ptr<SymmetricBuffer>> symmetric_;  // live allocations of this group
};

}  // namespace

std::shared_ptr<ProcessGroup> make_ring_process_group(GroupContext context) {
  return std::make_shared<RingProcessGroup>(std::move(context));
}

}  // namespace ringtrain::comm
