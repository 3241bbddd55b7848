// optim.cc: the optimizer base (groups, state, state_dict) and SGD/Adam/AdamW
// updates, written after PyTorch's single-tensor ("for-loop") implementations
// so that one step gives the same numbers. Every update is in place on the
// parameter (add_/mul_), under no_grad.
#include "nn/optim.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <set>
#include <sstream>
#include <string_view>

#include "autograd/autograd.h"
#include "tensor/checks.h"
#include "tensor/ops.h"

namespace ringtrain::nn {

using autograd::NoGradGuard;

// ---------------------------------------------------------------- hyperparameter checks

namespace {
std::string number_str(double v) {
  std::ostringstream os;
  os << v;
  return os.str();
}

// Where options are checked, formatted only when a check fails (step() checks every
// group at every step): "SGD", "ParamGroup::set_lr", "SGD::step (param group 1)".
struct OptionSite {
  std::string_view name;
  const char* op = nullptr;  // "step" -> "<name>::step"
  int64_t group = -1;        // >= 0 -> " (param group <group>)"
  std::string str() const {
    std::string out(name);
    if (op != nullptr) out += std::string("::") + op;
    if (group >= 0) out += " (param group " + std::to_string(group) + ")";
    return out;
  }
};

// The ranges PyTorch's optimizers check (torch/optim/sgd.py, adam.py), plus finiteness:
// every known option by name, so each optimizer, add_param_group, load_state_dict and
// step() share one rule. `where` prefixes the message ("SGD", "Adam::load_state_dict").
void check_option(const OptionSite& where, const std::string& key, double value) {
  auto bad = [&](const char* need, const char* hint) {
    throw Error(where.str() + ": " + key + " must be " + need + ", got " + number_str(value) + hint);
  };
  if (key == "nesterov" || key == "amsgrad") {
    if (value != 0 && value != 1) bad("0 or 1 (false or true)", "");
    return;
  }
  static const std::set<std::string> kKnown = {"lr", "momentum", "dampening", "weight_decay",
                                               "eps", "beta1", "beta2"};
  if (!kKnown.count(key)) return;  // a subclass's own option: its own business
  if (!std::isfinite(value)) bad("finite", "");
  if (key == "lr") {
    if (value < 0) bad(">= 0", " (a negative lr climbs the loss)");
  } else if (key == "momentum" || key == "weight_decay" || key == "eps") {
    if (value < 0) bad(">= 0", "");
  } else if (key == "beta1" || key == "beta2") {
    if (value < 0 || value >= 1) bad("in [0, 1)", " (typical: beta1 0.9, beta2 0.999)");
  }
}

void check_options(const OptionSite& where, const std::map<std::string, double>& options) {
  for (const auto& [key, value] : options) check_option(where, key, value);
  auto get = [&](const char* key) {
    auto it = options.find(key);
    return it == options.end() ? 0.0 : it->second;
  };
  if (get("nesterov") != 0 && !(get("momentum") > 0 && get("dampening") == 0)) {
    throw Error(detail::concat(where.str(), ": Nesterov momentum requires momentum > 0 and dampening = 0, got momentum=",
                               get("momentum"), " dampening=", get("dampening")));
  }
}
}  // namespace

void ParamGroup::set_lr(double lr) {
  check_option({"ParamGroup::set_lr"}, "lr", lr);
  options["lr"] = lr;
}

// ---------------------------------------------------------------- base

Optimizer::Optimizer(std::string type_name, std::vector<ParamGroup> groups,
                     std::map<std::string, double> defaults)
    : type_name_(std::move(type_name)), defaults_(std::move(defaults)) {
  RT_CHECK(!groups.empty(), type_name_, ": no parameter groups given");
  for (auto& g : groups) add_param_group(std::move(g));
}

void Optimizer::add_param_group(ParamGroup group) {
  RT_CHECK(!group.params.empty(), type_name_, ": a parameter group is empty");
  for (const auto& [key, value] : defaults_) group.options.try_emplace(key, value);
  for (const auto& [key, value] : group.options)
    RT_CHECK(defaults_.count(key), type_name_, ": unknown option '", key, "' in a parameter group");
  check_options({type_name_}, group.options);
  std::set<const TensorImpl*> seen;
  for (const auto& g : groups_)
    for (const Tensor& p : g.params) seen.insert(p.unsafe_impl());
  for (const Tensor& p : group.params) {
    // As PyTorch: a frozen parameter (requires_grad false) is accepted and, having no
    // gradient, left alone by step(); an op's result (non-leaf) is refused.
    RT_CHECK(p.defined() && autograd::is_leaf(p), type_name_, ": parameter ",
             p.defined() ? p.describe() : "undefined",
             " must be a leaf tensor (a parameter or a detached tensor), not the result of an op "
             "that autograd recorded");
    RT_CHECK(seen.insert(p.unsafe_impl()).second, type_name_, ": parameter ", p.describe(),
             " appears in more than one place");
  }
  groups_.push_back(std::move(group));
}

void Optimizer::zero_grad(bool set_to_none) {
  for (auto& g : groups_)
    for (const Tensor& p : g.params) {
      Tensor grad = autograd::grad(p);
      if (!grad.defined()) continue;
      if (set_to_none)
        autograd::set_grad(p, Tensor());
      else
        zero_(grad);
    }
}

OptimizerState Optimizer::state_dict() const {
  OptimizerState out;
  out.scalars["type"] = type_name_;
  nlohmann::json groups = nlohmann::json::array();
  size_t index = 0;
  for (const auto& g : groups_) {
    nlohmann::json jg = nlohmann::json::object();
    for (const auto& [key, value] : g.options) jg[key] = value;
    nlohmann::json ids = nlohmann::json::array();
    for (size_t i = 0; i < g.params.size(); ++i) ids.push_back(index++);
    jg["params"] = ids;
    groups.push_back(jg);
  }
  out.scalars["param_groups"] = groups;
  nlohmann::json state = nlohmann::json::object();
  for (const auto& [i, s] : state_) {
    state[std::to_string(i)] = {{"step", s.step}};
    for (const auto& [name, t] : s.bufs)
      out.tensors.emplace_back("state." + std::to_string(i) + "." + name, autograd::detach(t));
  }
  out.scalars["state"] = state;
  return out;
}

void Optimizer::check_groups(const char* op) const {
  for (size_t gi = 0; gi < groups_.size(); ++gi)
    check_options({type_name_, op, static_cast<int64_t>(gi)}, groups_[gi].options);
}

namespace {
// A decimal parameter index ("0", "17"); nullopt for anything else ("abc", "-1", "1x", "").
std::optional<size_t> parse_index(std::string_view text) {
  if (text.empty() || text.size() > 18) return std::nullopt;
  size_t value = 0;
  for (char c : text) {
    if (c < '0' || c > '9') return std::nullopt;
    value = value * 10 + static_cast<size_t>(c - '0');
  }
  return value;
}
}  // namespace

std::optional<StateTensorName> parse_state_tensor_name(std::string_view name) {
  constexpr std::string_view kState = "state.";
  if (name.substr(0, kState.size()) != kState) return std::nullopt;
  name.remove_prefix(kState.size());
  const size_t dot = name.find('.');
  if (dot == std::string_view::npos || dot + 1 == name.size()) return std::nullopt;
  std::optional<size_t> index = parse_index(name.substr(0, dot));
  if (!index) return std::nullopt;
  return StateTensorName{*index, std::string(name.substr(dot + 1))};
}

void Optimizer::load_state_dict(const OptimizerState& in) {
  const nlohmann::json& j = in.scalars;
  auto fail = [&](const std::string& why) {
    throw Error(type_name_ + "::load_state_dict: " + why + " (nothing was changed)");
  };
  // ---- check everything; nothing is written until the end ----
  if (!j.is_object() || !j.contains("type") || !j.contains("param_groups") || !j.contains("state"))
    fail("the state has no \"type\", \"param_groups\" and \"state\" entries");
  if (!j["type"].is_string() || j["type"].get<std::string>() != type_name_)
    fail("the state is of a " + j["type"].dump() + " optimizer, this is a " + type_name_);
  const auto& groups = j["param_groups"];
  if (!groups.is_array() || groups.size() != groups_.size())
    fail("the state has " + (groups.is_array() ? std::to_string(groups.size()) : groups.dump()) +
         " parameter groups, this optimizer " + std::to_string(groups_.size()));
  std::vector<const Tensor*> flat;
  std::vector<std::map<std::string, double>> new_options;
  for (size_t gi = 0; gi < groups_.size(); ++gi) {
    const std::string gname = "param_groups[" + std::to_string(gi) + "]";
    const auto& g = groups[gi];
    if (!g.is_object()) fail(gname + " must be an object, got " + g.dump());
    if (!g.contains("params") || !g["params"].is_array() || g["params"].size() != groups_[gi].params.size())
      fail(gname + " has a different number of parameters (this optimizer's group has " +
           std::to_string(groups_[gi].params.size()) + ")");
    std::map<std::string, double> options = groups_[gi].options;
    for (const auto& [key, value] : g.items()) {
      if (key == "params") continue;
      if (!defaults_.count(key)) fail(gname + " has option \"" + key + "\", which " + type_name_ + " does not know");
      if (!value.is_number() && !value.is_boolean())
        fail(gname + "." + key + " must be a number, got " + value.dump());
      options[key] = value.is_boolean() ? (value.get<bool>() ? 1.0 : 0.0) : value.get<double>();
    }
    try {
      check_options({gname}, options);
    } catch (const Error& e) {
      fail(e.what());
    }
    new_options.push_back(std::move(options));
    for (const Tensor& p : groups_[gi].params) flat.push_back(&p);
  }
  const auto& jstate = j["state"];
  if (!jstate.is_object()) fail("\"state\" must be an object {\"<param index>\": {\"step\": n}}, got " + jstate.dump());
  std::map<size_t, ParamState> new_state;
  for (const auto& [key, value] : jstate.items()) {
    std::optional<size_t> i = parse_index(key);
    if (!i) fail("state key \"" + key + "\" is not a parameter index (a decimal number)");
    if (*i >= flat.size())
      fail("state for parameter " + key + " but this optimizer has " + std::to_string(flat.size()) + " parameters");
    if (!value.is_object() || !value.contains("step"))
      fail("state." + key + " must be an object with a \"step\" count, got " + value.dump());
    const auto& step = value["step"];
    if (!step.is_number_integer() || (!step.is_number_unsigned() && step.get<int64_t>() < 0) ||
        (step.is_number_unsigned() && step.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)))
      fail("state." + key + ".step must be an integer >= 0, got " + step.dump());
    new_state[*i].step = step.get<int64_t>();
  }
  const StateSpec spec = state_spec();
  for (const auto& [name, t] : in.tensors) {
    std::optional<StateTensorName> parsed = parse_state_tensor_name(name);
    if (!parsed) fail("bad tensor name '" + name + "' (expected state.<param index>.<buffer>)");
    const size_t i = parsed->param_index;
    const std::string& buf = parsed->buffer;
    if (i >= flat.size()) fail("tensor '" + name + "' names a parameter that does not exist");
    auto it = new_state.find(i);
    if (it == new_state.end())
      fail("tensor '" + name + "' belongs to parameter " + std::to_string(i) +
           ", which has no entry (step count) in \"state\"");
    if (!t.defined()) fail("tensor '" + name + "' is an undefined Tensor");
    if (!is_floating_point(t.dtype())) fail("tensor '" + name + "' is " + t.describe() + "; state buffers are floating point");
    if (t.shape() != flat[i]->shape())
      fail("tensor '" + name + "' has shape " + shape_str(t.shape()) + " but the parameter is " +
           shape_str(flat[i]->shape()));
    if (!spec.any && std::find(spec.required.begin(), spec.required.end(), buf) == spec.required.end() &&
        std::find(spec.optional.begin(), spec.optional.end(), buf) == spec.optional.end())
      fail("tensor '" + name + "': " + type_name_ + " keeps no buffer named '" + buf + "'");
    if (it->second.bufs.count(buf)) fail("tensor '" + name + "' appears twice");
    it->second.bufs[buf] = t.to(flat[i]->device(), flat[i]->dtype()).clone();
  }
  for (const auto& [i, st] : new_state) {
    for (const std::string& buf : spec.required)
      if (!st.bufs.count(buf))
        fail("parameter " + std::to_string(i) + " has a step count (" + std::to_string(st.step) +
             ") but no tensor 'state." + std::to_string(i) + "." + buf + "'; its state would be incomplete");
  }
  // ---- apply ----
  for (size_t gi = 0; gi < groups_.size(); ++gi) groups_[gi].options = std::move(new_options[gi]);
  state_ = std::move(new_state);
}

