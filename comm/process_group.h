// process_group.h: the collective API that DDP and users call.
//
// defines: ProcessGroupOptions, GroupContext (what a backend is built from),
//          ProcessGroup (the abstract group: async collectives returning Work,
//          split into sub-groups, symmetric memory, abort).
//
// Where it sits in the data flow: DDP's Reducer calls allreduce() on a bucket
// when the bucket is full and it is its turn; the call only queues the
// collective on this group's comm thread and returns a Work. The comm thread
// runs the queued collectives one after another in issue order (the order is
// what makes ranks agree: every rank issues the same sequence), so a backend's
// run() is plain blocking code with a deadline.
//
// Around every run() the base class does the work common to all backends:
//   - argument checks (counts, roots, dtypes) with messages naming the op;
//   - the debug check (RINGTRAIN_DEBUG_COLLECTIVES=1): every rank publishes
//     (seq, op, dtype, count, root/redop) to the store and compares with all
//     others before running; a mismatch names each rank and what it issued
//     (split() takes a place in the sequence too);
//   - CUDA buffers for backends that only move host memory (ring, mpi): wait for
//     the caller's stream (an event recorded at issue time), copy to pinned host
//     memory, run, copy back;
//   - failure: the error is published to the store under this rank, the
//     transports are closed so that neighbours notice at once, and every pending
//     and later collective of the group fails with the same explained error.
//     A PeerLostError is explained with what the store knows: if some rank
//     published an exception, its message is the one reported.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "comm/store.h"
#include "comm/types.h"
#include "comm/work.h"
#include "tensor/storage.h"

namespace ringtrain::comm {

class SymmetricBuffer;

// How a collective is launched (torch.distributed's async_op).
enum class Launch {
  // Queue it on the comm thread and return at once; Work::wait() later. What DDP
  // does, so that allreduce runs while backward goes on.
  kAsync,
  // Return once it has completed, rethrowing its error (like MPI_Allreduce, or
  // torch's async_op=False). On an idle group it runs on the calling thread: no
  // hand-off to the comm thread and back (a futex wake-up each, and the buffer
  // crossing to another core's cache), which at 1 MiB is 10-40 us of ~140 on the
  // 2-core VM (docs/collective-benchmark.md). Behind queued work it queues and waits.
  kBlocking,
};

struct ProcessGroupOptions {
  // Per-collective timeout, counted from when the collective starts running.
  // RINGTRAIN_TIMEOUT_SEC overrides the default at init_process_group.
  std::chrono::milliseconds timeout = kDefaultTimeout;
  // Check that all ranks issue the same collective (costs p + 2 store round trips
  // per collective on p ranks). Also enabled by RINGTRAIN_DEBUG_COLLECTIVES=1.
  bool debug_collectives = false;
  // nccl backend: the CUDA device of this rank; -1: LOCAL_RANK % device count.
  int cuda_device = -1;
  // ring backend: "auto" (shared memory between ranks on one host, TCP otherwise),
  // "tcp" or "shm" (fails if a peer is on another host). RINGTRAIN_TRANSPORT overrides.
  std::string transport = "auto";
};

// Everything a backend needs to join the other members of its group.
struct GroupContext {
  int rank = 0;                          // rank in this group
  int size = 1;                          // members in this group
  std::vector<int> world_ranks;          // world rank of each member (for messages)
  std::shared_ptr<Store> store;          // shared by the world group and its sub-groups
  std::shared_ptr<StoreServer> server;   // non-null on world rank 0: keeps the store alive
  std::string prefix;                    // store key prefix unique to this group
  std::string token;                     // the job token (transport handshakes check it)
  bool is_world = false;                 // the group made by init_process_group
  ProcessGroupOptions options;
  // How long creating the group (members finding and connecting to each other) may
  // take; 0: options.timeout. init_process_group gives the world group its
  // rendezvous timeout here (ranks of one job start seconds or minutes apart).
  std::chrono::milliseconds setup_timeout{0};

