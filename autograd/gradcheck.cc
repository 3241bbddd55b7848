// gradcheck.cc: see gradcheck.h. The inputs are perturbed in place one element at
// a time (under no_grad, then restored), so the inputs' storage must be writable;
// any strides do, except stride 0 (an expanded view).
#include "autograd/gradcheck.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>

#include "autograd/autograd.h"
#include "autograd/functions.h"
#include "tensor/ops.h"

namespace ringtrain::autograd {

GradcheckResult gradcheck(const std::function<Tensor(const std::vector<Tensor>&)>& f,
                          const std::vector<Tensor>& inputs, const GradcheckOptions& options) {
  GradcheckResult result;
  // Non-contiguous inputs (a transposed or strided leaf) are checked as they are, each
  // element perturbed where it lives; an expanded input holds several elements at one
  // address, which cannot be moved one at a time.
  for (size_t i = 0; i < inputs.size(); ++i)
    for (int64_t d = 0; inputs[i].defined() && requires_grad(inputs[i]) && d < inputs[i].dim(); ++d)
      RT_CHECK(inputs[i].size(d) <= 1 || inputs[i].stride(d) != 0, "gradcheck: input ", i, " ",
               inputs[i].describe(), " has stride 0 in dim ", d, " (an expanded view): its elements "
               "share memory, so they cannot be perturbed one at a time; pass the unexpanded tensor "
               "and expand it inside f");
  // The projection vector, drawn once from the output's shape.
  Tensor v;
  {
    NoGradGuard no_grad;
    Tensor probe = f(inputs);
    Generator gen(options.seed + 12345);
    v = randn(probe.shape(), gen, probe.dtype(), probe.device());
  }
  auto project = [&](const Tensor& out) { return ringtrain::sum(ringtrain::mul(out, v)).item(); };

  // Analytic: one backward of sum(v * f(x)).
  for (const Tensor& in : inputs)
    if (in.defined() && requires_grad(in)) set_grad(in, Tensor());
  Tensor out = f(inputs);
  RT_CHECK(requires_grad(out), "gradcheck: the output does not require grad (no input requires grad, "
           "or f does not use them)");
  backward(ag::sum(ag::mul(out, v)));

  for (size_t i = 0; i < inputs.size(); ++i) {
    const Tensor& in = inputs[i];
    if (!in.defined() || !requires_grad(in)) continue;
    Tensor analytic = grad(in);
    std::vector<double> analytic_values =
        analytic.defined() ? analytic.to_vector<double>() : std::vector<double>(in.numel(), 0.0);
    // Each element is perturbed where it lives, through a one-element view (checked above).
    const Tensor writable = detach(in);
    for (int64_t j = 0; j < in.numel(); ++j) {
      Tensor element = writable;  // element j in row-major order, as analytic_values has it
      for (int64_t d = in.dim() - 1, rest = j; d >= 0; --d) {
        element = element.narrow(d, rest % in.size(d), 1);
        rest /= in.size(d);
      }
      double original = element.item();
      double plus, minus;
      {
        NoGradGuard no_grad;
        fill_(element, original + options.eps);
        plus = project(f(inputs));
        fill_(element, original - options.eps);
        minus = project(f(inputs));
        fill_(element, original);
      }
      const double numeric = (plus - minus) / (2.0 * options.eps);
      const double analytic = analytic_values[j];
      // A non-finite value passes only against the same infinity (+inf vs +inf): a NaN
      // rule used to pass, as every comparison with NaN is false (err > tol too), and an
      // infinite numeric value made the tolerance inf. `close` tests err <= tol (not
      // !(err > tol)), so any NaN that slips through counts as a failure as well.
      const bool finite = std::isfinite(analytic) && std::isfinite(numeric);
      const bool same_infinity = !finite && analytic == numeric;
      const double err = same_infinity ? 0.0 : std::fabs(analytic - numeric);  // NaN with a NaN
      // std::max drops a NaN in its second argument: keep it, so a NaN shows in the result.
      if (std::isnan(err) || std::isnan(result.max_abs_error)) {
        result.max_abs_error = std::numeric_limits<double>::quiet_NaN();
      } else {
        result.max_abs_error = std::max(result.max_abs_error, err);
      }
      const bool close = same_infinity || (finite && err <= options.atol + options.rtol * std::fabs(numeric));
      if (!close && result.ok) {
        result.ok = false;
        std::ostringstream os;
        os << "gradcheck: input " << i << " (" << in.describe() << ") element " << j
           << ": analytic " << analytic << " vs numeric " << numeric;
        result.message = os.str();
      }
    }
  }
  return result;
}

}  // namespace ringtrain::autograd
