// engine.cc: the backward engine and the AccumulateGrad node.
//
// backward(roots) runs in three phases on the calling thread, with grad mode off:
//
//   1. discover: walk the graph from the roots' nodes once, counting for every
//      node how many edges point at it (its dependencies: the number of
//      gradients it must receive before it can run);
//   2. execute: a node is ready when its count reaches zero. Ready nodes wait in
//      a priority queue ordered by sequence number, largest first: the node created
//      last in the forward runs first, and AccumulateGrad nodes (sequence number
//      UINT64_MAX) run as soon as they are ready, so a parameter's gradient is
//      delivered (and its post-accumulate hooks fire) the moment it is complete.
//      Running a node = its pre-hooks (non-leaf grad hooks) on the summed input
//      gradient, then its derivative rule; each returned gradient is checked
//      against the input's shape/dtype and summed into the InputBuffer of the
//      next node. Unless retain_graph, the node then frees its saved tensors;
//   3. finish: callbacks queued with queue_callback() during this backward run in
//      queue order (a callback may queue more), then backward() returns.
//
// Summing gradients reuses memory: a buffer that nobody else references is
// updated in place (add_), and AccumulateGrad "steals" a gradient nobody else
// references as the leaf's .grad instead of copying it (as PyTorch does).
#include <queue>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "autograd/autograd.h"
#include "autograd/graph.h"
#include "tensor/checks.h"
#include "tensor/ops.h"

