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
  nlohmann::json state = {{"type", type_name_}, {"last_epoch", last_epoch_}, {"base_lrs", base_lrs_}};
  const nlohmann::json h = hyperparameters();  // named: items() of a temporary would dangle
  for (const auto& [name, value] : h.items()) state[name] = value;
  return state;
}

LRScheduler::CheckedState LRScheduler::checked_state(const nlohmann::json& state) const {
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
  CheckedState out;
  out.last_epoch = epoch.get<int64_t>();
  for (size_t i = 0; i < base_json.size(); ++i) {
    RT_CHECK(base_json[i].is_number(), where, "\"base_lrs\"[", i, "] must be a number, got ",
             base_json[i].dump(), unchanged);
    double lr = base_json[i].get<double>();
    RT_CHECK(std::isfinite(lr) && lr >= 0, where, "\"base_lrs\"[", i, "] must be finite and >= 0, got ",
             lr, unchanged);
    out.base_lrs.push_back(lr);
  }
  // Each hyperparameter of the kind the constructor takes (an integer stays an
  // integer: 2.5 epochs is not a step_size), then the constructor's range checks. A
  // state without one (saved before they were) keeps this schedule's value.
  out.hyperparameters = hyperparameters();
  for (auto& [name, value] : out.hyperparameters.items()) {
    if (!state.contains(name)) continue;
    const auto& saved = state.at(name);
    if (value.is_number_integer()) {
      RT_CHECK(saved.is_number_integer(), where, "\"", name, "\" must be an integer, got ", saved.dump(),
               unchanged);
      RT_CHECK(!saved.is_number_unsigned() ||
                   saved.get<uint64_t>() <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()),
               where, "\"", name, "\" is out of range: ", saved.dump(), unchanged);
      value = saved.get<int64_t>();
    } else {
      // JSON has no inf or NaN: nlohmann writes them as null, refused here.
      RT_CHECK(saved.is_number(), where, "\"", name, "\" must be a number, got ", saved.dump(), unchanged);
      value = saved.get<double>();
    }
  }
  check_hyperparameters(out.hyperparameters, where, unchanged);
  return out;
}

void LRScheduler::check_state_dict(const nlohmann::json& state) const { (void)checked_state(state); }

void LRScheduler::load_state_dict(const nlohmann::json& state, std::vector<std::string>* changed) {
  CheckedState loaded = checked_state(state);
  // What the state changes, worded before anything moves.
  std::vector<std::string> notes;
  const char* why = " (a loaded schedule keeps its saved values, as PyTorch's load_state_dict; "
                    "start a new run to use this run's)";
  const nlohmann::json current = hyperparameters();
  for (const auto& [name, value] : loaded.hyperparameters.items()) {
    if (value != current.at(name))
      notes.push_back(type_name_ + " " + name + ": the loaded state's " + value.dump() + " replaces " +
                      current.at(name).dump() + why);
  }
  for (size_t i = 0; i < base_lrs_.size(); ++i) {
    if (loaded.base_lrs[i] != base_lrs_[i])
      notes.push_back(type_name_ + " base lr of param group " + std::to_string(i) + ": the loaded state's " +
                      nlohmann::json(loaded.base_lrs[i]).dump() + " replaces " +
                      nlohmann::json(base_lrs_[i]).dump() + why);
  }
  // Apply with the new values; on failure (the optimizer's groups changed) restore the old.
  std::vector<double> old_base = std::exchange(base_lrs_, std::move(loaded.base_lrs));
  int64_t old_epoch = std::exchange(last_epoch_, loaded.last_epoch);
  set_hyperparameters(loaded.hyperparameters);
  try {
    apply();
  } catch (...) {
    base_lrs_ = std::move(old_base);
    last_epoch_ = old_epoch;
    set_hyperparameters(current);
    throw;
  }
  if (changed != nullptr) changed->insert(changed->end(), notes.begin(), notes.end());
}