  int world_rank() const { return world_ranks.at(rank); }
};

class ProcessGroup {
 public:
  // Host collectives up to this size issued while the group is idle run on the
  // calling thread even when launched kAsync (the Work comes back completed): for
  // them the hand-off to the comm thread and back costs more than the collective.
  // Not a kAsync recv (it may wait for a send the caller has yet to issue on another
  // group). Collectives on several groups should be issued in the same order on every
  // rank, as NCCL requires: a small one may hold its caller until its peers join.
  static constexpr size_t kInlineBytes = 32 << 10;

  // Whether a collective of this group that failed (or was given up on) may still write
  // the caller's buffers on `device` afterwards: MPI cannot cancel a started request,
  // and device work a backend queued (the CUDA IPC allreduce's copies) may still run.
  // The caller must then keep those buffers alive rather than free them.
  bool may_write_after_failure(Device device) const { return may_write_after_giving_up() || device.is_cuda(); }

  virtual ~ProcessGroup();
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  int rank() const { return context_.rank; }
  int size() const { return context_.size; }
  virtual const char* backend_name() const = 0;
  const ProcessGroupOptions& options() const { return context_.options; }
  // How long this group's creation may take (GroupContext::setup_timeout).
  std::chrono::milliseconds setup_timeout() const {
    return context_.setup_timeout.count() > 0 ? context_.setup_timeout : context_.options.timeout;
  }
  Store& store() { return *context_.store; }

  // In place: every rank ends with op(all ranks' buffers). kAvg divides by size().
  // Every collective takes a trailing Launch (default kAsync; see Launch).
  Work allreduce(BufferRef buffer, ReduceOp op = ReduceOp::kSum, Launch launch = Launch::kAsync);
  // In place: every rank ends with root's buffer.
  Work broadcast(BufferRef buffer, int root, Launch launch = Launch::kAsync);
  // In place: root ends with op(all buffers); other ranks' buffers are scratch afterwards.
  Work reduce(BufferRef buffer, int root, ReduceOp op = ReduceOp::kSum,
              Launch launch = Launch::kAsync);
  // output.count == size() * input.count; output holds rank 0's input, then rank 1's, ...
  // In place only as input = output + rank * input.count; any other overlap is refused.
  Work allgather(BufferRef input, BufferRef output, Launch launch = Launch::kAsync);
  // input.count == size() * output.count; rank r gets op over ranks of input block r.
  // In place only as output = input + rank * output.count; any other overlap is refused.
  Work reduce_scatter(BufferRef input, BufferRef output, ReduceOp op = ReduceOp::kSum,
                      Launch launch = Launch::kAsync);
  // input and output hold size() equal blocks; block j of input goes to rank j, and
  // block i of output came from rank i.
  Work all_to_all(BufferRef input, BufferRef output, Launch launch = Launch::kAsync);
  Work barrier(Launch launch = Launch::kAsync);
  // Point to point. Executed in issue order on the comm thread like collectives: a
  // pair that both send first can deadlock on large messages; order them.
  Work send(BufferRef buffer, int dst, int tag = 0);
  Work recv(BufferRef buffer, int src, int tag = 0);

  // Collective over this group: ranks passing the same color form a new group,
  // ordered by (key, old rank). color < 0: this rank joins no group (nullptr).
  // Like a blocking collective, it first waits for the collectives this rank issued
  // on the group before it (the backend's split is itself a collective of the group).
  std::shared_ptr<ProcessGroup> split(int color, int key);

  // Collective (every rank calls it, with the same size): memory every rank of the
  // group has mapped (symmetric_memory.h). An allreduce whose buffer lies inside it
  // runs by direct loads and stores, with no copies through a transport. nullptr
  // when this group cannot share memory (mpi and nccl backends, ranks on several
  // hosts, RINGTRAIN_TRANSPORT=tcp), and on every rank when some rank could not
  // create its share (/dev/shm full: a warning says so): callers fall back to
  // ordinary memory.
  virtual std::shared_ptr<SymmetricBuffer> allocate_symmetric(size_t /*bytes*/) { return nullptr; }

