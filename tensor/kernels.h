// kernels.h: the small set of device kernels every op in ops.cc is built from.
//
// defines: UnaryOp, BinaryOp, ReduceOp and, for each device, the same kernel
//          functions: cpu::* (tensor/cpu/*.cc, Eigen) and cuda::* (tensor/cuda/*.cu,
//          cuBLAS/cuDNN/own kernels; tensor/cuda/cuda_unavailable.cc when the
//          build has no CUDA, where every entry throws a clear error).
//
// Contract: ops.cc has already checked shapes, dtypes and devices, allocated the
// outputs (always contiguous) and broadcast the inputs to the output shape with
// Tensor::expand (so inputs may have 0 strides and arbitrary strides/offsets).
// Kernels only compute. Kernels never allocate outputs the caller sees; CUDA
// kernels run on the current stream of the output's device.
#pragma once

#include <cstdint>
#include <vector>

#include "tensor/ops.h"
#include "tensor/tensor.h"

namespace ringtrain::kernels {

enum class UnaryOp { kNeg, kExp, kLog, kSqrt, kAbs, kRelu, kGelu, kGeluGrad, kTanh, kSigmoid, kIsFinite };
enum class BinaryOp { kAdd, kSub, kMul, kDiv, kPow, kMax, kMin, kEq, kNe, kLt, kLe, kGt, kGe };
enum class ReduceOp { kSum, kMax, kMin };

const char* unary_op_name(UnaryOp op);
const char* binary_op_name(BinaryOp op);

#define RINGTRAIN_DECLARE_KERNELS                                                                  \
  /* dst = src elementwise, same shape, any strides, any dtypes (converting). */                   \
  void copy(const Tensor& dst, const Tensor& src);                                                 \
  void fill(const Tensor& dst, double value);                                                      \
  /* out (contiguous) = op(in); in has out's shape. */                                             \
  void unary(UnaryOp op, const Tensor& in, const Tensor& out);                                     \
  /* out = op(a, b); a and b expanded to out's shape. */                                           \
  void binary(BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& out);                   \
  /* out = op(a, scalar). */                                                                       \
  void binary_scalar(BinaryOp op, const Tensor& a, double scalar, const Tensor& out);              \
  /* out = cond != 0 ? a : b; all expanded to out's shape. */                                      \
  void where(const Tensor& cond, const Tensor& a, const Tensor& b, const Tensor& out);             \
  /* y += alpha * x in place; x expanded to y's shape (the optimizers' update). */                \
  void axpy(double alpha, const Tensor& x, const Tensor& y);                                      \
  /* Reduces `in` over the dims where reduce_mask[d] is true; out has in's rank with those dims    \
     of size 1 (keepdim layout). */                                                                \
  void reduce(ReduceOp op, const Tensor& in, const std::vector<bool>& reduce_mask,                 \
              const Tensor& out);                                                                  \
  /* values/indices [outer, inner] from in viewed as [outer, n, inner] (contiguous in). */          \
  void max_along(const Tensor& in, int64_t dim, const Tensor& values, const Tensor& indices);       \
  /* out[b] = a[b] @ b[b]; a [B,m,k], b [B,k,n] (any strides), out [B,m,n] contiguous. */          \
  void batched_matmul(const Tensor& a, const Tensor& b, const Tensor& out);                        \
  void conv2d(const Tensor& input, const Tensor& weight, const Tensor& bias,                       \
              const Conv2dParams& p, const Tensor& out);                                           \
  void conv2d_backward_input(const Tensor& grad_out, const Tensor& weight, const Conv2dParams& p,  \
                             const Tensor& grad_input);                                            \
  void conv2d_backward_weight(const Tensor& grad_out, const Tensor& input, const Conv2dParams& p,  \
                              const Tensor& grad_weight);                                          \
  void max_pool2d(const Tensor& input, const Pool2dParams& p, const Tensor& out,                   \
                  const Tensor& indices);                                                          \
  void max_pool2d_backward(const Tensor& grad_out, const Tensor& indices, const Tensor& grad_input);\
  void avg_pool2d(const Tensor& input, const Pool2dParams& p, const Tensor& out);                  \
  void avg_pool2d_backward(const Tensor& grad_out, const Pool2dParams& p, const Tensor& grad_input);\
  /* in/out contiguous, viewed as [outer, n, inner]; log selects log_softmax. */                   \
  void softmax(const Tensor& in, int64_t dim, bool log, const Tensor& out);                        \
  void softmax_backward(const Tensor& grad_out, const Tensor& output, int64_t dim, bool log,        \
                        const Tensor& grad_in);                                                    \
  void gather(const Tensor& a, int64_t dim, const Tensor& index, const Tensor& out);                \
  void index_select(const Tensor& a, int64_t dim, const Tensor& index, const Tensor& out);         \
  void index_add(const Tensor& a, int64_t dim, const Tensor& index, const Tensor& src);            \
  /* true when no element is inf/NaN. */                                                           \
  bool all_finite(const Tensor& a);                                                                \
  /* Copies between host and device memory (either side may be CPU); contiguous, same bytes. */     \
  void memcpy_bytes(void* dst, Device dst_device, const void* src, Device src_device, size_t n);

namespace cpu {
RINGTRAIN_DECLARE_KERNELS
// The f32 GEMM's micro-kernel: "avx512 8x32" or "avx2 6x16" (tensor/cpu/matmul.cc; the widest
// the build targets unless RINGTRAIN_CPU_GEMM=avx2 asks for the narrower), or "eigen".
const char* sgemm_kernel_name();
}
namespace cuda {
RINGTRAIN_DECLARE_KERNELS
// True when this build has CUDA and a usable GPU (any failure of the runtime -> false).
bool is_available();
int device_count();
}  // namespace cuda

#undef RINGTRAIN_DECLARE_KERNELS

}  // namespace ringtrain::kernels
