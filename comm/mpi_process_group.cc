// mpi_process_group.cc: MpiProcessGroup, collectives by the MPI library.
//
// Each collective is the non-blocking MPI call (MPI_Iallreduce, MPI_Ibcast, ...)
// on a communicator of our own (MPI_Comm_dup / MPI_Comm_split, owned by an
// MpiComm), followed by MPI_Test polling on the comm thread until it completes
// or the deadline passes. MPI has no 16-bit float types: f16 and bf16 travel as
// MPI_UINT16_T with user-defined reduction ops that compute in float. kAvg is an
// MPI_SUM followed by one division.
//
// Limits, stated by name: counts above 2^31-1 elements are refused (MPI's int
// counts); after a timeout the outstanding MPI request cannot be cancelled, so
// the group is failed for good (exit the process); a dead peer is handled by
// mpirun, which stops the whole job. The ring backend is the one with its own
// failure detection.
#include <climits>
#include <cstring>
#include <memory>
#include <thread>

#include "comm/backends.h"
#include "comm/mpi_runtime.h"
#include "comm/reduce.h"

namespace ringtrain::comm {

namespace {

MPI_Datatype mpi_type(DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return MPI_FLOAT;
    case DType::kFloat64: return MPI_DOUBLE;
    case DType::kFloat16:
    case DType::kBFloat16: return MPI_UINT16_T;
    case DType::kInt32: return MPI_INT32_T;
    case DType::kInt64: return MPI_INT64_T;
  }
  return MPI_BYTE;
}

// User-defined MPI reductions for the 16-bit floats, one per (dtype, op).
template <DType kDType, ReduceOp kOp>
void reduce_16bit(void* in, void* inout, int* len, MPI_Datatype*) {
  reduce_into(inout, in, static_cast<size_t>(*len), kDType, kOp);
}

MPI_Op mpi_op(DType dtype, ReduceOp op) {
  if (!is_reduced_precision_float(dtype)) {
    switch (op) {
      case ReduceOp::kSum:
      case ReduceOp::kAvg: return MPI_SUM;
      case ReduceOp::kProd: return MPI_PROD;
      case ReduceOp::kMax: return MPI_MAX;
      case ReduceOp::kMin: return MPI_MIN;
    }
  }
  // created once, on first use, and kept until MPI_Finalize
  static MPI_Op ops[2][5] = {};
  static std::once_flag once;
  std::call_once(once, [] {
    MPI_User_function* functions[2][5] = {
        {reduce_16bit<DType::kFloat16, ReduceOp::kSum>, reduce_16bit<DType::kFloat16, ReduceOp::kSum>,
         reduce_16bit<DType::kFloat16, ReduceOp::kMax>, reduce_16bit<DType::kFloat16, ReduceOp::kMin>,
         reduce_16bit<DType::kFloat16, ReduceOp::kProd>},
        {reduce_16bit<DType::kBFloat16, ReduceOp::kSum>, reduce_16bit<DType::kBFloat16, ReduceOp::kSum>,
         reduce_16bit<DType::kBFloat16, ReduceOp::kMax>, reduce_16bit<DType::kBFloat16, ReduceOp::kMin>,
         reduce_16bit<DType::kBFloat16, ReduceOp::kProd>}};
    for (int d = 0; d < 2; ++d) {
      for (int o = 0; o < 5; ++o) MPI_CHECK(MPI_Op_create(functions[d][o], 1, &ops[d][o]));
    }
  });
  return ops[dtype == DType::kFloat16 ? 0 : 1][static_cast<int>(op)];
}

int mpi_count(size_t count, const char* what) {
  RT_CHECK(count <= static_cast<size_t>(INT_MAX), "mpi backend: ", what, " has ", count,
           " elements; MPI counts stop at 2^31-1 (use the ring backend or split the buffer)");
  return static_cast<int>(count);
}

class MpiProcessGroup final : public ProcessGroup {
 public:
  // The world group: a duplicate of MPI_COMM_WORLD, which must match the context.
  explicit MpiProcessGroup(GroupContext context) : ProcessGroup(std::move(context)) {
    ensure_mpi_initialized();
    int mpi_rank = 0;
    int mpi_size = 0;
    // Groups of an earlier init_process_group may still poll on their comm threads: every
    // MPI call here is serialized with theirs (mpi_call_mutex).
    {
      std::lock_guard<std::mutex> lock(mpi_call_mutex());
      MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &mpi_rank));
      MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &mpi_size));
    }
    if (mpi_size != size() || mpi_rank != rank()) {
      throw CommError(detail::concat(
          "mpi backend: MPI sees rank ", mpi_rank, " of ", mpi_size, " but the job has rank ",
          rank(), " of ", size(), "; the mpi backend needs the processes started by mpirun "
          "(or srun --mpi=pmix), not by ringrun or by hand"));
    }
    MPI_Comm dup = MPI_COMM_NULL;
    {
      // a collective that waits for every rank: the mutex only where MPI needs it (as
      // around MPI_Comm_split below)
      std::unique_lock<std::mutex> lock(mpi_call_mutex(), std::defer_lock);
      if (!mpi_thread_multiple()) lock.lock();
      MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &dup));
    }
    comm_ = MpiComm(dup);
    set_error_handler();
    start();
  }
  // A sub-group: comm is the result of MPI_Comm_split.
  MpiProcessGroup(GroupContext context, MpiComm comm)
      : ProcessGroup(std::move(context)), comm_(std::move(comm)) {
    set_error_handler();
    start();
  }
  ~MpiProcessGroup() override { stop(); }

  const char* backend_name() const override { return "mpi"; }

 protected:
  void run(const Collective& c, Deadline deadline) override {
    MPI_Request request = MPI_REQUEST_NULL;
    const MPI_Datatype type = mpi_type(c.input.dtype);
    const MPI_Comm comm = comm_.get();
    // In-place allgather / reduce_scatter (ProcessGroup::enqueue allows only this rank's
    // block): MPI forbids aliased send and receive buffers, so the input is copied aside.
    // (MPI_IN_PLACE would need every rank to pass it, and each rank decides alone here;
    // reduce_scatter's MPI_IN_PLACE also puts the result at the start of the buffer.)
    const void* send = c.input.data;
    std::unique_ptr<char[]> input_copy;
    if ((c.op == CollectiveOp::kAllgather || c.op == CollectiveOp::kReduceScatter) && c.input.count > 0 &&
        c.input.overlaps(c.output)) {
      input_copy = std::make_unique<char[]>(c.input.nbytes());
      std::memcpy(input_copy.get(), c.input.data, c.input.nbytes());
      send = input_copy.get();
    }
    {
      std::lock_guard<std::mutex> lock(mpi_call_mutex());
      switch (c.op) {
        case CollectiveOp::kAllreduce:
          MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, c.input.data, mpi_count(c.input.count, "allreduce"),
                                   type, mpi_op(c.input.dtype, c.reduce_op), comm, &request));
          break;
        case CollectiveOp::kBroadcast:
          MPI_CHECK(MPI_Ibcast(c.input.data, mpi_count(c.input.count, "broadcast"), type, c.peer,
                               comm, &request));
          break;
        case CollectiveOp::kReduce:
          MPI_CHECK(MPI_Ireduce(rank() == c.peer ? MPI_IN_PLACE : c.input.data,
                                rank() == c.peer ? c.input.data : nullptr,
                                mpi_count(c.input.count, "reduce"), type,
                                mpi_op(c.input.dtype, c.reduce_op), c.peer, comm, &request));
          break;
        case CollectiveOp::kAllgather:
          MPI_CHECK(MPI_Iallgather(send, mpi_count(c.input.count, "allgather"), type, c.output.data,
                                   static_cast<int>(c.input.count), type, comm, &request));
          break;
        case CollectiveOp::kReduceScatter:
          MPI_CHECK(MPI_Ireduce_scatter_block(send, c.output.data,
                                              mpi_count(c.output.count, "reduce_scatter"), type,
                                              mpi_op(c.input.dtype, c.reduce_op), comm, &request));
          break;
        case CollectiveOp::kAllToAll: {
          int block = mpi_count(c.input.count / size(), "all_to_all");
          MPI_CHECK(MPI_Ialltoall(c.input.data, block, type, c.output.data, block, type, comm,
                                  &request));
          break;
        }
        case CollectiveOp::kBarrier:
          MPI_CHECK(MPI_Ibarrier(comm, &request));
          break;
        case CollectiveOp::kSend:
          MPI_CHECK(MPI_Isend(c.input.data, mpi_count(c.input.count, "send"), type, c.peer, c.tag,
                              comm, &request));
          break;
        case CollectiveOp::kRecv:
          MPI_CHECK(MPI_Irecv(c.input.data, mpi_count(c.input.count, "recv"), type, c.peer, c.tag,
                              comm, &request));
          break;
      }
    }
    MPI_Status status;
    try {
      wait(request, c, deadline, &status);
    } catch (...) {
      (void)input_copy.release();  // MPI may still read it: it cannot cancel the request
      throw;
    }
    if (c.op == CollectiveOp::kRecv) {
      // MPI accepts a message shorter than the receive buffer (only a longer one is an
      // error, MPI_ERR_TRUNCATE) and leaves the rest of the buffer as it was: check the
      // size here, as the ring backend does.
      int received = 0;
      {
        std::lock_guard<std::mutex> lock(mpi_call_mutex());
        MPI_CHECK(MPI_Get_count(&status, type, &received));
      }
      if (received == MPI_UNDEFINED || static_cast<size_t>(received) != c.input.count) {
        throw CommError(detail::concat(
            "recv from rank ", context().world_ranks[c.peer], " expected tag ", c.tag, " with ", c.input.count, " ",
            dtype_name(c.input.dtype), " elements, but the peer sent ",
            received == MPI_UNDEFINED ? std::string("a message that is not a whole number of them")
                                      : detail::concat(received),
            "; give the send and the recv the same count and dtype"));
      }
    }
    if (c.reduce_op == ReduceOp::kAvg) {
      if (c.op == CollectiveOp::kAllreduce || (c.op == CollectiveOp::kReduce && rank() == c.peer)) {
        scale_for_average(c.input.data, c.input.count, c.input.dtype, size());
      } else if (c.op == CollectiveOp::kReduceScatter) {
        scale_for_average(c.output.data, c.output.count, c.output.dtype, size());
      }
    }
  }

  std::shared_ptr<ProcessGroup> create_subgroup(GroupContext context, int color, int key) override {
    MPI_Comm split = MPI_COMM_NULL;
    {
      // MPI_Comm_split blocks until every rank of this group has called it. Held under
      // the process-wide mpi_call_mutex, it would keep every other MPI call of this
      // process waiting meanwhile: another group's comm thread, and a split of another
      // group on another thread. Two threads splitting two groups at once then hung
      // forever whenever the ranks entered the two splits in different orders (each
      // rank's first split waited for a peer whose other split held its mutex;
      // SubGroups.ConcurrentSplitsOfTwoGroupsOnTwoThreads). With MPI_THREAD_MULTIPLE
      // MPI needs no mutex for it; without it, MPI requires the calls serialized, so
      // splits of different groups must not run concurrently (docs/comm.md).
      std::unique_lock<std::mutex> lock(mpi_call_mutex(), std::defer_lock);
      if (!mpi_thread_multiple()) lock.lock();
      MPI_CHECK(MPI_Comm_split(comm_.get(), color < 0 ? MPI_UNDEFINED : color, key, &split));
    }
    if (color < 0) return nullptr;
    return std::make_shared<MpiProcessGroup>(std::move(context), MpiComm(split));
  }

 private:
  // Errors come back as codes (MPI_CHECK names them) instead of aborting the job. Other
  // groups' comm threads are polling meanwhile: serialized with them.
  void set_error_handler() {
    std::lock_guard<std::mutex> lock(mpi_call_mutex());
    MPI_CHECK(MPI_Comm_set_errhandler(comm_.get(), MPI_ERRORS_RETURN));
  }

  // Polls the request: spin a little (latency), then yield the core. Every
  // kMemberCheck it also looks in the store for a member that failed (one that threw,
  // or aborted this group, stays alive and never joins this collective: MPI would
  // wait for it until the deadline), and then gives up with that member's reason.
  void wait(MPI_Request& request, const Collective& c, Deadline deadline, MPI_Status* status) {
    constexpr auto kMemberCheck = std::chrono::milliseconds(500);
    auto next_check = Clock::now() + kMemberCheck;
    for (uint64_t round = 0;; ++round) {
      int done = 0;
      {
        std::lock_guard<std::mutex> lock(mpi_call_mutex());
        MPI_CHECK(MPI_Test(&request, &done, status));
      }
      if (done) return;
      if (round > 1000) std::this_thread::yield();
      if ((round & 255) != 0) continue;
      const auto now = Clock::now();
      if (now >= deadline) {
        throw CommTimeoutError(detail::concat(
            "MPI request of ", describe(c), " did not complete before the deadline (MPI cannot "
            "cancel it; this group is unusable)"));
      }
      if (now >= next_check) {
        next_check = now + kMemberCheck;
        // This group was aborted (by this process: the Trainer, DDP, or a rank leaving on
        // an exception): MPI cannot cancel the request, but nobody will wait for it now.
        if (failed()) {
          throw CommError(detail::concat("mpi backend: ", describe(c), " given up: this group was aborted "
                                         "(MPI cannot cancel the request; the group is unusable)"));
        }
        try {
          throw_if_member_failed(describe(c));  // PeerLostError; explain_failure quotes the member
        } catch (const PeerLostError&) {
          throw;
        } catch (const std::exception&) {
          // The store is unreachable (rank 0 has exited): MPI itself reports a dead
          // process, so keep waiting on it without asking the store again.
          next_check = Deadline::max();
        }
      }
    }
  }
  // A request given up on stays active inside MPI (it cannot be cancelled).
  bool may_write_after_giving_up() const override { return true; }

  MpiComm comm_;
};

}  // namespace

std::shared_ptr<ProcessGroup> make_mpi_process_group(GroupContext context) {
  return std::make_shared<MpiProcessGroup>(std::move(context));
}

}  // namespace ringtrain::comm