  // Fails this group on purpose (e.g. the caller caught an exception it cannot
  // recover from): publishes `reason` so the peers fail with it, not a timeout. Returns
  // within kAbortPublishGrace even when the store (rank 0) does not answer.
  void abort(const std::string& reason);
  static constexpr std::chrono::seconds kAbortPublishGrace{2};
  bool failed() const { return failed_.load(); }

 protected:
  // One queued collective, as the backend's run() sees it.
  struct Collective {
    CollectiveOp op = CollectiveOp::kBarrier;
    BufferRef input;   // allreduce/broadcast/reduce/send/recv: the buffer
    BufferRef output;  // allgather/reduce_scatter/all_to_all: the result
    ReduceOp reduce_op = ReduceOp::kSum;
    int peer = -1;     // root (broadcast, reduce), dst (send), src (recv)
    int tag = 0;
    // Position in this group's sequence of collectives, which every rank issues alike
    // (what debug mode compares), or, for send/recv, among this rank's point-to-point
    // operations: those involve two ranks only, so they cannot share the numbering.
    uint64_t seq = 0;
    // >= 0 marks split #split_index's place in the sequence: it completes without
    // running, once everything queued before it has run. In debug mode it is checked
    // like a collective (so a rank that splits while another allreduces is named).
    int64_t split_index = -1;
    // CUDA buffers: a cuda::Event recorded on the caller's stream after the work that
    // produces the input. A backend's own stream waits for it on the device
    // (stream_wait_event); host staging waits for it on the host first.
    std::shared_ptr<void> ready_event;
  };

  explicit ProcessGroup(GroupContext context);
  // Derived constructors call start() when their transports are up, and their
  // destructors call stop() first, so the comm thread never sees a half-built or
  // half-destroyed backend. stop() called while an exception propagates (the group
  // is being destroyed because its rank is failing) aborts the group first: see
  // docs/comm.md, failure semantics.
  void start();
  void stop();

  // Runs one collective to completion (blocking, on the comm thread), or throws.
  virtual void run(const Collective& collective, Deadline deadline) = 0;
  // True when run() takes device pointers itself (nccl); false: the base stages them.
  virtual bool handles_device_buffers() const { return false; }
  // For a backend that stages: runs a collective of CUDA buffers without staging
  // when it has a device path for it (the ring's CUDA IPC allreduce on one host)
  // and returns true; false: the base stages it through pinned host memory.
  // Must decide the same way on every rank of the group.
  virtual bool try_run_on_device(const Collective&, Deadline) { return false; }
  // Builds the sub-group split() computed. Called on every rank of this group; on
  // ranks that passed color < 0, context.rank is -1 and the result must be nullptr.
  virtual std::shared_ptr<ProcessGroup> create_subgroup(GroupContext context, int color,
                                                        int key) = 0;
  // Called once after a failure: close sockets and the like so peers notice now.
  virtual void close_transports() {}
  // True when a collective that run() gave up on may still write its buffers later
  // (MPI cannot cancel a started collective): staging buffers are then kept alive
  // for the life of the group instead of being freed under it.
  virtual bool may_write_after_giving_up() const { return false; }
  // A member this backend sees gone (its connection closed), as a group rank, or -1.
  // Lets waits in the store (debug mode, split) stop when a peer dies. Callable from
  // any thread; it must not consume data.
  virtual int lost_member() const { return -1; }

  // Store::get of a key a member writes, waited for in short slices until the
  // timeout; in between, a member that published an error or that lost_member()
  // reports gone ends the wait with PeerLostError (explain_failure says why), and this
  // group failing meanwhile (abort() from another thread) ends it with that failure.
  // `what` names what is waited for in the timeout message.
  std::string await_member_key(const std::string& key, const std::string& what);
  // Throws PeerLostError, naming `what` this rank was waiting for, when another
  // member published an error (its message is quoted) or lost_member() reports one
  // gone. For backends that wait on something the store cannot see (NCCL's init).
  void throw_if_member_failed(const std::string& what) const;
  // The same, from the store alone: callable while the backend's own state (what
  // lost_member() reads) is still being built, as PeerMesh's setup does.
  void throw_if_member_published_failure(const std::string& what) const;

