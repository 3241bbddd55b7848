// autocast.cc: the thread-local autocast state (see autocast.h).
#include "autograd/autocast.h"

#include "tensor/checks.h"

namespace ringtrain::autograd {

namespace {
thread_local bool t_enabled = false;
thread_local DType t_dtype = DType::kFloat16;
}  // namespace

bool autocast_enabled() { return t_enabled; }
DType autocast_dtype() { return t_dtype; }

AutocastGuard::AutocastGuard(DType dtype, bool enabled) : previous_enabled_(t_enabled), previous_dtype_(t_dtype) {
  RT_CHECK(is_reduced_precision_float(dtype), "AutocastGuard: dtype must be float16 or "
           "bfloat16, got ", dtype_name(dtype));
  t_enabled = enabled;
  t_dtype = dtype;
}
AutocastGuard::~AutocastGuard() {
  t_enabled = previous_enabled_;
  t_dtype = previous_dtype_;
}

AutocastSuspend::AutocastSuspend() : previous_(t_enabled) { t_enabled = false; }
AutocastSuspend::~AutocastSuspend() { t_enabled = previous_; }

}  // namespace ringtrain::autograd
