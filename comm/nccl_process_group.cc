// nccl_process_group.cc: NcclProcessGroup, NCCL (CUDA builds only).
//
// The group owns one NCCL communicator (NcclComm, RAII: ncclCommFinalize +
// ncclCommDestroy, or ncclCommAbort after a failure) and one CUDA stream of its
// own. The unique id NCCL needs to bootstrap is made by rank 0 and shared
// through the store.
//
// Nothing waits inside NCCL. The communicator is created nonblocking
// (ncclConfig_t::blocking = 0): every NCCL call returns at once, with
// ncclInProgress while it is still working, and we poll ncclCommGetAsyncError.
// So a member that dies before ncclCommInitRankConfig completes costs the
// others at most the group's timeout (and less if it published an error),
// where the blocking ncclCommInitRank would wait forever. Each collective is
// launched on the group's stream; the comm thread then records an event and
// polls it, checking ncclCommGetAsyncError and the deadline, so a hung NCCL
// kernel becomes a CommTimeoutError (and an abort of the communicator)
// instead of a hang. The price: in nonblocking mode NCCL may run each group
// launch on a helper thread. Measured on one H100 at one rank, it cost nothing
// visible (8 B to 16 KiB: 8.4-11.4 us either way; docs/gpu-validation.md);
// RINGTRAIN_NCCL_NONBLOCKING=0 chooses blocking mode, without the init
// deadline. NCCL_COMM_BLOCKING=1, NCCL's own variable, overrides us as well.
//
// Aborts from other threads. NCCL forbids using one communicator from two
// threads at once, and ncclCommAbort is a use. ProcessGroup::abort() and
// split() may fail the group from the caller's thread while the comm thread
// is polling a collective, so every use of the communicator holds NcclComm's
// mutex; abort() raises a flag first, the comm thread's poll loops see it,
// abort the communicator themselves and give up, and the mutex then lets
// abort() through to a communicator that is already aborted (or, if the comm
// thread was idle, abort it itself). Before the NCCL call the group's stream
// waits, on the device, for the event the caller's stream recorded when the
// collective was issued (Collective::ready_event), so the inputs are ready and
// no thread blocks on them.
//
// Host buffers are accepted too, since DDP, the loss scaler and the Trainer
// exchange small host values (parameter shapes, the overflow flag, metrics)
// through whichever group they were given, as they would on the ring or mpi
// backend. NCCL itself reads and writes device memory only, so run() stages a
// host buffer through device scratch memory: the host-to-device copy, the NCCL
// call and the copy back are all queued on the group's stream, in that order,
// through a pinned host buffer (see HostStage for why not the user's memory).
// That costs two copies plus the launch latency; it is meant for small control
// data, and the ring or mpi backend is the one for large host buffers.
//
// NCCL refuses two ranks on one GPU ("Duplicate GPU detected"): on a one-GPU
// machine, multi-rank tests use the ring backend (CUDA IPC or host staging).
#include <cuda_runtime.h>
#include <nccl.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <mutex>
#include <thread>

#include "comm/backends.h"
#include "comm/cuda_staging.h"
#include "comm/init.h"
#include "tensor/cuda/runtime.h"
#include "tensor/storage.h"

namespace ringtrain::comm {

namespace {

ncclDataType_t nccl_type(DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return ncclFloat32;
    case DType::kFloat64: return ncclFloat64;
    case DType::kFloat16: return ncclFloat16;
    case DType::kBFloat16: return ncclBfloat16;
    case DType::kInt32: return ncclInt32;
    case DType::kInt64: return ncclInt64;
  }
  return ncclFloat32;
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return ncclSum;
    case ReduceOp::kAvg: return ncclAvg;
    case ReduceOp::kMax: return ncclMax;
    case ReduceOp::kMin: return ncclMin;
    case ReduceOp::kProd: return ncclProd;
  }
  return ncclSum;
}

// Owns an ncclComm_t made nonblocking, and serialises its use (file comment).
class NcclComm {
 public:
  // Runs between polls; throws to give up waiting (deadline, a member that failed).
  using Check = std::function<void()>;

  NcclComm() = default;
  ~NcclComm() { shut_down(); }
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;

