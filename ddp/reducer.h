// reducer.h: DDP's gradient reducer: buckets, readiness, and overlap of the
// allreduce with the backward pass.
//
// defines: Bucket, VariableLocator, CommHook (+ CommHookResult), ReducerOptions,
//          StepStats, Reducer.
//
// The walk through one step (docs/ddp-internals.md tells it with pictures):
//   prepare_for_backward(outputs)   before backward: reset per-step state; with
//                                   find_unused_parameters walk the graph from the
//                                   outputs and mark unreachable parameters ready.
//   (before backward, each parameter's bucket slot became its gradient
//   destination, so autograd writes the gradient straight into the bucket)
//   post-accumulate hook (param i)  during backward, when autograd has finished
//                                   accumulating i's gradient: copy it into its
//                                   bucket slot only if .grad existed before this
//                                   backward (no_sync accumulation; otherwise it is
//                                   there already), count the bucket down, and launch every bucket
//                                   that is complete *and whose turn it is*: buckets
//                                   go out strictly in index order on every rank, so
//                                   collective i is the same bucket everywhere.
//   finalize (queued callback)      once backward ends: wait for the buckets' Work
//                                   in order, run the comm hook's finish step
//                                   (e.g. decompress), make each used parameter's
//                                   .grad the averaged bucket view (copying mode: and
//                                   give the bucket its other buffer); nothing is
//                                   copied back.
//
// Cost model: with B buckets of sizes s_b, allreduce time is sum_b (alpha + beta*s_b);
// bucket b can start once the last of its parameters' gradients exists, so all
// but the last bucket's communication can hide behind the rest of backward. Small
// first bucket (1 MiB): the first collective starts early; large later buckets
// (25 MiB): few alpha terms.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "autograd/autograd.h"
#include "comm/process_group.h"
#include "tensor/tensor.h"

namespace ringtrain::ddp {

inline constexpr size_t kDefaultFirstBucketBytes = 1 << 20;     // 1 MiB, as PyTorch
inline constexpr size_t kDefaultBucketBytesCap = 25 << 20;      // 25 MiB, as PyTorch

// Where a parameter's gradient lives in the buckets.
struct VariableLocator {
  size_t bucket_index = 0;        // which bucket
  size_t intra_bucket_index = 0;  // position among that bucket's variables
};

// A contiguous group of gradients reduced by one collective.
struct Bucket {
  Tensor flat;                          // all gradients of this bucket, back to back (1-D)
  Tensor spare;                         // symmetric buckets, copying mode: the other buffer
  std::vector<size_t> variable_indices; // parameter indices, in bucket order
  std::vector<int64_t> offsets;         // element offset of each variable in `flat`
  std::vector<int64_t> lengths;         // element count of each variable
  std::vector<Tensor> views;            // flat.narrow(offset, length).view(param shape)
  size_t pending = 0;                   // variables not yet ready in this backward
  bool launched = false;                // its collective has been issued this step
  comm::Work work;                      // the in-flight collective
  std::function<void()> finish;         // comm hook's step after the Work completes
  std::chrono::steady_clock::time_point ready_time;   // when the last gradient arrived
  std::chrono::steady_clock::time_point launch_time;  // when its collective was issued
};

// What a communication hook hands back: the collective in flight, and what to do
// once it completed (on the training thread) so that bucket.flat holds the
// averaged gradient.
struct CommHookResult {
  comm::Work work;
  std::function<void()> finish;  // may be empty
};
// Issues the reduction of one bucket. The default averages with allreduce(kAvg).
using CommHook = std::function<CommHookResult(comm::ProcessGroup& group, Bucket& bucket)>;

struct ReducerOptions {
  size_t first_bucket_bytes = kDefaultFirstBucketBytes;
  size_t bucket_bytes_cap = kDefaultBucketBytesCap;
  bool find_unused_parameters = false;
  bool static_graph = false;              // the set of used parameters never changes
  bool gradient_as_bucket_view = false;   // .grad are views into the buckets: no copies
  bool rebuild_buckets = true;            // re-bucket once from the real ready order
  bool overlap = true;                    // false: launch nothing until backward ends (for benchmarks)
  // Buckets in ProcessGroup::allocate_symmetric memory when the group has it (ring
  // backend, every rank on this host): the allreduce then loads the peers' buckets
  // directly instead of copying through the transport (comm/direct_allreduce.cc).
  // Without gradient_as_bucket_view each bucket gets two such buffers, used in turn.
  bool symmetric_buckets = true;
};

// Per-step timings (milliseconds), filled by the Reducer and the DDP wrapper.
struct StepStats {
  double forward_ms = 0;        // DDP forward (incl. buffer broadcast)
  double backward_ms = 0;       // prepare_for_backward to the end of finalize
  double backward_compute_ms = 0;  // prepare_for_backward to the last gradient hook
  double comm_wait_ms = 0;      // time finalize blocked waiting for collectives
  double comm_ms = 0;           // time some bucket's collective ran (from its start, not its launch)
  double overlapped_ms = 0;     // the part of comm_ms that ran while backward was still computing
  size_t buckets = 0;
  size_t bytes_reduced = 0;
};

class Reducer {
 public:
  // `params` in registration order (the module's parameters()).
  Reducer(std::vector<Tensor> params, std::vector<std::string> names,
          std::shared_ptr<comm::ProcessGroup> group, ReducerOptions options);
  ~Reducer();
  Reducer(const Reducer&) = delete;
  Reducer& operator=(const Reducer&) = delete;

