// conv_pool.cu: 2-D convolution on cuDNN, and max/avg pooling kernels.
//
// defines: kernels::cuda::conv2d, conv2d_backward_input, conv2d_backward_weight,
//          max_pool2d, max_pool2d_backward, avg_pool2d, avg_pool2d_backward
//          (declared in tensor/kernels.h); CudnnHandle and the RAII descriptor
//          wrappers (CudnnDescriptor<...>).
//
// Convolution. All three directions are cuDNN's legacy convolution API
// (cudnnConvolutionForward / BackwardData / BackwardFilter), which cuDNN 9 still
// ships and supports. Per call we describe the operands (NCHW tensors, an NCHW
// filter, a cross-correlation descriptor with pads, strides, dilations and the
// group count), pick an algorithm, and run it with a workspace taken from the
// caching allocator (so the workspace is reused, stream-ordered, and never a
// cudaMalloc after warm-up). The algorithm is cuDNN's own heuristic choice
// (cudnnGet*Algorithm_v7: the first candidate that is supported and whose
// workspace size can be queried), remembered per (direction, dtype, shapes,
// params) so the heuristic runs once per layer shape, not once per step.
// Precision mirrors matmul.cu: float16/bfloat16 use tensor cores and float
// accumulation; float32 is restricted to CUDNN_FMA_MATH (no TF32), float64 runs
// in double. The bias is added by a small kernel of our own after the
// convolution (out[n, o, :, :] += bias[o]).
//
// Pooling is our own kernels, not cuDNN's: the kernel contract hands the max
// pool's backward only (grad_out, argmax indices) and the avg pool's backward
// only (grad_out, params), while cudnnPoolingBackward needs the forward's x and
// y too. The kernels are simple and deterministic where it is cheap:
//   max_pool2d: one thread per output, first maximum wins, NaN propagates, the
//     index is h * W + w within the input plane (what the CPU kernel records);
//   max_pool2d_backward: grad_input is zeroed, then each output adds its grad
//     to its argmax with atomicAdd (windows may overlap);
//   avg_pool2d: padding counts as zeros, the divisor is always kh * kw
//     (count_include_pad = true);
//   avg_pool2d_backward: one thread per input element gathers from the outputs
//     whose windows cover it: no atomics, deterministic.
//
// Handles. One cudnnHandle_t per host thread and device (thread_local, created
// on first use, destroyed at thread exit), bound to the current stream per call.
#include <cuda_runtime.h>
#include <cudnn.h>

#include <climits>
#include <mutex>
#include <sstream>
#include <string>
#include <unordered_map>

#include "tensor/cuda/internal.cuh"
#include "tensor/cuda/kernel_utils.cuh"
#include "tensor/kernels.h"

namespace ringtrain::kernels::cuda {

namespace {

using ringtrain::cuda::detail::AccType;
using ringtrain::cuda::detail::check_launch;
using ringtrain::cuda::detail::check_same_device;
using ringtrain::cuda::detail::convert;
using ringtrain::cuda::detail::cuda_device_of;
using ringtrain::cuda::detail::DeviceGuard;
using ringtrain::cuda::detail::dispatch_float_dtype;
using ringtrain::cuda::detail::grid_for;
using ringtrain::cuda::detail::is_nan;
using ringtrain::cuda::detail::kThreads;
using ringtrain::cuda::detail::raw_stream;
using ringtrain::cuda::detail::require_cuda;

// ---------------------------------------------------------------- RAII for cuDNN

// Owns one cudnnHandle_t. Lives in place in the per-thread map: not copyable or movable.
class CudnnHandle {
 public:
  explicit CudnnHandle(int device) {
    DeviceGuard guard(device);
    CUDNN_CHECK(cudnnCreate(&handle_));
  }
  ~CudnnHandle() {
    if (handle_ != nullptr) (void)cudnnDestroy(handle_);
  }
  CudnnHandle(const CudnnHandle&) = delete;
  CudnnHandle& operator=(const CudnnHandle&) = delete;
  CudnnHandle(CudnnHandle&&) = delete;
  CudnnHandle& operator=(CudnnHandle&&) = delete;
  cudnnHandle_t get() const { return handle_; }