  // `nonblocking` false gives a blocking communicator (RINGTRAIN_NCCL_NONBLOCKING=0):
  // then init has no deadline. Creation is slow work: it is polled every millisecond.
  void init(int device, int size, const ncclUniqueId& id, int rank, bool nonblocking,
            const Check& check) {
    std::lock_guard<std::mutex> lock(mutex_);
    device_ = device;
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = nonblocking ? 0 : 1;
    settle(ncclCommInitRankConfig(&comm_, size, id, rank, &config), "ncclCommInitRankConfig", check,
           std::chrono::milliseconds(1));
  }

  // Held by the comm thread around every use of get().
  std::unique_lock<std::mutex> lock() { return std::unique_lock<std::mutex>(mutex_); }
  ncclComm_t get() const { return comm_; }

  // Waits, with the lock held, until a call that answered `result` has taken
  // effect: a nonblocking call may answer ncclInProgress, and no other call may
  // follow until the communicator's state says ncclSuccess. Throws (after
  // aborting the communicator) on an NCCL error, on abort(), or when `check` does.
  void settle(ncclResult_t result, const char* call, const Check& check,
              std::chrono::microseconds poll_sleep = std::chrono::microseconds(0)) {
    while (true) {
      if (result == ncclSuccess) {
        give_up_if_aborted(call);
        return;
      }
      if (result != ncclInProgress) {
        std::string message = detail::concat("nccl backend: ", call, " failed: ",
                                             ncclGetErrorString(result));
        if (const char* last = ncclGetLastError(comm_); last != nullptr && *last != '\0')
          message += detail::concat(" (", last, ")");
        abort_locked();
        throw CommError(message);
      }
      give_up_if_aborted(call);
      try {
        check();
      } catch (...) {
        abort_locked();
        throw;
      }
      if (poll_sleep.count() > 0) std::this_thread::sleep_for(poll_sleep);
      else std::this_thread::yield();
      ncclResult_t state = ncclSuccess;
      const ncclResult_t asked = ncclCommGetAsyncError(comm_, &state);
      result = asked != ncclSuccess ? asked : state;
    }
  }

  // With the lock held, in a poll loop: an abort() requested by another thread
  // aborts the communicator here and ends the wait.
  void give_up_if_aborted(const char* during) {
    if (!abort_requested_.load(std::memory_order_acquire)) return;
    abort_locked();
    throw CommError(detail::concat("nccl backend: ", during,
                                   " was interrupted: the process group was aborted"));
  }

  bool abort_requested() const { return abort_requested_.load(std::memory_order_acquire); }

  // Any thread: kills outstanding kernels and frees the communicator.
  void abort() {
    abort_requested_.store(true, std::memory_order_release);
    std::lock_guard<std::mutex> lock(mutex_);  // the comm thread lets go at its next poll
    abort_locked();
  }
  // With the lock held. NCCL restores the calling thread's device around the
  // abort; on a thread that never chose one (a watchdog calling abort()) that
  // would create a context on GPU 0, so the thread is put on our device first.
  void abort_locked() {
    if (comm_ != nullptr && !aborted_) {
      cuda::QuietDeviceGuard on_device(device_);  // if the runtime is failing: abort from wherever we are
      (void)ncclCommAbort(comm_);
    }
    aborted_ = true;
  }

 private:
  // A healthy communicator is finalized (its outstanding work flushed) and
  // destroyed; one that does not settle within kFinalizeGrace, or that failed, is aborted.
  void shut_down() noexcept {
    static constexpr auto kFinalizeGrace = std::chrono::seconds(30);
    std::lock_guard<std::mutex> lock(mutex_);
    if (comm_ == nullptr) return;
    if (!aborted_) {
      cuda::QuietDeviceGuard on_device(device_);  // as in abort_locked()
      ncclResult_t result = ncclCommFinalize(comm_);
      for (const auto until = Clock::now() + kFinalizeGrace;
           result == ncclInProgress && Clock::now() < until;) {
        std::this_thread::sleep_for(std::chrono::microseconds(100));
        ncclResult_t state = ncclSuccess;
        const ncclResult_t asked = ncclCommGetAsyncError(comm_, &state);
        result = asked != ncclSuccess ? asked : state;
      }
      if (result == ncclSuccess) {
        (void)ncclCommDestroy(comm_);
        comm_ = nullptr;
        return;
      }
    }
    abort_locked();
    comm_ = nullptr;
  }

  std::mutex mutex_;
  int device_ = 0;
  ncclComm_t comm_ = nullptr;
  bool aborted_ = false;                    // guarded by mutex_
  std::atomic<bool> abort_requested_{false};  // read by poll loops without taking mutex_ again
};