  // Called by DDP's forward before backward runs. `outputs` are the forward's
  // outputs (used by find_unused_parameters). `sync` false (no_sync) means this
  // backward only accumulates into .grad locally.
  void prepare_for_backward(const std::vector<Tensor>& outputs, bool sync);
  // Called by the backward of a DDP forward's outputs (DistributedDataParallel::post_forward),
  // before any gradient hook of that backward: whether the forward ran synced or inside
  // no_sync(). A backward through a no_sync forward's outputs only accumulates locally, even
  // with a synced backward prepared; through both kinds at once, it is synced.
  // `forward_roots` are that forward's outputs' grad_fns: a synced forward whose preparation
  // an earlier backward already used (backward twice through one graph, retain_graph=true)
  // is prepared again from them, so this backward is reduced too (see note_backward_of_forward).
  void note_backward_of_forward(bool synced_forward,
                                const std::vector<std::weak_ptr<autograd::Node>>& forward_roots);

  void register_comm_hook(CommHook hook) {
    comm_hook_ = std::move(hook);
    custom_hook_ = true;
  }

  const std::vector<Bucket>& buckets() const { return buckets_; }
  // Parameter indices in bucket order, per bucket (for tests and the tour).
  std::vector<std::vector<size_t>> bucket_assignment() const;
  bool buckets_rebuilt() const { return rebuilt_; }
  const StepStats& last_stats() const { return stats_; }
  StepStats& mutable_stats() { return stats_; }

  // The bucket launches of the last synced step, for the timeline.
  struct BucketTiming {
    size_t bucket = 0;
    size_t bytes = 0;
    double ready_ms = 0, launch_ms = 0, done_ms = 0;  // since prepare_for_backward; done = Work completion
  };
  const std::vector<BucketTiming>& last_bucket_timings() const { return timings_; }
  // (parameter index, ms since prepare_for_backward) in the order gradients became ready.
  const std::vector<std::pair<size_t, double>>& last_grad_ready_times() const { return grad_ready_ms_; }
  const std::string& parameter_name(size_t index) const { return names_.at(index); }

 private:
  // prepare_for_backward's work, from the forward outputs' grad_fns (`roots`).
  void prepare(const std::vector<std::shared_ptr<autograd::Node>>& roots, bool sync);
  void build_buckets(const std::vector<size_t>& order);
  Tensor allocate_bucket(int64_t numel, const Tensor& like, bool* symmetric);
  void on_gradient_ready(size_t index);
  void mark_variable_ready(size_t index, bool used);
  // Launches the complete buckets whose turn it is; without overlap only once
  // `backward_done` (from finalize_backward).
  void launch_ready_buckets(bool backward_done = false);
  // Each parameter still has its bucket's dtype and device (module->to() after
  // wrapping changes them); else throws naming the parameter and the fix.
  void check_parameters_match_buckets();
  void finalize_backward();
  void maybe_rebuild_buckets();
  void offer_bucket_slots();  // bucket slots as autograd's gradient destinations
  void replace_spares_still_in_use();  // a kept .grad must not be overwritten two steps later
  std::string unready_parameter_names() const;

