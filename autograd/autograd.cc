// autograd.cc: the tensor-side half of autograd: AutogradMeta access, grad mode,
// SavedTensor's version check, hooks, detach, and record() which wires a forward
// op's output into the graph. The engine that runs the graph is in engine.cc.
#include <atomic>
#include <mutex>

#include "autograd/autograd.h"
#include "autograd/graph.h"
#include "tensor/checks.h"
#include "tensor/memory_overlap.h"
#include "tensor/ops.h"

namespace ringtrain::autograd {

namespace {
thread_local bool t_grad_enabled = true;
// Global creation counter: later nodes run first among ready nodes.
std::atomic<uint64_t> g_next_sequence_nr{0};
}  // namespace

bool grad_enabled() { return t_grad_enabled; }
void set_grad_enabled(bool enabled) { t_grad_enabled = enabled; }

void HookHandle::remove() {
  if (remover_) {
    auto remover = std::move(remover_);
    remover_ = nullptr;
    remover();
  }
}

// ---------------------------------------------------------------- meta access

AutogradMeta& meta(const Tensor& t) {
  RT_CHECK(t.defined(), "autograd: undefined tensor");
  auto& slot = t.unsafe_impl()->autograd_meta;
  if (!slot) slot = std::make_shared<AutogradMeta>();
  return *slot;
}

AutogradMeta* meta_or_null(const Tensor& t) {
  if (!t.defined()) return nullptr;
  return t.unsafe_impl()->autograd_meta.get();
}

const Tensor& set_requires_grad(const Tensor& t, bool requires_grad) {
  RT_CHECK(t.defined(), "set_requires_grad: undefined tensor");
  AutogradMeta* m = meta_or_null(t);
  // A computed tensor requires grad already: asking for that again is a no-op (PyTorch's
  // requires_grad_()); only turning it off is an error.
  if (m && m->grad_fn && requires_grad) return t;
  RT_CHECK(!(m && m->grad_fn), "set_requires_grad: ", t.describe(),
           " is not a leaf (it was computed by ", m ? m->grad_fn->name() : "",
           "), so it cannot stop requiring grad; use detach() for a copy without history");
  RT_CHECK(!requires_grad || is_floating_point(t.dtype()),
           "set_requires_grad: only floating-point tensors can require grad, got ", t.describe());
  if (!m && !requires_grad) return t;
  meta(t).requires_grad = requires_grad;
  return t;
}

bool requires_grad(const Tensor& t) {
  const AutogradMeta* m = meta_or_null(t);
  return m && (m->requires_grad || m->grad_fn);
}

bool is_leaf(const Tensor& t) {
  const AutogradMeta* m = meta_or_null(t);
  return !m || !m->grad_fn;
}

Tensor grad(const Tensor& t) {
  const AutogradMeta* m = meta_or_null(t);
  return m ? m->grad : Tensor();
}

namespace {
// A gradient buffer for `t` that backward will write (accumulate) into: the leaf's
// shape, dtype and device, no two elements at one address, and none of the leaf's
// own memory (else backward would overwrite the parameter). `op` names the caller.
void check_grad_buffer(const Tensor& t, const Tensor& g, const char* op, const char* what) {
  RT_CHECK(t.defined(), op, ": the tensor is undefined");
  RT_CHECK(g.shape() == t.shape(), op, ": ", what, " ", g.describe(), " does not match the shape of the tensor ",
           t.describe());
  RT_CHECK(g.dtype() == t.dtype(), op, ": ", what, " ", g.describe(), " has another dtype than the tensor ",
           t.describe(), "; convert it first (g.to(", dtype_name(t.dtype()), "))");
  RT_CHECK(g.device() == t.device(), op, ": ", what, " ", g.describe(), " is on another device than the tensor ",
           t.describe(), "; move it first (g.to(", t.device().str(), "))");
  for (int64_t d = 0; d < g.dim(); ++d)
    RT_CHECK(g.size(d) <= 1 || g.stride(d) != 0, op, ": ", what, " ", g.describe(), " has stride 0 in dim ", d,
             " (an expanded view), so several of its elements are one memory location and backward could "
             "not accumulate into it; pass a contiguous tensor (clone() it first)");
  RT_CHECK(memory_overlap(g, t) == MemoryOverlap::kNone, op, ": ", what, " ", g.describe(),
           " shares memory with the tensor ", t.describe(), " itself, so backward would overwrite the "
           "tensor's values with its gradient; pass a separate buffer (clone() it first)");
}
}  // namespace

void set_grad(const Tensor& t, const Tensor& g) {
  if (g.defined()) {
    check_grad_buffer(t, g, "set_grad", "gradient");
    meta(t).grad = g;
  } else if (AutogradMeta* m = meta_or_null(t)) {
    m->grad = Tensor();
  }
}

void set_grad_destination(const Tensor& t, const Tensor& destination) {
  if (destination.defined()) {
    check_grad_buffer(t, destination, "set_grad_destination", "the destination");
    RT_CHECK(destination.is_contiguous(), "set_grad_destination: the destination must be contiguous; got ",
             destination.describe(), " for ", t.describe());
    RT_CHECK(is_leaf(t), "set_grad_destination: ", t.describe(), " is not a leaf (only leaves "
             "accumulate .grad)");
    AutogradMeta& m = meta(t);
    m.grad_destination = destination;
    m.destination_claimed = false;
  } else if (AutogradMeta* m = meta_or_null(t)) {
    m->grad_destination = Tensor();
    m->destination_claimed = false;
  }
}

std::shared_ptr<Node> grad_fn(const Tensor& t) {
  const AutogradMeta* m = meta_or_null(t);
  return m ? m->grad_fn : nullptr;
}

Tensor alias(const Tensor& t) {
  RT_CHECK(t.defined(), "autograd::alias: undefined tensor");
  auto impl = std::make_shared<TensorImpl>();
  const TensorImpl& src = *t.unsafe_impl();
  impl->storage = src.storage;
  impl->shape = src.shape;
  impl->strides = src.strides;
  impl->offset = src.offset;
  impl->dtype = src.dtype;
  return Tensor(std::move(impl));
}

Tensor detach(const Tensor& t) { return alias(t); }

void retain_grad(const Tensor& t) {
  RT_CHECK(requires_grad(t), "retain_grad: ", t.describe(), " does not require grad");
  AutogradMeta& m = meta(t);
  if (!m.grad_fn || m.retains_grad) return;  // leaves keep .grad anyway
  m.retains_grad = true;
  std::weak_ptr<AutogradMeta> weak = t.unsafe_impl()->autograd_meta;
  m.grad_fn->retain_grad_hook = [weak](const Tensor& g) {
    if (auto mm = weak.lock()) {
      if (mm->grad.defined())
        add_(mm->grad, g);
      else
        mm->grad = g.clone();
    }
  };
}

// ---------------------------------------------------------------- hooks

HookHandle register_hook(const Tensor& t, GradHook hook) {
  RT_CHECK(requires_grad(t), "register_hook: ", t.describe(),
           " does not require grad, so no gradient will ever reach the hook");
  AutogradMeta& m = meta(t);
  if (m.grad_fn) {
    std::shared_ptr<Node> node = m.grad_fn;
    uint64_t id = node->next_hook_id++;
    node->pre_hooks.emplace_back(id, std::move(hook));
    std::weak_ptr<Node> weak = node;
    return HookHandle([weak, id] {
      if (auto n = weak.lock())
        std::erase_if(n->pre_hooks, [id](const Node::PreHook& h) { return h.first == id; });
    });
  }
  uint64_t id = m.next_hook_id++;
  m.grad_hooks.emplace_back(id, std::move(hook));
  std::weak_ptr<AutogradMeta> weak = t.unsafe_impl()->autograd_meta;
  return HookHandle([weak, id] {
    if (auto mm = weak.lock())
      std::erase_if(mm->grad_hooks, [id](const auto& h) { return h.first == id; });
  });
}

HookHandle register_post_accumulate_grad_hook(const Tensor& leaf, PostAccumulateGradHook hook) {
  RT_CHECK(requires_grad(leaf) && is_leaf(leaf), "register_post_accumulate_grad_hook: ",
           leaf.describe(), " must be a leaf that requires grad (a parameter)");
  AutogradMeta& m = meta(leaf);
  uint64_t id = m.next_hook_id++;
  m.post_accumulate_hooks.emplace_back(id, std::move(hook));
  std::weak_ptr<AutogradMeta> weak = leaf.unsafe_impl()->autograd_meta;
  return HookHandle([weak, id] {
    if (auto mm = weak.lock())
      std::erase_if(mm->post_accumulate_hooks, [id](const auto& h) { return h.first == id; });
  });
}

// ---------------------------------------------------------------- nodes

Node::Node(std::string name) : name_(std::move(name)), sequence_nr(g_next_sequence_nr++) {}

SavedTensor::SavedTensor(const Tensor& t) {
  if (!t.defined()) return;
  was_defined_ = true;
  data_ = alias(t);
  original_ = t.impl_ptr();
  saved_version_ = t.version();
}

const Tensor& SavedTensor::get(const std::string& op, const char* what) const {
  if (!was_defined_) return data_;  // an optional input that was absent
  RT_CHECK(data_.defined(), "autograd: ", op, ": saved ", what,
           " is gone: trying to backward through the graph a second time (or after its saved "
           "tensors were freed); pass retain_graph=true to the first backward()");
  // The version is the storage's, so a write through any view or alias of the saved
  // tensor counts (y.view(...).add_(1) after exp saved y); a tensor given new storage in
  // place (Module::to, load_state_dict) counts as modified too.
  const auto orig = original_.lock();
  const bool replaced = orig != nullptr && orig->storage != data_.storage();
  RT_CHECK(!replaced && data_.version() == saved_version_, "autograd: ", op, ": ", what,
           " saved for backward was modified by an in-place operation (",
           replaced ? std::string("it was given new storage") :
                      "version " + std::to_string(data_.version()) + ", expected " + std::to_string(saved_version_),
           "; in-place writes through any view of it count); make a copy (clone()) before modifying "
           "it in place, or modify it out of place");
  return data_;
}

void SavedTensor::reset() {
  data_ = Tensor();
  original_.reset();
}

const Tensor& BackwardContext::saved(size_t i) const {
  RT_CHECK(i < saved_.size(), "autograd: ", node_.name(), " asked for saved tensor ", i, " of ",
           saved_.size());
  static const char* kWhat[] = {"saved tensor 0", "saved tensor 1", "saved tensor 2",
                                "saved tensor 3", "saved tensor 4", "saved tensor 5"};
  return saved_[i].get(node_.name(), i < 6 ? kWhat[i] : "a saved tensor");
}

bool BackwardContext::needs(size_t i) const {
  return i < node_.next_edges.size() && node_.next_edges[i].node != nullptr;
}

Tensor BackwardContext::destination(size_t i) const {
  if (!needs(i)) return Tensor();
  auto* accumulate = dynamic_cast<AccumulateGrad*>(node_.next_edges[i].node.get());
  if (!accumulate) return Tensor();  // the gradient flows on through another op
  AutogradMeta* m = meta_or_null(accumulate->variable());
  if (!m || m->grad.defined() || !m->grad_destination.defined() || m->destination_claimed ||
      !m->grad_hooks.empty())
    return Tensor();
  // Claimed: a second rule feeding the same leaf (a weight used twice) computes its
  // gradient on its own, and the engine adds the two before AccumulateGrad.
  m->destination_claimed = true;
  return m->grad_destination;
}

FunctionNode::FunctionNode(std::string name, BackwardFn fn, std::vector<SavedTensor> saved)
    : Node(std::move(name)), fn_(std::move(fn)), saved_(std::move(saved)) {}

std::vector<Tensor> FunctionNode::apply(const Tensor& grad_output) {
  RT_CHECK(!released_ && fn_, "autograd: trying to backward through the graph a second time "
           "(node ", name_, " was already run and its saved tensors freed); pass "
           "retain_graph=true to the first backward() if you need to backward twice");
  BackwardContext ctx(*this, saved_);
  return fn_(grad_output, ctx);
}

void FunctionNode::release() {
  released_ = true;
  fn_ = nullptr;  // drops any tensors the lambda captured (masks, indices)
  saved_.clear();
}

AccumulateGrad::AccumulateGrad(Tensor variable)
    : Node("AccumulateGrad"), variable_(std::move(variable)) {
  sequence_nr = UINT64_MAX;  // run a leaf's accumulation as soon as its gradient is ready
  next_edges.clear();
}

Edge gradient_edge(const Tensor& t) {
  AutogradMeta* m = meta_or_null(t);
  if (!m) return Edge{};
  if (m->grad_fn) return Edge{m->grad_fn};
  if (!m->requires_grad) return Edge{};
  // Forwards on several threads (DataParallel replicas) may share a leaf: make
  // its one AccumulateGrad under a lock so they all reach the same node.
  static std::mutex accumulator_mutex;
  std::lock_guard<std::mutex> lock(accumulator_mutex);
  std::shared_ptr<Node> acc = m->grad_accumulator.lock();
  if (!acc) {
    acc = std::make_shared<AccumulateGrad>(t);
    m->grad_accumulator = acc;
  }
  return Edge{acc};
}

bool any_requires_grad(const std::vector<Tensor>& inputs) {
  if (!grad_enabled()) return false;
  for (const Tensor& t : inputs)
    if (t.defined() && requires_grad(t)) return true;
  return false;
}

Tensor record(const char* name, const std::vector<Tensor>& inputs, Tensor out,
              const std::vector<Tensor>& saved, BackwardFn fn) {
  // An integer result carries no gradient (its values are piecewise constant): as in
  // PyTorch, it ends the graph, so a cast to int64 or an index output never requires grad.
  if (!any_requires_grad(inputs) || !is_floating_point(out.dtype())) return out;
  Tensor original_out = out;
  for (const Tensor& in : inputs)
    if (in.defined() && out.is_same(in)) {
      out = alias(out);
      break;
    }
  // An op may also hand back a tensor that already has autograd state (never ours
  // to overwrite); give it a fresh impl too.
  if (meta_or_null(out)) out = alias(out);
  std::vector<SavedTensor> saved_tensors;
  saved_tensors.reserve(saved.size());
  for (const Tensor& s : saved) saved_tensors.emplace_back(s.is_same(original_out) ? out : s);
  auto node = std::make_shared<FunctionNode>(name, std::move(fn), std::move(saved_tensors));
  node->next_edges.reserve(inputs.size());
  for (const Tensor& in : inputs) {
    node->next_edges.push_back(in.defined() ? gradient_edge(in) : Edge{});
    node->input_shapes.push_back(in.defined() ? in.shape() : Shape{});
    node->input_dtypes.push_back(in.defined() ? in.dtype() : DType::kFloat32);
  }
  AutogradMeta& m = meta(out);
  m.grad_fn = std::move(node);
  m.requires_grad = true;
  return out;
}

}  // namespace ringtrain::autograd