  std::string describe(const Collective& collective) const;
  static std::string describe_collective(const Collective& collective, const char* backend,
                                         int rank, int size);
  const GroupContext& context() const { return context_; }

 private:
  struct Pending {
    Collective collective;
    std::shared_ptr<WorkState> state;
  };

  Work enqueue(Collective collective, Launch launch = Launch::kAsync);
  void worker_loop();
  void execute(Pending& pending);
  void run_staged(const Collective& collective, Deadline deadline);
  // run() on host memory, with a 16-bit average turned into a sum of divided values.
  void run_host(const Collective& collective, Deadline deadline);
  void keep_if_backend_may_write(std::initializer_list<DataPtr*> buffers);
  void check_same_collective(const Collective& collective);
  // Turns the exception of a failed collective (or split), described by what_op, into
  // the error every later wait sees.
  std::exception_ptr explain_failure(std::exception_ptr error, const std::string& what_op);
  // Marks the group failed with `explained` and closes its transports.
  void fail_with(std::exception_ptr explained);
  void wait_for_survivors(const std::string& shutdown_key);
  void publish_error(const std::string& kind, const std::string& message, int dead_rank);

  GroupContext context_;
  uint64_t next_seq_ = 0;            // next collective's sequence number (caller side)
  uint64_t next_p2p_seq_ = 0;        // next send/recv's number (its own count: see Collective::seq)
  int64_t last_checked_seq_ = -1;    // debug mode: the previous collective this rank checked
  uint64_t split_count_ = 0;         // splits made so far (store keys)
  std::atomic<bool> failed_{false};
  std::exception_ptr failure_;       // set once, by the comm thread, when failed_
  std::mutex queue_mutex_;
  std::condition_variable queue_changed_;
  std::deque<Pending> queue_;
  std::atomic<size_t> queued_{0};   // queue_.size(), for the comm thread's spin
  bool stopping_ = false;
  bool busy_ = false;                // a collective is executing (comm thread or inline)
  std::thread worker_;
  // Staging buffers of collectives given up on, kept alive (may_write_after_giving_up).
  std::mutex abandoned_mutex_;
  std::vector<DataPtr> abandoned_;
};

// Publishes why world rank `world_rank` failed, for its peers to report. kind:
// "exception" (the original error), "peer_lost" (dead_rank died), "peer_failed",
// "timeout"; "exited" is published by the store itself (leave_last_will). `group`: the prefix of the group it failed in; the record then concerns
// that group and the groups split from it, not its parents (a rank that aborted a
// sub-group still serves the world group). Empty: the whole process failed (an
// uncaught exception), which concerns every group. Best effort: never throws (the
// store may be gone).
void publish_rank_error(Store& store, int world_rank, const std::string& kind,
                        const std::string& message, int dead_rank = -1, const std::string& group = "");

// Leaves world rank `world_rank`'s last will with the store (Store::set_last_will):
// should its process end without a goodbye (killed, crashed), the store publishes
// an error record of kind "exited" for it, with dead_rank = world_rank, so that
// peers waiting for it in the store (group setup, split, debug mode) fail at once,
// naming it, pid and host. Called by init_process_group once the rank is claimed.
void leave_last_will(Store& store, int world_rank);

// For the process that runs the store (world rank 0) when it fails before the group
// exists: the other ranks may still be waiting in setup, about to read why it failed
// (or to publish their own failure). Returns once every world rank in `ranks` has
// published as many errors as it appears there (two processes that claimed one rank
// both publish under it), or after `grace`. Best effort: never throws.
void wait_for_peers_to_publish(Store& store, const std::vector<int>& ranks, std::chrono::milliseconds grace);

}  // namespace ringtrain::comm
