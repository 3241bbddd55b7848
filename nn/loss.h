// loss.h: the losses as small callable objects (and the functional forms).
//
// defines: CrossEntropyLoss (ignore_index, label_smoothing), MSELoss,
//          cross_entropy(), mse_loss().
//
// Where it sits: the last op of the forward; its scalar output is what
// autograd::backward() starts from. Both reduce by the mean, like PyTorch's
// default reduction="mean" (cross-entropy averages over non-ignored targets).
// The derivative rules are in autograd/functions.cc (ag::cross_entropy, ag::mse_loss).
#pragma once

#include <cstdint>

#include "autograd/functions.h"

namespace ringtrain::nn {

// Call these qualified (nn::cross_entropy): ringtrain::cross_entropy (the plain,
// non-recording op in tensor/ops.h) has the same signature and is found by
// argument-dependent lookup, so an unqualified call is ambiguous.
inline Tensor cross_entropy(const Tensor& logits, const Tensor& targets, int64_t ignore_index = -100,
                            double label_smoothing = 0.0) {
  return ag::cross_entropy(logits, targets, ignore_index, label_smoothing);
}
inline Tensor mse_loss(const Tensor& input, const Tensor& target) { return ag::mse_loss(input, target); }

struct CrossEntropyLoss {
  int64_t ignore_index = -100;   // targets equal to this contribute nothing
  double label_smoothing = 0.0;  // in [0, 1]
  // logits [N, C] (float), targets [N] (int64 class indices) -> scalar mean loss.
  Tensor operator()(const Tensor& logits, const Tensor& targets) const {
    return ag::cross_entropy(logits, targets, ignore_index, label_smoothing);
  }
};

struct MSELoss {
  Tensor operator()(const Tensor& input, const Tensor& target) const { return ag::mse_loss(input, target); }
};

}  // namespace ringtrain::nn
