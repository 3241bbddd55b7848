// lr_scheduler.cc: closed-form schedules; see lr_scheduler.h.
#include "nn/lr_scheduler.h"

#include <cmath>
#include <numbers>

#include "tensor/checks.h"

namespace ringtrain::nn {

LRScheduler::LRScheduler(std::string type_name, Optimizer& optimizer)
    : type_name_(std::move(type_name)), optimizer_(&optimizer) {
  for (const auto& g : optimizer.param_groups()) base_lrs_.push_back(g.lr());
}

void LRScheduler::apply() {
  auto& groups = optimizer_->param_groups();
  RT_CHECK(groups.size() == base_lrs_.size(), type_name_, ": the optimizer now has ", groups.size(),
           " param groups, the schedule was made for ", base_lrs_.size());
  for (size_t i = 0; i < groups.size(); ++i) groups[i].set_lr(lr_at(last_epoch_, i));
}

void LRScheduler::step() {
  ++last_epoch_;
  apply();
}

std::vector<double> LRScheduler::get_last_lr() const {
  std::vector<double> out;
  for (const auto& g : optimizer_->param_groups()) out.push_back(g.lr());
  return out;
}

nlohmann::json LRScheduler::state_dict() const {
  return {{"type", type_name_}, {"last_epoch", last_epoch_}, {"base_lrs", base_lrs_}};
}

void LRScheduler::load_state_dict(const nlohmann::json& state) {
  RT_CHECK(state.is_object() && state.contains("type") && state.contains("last_epoch") &&
               state.contains("base_lrs"),
           type_name_, "::load_state_dict: expected {type, last_epoch, base_lrs}, got ", state.dump());
  RT_CHECK(state["type"] == type_name_, type_name_, "::load_state_dict: the state is of a ",
           state["type"].dump(), " schedule");
  auto base = state["base_lrs"].get<std::vector<double>>();
  RT_CHECK(base.size() == base_lrs_.size(), type_name_, "::load_state_dict: ", base.size(),
           " base lrs for ", base_lrs_.size(), " param groups");
  base_lrs_ = std::move(base);
  last_epoch_ = state["last_epoch"].get<int64_t>();
  apply();
}

StepLR::StepLR(Optimizer& optimizer, int64_t step_size, double gamma)
    : LRScheduler("StepLR", optimizer), step_size_(step_size), gamma_(gamma) {
  RT_CHECK(step_size > 0, "StepLR: step_size must be positive, got ", step_size);
  apply();
}
double StepLR::lr_at(int64_t epoch, size_t group) const {
  return base_lrs_[group] * std::pow(gamma_, static_cast<double>(epoch / step_size_));
}

CosineAnnealingLR::CosineAnnealingLR(Optimizer& optimizer, int64_t t_max, double eta_min)
    : LRScheduler("CosineAnnealingLR", optimizer), t_max_(t_max), eta_min_(eta_min) {
  RT_CHECK(t_max > 0, "CosineAnnealingLR: t_max must be positive, got ", t_max);
  apply();
}
double CosineAnnealingLR::lr_at(int64_t epoch, size_t group) const {
  double t = static_cast<double>(std::min(epoch, t_max_)) / static_cast<double>(t_max_);
  return eta_min_ + (base_lrs_[group] - eta_min_) * (1.0 + std::cos(std::numbers::pi * t)) / 2.0;
}

LinearWarmup::LinearWarmup(Optimizer& optimizer, int64_t warmup_steps, double start_factor,
                           int64_t after_t_max, double after_eta_min)
    : LRScheduler("LinearWarmup", optimizer), warmup_steps_(warmup_steps), start_factor_(start_factor),
      after_t_max_(after_t_max), after_eta_min_(after_eta_min) {
  RT_CHECK(warmup_steps >= 0 && start_factor >= 0 && start_factor <= 1 && after_t_max >= 0,
           "LinearWarmup: invalid warmup_steps=", warmup_steps, " start_factor=", start_factor,
           " after_t_max=", after_t_max);
  apply();
}
double LinearWarmup::lr_at(int64_t epoch, size_t group) const {
  double base = base_lrs_[group];
  if (epoch < warmup_steps_)
    return base * (start_factor_ + (1.0 - start_factor_) * static_cast<double>(epoch) /
                                       static_cast<double>(warmup_steps_));
  if (after_t_max_ == 0) return base;
  double t = static_cast<double>(std::min(epoch - warmup_steps_, after_t_max_)) /
             static_cast<double>(after_t_max_);
  return after_eta_min_ + (base - after_eta_min_) * (1.0 + std::cos(std::numbers::pi * t)) / 2.0;
}

}  // namespace ringtrain::nn
