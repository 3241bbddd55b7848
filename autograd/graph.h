// graph.h: how a differentiable op puts itself into the backward graph.
//
// defines: BackwardContext, BackwardFn, FunctionNode (a Node whose derivative
//          rule is a lambda written next to the forward), AccumulateGrad (the node
//          at a leaf that adds into .grad and fires the post-accumulate hooks),
//          record() (wires an op's output to a new FunctionNode), gradient_edge().
//
// Where it sits: autograd/functions.cc calls record() after computing each
// forward with tensor/ops.h; engine.cc runs the nodes. A new op is written as
//
//   Tensor mul(const Tensor& a, const Tensor& b) {
//     return record("mul", {a, b}, ringtrain::mul(a, b), /*saved=*/{a, b},
//                   [](const Tensor& g, BackwardContext& c) -> std::vector<Tensor> {
//                     return {ringtrain::mul(g, c.saved(1)), ringtrain::mul(g, c.saved(0))};
//                   });
//   }
//
// record() does nothing but return the output when grad mode is off or no input
// requires grad, so inference pays only for the forward.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "autograd/autograd.h"

namespace ringtrain::autograd {

class FunctionNode;

// What a derivative rule sees besides the output gradient.
class BackwardContext {
 public:
  BackwardContext(const FunctionNode& node, const std::vector<SavedTensor>& saved)
      : node_(node), saved_(saved) {}
  // Saved tensor i, checked against in-place modification since the forward.
  const Tensor& saved(size_t i) const;
  // Whether input i needs a gradient (lets a rule skip work, e.g. a GEMM).
  bool needs(size_t i) const;
  // Where the gradient of input i may be written in place, or an undefined tensor:
  // defined only when input i is a leaf with a grad destination (set_grad_destination,
  // which checked it has the leaf's shape and dtype), no .grad yet and no grad hooks,
  // and only for the first rule that asks in this backward. A rule that gets one must
  // fill every element and return that same tensor as gradient i.
  Tensor destination(size_t i) const;

 private:
  const FunctionNode& node_;
  const std::vector<SavedTensor>& saved_;
};

// Returns one gradient per forward input (undefined where not needed).
using BackwardFn = std::function<std::vector<Tensor>(const Tensor& grad_output, BackwardContext& ctx)>;

class FunctionNode : public Node {
 public:
  FunctionNode(std::string name, BackwardFn fn, std::vector<SavedTensor> saved);
  std::vector<Tensor> apply(const Tensor& grad_output) override;
  void release() override;

 private:
  BackwardFn fn_;                   // the derivative rule; null once released
  std::vector<SavedTensor> saved_;  // tensors the rule reads (aliases + versions)
};

// The node at a leaf that requires grad. Holds the leaf strongly (the leaf's meta
// holds this node weakly, so there is no cycle).
class AccumulateGrad : public Node {
 public:
  explicit AccumulateGrad(Tensor variable);
  std::vector<Tensor> apply(const Tensor& grad) override;
  void release() override {}  // nothing saved: a leaf can be reached by many backwards
  const Tensor& variable() const { return variable_; }

 private:
  Tensor variable_;  // the leaf whose .grad this node updates
};

// The edge along which a gradient for `t` travels: its grad_fn, or its leaf
// AccumulateGrad (created on first use), or a null edge when t needs no gradient.
Edge gradient_edge(const Tensor& t);

// True when grad mode is on and any defined input requires grad.
bool any_requires_grad(const std::vector<Tensor>& inputs);

// Wires `out` (the forward result of op `name` over `inputs`) into the graph when
// needed and returns it. `saved` are the tensors the rule reads (inputs and/or out).
// If `out` shares its TensorImpl with an input (a view op that returned self), a
// fresh alias is made so the input's own history is not overwritten. An integer
// `out` is returned as it is: it ends the graph (only floating tensors require grad).
Tensor record(const char* name, const std::vector<Tensor>& inputs, Tensor out,
              const std::vector<Tensor>& saved, BackwardFn fn);

}  // namespace ringtrain::autograd
