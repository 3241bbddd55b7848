// optim_test.cc: a Linear + cross-entropy step against hand-computed numbers;
// SGD (momentum, dampening, Nesterov, weight decay), Adam, AdamW (and amsgrad)
// against PyTorch's update formulas written out in scalar form here;
// clip_grad_norm_; LR schedules; optimizer and schedule state round trips.
#include <gtest/gtest.h>

#include <cmath>
#include <numbers>
#include <string>
#include <vector>

#include "autograd/autograd.h"
#include "autograd/functions.h"
#include "nn/layers.h"
#include "nn/loss.h"
#include "nn/lr_scheduler.h"
#include "nn/optim.h"
#include "tensor/ops.h"
#include "tests/common/expect_error.h"

namespace ringtrain::nn {
namespace {

Tensor param64(std::vector<double> v) {
  Tensor t = Tensor::from_vector<double>(v, {static_cast<int64_t>(v.size())});
  autograd::set_requires_grad(t);
  return t;
}

// The gradient fed at step s (same for every test): g_s[i] = (i + 1) * 0.3 - 0.2 * s.
std::vector<double> grad_at(int step, size_t n) {
  std::vector<double> g(n);
  for (size_t i = 0; i < n; ++i) g[i] = (static_cast<double>(i) + 1) * 0.3 - 0.2 * step;
  return g;
}

void set_grad(const Tensor& p, const std::vector<double>& g) {
  autograd::set_grad(p, Tensor::from_vector<double>(g, p.shape()));
}

void expect_near(const Tensor& t, const std::vector<double>& expected, double tol, const char* what) {
  auto v = t.to_vector<double>();
  ASSERT_EQ(v.size(), expected.size());
  for (size_t i = 0; i < v.size(); ++i) EXPECT_NEAR(v[i], expected[i], tol) << what << " element " << i;
}

TEST(Optim, LinearCrossEntropyStepMatchesHandComputedValues) {
  Linear fc(2, 2);
  {
    autograd::NoGradGuard g;
    fc.weight().copy_(Tensor::from_vector<float>({0.1f, 0.2f, -0.3f, 0.4f}, {2, 2}));
    fc.bias().copy_(Tensor::from_vector<float>({0.05f, -0.05f}, {2}));
  }
  Tensor x = Tensor::from_vector<float>({1, 2, -1, 0.5}, {2, 2});
  Tensor t = Tensor::from_vector<int64_t>({1, 0}, {2});
  Tensor loss = nn::cross_entropy(fc.forward(x), t);
  // logits [[0.55, 0.45], [0.05, 0.45]]; loss = mean(-log softmax[target]) (by hand, in Python's math)
  EXPECT_NEAR(loss.item(), 0.8287059562367618, 1e-6);
  autograd::backward(loss);
  expect_near(autograd::grad(fc.weight()), {0.561833423795696, 0.375307272450827, -0.561833423795696,
                                            -0.375307272450827}, 1e-6, "dW");
  expect_near(autograd::grad(fc.bias()), {-0.036854236316755995, 0.036854236316755995}, 1e-6, "db");
  SGD opt(fc.parameters(), {.lr = 0.5});
  opt.step();
  expect_near(fc.weight(), {-0.180916711897848, 0.012346363774586505, -0.019083288102151985,
                            0.5876536362254136}, 1e-6, "W after step");
  expect_near(fc.bias(), {0.068427118158378, -0.068427118158378}, 1e-6, "b after step");
}

// PyTorch's SGD, scalar form (torch/optim/sgd.py _single_tensor_sgd).
std::vector<double> sgd_reference(std::vector<double> p, int steps, double lr, double momentum,
                                  double dampening, double wd, bool nesterov) {
  std::vector<double> buf(p.size());
  for (int s = 0; s < steps; ++s) {
    auto g = grad_at(s, p.size());
    for (size_t i = 0; i < p.size(); ++i) {
      double d = g[i] + wd * p[i];
      if (momentum != 0) {
        buf[i] = s == 0 ? d : momentum * buf[i] + (1 - dampening) * d;
        d = nesterov ? d + momentum * buf[i] : buf[i];
      }
      p[i] -= lr * d;
    }
  }
  return p;
}

void run_sgd(const SGDOptions& o, const char* what) {
  std::vector<double> init = {1.0, -2.0, 0.5};
  Tensor p = param64(init);
  SGD opt({p}, o);
  for (int s = 0; s < 4; ++s) {
    set_grad(p, grad_at(s, 3));
    opt.step();
  }
  expect_near(p, sgd_reference(init, 4, o.lr, o.momentum, o.dampening, o.weight_decay, o.nesterov), 1e-12,
              what);
}

TEST(Optim, SGDMatchesClosedForm) {
  run_sgd({.lr = 0.1}, "plain");
  run_sgd({.lr = 0.1, .momentum = 0.9}, "momentum");
  run_sgd({.lr = 0.1, .momentum = 0.9, .dampening = 0.3}, "dampening");
  run_sgd({.lr = 0.05, .momentum = 0.8, .weight_decay = 0.01, .nesterov = true}, "nesterov + wd");
  run_sgd({.lr = 0.1, .weight_decay = 0.1}, "weight decay");
  // one concrete number, by hand: p = 1, g = 0.3, lr = 0.1 -> 0.97
  Tensor p = param64({1.0});
  SGD opt({p}, {.lr = 0.1});
  set_grad(p, {0.3});
  opt.step();
  EXPECT_DOUBLE_EQ(p.item(), 0.97);
  EXPECT_THROW(SGD({p}, {.lr = 0.1, .nesterov = true}), Error);
}

// PyTorch's Adam/AdamW, scalar form (torch/optim/adam.py _single_tensor_adam).
std::vector<double> adam_reference(std::vector<double> p, int steps, const AdamOptions& o, bool decoupled) {
  std::vector<double> m(p.size()), v(p.size()), vmax(p.size());
  for (int s = 0; s < steps; ++s) {
    auto g = grad_at(s, p.size());
    int t = s + 1;
    for (size_t i = 0; i < p.size(); ++i) {
      double d = g[i];
      if (decoupled)
        p[i] *= 1 - o.lr * o.weight_decay;
      else
        d += o.weight_decay * p[i];
      m[i] = o.beta1 * m[i] + (1 - o.beta1) * d;
      v[i] = o.beta2 * v[i] + (1 - o.beta2) * d * d;
      vmax[i] = std::max(vmax[i], v[i]);
      double bc1 = 1 - std::pow(o.beta1, t), bc2 = 1 - std::pow(o.beta2, t);
      double second = o.amsgrad ? vmax[i] : v[i];
      double denom = std::sqrt(second) / std::sqrt(bc2) + o.eps;
      p[i] -= o.lr / bc1 * m[i] / denom;
    }
  }
  return p;
}

TEST(Optim, AdamAndAdamWMatchClosedForm) {
  std::vector<double> init = {1.0, -2.0, 0.5};
  for (bool amsgrad : {false, true}) {
    AdamOptions o{.lr = 0.01, .beta1 = 0.8, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1, .amsgrad = amsgrad};
    Tensor p = param64(init);
    Adam adam({p}, o);
    Tensor q = param64(init);
    AdamWOptions ow;
    static_cast<AdamOptions&>(ow) = o;
    AdamW adamw({q}, ow);
    for (int s = 0; s < 5; ++s) {
      set_grad(p, grad_at(s, 3));
      set_grad(q, grad_at(s, 3));
      adam.step();
      adamw.step();
    }
    expect_near(p, adam_reference(init, 5, o, false), 1e-12, amsgrad ? "adam amsgrad" : "adam");
    expect_near(q, adam_reference(init, 5, o, true), 1e-12, amsgrad ? "adamw amsgrad" : "adamw");
  }
  // First Adam step is lr * sign(g) (for eps -> 0): a number anyone can check.
  Tensor p = param64({1.0, 1.0});
  Adam adam({p}, {.lr = 0.1});
  autograd::set_grad(p, Tensor::from_vector<double>({0.5, -3.0}, {2}));
  adam.step();
  expect_near(p, {0.9, 1.1}, 1e-6, "first adam step");
  EXPECT_EQ(AdamWOptions().weight_decay, 0.01);
}

TEST(Optim, SkipsParametersWithoutGradAndZeroGrad) {
  Tensor a = param64({1.0}), b = param64({2.0});
  SGD opt({a, b}, {.lr = 1.0});
  set_grad(a, {0.5});
  opt.step();
  EXPECT_DOUBLE_EQ(a.item(), 0.5);
  EXPECT_DOUBLE_EQ(b.item(), 2.0);
  opt.zero_grad();
  EXPECT_FALSE(autograd::grad(a).defined());
  EXPECT_THROW(SGD({a, a}, {}), Error);
}

TEST(Optim, ParamGroupsHaveTheirOwnOptions) {
  Tensor a = param64({1.0}), b = param64({1.0});
  ParamGroup ga{{a}, {}}, gb{{b}, {{"lr", 0.5}}};
  SGD opt({ga, gb}, {.lr = 0.1});
  set_grad(a, {1.0});
  set_grad(b, {1.0});
  opt.step();
  EXPECT_DOUBLE_EQ(a.item(), 0.9);
  EXPECT_DOUBLE_EQ(b.item(), 0.5);
  ParamGroup bad{{param64({1.0})}, {{"lrr", 0.5}}};
  EXPECT_THROW(opt.add_param_group(bad), Error);
}

TEST(Optim, StateDictRoundTripContinuesIdentically) {
  std::vector<double> init = {1.0, -2.0, 0.5};
  Tensor p = param64(init), q = param64(init);
  Adam a({p}, {.lr = 0.05});
  for (int s = 0; s < 3; ++s) {
    set_grad(p, grad_at(s, 3));
    a.step();
  }
  OptimizerState state = a.state_dict();
  EXPECT_EQ(state.scalars["type"], "Adam");
  EXPECT_EQ(state.scalars["state"]["0"]["step"], 3);
  ASSERT_EQ(state.tensors.size(), 2u);
  EXPECT_EQ(state.tensors[0].first, "state.0.exp_avg");
  // A fresh optimizer on a copy of the parameter, restored, continues identically.
  {
    autograd::NoGradGuard g;
    q.copy_(p);
  }
  Adam b({q}, {.lr = 0.9});
  b.load_state_dict(state);
  EXPECT_EQ(b.param_groups()[0].lr(), 0.05);
  for (int s = 3; s < 6; ++s) {
    set_grad(p, grad_at(s, 3));
    set_grad(q, grad_at(s, 3));
    a.step();
    b.step();
  }
  EXPECT_EQ(max_abs_diff(p, q), 0.0);
  // Wrong optimizer type or shapes: clear errors.
  SGD sgd({param64(init)}, {});
  EXPECT_THROW(sgd.load_state_dict(state), Error);
  Adam other({param64({1.0})}, {});
  try {
    other.load_state_dict(state);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("shape"), std::string::npos) << e.what();
  }
}

TEST(Optim, ClipGradNormUsesTheGlobalNorm) {
  Tensor a = param64({0, 0}), b = param64({0});
  set_grad(a, {3.0, 0.0});
  set_grad(b, {4.0});
  double norm = clip_grad_norm_({a, b}, 1.0);
  EXPECT_DOUBLE_EQ(norm, 5.0);
  expect_near(autograd::grad(a), {3.0 / (5.0 + 1e-6), 0.0}, 1e-12, "clipped a");
  expect_near(autograd::grad(b), {4.0 / (5.0 + 1e-6)}, 1e-12, "clipped b");
  EXPECT_NEAR(clip_grad_norm_({a, b}, 10.0), 1.0, 1e-6);  // below max: unchanged
  expect_near(autograd::grad(b), {4.0 / (5.0 + 1e-6)}, 1e-12, "unchanged b");
}

// As torch.nn.utils.clip_grad_norm_: a NaN in any gradient makes the norm NaN and every
// gradient NaN (before, coef < 1 was false for NaN and the other gradients stayed unclipped).
TEST(Optim, ClipGradNormWithANaNGradientMakesEveryGradientNaN) {
  Tensor a = param64({0, 0}), b = param64({0});
  set_grad(a, {std::nan(""), 1.0});
  set_grad(b, {4.0});
  EXPECT_TRUE(std::isnan(clip_grad_norm_({a, b}, 1.0)));
  for (double v : autograd::grad(a).to_vector<double>()) EXPECT_TRUE(std::isnan(v));
  for (double v : autograd::grad(b).to_vector<double>()) EXPECT_TRUE(std::isnan(v));
}

TEST(LRSchedule, StepCosineWarmup) {
  Tensor p = param64({1.0});
  SGD opt({p}, {.lr = 1.0});
  StepLR step(opt, 2, 0.5);
  std::vector<double> seen;
  for (int e = 0; e < 5; ++e) {
    seen.push_back(opt.param_groups()[0].lr());
    step.step();
  }
  EXPECT_EQ(seen, (std::vector<double>{1.0, 1.0, 0.5, 0.5, 0.25}));

  SGD opt2({param64({1.0})}, {.lr = 0.1});
  CosineAnnealingLR cos(opt2, 4, 0.0);
  for (int e = 0; e <= 4; ++e) {
    EXPECT_NEAR(opt2.param_groups()[0].lr(), 0.05 * (1 + std::cos(std::numbers::pi * e / 4)), 1e-15) << e;
    cos.step();
  }
  EXPECT_NEAR(opt2.param_groups()[0].lr(), 0.0, 1e-15);  // stays at eta_min after t_max

  SGD opt3({param64({1.0})}, {.lr = 1.0});
  LinearWarmup warm(opt3, 4, 0.2, /*after_t_max=*/2);
  std::vector<double> lrs;
  for (int e = 0; e < 7; ++e) {
    lrs.push_back(opt3.param_groups()[0].lr());
    warm.step();
  }
  std::vector<double> expected = {0.2, 0.4, 0.6, 0.8, 1.0, 0.5, 0.0};
  for (size_t i = 0; i < lrs.size(); ++i) EXPECT_NEAR(lrs[i], expected[i], 1e-12) << i;

  // State round trip: a new schedule restored mid-way sets the same lr.
  nlohmann::json state = warm.state_dict();
  SGD opt4({param64({1.0})}, {.lr = 1.0});
  LinearWarmup warm2(opt4, 4, 0.2, 2);
  warm2.load_state_dict(state);
  EXPECT_EQ(warm2.last_epoch(), 7);
  EXPECT_NEAR(opt4.param_groups()[0].lr(), warm.lr_at(7, 0), 1e-15);
  EXPECT_THROW(step.load_state_dict(state), Error);  // a LinearWarmup state into a StepLR
}

// As PyTorch's LinearLR: start_factor in (0, 1], by default 1/3. Before, the default was 0
// (and 0 was accepted): the first epoch trained with lr exactly 0.
TEST(LRSchedule, LinearWarmupStartFactorIsInZeroOneAndDefaultsToAThird) {
  SGD opt({param64({1.0})}, {.lr = 0.3});
  LinearWarmup warm(opt, 2);
  std::vector<double> lrs;
  for (int e = 0; e < 4; ++e) {
    lrs.push_back(opt.param_groups()[0].lr());
    warm.step();
  }
  std::vector<double> expected = {0.1, 0.2, 0.3, 0.3};  // 0.3 * (1/3, 2/3, 1, 1)
  for (size_t i = 0; i < lrs.size(); ++i) EXPECT_NEAR(lrs[i], expected[i], 1e-15) << i;

  SGD other({param64({1.0})}, {.lr = 1.0});
  for (double bad : {0.0, -0.5, 1.5}) {
    ringtrain::testing::expect_error([&] { LinearWarmup(other, 2, bad); },
                                     {"LinearWarmup", "start_factor", "(0, 1]", "LinearLR"});
  }
  EXPECT_EQ(other.param_groups()[0].lr(), 1.0);
  LinearWarmup full(other, 2, 1.0);  // no ramp at all: the bound itself is allowed
  EXPECT_EQ(other.param_groups()[0].lr(), 1.0);
}

// The lr of group 0 at each of the next `epochs` epochs, stepping the schedule.
std::vector<double> next_lrs(Optimizer& opt, LRScheduler& schedule, int epochs) {
  std::vector<double> out;
  for (int e = 0; e < epochs; ++e) {
    schedule.step();
    out.push_back(opt.param_groups()[0].lr());
  }
  return out;
}

void expect_lrs_near(const std::vector<double>& got, const std::vector<double>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-15) << "epoch +" << i + 1;
}