// RINGTRAIN_NCCL_NONBLOCKING: 1 (default) or 0. See the file comment for why
// nonblocking is the default; 0 gives NCCL's blocking mode (and no init deadline).
bool nonblocking_from_environment() {
  const char* value = std::getenv("RINGTRAIN_NCCL_NONBLOCKING");
  if (value == nullptr || *value == '\0' || std::strcmp(value, "1") == 0) return true;
  if (std::strcmp(value, "0") == 0) return false;
  throw CommError(detail::concat("RINGTRAIN_NCCL_NONBLOCKING='", value, "' must be 0 or 1"));
}

class NcclProcessGroup final : public ProcessGroup {
 public:
  explicit NcclProcessGroup(GroupContext context) : ProcessGroup(std::move(context)) {
    if (!cuda::is_available()) {
      throw CommError(detail::concat("nccl backend: no usable GPU (", cuda::unavailable_reason(),
                                     "); use the ring or mpi backend"));
    }
    device_ = options().cuda_device >= 0 ? options().cuda_device : local_cuda_device();
    cuda::set_device(device_);
    ncclUniqueId id;
    const std::string key = this->context().prefix + "/nccl_unique_id";
    if (rank() == 0) {
      NCCL_CHECK(ncclGetUniqueId(&id));
      store().set(key, std::string(reinterpret_cast<const char*>(&id), sizeof(id)));
    } else {
      // In slices: a rank 0 that failed first is reported as such, not as a timeout.
      std::string bytes = await_member_key(key, "rank 0's NCCL unique id");
      RT_CHECK(bytes.size() == sizeof(id), "nccl backend: the unique id in the store has ",
               bytes.size(), " bytes, expected ", sizeof(id));
      std::memcpy(&id, bytes.data(), sizeof(id));
    }
    // Every member must reach this call; one that never does (it died, or failed
    // before it) would leave the others waiting. So: a deadline, and a look at
    // the store for a member's published error every kMemberCheckEvery.
    static constexpr auto kMemberCheckEvery = std::chrono::milliseconds(250);
    const Deadline deadline = Clock::now() + setup_timeout();
    Deadline next_member_check = Clock::now() + kMemberCheckEvery;
    comm_.init(device_, size(), id, rank(), nonblocking_from_environment(), [&] {
      const auto now = Clock::now();
      if (now >= next_member_check) {
        next_member_check = now + kMemberCheckEvery;
        throw_if_member_failed("NCCL communicator creation (ncclCommInitRankConfig)");
      }
      if (now >= deadline) {
        throw CommTimeoutError(detail::concat(
            "nccl backend: ncclCommInitRankConfig on rank ", rank(), "/", size(),
            " did not complete within ", setup_timeout().count(),
            " ms: some member of the group never reached it (it died, hangs, or uses another "
            "store or world size). Check every rank's log; raise the limit with "
            "RINGTRAIN_RENDEZVOUS_TIMEOUT_SEC (the world group) or RINGTRAIN_TIMEOUT_SEC"));
      }
    });
    stream_ = cuda::Stream::create(device_);
    done_ = cuda::Event::create(device_);
    start();
  }
  ~NcclProcessGroup() override { stop(); }

  const char* backend_name() const override { return "nccl"; }

 protected:
  bool handles_device_buffers() const override { return true; }

