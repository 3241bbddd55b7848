// distributed_data_parallel.h: the DDP wrapper a training loop holds.
//
// defines: DdpOptions, DistributedDataParallel (with NoSyncGuard).
//
// Construction (a collective: every rank must construct at the same point):
//   1. verify that every rank passed the same DdpOptions (those that decide the
//      collectives: bucket caps, find_unused_parameters, static_graph,
//      gradient_as_bucket_view, symmetric_buckets, broadcast_buffers), and has the
//      same parameters and, with broadcast_buffers, buffers (count, then dtype,
//      requires_grad and shape of each, in order; a tensor reached under two names,
//      tied weights, counts once); on mismatch throw naming the first differing
//      tensor (or every differing option) and the ranks, instead of hanging or
//      silently averaging unrelated tensors;
//   2. broadcast parameters (and buffers, with broadcast_buffers) from rank 0, so all
//      replicas start equal;
//   3. build the Reducer (buckets + post-accumulate hooks on every parameter).
// Each forward(): broadcast buffers from rank 0 (BatchNorm statistics), run the
// module, and tell the Reducer a backward is coming. The backward itself is plain
// autograd::backward(loss): the hooks do the rest (see reducer.h).
#pragma once

#include <memory>

#include "comm/process_group.h"
#include "ddp/reducer.h"
#include "nn/module.h"

namespace ringtrain::ddp {

struct DdpOptions {
  size_t bucket_cap_bytes = kDefaultBucketBytesCap;        // PyTorch's bucket_cap_mb, in bytes
  size_t first_bucket_bytes = kDefaultFirstBucketBytes;
  bool find_unused_parameters = false;
  bool static_graph = false;
  bool gradient_as_bucket_view = false;
  // Buckets in symmetric memory when the group has it (ring backend, one host): the
  // allreduce reads the peers' buckets in place. See ReducerOptions.
  bool symmetric_buckets = true;
  bool broadcast_buffers = true;   // sync buffers from rank 0 before a forward (rule in pre_forward)
  bool overlap = true;             // launch buckets during backward (false: all at the end)
};

class DistributedDataParallel {
 public:
  DistributedDataParallel(std::shared_ptr<nn::Module> module, std::shared_ptr<comm::ProcessGroup> group,
                          DdpOptions options = {});

  // Runs the module on this rank's batch and prepares the gradient reduction.
  Tensor forward(const Tensor& input);
  Tensor operator()(const Tensor& input) { return forward(input); }
  // For modules with other signatures: run the module yourself between
  // pre_forward() and post_forward(outputs), and use the tensors post_forward returns
  // (the outputs, each behind an identity node that tells the reducer, when backward
  // reaches it, whether this forward ran inside no_sync()).
  void pre_forward();
  std::vector<Tensor> post_forward(const std::vector<Tensor>& outputs);

  // Inside a NoSyncGuard's scope, backward only accumulates gradients locally; the
  // first backward after the scope reduces the accumulated sum (gradient
  // accumulation over several micro-batches). PyTorch's `with ddp.no_sync():` is
  // `{ auto guard = ddp.no_sync(); ... }`; a guard not kept in a variable would end at
  // once, so discarding it is a compiler warning (nodiscard).
  class [[nodiscard]] NoSyncGuard {
   public:
    explicit NoSyncGuard(DistributedDataParallel& ddp) : ddp_(ddp), previous_(ddp.sync_) { ddp_.sync_ = false; }
    ~NoSyncGuard() { ddp_.sync_ = previous_; }
    NoSyncGuard(const NoSyncGuard&) = delete;
    NoSyncGuard& operator=(const NoSyncGuard&) = delete;

   private:
    DistributedDataParallel& ddp_;
    bool previous_;
  };
  [[nodiscard("the guard ends no_sync() when it is destroyed: keep it, auto guard = ddp.no_sync();")]]
  NoSyncGuard no_sync() { return NoSyncGuard(*this); }

  void register_comm_hook(CommHook hook) { reducer_->register_comm_hook(std::move(hook)); }

  nn::Module& module() { return *module_; }
  std::shared_ptr<nn::Module> module_ptr() const { return module_; }
  comm::ProcessGroup& process_group() { return *group_; }
  Reducer& reducer() { return *reducer_; }
  const StepStats& last_stats() const { return reducer_->last_stats(); }

 private:
  // Every rank has the same options, parameters and (with broadcast_buffers) buffers
  // (count, dtype, shape, and which parameters require grad); else an error naming
  // the first tensor that differs, or every option that does.
  void verify_same_state();
  void verify_same_options();
  void verify_same_tensors(const std::vector<std::pair<std::string, Tensor>>& named, bool parameters);
  void broadcast_state(bool parameters, bool buffers);

  std::shared_ptr<nn::Module> module_;          // the replica on this rank
  std::shared_ptr<comm::ProcessGroup> group_;   // the data-parallel group
  DdpOptions options_;
  std::shared_ptr<Reducer> reducer_;            // buckets and hooks (the output markers hold it weakly)
  bool sync_ = true;                            // false inside no_sync()
  // Whether the next forward broadcasts buffers: true at first, then whether the last
  // forward ran with grad mode on outside no_sync() (PyTorch's require_forward_param_sync).
  bool sync_buffers_next_forward_ = true;
  std::chrono::steady_clock::time_point forward_start_;
};

}  // namespace ringtrain::ddp
