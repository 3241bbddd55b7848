// autocast.h: automatic mixed precision ("O1"), as torch.autocast does it.
//
// defines: AutocastGuard, autocast_enabled, autocast_dtype, AutocastSuspend.
//
// Inside an AutocastGuard(kFloat16) or (kBFloat16) scope on this thread, the
// ops that gain most from half precision and lose least (matmul, linear,
// conv2d: tensor-core GEMMs on a GPU) cast their floating-point inputs to the
// autocast dtype and return a half-precision result, while the ops that need
// range or precision (softmax, log_softmax, cross_entropy, mse_loss, layer_norm,
// batch_norm, and sum, exp, log, pow: a user's loss over a half GEMM output) cast
// their inputs up to float32. Elementwise binary ops (add, sub,
// mul, div, maximum, minimum, where) and cat/stack given mixed floating dtypes (a
// half GEMM output and a float32 residual) compute in the widest one, as PyTorch's
// type promotion does; outside autocast ringtrain's ops never promote. float64
// tensors are never cast down. The weights stay float32: the casts are ordinary
// differentiable ops, so their gradients flow back into the float32 weights in
// float32. Everything else runs in whatever dtype it receives.
//
// Combine with ddp::LossScaler for float16 (its gradients underflow without
// scaling); bfloat16 has float32's range and usually needs no scaler.
#pragma once

#include "tensor/dtype.h"

namespace ringtrain::autograd {

bool autocast_enabled();
DType autocast_dtype();  // meaningful when autocast_enabled()

// Turns autocast on (to kFloat16 or kBFloat16) for a scope on this thread.
class AutocastGuard {
 public:
  explicit AutocastGuard(DType dtype, bool enabled = true);
  ~AutocastGuard();
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  bool previous_enabled_;
  DType previous_dtype_;
};

// Turns autocast off for a scope (used by the ops themselves after casting, so the
// inner call does not cast again).
class AutocastSuspend {
 public:
  AutocastSuspend();
  ~AutocastSuspend();
  AutocastSuspend(const AutocastSuspend&) = delete;
  AutocastSuspend& operator=(const AutocastSuspend&) = delete;

 private:
  bool previous_;
};

}  // namespace ringtrain::autograd
