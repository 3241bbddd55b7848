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
#include <optional>
#include <string>
#include <string_view>
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
  // Throws (changing nothing) unless lr is finite and >= 0.
  void set_lr(double lr);
};

// An optimizer's saved state: named tensors plus JSON-able scalars.
struct OptimizerState {
  StateDict tensors;      // "state.<param_index>.<name>" -> tensor (shares storage; clone to keep)
  nlohmann::json scalars;  // {"type", "param_groups": [...], "state": {"<i>": {"step": n}}}
};

// An optimizer-state tensor's name, "state.<param index>.<buffer>", split into its
// parts; nullopt for any other form (no "state." prefix, an index that is not a
// decimal number, an empty buffer name). state_dict() writes these names;
// load_state_dict and checkpoints read them through this one parser.
struct StateTensorName {
  size_t param_index = 0;
  std::string buffer;  // "momentum_buffer", "exp_avg", ...
};
std::optional<StateTensorName> parse_state_tensor_name(std::string_view name);

class Optimizer {
 public:
  // `defaults` are the hyperparameters every group starts from; a group's own
  // options override them. Throws when a parameter is not a leaf (an op's result),
  // appears twice, or a group is empty, and when an option is out of PyTorch's ranges or
  // not finite: lr, momentum, weight_decay, eps >= 0; beta1, beta2 in [0, 1);
  // nesterov, amsgrad 0 or 1; Nesterov needs momentum > 0 and dampening = 0.
  // step() checks the same again (options may be edited through param_groups()).
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
  // Restores groups' options and per-parameter state. Checks everything first and
  // throws (changing nothing, naming the key) when the type, the number of groups or
  // their sizes differ, an option is unknown, not a number or out of range, a state
  // key is not a parameter index, a step count is not an integer >= 0, a state
  // tensor is undefined, mis-shaped or unknown to this optimizer, or a parameter's
  // state lacks one of its buffers (e.g. a momentum step count without the buffer).
  void load_state_dict(const OptimizerState& state);

 protected:
  // Per-parameter state: step count and named buffers, created at first step.
  struct ParamState {
    int64_t step = 0;                     // updates applied to this parameter
    std::map<std::string, Tensor> bufs;   // "momentum_buffer", "exp_avg", "exp_avg_sq", ...
  };
  // The buffers a parameter's state holds, checked by load_state_dict: every required
  // one must be there, no name outside required + optional is accepted. `any`: no
  // check (the base's default).
  struct StateSpec {
    std::vector<std::string> required, optional;
    bool any = true;
  };
  virtual StateSpec state_spec() const { return {}; }
  // Throws when a group's options are out of range (step() calls it first).
  void check_groups(const char* op) const;

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

 protected:
  StateSpec state_spec() const override;
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
  StateSpec state_spec() const override;
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
// clipping. Parameters without a gradient are skipped; an undefined Tensor in
// `params` and a max_norm that is NaN or negative throw (0 zeroes the gradients,
// infinity only measures the norm, as in PyTorch).
double clip_grad_norm_(const std::vector<Tensor>& params, double max_norm);

}  // namespace ringtrain::nn