// ---------------------------------------------------------------- SGD

namespace {
std::vector<ParamGroup> one_group(std::vector<Tensor> params) {
  ParamGroup g;
  g.params = std::move(params);
  return {std::move(g)};
}
std::map<std::string, double> sgd_defaults(const SGDOptions& o) {
  return {{"lr", o.lr}, {"momentum", o.momentum}, {"dampening", o.dampening},
          {"weight_decay", o.weight_decay}, {"nesterov", o.nesterov ? 1.0 : 0.0}};
}
std::map<std::string, double> adam_defaults(const AdamOptions& o) {
  return {{"lr", o.lr}, {"beta1", o.beta1}, {"beta2", o.beta2}, {"eps", o.eps},
          {"weight_decay", o.weight_decay}, {"amsgrad", o.amsgrad ? 1.0 : 0.0}};
}
}  // namespace

SGD::SGD(std::vector<Tensor> params, SGDOptions options) : SGD(one_group(std::move(params)), options) {}

SGD::SGD(std::vector<ParamGroup> groups, SGDOptions defaults)
    : Optimizer("SGD", std::move(groups), sgd_defaults(defaults)) {}  // add_param_group checks the options

Optimizer::StateSpec SGD::state_spec() const {
  return {{"momentum_buffer"}, {}, false};
}

