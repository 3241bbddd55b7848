// types.h: the vocabulary every comm file shares.
//
// defines: ReduceOp, CollectiveOp, BufferRef (a raw buffer: pointer, element
//          count, dtype, device), CommError and its two specific kinds
//          (PeerLostError, CommTimeoutError), Clock/Deadline.
//
// comm knows nothing of Tensor (design.md: "comm knows only tensor's
// DType/Device and raw buffers"); DDP hands it the bytes of a bucket.
#pragma once

#include <chrono>
#include <cstddef>
#include <string>

#include "tensor/checks.h"
#include "tensor/device.h"
#include "tensor/dtype.h"

namespace ringtrain::comm {

using Clock = std::chrono::steady_clock;
using Deadline = Clock::time_point;

// The default per-collective timeout (issue 4: "default 10 minutes").
inline constexpr std::chrono::milliseconds kDefaultTimeout = std::chrono::minutes(10);

enum class ReduceOp : uint8_t { kSum, kAvg, kMax, kMin, kProd };
const char* reduce_op_name(ReduceOp op);  // "sum", "avg", ...
ReduceOp parse_reduce_op(const std::string& name);

enum class CollectiveOp : uint8_t {
  kAllreduce, kBroadcast, kReduce, kAllgather, kReduceScatter, kAllToAll, kBarrier, kSend, kRecv
};
const char* collective_op_name(CollectiveOp op);  // "allreduce", "broadcast", ...
// The collectives that leave their result in `input` ...
inline bool is_in_place(CollectiveOp op) {
  return op == CollectiveOp::kAllreduce || op == CollectiveOp::kBroadcast ||
         op == CollectiveOp::kReduce || op == CollectiveOp::kRecv;
}
// ... and those that write a separate `output`.
inline bool uses_output(CollectiveOp op) {
  return op == CollectiveOp::kAllgather || op == CollectiveOp::kReduceScatter ||
         op == CollectiveOp::kAllToAll;
}

// A raw buffer handed to a collective. count is in elements of dtype.
struct BufferRef {
  void* data = nullptr;
  size_t count = 0;
  DType dtype = DType::kFloat32;
  Device device = Device::cpu();

  size_t nbytes() const { return count * dtype_size(dtype); }
  // Whether the two buffers share any byte (same device assumed).
  bool overlaps(const BufferRef& other) const {
    const auto* a = static_cast<const char*>(data);
    const auto* b = static_cast<const char*>(other.data);
    return a < b + other.nbytes() && b < a + nbytes();
  }
};

// Any failure of the communication layer.
class CommError : public Error {
 public:
  using Error::Error;
};

// A peer went away (its socket closed, its process is gone). rank() names it.
class PeerLostError : public CommError {
 public:
  PeerLostError(int rank, const std::string& what) : CommError(what), rank_(rank) {}
  int rank() const { return rank_; }

 private:
  int rank_;
};

// The store refused this client's hello (another job's token, or the previous group's
// store still up while this process joins a new one: init_process_group retries then).
class StoreRefusedError : public CommError {
 public:
  using CommError::CommError;
};

// A collective (or a wait on one) ran past its timeout.
class CommTimeoutError : public CommError {
 public:
  using CommError::CommError;
};

// Milliseconds left until `deadline` (0 when past), for poll() and condition waits.
int millis_until(Deadline deadline);

}  // namespace ringtrain::comm
