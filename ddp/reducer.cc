// reducer.cc: see reducer.h for the walk through one step and the cost model.
#include "ddp/reducer.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <mutex>
#include <unordered_set>

#include "comm/symmetric_memory.h"
#include "tensor/ops.h"

namespace ringtrain::ddp {

namespace {
using Clock = std::chrono::steady_clock;

double ms_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

// Keeps tensors' memory for the rest of the process (reachable from a static, so leak
// checkers do not count it): for buffers a collective that failed or never ended may
// still use.
// `finish` is kept (not run) for what its closure holds.
void keep_alive_until_exit(std::vector<Tensor> tensors, std::function<void()> finish) {
  struct Kept {
    std::vector<Tensor> tensors;
    std::vector<std::function<void()>> closures;
  };
  static std::mutex mutex;
  static auto* kept = new Kept();
  std::lock_guard<std::mutex> lock(mutex);
  for (Tensor& t : tensors)
    if (t.defined()) kept->tensors.push_back(std::move(t));
  if (finish) kept->closures.push_back(std::move(finish));
}

CommHookResult compress_hook(comm::ProcessGroup& group, Bucket& bucket, DType wire_dtype) {
  // Divide first so the half-precision sum cannot overflow where the average would not.
  Tensor compressed = div(bucket.flat, static_cast<double>(group.size())).to(wire_dtype);
  comm::Work work = group.allreduce(buffer_of(compressed), comm::ReduceOp::kSum);
  Tensor flat = bucket.flat;
  return {work, [flat, compressed]() mutable { flat.copy_(compressed); }};
}
}  // namespace

comm::BufferRef buffer_of(const Tensor& t) {
  RT_CHECK(t.is_contiguous(), "buffer_of: collectives need contiguous memory, got ", t.describe(),
           " with strides ", shape_str(t.strides()));
  return comm::BufferRef{t.data_ptr(), static_cast<size_t>(t.numel()), t.dtype(), t.device()};
}

CommHookResult allreduce_average_hook(comm::ProcessGroup& group, Bucket& bucket) {
  if (is_reduced_precision_float(bucket.flat.dtype())) {
    // A 16-bit sum of N gradients overflows at 65504 / N (fp16) although their average
    // would not: divide first, then sum, as PyTorch's reducer (it scales each gradient
    // by 1/N on its way into the bucket) and NCCL's ncclAvg (a pre-multiplied sum) do.
    div_(bucket.flat, static_cast<double>(group.size()));
    return {group.allreduce(buffer_of(bucket.flat), comm::ReduceOp::kSum), nullptr};
  }
  return {group.allreduce(buffer_of(bucket.flat), comm::ReduceOp::kAvg), nullptr};
}
CommHookResult fp16_compress_hook(comm::ProcessGroup& group, Bucket& bucket) {
  return compress_hook(group, bucket, DType::kFloat16);
}
CommHookResult bf16_compress_hook(comm::ProcessGroup& group, Bucket& bucket) {
  return compress_hook(group, bucket, DType::kBFloat16);
}

Reducer::Reducer(std::vector<Tensor> params, std::vector<std::string> names,
                 std::shared_ptr<comm::ProcessGroup> group, ReducerOptions options)
    : params_(std::move(params)),
      names_(std::move(names)),
      group_(std::move(group)),
      options_(options),
      comm_hook_(allreduce_average_hook) {
  RT_CHECK(group_ != nullptr, "Reducer: needs a process group");
  RT_CHECK(names_.size() == params_.size(), "Reducer: ", params_.size(), " parameters but ",
           names_.size(), " names");
  RT_CHECK(options_.first_bucket_bytes > 0 && options_.bucket_bytes_cap > 0,
           "Reducer: bucket caps must be positive");
  for (size_t i = 0; i < params_.size(); ++i) {
    RT_CHECK(params_[i].defined() && autograd::requires_grad(params_[i]) && autograd::is_leaf(params_[i]),
             "Reducer: parameter '", names_[i], "' must be a leaf tensor with requires_grad");
    for (size_t j = 0; j < i; ++j)
      RT_CHECK(!params_[i].is_same(params_[j]), "Reducer: parameter '", names_[i],
               "' is the same tensor as '", names_[j], "'; shared parameters must be listed once");
  }
  // Initial assignment: reverse registration order, because backward produces the
  // last layer's gradients first.
  std::vector<size_t> order(params_.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = order.size() - 1 - i;
  build_buckets(order);
  ready_.assign(params_.size(), false);
  used_.assign(params_.size(), false);
  used_since_sync_.assign(params_.size(), false);
  marked_unused_.assign(params_.size(), false);
  for (size_t i = 0; i < params_.size(); ++i)
    hooks_.push_back(autograd::register_post_accumulate_grad_hook(
        params_[i], [this, i](const Tensor&) { on_gradient_ready(i); }));
}

Reducer::~Reducer() {
  for (auto& hook : hooks_) hook.remove();
  // Never leave a collective reading or writing our buffers after they are freed. The
  // built-in hooks' collectives end within the group's timeout (they fail then); a user
  // hook's Work might never complete, and a destructor must not wait forever: all the
  // buckets together get one group timeout, after which a Work still running is
  // abandoned and its buffers kept alive for the rest of the process. A failed Work's
  // buffers are kept too where the backend may still write them (MPI cannot cancel a
  // request; the CUDA IPC allreduce gives up on a timeout with its copies queued);
  // elsewhere a failure means the collective has returned, and they are freed.
  // `finish` is kept with them: a hook's own wire buffer (the compression hooks'
  // half-precision copy) lives only in that closure.
  const auto deadline = std::chrono::steady_clock::now() + group_->options().timeout;
  for (auto& bucket : buckets_) {
    if (!bucket.launched) continue;
    try {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      bucket.work.wait(std::max(left, std::chrono::milliseconds(0)));
    } catch (...) {
      // The group's error was (or will be) reported by whoever waits next.
      const bool running = !bucket.work.is_completed();
      if (running || group_->may_write_after_failure(bucket.flat.device()))
        keep_alive_until_exit({bucket.flat, bucket.spare}, std::move(bucket.finish));
      // Still running after the timeout: abandon the wait, not the memory.
      if (running) {
        std::fprintf(stderr,
                     "ringtrain: DDP was destroyed while bucket %zu's collective (%s) was still running after "
                     "the group's timeout; its %zu-byte buffer is kept until the process exits so the collective "
                     "cannot write freed memory (a communication hook's Work that never completes?)\n",
                     static_cast<size_t>(&bucket - buckets_.data()), bucket.work.description().c_str(),
                     static_cast<size_t>(bucket.flat.nbytes()));
      }
    }
  }
}

void Reducer::build_buckets(const std::vector<size_t>& order) {
  // Fill one open bucket per (dtype, device) in `order`; close a bucket when it
  // reaches its cap. The first bucket of each kind gets the small cap so that the
  // first collective can start as early as possible.
  struct Open {
    std::vector<size_t> indices;
    size_t bytes = 0;
    size_t cap = 0;
  };
  std::map<std::pair<int, std::string>, Open> open;
  std::vector<std::vector<size_t>> assignment;
  for (size_t i : order) {
    const Tensor& p = params_[i];
    auto key = std::make_pair(static_cast<int>(p.dtype()), p.device().str());
    auto [it, inserted] = open.try_emplace(key);
    if (inserted) it->second.cap = options_.first_bucket_bytes;
    it->second.indices.push_back(i);
    it->second.bytes += p.nbytes();
    if (it->second.bytes >= it->second.cap) {
      assignment.push_back(std::move(it->second.indices));
      it->second = Open{{}, 0, options_.bucket_bytes_cap};
    }
  }
  // Leftover partial buckets, in the order their first variable appeared.
  std::vector<std::vector<size_t>> rest;
  for (auto& [key, o] : open)
    if (!o.indices.empty()) rest.push_back(std::move(o.indices));
  std::sort(rest.begin(), rest.end(), [&](const auto& a, const auto& b) {
    auto pos = [&](size_t v) { return std::find(order.begin(), order.end(), v) - order.begin(); };
    return pos(a.front()) < pos(b.front());
  });
  for (auto& r : rest) assignment.push_back(std::move(r));

  buckets_.clear();
  locators_.assign(params_.size(), VariableLocator{});
  for (size_t b = 0; b < assignment.size(); ++b) {
    Bucket bucket;
    int64_t total = 0;
    for (size_t i : assignment[b]) {
      bucket.variable_indices.push_back(i);
      bucket.offsets.push_back(total);
      bucket.lengths.push_back(params_[i].numel());
      total += params_[i].numel();
    }
    const Tensor& first = params_[assignment[b].front()];
    bool symmetric = false;
    bucket.flat = allocate_bucket(total, first, &symmetric);
    // Copying mode swaps in a fresh buffer after each step (finalize_backward, step 5):
    // with symmetric memory that is a second buffer of the same kind, used in turn.
    if (symmetric && !options_.gradient_as_bucket_view) bucket.spare = allocate_bucket(total, first, &symmetric);
    for (size_t j = 0; j < bucket.variable_indices.size(); ++j) {
      size_t i = bucket.variable_indices[j];
      bucket.views.push_back(bucket.flat.narrow(0, bucket.offsets[j], bucket.lengths[j]).view(params_[i].shape()));
      locators_[i] = VariableLocator{b, j};
    }
    buckets_.push_back(std::move(bucket));
  }
}

Tensor Reducer::allocate_bucket(int64_t numel, const Tensor& like, bool* symmetric) {
  *symmetric = false;
  if (options_.symmetric_buckets && !passthrough() && like.device().is_cpu()) {
    // Collective: every rank builds the same buckets in the same order.
    const size_t bytes = static_cast<size_t>(numel) * dtype_size(like.dtype());
    if (auto memory = group_->allocate_symmetric(bytes)) {
      *symmetric = true;
      // The tensor keeps the mapping alive (a .grad view may outlive the bucket).
      DataPtr data(memory->data(), [memory](void*) {});
      auto storage = std::make_shared<Storage>(std::move(data), bytes, like.device());
      return Tensor::from_storage(storage, {numel}, {1}, 0, like.dtype());  // zero-filled
    }
  }
  return zeros({numel}, like.dtype(), like.device());
}

void Reducer::replace_spares_still_in_use() {
  // Copying mode with symmetric buckets hands this step's buffer to .grad and takes the
  // spare, which .grad viewed one step ago, for the next backward. Anyone still holding
  // that older .grad (a list of past gradients, an optimizer that keeps the tensor) would
  // see it overwritten, where PyTorch's copying mode never touches a .grad again: such a
  // spare is replaced by a new buffer. A symmetric allocation is collective, so the ranks
  // first agree on which spares to replace (one small allreduce per step; whether any
  // bucket has a spare was settled collectively when the buckets were built).
  std::vector<int32_t> busy;
  bool any_spare = false;
  for (const Bucket& bucket : buckets_) {
    any_spare = any_spare || bucket.spare.defined();
    // Only the bucket's own handle left: nobody else views the memory.
    busy.push_back(bucket.spare.defined() && bucket.spare.storage().use_count() > 1 ? 1 : 0);
  }
  if (!any_spare) return;
  group_->allreduce({busy.data(), busy.size(), DType::kInt32, Device::cpu()}, comm::ReduceOp::kMax)
      .wait(group_->options().timeout);
  for (size_t b = 0; b < buckets_.size(); ++b) {
    if (!busy[b]) continue;
    bool symmetric = false;
    buckets_[b].spare = allocate_bucket(buckets_[b].flat.numel(), buckets_[b].flat, &symmetric);
  }
}

std::vector<std::vector<size_t>> Reducer::bucket_assignment() const {
  std::vector<std::vector<size_t>> out;
  for (const auto& b : buckets_) out.push_back(b.variable_indices);
  return out;
}

void Reducer::offer_bucket_slots() {
  // Each parameter's bucket slot becomes where its next gradient goes
  // (autograd::set_grad_destination): linear's weight-gradient GEMM writes straight
  // into the bucket, any other rule's result is copied in by AccumulateGrad, and
  // either way the copy in mark_variable_ready finds nothing left to move.
  //   gradient_as_bucket_view: .grad *is* the slot from now on; a gradient already
  //   accumulated (no_sync micro-batches) is moved into the slot first.
  //   copying mode: only where .grad is undefined (zero_grad's default); a defined
  //   .grad is accumulated into as usual and copied into the bucket when ready.
  for (size_t i = 0; i < params_.size(); ++i) {
    const VariableLocator& loc = locators_[i];
    Tensor view = buckets_[loc.bucket_index].views[loc.intra_bucket_index];
    Tensor g = autograd::grad(params_[i]);
    if (!g.defined()) {
      autograd::set_grad_destination(params_[i], view);
    } else if (options_.gradient_as_bucket_view && !g.is_same(view)) {
      view.copy_(g);
      autograd::set_grad(params_[i], view);
    }
  }
}

void Reducer::check_parameters_match_buckets() {
  // module->to(another dtype or device) after wrapping converts the parameters in place
  // (same tensors), but the buckets keep the dtype and device they were built with.
  // Left alone, that fails later and far away (a gradient destination of the wrong
  // dtype, a copy between devices), and only with more than one rank, where buckets are
  // used: say what happened, at every world size.
  for (size_t i = 0; i < params_.size(); ++i) {
    const Tensor& p = params_[i];
    const Tensor& flat = buckets_[locators_[i].bucket_index].flat;
    if (p.dtype() == flat.dtype() && p.device() == flat.device()) continue;
    auto describe = [&](const Tensor& t) {
      std::string out;
      if (p.dtype() != flat.dtype()) out = dtype_name(t.dtype());
      if (p.device() != flat.device()) out += (out.empty() ? "on " : " on ") + t.device().str();
      return out;
    };
    const std::string message = detail::concat(
        "DDP: parameter '", names_[i], "' is ", describe(p), " but was ", describe(flat),
        " when DDP was built (its gradient bucket is sized and placed for that); call module->to() "
        "before wrapping the module in DistributedDataParallel, or wrap it again after converting");
    // The peers (which may not have converted) would wait for this rank in the first
    // bucket's allreduce until the timeout: fail them now with the reason.
    if (group_->size() > 1) group_->abort(message);
    throw Error(message);
  }
}

void Reducer::prepare_for_backward(const std::vector<Tensor>& outputs, bool sync) {
  std::vector<std::shared_ptr<autograd::Node>> roots;
  for (const Tensor& out : outputs)
    if (out.defined())
      if (auto fn = autograd::grad_fn(out)) roots.push_back(std::move(fn));
  prepare(roots, sync);
}

void Reducer::prepare(const std::vector<std::shared_ptr<autograd::Node>>& roots, bool sync) {
  if (!pending_error_.empty()) {
    std::string message = std::move(pending_error_);
    pending_error_.clear();
    throw Error(message);
  }
  check_parameters_match_buckets();
  // A backward that launched buckets and then threw never reached finalize_backward:
  // its collectives may still be running on the comm thread, into bucket memory that
  // is reset below. Let them end first (a no-op after a finalized step).
  for (auto& bucket : buckets_)
    if (bucket.launched) bucket.work.wait(group_->options().timeout);
  expect_hooks_ = sync;
  backward_kind_ = BackwardKind::kUnknown;  // a backward that threw never reset it
  callback_queued_ = false;
  unused_to_mark_.clear();
  prepared_roots_.clear();
  if (!sync) return;  // no_sync: gradients only accumulate locally in .grad
  prepared_roots_.assign(roots.begin(), roots.end());

  std::fill(ready_.begin(), ready_.end(), false);
  std::fill(used_.begin(), used_.end(), false);
  std::fill(marked_unused_.begin(), marked_unused_.end(), false);
  ready_order_.clear();
  next_bucket_ = 0;
  timings_.clear();
  grad_ready_ms_.clear();
  for (auto& bucket : buckets_) {
    bucket.pending = bucket.variable_indices.size();
    bucket.launched = false;
    bucket.work = comm::Work();
    bucket.finish = nullptr;
  }
  if (options_.gradient_as_bucket_view || !passthrough()) offer_bucket_slots();
  backward_start_ = last_hook_time_ = Clock::now();
  stats_.backward_ms = stats_.backward_compute_ms = stats_.comm_wait_ms = 0;

  // Parameters that will get no gradient in this backward are found now and marked
  // ready at its first gradient hook (on_gradient_ready), as PyTorch does: marking them
  // here could complete a bucket and launch its allreduce from a forward that is never
  // followed by a backward (an evaluation forward with grad enabled), and the next
  // forward would reset that bucket under the collective.
  if (options_.static_graph && first_step_done_) {
    // The graph never changes: the parameters unused in step 1 are unused now.
    for (size_t i = 0; i < params_.size(); ++i)
      if (static_unused_[i]) unused_to_mark_.push_back(i);
  } else if (options_.find_unused_parameters) {
    // Walk the graph from the outputs; a parameter whose AccumulateGrad node is not
    // reachable will get no gradient in this backward, so it is ready right now.
    std::unordered_set<const autograd::Node*> reachable;
    std::vector<std::shared_ptr<autograd::Node>> stack(roots.begin(), roots.end());
    while (!stack.empty()) {
      auto node = stack.back();
      stack.pop_back();
      if (!reachable.insert(node.get()).second) continue;
      for (const auto& edge : node->next_edges)
        if (edge.node && !reachable.count(edge.node.get())) stack.push_back(edge.node);
    }
    for (size_t i = 0; i < params_.size(); ++i) {
      auto* m = autograd::meta_or_null(params_[i]);
      auto accumulator = m ? m->grad_accumulator.lock() : nullptr;
      if (!accumulator || !reachable.count(accumulator.get())) unused_to_mark_.push_back(i);
    }
  }
}

void Reducer::note_backward_of_forward(bool synced_forward,
                                       const std::vector<std::weak_ptr<autograd::Node>>& forward_roots) {
  // Is the prepared walk for unused parameters this forward's? Only matters while the
  // walk decides anything (find_unused_parameters; static_graph after step 1 knows its set).
  auto same_node = [](const std::weak_ptr<autograd::Node>& a, const std::weak_ptr<autograd::Node>& b) {
    return !a.owner_before(b) && !b.owner_before(a);
  };
  const bool walk_matters = options_.find_unused_parameters && !(options_.static_graph && first_step_done_);
  auto roots_prepared = [&] {
    return std::all_of(forward_roots.begin(), forward_roots.end(), [&](const auto& root) {
      return std::any_of(prepared_roots_.begin(), prepared_roots_.end(),
                         [&](const auto& prepared) { return same_node(root, prepared); });
    });
  };
  if (synced_forward && !callback_queued_ && (!expect_hooks_ || (walk_matters && !roots_prepared()))) {
    // A synced forward's graph is backpropagated, and no gradient hook of this backward
    // has fired yet, but the reducer is not prepared for it:
    //  * no synced backward is prepared: an earlier backward already used (and finalized)
    //    this forward's preparation. That is backward run twice through one graph
    //    (retain_graph=true), or two synced forwards before their two backwards. Left
    //    local, this backward's gradients would accumulate into .grad unreduced, and the
    //    ranks' parameters would silently drift apart after the step. Prepared again, it is
    //    reduced like the first: .grad (the averaged first gradient) accumulates this rank's
    //    new gradient, the bucket averages that sum, and the result is the average of both
    //    backwards, as one process computes it. (PyTorch's reducer ignores such hooks and
    //    lets the ranks diverge.)
    //  * a later synced forward prepared it (forward A, forward B, backward A): with
    //    find_unused_parameters the walk started at B's outputs, and a parameter A uses but
    //    B does not would be marked unused and then receive a gradient. Prepared again
    //    from this forward's outputs (and those of any synced forward whose marker this
    //    backward passed already: one backward through both losses walks from both).
    // Every rank runs the same forwards and backwards, so every rank prepares alike.
    std::vector<std::weak_ptr<autograd::Node>> weak_roots = forward_roots;
    if (expect_hooks_ && backward_kind_ == BackwardKind::kSynced)
      weak_roots.insert(weak_roots.end(), prepared_roots_.begin(), prepared_roots_.end());
    std::vector<std::shared_ptr<autograd::Node>> roots;
    for (const auto& weak : weak_roots)
      if (auto root = weak.lock()) roots.push_back(std::move(root));
    prepare(roots, /*sync=*/true);
  }
  if (synced_forward) {
    backward_kind_ = BackwardKind::kSynced;
  } else if (backward_kind_ == BackwardKind::kUnknown) {
    backward_kind_ = BackwardKind::kLocal;
  }
  // Forgotten when this backward ends, whichever way the next one goes.
  autograd::queue_callback([this] { backward_kind_ = BackwardKind::kUnknown; });
}

void Reducer::on_gradient_ready(size_t index) {
  if (!expect_hooks_ || backward_kind_ == BackwardKind::kLocal) {
    // no_sync (or a backward DDP did not prepare): the gradient only accumulates in
    // .grad, but the parameter counts as used in the next synced step, which must
    // reduce that sum even if its own backward does not reach the parameter.
    used_since_sync_[index] = true;
    return;
  }
  if (!callback_queued_) {
    autograd::queue_callback([this] { finalize_backward(); });
    callback_queued_ = true;
    // The first hook of this backward: now the unused parameters count as ready.
    for (size_t i : unused_to_mark_) {
      marked_unused_[i] = true;
      mark_variable_ready(i, false);
    }
    unused_to_mark_.clear();
  }
  if (ready_[index]) {
    // This rank cannot go on with this backward, and its peers would wait in the bucket's
    // allreduce until the timeout: the group is aborted with the reason, so they fail with
    // it at once (as for a throwing comm hook).
    auto fail = [&](const std::string& message) {
      if (group_->size() > 1) group_->abort(message);
      throw Error(message);
    };
    if (!marked_unused_[index]) {
      fail(detail::concat("DDP: parameter '", names_[index], "' received a gradient twice in one "
                          "backward pass (is backward run twice per forward?)"));
    }
    if (options_.static_graph) {
      fail(detail::concat(
          "DDP: parameter '", names_[index], "' received a gradient, but it was unused on this rank in the "
          "first step and static_graph=true promised the same graph every step. Drop static_graph (use "
          "find_unused_parameters=true if the set of used parameters changes)."));
    }
    fail(detail::concat(
        "DDP: parameter '", names_[index], "' received a gradient, but find_unused_parameters found it "
        "unreachable from the outputs of the DDP forward. Does the loss use it outside the module's "
        "forward (a weight penalty on module().parameters(), say)? Compute that inside forward."));
  }
  last_hook_time_ = Clock::now();
  grad_ready_ms_.emplace_back(index, ms_between(backward_start_, last_hook_time_));
  mark_variable_ready(index, true);
}

void Reducer::mark_variable_ready(size_t index, bool used) {
  ready_[index] = true;
  // Used means: got a gradient in this backward or in a no_sync backward since the
  // last synced one (then .grad holds the accumulated sum, and it must be reduced).
  used_[index] = used || used_since_sync_[index];
  if (used) ready_order_.push_back(index);
  const VariableLocator& loc = locators_[index];
  Bucket& bucket = buckets_[loc.bucket_index];
  Tensor& view = bucket.views[loc.intra_bucket_index];
  Tensor g = autograd::grad(params_[index]);
  if (passthrough()) {
    // nothing to move: the average over one rank is the gradient itself
  } else if (!g.defined()) {
    zero_(view);  // a parameter without a gradient contributes zeros to the average
  } else if (!g.is_same(view)) {
    // A defined .grad goes in whether or not this backward reached the parameter:
    // unused now, it may still hold what no_sync micro-batches accumulated.
    view.copy_(g);  // gradient_as_bucket_view makes this a no-op (same tensor)
  }
  if (--bucket.pending == 0) {
    bucket.ready_time = Clock::now();
    launch_ready_buckets();
  }
}

void Reducer::launch_ready_buckets(bool backward_done) {
  // Without overlap everything launches once backward is done (finalize_backward).
  // A parameter, not a toggle of options_.overlap: a hook that throws then must not
  // leave overlap switched on for every later step.
  if (!options_.overlap && !backward_done) return;
  // Strictly in index order: a complete bucket waits for all lower-indexed buckets,
  // so that every rank issues the same collective sequence.
  while (next_bucket_ < buckets_.size() && buckets_[next_bucket_].pending == 0) {
    Bucket& bucket = buckets_[next_bucket_++];
    bucket.launch_time = Clock::now();
    bucket.launched = true;
    if (passthrough()) continue;  // an empty Work: already complete
    try {
      CommHookResult result = comm_hook_(*group_, bucket);
      bucket.work = std::move(result.work);
      bucket.finish = std::move(result.finish);
    } catch (...) {
      // The hook (a user's, or a compression cast out of memory) issued no collective
      // for this bucket, so the peers would wait in theirs until the timeout: abort the
      // group with the reason, and they fail at once with it. Whatever it threw: a
      // user's hook may throw something that is no std::exception, and letting that
      // through would strand the peers just the same.
      const std::string what = detail::current_exception_what();
      const std::string reason = detail::concat("DDP: the communication hook failed for bucket ",
                                                next_bucket_ - 1, " on rank ", group_->rank(), ": ", what);
      if (group_->size() > 1) group_->abort(reason);
      throw Error(reason);
    }
  }
}

std::string Reducer::unready_parameter_names() const {
  std::string names;
  for (size_t i = 0; i < params_.size(); ++i)
    if (!ready_[i]) names += (names.empty() ? "" : ", ") + names_[i];
  return names;
}

void Reducer::finalize_backward() {
  callback_queued_ = false;
  expect_hooks_ = false;
  // Step 1: parameters that never got a gradient.
  if (options_.find_unused_parameters || (options_.static_graph && !first_step_done_)) {
    for (size_t i = 0; i < params_.size(); ++i)
      if (!ready_[i]) mark_variable_ready(i, false);
  }
  bool complete = std::all_of(buckets_.begin(), buckets_.end(), [](const Bucket& b) { return b.pending == 0; });
  if (!complete) {
    // A parameter got no gradient and the user did not say that may happen. The
    // error surfaces at the next iteration (as in PyTorch), naming the parameters.
    pending_error_ = detail::concat(
        "DDP: parameter(s) ", unready_parameter_names(), " received no gradient in a backward pass on rank ",
        group_->rank(), ", so their buckets were never reduced. ",
        options_.static_graph
            ? "static_graph=true promised the graph of the first step, where they were used: drop "
              "static_graph and pass find_unused_parameters=true if the used parameters change."
            : "Pass find_unused_parameters=true to DistributedDataParallel if some parameters are "
              "legitimately unused, or make sure every parameter takes part in computing the loss on "
              "every rank.");
    // Only the buckets launched here are waited for. Another rank may have used those
    // parameters: it launched a bucket this rank never will and waits for it. So the
    // group is then aborted with this message: that rank fails now, naming the
    // parameters, instead of after the collective timeout with a sequence mismatch.
    // (The group is no longer usable, here or there; the run must be fixed anyway.)
    for (auto& bucket : buckets_)
      if (bucket.launched) bucket.work.wait(group_->options().timeout);
    std::fill(used_since_sync_.begin(), used_since_sync_.end(), false);
    if (group_->size() > 1) group_->abort(pending_error_);
    return;
  }
  // Step 2: without overlap, everything goes out now (still in index order).
  if (!options_.overlap) launch_ready_buckets(/*backward_done=*/true);
  // Step 3: wait for the collectives in order and finish them (average/decompress).
  Clock::time_point wait_start = Clock::now();
  size_t bytes = 0;
  for (size_t b = 0; b < buckets_.size(); ++b) {
    Bucket& bucket = buckets_[b];
    bucket.work.wait(group_->options().timeout);
    if (bucket.finish) bucket.finish();
    bytes += bucket.flat.nbytes();
    Clock::time_point done = bucket.work.completed_at();
    // An empty Work (nothing to reduce: one rank) took no time at all.
    if (done == Clock::time_point{}) done = bucket.launch_time;
    timings_.push_back({b, bucket.flat.nbytes(), ms_between(backward_start_, bucket.ready_time),
                        ms_between(backward_start_, bucket.launch_time), ms_between(backward_start_, done)});
  }
  stats_.comm_wait_ms = ms_between(wait_start, Clock::now());

  // Step 4: which parameters were used anywhere? (only when some may be unused)
  // used_ counts this backward and the no_sync micro-batches before it.
  std::vector<bool> globally_used(params_.size(), true);
  if (passthrough()) {
    globally_used = used_;
  } else if (options_.find_unused_parameters || options_.static_graph) {
    std::vector<int32_t> used(params_.size());
    for (size_t i = 0; i < params_.size(); ++i) used[i] = used_[i] ? 1 : 0;
    group_->allreduce({used.data(), used.size(), DType::kInt32, Device::cpu()}, comm::ReduceOp::kMax)
        .wait(group_->options().timeout);
    for (size_t i = 0; i < params_.size(); ++i) globally_used[i] = used[i] != 0;
  }
  // Counted: the next no_sync accumulation starts afresh.
  std::fill(used_since_sync_.begin(), used_since_sync_.end(), false);

  // Step 5: averaged gradients back into .grad. A parameter no rank used keeps
  // the .grad it had (none, or what zero_grad(set_to_none=false) left), exactly as
  // in single-process training; a copy, because a bucket view's memory is reused.
  //   gradient_as_bucket_view: .grad already is the bucket view; nothing moves.
  //   otherwise: .grad *becomes* the bucket view and the bucket gets a fresh buffer
  //   for the next step (from the caching allocator; with symmetric buckets, the
  //   spare one, which no .grad views any more), instead of copying every averaged
  //   gradient back; every slot of the fresh buffer is written (copy or zero)
  //   before its bucket is launched, so it needs no initialisation.
  // A slot offered to a parameter that got no gradient is withdrawn: the next
  // offer may point elsewhere (buckets swap buffers, or are rebuilt).
  for (const Tensor& p : params_) autograd::set_grad_destination(p, Tensor());
  for (size_t i = 0; i < params_.size() && !passthrough(); ++i) {
    const VariableLocator& loc = locators_[i];
    const Tensor& view = buckets_[loc.bucket_index].views[loc.intra_bucket_index];
    Tensor g = autograd::grad(params_[i]);
    if (!globally_used[i]) autograd::set_grad(params_[i], g.defined() ? g.clone() : Tensor());
    else if (!g.defined() || !g.is_same(view)) autograd::set_grad(params_[i], view);
  }
  if (!options_.gradient_as_bucket_view && !passthrough()) {
    replace_spares_still_in_use();
    for (auto& bucket : buckets_) {
      if (bucket.spare.defined()) {
        std::swap(bucket.flat, bucket.spare);  // .grad now views the other one
      } else {
        bucket.flat = Tensor::empty(bucket.flat.shape(), bucket.flat.dtype(), bucket.flat.device());
      }
      for (size_t j = 0; j < bucket.views.size(); ++j)
        bucket.views[j] = bucket.flat.narrow(0, bucket.offsets[j], bucket.lengths[j])
                              .view(params_[bucket.variable_indices[j]].shape());
    }
  }

  if (options_.static_graph && !first_step_done_) {
    // What *this rank* did not use, not what no rank used: the set is pre-marked
    // here in every later step, and a parameter only rank 0 uses must still be
    // pre-marked on rank 1, or rank 1's bucket never completes while rank 0 waits
    // for it in the allreduce.
    // And what this *synced backward* did not reach (no hook fired), not what got no
    // gradient since the last sync: a parameter that only the no_sync micro-batches of
    // each step use is reached by none of the synced backwards, so it must be pre-marked
    // (its slot then takes the .grad those micro-batches accumulated, counted as used, as
    // find_unused_parameters does). Counting it as used left its bucket incomplete in
    // step 2, which failed although every step had the same graphs.
    static_unused_.assign(params_.size(), true);
    for (size_t i : ready_order_) static_unused_[i] = false;
  }
  first_step_done_ = true;
  maybe_rebuild_buckets();

  Clock::time_point end = Clock::now();
  stats_.backward_ms = ms_between(backward_start_, end);
  stats_.backward_compute_ms = ms_between(backward_start_, last_hook_time_);
  // The group runs its collectives one at a time in launch (= bucket index) order, so
  // bucket b's collective starts when it is launched or when bucket b-1's ends, whichever
  // is later; counting from its launch would also count the time it sat in the queue
  // (and comm_ms could exceed the step). comm_ms is the time some collective ran;
  // overlapped_ms the part of it inside the backward's compute window.
  stats_.comm_ms = stats_.overlapped_ms = 0;
  double previous_done = 0;
  for (const BucketTiming& t : timings_) {
    const double start = std::max(t.launch_ms, previous_done);
    const double done = std::max(t.done_ms, start);
    stats_.comm_ms += done - start;
    stats_.overlapped_ms += std::max(0.0, std::min(done, stats_.backward_compute_ms) - start);
    previous_done = done;
  }
  stats_.buckets = buckets_.size();
  stats_.bytes_reduced = bytes;
}

void Reducer::maybe_rebuild_buckets() {
  if (rebuilt_ || !options_.rebuild_buckets) return;
  rebuilt_ = true;
  // The order gradients really became ready here, unused parameters last (in
  // reverse registration order). Rank 0's order wins so that all ranks agree.
  std::vector<int64_t> order(ready_order_.begin(), ready_order_.end());
  std::vector<bool> seen(params_.size(), false);
  for (int64_t i : order) seen[i] = true;
  for (size_t i = params_.size(); i-- > 0;)
    if (!seen[i]) order.push_back(static_cast<int64_t>(i));
  group_->broadcast({order.data(), order.size(), DType::kInt64, Device::cpu()}, 0)
      .wait(group_->options().timeout);
  std::vector<size_t> new_order(order.begin(), order.end());
  build_buckets(new_order);
}

}  // namespace ringtrain::ddp
