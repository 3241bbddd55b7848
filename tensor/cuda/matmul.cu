// matmul.cu: batched matrix multiply on cuBLAS.
//
// defines: kernels::cuda::batched_matmul (declared in tensor/kernels.h), and the
//          per-thread, per-device cuBLAS handle cache (CublasHandle).
//
// Row-major meets column-major. cuBLAS thinks in column-major matrices; our
// tensors are row-major. A row-major [m, n] matrix is, byte for byte, the
// column-major [n, m] matrix of its transpose, so instead of out = a @ b we ask
// cuBLAS for out^T = b^T @ a^T, which it reads and writes in place with no
// copies: the "A" operand of the call is b, the "B" operand is a, and the
// output's leading dimension is n.
//
// Strided operands. Each operand [B, r, c] is looked at once:
//   * rows contiguous (stride of c == 1, rows spaced >= c apart): plain, op N,
//     leading dimension = row stride (a narrowed or padded matrix costs nothing);
//   * columns contiguous (stride of r == 1): it is a transposed view (x.t() of a
//     contiguous tensor, the weight in linear()), op T, leading dim = col stride;
//   * anything else (a permute that mixes batch and matrix dims, a broadcast
//     column): copied to contiguous first.
// Batch strides go to cublasGemmStridedBatchedEx as they are; a broadcast batch
// (stride 0) is allowed there.
//
// Precision. float16/bfloat16 run on tensor cores with float32 accumulation
// (CUBLAS_COMPUTE_32F, alpha/beta in float), which is what ops.h promises.
// float32 uses CUBLAS_COMPUTE_32F with the default math mode, i.e. no TF32:
// results match the CPU to float32 rounding (TF32 would be faster on A100/H100
// but is a deliberate opt-in nobody has asked for yet). float64 uses
// CUBLAS_COMPUTE_64F.
//
// Handles and workspace. cublasCreate is slow and a handle must not be used by
// two threads at once, so each host thread keeps one handle per device
// (thread_local, destroyed when the thread exits). Every call binds the handle
// to the current stream and gives it a 32 MiB workspace from the caching
// allocator (one per thread, device and stream), so cuBLAS never calls
// cudaMalloc behind the allocator's back during training.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <climits>
#include <map>
#include <utility>
#include <unordered_map>

#include "tensor/cuda/internal.cuh"
#include "tensor/cuda/kernel_utils.cuh"
#include "tensor/kernels.h"

namespace ringtrain::kernels::cuda {

namespace {

using ringtrain::cuda::detail::check_same_device;
using ringtrain::cuda::detail::cuda_device_of;
using ringtrain::cuda::detail::DeviceGuard;
using ringtrain::cuda::detail::raw_stream;
using ringtrain::cuda::detail::require_cuda;

constexpr size_t kCublasWorkspaceBytes = size_t{32} << 20;

// Owns one cublasHandle_t, destroyed with it.
class CublasHandle {
 public:
  explicit CublasHandle(int device) {
    DeviceGuard guard(device);
    CUBLAS_CHECK(cublasCreate(&handle_));
  }
  ~CublasHandle() {
    if (handle_ != nullptr) (void)cublasDestroy(handle_);
  }
  // Neither copyable nor movable: it lives in place in the per-thread map.
  CublasHandle(const CublasHandle&) = delete;
  CublasHandle& operator=(const CublasHandle&) = delete;
  CublasHandle(CublasHandle&&) = delete;
  CublasHandle& operator=(CublasHandle&&) = delete;
  cublasHandle_t get() const { return handle_; }