  void run(const Collective& collective, Deadline deadline) override {
    // A communicator serves one GPU: a buffer on another one would reach NCCL through
    // peer access at best, or end in an illegal address that poisons the context.
    for (const BufferRef* b : {&collective.input, &collective.output})
      RT_CHECK(b->data == nullptr || !b->device.is_cuda() || b->device.index == device_, "nccl backend: ",
               describe(collective), " has a buffer on ", b->device.str(), " but this group's communicator is on cuda:",
               device_, "; move the tensor there (or create the group on that GPU)");
    // Host buffers may run inline on the caller's thread: leave its device as it was.
    cuda::DeviceGuard on_group_device(device_);
    // The communicator is ours until run() returns; abort() waits for our next poll.
    std::unique_lock<std::mutex> using_comm = comm_.lock();
    if (comm_.abort_requested()) comm_.give_up_if_aborted(describe(collective).c_str());
    auto stream = static_cast<cudaStream_t>(stream_.handle());
    // 1. Host buffers move to device scratch memory (see the file comment).
    Collective c = collective;
    HostStage input_stage, output_stage;
    if (c.op != CollectiveOp::kBarrier) {
      stage_in(c.input, c.op != CollectiveOp::kRecv, input_stage, stream);
      if (uses_output(c.op)) stage_in(c.output, false, output_stage, stream);
    }
    // 2. The NCCL call on the group's stream, once the caller's stream has produced
    //    the input (a device-side wait: this thread does not block on it).
    stream_wait_event(stream, collective.ready_event);
    launch(c, stream, deadline);
    // 3. Results go back towards the host buffers, still in stream order ...
    const bool input_back = input_stage.device && is_in_place(c.op);
    if (input_back) queue_copy_out(input_stage, stream);
    if (output_stage.device) queue_copy_out(output_stage, stream);
    wait_for_stream(c, deadline);
    // ... and into them once the stream is done.
    if (input_back) input_stage.finish(collective.input);
    if (output_stage.device) output_stage.finish(collective.output);
  }

  std::shared_ptr<ProcessGroup> create_subgroup(GroupContext context, int color, int) override {
    if (color < 0) return nullptr;
    return std::make_shared<NcclProcessGroup>(std::move(context));
  }

  // May run on any thread (abort(), a failed split()): NcclComm serialises it with run().
  void close_transports() override { comm_.abort(); }

 private:
  // A host buffer's stand-ins: device scratch memory for NCCL and a pinned host
  // buffer for the copies. Copies between device and pageable memory may return
  // before the bytes have landed (the driver stages them itself), so the copies
  // on the stream only ever touch pinned memory, and the pageable user buffer is
  // read before the stream starts and written after it has finished.
  struct HostStage {
    DataPtr device;
    DataPtr pinned;
    size_t nbytes = 0;
    void finish(const BufferRef& host) const { std::memcpy(host.data, pinned.get(), nbytes); }
  };

  // Points `buffer` at new device scratch memory if it is a host buffer, copying
  // the host bytes in first when `copy_in`.
  void stage_in(BufferRef& buffer, bool copy_in, HostStage& stage, cudaStream_t stream) {
    if (!buffer.device.is_cpu() || buffer.nbytes() == 0) return;
    stage.nbytes = buffer.nbytes();
    {
      // Allocated as the group stream's memory: the caching allocator hands a block
      // straight back to the stream that freed it, ordered after that stream's
      // pending kernels, so a block taken on the caller's stream could still be in
      // use there while NCCL writes it (that corrupted DDP's bucket order once).
      cuda::StreamGuard on_group_stream(stream_);
      stage.device = allocate_bytes(stage.nbytes, Device::cuda(device_));
    }
    stage.pinned = allocate_pinned_host_bytes(stage.nbytes);
    if (copy_in) {
      std::memcpy(stage.pinned.get(), buffer.data, stage.nbytes);
      CUDA_CHECK(cudaMemcpyAsync(stage.device.get(), stage.pinned.get(), stage.nbytes, cudaMemcpyHostToDevice,
                                 stream));
      // If a failure releases the buffer with this copy still queued, it is not
      // handed out again before the copy has read it.
      cuda::record_host_stream(stage.pinned.get(), stream_);
    }
    buffer.data = stage.device.get();
    buffer.device = Device::cuda(device_);
  }
  void queue_copy_out(const HostStage& stage, cudaStream_t stream) {
    CUDA_CHECK(cudaMemcpyAsync(stage.pinned.get(), stage.device.get(), stage.nbytes, cudaMemcpyDeviceToHost,
                               stream));
    cuda::record_host_stream(stage.pinned.get(), stream_);  // the same, for the copy back
  }

