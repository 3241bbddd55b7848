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
// Order with DDP: either. The masters are snapshots, so one taken before DDP's
// constructor broadcast rank 0's weights into the model would hold this rank's own
// initial weights; copy_grads_to_masters() therefore first re-takes every master whose
// model parameter was written since the masters last matched it (tensor version
// counters: the broadcast, a checkpoint loaded into the model only, weights set by hand)
// while the master itself was not (a checkpoint that also loaded the masters keeps them),
// and whose values are no longer the master rounded to half precision: a write of the
// values it already had (a failed checkpoint load rolled back, DDP's broadcast of weights
// every rank already holds) keeps the master's bits below half precision.
//
// Checkpoints: save_checkpoint saves the model (half) and the optimizer state (which
// belongs to the masters); pass checkpoint_tensors() as the targets' extra_tensors
// to save and load the masters too. Then a resumed O2 run continues bitwise like
// the uninterrupted one. A checkpoint without them (or weights set by hand) needs
// no call: the next copy_grads_to_masters() re-takes the masters from the loaded model
// (as copy_model_to_masters() does at once); the run then resumes from its half
// weights widened to float32, close to but not bitwise the uninterrupted run.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "nn/module.h"

namespace ringtrain::ddp {

class MasterWeights {
 public:
  // Snapshots the model's (half-precision) parameters as float32 leaves.
  explicit MasterWeights(nn::Module& model);

  // float32 leaves that require grad, one per model parameter, same order.
  const std::vector<Tensor>& master_params() const { return masters_; }
  // First re-takes any master whose model parameter was written since they last matched
  // and now holds other values than the master rounded (see "Order with DDP" above). Then sets each master's .grad to its model parameter's
  // gradient in float32 (undefined
  // when the model parameter has none) and returns them, for LossScaler::step. The
  // model's gradients are cleared (set to none): they moved to the masters, so the
  // recipe above needs no model->zero_grad() (micro-batches accumulate as usual before
  // this call).
  std::vector<Tensor> copy_grads_to_masters();
  // Writes the masters back into the model's parameters (rounded to their dtype).
  void copy_masters_to_model();
  // Sets the masters from the model's parameters (widened to float32): after the model
  // was loaded from a checkpoint, or changed by hand.
  void copy_model_to_masters();
  // The masters by name ("master_weights.<i>"), for CheckpointTargets::extra_tensors:
  // saving them keeps the bits below half precision, loading writes them in place.
  std::vector<std::pair<std::string, Tensor>> checkpoint_tensors() const;

 private:
  void note_versions();  // the model and the masters agree now

  std::vector<Tensor> model_params_;  // the model's own (half) parameters
  std::vector<Tensor> masters_;       // float32 copies the optimizer updates
  // Version counters of each model parameter and master when they last agreed.
  std::vector<uint64_t> model_versions_, master_versions_;
};

}  // namespace ringtrain::ddp
