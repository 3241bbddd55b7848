// hierarchical_allreduce.cc: see hierarchical_allreduce.h.
#include "ddp/hierarchical_allreduce.h"

#include <condition_variable>
#include <deque>
#include <mutex>
#include <optional>
#include <thread>

#include "tensor/cuda/runtime.h"
#include "tensor/ops.h"

namespace ringtrain::ddp {

// Everything the worker and the hooks use, behind one shared_ptr: a hook registered
// with DDP keeps it alive after the HierarchicalAllreduce that made it is gone, so a
// bucket reduced then still has its groups and its worker (a raw `this` in the hook
// would point at freed memory). The worker holds a raw pointer: it is joined in
// ~State, which therefore never runs on the worker itself.
struct HierarchicalAllreduce::State {
  struct Job {
    comm::BufferRef buffer;
    std::shared_ptr<comm::WorkState> state;
    // CUDA buffers: the stream the caller produced the buffer on (its current stream
    // when it enqueued the job). Step 1 is issued with it current, so the collective's
    // ready event follows the caller's kernels, not the worker thread's default stream.
    void* producer_stream = nullptr;
  };

  ~State() {
    {
      std::lock_guard<std::mutex> lock(mutex);
      stopping = true;
    }
    changed.notify_all();
    if (worker.joinable()) worker.join();
  }

  comm::Work enqueue(comm::BufferRef buffer);
  void worker_loop();
  // Aborts the sub-groups with `reason` (first caller only) and fails every queued and
  // later job with it.
  void fail_all(const std::string& reason);