  // Queues the NCCL call(s) for `c` on `stream`. Each call is settled before the
  // next (nonblocking mode may answer ncclInProgress); the deadline bounds that.
  void launch(const Collective& c, cudaStream_t stream, Deadline deadline) {
    const ncclDataType_t type = nccl_type(c.input.dtype);
    ncclComm_t comm = comm_.get();
    void* data = c.input.data;
    const std::string what = describe(c);
    auto settle = [&](ncclResult_t result, const char* call) {
      comm_.settle(result, call, [&] {
        if (Clock::now() >= deadline)
          throw CommTimeoutError(detail::concat("nccl backend: ", what, ": ", call,
                                                " did not complete before the deadline"));
      });
    };
    switch (c.op) {
      case CollectiveOp::kAllreduce:
        settle(ncclAllReduce(data, data, c.input.count, type, nccl_op(c.reduce_op), comm, stream),
               "ncclAllReduce");
        break;
      case CollectiveOp::kBroadcast:
        settle(ncclBroadcast(data, data, c.input.count, type, c.peer, comm, stream), "ncclBroadcast");
        break;
      case CollectiveOp::kReduce:
        settle(ncclReduce(data, data, c.input.count, type, nccl_op(c.reduce_op), c.peer, comm, stream),
               "ncclReduce");
        break;
      case CollectiveOp::kAllgather:
        settle(ncclAllGather(data, c.output.data, c.input.count, type, comm, stream), "ncclAllGather");
        break;
      case CollectiveOp::kReduceScatter:
        settle(ncclReduceScatter(data, c.output.data, c.output.count, type, nccl_op(c.reduce_op), comm,
                                 stream),
               "ncclReduceScatter");
        break;
      case CollectiveOp::kAllToAll: {
        const size_t block = c.input.count / size();
        const size_t block_bytes = block * dtype_size(c.input.dtype);
        // Nothing may throw (or abort, which NCCL would only queue) while the
        // group is open: note the first failure, always close the group, then settle.
        NCCL_CHECK(ncclGroupStart());
        ncclResult_t first_failure = ncclSuccess;
        const char* failed_call = "";
        for (int peer = 0; peer < size() && first_failure == ncclSuccess; ++peer) {
          ncclResult_t sent = ncclSend(static_cast<char*>(data) + peer * block_bytes, block, type, peer, comm,
                                       stream);
          if (sent != ncclSuccess) {
            first_failure = sent;
            failed_call = "ncclSend";
            break;
          }
          ncclResult_t received = ncclRecv(static_cast<char*>(c.output.data) + peer * block_bytes, block, type,
                                           peer, comm, stream);
          if (received != ncclSuccess) {
            first_failure = received;
            failed_call = "ncclRecv";
          }
        }
        settle(ncclGroupEnd(), "ncclGroupEnd");
        if (first_failure != ncclSuccess) settle(first_failure, failed_call);
        break;
      }
      case CollectiveOp::kBarrier: {
        if (!barrier_scratch_) CUDA_CHECK(cudaMalloc(&barrier_scratch_, sizeof(int)));
        settle(ncclAllReduce(barrier_scratch_, barrier_scratch_, 1, ncclInt32, ncclSum, comm, stream),
               "ncclAllReduce (barrier)");
        break;
      }
      case CollectiveOp::kSend:
        settle(ncclSend(data, c.input.count, type, c.peer, comm, stream), "ncclSend");
        break;
      case CollectiveOp::kRecv:
        settle(ncclRecv(data, c.input.count, type, c.peer, comm, stream), "ncclRecv");
        break;
    }
  }

  // Records the group's event after everything queued and polls it (with the
  // communicator's lock held, see run()).
  void wait_for_stream(const Collective& c, Deadline deadline) {
    ncclComm_t comm = comm_.get();
    done_.record(stream_);
    const std::string what = describe(c);
    // Poll instead of cudaEventSynchronize: a dead peer must become an error, not a hang.
    while (!done_.query()) {
      comm_.give_up_if_aborted(what.c_str());
      ncclResult_t async_error = ncclSuccess;
      NCCL_CHECK(ncclCommGetAsyncError(comm, &async_error));
      if (async_error != ncclSuccess && async_error != ncclInProgress) {
        comm_.abort_locked();
        throw CommError(detail::concat("nccl backend: ", what, " failed: ",
                                       ncclGetErrorString(async_error)));
      }
      if (Clock::now() >= deadline) {
        comm_.abort_locked();
        throw CommTimeoutError(detail::concat("nccl backend: ", what,
                                              " did not finish before the deadline"));
      }
      std::this_thread::yield();
    }
  }

  int device_ = 0;
  NcclComm comm_;
  cuda::Stream stream_;
  cuda::Event done_;
  void* barrier_scratch_ = nullptr;  // one int on the device for barrier(); never freed before exit
};

}  // namespace

std::shared_ptr<ProcessGroup> make_nccl_process_group(GroupContext context) {
  return std::make_shared<NcclProcessGroup>(std::move(context));
}

bool nccl_is_built() { return true; }

}  // namespace ringtrain::comm
