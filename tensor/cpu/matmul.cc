// matmul.cc: CPU batched GEMM, out[b] = a[b] @ b[b], on Eigen.
//
// Each operand of each batch is wrapped in an Eigen::Map without copying when one
// of its two matrix strides is 1: row stride 1 maps it column-major, column stride
// 1 maps it row-major, with the other stride as the outer stride (so transposed
// views, Linear's x W^T, go straight into the GEMM). An operand with neither
// stride 1 is first copied to a contiguous buffer. A batch stride of 0 (broadcast
// batch dims) needs nothing special: the loop just re-reads the same matrix.
//
// Eigen's GEMM packs panels of both operands into cache-sized blocks and runs an
// FMA micro-kernel (AVX2/AVX-512 under -march=native). It is single-threaded
// here: the library is built without OpenMP, and we pin Eigen::setNbThreads(1)
// anyway, because data-parallel training runs one rank per core.
//
// f16/bf16: both operands are converted to f32 contiguous buffers, multiplied in
// f32 (f32 accumulation, as cuBLAS does) and rounded once on store. Integer
// dtypes are rejected. Cost: 2 m n k flops per batch; for 1024^3 f32 about
// 80-90% of OpenBLAS single-thread on this AVX2 machine (docs/tensor-benchmark.md).
#include <vector>

#include <Eigen/Core>

#include "tensor/checks.h"
#include "tensor/cpu/loops.h"
#include "tensor/kernels.h"

namespace ringtrain::kernels::cpu {

namespace {

template <typename C>
using RowMat = Eigen::Matrix<C, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <typename C>
using ColMat = Eigen::Matrix<C, Eigen::Dynamic, Eigen::Dynamic, Eigen::ColMajor>;
using OuterStride = Eigen::OuterStride<Eigen::Dynamic>;

// One matrix operand: pointer, rows x cols, element strides of a row step and a column step.
template <typename C>
struct MatRef {
  const C* data;
  int64_t rows, cols, row_stride, col_stride;
};

// y (m x n, row-major, contiguous) = a @ b, picking the Map layouts from the strides.
template <typename C>
void gemm(const MatRef<C>& a, const MatRef<C>& b, C* y) {
  Eigen::Map<RowMat<C>> Y(y, a.rows, b.cols);
  auto with_b = [&](const auto& A) {
    if (b.col_stride == 1) {
      Eigen::Map<const RowMat<C>, 0, OuterStride> B(b.data, b.rows, b.cols, OuterStride(b.row_stride));
      Y.noalias() = A * B;
    } else {
      Eigen::Map<const ColMat<C>, 0, OuterStride> B(b.data, b.rows, b.cols, OuterStride(b.col_stride));
      Y.noalias() = A * B;
    }
  };
  if (a.col_stride == 1) {
    with_b(Eigen::Map<const RowMat<C>, 0, OuterStride>(a.data, a.rows, a.cols, OuterStride(a.row_stride)));
  } else {
    with_b(Eigen::Map<const ColMat<C>, 0, OuterStride>(a.data, a.rows, a.cols, OuterStride(a.col_stride)));
  }
}

// Makes a matrix operand Map-able: returns it as is when one stride is 1 (and the other is a
// valid outer stride), otherwise copies it (converting T -> C) into `scratch`.
template <typename T, typename C>
MatRef<C> prepare(const T* p, int64_t rows, int64_t cols, int64_t rs, int64_t cs,
                  std::vector<C>& scratch) {
  if constexpr (std::is_same_v<T, C>) {
    if (cs == 1 && rs >= std::max<int64_t>(cols, 1)) return {p, rows, cols, rs, 1};
    if (rs == 1 && cs >= std::max<int64_t>(rows, 1)) return {p, rows, cols, 1, cs};
  }
  scratch.resize(static_cast<size_t>(rows * cols));
  for (int64_t i = 0; i < rows; ++i) detail::load_run(p + i * rs, cs, scratch.data() + i * cols, cols);
  return {scratch.data(), rows, cols, std::max<int64_t>(cols, 1), 1};
}

template <typename T>
void batched_matmul_typed(const Tensor& a, const Tensor& b, const Tensor& out) {
  using C = detail::Compute<T>;
  const int64_t B = out.size(0), m = out.size(1), n = out.size(2), k = a.size(2);
  const T* ap = a.data<T>();
  const T* bp = b.data<T>();
  T* op = out.data<T>();
  std::vector<C> a_scratch, b_scratch, y_scratch;
  if constexpr (!std::is_same_v<T, C>) y_scratch.resize(static_cast<size_t>(m * n));
  for (int64_t i = 0; i < B; ++i) {
    C* y;
    if constexpr (std::is_same_v<T, C>) {
      y = op + i * m * n;
    } else {
      y = y_scratch.data();
    }
    if (k == 0) {
      std::fill_n(y, m * n, C(0));
    } else {
      MatRef<C> am = prepare<T, C>(ap + i * a.stride(0), m, k, a.stride(1), a.stride(2), a_scratch);
      MatRef<C> bm = prepare<T, C>(bp + i * b.stride(0), k, n, b.stride(1), b.stride(2), b_scratch);
      gemm(am, bm, y);
    }
    if constexpr (!std::is_same_v<T, C>) detail::store_run(y, op + i * m * n, 1, m * n);
  }
}

}  // namespace

void batched_matmul(const Tensor& a, const Tensor& b, const Tensor& out) {
  RT_CHECK(a.dim() == 3 && b.dim() == 3 && out.dim() == 3 && a.size(0) == out.size(0) &&
               b.size(0) == out.size(0) && a.size(1) == out.size(1) && b.size(2) == out.size(2) &&
               a.size(2) == b.size(1),
           "matmul (cpu kernel): a ", a.describe(), " @ b ", b.describe(), " -> out ",
           out.describe(), ": expected [B,m,k] @ [B,k,n] -> [B,m,n]");
  RT_CHECK(a.dtype() == b.dtype() && a.dtype() == out.dtype(), "matmul (cpu kernel): dtypes of ",
           a.describe(), ", ", b.describe(), ", ", out.describe(), " differ");
  RT_CHECK(is_floating_point(a.dtype()), "matmul: floating-point dtypes only, got ", a.describe());
  RT_CHECK(out.is_contiguous(), "matmul (cpu kernel): output ", out.describe(), " must be contiguous");
  if (out.numel() == 0) return;
  Eigen::setNbThreads(1);
  dispatch_dtype(a.dtype(), [&](auto tag) {
    using T = decltype(tag);
    if constexpr (detail::kIsFloat<T>) batched_matmul_typed<T>(a, b, out);
  });
}

}  // namespace ringtrain::kernels::cpu
