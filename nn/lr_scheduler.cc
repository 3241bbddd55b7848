// lr_scheduler.cc: closed-form schedules; see lr_scheduler.h.
#include "nn/lr_scheduler.h"

#include <cmath>
#include <limits>
#include <utility>
#include <numbers>

#include "tensor/checks.h"

namespace ringtrain::nn {

LRScheduler::LRScheduler(std::string type_name, Optimizer& optimizer)
    : type_name_(std::move(type_name)), optimizer_(&optimizer) {
  for (const auto& g : optimizer.param_groups()) base_lrs_.push_back(g.lr());
}

double LRScheduler::base_lr(int64_t epoch, size_t group) const {
  RT_CHECK(group < base_lrs_.size(), type_name_, "::lr_at: group ", group, " does not exist; the schedule has ",
           base_lrs_.size(), " param group", base_lrs_.size() == 1 ? "" : "s", " (valid: 0 to ",
           base_lrs_.size() - 1, ")");
  RT_CHECK(epoch >= 0, type_name_, "::lr_at: epoch must be >= 0, got ", epoch);
  return base_lrs_[group];
}

void LRScheduler::apply_at(int64_t epoch) {
  auto& groups = optimizer_->param_groups();
  RT_CHECK(groups.size() == base_lrs_.size(), type_name_, ": the optimizer now has ", groups.size(),
           " param groups, the schedule was made for ", base_lrs_.size());
  // Every lr first, then the writes: a failure leaves all groups as they were.
  std::vector<double> lrs;
  for (size_t i = 0; i < groups.size(); ++i) {
    double lr = lr_at(epoch, i);
    RT_CHECK(std::isfinite(lr) && lr >= 0, type_name_, ": the lr of group ", i, " at epoch ", epoch,
             " would be ", lr, " (from base lr ", base_lrs_[i], "); the schedule's parameters make it "
             "leave the finite non-negative range");
    lrs.push_back(lr);
  }
  for (size_t i = 0; i < groups.size(); ++i) groups[i].set_lr(lrs[i]);
}

void LRScheduler::apply() { apply_at(last_epoch_); }

void LRScheduler::step() {
  apply_at(last_epoch_ + 1);  // throws before last_epoch_ moves
  ++last_epoch_;
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
  const std::string where = type_name_ + "::load_state_dict: ";
  const char* unchanged = " (nothing was changed)";
  RT_CHECK(state.is_object() && state.contains("type") && state.contains("last_epoch") &&
               state.contains("base_lrs"),
           where, "expected an object {\"type\", \"last_epoch\", \"base_lrs\"}, got ", state.dump(), unchanged);
  const auto& type = state["type"];
  RT_CHECK(type.is_string(), where, "\"type\" must be a string, got ", type.dump(), unchanged);
  RT_CHECK(type.get<std::string>() == type_name_, where, "the state is of a ", type.dump(),
           " schedule, this is a ", type_name_, unchanged);
  const auto& epoch = state["last_epoch"];
  RT_CHECK(epoch.is_number_integer(), where, "\"last_epoch\" must be an integer, got ", epoch.dump(),
           unchanged);
  RT_CHECK(epoch.is_number_unsigned() || epoch.get<int64_t>() >= 0, where,
           "\"last_epoch\" must be >= 0 (the number of step() calls), got ", epoch.dump(), unchanged);
  RT_CHECK(!epoch.is_number_unsigned() ||
               epoch.get<uint64_t>() <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()),
           where, "\"last_epoch\" is out of range: ", epoch.dump(), unchanged);
  const auto& base_json = state["base_lrs"];
  RT_CHECK(base_json.is_array(), where, "\"base_lrs\" must be an array of numbers, got ", base_json.dump(),
           unchanged);
  RT_CHECK(base_json.size() == base_lrs_.size(), where, base_json.size(), " base lrs for ", base_lrs_.size(),
           " param groups", unchanged);
  std::vector<double> base;
  for (size_t i = 0; i < base_json.size(); ++i) {
    RT_CHECK(base_json[i].is_number(), where, "\"base_lrs\"[", i, "] must be a number, got ",
             base_json[i].dump(), unchanged);
    double lr = base_json[i].get<double>();
    RT_CHECK(std::isfinite(lr) && lr >= 0, where, "\"base_lrs\"[", i, "] must be finite and >= 0, got ",
             lr, unchanged);
    base.push_back(lr);
  }
  // Apply with the new values; on failure (the optimizer's groups changed) restore the old.
  std::vector<double> old_base = std::exchange(base_lrs_, std::move(base));
  int64_t old_epoch = std::exchange(last_epoch_, epoch.get<int64_t>());
  try {
    apply();
  } catch (...) {
    base_lrs_ = std::move(old_base);
    last_epoch_ = old_epoch;
    throw;
  }
}