namespace ringtrain::autograd {

namespace {

// State of one running backward() (one per nesting level on this thread).
struct GraphTask {
  std::vector<std::function<void()>> callbacks;  // queue_callback(), run at the end in order
};

thread_local std::vector<GraphTask*> t_running_tasks;  // innermost last

// Pushes/pops the running task (exception-safe).
class TaskScope {
 public:
  explicit TaskScope(GraphTask* task) { t_running_tasks.push_back(task); }
  ~TaskScope() { t_running_tasks.pop_back(); }
  TaskScope(const TaskScope&) = delete;
  TaskScope& operator=(const TaskScope&) = delete;
};

// True when `t` may be modified in place or adopted without anyone noticing: this
// handle (plus `extra_refs` known ones) is the only reference to its impl, it is
// the only view of its storage, and it covers the storage exactly, contiguously.
bool exclusively_owned(const Tensor& t, long extra_refs) {
  return t.impl_ptr().use_count() <= 1 + extra_refs && t.storage().use_count() == 1 &&
         t.is_contiguous() && t.offset() == 0 && t.storage()->nbytes() == t.nbytes() &&
         meta_or_null(t) == nullptr;
}

// Adds `g` into the buffer slot (the slot takes `g` when empty).
void accumulate_into(Tensor& slot, Tensor g) {
  if (!g.defined()) return;
  if (!slot.defined()) {
    slot = std::move(g);
  } else if (exclusively_owned(slot, 0) && slot.shape() == g.shape()) {
    add_(slot, g);
  } else {
    slot = add(slot, g);
  }
}

struct ReadyEntry {
  uint64_t sequence_nr;
  std::shared_ptr<Node> node;
  bool operator<(const ReadyEntry& other) const { return sequence_nr < other.sequence_nr; }
};

// A grad hook's replacement must look like the gradient it replaces: the rules and
// AccumulateGrad compute with it next to tensors of the original dtype and device, where
// a mismatch would fail inside some op (or, at a fresh leaf, be converted silently).
void check_hook_result(const Tensor& replaced, const Tensor& g, const std::string& where) {
  RT_CHECK(replaced.defined() && replaced.shape() == g.shape() && replaced.dtype() == g.dtype() &&
               replaced.device() == g.device(),
           "autograd: a grad hook on ", where, " returned ",
           replaced.defined() ? replaced.describe() : "an undefined tensor", " for the gradient ", g.describe(),
           "; a hook must return a tensor of the gradient's shape, dtype and device (return the "
           "argument itself to only observe it)");
}

void check_grad_matches(const Node& node, size_t i, const Tensor& g) {
  RT_CHECK(g.shape() == node.input_shapes[i], "autograd: the backward of ", node.name(),
           " produced a gradient of shape ", shape_str(g.shape()), " for input ", i,
           ", whose shape is ", shape_str(node.input_shapes[i]));
  RT_CHECK(g.dtype() == node.input_dtypes[i], "autograd: the backward of ", node.name(),
           " produced a ", dtype_name(g.dtype()), " gradient for input ", i, ", which is ",
           dtype_name(node.input_dtypes[i]));
}

}  // namespace

void queue_callback(std::function<void()> callback) {
  RT_CHECK(!t_running_tasks.empty(), "queue_callback: no backward pass is running on this thread; "
           "queue the callback from a hook that runs during backward()");
  t_running_tasks.back()->callbacks.push_back(std::move(callback));
}

bool in_backward() { return !t_running_tasks.empty(); }

// ---------------------------------------------------------------- AccumulateGrad

std::vector<Tensor> AccumulateGrad::apply(const Tensor& grad) {
  AutogradMeta& m = meta(variable_);
  Tensor g = grad;
  // Copy: a hook may register or remove hooks (a one-shot hook removes itself).
  const auto grad_hooks = m.grad_hooks;
  for (auto& [id, hook] : grad_hooks) {
    Tensor replaced = hook(g);
    check_hook_result(replaced, g, "leaf " + variable_.describe());
    g = std::move(replaced);
  }
  if (!m.grad.defined() && m.grad_destination.defined()) {
    // A preallocated destination (set_grad_destination): the rule that produced `g`
    // may already have written it there (then nothing moves); otherwise copy it in.
    Tensor destination = std::exchange(m.grad_destination, Tensor());
    m.destination_claimed = false;
    if (!g.is_same(destination)) destination.copy_(g);
    m.grad = std::move(destination);
  } else if (!m.grad.defined()) {
    // `grad` is held by the engine (1) and by `g` (1) when no hook replaced it.
    long known_refs = g.is_same(grad) ? 1 : 0;
    if (exclusively_owned(g, known_refs) && g.dtype() == variable_.dtype())
      m.grad = g;
    else
      m.grad = g.to(variable_.dtype()).clone().view(variable_.shape());
  } else {
    add_(m.grad, g);
  }
  // Copy: a hook may register/remove hooks.
  auto post_hooks = m.post_accumulate_hooks;
  for (auto& [id, hook] : post_hooks) hook(variable_);
  return {};
}

// ---------------------------------------------------------------- backward

void backward(const Tensor& root, const Tensor& grad_root, bool retain_graph) {
  backward(std::vector<Tensor>{root}, std::vector<Tensor>{grad_root}, retain_graph);
}

void backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& grad_roots,
              bool retain_graph) {
  RT_CHECK(grad_roots.empty() || grad_roots.size() == roots.size(), "backward: ", roots.size(),
           " roots but ", grad_roots.size(), " root gradients");
  NoGradGuard no_grad;

  // ---- the roots' edges and starting gradients ----
  std::unordered_map<Node*, Tensor> buffers;  // InputBuffer: summed gradient per pending node
  std::vector<std::shared_ptr<Node>> root_nodes;
  for (size_t i = 0; i < roots.size(); ++i) {
    const Tensor& root = roots[i];
    RT_CHECK(root.defined(), "backward: root ", i, " is an undefined tensor");
    RT_CHECK(requires_grad(root), "backward: ", root.describe(),
             " does not require grad and has no grad_fn (no parameter in its computation "
             "requires grad, or it was computed under no_grad)");
    Tensor g = grad_roots.empty() ? Tensor() : grad_roots[i];
    if (!g.defined()) {
      RT_CHECK(root.numel() == 1, "backward: a gradient can be created implicitly only for a "
               "one-element (scalar) output, but the root is ", root.describe(),
               "; reduce it first (e.g. sum or mean) or pass the gradient explicitly");
      g = ones_like(root);
    } else {
      RT_CHECK(g.shape() == root.shape() && g.dtype() == root.dtype() && g.device() == root.device(),
               "backward: the gradient ", g.describe(), " for root ", i, " must have the root's shape, "
               "dtype and device, but the root is ", root.describe(), "; make it with e.g. "
               "ones_like(root) or convert it (g.to(root.device(), root.dtype()))");
    }
    Edge edge = gradient_edge(root);
    if (!edge.node) continue;
    accumulate_into(buffers[edge.node.get()], std::move(g));
    root_nodes.push_back(edge.node);
  }

  // ---- phase 1: count dependencies ----
  std::unordered_map<Node*, int> dependencies;
  std::unordered_set<Node*> seen;
  std::vector<Node*> stack;
  for (auto& n : root_nodes)
    if (seen.insert(n.get()).second) stack.push_back(n.get());
  while (!stack.empty()) {
    Node* n = stack.back();
    stack.pop_back();
    for (const Edge& e : n->next_edges) {
      if (!e.node) continue;
      ++dependencies[e.node.get()];
      if (seen.insert(e.node.get()).second) stack.push_back(e.node.get());
    }
  }

  // ---- phase 2: execute in dependency order ----
  GraphTask task;
  TaskScope scope(&task);
  std::priority_queue<ReadyEntry> ready;
  std::unordered_set<Node*> queued;
  for (auto& n : root_nodes)
    if (dependencies[n.get()] == 0 && queued.insert(n.get()).second)
      ready.push({n->sequence_nr, n});

  while (!ready.empty()) {
    std::shared_ptr<Node> node = ready.top().node;
    ready.pop();
    Tensor g;
    if (auto it = buffers.find(node.get()); it != buffers.end()) {
      g = std::move(it->second);
      buffers.erase(it);
    }
    std::vector<Tensor> grads;
    if (g.defined()) {
      const auto pre_hooks = node->pre_hooks;  // copy: a hook may register or remove hooks
      for (auto& [id, hook] : pre_hooks) {
        Tensor replaced = hook(g);
        check_hook_result(replaced, g, "the output of " + node->name());
        g = std::move(replaced);
      }
      if (node->retain_grad_hook) node->retain_grad_hook(g);  // after every hook
      grads = node->apply(g);
      g = Tensor();
      if (!retain_graph) node->release();
      RT_CHECK(grads.empty() || grads.size() == node->next_edges.size(), "autograd: the backward of ",
               node->name(), " returned ", grads.size(), " gradients for ", node->next_edges.size(),
               " inputs");
    }
    for (size_t i = 0; i < node->next_edges.size(); ++i) {
      const std::shared_ptr<Node>& next = node->next_edges[i].node;
      if (!next) continue;
      if (i < grads.size() && grads[i].defined()) {
        check_grad_matches(*node, i, grads[i]);
        accumulate_into(buffers[next.get()], std::move(grads[i]));
      }
      if (--dependencies[next.get()] == 0 && queued.insert(next.get()).second)
        ready.push({next->sequence_nr, next});
    }
  }

  // ---- phase 3: end-of-backward callbacks (may queue more) ----
  for (size_t i = 0; i < task.callbacks.size(); ++i) {
    auto callback = std::move(task.callbacks[i]);
    callback();
  }
}

}  // namespace ringtrain::autograd
