// optim.cc: the optimizer base (groups, state, state_dict) and SGD/Adam/AdamW
// updates, written after PyTorch's single-tensor ("for-loop") implementations
// so that one step gives the same numbers. Every update is in place on the
// parameter (add_/mul_), under no_grad.
#include "nn/optim.h"

#include <cmath>
#include <set>
#include <sstream>

#include "autograd/autograd.h"
#include "tensor/checks.h"
#include "tensor/ops.h"

namespace ringtrain::nn {

using autograd::NoGradGuard;

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
  std::set<const TensorImpl*> seen;
  for (const auto& g : groups_)
    for (const Tensor& p : g.params) seen.insert(p.unsafe_impl());
  for (const Tensor& p : group.params) {
    RT_CHECK(p.defined() && autograd::requires_grad(p) && autograd::is_leaf(p), type_name_,
             ": parameter ", p.defined() ? p.describe() : "undefined",
             " must be a leaf tensor that requires grad");
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

void Optimizer::load_state_dict(const OptimizerState& in) {
  const nlohmann::json& j = in.scalars;
  auto fail = [&](const std::string& why) {
    throw Error(type_name_ + "::load_state_dict: " + why + " (nothing was changed)");
  };
  if (!j.is_object() || !j.contains("type") || !j.contains("param_groups") || !j.contains("state"))
    fail("the state has no \"type\", \"param_groups\" and \"state\" entries");
  if (j["type"] != type_name_) fail("the state is of a " + j["type"].dump() + " optimizer");
  const auto& groups = j["param_groups"];
  if (!groups.is_array() || groups.size() != groups_.size())
    fail("the state has " + std::to_string(groups.size()) + " parameter groups, this optimizer " +
         std::to_string(groups_.size()));
  std::vector<const Tensor*> flat;
  for (size_t gi = 0; gi < groups_.size(); ++gi) {
    if (!groups[gi].contains("params") || groups[gi]["params"].size() != groups_[gi].params.size())
      fail("group " + std::to_string(gi) + " has a different number of parameters");
    for (const Tensor& p : groups_[gi].params) flat.push_back(&p);
  }
  // Collect state tensors by parameter index and check shapes before changing anything.
  std::map<size_t, ParamState> new_state;
  for (const auto& [key, value] : j["state"].items()) {
    size_t i = std::stoul(key);
    if (i >= flat.size()) fail("state for parameter " + key + " but only " + std::to_string(flat.size()));
    new_state[i].step = value.at("step").get<int64_t>();
  }
  for (const auto& [name, t] : in.tensors) {
    // "state.<i>.<buf>"
    auto first = name.find('.'), second = name.find('.', first + 1);
    if (name.rfind("state.", 0) != 0 || second == std::string::npos) fail("bad tensor name '" + name + "'");
    size_t i = std::stoul(name.substr(first + 1, second - first - 1));
    std::string buf = name.substr(second + 1);
    if (i >= flat.size()) fail("tensor '" + name + "' names a parameter that does not exist");
    if (t.shape() != flat[i]->shape())
      fail("tensor '" + name + "' has shape " + shape_str(t.shape()) + " but the parameter is " +
           shape_str(flat[i]->shape()));
    new_state[i].bufs[buf] = t.to(flat[i]->device(), flat[i]->dtype()).clone();
  }
  for (size_t gi = 0; gi < groups_.size(); ++gi)
    for (const auto& [key, value] : groups[gi].items())
      if (key != "params") groups_[gi].options[key] = value.get<double>();
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
    : Optimizer("SGD", std::move(groups), sgd_defaults(defaults)) {
  for (const auto& g : groups_) {
    RT_CHECK(g.options.at("lr") >= 0, "SGD: lr must be >= 0, got ", g.options.at("lr"));
    RT_CHECK(g.options.at("nesterov") == 0 ||
                 (g.options.at("momentum") > 0 && g.options.at("dampening") == 0),
             "SGD: Nesterov momentum requires momentum > 0 and dampening = 0");
  }
}

void SGD::step() {
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
    : Optimizer(std::move(type_name), std::move(groups), adam_defaults(defaults)) {
  for (const auto& g : groups_) {
    double b1 = g.options.at("beta1"), b2 = g.options.at("beta2");
    RT_CHECK(b1 >= 0 && b1 < 1 && b2 >= 0 && b2 < 1, type_name_, ": betas must be in [0, 1), got (", b1,
             ", ", b2, ")");
    RT_CHECK(g.options.at("eps") >= 0, type_name_, ": eps must be >= 0");
  }
}

void Adam::step() { adam_step(/*decoupled_weight_decay=*/false); }

void Adam::adam_step(bool decoupled) {
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