StepLR::StepLR(Optimizer& optimizer, int64_t step_size, double gamma)
    : LRScheduler("StepLR", optimizer), step_size_(step_size), gamma_(gamma) {
  check_hyperparameters(hyperparameters(), "StepLR: ", "");
  apply();
}
nlohmann::json StepLR::hyperparameters() const { return {{"step_size", step_size_}, {"gamma", gamma_}}; }
void StepLR::check_hyperparameters(const nlohmann::json& h, const std::string& where,
                                   const std::string& tail) const {
  const auto step_size = h.at("step_size").get<int64_t>();
  const auto gamma = h.at("gamma").get<double>();
  RT_CHECK(step_size > 0, where, "step_size must be positive, got ", step_size, tail);
  RT_CHECK(std::isfinite(gamma) && gamma > 0, where, "gamma (the factor applied every step_size epochs) "
           "must be finite and > 0, got ", gamma, "; 0.1 divides the lr by 10", tail);
}
void StepLR::set_hyperparameters(const nlohmann::json& h) {
  step_size_ = h.at("step_size").get<int64_t>();
  gamma_ = h.at("gamma").get<double>();
}
double StepLR::lr_at(int64_t epoch, size_t group) const {
  return base_lr(epoch, group) * std::pow(gamma_, static_cast<double>(epoch / step_size_));
}

CosineAnnealingLR::CosineAnnealingLR(Optimizer& optimizer, int64_t t_max, double eta_min)
    : LRScheduler("CosineAnnealingLR", optimizer), t_max_(t_max), eta_min_(eta_min) {
  check_hyperparameters(hyperparameters(), "CosineAnnealingLR: ", "");
  apply();
}
nlohmann::json CosineAnnealingLR::hyperparameters() const { return {{"t_max", t_max_}, {"eta_min", eta_min_}}; }
void CosineAnnealingLR::check_hyperparameters(const nlohmann::json& h, const std::string& where,
                                              const std::string& tail) const {
  const auto t_max = h.at("t_max").get<int64_t>();
  const auto eta_min = h.at("eta_min").get<double>();
  RT_CHECK(t_max > 0, where, "t_max must be positive, got ", t_max, tail);
  RT_CHECK(std::isfinite(eta_min) && eta_min >= 0, where, "eta_min (the final lr) must be finite and >= 0, got ",
           eta_min, tail);
}
void CosineAnnealingLR::set_hyperparameters(const nlohmann::json& h) {
  t_max_ = h.at("t_max").get<int64_t>();
  eta_min_ = h.at("eta_min").get<double>();
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
  check_hyperparameters(hyperparameters(), "LinearWarmup: ", "");
  apply();
}
nlohmann::json LinearWarmup::hyperparameters() const {
  return {{"warmup_steps", warmup_steps_},
          {"start_factor", start_factor_},
          {"after_t_max", after_t_max_},
          {"after_eta_min", after_eta_min_}};
}
void LinearWarmup::check_hyperparameters(const nlohmann::json& h, const std::string& where,
                                         const std::string& tail) const {
  const auto warmup_steps = h.at("warmup_steps").get<int64_t>();
  const auto start_factor = h.at("start_factor").get<double>();
  const auto after_t_max = h.at("after_t_max").get<int64_t>();
  const auto after_eta_min = h.at("after_eta_min").get<double>();
  RT_CHECK(warmup_steps >= 0 && after_t_max >= 0, where, "warmup_steps and after_t_max must be >= 0, got "
           "warmup_steps=", warmup_steps, " after_t_max=", after_t_max, tail);
  RT_CHECK(start_factor > 0 && start_factor <= 1, where, "start_factor must be in (0, 1], as PyTorch's "
           "LinearLR requires (0 would train the first epoch with lr 0), got ", start_factor,
           "; the default is 1/3", tail);
  RT_CHECK(std::isfinite(after_eta_min) && after_eta_min >= 0, where, "after_eta_min (the final lr of the "
           "cosine after the warm-up) must be finite and >= 0, got ", after_eta_min, tail);
}
void LinearWarmup::set_hyperparameters(const nlohmann::json& h) {
  warmup_steps_ = h.at("warmup_steps").get<int64_t>();
  start_factor_ = h.at("start_factor").get<double>();
  after_t_max_ = h.at("after_t_max").get<int64_t>();
  after_eta_min_ = h.at("after_eta_min").get<double>();
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
