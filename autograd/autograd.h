// autograd.h: reverse-mode automatic differentiation over ringtrain tensors.
//
// defines: AutogradMeta (what autograd keeps in a TensorImpl's opaque slot),
//          Node + Edge (the backward graph), SavedTensor (a tensor saved for
//          backward, with in-place modification detection), grad mode
//          (NoGradGuard, EnableGradGuard), the tensor-side API (requires_grad,
//          grad, grad_fn, detach), hooks (register_hook,
//          register_post_accumulate_grad_hook, queue_callback) and backward().
//
// Where it sits: tensor/ops.h computes; autograd/functions.h wraps each op so
// that, when an input requires grad, the output's AutogradMeta points at a Node
// holding the derivative rule and Edges to the nodes of the inputs. backward()
// (autograd/engine.cc) walks that graph from the loss in dependency order, sums
// the gradients flowing into each node, runs its rule, and at the leaves an
// AccumulateGrad node adds the gradient into the parameter's .grad and fires the
// post-accumulate hooks that DDP's Reducer listens to. Autograd knows nothing of
// DDP: the Reducer only registers hooks and queues an end-of-backward callback.
//
// Hook order during one backward() (docs/autograd.md explains why DDP cares):
//   1. for a non-leaf tensor: its grad hooks, in registration order, when its
//      gradient is complete (before its grad_fn runs); each may replace the gradient.
//   2. for a leaf: its grad hooks (may replace), then the gradient is accumulated
//      into .grad, then its post-accumulate-grad hooks (given the leaf tensor).
//      Leaves become ready in the order the engine finishes their consumers
//      (reverse of the forward, as a rule), which is the order these fire.
//   3. callbacks queued with queue_callback() during this backward run once, in
//      queue order, after every node has run (and before backward() returns).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "tensor/tensor.h"

namespace ringtrain::autograd {

struct Node;

// An input of a Node's forward, seen from backward: the node that produced that
// input (or the AccumulateGrad of a leaf). A null node means "no gradient needed".
struct Edge {
  std::shared_ptr<Node> node;  // where the gradient for this input goes; null: nowhere
};

// A tensor's gradient hook: receives the gradient, returns the gradient to use
// (return the argument unchanged to only observe it). A replacement must have the
// gradient's shape, dtype and device; backward throws naming the hook otherwise.
using GradHook = std::function<Tensor(const Tensor& grad)>;
// Runs after a leaf's .grad has been updated; receives the leaf itself.
using PostAccumulateGradHook = std::function<void(const Tensor& leaf)>;

// Removes the hook it was returned for (no-op when already removed or its owner is gone).
class HookHandle {
 public:
  HookHandle() = default;
  explicit HookHandle(std::function<void()> remover) : remover_(std::move(remover)) {}
  void remove();

 private:
  std::function<void()> remover_;  // erases the hook from its owner (captures weak pointers)
};

// What autograd stores in TensorImpl::autograd_meta.
struct AutogradMeta {
  bool requires_grad = false;      // leaf: user-set; non-leaf: true iff grad_fn is set
  Tensor grad;                     // accumulated gradient (leaves, or non-leaves with retain_grad)
  std::shared_ptr<Node> grad_fn;   // the node that produced this tensor; null for leaves
  std::weak_ptr<Node> grad_accumulator;  // a leaf's AccumulateGrad (weak: it points back at us)
  bool retains_grad = false;       // non-leaf: keep .grad (retain_grad())
  uint64_t next_hook_id = 0;       // ids for HookHandle removal
  std::vector<std::pair<uint64_t, GradHook>> grad_hooks;  // leaf grad hooks (non-leaf ones live on grad_fn)
  std::vector<std::pair<uint64_t, PostAccumulateGradHook>> post_accumulate_hooks;  // leaves only
  // Where the next gradient of this leaf goes while .grad is undefined (see
  // set_grad_destination); `destination_claimed` is set once one backward rule has
  // been handed it to write into, so no second rule writes there too.
  Tensor grad_destination;
  bool destination_claimed = false;
};

// A tensor saved by a forward for its backward. It keeps the values (an alias of
// the storage without autograd history, so saving an op's own output makes no
// reference cycle) and the version of the original tensor at save time; get()
// throws, naming the op, when the original was modified in place since.
class SavedTensor {
 public:
  SavedTensor() = default;
  explicit SavedTensor(const Tensor& t);
  // `op` and `what` name the tensor in the error ("mul", "input 1").
  const Tensor& get(const std::string& op, const char* what) const;
  bool defined() const { return data_.defined(); }
  void reset();

 private:
  Tensor data_;                         // alias of the saved values (no autograd meta)
  std::weak_ptr<TensorImpl> original_;  // the tensor that was saved: was it given new storage?
  uint64_t saved_version_ = 0;          // the storage's version counter when saved
  bool was_defined_ = false;            // false: an undefined tensor was saved (e.g. no bias)
};

// A node of the backward graph: computes the gradients of one op's inputs from
// the gradient of its (single) output. Every differentiable op has one output;
// ops with several (chunk, split) make one node per output.
struct Node {
  using PreHook = std::pair<uint64_t, GradHook>;

  explicit Node(std::string name);
  virtual ~Node() = default;
  Node(const Node&) = delete;
  Node& operator=(const Node&) = delete;