// As PyTorch's LRScheduler.load_state_dict (it restores the whole __dict__): the saved
// hyperparameters win over the constructor's, so a resumed run stays on its curve. Before,
// only type, last_epoch and base_lrs were saved, and a resume with another step_size or
// t_max (digits_train --epochs 40 after 30) silently switched to another curve.
TEST(LRSchedule, LoadingRestoresTheSavedStepSizeAndSaysWhatChanged) {
  SGD saved_opt({param64({1.0})}, {.lr = 1.0});
  StepLR saved(saved_opt, 2, 0.5);
  saved.step();
  nlohmann::json state = saved.state_dict();
  EXPECT_EQ(state["step_size"], 2);
  EXPECT_EQ(state["gamma"], 0.5);

  SGD opt({param64({1.0})}, {.lr = 1.0});
  StepLR resumed(opt, 3, 0.5);
  std::vector<std::string> changed;
  resumed.load_state_dict(state, &changed);
  expect_lrs_near(next_lrs(opt, resumed, 5), next_lrs(saved_opt, saved, 5));
  // Epochs 2 and 6 of step_size 2 (of step_size 3 they would be 1 and 0.25).
  EXPECT_NEAR(resumed.lr_at(2, 0), 0.5, 1e-15);
  EXPECT_NEAR(resumed.lr_at(6, 0), 0.125, 1e-15);
  EXPECT_EQ(resumed.state_dict(), saved.state_dict());
  EXPECT_EQ(changed.size(), 1u);
  for (const char* part : {"StepLR", "step_size", "2", "replaces 3", "PyTorch"})
    EXPECT_NE(changed.empty() ? std::string::npos : changed[0].find(part), std::string::npos) << part;
}

