// optim.h: optimizers, gradient clipping.
//
// defines: ParamGroup, OptimizerState, Optimizer (base: step, zero_grad,
//          param groups, state_dict/load_state_dict), SGD (momentum, dampening,
//          Nesterov, weight decay), Adam, AdamW, clip_grad_norm_.
//
// Where it sits: after backward has accumulated (and DDP has averaged) every
// parameter's .grad, step() updates the parameters in place (same tensor
// objects, so the model, DDP and checkpoints keep seeing them). All updates run
// under no_grad and use in-place tensor ops; the per-parameter state
// (momentum_buffer, exp_avg, exp_avg_sq) is allocated lazily at the first step,
// as in PyTorch, and the formulas are PyTorch's (torch/optim/sgd.py, adam.py,
// adamw.py), so one step gives the same numbers.
//
// Hyperparameters live in each ParamGroup's `options` (name -> double; booleans
// are 0/1), so an LR schedule (nn/lr_scheduler.h) sets group.options["lr"] and a
// checkpoint stores every group as plain JSON.
//
// state_dict(): tensors are named "state.<param_index>.<name>" (param_index
// counts parameters across groups in order, like PyTorch's packed state); the
// scalars are JSON: {"type": "SGD", "param_groups": [{"lr": .., ..., "params": [0, 1]}],
// "state": {"<param_index>": {"step": 3}}}. That pair maps directly onto a
// safetensors file plus a JSON metadata entry.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "nn/module.h"
#include "tensor/tensor.h"

namespace ringtrain::nn {

// A set of parameters sharing hyperparameters.
struct ParamGroup {
  std::vector<Tensor> params;             // the parameter handles (the model's own tensors)
  std::map<std::string, double> options;  // "lr", "momentum", "weight_decay", "betas0", ... (bools 0/1)

  double lr() const { return options.at("lr"); }
  void set_lr(double lr) { options["lr"] = lr; }
};

// An optimizer's saved state: named tensors plus JSON-able scalars.
struct OptimizerState {
  StateDict tensors;      // "state.<param_index>.<name>" -> tensor (shares storage; clone to keep)
  nlohmann::json scalars;  // {"type", "param_groups": [...], "state": {"<i>": {"step": n}}}
};

class Optimizer {
 public:
  // `defaults` are the hyperparameters every group starts from; a group's own
  // options override them. Throws when a parameter does not require grad, appears
  // twice, or a group is empty.
  Optimizer(std::string type_name, std::vector<ParamGroup> groups,
            std::map<std::string, double> defaults);
  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  // One update of every parameter that has a gradient (parameters without one are
  // skipped, as in PyTorch). Runs under no_grad.
  virtual void step() = 0;
  // Gradients of all parameters to undefined (set_to_none, default) or zero.
  void zero_grad(bool set_to_none = true);

  std::vector<ParamGroup>& param_groups() { return groups_; }
  const std::vector<ParamGroup>& param_groups() const { return groups_; }
  void add_param_group(ParamGroup group);
  const std::string& type_name() const { return type_name_; }

  OptimizerState state_dict() const;
  // Restores groups' options and per-parameter state. Throws (changing nothing) when
  // the type, the number of groups or their sizes, or a state tensor's shape differ.
  void load_state_dict(const OptimizerState& state);

 protected:
  // Per-parameter state: step count and named buffers, created at first step.
  struct ParamState {
    int64_t step = 0;                     // updates applied to this parameter
    std::map<std::string, Tensor> bufs;   // "momentum_buffer", "exp_avg", "exp_avg_sq", ...
  };
  // State of the parameter at global index `index` (creates it empty).
  ParamState& state_at(size_t index) { return state_[index]; }
  bool has_state(size_t index) const { return state_.count(index) != 0; }

  std::string type_name_;                    // "SGD", "Adam", "AdamW": checked on load
  std::map<std::string, double> defaults_;   // hyperparameters a new group starts from
  std::vector<ParamGroup> groups_;           // the parameter groups, in order
  std::map<size_t, ParamState> state_;       // global param index -> state (lazily created)
};

struct SGDOptions {
  double lr = 0.01;
  double momentum = 0.0;
  double dampening = 0.0;
  double weight_decay = 0.0;
  bool nesterov = false;
};

// PyTorch's SGD: g += wd * p; with momentum: buf = g at the first step, else
// buf = momentum * buf + (1 - dampening) * g; g = nesterov ? g + momentum * buf : buf;
// p -= lr * g.
class SGD : public Optimizer {
 public:
  SGD(std::vector<Tensor> params, SGDOptions options);
  SGD(std::vector<ParamGroup> groups, SGDOptions defaults);
  void step() override;
};

struct AdamOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;  // Adam: L2 added to the gradient; AdamW: decoupled
  bool amsgrad = false;
};

// PyTorch's Adam: g += wd * p; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
// p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps).
class Adam : public Optimizer {
 public:
  Adam(std::vector<Tensor> params, AdamOptions options);
  Adam(std::vector<ParamGroup> groups, AdamOptions defaults);
  void step() override;

 protected:
  Adam(std::string type_name, std::vector<ParamGroup> groups, AdamOptions defaults);
  void adam_step(bool decoupled_weight_decay);
};

// AdamW's options: Adam's with PyTorch's AdamW default weight_decay = 0.01.
struct AdamWOptions : AdamOptions {
  AdamWOptions() { weight_decay = 0.01; }
};

// PyTorch's AdamW: p *= 1 - lr * wd, then the Adam update without L2 in the gradient.
class AdamW : public Adam {
 public:
  AdamW(std::vector<Tensor> params, AdamWOptions options);
  AdamW(std::vector<ParamGroup> groups, AdamWOptions defaults);
  void step() override;
};

// Scales all gradients so that their global L2 norm (over every parameter, like
// torch.nn.utils.clip_grad_norm_) is at most max_norm; returns the norm before
// clipping. Parameters without a gradient are skipped.
double clip_grad_norm_(const std::vector<Tensor>& params, double max_norm);

}  // namespace ringtrain::nn