  // Gradients for each input edge (an undefined tensor where there is none), given
  // the gradient of the output. Called by the engine with grad mode off.
  virtual std::vector<Tensor> apply(const Tensor& grad_output) = 0;
  // Drops saved tensors (the engine calls it after running the node unless
  // retain_graph); applying a released node throws.
  virtual void release() { released_ = true; }

  const std::string& name() const { return name_; }
  bool released() const { return released_; }

  std::string name_;                 // op name for errors ("mul", "AccumulateGrad")
  std::vector<Edge> next_edges;      // one per input of the forward, in argument order
  std::vector<Shape> input_shapes;   // shape of each input, to check gradients against
  std::vector<DType> input_dtypes;   // dtype of each input
  uint64_t sequence_nr = 0;          // creation order; the engine runs later nodes first
  std::vector<PreHook> pre_hooks;    // grad hooks of the output tensor (non-leaf register_hook)
  uint64_t next_hook_id = 0;         // ids for pre_hooks removal
  // retain_grad()'s hook: runs after every pre_hook, whenever it was registered, so the
  // retained .grad is the gradient the hooks produced (as in PyTorch 2).
  std::function<void(const Tensor&)> retain_grad_hook;
  bool released_ = false;            // set by release(): saved tensors are gone
};

// ---------------------------------------------------------------- grad mode
// Thread-local: is the graph being recorded? (true by default)
bool grad_enabled();
void set_grad_enabled(bool enabled);

// RAII: records no graph inside the scope (like torch.no_grad()).
class NoGradGuard {
 public:
  NoGradGuard() : prev_(grad_enabled()) { set_grad_enabled(false); }
  ~NoGradGuard() { set_grad_enabled(prev_); }
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool prev_;
};

// RAII: re-enables recording inside a no_grad scope.
class EnableGradGuard {
 public:
  EnableGradGuard() : prev_(grad_enabled()) { set_grad_enabled(true); }
  ~EnableGradGuard() { set_grad_enabled(prev_); }
  EnableGradGuard(const EnableGradGuard&) = delete;
  EnableGradGuard& operator=(const EnableGradGuard&) = delete;

 private:
  bool prev_;
};

// ---------------------------------------------------------------- tensor-side API
// Marks a leaf as needing a gradient (float dtypes only). On a non-leaf (which requires
// grad already) true is a no-op and false throws, as PyTorch's requires_grad_().
const Tensor& set_requires_grad(const Tensor& t, bool requires_grad = true);
bool requires_grad(const Tensor& t);
bool is_leaf(const Tensor& t);                    // no grad_fn
Tensor grad(const Tensor& t);                     // undefined when none
// g may be undefined (= set to none); otherwise it must have t's shape, dtype and
// device, not be an expanded view, and not share t's memory (backward accumulates
// into .grad in place). Throws otherwise.
void set_grad(const Tensor& t, const Tensor& g);
// A preallocated buffer for a leaf's next gradient (DDP passes its bucket slot):
// while .grad is undefined, the next backward leaves the gradient in `destination`
// and makes it .grad, instead of allocating one. A rule that can write its result
// in place (linear's weight gradient, a GEMM) writes straight into it via
// BackwardContext::destination(); otherwise the gradient is copied in. The buffer
// must match the leaf's shape, dtype and device, be contiguous and not share the
// leaf's own memory (checked: throws otherwise); its old values are
// never read. Undefined clears it. Ignored while .grad is defined (then backward
// accumulates into .grad as always) and when the leaf has grad hooks.
void set_grad_destination(const Tensor& t, const Tensor& destination);
std::shared_ptr<Node> grad_fn(const Tensor& t);
// Keep .grad on a non-leaf after backward.
void retain_grad(const Tensor& t);
// Same storage, no history, requires_grad false.
Tensor detach(const Tensor& t);
// The autograd meta of t, created if absent.
AutogradMeta& meta(const Tensor& t);
AutogradMeta* meta_or_null(const Tensor& t);

// ---------------------------------------------------------------- hooks
// Gradient hook on any tensor that requires grad (see the order above).
HookHandle register_hook(const Tensor& t, GradHook hook);
// Post-accumulate-grad hook on a leaf that requires grad.
HookHandle register_post_accumulate_grad_hook(const Tensor& leaf, PostAccumulateGradHook hook);
// Runs `callback` once when the backward pass running on this thread finishes.
// Throws when called outside a backward pass (e.g. from a hook's owner at the wrong time).
void queue_callback(std::function<void()> callback);
bool in_backward();  // true inside hooks/nodes/callbacks of a running backward

// ---------------------------------------------------------------- backward
// Computes gradients of `root` w.r.t. every leaf that requires grad and
// accumulates them into the leaves' .grad. `grad_root` may be omitted only for a
// one-element root (then 1 is used); otherwise it must have the root's shape, dtype
// and device (checked up front). The graph is freed unless retain_graph.
void backward(const Tensor& root, const Tensor& grad_root = Tensor(), bool retain_graph = false);
void backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& grad_roots,
              bool retain_graph = false);

// Creates a fresh TensorImpl over the same storage/shape/strides/offset as t,
// with no autograd meta (used for outputs that must not share t's impl).
Tensor alias(const Tensor& t);

}  // namespace ringtrain::autograd