TEST(LRSchedule, LoadingRestoresCosineAndWarmupHyperparametersAndBaseLrs) {
  std::vector<std::string> changed;

  // CosineAnnealingLR: saved with t_max 4, loaded into t_max 8; eta_min 0.01 over 0.
  SGD cos_saved_opt({param64({1.0})}, {.lr = 0.1});
  CosineAnnealingLR cos_saved(cos_saved_opt, 4, 0.01);
  cos_saved.step();
  SGD cos_opt({param64({1.0})}, {.lr = 0.1});
  CosineAnnealingLR cos_resumed(cos_opt, 8);
  changed.clear();
  cos_resumed.load_state_dict(cos_saved.state_dict(), &changed);
  expect_lrs_near(next_lrs(cos_opt, cos_resumed, 5), next_lrs(cos_saved_opt, cos_saved, 5));
  EXPECT_NEAR(cos_opt.param_groups()[0].lr(), 0.01, 1e-15);  // reached eta_min at epoch 4 of t_max 4
  EXPECT_EQ(changed.size(), 2u);  // t_max and eta_min

  // LinearWarmup: all four, and the same values again change nothing and report nothing.
  SGD warm_saved_opt({param64({1.0})}, {.lr = 1.0});
  LinearWarmup warm_saved(warm_saved_opt, 4, 0.2, /*after_t_max=*/6, /*after_eta_min=*/0.05);
  SGD warm_opt({param64({1.0})}, {.lr = 1.0});
  LinearWarmup warm_resumed(warm_opt, 2);
  changed.clear();
  warm_resumed.load_state_dict(warm_saved.state_dict(), &changed);
  EXPECT_EQ(changed.size(), 4u);
  expect_lrs_near(next_lrs(warm_opt, warm_resumed, 12), next_lrs(warm_saved_opt, warm_saved, 12));
  changed.clear();
  warm_resumed.load_state_dict(warm_saved.state_dict(), &changed);
  EXPECT_TRUE(changed.empty());

  // A base lr that differs (the run's --lr changed) is restored and reported too.
  SGD other_lr({param64({1.0})}, {.lr = 0.3});
  StepLR other(other_lr, 2, 0.5);
  SGD saved_opt({param64({1.0})}, {.lr = 1.0});
  StepLR saved(saved_opt, 2, 0.5);
  saved.step();
  changed.clear();
  other.load_state_dict(saved.state_dict(), &changed);
  EXPECT_EQ(changed.size(), 1u);
  EXPECT_NE(changed.empty() ? std::string::npos : changed[0].find("base lr of param group 0"), std::string::npos);
  EXPECT_NEAR(other_lr.param_groups()[0].lr(), 1.0, 1e-15);
}

