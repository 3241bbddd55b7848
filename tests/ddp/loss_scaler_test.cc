// LossScaler against the GradScaler rule, written out step by step.
#include "ddp/loss_scaler.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "autograd/autograd.h"
#include "autograd/functions.h"
#include "tensor/ops.h"
#include "tests/common/expect_error.h"

namespace ringtrain::ddp {
namespace {

// The GradScaler rule as a plain function: the scale after each of `steps` steps,
// given which steps overflow.
std::vector<double> reference_scales(double init, double growth, double backoff, int64_t interval,
                                     const std::vector<bool>& overflow) {
  std::vector<double> scales;
  double scale = init;
  int64_t tracker = 0;
  for (bool inf : overflow) {
    if (inf) {
      scale *= backoff;
      tracker = 0;
    } else if (++tracker == interval) {
      scale *= growth;
      tracker = 0;
    }
    scales.push_back(scale);
  }
  return scales;
}

// An integer loss or gradient has no scale to apply or undo (and no gradient).
TEST(LossScalerTest, IntegerLossOrGradientsAreRefused) {
  LossScaler scaler;
  EXPECT_THROW(scaler.scale(full({1}, 3, DType::kInt64)), Error);
  EXPECT_THROW(scaler.scale(Tensor()), Error);
  EXPECT_THROW(scaler.unscale_({full({2}, 1, DType::kInt32)}), Error);
}

TEST(LossScalerTest, DefaultsMatchGradScaler) {
  LossScaler scaler;
  EXPECT_EQ(scaler.get_scale(), 65536.0);
  LossScalerOptions o;
  EXPECT_EQ(o.growth_factor, 2.0);
  EXPECT_EQ(o.backoff_factor, 0.5);
  EXPECT_EQ(o.growth_interval, 2000);
}

TEST(LossScalerTest, ScaleSequenceUnderInjectedOverflowsFollowsTheRule) {
  LossScalerOptions options;
  options.init_scale = 1024;
  options.growth_interval = 3;
  LossScaler scaler(options);
  std::vector<bool> overflow = {false, false, false, true, false, true, true, false, false, false,
                                false, false, false, true, false};
  std::vector<double> expected = reference_scales(1024, 2.0, 0.5, 3, overflow);
  Tensor param = ones({4});
  for (size_t step = 0; step < overflow.size(); ++step) {
    // The gradient a backward of the scaled loss would produce: S * 0.5, or inf.
    Tensor grad = full({4}, 0.5 * scaler.get_scale());
    if (overflow[step]) {
      Tensor bad = grad.narrow(0, 2, 1);
      fill_(bad, std::numeric_limits<double>::infinity());
    }
    bool ran = false;
    bool stepped = scaler.step({grad}, [&] {
      ran = true;
      add_(param, grad, -1.0);
    });
    EXPECT_EQ(stepped, !overflow[step]) << "step " << step;
    EXPECT_EQ(ran, !overflow[step]) << "step " << step;
    EXPECT_EQ(scaler.step_skipped(), overflow[step]);
    if (!overflow[step]) {
      EXPECT_EQ(grad.to_vector<float>(), std::vector<float>(4, 0.5f));  // unscaled
    }
    scaler.update();
    EXPECT_EQ(scaler.get_scale(), expected[step]) << "step " << step;
  }
  // 11 clean steps of -0.5 each.
  EXPECT_EQ(param.to_vector<float>(), std::vector<float>(4, 1.0f - 0.5f * 11));
}

TEST(LossScalerTest, NaNCountsAsOverflowAndUnscaleBeforeClipping) {
  LossScaler scaler;
  Tensor grad = full({3}, 65536.0 * 3);
  EXPECT_FALSE(scaler.unscale_({grad, Tensor()}));  // undefined grads are skipped
  EXPECT_EQ(grad.to_vector<float>(), std::vector<float>(3, 3.0f));
  EXPECT_THROW(scaler.unscale_({grad}), Error);  // twice in one step
  EXPECT_TRUE(scaler.step({grad}, [] {}));       // uses the earlier unscale, no second division
  EXPECT_EQ(grad.to_vector<float>(), std::vector<float>(3, 3.0f));
  scaler.update();

  Tensor nan_grad = full({2}, std::nan(""));
  EXPECT_FALSE(scaler.step({nan_grad}, [] { FAIL() << "optimizer must not run on NaN"; }));
  scaler.update();
  EXPECT_EQ(scaler.get_scale(), 32768.0);
}

TEST(LossScalerTest, HalfPrecisionGradientsOverflowLikeOnTheGpu) {
  // 70000 is beyond float16's max (65504): a gradient scaled in fp16 is inf, and its float32
  // master copy (what O2 unscales) is inf too.
  LossScaler scaler;
  Tensor grad = full({2}, 70000.0).to(DType::kFloat16).to(DType::kFloat32);
  EXPECT_TRUE(scaler.unscale_({grad}));
  scaler.update();
  EXPECT_EQ(scaler.get_scale(), 32768.0);
  Tensor scaled = scaler.scale(full({}, 1.5, DType::kFloat16));
  EXPECT_EQ(scaled.dtype(), DType::kFloat16);
  EXPECT_EQ(scaled.item(), 49152.0);  // 1.5 * 32768, exact in fp16
}

TEST(LossScalerTest, DisabledIsTheIdentity) {
  LossScalerOptions options;
  options.enabled = false;
  LossScaler scaler(options);
  Tensor loss = full({}, 3.0);
  EXPECT_TRUE(scaler.scale(loss).is_same(loss));
  Tensor grad = full({1}, std::numeric_limits<double>::infinity());
  EXPECT_TRUE(scaler.step({grad}, [] {}));
  scaler.update();
  EXPECT_EQ(scaler.get_scale(), 65536.0);
}

// As GradScaler(enabled=False), whose unscale_, step and update return before touching
// any state: a disabled scaler steps every time, with or without update() in between
// (a bf16 or float32 loop that leaves out the no-op update()). Before, its second step()
// threw "already called since the last update()" and did not step.
TEST(LossScalerTest, DisabledStepsEveryTimeWithoutUpdate) {
  LossScalerOptions options;
  options.enabled = false;
  LossScaler scaler(options);
  Tensor grad = full({2}, 3.0);
  int steps = 0;
  for (int i = 0; i < 3; ++i) {
    EXPECT_FALSE(scaler.unscale_({grad}));
    EXPECT_TRUE(scaler.step({grad}, [&] { ++steps; })) << "step " << i;
  }
  EXPECT_EQ(steps, 3);
  EXPECT_EQ(grad.to_vector<float>(), (std::vector<float>{3, 3}));  // never divided
  EXPECT_THROW(scaler.step({ones({1}).to(DType::kInt64)}, [&] { ++steps; }), Error);  // still checked
  EXPECT_EQ(steps, 3);
}

TEST(LossScalerTest, StateDictRoundTripsAndRejectsGarbage) {
  LossScalerOptions options;
  options.growth_interval = 2;
  LossScaler a(options);
  for (int i = 0; i < 3; ++i) {
    Tensor g = ones({1});
    a.step({g}, [] {});
    a.update();
  }
  LossScaler b;
  b.load_state_dict(a.state_dict());
  EXPECT_EQ(b.get_scale(), a.get_scale());
  EXPECT_EQ(b.growth_tracker(), a.growth_tracker());
  EXPECT_EQ(b.state_dict(), a.state_dict());
  EXPECT_THROW(b.load_state_dict(nlohmann::json{{"scale", 2.0}}), Error);
  EXPECT_THROW(LossScaler(LossScalerOptions{.init_scale = 1, .growth_factor = 0.5}), Error);
  // What the constructor refuses, loading refuses too: a factor of 1 freezes the scale.
  for (const char* key : {"growth_factor", "backoff_factor"}) {
    nlohmann::json state = a.state_dict();
    state[key] = 1.0;
    EXPECT_THROW(b.load_state_dict(state), Error) << key;
  }
}

// The constructor (the run's precision) decides whether scaling is on, not the checkpoint:
// before, loading an enabled scaler's state turned a disabled scaler on (a bf16 run resumed
// from an fp16 checkpoint scaled its loss), and the reverse turned scaling off silently.
TEST(LossScalerTest, LoadingStateNeverChangesWhetherScalingIsOn) {
  LossScaler enabled;
  LossScalerOptions off;
  off.enabled = false;
  LossScaler disabled(off);
  disabled.load_state_dict(enabled.state_dict());  // a no-op, as GradScaler's
  EXPECT_FALSE(disabled.enabled());
  LossScaler other;
  try {
    other.load_state_dict(disabled.state_dict());
    FAIL() << "an enabled scaler loaded a disabled one's state";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("disabled"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(other.enabled());
  nlohmann::json bad = enabled.state_dict();
  bad["growth_tracker"] = 5000;  // beyond growth_interval 2000
  EXPECT_THROW(other.load_state_dict(bad), Error);
}

// As GradScaler ("Attempting to unscale FP16 gradients"): unscaling float16 gradients in place
// flushed the small ones to zero (1e-3 / 65536 -> 0); it is now an error naming the fix.
// bfloat16 has float32's exponent range, so it is allowed.
TEST(LossScalerTest, Float16GradientsAreNotUnscaledInPlace) {
  LossScaler scaler;
  Tensor fp16 = full({2}, 1e-3).to(DType::kFloat16);
  try {
    scaler.unscale_({fp16});
    FAIL() << "unscaled float16 gradients";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("MasterWeights"), std::string::npos) << e.what();
  }
  LossScaler other;
  Tensor bf16 = full({2}, 1.0).to(DType::kBFloat16);
  EXPECT_FALSE(other.unscale_({bf16}));
}

// As GradScaler: step() twice without update() is an error, not a second optimizer step.
TEST(LossScalerTest, SecondStepBeforeUpdateIsAnError) {
  LossScaler scaler;
  int steps = 0;
  Tensor g = ones({1});
  EXPECT_TRUE(scaler.step({g}, [&] { ++steps; }));
  EXPECT_THROW(scaler.step({g}, [&] { ++steps; }), Error);
  EXPECT_EQ(steps, 1);
  scaler.update();
  EXPECT_TRUE(scaler.step({g}, [&] { ++steps; }));
  EXPECT_EQ(steps, 2);
}

// Runs `cycles` steps of a loss of 0 in `dtype` (zero gradients: nothing ever overflows)
// through the scaler with growth_interval 1, the whole path: scale, backward, step, update.
// Returns how many steps were skipped.
int64_t skipped_steps_with_zero_loss(LossScaler& scaler, DType dtype, int cycles) {
  Tensor param = autograd::set_requires_grad(zeros({2}, dtype));
  int64_t skipped = 0;
  for (int i = 0; i < cycles; ++i) {
    autograd::set_grad(param, Tensor());
    Tensor loss = ag::sum(ag::mul(param, 0.0));  // 0, and d loss / d param = 0
    autograd::backward(scaler.scale(loss));
    if (!scaler.step({autograd::grad(param)}, [] {})) ++skipped;
    scaler.update();
  }
  return skipped;
}

// As _amp_update_scale_ ("Do not grow the scale past fp32 bounds to inf"): the scale
// stops at 2^127. Before, it grew to 2^128 (inf as a float32): a float32 loss of 0
// times it was NaN, so every other step was skipped; a float64 loss let it grow to
// double inf, where it stayed (inf * backoff = inf) and state_dict wrote "scale": null.
TEST(LossScalerTest, TheScaleNeverGrowsPastFloat32Range) {
  const double kMaxScale = std::ldexp(1.0, 127);
  {
    LossScaler scaler({.growth_interval = 1});  // 2^16, doubling after every clean step
    EXPECT_EQ(skipped_steps_with_zero_loss(scaler, DType::kFloat32, 200), 0);
    EXPECT_EQ(scaler.get_scale(), kMaxScale);
    EXPECT_EQ(scaler.growth_tracker(), 0);  // a growth refused still restarts the count
  }
  {
    LossScaler scaler({.growth_interval = 1});
    EXPECT_EQ(skipped_steps_with_zero_loss(scaler, DType::kFloat64, 1100), 0);
    EXPECT_EQ(scaler.get_scale(), kMaxScale);
    nlohmann::json state = scaler.state_dict();
    EXPECT_TRUE(state["scale"].is_number()) << state.dump();
    LossScaler resumed;
    resumed.load_state_dict(state);
    EXPECT_EQ(resumed.get_scale(), kMaxScale);
  }
}

TEST(LossScalerTest, AnInitScaleOutsideFloat32RangeIsRefused) {
  using ringtrain::testing::expect_error;
  expect_error([] { LossScaler({.init_scale = INFINITY}); }, {"LossScaler", "init_scale", "finite", "65536"});
  expect_error([] { LossScaler({.init_scale = 1e39}); }, {"LossScaler", "init_scale", "float32"});
  expect_error([] { LossScaler({.init_scale = std::nan("")}); }, {"LossScaler", "init_scale"});
  LossScaler largest({.init_scale = std::numeric_limits<float>::max()});  // the bound itself is fine
  EXPECT_EQ(largest.get_scale(), std::numeric_limits<float>::max());
  // A checkpoint written before the growth was capped may hold a larger scale: it
  // resumes at 2^127 (where the capped growth stops), not past float32's range.
  nlohmann::json old_state = largest.state_dict();
  old_state["scale"] = std::ldexp(1.0, 130);
  LossScaler resumed;
  resumed.load_state_dict(old_state);
  EXPECT_EQ(resumed.get_scale(), std::ldexp(1.0, 127));
}

}  // namespace
}  // namespace ringtrain::ddp