  std::shared_ptr<comm::ProcessGroup> world;
  std::shared_ptr<comm::ProcessGroup> intra;  // ranks on my node, leader = local rank 0
  std::shared_ptr<comm::ProcessGroup> inter;  // the node leaders (null on non-leaders)
  int nodes = 1;                              // number of nodes (leaders)
  std::mutex mutex;
  std::condition_variable changed;
  std::deque<Job> queue;
  bool stopping = false;
  bool aborting = false;         // fail_all has begun: the groups are (being) aborted
  std::exception_ptr failure;    // set by fail_all: every queued and later job fails with it
  std::thread worker;
};

HierarchicalAllreduce::HierarchicalAllreduce(std::shared_ptr<comm::ProcessGroup> world, int node,
                                             int local_rank)
    : state_(std::make_shared<State>()) {
  State& s = *state_;
  s.world = std::move(world);
  RT_CHECK(s.world != nullptr, "HierarchicalAllreduce: process group is null");
  RT_CHECK(node >= 0 && local_rank >= 0, "HierarchicalAllreduce: node (", node, ") and local rank (",
           local_rank, ") must be non-negative");
  s.intra = s.world->split(/*color=*/node, /*key=*/local_rank);
  s.inter = s.world->split(/*color=*/s.intra->rank() == 0 ? 0 : -1, /*key=*/node);
  // Everyone learns the number of nodes: leaders count themselves.
  int32_t leader = s.intra->rank() == 0 ? 1 : 0;
  s.world->allreduce({&leader, 1, DType::kInt32, Device::cpu()}, comm::ReduceOp::kSum)
      .wait(s.world->options().timeout);
  s.nodes = leader;
  s.worker = std::thread([raw = state_.get()] { raw->worker_loop(); });
}

bool HierarchicalAllreduce::is_leader() const { return state_->inter != nullptr; }
int HierarchicalAllreduce::nodes() const { return state_->nodes; }

comm::Work HierarchicalAllreduce::allreduce_sum(comm::BufferRef buffer) { return state_->enqueue(buffer); }

void HierarchicalAllreduce::abort(const std::string& reason) {
  state_->fail_all(detail::concat("HierarchicalAllreduce aborted on rank ", state_->world->rank(), ": ", reason));
}

comm::Work HierarchicalAllreduce::State::enqueue(comm::BufferRef buffer) {
  auto work = std::make_shared<comm::WorkState>([buffer] {
    return "hierarchical allreduce (" + std::to_string(buffer.count) + " x " + dtype_name(buffer.dtype) + ")";
  });
  {
    std::lock_guard<std::mutex> lock(mutex);
    if (failure) {
      // The chain is broken on this rank (its groups are aborted): fail now, not after
      // a timeout in a group that can no longer run anything.
      work->mark_failed(failure);
      return comm::Work(work);
    }
    queue.push_back({buffer, work, buffer.device.is_cuda() ? cuda::current_stream(buffer.device.index).handle() : nullptr});
  }
  changed.notify_all();
  return comm::Work(work);
}

void HierarchicalAllreduce::State::fail_all(const std::string& reason) {
  {
    std::lock_guard<std::mutex> lock(mutex);
    if (aborting) return;  // the first reason is the one everybody reports
    aborting = true;
  }
  // The groups first: abort() publishes the reason before it closes the transports, so
  // a member waiting in the step-3 broadcast (or a leader in step 2) fails at once with
  // it, instead of at the collective timeout or, worse, pairing this rank's next
  // bucket's reduce with its broadcast.
  for (comm::ProcessGroup* group : {intra.get(), inter.get()})
    if (group != nullptr && !group->failed()) group->abort(reason);
  std::deque<Job> dropped;
  std::exception_ptr error = std::make_exception_ptr(comm::CommError(reason));
  {
    std::lock_guard<std::mutex> lock(mutex);
    failure = error;
    dropped.swap(queue);
  }
  changed.notify_all();  // a worker waiting to fail its own job with the first reason
  for (Job& job : dropped) job.state->mark_failed(error);
}

void HierarchicalAllreduce::State::worker_loop() {
  while (true) {
    Job job;
    {
      std::unique_lock<std::mutex> lock(mutex);
      changed.wait(lock, [this] { return stopping || !queue.empty(); });
      if (queue.empty()) return;  // stopping, nothing left
      job = std::move(queue.front());
      queue.pop_front();
    }
    // Each step waits for the previous one, so each is launched kBlocking: the
    // sub-groups serve only this thread, are idle, and run the step right here
    // instead of handing it to their comm threads and back.
    const char* step = "1 (reduce inside the node)";
    try {
      // step 1: reduce inside the node onto its leader, once the caller's stream has
      // produced the buffer (steps 2 and 3 read what step 1 left: it has completed)
      {
        std::optional<cuda::StreamGuard> producer;
        if (job.buffer.device.is_cuda())
          producer.emplace(cuda::Stream::borrowed(job.producer_stream, job.buffer.device.index));
        intra->reduce(job.buffer, 0, comm::ReduceOp::kSum, comm::Launch::kBlocking);
      }
      // step 2: allreduce across nodes, leaders only
      step = "2 (allreduce among the node leaders)";
      if (inter) inter->allreduce(job.buffer, comm::ReduceOp::kSum, comm::Launch::kBlocking);
      // step 3: the leader hands the total to its node
      step = "3 (broadcast inside the node)";
      intra->broadcast(job.buffer, 0, comm::Launch::kBlocking);
      job.state->mark_completed();
    } catch (...) {
      const std::string what = detail::current_exception_what();
      const std::string reason = detail::concat("HierarchicalAllreduce: ", job.state->description(),
                                                " failed on rank ", world->rank(), " in step ", step, ": ", what);
      fail_all(reason);
      // This job fails like the queued ones, with the first reason: this one, or that of
      // an abort() on another thread that got there first (and may still be aborting).
      std::unique_lock<std::mutex> lock(mutex);
      changed.wait(lock, [this] { return failure != nullptr; });
      job.state->mark_failed(failure);
    }
  }
}

CommHook HierarchicalAllreduce::hook() const {
  // The hook shares the state: DDP may reduce buckets after this object is gone.
  return [state = state_](comm::ProcessGroup& group, Bucket& bucket) -> CommHookResult {
    // The sum runs over the groups split from the world this object was built on, not
    // over `group`: were DDP's group another one (a sub-group, another world), every
    // bucket would be summed over the wrong ranks and divided by the wrong size.
    // Identity, not equivalence, on purpose: what would make another group acceptable is
    // the same set of processes (a copy split from the world with one color), but comm
    // exposes no member list to compare, and size and rank alone would accept a
    // same-sized group of other ranks. Identity never accepts a wrong group; it refuses
    // a same-member copy, and the message names the fix (pass the same object).
    RT_CHECK(&group == state->world.get(), "HierarchicalAllreduce::hook: DDP reduces over a process group (",
             group.backend_name(), ", rank ", group.rank(), " of ", group.size(),
             ") that is not the one this HierarchicalAllreduce was built on (", state->world->backend_name(),
             ", rank ", state->world->rank(), " of ", state->world->size(),
             "), so it would sum the buckets over the wrong ranks; build the HierarchicalAllreduce on the "
             "same ProcessGroup object you pass to DistributedDataParallel");
    Tensor flat = bucket.flat;
    const double world = static_cast<double>(state->world->size());
    if (is_reduced_precision_float(flat.dtype())) {
      // Divide before summing: a 16-bit sum of N gradients overflows at 65504 / N.
      div_(flat, world);
      return {state->enqueue(buffer_of(flat)), nullptr};
    }
    comm::Work work = state->enqueue(buffer_of(flat));
    return {work, [flat, world]() mutable { div_(flat, world); }};
  };
}

}  // namespace ringtrain::ddp
