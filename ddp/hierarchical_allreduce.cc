// hierarchical_allreduce.cc: see hierarchical_allreduce.h.
#include "ddp/hierarchical_allreduce.h"

#include "tensor/ops.h"

namespace ringtrain::ddp {

HierarchicalAllreduce::HierarchicalAllreduce(std::shared_ptr<comm::ProcessGroup> world, int node,
                                             int local_rank)
    : world_(std::move(world)) {
  RT_CHECK(world_ != nullptr, "HierarchicalAllreduce: process group is null");
  RT_CHECK(node >= 0 && local_rank >= 0, "HierarchicalAllreduce: node (", node, ") and local rank (",
           local_rank, ") must be non-negative");
  intra_ = world_->split(/*color=*/node, /*key=*/local_rank);
  inter_ = world_->split(/*color=*/intra_->rank() == 0 ? 0 : -1, /*key=*/node);
  // Everyone learns the number of nodes: leaders count themselves.
  int32_t leader = intra_->rank() == 0 ? 1 : 0;
  world_->allreduce({&leader, 1, DType::kInt32, Device::cpu()}, comm::ReduceOp::kSum).wait(world_->options().timeout);
  nodes_ = leader;
  worker_ = std::thread([this] { worker_loop(); });
}

HierarchicalAllreduce::~HierarchicalAllreduce() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  changed_.notify_all();
  worker_.join();
}

comm::Work HierarchicalAllreduce::allreduce_sum(comm::BufferRef buffer) {
  auto state = std::make_shared<comm::WorkState>([buffer] {
    return "hierarchical allreduce (" + std::to_string(buffer.count) + " x " + dtype_name(buffer.dtype) + ")";
  });
  {
    std::lock_guard<std::mutex> lock(mutex_);
    queue_.push_back({buffer, state});
  }
  changed_.notify_all();
  return comm::Work(state);
}

void HierarchicalAllreduce::worker_loop() {
  while (true) {
    Job job;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      changed_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, nothing left
      job = std::move(queue_.front());
      queue_.pop_front();
    }
    // Each step waits for the previous one, so each is launched kBlocking: the
    // sub-groups serve only this thread, are idle, and run the step right here
    // instead of handing it to their comm threads and back.
    try {
      // step 1: reduce inside the node onto its leader
      intra_->reduce(job.buffer, 0, comm::ReduceOp::kSum, comm::Launch::kBlocking);
      // step 2: allreduce across nodes, leaders only
      if (inter_) inter_->allreduce(job.buffer, comm::ReduceOp::kSum, comm::Launch::kBlocking);
      // step 3: the leader hands the total to its node
      intra_->broadcast(job.buffer, 0, comm::Launch::kBlocking);
      job.state->mark_completed();
    } catch (...) {
      job.state->mark_failed(std::current_exception());
    }
  }
}

CommHook HierarchicalAllreduce::hook() {
  return [this](comm::ProcessGroup& group, Bucket& bucket) -> CommHookResult {
    Tensor flat = bucket.flat;
    const double world = static_cast<double>(world_->size());
    if (is_reduced_precision_float(flat.dtype())) {
      // Divide before summing: a 16-bit sum of N gradients overflows at 65504 / N.
      div_(flat, world);
      return {allreduce_sum(buffer_of(flat)), nullptr};
    }
    comm::Work work = allreduce_sum(buffer_of(flat));
    return {work, [flat, world]() mutable { div_(flat, world); }};
  };
}

}  // namespace ringtrain::ddp
