// softmax_index.cc: CPU softmax / log_softmax (forward and backward) along a dim,
// and the indexing kernels gather, index_select, index_add.
//
// softmax: the contiguous input is viewed as [outer, n, inner] (n = the softmax
// dim). Each outer slice is processed in column blocks of up to kCols columns:
// the block [n, cols] is loaded into a compute-type buffer (f32 for
// f32/f16/bf16, f64 for f64), the column maxima m are subtracted (numerically
// stable: every exponent is <= 0), Eigen's vectorised exp gives e, the column
// sums s accumulate in float64, and the result is e / s (softmax) or
// (x - m) - log s (log_softmax). Backward uses the saved output y:
//   softmax:      dx = y * (dy - sum_k dy*y)
//   log_softmax:  dx = dy - exp(y) * sum_k dy
// Cost: one read + one write per element plus one exp; the row sums are O(n).
//
// gather and index_add are StridedLoops in which the indexed tensor gets stride
// 0 along `dim` and the loaded index supplies that offset; index_select copies
// whole [inner] rows with memcpy (embedding lookup is one memcpy per token).
// Every index is bounds-checked and a bad one throws naming the op, index and size.
#include <cmath>
#include <cstring>
#include <vector>

#include <Eigen/Core>

#include "tensor/checks.h"
#include "tensor/cpu/loops.h"
#include "tensor/kernels.h"

