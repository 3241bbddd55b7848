#include "comm/process_group.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <exception>
#include <future>
#include <optional>
#include <thread>

#include <nlohmann/json.hpp>

#include "comm/cuda_staging.h"
#include "comm/reduce.h"
#include "tensor/storage.h"

namespace ringtrain::comm {

using nlohmann::json;

namespace {

// The error records a rank published, a list in the store (a rank may fail in a
// sub-group and later, for another reason, in the world group):
//   rt/error/<world rank>/count, rt/error/<world rank>/<0..count-1>.
std::string error_key(int world_rank) { return "rt/error/" + std::to_string(world_rank); }

// Whether a published error record concerns the group with store prefix `prefix`:
// records without a group (the process died) concern every group; a group's own
// record concerns it and the groups split from it (their prefixes extend its one).
bool record_concerns(const json& record, const std::string& prefix) {
  if (!record.contains("group")) return true;
  const std::string group = record["group"].get<std::string>();
  // "rt/world/split1" is an ancestor of "rt/world/split1/..." but not of "rt/world/split10".
  return prefix == group || prefix.rfind(group + "/", 0) == 0;
}

// The first record world rank `world_rank` published that concerns the group with
// store prefix `prefix` (its first explanation there is the one that counts).
std::optional<json> first_error_record(Store& store, int world_rank, const std::string& prefix) {
  const std::optional<std::string> count = store.try_get(error_key(world_rank) + "/count");
  if (!count) return std::nullopt;
  for (int64_t i = 0, n = std::stoll(*count); i < n; ++i) {
    // The count goes up before the record lands: a missing one is still being written.
    const std::optional<std::string> text = store.try_get(detail::concat(error_key(world_rank), "/", i));
    if (!text) continue;
    json record = json::parse(*text, nullptr, /*allow_exceptions=*/false);
    if (record.is_object() && record_concerns(record, prefix)) return record;
  }
  return std::nullopt;
}

}  // namespace

ProcessGroup::ProcessGroup(GroupContext context) : context_(std::move(context)) {
  RT_CHECK(context_.size >= 1 && context_.rank >= 0 && context_.rank < context_.size,
           "ProcessGroup: rank ", context_.rank, " out of range for size ", context_.size);
  RT_CHECK(static_cast<int>(context_.world_ranks.size()) == context_.size,
           "ProcessGroup: world_ranks has ", context_.world_ranks.size(), " entries for ",
           context_.size, " members");
}

ProcessGroup::~ProcessGroup() { stop(); }

void ProcessGroup::start() {
  worker_ = std::thread([this] { worker_loop(); });
}

void ProcessGroup::stop() {
  // Destroyed while an exception propagates: this rank failed, maybe alone (a path only
  // rank 0 writes to, say). Abort first, so that a collective in flight ends now instead
  // of at its timeout, and the peers fail at once, told where to look, instead of
  // waiting in their next collective for a rank that will never come.
  if (std::uncaught_exceptions() > 0 && !failed_.load()) {
    bool running = false;
    {
      std::lock_guard<std::mutex> lock(queue_mutex_);
      running = worker_.joinable();
    }
    if (running) abort("it left the group while an exception propagated (its own output has the error)");
  }
  {
    std::lock_guard<std::mutex> lock(queue_mutex_);
    if (!worker_.joinable()) return;
    stopping_ = true;
    queue_changed_.notify_all();
  }
  worker_.join();
  // The store lives in world rank 0's process: rank 0 must not leave (and take the
  // store with it) while other ranks may still use it, e.g. to read the error that
  // explains their failure. Everyone checks out; rank 0 waits until every rank has
  // checked out or is known gone (a minute at most; kFailureGrace after a failure).
  if (context_.is_world) {
    try {
      const std::string key = context_.prefix + "/shutdown";
      // Who checked out (wait_for_survivors asks), then how many (its first look).
      context_.store->set(detail::concat(key, "/", context_.rank), "");
      context_.store->add(key, 1);
      if (context_.rank == 0) wait_for_survivors(key);
    } catch (const std::exception&) {
      // best effort: a store that is gone cannot be waited on
    }
  }
}

// Without a failure here, up to a minute (the others may still be finishing their last
// steps), but no longer than until every rank that has not checked out is known gone: a
// rank killed after the last collective (its last will says so) made rank 0 sit out the
// whole minute at exit.
void ProcessGroup::wait_for_survivors(const std::string& key) {
  constexpr auto kFailureGrace = std::chrono::seconds(5);
  constexpr auto kShutdownGrace = std::chrono::seconds(60);
  // The scan below asks about every rank (about 2 requests each): every 250 ms, while
  // the count is asked every 20 ms, so a large world's rank 0 does not flood its own
  // store while the others are checking out.
  constexpr auto kScanEvery = std::chrono::milliseconds(250);
  const Deadline deadline = Clock::now() + (failed_ ? kFailureGrace : kShutdownGrace);
  Deadline next_scan = Clock::now();
  for (;; std::this_thread::sleep_for(std::chrono::milliseconds(20))) {
    if (Clock::now() >= deadline) return;
    // the usual end, one request: everyone has checked out
    if (context_.store->add(key, 0) >= context_.size) return;
    if (Clock::now() < next_scan) continue;
    next_scan = Clock::now() + kScanEvery;
    // ranks known to be gone: named dead by a peer, or dead of an uncaught exception
    std::vector<bool> gone(context_.size, false);
    for (int r = 0; r < context_.size; ++r) {
      std::optional<json> found = first_error_record(*context_.store, context_.world_ranks[r], context_.prefix);
      if (!found) continue;
      const json& record = *found;
      if (record["kind"] == "exception" &&
          record["message"].get<std::string>().rfind("uncaught exception", 0) == 0) {
        gone[r] = true;
      }
      int dead = record.value("dead_rank", -1);
      for (int q = 0; q < context_.size; ++q) {
        if (context_.world_ranks[q] == dead) gone[q] = true;
      }
    }
    // Done when every rank has checked out or is gone. Asked rank by rank, not by
    // comparing the count with the ranks not gone: a rank named by a peer (dead_rank)
    // may be alive and check out all the same (it aborted, it did not die), and
    // counted twice it let rank 0 leave, with the store, while a survivor was still
    // reading why its collective failed ("the store on rank 0 is unreachable too").
    bool everyone = true;
    for (int r = 0; r < context_.size && everyone; ++r) {
      everyone = gone[r] || context_.store->try_get(detail::concat(key, "/", r)).has_value();
    }
    if (everyone) return;
  }
}

std::string ProcessGroup::describe(const Collective& c) const {
  return describe_collective(c, backend_name(), context_.rank, context_.size);
}

std::string ProcessGroup::describe_collective(const Collective& c, const char* backend, int rank,
                                              int size) {
  if (c.split_index >= 0) {
    return detail::concat("split #", c.split_index, " (collective #", c.seq, ") on ", backend, " group rank ",
                          rank, "/", size);
  }
  std::string text = detail::concat(collective_op_name(c.op), " #", c.seq, " (");
  if (c.op != CollectiveOp::kBarrier) {
    text += detail::concat(dtype_name(c.input.dtype), " x ", c.input.count);
  }
  if (c.op == CollectiveOp::kAllreduce || c.op == CollectiveOp::kReduce ||
      c.op == CollectiveOp::kReduceScatter) {
    text += detail::concat(", ", reduce_op_name(c.reduce_op));
  }
  if (c.op == CollectiveOp::kBroadcast || c.op == CollectiveOp::kReduce) {
    text += detail::concat(", root ", c.peer);
  }
  if (c.op == CollectiveOp::kSend) text += detail::concat(", to ", c.peer, ", tag ", c.tag);
  if (c.op == CollectiveOp::kRecv) text += detail::concat(", from ", c.peer, ", tag ", c.tag);
  return text + detail::concat(") on ", backend, " group rank ", rank, "/", size);
}

// ---------------------------------------------------------------- issuing

// Each call only describes the collective (fields in Collective's declaration order) and
// queues it; enqueue() checks the arguments and hands it to the comm thread.
Work ProcessGroup::allreduce(BufferRef buffer, ReduceOp op, Launch launch) {
  return enqueue({.op = CollectiveOp::kAllreduce, .input = buffer, .reduce_op = op}, launch);
}

Work ProcessGroup::broadcast(BufferRef buffer, int root, Launch launch) {
  return enqueue({.op = CollectiveOp::kBroadcast, .input = buffer, .peer = root}, launch);
}

Work ProcessGroup::reduce(BufferRef buffer, int root, ReduceOp op, Launch launch) {
  return enqueue({.op = CollectiveOp::kReduce, .input = buffer, .reduce_op = op, .peer = root},
                 launch);
}

Work ProcessGroup::allgather(BufferRef input, BufferRef output, Launch launch) {
  return enqueue({.op = CollectiveOp::kAllgather, .input = input, .output = output}, launch);
}

Work ProcessGroup::reduce_scatter(BufferRef input, BufferRef output, ReduceOp op, Launch launch) {
  return enqueue(
      {.op = CollectiveOp::kReduceScatter, .input = input, .output = output, .reduce_op = op},
      launch);
}

Work ProcessGroup::all_to_all(BufferRef input, BufferRef output, Launch launch) {
  return enqueue({.op = CollectiveOp::kAllToAll, .input = input, .output = output}, launch);
}

Work ProcessGroup::barrier(Launch launch) {
  return enqueue({.op = CollectiveOp::kBarrier, .input = {.dtype = DType::kInt32}}, launch);
}

Work ProcessGroup::send(BufferRef buffer, int dst, int tag) {
  return enqueue({.op = CollectiveOp::kSend, .input = buffer, .peer = dst, .tag = tag});
}

Work ProcessGroup::recv(BufferRef buffer, int src, int tag) {
  return enqueue({.op = CollectiveOp::kRecv, .input = buffer, .peer = src, .tag = tag});
}

namespace {
// `part` is block `index` of `whole` (whole.data + index * part's bytes): the one layout
// in which allgather (input = this rank's block of the output) and reduce_scatter
// (output = this rank's block of the input) run in place on every backend.
bool is_block(const BufferRef& part, const BufferRef& whole, int index) {
  return static_cast<const char*>(part.data) ==
         static_cast<const char*>(whole.data) + static_cast<size_t>(index) * part.nbytes();
}
}  // namespace

Work ProcessGroup::enqueue(Collective c, Launch launch) {
  const char* name = collective_op_name(c.op);
  const int n = context_.size;
  RT_CHECK(c.input.data != nullptr || c.input.count == 0, name, ": null buffer with count ",
           c.input.count);
  if (uses_output(c.op)) {
    RT_CHECK(c.output.data != nullptr || c.output.count == 0, name, ": null output buffer");
    RT_CHECK(c.input.dtype == c.output.dtype, name, ": input is ", dtype_name(c.input.dtype),
             " but output is ", dtype_name(c.output.dtype));
    RT_CHECK(c.input.device == c.output.device, name, ": input on ", c.input.device.str(),
             " but output on ", c.output.device.str());
  }
  switch (c.op) {
    case CollectiveOp::kBroadcast:
    case CollectiveOp::kReduce:
      RT_CHECK(c.peer >= 0 && c.peer < n, name, ": root ", c.peer, " is not a rank of this group (size ", n, ")");
      break;
    case CollectiveOp::kSend:
    case CollectiveOp::kRecv:
      RT_CHECK(c.peer >= 0 && c.peer < n && c.peer != context_.rank, name, ": peer ", c.peer,
               " must be another rank of this group (this is rank ", context_.rank, " of ", n, ")");
      break;
    case CollectiveOp::kAllgather:
      RT_CHECK(c.output.count == c.input.count * n, "allgather: output has ", c.output.count,
               " elements; it needs size() * input.count = ", n, " * ", c.input.count);
      // Any other overlap is undefined for MPI and NCCL (and gave wrong results under mpi).
      RT_CHECK(c.input.count == 0 || !c.input.overlaps(c.output) || is_block(c.input, c.output, context_.rank),
               "allgather: the input overlaps the output other than as this rank's block; in place, "
               "the input must be exactly output + rank * count (rank ", context_.rank, "), else pass a "
               "separate input buffer");
      break;
    case CollectiveOp::kReduceScatter:
      RT_CHECK(c.input.count == c.output.count * n, "reduce_scatter: input has ", c.input.count,
               " elements; it needs size() * output.count = ", n, " * ", c.output.count);
      RT_CHECK(c.output.count == 0 || !c.input.overlaps(c.output) || is_block(c.output, c.input, context_.rank),
               "reduce_scatter: the output overlaps the input other than as this rank's block; in place, "
               "the output must be exactly input + rank * count (rank ", context_.rank, "), else pass a "
               "separate output buffer");
      break;
    case CollectiveOp::kAllToAll:
      RT_CHECK(c.input.count == c.output.count && c.input.count % n == 0, "all_to_all: input (",
               c.input.count, ") and output (", c.output.count,
               ") must have the same count, a multiple of size() = ", n);
      // Every backend sends block j while blocks arrive: in place, an arriving block
      // would overwrite one not yet sent (the ring's rounds, MPI without MPI_IN_PLACE).
      RT_CHECK(c.input.count == 0 || !c.input.overlaps(c.output),
               "all_to_all: the input and output buffers overlap; it cannot run in place. Pass a "
               "separate output buffer (or copy the input first)");
      break;
    default:
      break;
  }
  Pending pending;
  bool on_device = c.input.device.is_cuda() || (uses_output(c.op) && c.output.device.is_cuda());
  if (on_device) c.ready_event = record_stream_event(c.input.device.index);
  std::unique_lock<std::mutex> lock(queue_mutex_);
  RT_CHECK(!stopping_, name, ": the process group is shutting down");
  const bool p2p = c.op == CollectiveOp::kSend || c.op == CollectiveOp::kRecv;
  c.seq = p2p ? next_p2p_seq_++ : next_seq_++;
  pending.collective = c;
  pending.state = std::make_shared<WorkState>(
      [c, backend = backend_name(), rank = context_.rank, size = context_.size] {
        return describe_collective(c, backend, rank, size);
      });
  Work work(pending.state);
  // Fast path (see Launch::kBlocking and kInlineBytes): a host collective the caller
  // waits for anyway, or a small one, on an idle group runs right here, saving the
  // two thread hand-offs. Order is kept: nothing is queued or running, and the comm
  // thread waits while busy_.
  const size_t bytes = std::max(c.input.nbytes(), uses_output(c.op) ? c.output.nbytes() : 0);
  // Never an asynchronous recv: it waits for its peer by nature, and run here it would
  // hold the caller, who may be about to issue the send that peer waits for on another
  // group.
  const bool inline_worth_it =
      launch == Launch::kBlocking || (bytes <= kInlineBytes && c.op != CollectiveOp::kRecv);
  if (!on_device && inline_worth_it && queue_.empty() && !busy_) {
    busy_ = true;
    lock.unlock();
    execute(pending);
    lock.lock();
    busy_ = false;
    // wake the comm thread only if work was queued meanwhile: a needless wake-up
    // costs a context switch on a core the peer rank may be spinning on
    if (!queue_.empty() || stopping_) queue_changed_.notify_all();
  } else {
    queue_.push_back(std::move(pending));
    queued_.fetch_add(1, std::memory_order_release);
    queue_changed_.notify_all();
  }
  lock.unlock();
  if (launch == Launch::kBlocking) work.wait();  // completed already if it ran inline; rethrows
  return work;
}

// ---------------------------------------------------------------- the comm thread

void ProcessGroup::worker_loop() {
  while (true) {
    Pending pending;
    // Spin briefly before sleeping: the next bucket is often issued within
    // microseconds, and a futex wake-up costs more than that (see work.cc).
    for (auto until = Clock::now() + kSpinBeforeBlocking;
         queued_.load(std::memory_order_acquire) == 0 && Clock::now() < until;) {
      std::this_thread::yield();
    }
    {
      std::unique_lock<std::mutex> lock(queue_mutex_);
      queue_changed_.wait(lock, [&] { return (stopping_ && !busy_) || (!queue_.empty() && !busy_); });
      if (queue_.empty()) return;  // stopping, and everything queued has run
      pending = std::move(queue_.front());
      queue_.pop_front();
      queued_.fetch_sub(1, std::memory_order_release);
      busy_ = true;
    }
    execute(pending);
    std::lock_guard<std::mutex> lock(queue_mutex_);
    busy_ = false;
  }
}

void ProcessGroup::execute(Pending& pending) {
  const Collective& c = pending.collective;
  {
    std::lock_guard<std::mutex> lock(queue_mutex_);
    if (failed_) {
      pending.state->mark_failed(failure_);
      return;
    }
  }
  try {
    if (context_.options.debug_collectives && c.op != CollectiveOp::kSend &&
        c.op != CollectiveOp::kRecv) {
      check_same_collective(c);
    }
    if (c.split_index < 0) run_staged(c, Clock::now() + context_.options.timeout);
    pending.state->mark_completed();
  } catch (...) {
    std::exception_ptr explained = explain_failure(std::current_exception(), describe(c));
    fail_with(explained);
    // The group's first failure is the cause: when abort() on another thread is
    // what interrupted this collective, its reason is the one to report.
    std::lock_guard<std::mutex> lock(queue_mutex_);
    pending.state->mark_failed(failure_);
  }
}

void ProcessGroup::run_staged(const Collective& c, Deadline deadline) {
  bool on_device = c.input.device.is_cuda() || (uses_output(c.op) && c.output.device.is_cuda());
  if (handles_device_buffers() && on_device) {
    run(c, deadline);
    return;
  }
  if (!on_device) {
    run_host(c, deadline);
    return;
  }
  // One rank: an in-place collective leaves the buffer as it is; skip the copies.
  if (context_.size == 1 && is_in_place(c.op)) {
    wait_for_stream_event(c.ready_event);  // done means the caller's input is ready too
    return;
  }
  if (try_run_on_device(c, deadline)) return;
  // Host staging reads the input from the host: wait here for the caller's stream.
  wait_for_stream_event(c.ready_event);
  // The backend moves host memory: stage through pinned buffers.
  const int device = c.input.device.index;
  Collective host = c;
  DataPtr input_host = allocate_pinned_host_bytes(c.input.nbytes());
  host.input.data = input_host.get();
  host.input.device = Device::cpu();
  if (c.op != CollectiveOp::kRecv) {
    copy_device_to_host(host.input.data, c.input.data, c.input.nbytes(), device);
  }
  DataPtr output_host;
  if (uses_output(c.op)) {
    output_host = allocate_pinned_host_bytes(c.output.nbytes());
    host.output.data = output_host.get();
    host.output.device = Device::cpu();
  }
  try {
    run_host(host, deadline);
  } catch (...) {
    keep_if_backend_may_write({&input_host, &output_host});
    throw;
  }
  if (is_in_place(c.op)) copy_host_to_device(c.input.data, host.input.data, c.input.nbytes(), device);
  if (uses_output(c.op)) {
    copy_host_to_device(c.output.data, host.output.data, c.output.nbytes(), device);
  }
}

// After the backend gave up on a collective by throwing: where it may still write its
// buffers (MPI cannot cancel a request), they are kept, never freed under it.
void ProcessGroup::keep_if_backend_may_write(std::initializer_list<DataPtr*> buffers) {
  if (!may_write_after_giving_up()) return;
  std::lock_guard<std::mutex> lock(abandoned_mutex_);
  for (DataPtr* buffer : buffers)
    if (*buffer) abandoned_.push_back(std::move(*buffer));
}

// A 16-bit float average is a sum of values divided first (x / p on every rank), as
// NCCL's ncclAvg does for them: the backends round each partial sum to 16 bits, so a
// sum-then-divide overflows where the average would not (4 ranks of f16 20000: the sum
// 80000 is inf). Integers and wider floats keep the division at the end (exact for
// integers; no overflow to fear for f32/f64).
void ProcessGroup::run_host(const Collective& c, Deadline deadline) {
  const bool sixteen_bit = c.input.dtype == DType::kFloat16 || c.input.dtype == DType::kBFloat16;
  const bool reduction =
      c.op == CollectiveOp::kAllreduce || c.op == CollectiveOp::kReduce || c.op == CollectiveOp::kReduceScatter;
  if (c.reduce_op != ReduceOp::kAvg || !sixteen_bit || !reduction || context_.size == 1) {
    run(c, deadline);
    return;
  }
  Collective sum = c;
  sum.reduce_op = ReduceOp::kSum;
  if (c.op == CollectiveOp::kAllreduce) {
    // In place: the buffer is overwritten with the result anyway.
    scale_for_average(c.input.data, c.input.count, c.input.dtype, context_.size);
    run(sum, deadline);
    return;
  }
  // reduce, reduce_scatter: the caller's input must stay as it was (on non-roots, and
  // outside the output block); sum a divided copy. The reduce's result lands in the
  // copy on the root.
  DataPtr divided = allocate_bytes(c.input.nbytes(), Device::cpu());
  std::memcpy(divided.get(), c.input.data, c.input.nbytes());
  scale_for_average(divided.get(), c.input.count, c.input.dtype, context_.size);
  sum.input.data = divided.get();
  try {
    run(sum, deadline);
  } catch (...) {
    keep_if_backend_may_write({&divided});
    throw;
  }
  if (c.op == CollectiveOp::kReduce && context_.rank == c.peer)
    std::memcpy(c.input.data, divided.get(), c.input.nbytes());
}

// ---------------------------------------------------------------- debug mode

void ProcessGroup::check_same_collective(const Collective& c) {
  // What this rank issued, in the form that must be equal on every rank.
  std::string signature = c.split_index >= 0 ? detail::concat("split #", c.split_index, "(")
                                             : detail::concat(collective_op_name(c.op), "(");
  if (c.op != CollectiveOp::kBarrier) {
    signature += detail::concat(dtype_name(c.input.dtype), ", count=", c.input.count);
  }
  if (c.op == CollectiveOp::kAllreduce || c.op == CollectiveOp::kReduce ||
      c.op == CollectiveOp::kReduceScatter) {
    signature += detail::concat(", ", reduce_op_name(c.reduce_op));
  }
  if (c.op == CollectiveOp::kBroadcast || c.op == CollectiveOp::kReduce) {
    signature += detail::concat(", root=", c.peer);
  }
  signature += ")";
  const std::string base = detail::concat(context_.prefix, "/debug/", c.seq, "/");
  context_.store->set(base + std::to_string(context_.rank), signature);
  // Ranks are named by their world rank, as in every other message: in a sub-group
  // the group rank would point at the wrong process.
  const auto& world = context_.world_ranks;
  std::vector<std::string> issued(context_.size);
  for (int r = 0; r < context_.size; ++r) {
    // A member that died or failed before issuing this collective is reported as
    // such (await_member_key throws PeerLostError, explained like a collective's).
    const std::string waited_for = detail::concat("rank ", world[r], "'s collective #", c.seq);
    try {
      issued[r] = await_member_key(base + std::to_string(r), waited_for);
    } catch (const CommTimeoutError&) {
      throw CommTimeoutError(detail::concat("collective mismatch at #", c.seq, ": rank ", world[r],
                                            " issued no collective #", c.seq, " within the timeout ",
                                            "(this rank issued ", signature, ")"));
    }
  }
  std::vector<int> differing;
  for (int r = 0; r < context_.size; ++r) {
    if (issued[r] != issued[0]) differing.push_back(r);
  }
  if (differing.empty()) {
    // Every rank has published this collective, so every rank is done checking the one
    // before it: this rank's key for that one will not be read again. Without this the
    // store would hold one key per rank per collective for the whole run.
    if (last_checked_seq_ >= 0)
      context_.store->remove(detail::concat(context_.prefix, "/debug/", last_checked_seq_, "/", context_.rank));
    last_checked_seq_ = static_cast<int64_t>(c.seq);
    return;
  }
  std::string message = detail::concat("collective mismatch at #", c.seq, " (debug mode): ");
  for (int r = 0; r < context_.size; ++r) {
    bool odd = std::count(issued.begin(), issued.end(), issued[r]) <= context_.size / 2;
    message += detail::concat(r ? "; " : "", "rank ", world[r], " issued ", issued[r],
                              odd ? " <- differs" : "");
  }
  message += ". Every rank must issue the same collectives in the same order.";
  throw CommError(message);
}

void ProcessGroup::throw_if_member_failed(const std::string& what) const {
  throw_if_member_published_failure(what);
  if (const int lost = lost_member(); lost >= 0) {
    throw PeerLostError(context_.world_ranks[lost],
                        detail::concat("rank ", context_.world_ranks[lost],
                                       " closed its connection while rank ",
                                       context_.world_rank(), " waited for ", what));
  }
}

void ProcessGroup::throw_if_member_published_failure(const std::string& what) const {
  std::vector<std::optional<json>> records(context_.size);
  for (int r = 0; r < context_.size; ++r) {
    if (r != context_.rank) records[r] = first_error_record(*context_.store, context_.world_ranks[r], context_.prefix);
  }
  // A member that died comes first: the others' errors may only relay its death.
  for (int r = 0; r < context_.size; ++r) {
    if (!records[r] || records[r]->value("kind", "") != "exited") continue;
    // the store's word for it (its last will): the message names it, pid and host
    throw PeerLostError(context_.world_ranks[r],
                        detail::concat(records[r]->value("message", records[r]->dump()), ", while rank ",
                                       context_.world_rank(), " waited for ", what));
  }
  for (int r = 0; r < context_.size; ++r) {
    const int world_rank = context_.world_ranks[r];
    const std::optional<json>& record = records[r];
    if (!record) continue;  // none, or it failed only in another group
    const std::string their_message = record->value("message", record->dump());
    throw PeerLostError(world_rank, detail::concat("rank ", world_rank, " failed while rank ",
                                                   context_.world_rank(), " waited for ", what,
                                                   " (rank ", world_rank, ": ", their_message, ")"));
  }
}

std::string ProcessGroup::await_member_key(const std::string& key, const std::string& what) {
  // Short slices: a member that is gone never writes the key, and waiting the whole
  // timeout (10 minutes by default) to say "did not appear" would hide why.
  constexpr auto kSlice = std::chrono::milliseconds(200);
  const Deadline deadline = Clock::now() + context_.options.timeout;
  while (true) {
    const auto left = std::chrono::milliseconds(millis_until(deadline));
    try {
      return context_.store->get(key, std::min<std::chrono::milliseconds>(kSlice, left));
    } catch (const CommTimeoutError&) {
      // not there yet: look for a reason it may never come
    }
    // This group was aborted meanwhile (by another thread of this rank: a watchdog, the
    // Trainer): the wait ends with that reason, as a collective in flight does, not at
    // the timeout (SubGroups.AbortFromAnotherThreadEndsAWaitingSplit).
    {
      std::lock_guard<std::mutex> lock(queue_mutex_);
      if (failed_) std::rethrow_exception(failure_);
    }
    throw_if_member_failed(what);
    if (Clock::now() >= deadline) {
      throw CommTimeoutError(detail::concat(what, " did not come within ",
                                            context_.options.timeout.count(), " ms"));
    }
  }
}

void ProcessGroup::fail_with(std::exception_ptr explained) {
  {
    std::lock_guard<std::mutex> lock(queue_mutex_);
    if (!failed_) failure_ = explained;
    failed_ = true;
  }
  close_transports();
}

// ---------------------------------------------------------------- failures

void publish_rank_error(Store& store, int world_rank, const std::string& kind,
                        const std::string& message, int dead_rank, const std::string& group) {
  try {
    json record{{"rank", world_rank}, {"kind", kind}, {"message", message},
                {"dead_rank", dead_rank}};
    if (!group.empty()) record["group"] = group;
    // Appended: readers take the first one that concerns their group.
    const int64_t index = store.add(error_key(world_rank) + "/count", 1) - 1;
    store.set(detail::concat(error_key(world_rank), "/", index), record.dump());
  } catch (const std::exception&) {
    // the store itself may be gone (rank 0 died); the local error still stands
  }
}

void leave_last_will(Store& store, int world_rank) {
  const std::string message = detail::concat(
      "rank ", world_rank, " (pid ", getpid(), " on ", local_hostname(),
      ") ended without closing its connection to the store: it was killed (kill -9, the OOM killer, "
      "a time limit), crashed, or its host went down or off the network (or the connection itself broke)");
  json record{{"rank", world_rank}, {"kind", "exited"}, {"message", message}, {"dead_rank", world_rank}};
  store.set_last_will(error_key(world_rank), record.dump());
}

void wait_for_peers_to_publish(Store& store, const std::vector<int>& ranks, std::chrono::milliseconds grace) {
  const Deadline deadline = Clock::now() + grace;
  try {
    for (int r : ranks) {
      const auto wanted = std::count(ranks.begin(), ranks.end(), r);
      auto published = [&] {
        const std::optional<std::string> count = store.try_get(error_key(r) + "/count");
        return count ? std::stoll(*count) : 0;
      };
      while (published() < wanted && Clock::now() < deadline) {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
    }
  } catch (const std::exception&) {
    // the store is this process's own; a failure here leaves nothing to wait for
  }
}

void ProcessGroup::publish_error(const std::string& kind, const std::string& message,
                                 int dead_rank) {
  publish_rank_error(*context_.store, context_.world_rank(), kind, message, dead_rank, context_.prefix);
}

std::exception_ptr ProcessGroup::explain_failure(std::exception_ptr error,
                                                 const std::string& what_op) {
  const int me = context_.world_rank();
  // What the other ranks published (an original exception wins over "peer lost").
  auto published = [&](std::string* note) {
    std::vector<json> records;
    try {
      for (int world_rank : context_.world_ranks) {
        if (world_rank == me) continue;
        if (auto record = first_error_record(*context_.store, world_rank, context_.prefix)) {
          records.push_back(std::move(*record));
        }
      }
    } catch (const std::exception&) {
      *note = " (the store on rank 0 is unreachable too: rank 0 has exited)";
    }
    return records;
  };
  try {
    std::rethrow_exception(error);
  } catch (const PeerLostError& e) {
    // The rank that went away says why in the store: the error it published as it
    // failed, or, killed, the store's record of its end (its last will). Either lands
    // within milliseconds of its sockets closing, but usually after them (a failing
    // constructor's sockets close as the stack unwinds, before the catch that
    // publishes): wait for it briefly, or the reason is lost to a race.
    constexpr auto kDeadRankRecordGrace = std::chrono::seconds(1);
    try {
      for (const Deadline until = Clock::now() + kDeadRankRecordGrace;
           !first_error_record(*context_.store, e.rank(), context_.prefix) && Clock::now() < until;) {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
    } catch (const std::exception&) {
      // the store is gone (rank 0 died): published() below says so
    }
    std::string note;
    auto records = published(&note);
    for (const json& r : records) {
      if (r["kind"] == "exception") {
        std::string message = detail::concat(what_op, " failed on rank ", me, ": rank ",
                                             r["rank"].get<int>(), " failed with: ",
                                             r["message"].get<std::string>());
        publish_error("peer_failed", message, r["rank"].get<int>());
        return std::make_exception_ptr(CommError(message));
      }
    }
    // A peer that timed out closed its sockets on purpose; it is alive, and its
    // message names the rank it waited on (the stuck one). Then one that relayed
    // such an explanation from a rank outside what we can see.
    for (const char* kind : {"timeout", "peer_failed"}) {
      for (const json& r : records) {
        if (r["kind"] != kind) continue;
        std::string message = detail::concat(what_op, " failed on rank ", me, ": rank ",
                                             r["rank"].get<int>(), " gave up first: ",
                                             r["message"].get<std::string>());
        publish_error("peer_failed", message, r.value("dead_rank", -1));
        return std::make_exception_ptr(CommError(message));
      }
    }
    int dead = e.rank();
    for (const json& r : records) {
      if (r["kind"] == "peer_lost") {
        dead = r["dead_rank"].get<int>();
        break;
      }
    }
    // The store's record of how it ended (its pid and host), when it has come yet.
    std::string how;
    for (const json& r : records) {
      if (r["kind"] == "exited" && r["rank"] == dead) how = detail::concat(": ", r["message"].get<std::string>());
    }
    std::string message = detail::concat(what_op, " failed on rank ", me, ": rank ", dead,
                                         " died (its connection closed)", how, note);
    publish_error("peer_lost", message, dead);
    return std::make_exception_ptr(PeerLostError(dead, message));
  } catch (const CommTimeoutError& e) {
    std::string note;
    for (const json& r : published(&note)) {
      if (r["kind"] == "exception" || r["kind"] == "peer_lost" || r["kind"] == "exited") {
        std::string message = detail::concat(what_op, " failed on rank ", me, ": ",
                                             r["message"].get<std::string>());
        return std::make_exception_ptr(CommError(message));
      }
    }
    auto seconds = std::chrono::duration_cast<std::chrono::seconds>(context_.options.timeout);
    std::string message = detail::concat(
        what_op, " timed out on rank ", me, " after ", seconds.count(), " s: ", e.what(),
        ". Another rank is stuck or issued different collectives (run with "
        "RINGTRAIN_DEBUG_COLLECTIVES=1 to check); raise the limit with RINGTRAIN_TIMEOUT_SEC or "
        "ProcessGroupOptions::timeout");
    publish_error("timeout", message, -1);
    return std::make_exception_ptr(CommTimeoutError(message));
  } catch (const std::exception& e) {
    std::string message = detail::concat(what_op, " failed on rank ", me, ": ", e.what());
    publish_error("exception", message, -1);
    return std::make_exception_ptr(CommError(message));
  }
}

void ProcessGroup::abort(const std::string& reason) {
  std::string message = detail::concat("rank ", context_.world_rank(), " aborted: ", reason);
  {
    std::lock_guard<std::mutex> lock(queue_mutex_);
    if (!failed_) failure_ = std::make_exception_ptr(CommError(message));
    failed_ = true;
  }
  // The reason goes to the store before the transports close, so that the peers, which
  // notice the closed connections at once, find it there. But with a bound: a watchdog
  // aborts when something is stuck, possibly rank 0 itself, and a store request to a
  // rank 0 that no longer answers would wait out the store's I/O timeout (a minute)
  // while the collective in flight went on. The publication runs on a thread of its own
  // (holding the store), gets kAbortPublishGrace, and is left to finish after that.
  auto published = std::make_shared<std::promise<void>>();
  std::future<void> done = published->get_future();
  std::thread([store = context_.store, rank = context_.world_rank(), prefix = context_.prefix, message,
               published] {
    publish_rank_error(*store, rank, "exception", message, -1, prefix);
    published->set_value();
  }).detach();
  done.wait_for(kAbortPublishGrace);
  close_transports();
}

// ---------------------------------------------------------------- sub-groups

std::shared_ptr<ProcessGroup> ProcessGroup::split(int color, int key) {
  {
    std::lock_guard<std::mutex> lock(queue_mutex_);
    if (failed_) std::rethrow_exception(failure_);
  }
  const uint64_t split_index = split_count_++;
  // A split is a collective over this group: it takes its place in the group's
  // sequence, as a blocking collective would, and starts only once everything this
  // rank issued before it has run. The backend's own split can then never overtake
  // an earlier collective: MPI_Comm_split (and ncclCommSplit) is a collective over
  // the parent communicator, and MPI requires every rank to issue the collectives of
  // a communicator in one order. Without this a rank whose comm thread had not yet
  // issued its queued MPI_Iallreduce split first, while its peer had issued it, and
  // Open MPI crashed (SubGroups.SplitWhileAsyncCollectivesAreInFlight). In debug mode
  // the marker is also compared like the rest (its color and key may differ by
  // rank): a rank that splits where another allreduces is named at once, not found
  // out by two timeouts. Outside debug mode it only waits its turn.
  enqueue({.op = CollectiveOp::kBarrier, .split_index = static_cast<int64_t>(split_index)}, Launch::kBlocking);
  const std::string base = detail::concat(context_.prefix, "/split", split_index);
  context_.store->set(base + "/" + std::to_string(context_.rank), json{color, key}.dump());
  struct Member {
    int color, key, rank;
  };
  std::vector<Member> members;
  try {
    for (int r = 0; r < context_.size; ++r) {
      // a member that died or failed is reported as such, not after the whole timeout
      json entry = json::parse(await_member_key(
          base + "/" + std::to_string(r),
          detail::concat("rank ", context_.world_ranks[r], "'s split #", split_index)));
      if (entry[0].get<int>() == color) members.push_back({color, entry[1].get<int>(), r});
    }
  } catch (...) {
    // The same explanation and the same end as a failed collective: the group is failed.
    std::exception_ptr explained = explain_failure(
        std::current_exception(),
        detail::concat("split #", split_index, " (color ", color, ", key ", key, ") on ",
                       backend_name(), " group rank ", context_.rank, "/", context_.size));
    fail_with(explained);
    std::rethrow_exception(explained);
  }
  std::sort(members.begin(), members.end(), [](const Member& a, const Member& b) {
    return a.key != b.key ? a.key < b.key : a.rank < b.rank;
  });
  GroupContext child = context_;
  child.is_world = false;
  child.server = nullptr;
  child.prefix = detail::concat(base, "/color", color);
  child.size = static_cast<int>(members.size());
  child.world_ranks.clear();
  child.rank = -1;
  for (size_t i = 0; i < members.size(); ++i) {
    if (members[i].rank == context_.rank) child.rank = static_cast<int>(i);
    child.world_ranks.push_back(context_.world_ranks[members[i].rank]);
  }
  // Called on non-members too (color < 0, child.rank == -1): a backend whose split is
  // itself a collective over the parent (MPI_Comm_split) needs every rank; the others
  // return nullptr for them.
  const std::string child_prefix = child.prefix;
  std::shared_ptr<ProcessGroup> subgroup;
  try {
    subgroup = create_subgroup(std::move(child), color, key);
  } catch (const std::exception& e) {
    // The sub-group's other members may be waiting for this rank in its setup: tell
    // them why it will not come (the parent group itself is not failed).
    publish_rank_error(*context_.store, context_.world_rank(), "exception",
                       detail::concat("rank ", context_.world_rank(), " could not join split #", split_index,
                                      " (color ", color, ", key ", key, "): ", e.what()),
                       -1, child_prefix);
    throw;
  }
  // abort() from another thread may have landed after the waits above (every member's
  // key was in the store already, so they never looked), while the sub-group was being
  // built: this split was in flight, so it fails with the reason, as a collective would,
  // instead of handing out a child of an aborted group
  // (SubGroups.AbortFromAnotherThreadWhileTheSubGroupIsBuiltFailsTheSplit). The backend's
  // split has run on the peers (MPI_Comm_split needs every rank), so the sub-group is
  // aborted too: their first use of it fails with the reason instead of waiting for
  // this rank.
  std::exception_ptr failure;
  {
    std::lock_guard<std::mutex> lock(queue_mutex_);
    if (failed_) failure = failure_;
  }
  if (!failure) return subgroup;
  if (subgroup) {
    std::string why;
    try {
      std::rethrow_exception(failure);
    } catch (...) {
      why = detail::current_exception_what();
    }
    subgroup->abort(detail::concat("split #", split_index, " of its parent group was cut short (", why, ")"));
  }
  std::rethrow_exception(failure);
}

}  // namespace ringtrain::comm