void SGD::step() {
  check_groups("step");  // options edited through param_groups() since
  NoGradGuard no_grad;
  size_t index = 0;
  for (auto& group : groups_) {
    const double lr = group.options.at("lr");
    const double momentum = group.options.at("momentum");
    const double dampening = group.options.at("dampening");
    const double weight_decay = group.options.at("weight_decay");
    const bool nesterov = group.options.at("nesterov") != 0;
    for (Tensor& p : group.params) {
      size_t i = index++;
      Tensor g = autograd::grad(p);
      if (!g.defined()) continue;
      if (weight_decay != 0) g = add(g, mul(p, weight_decay));  // g + wd * p
      if (momentum != 0) {
        ParamState& st = state_at(i);
        auto it = st.bufs.find("momentum_buffer");
        if (it == st.bufs.end()) {
          it = st.bufs.emplace("momentum_buffer", g.clone()).first;  // buf = g at the first step
          st.step = 0;
        } else {
          mul_(it->second, momentum);                    // buf = momentum * buf
          add_(it->second, g, 1.0 - dampening);          //       + (1 - dampening) * g
        }
        ++st.step;
        if (nesterov)
          g = add(g, mul(it->second, momentum));          // g + momentum * buf
        else
          g = it->second;
      }
      add_(p, g, -lr);                                     // p -= lr * g
    }
  }
}