 private:
  cudnnHandle_t handle_ = nullptr;
};

cudnnHandle_t cudnn_for(int device, cudaStream_t stream) {
  thread_local std::unordered_map<int, CudnnHandle> handles;
  auto it = handles.find(device);
  if (it == handles.end()) it = handles.try_emplace(device, device).first;
  CUDNN_CHECK(cudnnSetStream(it->second.get(), stream));
  return it->second.get();
}

// One descriptor of type T, created by Create and destroyed by Destroy. Scoped
// to one call: not copyable or movable.
template <typename T, cudnnStatus_t (*Create)(T*), cudnnStatus_t (*Destroy)(T)>
class CudnnDescriptor {
 public:
  CudnnDescriptor() { CUDNN_CHECK(Create(&desc_)); }
  ~CudnnDescriptor() { (void)Destroy(desc_); }
  CudnnDescriptor(const CudnnDescriptor&) = delete;
  CudnnDescriptor& operator=(const CudnnDescriptor&) = delete;
  CudnnDescriptor(CudnnDescriptor&&) = delete;
  CudnnDescriptor& operator=(CudnnDescriptor&&) = delete;
  T get() const { return desc_; }

 private:
  T desc_ = nullptr;
};

using TensorDescriptor = CudnnDescriptor<cudnnTensorDescriptor_t, cudnnCreateTensorDescriptor,
                                         cudnnDestroyTensorDescriptor>;
using FilterDescriptor = CudnnDescriptor<cudnnFilterDescriptor_t, cudnnCreateFilterDescriptor,
                                         cudnnDestroyFilterDescriptor>;
using ConvolutionDescriptor =
    CudnnDescriptor<cudnnConvolutionDescriptor_t, cudnnCreateConvolutionDescriptor,
                    cudnnDestroyConvolutionDescriptor>;

int to_int(int64_t v, const char* op) {
  RT_CHECK(v >= 0 && v <= INT_MAX, op, ": size ", v, " exceeds cuDNN's 32-bit limit");
  return static_cast<int>(v);
}

cudnnDataType_t cudnn_dtype(DType dtype, const char* op) {
  switch (dtype) {
    case DType::kFloat32: return CUDNN_DATA_FLOAT;
    case DType::kFloat64: return CUDNN_DATA_DOUBLE;
    case DType::kFloat16: return CUDNN_DATA_HALF;
    case DType::kBFloat16: return CUDNN_DATA_BFLOAT16;
    default: break;
  }
  throw Error(::ringtrain::detail::concat(
      op, ": cuDNN convolution supports float32/float64/float16/bfloat16, got ", dtype_name(dtype)));
}

// Everything one convolution call describes to cuDNN.
struct ConvDescriptors {
  TensorDescriptor x;      // input  [N, C, H, W]
  FilterDescriptor w;      // weight [O, C/groups, kh, kw]
  TensorDescriptor y;      // output [N, O, Ho, Wo]
  ConvolutionDescriptor conv;
  DType dtype = DType::kFloat32;
  std::string key;         // identifies the problem for the algorithm cache

  ConvDescriptors(const Shape& x_shape, const Shape& w_shape, const Shape& y_shape, DType dt,
                  const Conv2dParams& p, const char* op)
      : dtype(dt) {
    cudnnDataType_t data = cudnn_dtype(dt, op);
    CUDNN_CHECK(cudnnSetTensor4dDescriptor(x.get(), CUDNN_TENSOR_NCHW, data, to_int(x_shape[0], op),
                                           to_int(x_shape[1], op), to_int(x_shape[2], op),
                                           to_int(x_shape[3], op)));
    CUDNN_CHECK(cudnnSetFilter4dDescriptor(w.get(), data, CUDNN_TENSOR_NCHW, to_int(w_shape[0], op),
                                           to_int(w_shape[1], op), to_int(w_shape[2], op),
                                           to_int(w_shape[3], op)));
    CUDNN_CHECK(cudnnSetTensor4dDescriptor(y.get(), CUDNN_TENSOR_NCHW, data, to_int(y_shape[0], op),
                                           to_int(y_shape[1], op), to_int(y_shape[2], op),
                                           to_int(y_shape[3], op)));
    cudnnDataType_t compute = dt == DType::kFloat64 ? CUDNN_DATA_DOUBLE : CUDNN_DATA_FLOAT;
    CUDNN_CHECK(cudnnSetConvolution2dDescriptor(
        conv.get(), to_int(p.pad_h, op), to_int(p.pad_w, op), to_int(p.stride_h, op),
        to_int(p.stride_w, op), to_int(p.dilation_h, op), to_int(p.dilation_w, op),
        CUDNN_CROSS_CORRELATION, compute));
    CUDNN_CHECK(cudnnSetConvolutionGroupCount(conv.get(), to_int(p.groups, op)));
    CUDNN_CHECK(cudnnSetConvolutionMathType(conv.get(), default_math()));
    std::ostringstream os;
    os << dtype_name(dt) << shape_str(x_shape) << shape_str(w_shape) << shape_str(y_shape) << ' '
       << p.stride_h << ',' << p.stride_w << ',' << p.pad_h << ',' << p.pad_w << ','
       << p.dilation_h << ',' << p.dilation_w << ',' << p.groups;
    key = os.str();
  }