// A state written before the hyperparameters were saved still loads: the constructor's
// values are kept, and nothing is reported as changed.
TEST(LRSchedule, AStateWithoutHyperparametersKeepsTheConstructorsValues) {
  SGD opt({param64({1.0})}, {.lr = 1.0});
  StepLR step(opt, 3, 0.5);
  std::vector<std::string> changed;
  step.load_state_dict({{"type", "StepLR"}, {"last_epoch", 1}, {"base_lrs", {1.0}}}, &changed);
  EXPECT_TRUE(changed.empty());
  EXPECT_EQ(step.state_dict()["step_size"], 3);
  expect_lrs_near(next_lrs(opt, step, 4), {1.0, 0.5, 0.5, 0.5});  // epochs 2..5 of step_size 3
  nlohmann::json only_gamma = {{"type", "StepLR"}, {"last_epoch", 0}, {"base_lrs", {1.0}}, {"gamma", 0.1}};
  step.load_state_dict(only_gamma);  // one present, one not
  EXPECT_EQ(step.state_dict()["step_size"], 3);
  EXPECT_EQ(step.state_dict()["gamma"], 0.1);
}

// ---------------------------------------------------------------- misuse: each names the problem

using ringtrain::testing::expect_error;

TEST(OptimMisuse, ClipGradNormRejectsANegativeOrNaNMaxNormAndKeepsTheGradients) {
  Tensor a = param64({0, 0});
  set_grad(a, {3.0, 4.0});
  expect_error([&] { clip_grad_norm_({a}, -1.0); }, {"clip_grad_norm_", "max_norm", "-1"});
  expect_error([&] { clip_grad_norm_({a}, std::nan("")); }, {"clip_grad_norm_", "max_norm"});
  expect_near(autograd::grad(a), {3.0, 4.0}, 0, "untouched");
  // max_norm = 0 zeroes them (PyTorch's behaviour); infinity only measures.
  EXPECT_DOUBLE_EQ(clip_grad_norm_({a}, INFINITY), 5.0);
  expect_near(autograd::grad(a), {3.0, 4.0}, 0, "infinity clips nothing");
  EXPECT_DOUBLE_EQ(clip_grad_norm_({a}, 0.0), 5.0);
  expect_near(autograd::grad(a), {0.0, 0.0}, 0, "zeroed");
}

