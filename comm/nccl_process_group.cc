// nccl_process_group.cc: NcclProcessGroup, NCCL (CUDA builds only).
//
// The group owns one NCCL communicator (NcclComm, RAII: ncclCommDestroy, or
// ncclCommAbort after a failure) and one CUDA stream of its own. The unique id
// NCCL needs to bootstrap is made by rank 0 and shared through the store.
// Each collective is launched on the group's stream; the comm thread then
// records an event and polls it, checking ncclCommGetAsyncError and the
// deadline, so a hung NCCL kernel becomes a CommTimeoutError (and an abort of
// the communicator) instead of a hang. Before the NCCL call the group's stream
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

#include <cstring>
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

// Owns an ncclComm_t.
class NcclComm {
 public:
  NcclComm() = default;
  ~NcclComm() { reset(); }
  NcclComm(NcclComm&& other) noexcept : comm_(other.comm_), aborted_(other.aborted_) {
    other.comm_ = nullptr;
  }
  NcclComm& operator=(NcclComm&& other) noexcept {
    if (this != &other) {
      reset();
      comm_ = other.comm_;
      aborted_ = other.aborted_;
      other.comm_ = nullptr;
    }
    return *this;
  }
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;

  static NcclComm init(int size, const ncclUniqueId& id, int rank) {
    NcclComm comm;
    NCCL_CHECK(ncclCommInitRank(&comm.comm_, size, id, rank));
    return comm;
  }
  ncclComm_t get() const { return comm_; }
  // After a failure: kills outstanding kernels; the destructor then only forgets the handle.
  void abort() {
    if (comm_ && !aborted_) ncclCommAbort(comm_);
    aborted_ = true;
  }

 private:
  void reset() {
    if (comm_ && !aborted_) ncclCommDestroy(comm_);
    comm_ = nullptr;
  }
  ncclComm_t comm_ = nullptr;
  bool aborted_ = false;
};

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
      std::string bytes = store().get(key, options().timeout);
      RT_CHECK(bytes.size() == sizeof(id), "nccl backend: the unique id in the store has ",
               bytes.size(), " bytes, expected ", sizeof(id));
      std::memcpy(&id, bytes.data(), sizeof(id));
    }
    comm_ = NcclComm::init(size(), id, rank());
    stream_ = cuda::Stream::create(device_);
    done_ = cuda::Event::create(device_);
    start();
  }
  ~NcclProcessGroup() override { stop(); }

  const char* backend_name() const override { return "nccl"; }

 protected:
  bool handles_device_buffers() const override { return true; }

  void run(const Collective& collective, Deadline deadline) override {
    // Host buffers may run inline on the caller's thread: leave its device as it was.
    cuda::DeviceGuard on_group_device(device_);
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
    launch(c, stream);
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
    }
    buffer.data = stage.device.get();
    buffer.device = Device::cuda(device_);
  }
  void queue_copy_out(const HostStage& stage, cudaStream_t stream) {
    CUDA_CHECK(cudaMemcpyAsync(stage.pinned.get(), stage.device.get(), stage.nbytes, cudaMemcpyDeviceToHost,
                               stream));
  }

  void launch(const Collective& c, cudaStream_t stream) {
    const ncclDataType_t type = nccl_type(c.input.dtype);
    ncclComm_t comm = comm_.get();
    void* data = c.input.data;
    switch (c.op) {
      case CollectiveOp::kAllreduce:
        NCCL_CHECK(ncclAllReduce(data, data, c.input.count, type, nccl_op(c.reduce_op), comm, stream));
        break;
      case CollectiveOp::kBroadcast:
        NCCL_CHECK(ncclBroadcast(data, data, c.input.count, type, c.peer, comm, stream));
        break;
      case CollectiveOp::kReduce:
        NCCL_CHECK(ncclReduce(data, data, c.input.count, type, nccl_op(c.reduce_op), c.peer, comm, stream));
        break;
      case CollectiveOp::kAllgather:
        NCCL_CHECK(ncclAllGather(data, c.output.data, c.input.count, type, comm, stream));
        break;
      case CollectiveOp::kReduceScatter:
        NCCL_CHECK(ncclReduceScatter(data, c.output.data, c.output.count, type, nccl_op(c.reduce_op),
                                     comm, stream));
        break;
      case CollectiveOp::kAllToAll: {
        const size_t block = c.input.count / size();
        const size_t block_bytes = block * dtype_size(c.input.dtype);
        NCCL_CHECK(ncclGroupStart());
        for (int peer = 0; peer < size(); ++peer) {
          NCCL_CHECK(ncclSend(static_cast<char*>(data) + peer * block_bytes, block, type, peer, comm, stream));
          NCCL_CHECK(ncclRecv(static_cast<char*>(c.output.data) + peer * block_bytes, block, type, peer,
                              comm, stream));
        }
        NCCL_CHECK(ncclGroupEnd());
        break;
      }
      case CollectiveOp::kBarrier: {
        if (!barrier_scratch_) CUDA_CHECK(cudaMalloc(&barrier_scratch_, sizeof(int)));
        NCCL_CHECK(ncclAllReduce(barrier_scratch_, barrier_scratch_, 1, ncclInt32, ncclSum, comm, stream));
        break;
      }
      case CollectiveOp::kSend:
        NCCL_CHECK(ncclSend(data, c.input.count, type, c.peer, comm, stream));
        break;
      case CollectiveOp::kRecv:
        NCCL_CHECK(ncclRecv(data, c.input.count, type, c.peer, comm, stream));
        break;
    }
  }

  // Records the group's event after everything queued and polls it.
  void wait_for_stream(const Collective& c, Deadline deadline) {
    ncclComm_t comm = comm_.get();
    done_.record(stream_);
    // Poll instead of cudaEventSynchronize: a dead peer must become an error, not a hang.
    while (!done_.query()) {
      ncclResult_t async_error = ncclSuccess;
      NCCL_CHECK(ncclCommGetAsyncError(comm, &async_error));
      if (async_error != ncclSuccess) {
        comm_.abort();
        throw CommError(detail::concat("nccl backend: ", describe(c), " failed: ",
                                       ncclGetErrorString(async_error)));
      }
      if (Clock::now() >= deadline) {
        comm_.abort();
        throw CommTimeoutError(detail::concat("nccl backend: ", describe(c),
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
