// master_weights.h: "O2" mixed precision, a half-precision model with float32
// master weights in the optimizer.
//
// defines: MasterWeights.
//
// The model's parameters are float16/bfloat16 (model->to(DType::kFloat16)): the
// forward and backward run in half precision, and DDP reduces half-size buckets.
// The optimizer, however, updates float32 copies (the masters): an update of
// lr * g is often smaller than half precision's resolution around the weight
// (fp16 has 11 significant bits), so applying it to the half weights directly
// would round it away. One step:
//
//   backward(scaler.scale(loss));                 // half gradients, scaled
//   auto grads = masters.copy_grads_to_masters(); // float32 .grad on the masters
//   if (scaler.step(grads, [&] { opt.step(); }))   // unscale, skip on inf/NaN
//     masters.copy_masters_to_model();            // round the new weights to half
//   scaler.update();
//
// The optimizer is built on masters.master_params(), never on the model.
//
// Checkpoints: save_checkpoint saves the model (half) and the optimizer state (which
// belongs to the masters). After loading one into the model, call
// copy_model_to_masters(): otherwise the masters still hold the weights they were
// constructed from, and the next copy_masters_to_model() would overwrite the loaded
// model with them. The masters' bits below half precision are not in the checkpoint,
// so an O2 run resumes from its half weights widened to float32, close to but not
// bitwise the uninterrupted run (O1 autocast runs, whose weights are float32, resume
// exactly).
#pragma once

#include <vector>

#include "nn/module.h"

namespace ringtrain::ddp {

class MasterWeights {
 public:
  // Snapshots the model's (half-precision) parameters as float32 leaves.
  explicit MasterWeights(nn::Module& model);

  // float32 leaves that require grad, one per model parameter, same order.
  const std::vector<Tensor>& master_params() const { return masters_; }
  // Sets each master's .grad to its model parameter's gradient in float32 (undefined
  // when the model parameter has none) and returns them, for LossScaler::step.
  std::vector<Tensor> copy_grads_to_masters();
  // Writes the masters back into the model's parameters (rounded to their dtype).
  void copy_masters_to_model();
  // Sets the masters from the model's parameters (widened to float32): after the model
  // was loaded from a checkpoint, or changed by hand.
  void copy_model_to_masters();

 private:
  std::vector<Tensor> model_params_;  // the model's own (half) parameters
  std::vector<Tensor> masters_;       // float32 copies the optimizer updates
};

}  // namespace ringtrain::ddp