namespace ringtrain::kernels::cpu {

using detail::byte_ptr;
using detail::Compute;
using detail::StridedLoop;

namespace {

constexpr int64_t kCols = 256;

struct Slab {
  int64_t outer = 1, n = 1, inner = 1;
};

Slab slab_of(const Tensor& t, int64_t dim, const char* op) {
  Slab s;
  if (t.dim() == 0) return s;
  RT_CHECK(dim >= 0 && dim < t.dim(), op, " (cpu kernel): dim ", dim, " out of range for ", t.describe());
  for (int64_t d = 0; d < dim; ++d) s.outer *= t.size(d);
  s.n = t.size(dim);
  for (int64_t d = dim + 1; d < t.dim(); ++d) s.inner *= t.size(d);
  return s;
}

// Loads rows [0, n) x columns [j0, j0 + cols) of a [n, inner] slab into buf[n][cols].
template <typename T>
void load_block(const T* slab, const Slab& s, int64_t j0, int64_t cols, Compute<T>* buf) {
  for (int64_t k = 0; k < s.n; ++k) detail::load_run(slab + k * s.inner + j0, 1, buf + k * cols, cols);
}
template <typename T>
void store_block(const Compute<T>* buf, const Slab& s, int64_t j0, int64_t cols, T* slab) {
  for (int64_t k = 0; k < s.n; ++k) detail::store_run(buf + k * cols, slab + k * s.inner + j0, 1, cols);
}

template <typename T>
void softmax_typed(const Tensor& in, int64_t dim, bool log, const Tensor& out) {
  using C = Compute<T>;
  const Slab s = slab_of(in, dim, log ? "log_softmax" : "softmax");
  const T* x = in.data<T>();
  T* y = out.data<T>();
  const int64_t max_cols = std::min(s.inner, kCols);
  std::vector<C> xb(static_cast<size_t>(s.n * max_cols)), eb(xb.size()), m(static_cast<size_t>(max_cols));
  std::vector<double> sum(static_cast<size_t>(max_cols));
  for (int64_t o = 0; o < s.outer; ++o) {
    const T* xs = x + o * s.n * s.inner;
    T* ys = y + o * s.n * s.inner;
    for (int64_t j0 = 0; j0 < s.inner; j0 += kCols) {
      const int64_t cols = std::min(kCols, s.inner - j0);
      const int64_t len = s.n * cols;
      load_block(xs, s, j0, cols, xb.data());
      std::fill_n(m.begin(), cols, -std::numeric_limits<C>::infinity());
      for (int64_t k = 0; k < s.n; ++k)
        for (int64_t j = 0; j < cols; ++j) {
          const C v = xb[static_cast<size_t>(k * cols + j)];
          C& mj = m[static_cast<size_t>(j)];
          mj = (v > mj || v != v) ? v : mj;
        }
      for (int64_t k = 0; k < s.n; ++k)
        for (int64_t j = 0; j < cols; ++j) xb[static_cast<size_t>(k * cols + j)] -= m[static_cast<size_t>(j)];
      // masked (-inf) entries give exactly 0
      detail::apply_packet_fixing_low<Eigen::internal::scalar_exp_op<C>>(
          xb.data(), eb.data(), len, detail::kExpNormalLow<C>, [](C v) { return std::exp(v); });
      std::fill_n(sum.begin(), cols, 0.0);
      for (int64_t k = 0; k < s.n; ++k)
        for (int64_t j = 0; j < cols; ++j) sum[static_cast<size_t>(j)] += eb[static_cast<size_t>(k * cols + j)];
      if (log) {
        for (int64_t j = 0; j < cols; ++j) m[static_cast<size_t>(j)] = static_cast<C>(std::log(sum[static_cast<size_t>(j)]));
        for (int64_t k = 0; k < s.n; ++k)
          for (int64_t j = 0; j < cols; ++j) eb[static_cast<size_t>(k * cols + j)] = xb[static_cast<size_t>(k * cols + j)] - m[static_cast<size_t>(j)];
      } else {
        for (int64_t j = 0; j < cols; ++j) m[static_cast<size_t>(j)] = static_cast<C>(1.0 / sum[static_cast<size_t>(j)]);
        for (int64_t k = 0; k < s.n; ++k)
          for (int64_t j = 0; j < cols; ++j) eb[static_cast<size_t>(k * cols + j)] *= m[static_cast<size_t>(j)];
      }
      store_block(eb.data(), s, j0, cols, ys);
    }
  }
}

template <typename T>
void softmax_backward_typed(const Tensor& grad_out, const Tensor& output, int64_t dim, bool log,
                            const Tensor& grad_in) {
  using C = Compute<T>;
  const Slab s = slab_of(output, dim, log ? "log_softmax_backward" : "softmax_backward");
  const T* g = grad_out.data<T>();
  const T* y = output.data<T>();
  T* gi = grad_in.data<T>();
  const int64_t max_cols = std::min(s.inner, kCols);
  std::vector<C> gb(static_cast<size_t>(s.n * max_cols)), yb(gb.size());
  std::vector<C> pb(log ? gb.size() : 0);  // log: p = exp(y)
  std::vector<double> dot(static_cast<size_t>(max_cols));
  for (int64_t o = 0; o < s.outer; ++o) {
    const int64_t base = o * s.n * s.inner;
    for (int64_t j0 = 0; j0 < s.inner; j0 += kCols) {
      const int64_t cols = std::min(kCols, s.inner - j0);
      const int64_t len = s.n * cols;
      load_block(g + base, s, j0, cols, gb.data());
      load_block(y + base, s, j0, cols, yb.data());
      std::fill_n(dot.begin(), cols, 0.0);
      for (int64_t k = 0; k < s.n; ++k)
        for (int64_t j = 0; j < cols; ++j) {
          const size_t i = static_cast<size_t>(k * cols + j);
          dot[static_cast<size_t>(j)] += log ? static_cast<double>(gb[i]) : static_cast<double>(gb[i]) * yb[i];
        }
      if (log) {
        // y = log p -> p
        detail::apply_packet_fixing_low<Eigen::internal::scalar_exp_op<C>>(
            yb.data(), pb.data(), len, detail::kExpNormalLow<C>, [](C v) { return std::exp(v); });
        for (int64_t k = 0; k < s.n; ++k)
          for (int64_t j = 0; j < cols; ++j) {
            const size_t i = static_cast<size_t>(k * cols + j);
            gb[i] = static_cast<C>(gb[i] - pb[i] * dot[static_cast<size_t>(j)]);
          }
      } else {
        for (int64_t k = 0; k < s.n; ++k)
          for (int64_t j = 0; j < cols; ++j) {
            const size_t i = static_cast<size_t>(k * cols + j);
            gb[i] = static_cast<C>(yb[i] * (gb[i] - dot[static_cast<size_t>(j)]));
          }
      }
      store_block(gb.data(), s, j0, cols, gi + base);
    }
  }
}

void check_contiguous_same(const char* op, const Tensor& a, const Tensor& b) {
  RT_CHECK(a.is_contiguous() && b.is_contiguous() && a.shape() == b.shape() && a.dtype() == b.dtype(),
           op, " (cpu kernel): ", a.describe(), " and ", b.describe(),
           " must be contiguous with equal shapes and dtypes");
}

[[noreturn]] void bad_index(const char* op, int64_t index, int64_t size, int64_t dim,
                            const Tensor& a) {
  throw Error(::ringtrain::detail::concat(op, ": index ", index, " is out of range for dim ", dim, " of size ",
                             size, " (tensor ", a.describe(), ")"));
}

}  // namespace

void softmax(const Tensor& in, int64_t dim, bool log, const Tensor& out) {
  check_contiguous_same(log ? "log_softmax" : "softmax", in, out);
  RT_CHECK(is_floating_point(in.dtype()), log ? "log_softmax" : "softmax",
           ": floating-point dtypes only, got ", in.describe());
  if (in.numel() == 0) return;
  dispatch_dtype(in.dtype(), [&](auto tag) {
    using T = decltype(tag);
    if constexpr (detail::kIsFloat<T>) softmax_typed<T>(in, dim, log, out);
  });
}

void softmax_backward(const Tensor& grad_out, const Tensor& output, int64_t dim, bool log,
                      const Tensor& grad_in) {
  const char* op = log ? "log_softmax_backward" : "softmax_backward";
  check_contiguous_same(op, grad_out, output);
  check_contiguous_same(op, grad_out, grad_in);
  RT_CHECK(is_floating_point(output.dtype()), op, ": floating-point dtypes only, got ", output.describe());
  if (output.numel() == 0) return;
  dispatch_dtype(output.dtype(), [&](auto tag) {
    using T = decltype(tag);
    if constexpr (detail::kIsFloat<T>) softmax_backward_typed<T>(grad_out, output, dim, log, grad_in);
  });
}

void gather(const Tensor& a, int64_t dim, const Tensor& index, const Tensor& out) {
  RT_CHECK(index.dtype() == DType::kInt64 && index.dim() == a.dim() && out.shape() == index.shape() &&
               out.dtype() == a.dtype() && dim >= 0 && dim < std::max<int64_t>(a.dim(), 1),
           "gather (cpu kernel): a ", a.describe(), ", dim ", dim, ", index ", index.describe(),
           ", out ", out.describe(), " do not fit");
  for (int64_t d = 0; d < a.dim(); ++d) {
    RT_CHECK(d == dim || index.size(d) <= a.size(d), "gather: index ", index.describe(),
             " is larger than ", a.describe(), " in dim ", d);
  }
  if (out.numel() == 0) return;
  const int64_t size = a.dim() ? a.size(dim) : 1;
  const int64_t dstride = a.dim() ? a.stride(dim) : 0;
  Shape a_strides = a.strides();
  if (a.dim()) a_strides[static_cast<size_t>(dim)] = 0;
  dispatch_dtype(a.dtype(), [&](auto tag) {
    using T = decltype(tag);
    constexpr int64_t es = sizeof(T);
    StridedLoop<3> loop(out.shape(), {&out.strides(), &index.strides(), &a_strides}, {es, 8, es});
    loop.run({byte_ptr(out), byte_ptr(index), byte_ptr(a)},
             [&](std::array<char*, 3> p, const std::array<int64_t, 3>& s, int64_t n) {
               T* y = reinterpret_cast<T*>(p[0]);
               const int64_t* ix = reinterpret_cast<const int64_t*>(p[1]);
               const T* x = reinterpret_cast<const T*>(p[2]);
               const int64_t ys = s[0] / es, is = s[1] / 8, xs = s[2] / es;
               for (int64_t i = 0; i < n; ++i) {
                 const int64_t k = ix[i * is];
                 if (k < 0 || k >= size) bad_index("gather", k, size, dim, a);
                 y[i * ys] = x[i * xs + k * dstride];
               }
             });
  });
}

void index_select(const Tensor& a_arg, int64_t dim, const Tensor& index_arg, const Tensor& out) {
  RT_CHECK(index_arg.dtype() == DType::kInt64 && out.dtype() == a_arg.dtype() && out.is_contiguous() &&
               a_arg.dim() > 0 && dim >= 0 && dim < a_arg.dim(),
           "index_select (cpu kernel): a ", a_arg.describe(), ", dim ", dim, ", index ",
           index_arg.describe(), ", out ", out.describe(), " do not fit");
  const Tensor a = a_arg.contiguous();
  const Tensor index = index_arg.contiguous();
  const Slab s = slab_of(a, dim, "index_select");
  const int64_t nidx = index.numel();
  RT_CHECK(out.numel() == s.outer * nidx * s.inner, "index_select (cpu kernel): out ",
           out.describe(), " does not hold ", nidx, " selections of ", a.describe());
  if (out.numel() == 0) return;
  const int64_t* ix = index.data<int64_t>();
  const size_t es = dtype_size(a.dtype());
  const size_t row_bytes = static_cast<size_t>(s.inner) * es;
  const char* x = static_cast<const char*>(a.data_ptr());
  char* y = static_cast<char*>(out.data_ptr());
  for (int64_t i = 0; i < nidx; ++i) {
    if (ix[i] < 0 || ix[i] >= s.n) bad_index("index_select", ix[i], s.n, dim, a_arg);
  }
  for (int64_t o = 0; o < s.outer; ++o)
    for (int64_t i = 0; i < nidx; ++i) {
      std::memcpy(y + static_cast<size_t>(o * nidx + i) * row_bytes,
                  x + static_cast<size_t>(o * s.n + ix[i]) * row_bytes, row_bytes);
    }
}

void index_add(const Tensor& a, int64_t dim, const Tensor& index_arg, const Tensor& src_arg) {
  // An index of any shape selects src's dims [dim, dim + index.dim()): flatten both to one dim.
  RT_CHECK(a.dim() > 0 && dim >= 0 && dim < a.dim() && src_arg.dim() == a.dim() - 1 + index_arg.dim(),
           "index_add (cpu kernel): a ", a.describe(), ", dim ", dim, ", index ",
           index_arg.describe(), ", src ", src_arg.describe(), " do not fit");
  const Tensor index = index_arg.reshape({-1});
  Shape src_shape = a.shape();
  src_shape[static_cast<size_t>(dim)] = index.numel();
  RT_CHECK(shape_numel(src_shape) == src_arg.numel(), "index_add: src ", src_arg.describe(),
           " does not hold ", index.numel(), " slices of ", a.describe());
  const Tensor src = src_arg.reshape(src_shape);
  RT_CHECK(index.dtype() == DType::kInt64 && index.dim() == 1 && src.dtype() == a.dtype() &&
               src.dim() == a.dim() && a.dim() > 0 && dim >= 0 && dim < a.dim() &&
               src.size(dim) == index.size(0),
           "index_add (cpu kernel): a ", a.describe(), ", dim ", dim, ", index ", index.describe(),
           ", src ", src.describe(), " do not fit");
  for (int64_t d = 0; d < a.dim(); ++d) {
    RT_CHECK(d == dim || src.size(d) == a.size(d), "index_add: src ", src.describe(),
             " differs from ", a.describe(), " in dim ", d);
  }
  if (src.numel() == 0) return;
  const int64_t size = a.size(dim), dstride = a.stride(dim);
  // Every index is checked before the first write, as index_select does: throwing from
  // inside the loop left the destination (a gradient, a user's accumulator) half-updated.
  const int64_t* ix0 = index.data<int64_t>();
  for (int64_t i = 0; i < index.numel(); ++i) {
    const int64_t k = ix0[i * index.stride(0)];
    if (k < 0 || k >= size) bad_index("index_add", k, size, dim, a);
  }
  Shape a_strides = a.strides();
  a_strides[static_cast<size_t>(dim)] = 0;
  Shape i_strides(static_cast<size_t>(a.dim()), 0);
  i_strides[static_cast<size_t>(dim)] = index.stride(0);
  dispatch_dtype(a.dtype(), [&](auto tag) {
    using T = decltype(tag);
    constexpr int64_t es = sizeof(T);
    StridedLoop<3> loop(src.shape(), {&a_strides, &src.strides(), &i_strides}, {es, es, 8});
    loop.run({byte_ptr(a), byte_ptr(src), byte_ptr(index)},
             [&](std::array<char*, 3> p, const std::array<int64_t, 3>& s, int64_t n) {
               T* y = reinterpret_cast<T*>(p[0]);
               const T* x = reinterpret_cast<const T*>(p[1]);
               const int64_t* ix = reinterpret_cast<const int64_t*>(p[2]);
               const int64_t ys = s[0] / es, xs = s[1] / es, is = s[2] / 8;
               for (int64_t i = 0; i < n; ++i) {
                 const int64_t k = ix[i * is];  // in range: checked above
                 T& dst = y[i * ys + k * dstride];
                 if constexpr (std::is_integral_v<T>) dst = wrapping_add(dst, x[i * xs]);
                 else dst = detail::store<T>(detail::load(dst) + detail::load(x[i * xs]));
               }
             });
  });
}

}  // namespace ringtrain::kernels::cpu
