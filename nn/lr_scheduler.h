// lr_scheduler.h: learning-rate schedules that set each param group's "lr".
//
// defines: LRScheduler (base: step(), last_epoch, get_last_lr, state_dict as
//          JSON), StepLR, CosineAnnealingLR, LinearWarmup (linear ramp, then
//          the base lr or, with after_t_max > 0, a built-in cosine decay).
//
// Where it sits: the training loop calls optimizer.step() then scheduler.step()
// once per epoch (or per iteration, the user's choice). A schedule computes the
// lr from (base_lrs, last_epoch, its hyperparameters) in closed form. Constructing
// a schedule records the groups' current lr as base_lrs and applies epoch 0's lr
// (PyTorch does the same).
//
// State and resume. The JSON state is {"type", "last_epoch", "base_lrs": [...]}
// plus the schedule's hyperparameters under their constructor names ("step_size",
// "gamma"; "t_max", "eta_min"; "warmup_steps", "start_factor", "after_t_max",
// "after_eta_min"). Loading restores all of them, as PyTorch's
// LRScheduler.load_state_dict restores its whole __dict__: the saved values win
// over the constructor's, so a run resumed with another t_max (digits_train
// --epochs 40 after a run of 30) continues the curve it was on instead of
// silently jumping to another one. Each value that loading changed is reported
// (load_state_dict's `changed`, CheckpointInfo::notes) so the caller can say so;
// a user who wants the new curve starts a new run. A state without the
// hyperparameters (written before they were saved) keeps the constructor's.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "nn/optim.h"

namespace ringtrain::nn {

class LRScheduler {
 public:
  LRScheduler(std::string type_name, Optimizer& optimizer);
  virtual ~LRScheduler() = default;

  // Advances one epoch and writes the new lr into every param group (on error,
  // neither the epoch nor any lr changes).
  void step();
  int64_t last_epoch() const { return last_epoch_; }
  std::vector<double> get_last_lr() const;
  // The lr of group `group` at epoch `epoch` (closed form). Throws when the group
  // does not exist or the epoch is negative.
  virtual double lr_at(int64_t epoch, size_t group) const = 0;

  // {"type", "last_epoch", "base_lrs", and every hyperparameter by name}.
  nlohmann::json state_dict() const;
  // Checks everything first (type, last_epoch an integer >= 0, base_lrs one finite
  // number >= 0 per group, each hyperparameter it holds of the right kind and in the
  // range the constructor accepts) and throws, changing nothing, on any problem;
  // then restores them all (a hyperparameter the state lacks keeps its value) and
  // applies the lr. Appends to `changed`, when given, one line for each value the
  // state changed (a hyperparameter or a base lr that differs from this schedule's).
  void load_state_dict(const nlohmann::json& state, std::vector<std::string>* changed = nullptr);
  // load_state_dict's checks alone: throws Error naming the problem, changes nothing.
  void check_state_dict(const nlohmann::json& state) const;

 protected:
  void apply();  // writes lr_at(last_epoch_) into the groups
  void apply_at(int64_t epoch);  // all lrs computed and checked, then written
  // base_lrs_[group], after checking the arguments of lr_at.
  double base_lr(int64_t epoch, size_t group) const;

  // The schedule's own parameters by constructor name, integers as JSON integers
  // and reals as JSON floats: {"step_size": 2, "gamma": 0.5}. A schedule of your own
  // overrides these three to have its parameters saved and restored; by default it
  // has none (only last_epoch and base_lrs travel).
  virtual nlohmann::json hyperparameters() const { return nlohmann::json::object(); }
  // Throws Error, each message starting with `where` and ending with `tail`, when
  // `h` (every key of hyperparameters(), each of its kind) holds a value the
  // constructor would refuse. The constructors use the same check.
  virtual void check_hyperparameters(const nlohmann::json& /*h*/, const std::string& /*where*/,
                                     const std::string& /*tail*/) const {}
  // Sets the parameters from `h`, already checked.
  virtual void set_hyperparameters(const nlohmann::json& /*h*/) {}

  std::string type_name_;          // "StepLR", ...; checked on load
  Optimizer* optimizer_;           // not owned; must outlive the schedule
  std::vector<double> base_lrs_;   // each group's lr when the schedule was made (or loaded)
  int64_t last_epoch_ = 0;         // number of step() calls so far

 private:
  // What load_state_dict sets, from a state that passed every check.
  struct CheckedState {
    int64_t last_epoch = 0;
    std::vector<double> base_lrs;
    nlohmann::json hyperparameters;  // every key of hyperparameters(): the state's value, else the current one
  };
  CheckedState checked_state(const nlohmann::json& state) const;  // throws on any problem
};

// lr = base * gamma^(epoch / step_size); gamma finite and > 0.
class StepLR : public LRScheduler {
 public:
  StepLR(Optimizer& optimizer, int64_t step_size, double gamma = 0.1);
  double lr_at(int64_t epoch, size_t group) const override;

 protected:
  nlohmann::json hyperparameters() const override;
  void check_hyperparameters(const nlohmann::json& h, const std::string& where,
                             const std::string& tail) const override;
  void set_hyperparameters(const nlohmann::json& h) override;

 private:
  int64_t step_size_;
  double gamma_;
};

// lr = eta_min + (base - eta_min) * (1 + cos(pi * epoch / t_max)) / 2, epoch clamped to t_max;
// eta_min finite and >= 0.
class CosineAnnealingLR : public LRScheduler {
 public:
  CosineAnnealingLR(Optimizer& optimizer, int64_t t_max, double eta_min = 0.0);
  double lr_at(int64_t epoch, size_t group) const override;

 protected:
  nlohmann::json hyperparameters() const override;
  void check_hyperparameters(const nlohmann::json& h, const std::string& where,
                             const std::string& tail) const override;
  void set_hyperparameters(const nlohmann::json& h) override;

 private:
  int64_t t_max_;
  double eta_min_;
};

// Linear warm-up: lr = base * (start_factor + (1 - start_factor) * epoch / warmup_steps)
// for epoch < warmup_steps (PyTorch's LinearLR with end_factor 1); afterwards the base
// lr, or, with after_t_max > 0, a cosine from the base lr down to after_eta_min over
// the after_t_max epochs after the warm-up (then after_eta_min). There is no other
// schedule to hand over to. Example: warm-up then cosine:
//   LinearWarmup(opt, 5, 0.1, /*after_t_max=*/95)  (cosine over the remaining 95).
// start_factor is in (0, 1], as LinearLR requires, with LinearLR's default 1/3: a
// factor of 0 would train the first epoch with lr 0 (Adam's step count, and so its
// bias correction, would still advance).
class LinearWarmup : public LRScheduler {
 public:
  static constexpr double kDefaultStartFactor = 1.0 / 3;  // torch.optim.lr_scheduler.LinearLR's
  // after_t_max > 0: cosine-anneal to after_eta_min over after_t_max epochs after the warm-up.
  LinearWarmup(Optimizer& optimizer, int64_t warmup_steps, double start_factor = kDefaultStartFactor,
               int64_t after_t_max = 0, double after_eta_min = 0.0);
  double lr_at(int64_t epoch, size_t group) const override;

 protected:
  nlohmann::json hyperparameters() const override;
  void check_hyperparameters(const nlohmann::json& h, const std::string& where,
                             const std::string& tail) const override;
  void set_hyperparameters(const nlohmann::json& h) override;

 private:
  int64_t warmup_steps_;
  double start_factor_;
  int64_t after_t_max_;
  double after_eta_min_;
};

}  // namespace ringtrain::nn
