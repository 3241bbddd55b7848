// loss_scaler.h: dynamic loss scaling for fp16/bf16 mixed precision, with the
// semantics of PyTorch's torch.cuda.amp.GradScaler.
//
// Why: fp16 gradients underflow (anything below ~6e-8 becomes 0). Multiplying the
// loss by a large scale S before backward multiplies every gradient by S, which
// lifts them into fp16's range; the optimizer then sees grad / S. If S is too
// large some gradient overflows to inf/NaN: that step is skipped and S halves.
// After `growth_interval` clean steps in a row S doubles, probing for the largest
// scale that does not overflow, but never past float32's largest value (~3.4e38,
// just below 2^128): as in GradScaler, whose scale is a float32 tensor, a growth
// that would leave that range keeps S (the clean-step count still restarts).
//
// One step, in the order the caller uses it:
//   scaled = scaler.scale(loss);  backward(scaled);
//   scaler.unscale_(grads);       // optional: before clipping gradients
//   bool stepped = scaler.step(grads, [&] { optimizer.step(); });
//   scaler.update();              // grow or back off the scale
//
// In data-parallel training every rank must make the same decision, or the
// replicas diverge: the "found inf" flag is reduced (max) across the process
// group, so if any rank overflowed, every rank skips the step.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include <nlohmann/json.hpp>

#include "comm/process_group.h"
#include "tensor/tensor.h"

namespace ringtrain::ddp {

struct LossScalerOptions {
  double init_scale = 65536.0;    // 2^16, GradScaler's default; > 0 and finite in float32
  double growth_factor = 2.0;     // scale *= this after growth_interval clean steps
  double backoff_factor = 0.5;    // scale *= this on a step with inf/NaN
  int64_t growth_interval = 2000; // clean steps in a row before growing
  // false: scale() and unscale_() are identities, step() always steps, and no call order
  // is enforced (update() may be left out), as with GradScaler(enabled=False)
  bool enabled = true;
};

class LossScaler {
 public:
  // `group` (may be null for one process) is where the overflow flag is agreed.
  explicit LossScaler(LossScalerOptions options = {},
                      std::shared_ptr<comm::ProcessGroup> group = nullptr);

  // loss * scale, in the loss's dtype, recorded by autograd (backward through it).
  Tensor scale(const Tensor& loss) const;
  // Divides every gradient by the scale in place (once per step when enabled; a
  // second call before update() throws) and records whether any rank saw inf/NaN.
  // Undefined tensors in `grads` (parameters without a gradient) are skipped.
  // Returns the agreed found-inf flag.
  bool unscale_(const std::vector<Tensor>& grads);
  // Unscales if the caller has not, then runs `optimizer_step` unless an overflow
  // was found. Returns true when the step ran. The LR schedule should not advance
  // on a skipped step (step_skipped() tells it).
  bool step(const std::vector<Tensor>& grads, const std::function<void()>& optimizer_step);
  // Ends the step: backs off on overflow, grows after growth_interval clean steps.
  void update();

  double get_scale() const { return scale_; }
  int64_t growth_tracker() const { return growth_tracker_; }
  bool step_skipped() const { return last_step_skipped_; }
  bool enabled() const { return options_.enabled; }

  // Everything needed to resume bit-exactly: scale, growth tracker and the options.
  nlohmann::json state_dict() const;
  void load_state_dict(const nlohmann::json& state);

 private:
  // max over ranks of a 0/1 flag (the identity without a group).
  bool any_rank(bool flag) const;
  // `scale` is finite as a double and as a float32 (the range S is kept in).
  static bool fits_float32(double scale);

  LossScalerOptions options_;
  std::shared_ptr<comm::ProcessGroup> group_;  // null: single process
  double scale_;                               // current loss scale S
  int64_t growth_tracker_ = 0;                 // clean steps since the last change of S
  bool unscaled_ = false;                      // unscale_ already ran this step
  bool stepped_ = false;                       // step() already ran this step
  bool found_inf_ = false;                     // this step's agreed overflow flag
  bool last_step_skipped_ = false;             // the latest step() skipped the optimizer
};

}  // namespace ringtrain::ddp