TEST(OptimMisuse, FrozenParametersAreAcceptedAndLeftAloneButOpResultsAreRefused) {
  // Fine-tuning: SGD(model->parameters()) with some layers frozen works, as in PyTorch.
  Tensor trained = param64({1.0, 2.0});
  Tensor frozen = Tensor::from_vector<double>({5.0, 6.0}, {2});  // requires_grad false
  SGD sgd({trained, frozen}, SGDOptions{.lr = 0.5});
  set_grad(trained, {1.0, 1.0});
  sgd.step();
  expect_near(trained, {0.5, 1.5}, 0, "trained");
  expect_near(frozen, {5.0, 6.0}, 0, "frozen");
  Tensor op_result = ag::mul(trained, 2.0);
  expect_error([&] { SGD({op_result}, SGDOptions{.lr = 0.1}); }, {"SGD", "must be a leaf", "recorded"});
  expect_error([&] { Adam({Tensor()}, AdamOptions{}); }, {"Adam", "undefined", "leaf"});
}

TEST(OptimMisuse, ClipGradNormRejectsAnUndefinedParameterButSkipsMissingGrads) {
  Tensor a = param64({0, 0}), no_grad = param64({1});
  set_grad(a, {3.0, 4.0});
  expect_error([&] { clip_grad_norm_({a, Tensor()}, 1.0); }, {"clip_grad_norm_", "parameter 1", "undefined"});
  expect_near(autograd::grad(a), {3.0, 4.0}, 0, "untouched");
  EXPECT_DOUBLE_EQ(clip_grad_norm_({a, no_grad}, 10.0), 5.0);  // a parameter without .grad is skipped
}