 private:
  cublasHandle_t handle_ = nullptr;
};

// This thread's handle for `device`, bound to `stream` with a cached workspace.
cublasHandle_t cublas_for(int device, cudaStream_t stream) {
  // A handle points at its workspace only while a call runs, so the order in
  // which these two are destroyed at thread exit does not matter.
  thread_local std::unordered_map<int, CublasHandle> handles;
  thread_local std::map<std::pair<int, cudaStream_t>, DataPtr> workspaces;
  auto it = handles.find(device);
  if (it == handles.end()) it = handles.try_emplace(device, device).first;
  cublasHandle_t handle = it->second.get();
  CUBLAS_CHECK(cublasSetStream(handle, stream));  // also resets the workspace to cuBLAS's own
  auto key = std::make_pair(device, stream);
  auto ws = workspaces.find(key);
  if (ws == workspaces.end())
    ws = workspaces.emplace(key, ringtrain::cuda::caching_allocate(kCublasWorkspaceBytes, device))
             .first;
  CUBLAS_CHECK(cublasSetWorkspace(handle, ws->second.get(), kCublasWorkspaceBytes));
  return handle;
}

// How one [B, rows, cols] operand is handed to cuBLAS (see the note at the top).
struct GemmOperand {
  Tensor tensor;          // the tensor actually read (a contiguous copy when needed)
  bool transposed = false;  // memory holds the matrix column by column
  int64_t ld = 0;
  int64_t batch_stride = 0;
};

GemmOperand describe_operand(const Tensor& x) {
  int64_t rows = x.shape()[1], cols = x.shape()[2];
  int64_t s_rows = x.strides()[1], s_cols = x.strides()[2];
  GemmOperand op;
  op.tensor = x;
  if ((cols == 1 || s_cols == 1) && (rows == 1 || s_rows >= cols)) {
    op.ld = rows == 1 ? cols : s_rows;
  } else if ((rows == 1 || s_rows == 1) && (cols == 1 || s_cols >= rows)) {
    op.transposed = true;
    op.ld = cols == 1 ? rows : s_cols;
  } else {
    op.tensor = x.contiguous();
    op.ld = cols;
  }
  op.ld = std::max<int64_t>(op.ld, 1);
  op.batch_stride = x.shape()[0] == 1 ? 0 : op.tensor.strides()[0];
  return op;
}

int to_int(int64_t v, const char* what, const Tensor& a, const Tensor& b) {
  RT_CHECK(v >= 0 && v <= INT_MAX, "cuda::batched_matmul: ", what, " = ", v,
           " exceeds cuBLAS's 32-bit limit for a ", a.describe(), " @ ", b.describe());
  return static_cast<int>(v);
}

}  // namespace

void batched_matmul(const Tensor& a, const Tensor& b, const Tensor& out) {
  constexpr const char* kOp = "cuda::batched_matmul";
  int device = cuda_device_of(out, kOp);
  check_same_device(kOp, device, a, b);
  RT_CHECK(a.dim() == 3 && b.dim() == 3 && out.dim() == 3 && a.shape()[0] == b.shape()[0] &&
               a.shape()[2] == b.shape()[1] && out.shape()[0] == a.shape()[0] &&
               out.shape()[1] == a.shape()[1] && out.shape()[2] == b.shape()[2],
           kOp, ": expected a [B,m,k], b [B,k,n], out [B,m,n]; got a ", a.describe(), ", b ",
           b.describe(), ", out ", out.describe());
  RT_CHECK(a.dtype() == b.dtype() && a.dtype() == out.dtype(), kOp, ": dtypes differ: a ",
           a.describe(), ", b ", b.describe(), ", out ", out.describe());
  RT_CHECK(out.is_contiguous(), kOp, ": out ", out.describe(), " must be contiguous");
  int64_t batch = a.shape()[0], m = a.shape()[1], k = a.shape()[2], n = b.shape()[2];
  if (batch == 0 || m == 0 || n == 0) return;
  require_cuda(kOp, device);
  if (k == 0) {  // an empty sum: zeros
    fill(out, 0.0);
    return;
  }
  cudaDataType_t data_type;
  cublasComputeType_t compute_type;
  switch (a.dtype()) {
    case DType::kFloat32: data_type = CUDA_R_32F; compute_type = CUBLAS_COMPUTE_32F; break;
    case DType::kFloat64: data_type = CUDA_R_64F; compute_type = CUBLAS_COMPUTE_64F; break;
    case DType::kFloat16: data_type = CUDA_R_16F; compute_type = CUBLAS_COMPUTE_32F; break;
    case DType::kBFloat16: data_type = CUDA_R_16BF; compute_type = CUBLAS_COMPUTE_32F; break;
    default:
      throw Error(::ringtrain::detail::concat(
          kOp, ": cuBLAS matmul supports float32/float64/float16/bfloat16, got ", a.describe()));
  }
  GemmOperand op_a = describe_operand(a);
  GemmOperand op_b = describe_operand(b);
  DeviceGuard guard(device);
  cublasHandle_t handle = cublas_for(device, raw_stream(device));
  // out^T [n, m] = b^T [n, k] @ a^T [k, m], all column-major.
  float alpha_f = 1.0f, beta_f = 0.0f;
  double alpha_d = 1.0, beta_d = 0.0;
  bool f64 = compute_type == CUBLAS_COMPUTE_64F;
  CUBLAS_CHECK(cublasGemmStridedBatchedEx(
      handle, op_b.transposed ? CUBLAS_OP_T : CUBLAS_OP_N,
      op_a.transposed ? CUBLAS_OP_T : CUBLAS_OP_N, to_int(n, "n", a, b), to_int(m, "m", a, b),
      to_int(k, "k", a, b), f64 ? static_cast<const void*>(&alpha_d) : &alpha_f,
      op_b.tensor.data_ptr(), data_type, to_int(op_b.ld, "ld(b)", a, b), op_b.batch_stride,
      op_a.tensor.data_ptr(), data_type, to_int(op_a.ld, "ld(a)", a, b), op_a.batch_stride,
      f64 ? static_cast<const void*>(&beta_d) : &beta_f, out.data_ptr(), data_type,
      to_int(n, "n", a, b), m * n, to_int(batch, "batch", a, b), compute_type,
      CUBLAS_GEMM_DEFAULT));
}

}  // namespace ringtrain::kernels::cuda