// ---------------------------------------------------------------- Adam, AdamW

Adam::Adam(std::vector<Tensor> params, AdamOptions options) : Adam(one_group(std::move(params)), options) {}
Adam::Adam(std::vector<ParamGroup> groups, AdamOptions defaults) : Adam("Adam", std::move(groups), defaults) {}
Adam::Adam(std::string type_name, std::vector<ParamGroup> groups, AdamOptions defaults)
    : Optimizer(std::move(type_name), std::move(groups), adam_defaults(defaults)) {}  // options checked

Optimizer::StateSpec Adam::state_spec() const {
  // max_exp_avg_sq (amsgrad) is created at the next step when absent.
  return {{"exp_avg", "exp_avg_sq"}, {"max_exp_avg_sq"}, false};
}

void Adam::step() { adam_step(/*decoupled_weight_decay=*/false); }

void Adam::adam_step(bool decoupled) {
  check_groups("step");  // options edited through param_groups() since
  NoGradGuard no_grad;
  size_t index = 0;
  for (auto& group : groups_) {
    const double lr = group.options.at("lr");
    const double beta1 = group.options.at("beta1");
    const double beta2 = group.options.at("beta2");
    const double eps = group.options.at("eps");
    const double weight_decay = group.options.at("weight_decay");
    const bool amsgrad = group.options.at("amsgrad") != 0;
    for (Tensor& p : group.params) {
      size_t i = index++;
      Tensor g = autograd::grad(p);
      if (!g.defined()) continue;
      ParamState& st = state_at(i);
      if (st.bufs.empty()) {
        st.bufs["exp_avg"] = zeros_like(p);
        st.bufs["exp_avg_sq"] = zeros_like(p);
        if (amsgrad) st.bufs["max_exp_avg_sq"] = zeros_like(p);
      }
      ++st.step;
      if (weight_decay != 0) {
        if (decoupled)
          mul_(p, 1.0 - lr * weight_decay);           // AdamW: p *= 1 - lr * wd
        else
          g = add(g, mul(p, weight_decay));           // Adam: g += wd * p
      }
      Tensor& m = st.bufs["exp_avg"];
      Tensor& v = st.bufs["exp_avg_sq"];
      mul_(m, beta1);                                  // m = b1 m + (1 - b1) g
      add_(m, g, 1.0 - beta1);
      mul_(v, beta2);                                  // v = b2 v + (1 - b2) g^2
      add_(v, mul(g, g), 1.0 - beta2);
      const double bias_correction1 = 1.0 - std::pow(beta1, static_cast<double>(st.step));
      const double bias_correction2 = 1.0 - std::pow(beta2, static_cast<double>(st.step));
      Tensor second = v;
      if (amsgrad) {
        Tensor& vmax = st.bufs["max_exp_avg_sq"];
        if (!vmax.defined()) vmax = zeros_like(p);  // amsgrad switched on after the first steps
        vmax.copy_(maximum(vmax, v));
        second = vmax;
      }
      // denom = sqrt(v) / sqrt(bc2) + eps; p -= lr / bc1 * m / denom
      Tensor denom = add(div(sqrt(second), std::sqrt(bias_correction2)), eps);
      add_(p, div(m, denom), -lr / bias_correction1);
    }
  }
}