TEST(OptimMisuse, HyperparametersAreCheckedLikePyTorch) {
  auto p = [] { return std::vector<Tensor>{param64({1.0})}; };
  expect_error([&] { Adam(p(), {.lr = std::nan("")}); }, {"Adam", "lr", "finite"});
  expect_error([&] { Adam(p(), {.lr = -1}); }, {"Adam", "lr", ">= 0"});
  expect_error([&] { Adam(p(), {.beta1 = 1.0}); }, {"Adam", "beta1", "[0, 1)"});
  expect_error([&] { Adam(p(), {.eps = -1e-8}); }, {"Adam", "eps"});
  expect_error([&] { Adam(p(), {.weight_decay = -0.1}); }, {"Adam", "weight_decay"});
  AdamWOptions nan_beta2;
  nan_beta2.beta2 = std::nan("");
  expect_error([&] { AdamW(p(), nan_beta2); }, {"AdamW", "beta2"});
  expect_error([&] { SGD(p(), {.lr = INFINITY}); }, {"SGD", "lr", "finite"});
  expect_error([&] { SGD(p(), {.lr = 0.1, .momentum = -0.9}); }, {"SGD", "momentum", ">= 0"});
  expect_error([&] { SGD(p(), {.lr = 0.1, .weight_decay = -1e-4}); }, {"SGD", "weight_decay", ">= 0"});
  expect_error([&] { SGD(p(), {.lr = 0.1, .nesterov = true}); }, {"SGD", "Nesterov", "momentum > 0"});
  // A group's own options, added later, too.
  SGD opt(p(), {.lr = 0.1});
  ParamGroup bad{{param64({1.0})}, {{"lr", -0.5}}};
  expect_error([&] { opt.add_param_group(bad); }, {"SGD", "lr", "-0.5"});
  EXPECT_EQ(opt.param_groups().size(), 1u);
}

TEST(OptimMisuse, SetLrRejectsNaNAndStepRejectsOptionsEditedOutOfRange) {
  Tensor a = param64({1.0});
  SGD opt({a}, {.lr = 0.1});
  expect_error([&] { opt.param_groups()[0].set_lr(std::nan("")); }, {"set_lr", "lr", "finite"});
  expect_error([&] { opt.param_groups()[0].set_lr(-1); }, {"set_lr", "lr", ">= 0"});
  EXPECT_EQ(opt.param_groups()[0].lr(), 0.1);
  // Edited straight through the options map: step() refuses before touching anything.
  opt.param_groups()[0].options["momentum"] = -1;
  set_grad(a, {1.0});
  expect_error([&] { opt.step(); }, {"SGD::step", "param group 0", "momentum"});
  EXPECT_EQ(a.item(), 1.0);
  Tensor b = param64({1.0});
  Adam adam({b}, {});
  adam.param_groups()[0].options["lr"] = std::nan("");
  set_grad(b, {1.0});
  expect_error([&] { adam.step(); }, {"Adam::step", "lr"});
  EXPECT_EQ(b.item(), 1.0);
}

// A state saved after two momentum steps on two groups.
OptimizerState two_group_sgd_state() {
  ParamGroup g0{{param64({1.0, 2.0})}, {}}, g1{{param64({3.0})}, {{"lr", 0.2}}};
  SGD opt({g0, g1}, {.lr = 0.1, .momentum = 0.9});
  for (int s = 0; s < 2; ++s) {
    set_grad(opt.param_groups()[0].params[0], grad_at(s, 2));
    set_grad(opt.param_groups()[1].params[0], grad_at(s, 1));
    opt.step();
  }
  OptimizerState st = opt.state_dict();
  for (auto& [name, t] : st.tensors) t = t.clone();
  return st;
}

// Loads `state` into a fresh two-group SGD and expects the error; checks nothing changed.
void expect_load_error(const OptimizerState& state, std::vector<std::string> parts) {
  ParamGroup g0{{param64({1.0, 2.0})}, {}}, g1{{param64({3.0})}, {{"lr", 0.7}}};
  SGD opt({g0, g1}, {.lr = 0.5, .momentum = 0.5});
  parts.push_back("nothing was changed");
  expect_error([&] { opt.load_state_dict(state); }, parts);
  EXPECT_EQ(opt.param_groups()[0].lr(), 0.5);
  EXPECT_EQ(opt.param_groups()[1].lr(), 0.7);
  EXPECT_EQ(opt.param_groups()[0].options.at("momentum"), 0.5);
  EXPECT_TRUE(opt.state_dict().tensors.empty());
}