  std::vector<Tensor> params_;                 // the model's parameters, registration order
  std::vector<std::string> names_;             // their names, for error messages
  std::shared_ptr<comm::ProcessGroup> group_;  // who we reduce with
  ReducerOptions options_;
  CommHook comm_hook_;                         // how one bucket is reduced
  bool custom_hook_ = false;                   // register_comm_hook was called
  // One process and the default (averaging) hook: the allreduce is the identity, so
  // gradients stay where autograd put them (no bucket copies, no collectives).
  bool passthrough() const { return group_->size() == 1 && !custom_hook_; }

  std::vector<Bucket> buckets_;                // current bucket assignment
  std::vector<VariableLocator> locators_;      // param index -> place in buckets_
  std::vector<autograd::HookHandle> hooks_;    // post-accumulate hooks, removed in ~Reducer

  // ---- per-backward state ----
  bool expect_hooks_ = false;            // a synced backward is pending (set by prepare)
  // What the running backward went through, as the output markers reported it:
  // kUnknown (no marker yet, or a backward that bypassed DDP's outputs), kLocal, kSynced.
  enum class BackwardKind { kUnknown, kLocal, kSynced };
  BackwardKind backward_kind_ = BackwardKind::kUnknown;
  bool callback_queued_ = false;         // finalize is queued for this backward
  size_t next_bucket_ = 0;               // the next bucket index allowed to launch
  std::vector<bool> ready_;              // param i marked ready this backward
  std::vector<bool> used_;               // param i got a gradient this backward or since the last sync
  std::vector<bool> used_since_sync_;    // param i got a gradient in a no_sync backward since the last sync
  std::vector<size_t> ready_order_;      // order of readiness in this backward (for rebuilding)
  std::string pending_error_;            // thrown at the next prepare_for_backward
  std::chrono::steady_clock::time_point backward_start_;
  std::chrono::steady_clock::time_point last_hook_time_;

  // ---- across steps ----
  bool rebuilt_ = false;                 // buckets already rebuilt from the real order
  bool first_step_done_ = false;         // one synced backward has finished
  std::vector<bool> static_unused_;      // static_graph: params this rank did not use in step 1
  std::vector<size_t> unused_to_mark_;   // found unused at forward; marked ready at the first hook
  // The grad_fns of the outputs the pending synced backward was prepared from (what the
  // find_unused_parameters walk started at): a backward through another forward's outputs
  // is prepared again from its own (note_backward_of_forward).
  std::vector<std::weak_ptr<autograd::Node>> prepared_roots_;
  std::vector<bool> marked_unused_;      // this backward: marked ready as unused (no gradient expected)
  StepStats stats_;
  std::vector<BucketTiming> timings_;
  std::vector<std::pair<size_t, double>> grad_ready_ms_;  // this step's hook times
};

// The raw buffer a collective sees for a (contiguous) tensor: where the Tensor world
// meets comm's DType/Device/pointer world.
comm::BufferRef buffer_of(const Tensor& t);

// The default hook: in-place allreduce with ReduceOp::kAvg.
CommHookResult allreduce_average_hook(comm::ProcessGroup& group, Bucket& bucket);
// Compression hooks: divide by the world size, cast to fp16/bf16, allreduce(sum)
// the half-size buffer, cast back into the bucket. Halves the bytes on the wire.
CommHookResult fp16_compress_hook(comm::ProcessGroup& group, Bucket& bucket);
CommHookResult bf16_compress_hook(comm::ProcessGroup& group, Bucket& bucket);

}  // namespace ringtrain::ddp
