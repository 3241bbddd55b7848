// gradcheck.h: compares autograd's gradients with central finite differences.
//
// defines: GradcheckOptions, GradcheckResult, gradcheck().
//
// Where it sits: tests (tests/autograd, tests/nn) run it over every op and layer.
// It checks a vector-Jacobian product: with a fixed random v (seeded), the
// analytic gradient of s(x) = sum(v * f(x)) from backward() is compared, element
// by element for every input that requires grad, with the numerical derivative
// (s(x + eps e_i) - s(x - eps e_i)) / (2 eps). Inputs should be float64 (the
// finite differences are only meaningful there); f must be deterministic. An input
// may be non-contiguous (a transposed or strided leaf: its .grad is checked too),
// but not expanded (stride 0: one address for several elements; throws).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "tensor/tensor.h"

namespace ringtrain::autograd {

struct GradcheckOptions {
  double eps = 1e-6;   // finite-difference step
  double atol = 1e-5;  // |analytic - numeric| <= atol + rtol * |numeric|, both finite
                       // (or the same infinity); NaN or inf against anything else fails
  double rtol = 1e-3;
  uint64_t seed = 0;   // for the projection vector v
};

struct GradcheckResult {
  bool ok = true;             // every element within tolerance
  double max_abs_error = 0;   // over all checked elements; NaN if any error is NaN
  std::string message;        // first failure: input, element, analytic, numeric
};

// `f` maps the inputs to one output tensor (any shape). Inputs that require grad
// are checked; the others are held fixed. Never throws for a mismatch (see
// result.ok/message); errors inside f or backward propagate.
GradcheckResult gradcheck(const std::function<Tensor(const std::vector<Tensor>&)>& f,
                          const std::vector<Tensor>& inputs, const GradcheckOptions& options = {});

}  // namespace ringtrain::autograd