AdamW::AdamW(std::vector<Tensor> params, AdamWOptions options)
    : AdamW(one_group(std::move(params)), options) {}
AdamW::AdamW(std::vector<ParamGroup> groups, AdamWOptions defaults)
    : Adam("AdamW", std::move(groups), defaults) {}
void AdamW::step() { adam_step(/*decoupled_weight_decay=*/true); }

// ---------------------------------------------------------------- clipping

double clip_grad_norm_(const std::vector<Tensor>& params, double max_norm) {
  RT_CHECK(max_norm >= 0, "clip_grad_norm_: max_norm must be >= 0 (a NaN or negative bound would make the "
           "gradients NaN or flip their sign), got ", max_norm, "; pass infinity to only measure the norm");
  for (size_t i = 0; i < params.size(); ++i)
    RT_CHECK(params[i].defined(), "clip_grad_norm_: parameter ", i, " of ", params.size(),
             " is an undefined Tensor (a default-constructed handle, not a parameter); pass the "
             "model's parameters (module.parameters())");
  NoGradGuard no_grad;
  double total_sq = 0.0;
  std::vector<Tensor> grads;
  for (const Tensor& p : params) {
    Tensor g = autograd::grad(p);
    if (!g.defined()) continue;
    Tensor g64 = g.to(DType::kFloat64);
    total_sq += sum(mul(g64, g64)).item();
    grads.push_back(g);
  }
  double total = std::sqrt(total_sq);
  double coef = max_norm / (total + 1e-6);
  // As torch.nn.utils.clip_grad_norm_ (which multiplies by clamp(coef, max=1)): a NaN norm
  // makes every gradient NaN rather than leaving them unclipped, so the overflow is visible.
  if (coef < 1.0 || std::isnan(coef))
    for (Tensor& g : grads) mul_(g, coef);
  return total;
}

}  // namespace ringtrain::nn
