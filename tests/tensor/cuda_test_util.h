// cuda_test_util.h: shared pieces of the CUDA tensor tests (tests/tensor/cuda_*_test.cc).
//
// defines: CudaTest (a fixture whose SetUp skips with cuda::unavailable_reason()
//          when no GPU is usable), kCuda, kFloatTypes, and expect_matches_cpu:
//          the check every CUDA op test makes, "the GPU result equals the CPU
//          result of the same op on the same stored values, within tolerance".
//
// The CUDA tests compare against the CPU kernels rather than the float64
// reference directly: the CPU kernels are themselves tested against the
// reference (tests/tensor/*_test.cc), and "same answer on both devices" is the
// property DDP and checkpoints rely on. The tolerance is twice the dtype's
// default, since both sides round.
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "tensor/cuda/runtime.h"
#include "tensor/kernels.h"
#include "tensor/ops.h"
#include "tests/tensor/reference.h"

namespace ringtrain::cuda_test {

inline const Device kCuda = Device::cuda(0);
inline constexpr DType kFloatTypes[] = {DType::kFloat32, DType::kFloat64, DType::kFloat16,
                                        DType::kBFloat16};

class CudaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cuda::is_available()) GTEST_SKIP() << "no usable GPU: " << cuda::unavailable_reason();
  }
};

// Both sides round once: allow twice the single-rounding tolerance.
inline ref::Tolerance twice(ref::Tolerance t) { return {2 * t.rtol, 2 * t.atol}; }

// `gpu` must be on a CUDA device and match `cpu` (same shape and dtype) within `tol`.
inline ::testing::AssertionResult expect_matches_cpu(const Tensor& gpu, const Tensor& cpu,
                                                     ref::Tolerance tol) {
  if (!gpu.device().is_cuda())
    return ::testing::AssertionFailure() << "result is on " << gpu.device().str() << ", not CUDA";
  if (gpu.dtype() != cpu.dtype())
    return ::testing::AssertionFailure() << "dtype " << dtype_name(gpu.dtype()) << " vs CPU "
                                         << dtype_name(cpu.dtype());
  return ref::expect_close(gpu, ref::to_ref(cpu), tol);
}

inline std::string trace(DType dtype, const Shape& shape, ref::Layout layout) {
  return std::string(dtype_name(dtype)) + shape_str(shape) + " " + ref::layout_name(layout);
}

}  // namespace ringtrain::cuda_test