StepLR::StepLR(Optimizer& optimizer, int64_t step_size, double gamma)
    : LRScheduler("StepLR", optimizer), step_size_(step_size), gamma_(gamma) {
  RT_CHECK(step_size > 0, "StepLR: step_size must be positive, got ", step_size);
  RT_CHECK(std::isfinite(gamma) && gamma > 0, "StepLR: gamma (the factor applied every step_size epochs) "
           "must be finite and > 0, got ", gamma, "; 0.1 divides the lr by 10");
  apply();
}
double StepLR::lr_at(int64_t epoch, size_t group) const {
  return base_lr(epoch, group) * std::pow(gamma_, static_cast<double>(epoch / step_size_));
}

CosineAnnealingLR::CosineAnnealingLR(Optimizer& optimizer, int64_t t_max, double eta_min)
    : LRScheduler("CosineAnnealingLR", optimizer), t_max_(t_max), eta_min_(eta_min) {
  RT_CHECK(t_max > 0, "CosineAnnealingLR: t_max must be positive, got ", t_max);
  RT_CHECK(std::isfinite(eta_min) && eta_min >= 0, "CosineAnnealingLR: eta_min (the final lr) must be "
           "finite and >= 0, got ", eta_min);
  apply();
}
double CosineAnnealingLR::lr_at(int64_t epoch, size_t group) const {
  const double base = base_lr(epoch, group);
  double t = static_cast<double>(std::min(epoch, t_max_)) / static_cast<double>(t_max_);
  return eta_min_ + (base - eta_min_) * (1.0 + std::cos(std::numbers::pi * t)) / 2.0;
}

LinearWarmup::LinearWarmup(Optimizer& optimizer, int64_t warmup_steps, double start_factor,
                           int64_t after_t_max, double after_eta_min)
    : LRScheduler("LinearWarmup", optimizer), warmup_steps_(warmup_steps), start_factor_(start_factor),
      after_t_max_(after_t_max), after_eta_min_(after_eta_min) {
  RT_CHECK(warmup_steps >= 0 && after_t_max >= 0, "LinearWarmup: warmup_steps and after_t_max must be >= 0, "
           "got warmup_steps=", warmup_steps, " after_t_max=", after_t_max);
  RT_CHECK(start_factor > 0 && start_factor <= 1, "LinearWarmup: start_factor must be in (0, 1], as PyTorch's "
           "LinearLR requires (0 would train the first epoch with lr 0), got ", start_factor,
           "; the default is 1/3");
  RT_CHECK(std::isfinite(after_eta_min) && after_eta_min >= 0, "LinearWarmup: after_eta_min (the final lr "
           "of the cosine after the warm-up) must be finite and >= 0, got ", after_eta_min);
  apply();
}
double LinearWarmup::lr_at(int64_t epoch, size_t group) const {
  const double base = base_lr(epoch, group);
  if (epoch < warmup_steps_)
    return base * (start_factor_ + (1.0 - start_factor_) * static_cast<double>(epoch) /
                                       static_cast<double>(warmup_steps_));
  if (after_t_max_ == 0) return base;
  double t = static_cast<double>(std::min(epoch - warmup_steps_, after_t_max_)) /
             static_cast<double>(after_t_max_);
  return after_eta_min_ + (base - after_eta_min_) * (1.0 + std::cos(std::numbers::pi * t)) / 2.0;
}

}  // namespace ringtrain::nn