TEST(OptimMisuse, LoadStateDictChecksEverythingBeforeWritingAnything) {
  OptimizerState good = two_group_sgd_state();
  {
    ParamGroup g0{{param64({1.0, 2.0})}, {}}, g1{{param64({3.0})}, {}};
    SGD opt({g0, g1}, {.lr = 0.5});
    opt.load_state_dict(good);  // the valid state loads
    EXPECT_EQ(opt.param_groups()[1].lr(), 0.2);
    EXPECT_EQ(opt.state_dict().tensors.size(), 2u);
  }
  OptimizerState st = good;
  st.scalars["param_groups"][0]["lr"] = -0.1;
  expect_load_error(st, {"param_groups[0]", "lr", ">= 0"});
  st = good;
  st.scalars["param_groups"][1]["lr"] = "x";  // group 0 is valid: it must not be written either
  expect_load_error(st, {"param_groups[1].lr", "must be a number", "\"x\""});
  st = good;
  st.scalars["param_groups"][0]["momentum"] = std::nan("");
  expect_load_error(st, {"param_groups[0]", "momentum", "finite"});
  st = good;
  st.scalars["param_groups"][0]["momentum"] = nullptr;  // what a NaN becomes in a JSON file
  expect_load_error(st, {"param_groups[0].momentum", "must be a number", "null"});
  st = good;
  st.scalars["param_groups"][0]["lrr"] = 0.1;
  expect_load_error(st, {"param_groups[0]", "\"lrr\""});
  st = good;
  st.scalars["state"]["abc"] = {{"step", 1}};
  expect_load_error(st, {"state key \"abc\"", "parameter index"});
  st = good;
  st.scalars["state"]["0"]["step"] = "3";
  expect_load_error(st, {"state.0.step", "integer"});
  st = good;
  st.scalars["state"]["0"]["step"] = -2;
  expect_load_error(st, {"state.0.step", ">= 0"});
  st = good;
  st.scalars["state"]["7"] = {{"step", 1}};
  expect_load_error(st, {"state for parameter 7"});
  st = good;
  st.tensors[0].second = Tensor();
  expect_load_error(st, {st.tensors[0].first, "undefined"});
  st = good;
  st.tensors.pop_back();  // parameter 1 keeps its step count but loses its momentum buffer
  expect_load_error(st, {"parameter 1", "step count", "state.1.momentum_buffer"});
  st = good;
  st.scalars["state"].erase("1");  // a buffer without a step count
  expect_load_error(st, {"state.1.momentum_buffer", "no entry"});
  st = good;
  st.tensors.emplace_back("state.0.exp_avg", zeros({2}, DType::kFloat64));
  expect_load_error(st, {"state.0.exp_avg", "SGD keeps no buffer named 'exp_avg'"});
  st = good;
  st.tensors.emplace_back("state.x1.momentum_buffer", zeros({2}, DType::kFloat64));
  expect_load_error(st, {"bad tensor name 'state.x1.momentum_buffer'"});
}

TEST(OptimMisuse, StateTensorNamesParseOnlyInTheirOneForm) {
  std::optional<StateTensorName> ok = parse_state_tensor_name("state.17.exp_avg_sq");
  ASSERT_TRUE(ok.has_value());
  EXPECT_EQ(ok->param_index, 17u);
  EXPECT_EQ(ok->buffer, "exp_avg_sq");
  EXPECT_EQ(parse_state_tensor_name("state.0.a.b")->buffer, "a.b");  // the buffer is the rest
  for (const char* bad : {"state.x1.momentum_buffer", "state.-1.m", "state.1", "state.1.", "state..m",
                          "states.1.m", "1.m", "", "state.1234567890123456789.m"}) {
    EXPECT_FALSE(parse_state_tensor_name(bad).has_value()) << bad;
  }
}

TEST(OptimMisuse, AdamStateMustBeComplete) {
  Tensor p = param64({1.0, 2.0});
  Adam a({p}, {});
  set_grad(p, {0.1, 0.2});
  a.step();
  OptimizerState st = a.state_dict();
  st.tensors.erase(st.tensors.begin());  // exp_avg gone: the bias correction would restart wrong
  Adam b({param64({1.0, 2.0})}, {});
  expect_error([&] { b.load_state_dict(st); }, {"Adam::load_state_dict", "state.0.exp_avg", "nothing was changed"});
  EXPECT_TRUE(b.state_dict().scalars["state"].empty());
}

TEST(OptimMisuse, AmsgradSwitchedOnLaterStartsItsMaximum) {
  Tensor p = param64({1.0});
  Adam a({p}, {.lr = 0.1});
  set_grad(p, {0.5});
  a.step();
  a.param_groups()[0].options["amsgrad"] = 1;
  set_grad(p, {0.5});
  a.step();  // used to fail on an undefined max_exp_avg_sq
  EXPECT_EQ(a.state_dict().tensors.size(), 3u);
  a.param_groups()[0].options["amsgrad"] = 2;
  expect_error([&] { a.step(); }, {"amsgrad", "0 or 1"});
}

TEST(LRScheduleMisuse, ConstructorArgumentsAreChecked) {
  SGD opt({param64({1.0})}, {.lr = 1.0});
  expect_error([&] { StepLR(opt, 1, -1.0); }, {"StepLR", "gamma", "> 0"});
  expect_error([&] { StepLR(opt, 1, std::nan("")); }, {"StepLR", "gamma"});
  expect_error([&] { StepLR(opt, 1, 0.0); }, {"StepLR", "gamma"});
  expect_error([&] { CosineAnnealingLR(opt, 10, -5.0); }, {"CosineAnnealingLR", "eta_min", ">= 0"});
  expect_error([&] { CosineAnnealingLR(opt, 10, INFINITY); }, {"CosineAnnealingLR", "eta_min", "finite"});
  expect_error([&] { LinearWarmup(opt, 2, 0.5, 3, -1.0); }, {"LinearWarmup", "after_eta_min"});
  expect_error([&] { LinearWarmup(opt, 2, std::nan("")); }, {"LinearWarmup", "start_factor"});
  EXPECT_EQ(opt.param_groups()[0].lr(), 1.0);
}

