// loss_scaler.cc: see loss_scaler.h for the algorithm (PyTorch GradScaler rules).
#include "ddp/loss_scaler.h"

#include <cmath>
#include <limits>

#include "autograd/functions.h"
#include "tensor/ops.h"

namespace ringtrain::ddp {

LossScaler::LossScaler(LossScalerOptions options, std::shared_ptr<comm::ProcessGroup> group)
    : options_(options), group_(std::move(group)), scale_(options.init_scale) {
  RT_CHECK(options_.init_scale > 0 && options_.growth_factor > 1.0 && options_.backoff_factor > 0 &&
               options_.backoff_factor < 1.0 && options_.growth_interval > 0,
           "LossScaler: need init_scale > 0, growth_factor > 1, 0 < backoff_factor < 1 and "
           "growth_interval > 0; got ", options_.init_scale, ", ", options_.growth_factor, ", ",
           options_.backoff_factor, ", ", options_.growth_interval);
  // GradScaler keeps its scale in a float32 tensor, and a float32 loss times a scale
  // past FLT_MAX is inf: every step would overflow. (NaN fails the check above.)
  RT_CHECK(fits_float32(options_.init_scale), "LossScaler: init_scale must be finite and at most "
           "float32's largest value (", std::numeric_limits<float>::max(), "), got ", options_.init_scale,
           "; GradScaler's default is 65536 (2^16)");
}

// A comparison, not static_cast<float>(scale): converting a double beyond float's
// range is undefined behaviour in C++ (IEEE rounding makes it inf on our targets).
bool LossScaler::fits_float32(double scale) {
  return std::isfinite(scale) && scale <= std::numeric_limits<float>::max();
}

Tensor LossScaler::scale(const Tensor& loss) const {
  RT_CHECK(loss.defined() && is_floating_point(loss.dtype()), "LossScaler::scale: the loss must be a floating-point "
           "tensor, got ", loss.defined() ? loss.describe() : std::string("an undefined tensor"));
  if (!options_.enabled) return loss;
  return ag::mul(loss, scale_);  // differentiable: backward of the scaled loss gives S * grad
}

bool LossScaler::any_rank(bool flag) const {
  if (!group_ || group_->size() == 1) return flag;
  float value = flag ? 1.0f : 0.0f;
  group_->allreduce(comm::BufferRef{&value, 1, DType::kFloat32, Device::cpu()}, comm::ReduceOp::kMax)
      .wait();
  return value > 0.0f;
}

bool LossScaler::unscale_(const std::vector<Tensor>& grads) {
  for (const Tensor& grad : grads)
    RT_CHECK(!grad.defined() || is_floating_point(grad.dtype()), "LossScaler::unscale_: gradient ", grad.describe(),
             " is not floating-point; pass the parameters' gradients");
  // Disabled, as GradScaler: nothing to undo and no per-step state, so no once-per-step rule.
  if (!options_.enabled) return found_inf_ = false;
  RT_CHECK(!unscaled_, "LossScaler::unscale_: already called since the last update(); "
                       "call it at most once per step");
  // As GradScaler: dividing float16 gradients in place by the scale flushes the small ones
  // to zero (the very values scaling exists to keep). O2 keeps float32 master gradients.
  for (const Tensor& grad : grads)
    RT_CHECK(!grad.defined() || grad.dtype() != DType::kFloat16,
             "LossScaler::unscale_: gradient ", grad.describe(), " is float16; unscaling it in place "
             "would flush small values to zero. Keep float32 gradients (autocast with float32 weights), "
             "or unscale float32 master gradients (ddp::MasterWeights::copy_grads_to_masters)");
  unscaled_ = true;
  const double inverse = 1.0 / scale_;
  bool local_inf = false;
  for (const Tensor& grad : grads) {
    if (!grad.defined()) continue;
    Tensor g = grad;
    mul_(g, inverse);
    // inf and NaN survive the division, so checking the unscaled values is enough.
    if (!local_inf && !all_finite(g)) local_inf = true;
  }
  found_inf_ = any_rank(local_inf);
  return found_inf_;
}

bool LossScaler::step(const std::vector<Tensor>& grads, const std::function<void()>& optimizer_step) {
  if (!options_.enabled) {  // as GradScaler: just the optimizer step, every time
    unscale_(grads);        // (only checks the gradients' dtypes)
    last_step_skipped_ = false;
    optimizer_step();
    return true;
  }
  // As GradScaler: a second step() would step the optimizer again on the same gradients.
  RT_CHECK(!stepped_, "LossScaler::step: already called since the last update(); call update() "
                      "after every step()");
  stepped_ = true;
  if (!unscaled_) unscale_(grads);
  last_step_skipped_ = found_inf_;
  if (!found_inf_) optimizer_step();
  return !last_step_skipped_;
}

void LossScaler::update() {
  RT_CHECK(unscaled_ || !options_.enabled, "LossScaler::update: called without step() or unscale_() "
                                           "in this iteration");
  if (options_.enabled) {
    if (found_inf_) {
      scale_ *= options_.backoff_factor;
      growth_tracker_ = 0;
    } else if (++growth_tracker_ == options_.growth_interval) {
      // As _amp_update_scale_: never grow past float32's range. A scale of inf would
      // turn a float32 loss into inf/NaN (a skipped step every growth_interval + 1
      // steps), and a float64 loss could grow it to double inf, which never comes back
      // and which state_dict cannot write. The tracker restarts either way.
      const double grown = scale_ * options_.growth_factor;
      if (fits_float32(grown)) scale_ = grown;
      growth_tracker_ = 0;
    }
  }
  unscaled_ = false;
  stepped_ = false;
  found_inf_ = false;
}

nlohmann::json LossScaler::state_dict() const {
  return {{"scale", scale_},
          {"growth_tracker", growth_tracker_},
          {"growth_factor", options_.growth_factor},
          {"backoff_factor", options_.backoff_factor},
          {"growth_interval", options_.growth_interval},
          {"enabled", options_.enabled}};
}

// Whether scaling is on stays what the constructor said (the run's precision decides it,
// not the checkpoint), as with GradScaler: loading into a disabled scaler does nothing,
// and loading a disabled scaler's state into an enabled one is an error, since the
// checkpoint has no scale to continue from.
void LossScaler::load_state_dict(const nlohmann::json& state) {
  if (!options_.enabled) return;
  double scale = 0, growth_factor = 0, backoff_factor = 0;
  int64_t growth_tracker = 0, growth_interval = 0;
  bool saved_enabled = false;
  try {
    scale = state.at("scale").get<double>();
    growth_tracker = state.at("growth_tracker").get<int64_t>();
    growth_factor = state.at("growth_factor").get<double>();
    backoff_factor = state.at("backoff_factor").get<double>();
    growth_interval = state.at("growth_interval").get<int64_t>();
    saved_enabled = state.at("enabled").get<bool>();
  } catch (const nlohmann::json::exception& e) {
    throw Error(std::string("LossScaler::load_state_dict: malformed state (") + e.what() +
                "); expected the object written by state_dict()");
  }
  RT_CHECK(saved_enabled, "LossScaler::load_state_dict: the state was saved by a disabled scaler (a run "
                          "without fp16 loss scaling, e.g. precision 32 or bf16-mixed), so it has no "
                          "scale to resume; resume with the precision the checkpoint was written with, "
                          "or start this run without resuming");
  RT_CHECK(scale > 0 && std::isfinite(scale), "LossScaler::load_state_dict: scale must be positive and "
                                              "finite, got ", scale);
  // The constructor's bounds: a factor of 1 would freeze the scale (review: accepted here before).
  RT_CHECK(growth_factor > 1 && backoff_factor > 0 && backoff_factor < 1 && growth_interval >= 1 &&
               growth_tracker >= 0 && growth_tracker < growth_interval,
           "LossScaler::load_state_dict: inconsistent state (growth_factor ", growth_factor,
           ", backoff_factor ", backoff_factor, ", growth_interval ", growth_interval, ", growth_tracker ",
           growth_tracker, ")");
  // A scale past float32's range (only a checkpoint written before the growth was
  // capped has one) would make every float32 step overflow: it resumes at 2^127, the
  // largest power of two that fits, where such a scale would have stopped growing.
  scale_ = fits_float32(scale) ? scale : std::ldexp(1.0, 127);
  growth_tracker_ = growth_tracker;
  options_.growth_factor = growth_factor;
  options_.backoff_factor = backoff_factor;
  options_.growth_interval = growth_interval;
  unscaled_ = false;
  stepped_ = false;
  found_inf_ = false;
}

}  // namespace ringtrain::ddp