  cudnnMathType_t default_math() const {
    if (is_reduced_precision_float(dtype)) return CUDNN_TENSOR_OP_MATH;
    if (dtype == DType::kFloat32) return CUDNN_FMA_MATH;  // no TF32: match the CPU
    return CUDNN_DEFAULT_MATH;
  }
  // float32 must not run on TF32 tensor cores; other dtypes take what cuDNN suggests.
  bool math_allowed(cudnnMathType_t math) const {
    return dtype != DType::kFloat32 || math == CUDNN_FMA_MATH || math == CUDNN_DEFAULT_MATH;
  }
  // alpha = 1, beta = 0 in the type cuDNN reads for this dtype.
  const void* one() const { return dtype == DType::kFloat64 ? static_cast<const void*>(&one_d_) : &one_f_; }
  const void* zero() const { return dtype == DType::kFloat64 ? static_cast<const void*>(&zero_d_) : &zero_f_; }

 private:
  float one_f_ = 1.0f, zero_f_ = 0.0f;
  double one_d_ = 1.0, zero_d_ = 0.0;
};

// The chosen algorithm for one problem (algo is the direction's enum, stored as int).
struct AlgoChoice {
  int algo = 0;
  cudnnMathType_t math = CUDNN_DEFAULT_MATH;
  size_t workspace = 0;
};

// Heuristic algorithm choice, cached per (direction, device, problem key).
// get_candidates(perfs, &count) fills cuDNN's ranked list; workspace_of(algo, &bytes) sizes one.
template <typename Perf, int kMaxAlgos, typename GetCandidates, typename WorkspaceOf>
AlgoChoice choose_algorithm(const char* direction, int device, ConvDescriptors& d,
                            GetCandidates get_candidates, WorkspaceOf workspace_of) {
  static std::mutex mutex;
  static std::unordered_map<std::string, AlgoChoice> cache;
  std::string key = std::string(direction) + " cuda:" + std::to_string(device) + ' ' + d.key;
  {
    std::lock_guard<std::mutex> lock(mutex);
    auto it = cache.find(key);
    if (it != cache.end()) return it->second;
  }
  Perf perfs[kMaxAlgos];
  int count = 0;
  CUDNN_CHECK(get_candidates(perfs, &count));
  for (int i = 0; i < count; ++i) {
    if (perfs[i].status != CUDNN_STATUS_SUCCESS || !d.math_allowed(perfs[i].mathType)) continue;
    cudnnMathType_t math = d.dtype == DType::kFloat32 ? CUDNN_FMA_MATH : perfs[i].mathType;
    if (cudnnSetConvolutionMathType(d.conv.get(), math) != CUDNN_STATUS_SUCCESS) continue;
    size_t bytes = 0;
    if (workspace_of(perfs[i].algo, &bytes) != CUDNN_STATUS_SUCCESS) continue;
    AlgoChoice choice{static_cast<int>(perfs[i].algo), math, bytes};
    std::lock_guard<std::mutex> lock(mutex);
    cache.emplace(key, choice);
    return choice;
  }
  throw Error(::ringtrain::detail::concat("cuDNN found no usable ", direction,
                                          " convolution algorithm for ", d.key));
}

template <typename T>
__global__ void add_bias_kernel(T* out, const T* bias, int64_t channels, int64_t plane,
                                int64_t n) {
  using A = AccType<T>;
  RT_GRID_STRIDE_LOOP(i, n) {
    int64_t c = (i / plane) % channels;
    out[i] = convert<T>(convert<A>(out[i]) + convert<A>(bias[c]));
  }
}

void check_conv_operand(const Tensor& t, const char* what, const char* op) {
  RT_CHECK(t.dim() == 4, op, ": ", what, " must be 4-D, got ", t.describe());
}

// ---------------------------------------------------------------- pooling kernels

template <typename T>
__global__ void max_pool_kernel(const T* in, int64_t H, int64_t W, int64_t Ho, int64_t Wo,
                                Pool2dParams p, T* out, int64_t* indices, int64_t n) {
  using A = AccType<T>;
  RT_GRID_STRIDE_LOOP(i, n) {
    int64_t ow = i % Wo;
    int64_t oh = (i / Wo) % Ho;
    int64_t plane = i / (Wo * Ho);
    const T* src = in + plane * H * W;
    int64_t h0 = oh * p.stride_h - p.pad_h, w0 = ow * p.stride_w - p.pad_w;
    A best = 0;
    int64_t best_i = -1;
    for (int64_t kh = 0; kh < p.kernel_h; ++kh) {
      int64_t h = h0 + kh;
      if (h < 0 || h >= H) continue;
      for (int64_t kw = 0; kw < p.kernel_w; ++kw) {
        int64_t w = w0 + kw;
        if (w < 0 || w >= W) continue;
        A v = convert<A>(src[h * W + w]);
        if (best_i < 0 || (!is_nan(best) && (is_nan(v) || v > best))) {
          best = v;
          best_i = h * W + w;
        }
      }
    }
    // A window entirely in the padding has no element; it yields -inf and index 0... such a
    // window cannot occur when pad <= kernel / 2, which ops.cc enforces like PyTorch.
    out[i] = best_i < 0 ? convert<T>(-INFINITY) : convert<T>(best);
    indices[i] = best_i < 0 ? 0 : best_i;
  }
}

template <typename T>
__global__ void max_pool_backward_kernel(const T* grad_out, const int64_t* indices,
                                         int64_t out_plane, int64_t in_plane, T* grad_in,
                                         int64_t n) {
  RT_GRID_STRIDE_LOOP(i, n) {
    int64_t plane = i / out_plane;
    int64_t k = indices[i];
    if (k < 0 || k >= in_plane) continue;  // as the CPU kernel: a bad index adds nothing
    atomicAdd(grad_in + plane * in_plane + k, grad_out[i]);
  }
}

template <typename T>
__global__ void avg_pool_kernel(const T* in, int64_t H, int64_t W, int64_t Ho, int64_t Wo,
                                Pool2dParams p, T* out, int64_t n) {
  using A = AccType<T>;
  RT_GRID_STRIDE_LOOP(i, n) {
    int64_t ow = i % Wo;
    int64_t oh = (i / Wo) % Ho;
    int64_t plane = i / (Wo * Ho);
    const T* src = in + plane * H * W;
    int64_t h0 = oh * p.stride_h - p.pad_h, w0 = ow * p.stride_w - p.pad_w;
    A sum = 0;
    for (int64_t kh = 0; kh < p.kernel_h; ++kh) {
      int64_t h = h0 + kh;
      if (h < 0 || h >= H) continue;
      for (int64_t kw = 0; kw < p.kernel_w; ++kw) {
        int64_t w = w0 + kw;
        if (w >= 0 && w < W) sum += convert<A>(src[h * W + w]);
      }
    }
    out[i] = convert<T>(sum / static_cast<A>(p.kernel_h * p.kernel_w));
  }
}

// One thread per input element: sums grad_out over the windows that contain it.
template <typename T>
__global__ void avg_pool_backward_kernel(const T* grad_out, int64_t H, int64_t W, int64_t Ho,
                                         int64_t Wo, Pool2dParams p, T* grad_in, int64_t n) {
  using A = AccType<T>;
  RT_GRID_STRIDE_LOOP(i, n) {
    int64_t w = i % W;
    int64_t h = (i / W) % H;
    int64_t plane = i / (W * H);
    const T* g = grad_out + plane * Ho * Wo;
    // Output oh covers input rows [oh*s - pad, oh*s - pad + k): oh in
    // [ceil((h + pad - k + 1) / s), floor((h + pad) / s)], clipped to [0, Ho).
    int64_t hp = h + p.pad_h, wp = w + p.pad_w;
    int64_t oh_lo = hp - p.kernel_h + 1 > 0 ? (hp - p.kernel_h + 1 + p.stride_h - 1) / p.stride_h : 0;
    int64_t ow_lo = wp - p.kernel_w + 1 > 0 ? (wp - p.kernel_w + 1 + p.stride_w - 1) / p.stride_w : 0;
    int64_t oh_hi = hp / p.stride_h < Ho - 1 ? hp / p.stride_h : Ho - 1;
    int64_t ow_hi = wp / p.stride_w < Wo - 1 ? wp / p.stride_w : Wo - 1;
    A sum = 0;
    for (int64_t oh = oh_lo; oh <= oh_hi; ++oh)
      for (int64_t ow = ow_lo; ow <= ow_hi; ++ow) sum += convert<A>(g[oh * Wo + ow]);
    grad_in[i] = convert<T>(sum / static_cast<A>(p.kernel_h * p.kernel_w));
  }
}

void check_pool_params(const Pool2dParams& p, const char* op) {
  RT_CHECK(p.kernel_h > 0 && p.kernel_w > 0 && p.stride_h > 0 && p.stride_w > 0 && p.pad_h >= 0 &&
               p.pad_w >= 0,
           op, ": invalid pooling parameters kernel ", p.kernel_h, "x", p.kernel_w, " stride ",
           p.stride_h, "x", p.stride_w, " pad ", p.pad_h, "x", p.pad_w);
}

}  // namespace

// ---------------------------------------------------------------- convolution

void conv2d(const Tensor& input_arg, const Tensor& weight_arg, const Tensor& bias_arg,
            const Conv2dParams& p, const Tensor& out) {
  constexpr const char* kOp = "cuda::conv2d";
  int device = cuda_device_of(out, kOp);
  check_same_device(kOp, device, input_arg, weight_arg, bias_arg);
  check_conv_operand(input_arg, "input", kOp);
  check_conv_operand(weight_arg, "weight", kOp);
  check_conv_operand(out, "out", kOp);
  RT_CHECK(out.is_contiguous(), kOp, ": out ", out.describe(), " must be contiguous");
  if (out.numel() == 0) return;
  require_cuda(kOp, device);
  Tensor input = input_arg.contiguous();
  Tensor weight = weight_arg.contiguous();
  DeviceGuard guard(device);
  cudaStream_t stream = raw_stream(device);
  if (input.numel() == 0 || weight.numel() == 0) {
    fill(out, 0.0);
  } else {
    cudnnHandle_t handle = cudnn_for(device, stream);
    ConvDescriptors d(input.shape(), weight.shape(), out.shape(), out.dtype(), p, kOp);
    AlgoChoice choice = choose_algorithm<cudnnConvolutionFwdAlgoPerf_t, CUDNN_CONVOLUTION_FWD_ALGO_COUNT>(
        "forward", device, d,
        [&](cudnnConvolutionFwdAlgoPerf_t* perfs, int* count) {
          return cudnnGetConvolutionForwardAlgorithm_v7(handle, d.x.get(), d.w.get(), d.conv.get(),
                                                        d.y.get(), CUDNN_CONVOLUTION_FWD_ALGO_COUNT,
                                                        count, perfs);
        },
        [&](cudnnConvolutionFwdAlgo_t algo, size_t* bytes) {
          return cudnnGetConvolutionForwardWorkspaceSize(handle, d.x.get(), d.w.get(),
                                                         d.conv.get(), d.y.get(), algo, bytes);
        });
    CUDNN_CHECK(cudnnSetConvolutionMathType(d.conv.get(), choice.math));
    DataPtr workspace = ringtrain::cuda::caching_allocate(choice.workspace, device);
    CUDNN_CHECK(cudnnConvolutionForward(handle, d.one(), d.x.get(), input.data_ptr(), d.w.get(),
                                        weight.data_ptr(), d.conv.get(),
                                        static_cast<cudnnConvolutionFwdAlgo_t>(choice.algo),
                                        workspace.get(), choice.workspace, d.zero(), d.y.get(),
                                        out.data_ptr()));
  }
  if (bias_arg.defined()) {
    RT_CHECK(bias_arg.dim() == 1 && bias_arg.shape()[0] == out.shape()[1] &&
                 bias_arg.dtype() == out.dtype(),
             kOp, ": bias ", bias_arg.describe(), " must be [", out.shape()[1], "] of ",
             dtype_name(out.dtype()));
    Tensor bias = bias_arg.contiguous();
    int64_t n = out.numel();
    int64_t plane = out.shape()[2] * out.shape()[3];
    dispatch_float_dtype(out.dtype(), kOp, [&](auto tag) {
      using T = decltype(tag);
      add_bias_kernel<T><<<grid_for(n), kThreads, 0, stream>>>(
          static_cast<T*>(out.data_ptr()), static_cast<const T*>(bias.data_ptr()), out.shape()[1],
          plane, n);
    });
    check_launch(kOp);
  }
}

void conv2d_backward_input(const Tensor& grad_out_arg, const Tensor& weight_arg,
                           const Conv2dParams& p, const Tensor& grad_input) {
  constexpr const char* kOp = "cuda::conv2d_backward_input";
  int device = cuda_device_of(grad_input, kOp);
  check_same_device(kOp, device, grad_out_arg, weight_arg);
  check_conv_operand(grad_out_arg, "grad_out", kOp);
  check_conv_operand(weight_arg, "weight", kOp);
  check_conv_operand(grad_input, "grad_input", kOp);
  RT_CHECK(grad_input.is_contiguous(), kOp, ": grad_input ", grad_input.describe(),
           " must be contiguous");
  if (grad_input.numel() == 0) return;
  require_cuda(kOp, device);
  if (grad_out_arg.numel() == 0 || weight_arg.numel() == 0) {
    fill(grad_input, 0.0);
    return;
  }
  Tensor grad_out = grad_out_arg.contiguous();
  Tensor weight = weight_arg.contiguous();
  DeviceGuard guard(device);
  cudnnHandle_t handle = cudnn_for(device, raw_stream(device));
  ConvDescriptors d(grad_input.shape(), weight.shape(), grad_out.shape(), grad_input.dtype(), p,
                    kOp);
  AlgoChoice choice =
      choose_algorithm<cudnnConvolutionBwdDataAlgoPerf_t, CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT>(
          "backward-data", device, d,
          [&](cudnnConvolutionBwdDataAlgoPerf_t* perfs, int* count) {
            return cudnnGetConvolutionBackwardDataAlgorithm_v7(
                handle, d.w.get(), d.y.get(), d.conv.get(), d.x.get(),
                CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, count, perfs);
          },
          [&](cudnnConvolutionBwdDataAlgo_t algo, size_t* bytes) {
            return cudnnGetConvolutionBackwardDataWorkspaceSize(handle, d.w.get(), d.y.get(),
                                                                d.conv.get(), d.x.get(), algo,
                                                                bytes);
          });
  CUDNN_CHECK(cudnnSetConvolutionMathType(d.conv.get(), choice.math));
  DataPtr workspace = ringtrain::cuda::caching_allocate(choice.workspace, device);
  CUDNN_CHECK(cudnnConvolutionBackwardData(
      handle, d.one(), d.w.get(), weight.data_ptr(), d.y.get(), grad_out.data_ptr(), d.conv.get(),
      static_cast<cudnnConvolutionBwdDataAlgo_t>(choice.algo), workspace.get(), choice.workspace,
      d.zero(), d.x.get(), grad_input.data_ptr()));
}

void conv2d_backward_weight(const Tensor& grad_out_arg, const Tensor& input_arg,
                            const Conv2dParams& p, const Tensor& grad_weight) {
  constexpr const char* kOp = "cuda::conv2d_backward_weight";
  int device = cuda_device_of(grad_weight, kOp);
  check_same_device(kOp, device, grad_out_arg, input_arg);
  check_conv_operand(grad_out_arg, "grad_out", kOp);
  check_conv_operand(input_arg, "input", kOp);
  check_conv_operand(grad_weight, "grad_weight", kOp);
  RT_CHECK(grad_weight.is_contiguous(), kOp, ": grad_weight ", grad_weight.describe(),
           " must be contiguous");
  if (grad_weight.numel() == 0) return;
  require_cuda(kOp, device);
  if (grad_out_arg.numel() == 0 || input_arg.numel() == 0) {
    fill(grad_weight, 0.0);
    return;
  }
  Tensor grad_out = grad_out_arg.contiguous();
  Tensor input = input_arg.contiguous();
  DeviceGuard guard(device);
  cudnnHandle_t handle = cudnn_for(device, raw_stream(device));
  ConvDescriptors d(input.shape(), grad_weight.shape(), grad_out.shape(), grad_weight.dtype(), p,
                    kOp);
  AlgoChoice choice = choose_algorithm<cudnnConvolutionBwdFilterAlgoPerf_t,
                                       CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT>(
      "backward-filter", device, d,
      [&](cudnnConvolutionBwdFilterAlgoPerf_t* perfs, int* count) {
        return cudnnGetConvolutionBackwardFilterAlgorithm_v7(
            handle, d.x.get(), d.y.get(), d.conv.get(), d.w.get(),
            CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, count, perfs);
      },
      [&](cudnnConvolutionBwdFilterAlgo_t algo, size_t* bytes) {
        return cudnnGetConvolutionBackwardFilterWorkspaceSize(handle, d.x.get(), d.y.get(),
                                                              d.conv.get(), d.w.get(), algo, bytes);
      });
  CUDNN_CHECK(cudnnSetConvolutionMathType(d.conv.get(), choice.math));
  DataPtr workspace = ringtrain::cuda::caching_allocate(choice.workspace, device);
  CUDNN_CHECK(cudnnConvolutionBackwardFilter(
      handle, d.one(), d.x.get(), input.data_ptr(), d.y.get(), grad_out.data_ptr(), d.conv.get(),
      static_cast<cudnnConvolutionBwdFilterAlgo_t>(choice.algo), workspace.get(), choice.workspace,
      d.zero(), d.w.get(), grad_weight.data_ptr()));
}

// ---------------------------------------------------------------- pooling

void max_pool2d(const Tensor& input_arg, const Pool2dParams& p, const Tensor& out,
                const Tensor& indices) {
  constexpr const char* kOp = "cuda::max_pool2d";
  int device = cuda_device_of(out, kOp);
  check_same_device(kOp, device, input_arg, indices);
  check_pool_params(p, kOp);
  RT_CHECK(input_arg.dim() == 4 && out.dim() == 4 && out.is_contiguous() &&
               indices.dtype() == DType::kInt64 && indices.is_contiguous() &&
               indices.shape() == out.shape(),
           kOp, ": expected input [N,C,H,W], contiguous out and int64 indices of one shape; got ",
           input_arg.describe(), ", ", out.describe(), ", ", indices.describe());
  int64_t n = out.numel();
  if (n == 0) return;
  require_cuda(kOp, device);
  Tensor input = input_arg.contiguous();
  DeviceGuard guard(device);
  cudaStream_t stream = raw_stream(device);
  dispatch_float_dtype(out.dtype(), kOp, [&](auto tag) {
    using T = decltype(tag);
    max_pool_kernel<T><<<grid_for(n), kThreads, 0, stream>>>(
        static_cast<const T*>(input.data_ptr()), input.shape()[2], input.shape()[3], out.shape()[2],
        out.shape()[3], p, static_cast<T*>(out.data_ptr()),
        static_cast<int64_t*>(indices.data_ptr()), n);
  });
  check_launch(kOp);
}

void max_pool2d_backward(const Tensor& grad_out_arg, const Tensor& indices_arg,
                         const Tensor& grad_input) {
  constexpr const char* kOp = "cuda::max_pool2d_backward";
  int device = cuda_device_of(grad_input, kOp);
  check_same_device(kOp, device, grad_out_arg, indices_arg);
  RT_CHECK(grad_out_arg.dim() == 4 && grad_input.dim() == 4 && grad_input.is_contiguous() &&
               indices_arg.shape() == grad_out_arg.shape() &&
               indices_arg.dtype() == DType::kInt64 &&
               grad_out_arg.shape()[0] == grad_input.shape()[0] &&
               grad_out_arg.shape()[1] == grad_input.shape()[1],
           kOp, ": expected grad_out [N,C,Ho,Wo], int64 indices of that shape and contiguous "
           "grad_input [N,C,H,W]; got ", grad_out_arg.describe(), ", ", indices_arg.describe(),
           ", ", grad_input.describe());
  if (grad_input.numel() == 0) return;
  require_cuda(kOp, device);
  fill(grad_input, 0.0);
  int64_t n = grad_out_arg.numel();
  if (n == 0) return;
  Tensor grad_out = grad_out_arg.contiguous();
  Tensor indices = indices_arg.contiguous();
  DeviceGuard guard(device);
  cudaStream_t stream = raw_stream(device);
  dispatch_float_dtype(grad_input.dtype(), kOp, [&](auto tag) {
    using T = decltype(tag);
    max_pool_backward_kernel<T><<<grid_for(n), kThreads, 0, stream>>>(
        static_cast<const T*>(grad_out.data_ptr()), static_cast<const int64_t*>(indices.data_ptr()),
        grad_out.shape()[2] * grad_out.shape()[3], grad_input.shape()[2] * grad_input.shape()[3],
        static_cast<T*>(grad_input.data_ptr()), n);
  });
  check_launch(kOp);
}

void avg_pool2d(const Tensor& input_arg, const Pool2dParams& p, const Tensor& out) {
  constexpr const char* kOp = "cuda::avg_pool2d";
  int device = cuda_device_of(out, kOp);
  check_same_device(kOp, device, input_arg);
  check_pool_params(p, kOp);
  RT_CHECK(input_arg.dim() == 4 && out.dim() == 4 && out.is_contiguous(), kOp,
           ": expected input [N,C,H,W] and contiguous out; got ", input_arg.describe(), ", ",
           out.describe());
  int64_t n = out.numel();
  if (n == 0) return;
  require_cuda(kOp, device);
  Tensor input = input_arg.contiguous();
  DeviceGuard guard(device);
  cudaStream_t stream = raw_stream(device);
  dispatch_float_dtype(out.dtype(), kOp, [&](auto tag) {
    using T = decltype(tag);
    avg_pool_kernel<T><<<grid_for(n), kThreads, 0, stream>>>(
        static_cast<const T*>(input.data_ptr()), input.shape()[2], input.shape()[3],
        out.shape()[2], out.shape()[3], p, static_cast<T*>(out.data_ptr()), n);
  });
  check_launch(kOp);
}

void avg_pool2d_backward(const Tensor& grad_out_arg, const Pool2dParams& p,
                         const Tensor& grad_input) {
  constexpr const char* kOp = "cuda::avg_pool2d_backward";
  int device = cuda_device_of(grad_input, kOp);
  check_same_device(kOp, device, grad_out_arg);
  check_pool_params(p, kOp);
  RT_CHECK(grad_out_arg.dim() == 4 && grad_input.dim() == 4 && grad_input.is_contiguous(), kOp,
           ": expected grad_out [N,C,Ho,Wo] and contiguous grad_input [N,C,H,W]; got ",
           grad_out_arg.describe(), ", ", grad_input.describe());
  int64_t n = grad_input.numel();
  if (n == 0) return;
  require_cuda(kOp, device);
  if (grad_out_arg.numel() == 0) {
    fill(grad_input, 0.0);
    return;
  }
  Tensor grad_out = grad_out_arg.contiguous();
  DeviceGuard guard(device);
  cudaStream_t stream = raw_stream(device);
  dispatch_float_dtype(grad_input.dtype(), kOp, [&](auto tag) {
    using T = decltype(tag);
    avg_pool_backward_kernel<T><<<grid_for(n), kThreads, 0, stream>>>(
        static_cast<const T*>(grad_out.data_ptr()), grad_input.shape()[2], grad_input.shape()[3],
        grad_out.shape()[2], grad_out.shape()[3], p, static_cast<T*>(grad_input.data_ptr()), n);
  });
  check_launch(kOp);
}

}  // namespace ringtrain::kernels::cuda