TEST(LRScheduleMisuse, LrAtChecksTheGroupAndTheEpoch) {
  SGD opt({param64({1.0})}, {.lr = 1.0});
  StepLR step(opt, 2, 0.5);
  CosineAnnealingLR cos(opt, 4);
  LinearWarmup warm(opt, 2);
  for (LRScheduler* s : std::vector<LRScheduler*>{&step, &cos, &warm}) {
    expect_error([&] { s->lr_at(0, 5); }, {"lr_at", "group 5", "1 param group"});
    expect_error([&] { s->lr_at(-1, 0); }, {"lr_at", "epoch", ">= 0"});
  }
}

TEST(LRScheduleMisuse, LoadStateDictChecksTypesAndRangesAndChangesNothing) {
  SGD opt({param64({1.0})}, {.lr = 1.0});
  StepLR step(opt, 1, 0.1);
  step.step();
  nlohmann::json good = step.state_dict();
  auto expect_bad = [&](const nlohmann::json& state, std::vector<std::string> parts) {
    parts.push_back("nothing was changed");
    expect_error([&] { step.load_state_dict(state); }, parts);
    EXPECT_EQ(step.last_epoch(), 1);
    EXPECT_NEAR(opt.param_groups()[0].lr(), 0.1, 1e-15);
  };
  nlohmann::json st = good;
  st["last_epoch"] = -5;  // used to give lr 1000
  expect_bad(st, {"last_epoch", ">= 0"});
  st = good;
  st["last_epoch"] = "3";  // used to throw nlohmann's type_error
  expect_bad(st, {"last_epoch", "integer"});
  st = good;
  st["last_epoch"] = 2.5;
  expect_bad(st, {"last_epoch", "integer"});
  st = good;
  st["base_lrs"] = {"x"};
  expect_bad(st, {"base_lrs", "[0]", "number"});
  st = good;
  st["base_lrs"] = {-1.0};
  expect_bad(st, {"base_lrs", ">= 0"});
  st = good;
  st["base_lrs"] = 1.0;
  expect_bad(st, {"base_lrs", "array"});
  st = good;
  st["type"] = 5;
  expect_bad(st, {"type", "string"});
  st = good;
  st["last_epoch"] = 3;
  step.load_state_dict(st);  // a valid state loads
  EXPECT_EQ(step.last_epoch(), 3);
  EXPECT_NEAR(opt.param_groups()[0].lr(), 1e-3, 1e-15);
}

// A saved hyperparameter gets the constructor's checks (a corrupt checkpoint is an error
// naming the field, never a division by zero or an lr of NaN), and a refused state
// changes nothing: not the epoch, the lr, nor any hyperparameter.
TEST(LRScheduleMisuse, LoadedHyperparametersAreCheckedLikeTheConstructorsAndChangeNothing) {
  SGD opt({param64({1.0})}, {.lr = 1.0});
  StepLR step(opt, 1, 0.1);
  step.step();
  const nlohmann::json good = step.state_dict();
  auto expect_bad = [&](LRScheduler& schedule, const nlohmann::json& state, std::vector<std::string> parts) {
    const nlohmann::json before = schedule.state_dict();
    const double lr = opt.param_groups()[0].lr();
    parts.push_back("nothing was changed");
    expect_error([&] { schedule.load_state_dict(state); }, parts);
    expect_error([&] { schedule.check_state_dict(state); }, parts);
    EXPECT_EQ(schedule.state_dict(), before);
    EXPECT_EQ(opt.param_groups()[0].lr(), lr);
  };
  auto with = [&](const char* key, const nlohmann::json& value) {
    nlohmann::json st = good;
    st[key] = value;
    return st;
  };
  expect_bad(step, with("step_size", 0), {"StepLR::load_state_dict", "step_size must be positive, got 0"});
  expect_bad(step, with("step_size", -2), {"step_size must be positive"});
  expect_bad(step, with("step_size", 2.5), {"\"step_size\" must be an integer"});
  expect_bad(step, with("step_size", "2"), {"\"step_size\" must be an integer"});
  expect_bad(step, with("step_size", nlohmann::json(uint64_t{1} << 63)), {"\"step_size\" is out of range"});
  expect_bad(step, with("gamma", nullptr), {"\"gamma\" must be a number, got null"});  // inf/NaN as written
  expect_bad(step, with("gamma", -1.0), {"gamma", "must be finite and > 0"});
  expect_bad(step, with("gamma", 0), {"gamma", "must be finite and > 0"});

  CosineAnnealingLR cos(opt, 4);
  nlohmann::json st = cos.state_dict();
  st["t_max"] = 0;  // would divide by zero
  expect_bad(cos, st, {"CosineAnnealingLR::load_state_dict", "t_max must be positive"});
  st = cos.state_dict();
  st["eta_min"] = -0.5;
  expect_bad(cos, st, {"eta_min", ">= 0"});

  LinearWarmup warm(opt, 2, 0.5);
  st = warm.state_dict();
  st["start_factor"] = 0.0;
  expect_bad(warm, st, {"LinearWarmup::load_state_dict", "start_factor must be in (0, 1]"});
  st = warm.state_dict();
  st["warmup_steps"] = -1;
  expect_bad(warm, st, {"warmup_steps", ">= 0"});
  st = warm.state_dict();
  st["after_eta_min"] = "x";
  expect_bad(warm, st, {"\"after_eta_min\" must be a number"});
}

}  // namespace
}  // namespace ringtrain::nn
