// reduce.cc: CPU sum/max/min over any set of dims, and max_along (values + first
// argmax) along one dim.
//
// reduce: the output (keepdim layout) is given 0 strides on the reduced dims and
// walked together with the input by a StridedLoop ordered by the *input's*
// strides, so the input is read once, sequentially, whatever the reduced dims.
// Results accumulate in a scratch buffer of the output's size in the accumulation
// type (sum: float64 for every float dtype, int64 for integers; max/min: the
// compute type) and are rounded to the output dtype once at the end. Innermost
// runs are either
//   * "reduce a run into one accumulator" (the output stride is 0): f32/f64 runs
//     are summed in blocks of kBlock with Eigen's vectorised sum (several SIMD
//     partial sums, so the block error is tiny) and the blocks added in float64;
//     max/min use Eigen's NaN-propagating maxCoeff/minCoeff;
//   * "accumulate a run into a run" (reducing an outer dim): acc[i] += x[i].
// NaN propagates through max/min. Cost: one read of the input, memory bound.
//
// max_along: input viewed as [outer, n, inner]; for each outer slice the running
// best of all `inner` columns is updated row by row (contiguous rows, so it
// vectorises and stays in cache). The first maximum wins; a NaN is the maximum.
#include <cmath>
#include <limits>
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

constexpr int64_t kBlock = 1024;

const char* reduce_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return "sum";
    case ReduceOp::kMax: return "amax";
    case ReduceOp::kMin: return "amin";
  }
  return "reduce";
}

template <ReduceOp OP, typename T>
using Acc = std::conditional_t<OP == ReduceOp::kSum,
                               std::conditional_t<detail::kIsFloat<T>, double, int64_t>, Compute<T>>;

template <ReduceOp OP, typename A>
constexpr A identity() {
  if constexpr (OP == ReduceOp::kSum) return A(0);
  else if constexpr (OP == ReduceOp::kMax) {
    if constexpr (std::is_floating_point_v<A>) return -std::numeric_limits<A>::infinity();
    else return std::numeric_limits<A>::lowest();
  } else {
    if constexpr (std::is_floating_point_v<A>) return std::numeric_limits<A>::infinity();
    else return std::numeric_limits<A>::max();
  }
}

template <ReduceOp OP, typename A>
inline A combine(A s, A v) {
  // Integer sums wrap around in int64 (two's complement) instead of overflowing (UB).
  if constexpr (OP == ReduceOp::kSum) return wrapping_add(s, v);
  else if constexpr (OP == ReduceOp::kMax) return (s != s) ? s : ((v > s || v != v) ? v : s);
  else return (s != s) ? s : ((v < s || v != v) ? v : s);
}

// Reduces x[0], x[xs], ... x[(n-1) xs] into one accumulator value.
template <ReduceOp OP, typename T>
Acc<OP, T> reduce_run(const T* x, int64_t xs, int64_t n) {
  using A = Acc<OP, T>;
  using C = Compute<T>;
  A s = identity<OP, A>();
  if constexpr (detail::kIsFloat<T>) {
    alignas(64) C buf[kBlock];
    for (int64_t i0 = 0; i0 < n; i0 += kBlock) {
      const int64_t m = std::min(kBlock, n - i0);
      const C* run;
      if (std::is_same_v<T, C> && xs == 1) {
        run = reinterpret_cast<const C*>(x + i0);
      } else {
        detail::load_run(x + i0 * xs, xs, buf, m);
        run = buf;
      }
      Eigen::Map<const Eigen::Array<C, Eigen::Dynamic, 1>> v(run, m);
      if constexpr (OP == ReduceOp::kSum) {
        s += static_cast<A>(v.sum());
      } else if constexpr (OP == ReduceOp::kMax) {
        s = combine<OP, A>(s, static_cast<A>(v.template maxCoeff<Eigen::PropagateNaN>()));
      } else {
        s = combine<OP, A>(s, static_cast<A>(v.template minCoeff<Eigen::PropagateNaN>()));
      }
    }
  } else {
    for (int64_t i = 0; i < n; ++i) s = combine<OP, A>(s, static_cast<A>(x[i * xs]));
  }
  return s;
}

template <ReduceOp OP, typename T>
void reduce_typed(const Tensor& in, const std::vector<bool>& mask, const Tensor& out) {
  using A = Acc<OP, T>;
  std::vector<A> acc(static_cast<size_t>(out.numel()), identity<OP, A>());
  // The accumulator viewed with in's shape: contiguous strides of out, 0 on reduced dims.
  Shape acc_strides = contiguous_strides(out.shape());
  for (size_t d = 0; d < mask.size(); ++d) {
    if (mask[d]) acc_strides[d] = 0;
  }
  if (in.numel() > 0) {
    StridedLoop<2> loop(in.shape(), {&acc_strides, &in.strides()},
                        {static_cast<int64_t>(sizeof(A)), static_cast<int64_t>(sizeof(T))},
                        /*sort_by=*/1);
    loop.run({reinterpret_cast<char*>(acc.data()), byte_ptr(in)},
             [](std::array<char*, 2> p, const std::array<int64_t, 2>& s, int64_t n) {
               A* a = reinterpret_cast<A*>(p[0]);
               const T* x = reinterpret_cast<const T*>(p[1]);
               const int64_t as = s[0] / static_cast<int64_t>(sizeof(A));
               const int64_t xs = s[1] / static_cast<int64_t>(sizeof(T));
               if (as == 0) {
                 *a = combine<OP, A>(*a, reduce_run<OP, T>(x, xs, n));
               } else if (as == 1 && xs == 1) {
                 for (int64_t i = 0; i < n; ++i) a[i] = combine<OP, A>(a[i], static_cast<A>(detail::load(x[i])));
               } else {
                 for (int64_t i = 0; i < n; ++i) {
                   a[i * as] = combine<OP, A>(a[i * as], static_cast<A>(detail::load(x[i * xs])));
                 }
               }
             });
  }
  T* o = out.data<T>();
  for (size_t i = 0; i < acc.size(); ++i) o[i] = detail::store<T>(acc[i]);
}

}  // namespace

void reduce(ReduceOp op, const Tensor& in, const std::vector<bool>& reduce_mask, const Tensor& out) {
  RT_CHECK(static_cast<int64_t>(reduce_mask.size()) == in.dim() && out.dim() == in.dim() &&
               out.dtype() == in.dtype() && out.is_contiguous(),
           reduce_name(op), " (cpu kernel): input ", in.describe(), ", output ", out.describe(),
           ", mask of ", reduce_mask.size(), " dims do not fit together");
  for (int64_t d = 0; d < in.dim(); ++d) {
    const int64_t want = reduce_mask[static_cast<size_t>(d)] ? 1 : in.size(d);
    RT_CHECK(out.size(d) == want, reduce_name(op), " (cpu kernel): output ", out.describe(),
             " is not the keepdim shape for input ", in.describe());
  }
  if (out.numel() == 0) return;
  RT_CHECK(op == ReduceOp::kSum || in.numel() > 0, reduce_name(op), ": cannot reduce ",
           in.describe(), " over an empty dim (no identity for max/min)");
  dispatch_dtype(in.dtype(), [&](auto tag) {
    using T = decltype(tag);
    switch (op) {
      case ReduceOp::kSum: reduce_typed<ReduceOp::kSum, T>(in, reduce_mask, out); break;
      case ReduceOp::kMax: reduce_typed<ReduceOp::kMax, T>(in, reduce_mask, out); break;
      case ReduceOp::kMin: reduce_typed<ReduceOp::kMin, T>(in, reduce_mask, out); break;
    }
  });
}

void max_along(const Tensor& in_arg, int64_t dim, const Tensor& values, const Tensor& indices) {
  const int64_t nd = std::max<int64_t>(in_arg.dim(), 1);
  RT_CHECK(dim >= 0 && dim < nd, "max (cpu kernel): dim ", dim, " out of range for ",
           in_arg.describe());
  RT_CHECK(indices.dtype() == DType::kInt64 && values.dtype() == in_arg.dtype() &&
               values.is_contiguous() && indices.is_contiguous(),
           "max (cpu kernel): values ", values.describe(), " / indices ", indices.describe(),
           " do not fit input ", in_arg.describe());
  const Tensor in = in_arg.contiguous();
  const int64_t n = in.dim() == 0 ? 1 : in.size(dim);
  int64_t outer = 1, inner = 1;
  for (int64_t d = 0; d < dim; ++d) outer *= in.size(d);
  for (int64_t d = dim + 1; d < in.dim(); ++d) inner *= in.size(d);
  RT_CHECK(values.numel() == outer * inner && indices.numel() == outer * inner, "max (cpu kernel): ",
           values.describe(), " is not the reduced shape of ", in.describe(), " along dim ", dim);
  if (outer * inner == 0) return;
  RT_CHECK(n > 0, "max: cannot take the maximum of ", in.describe(), " along its empty dim ", dim);
  dispatch_dtype(in.dtype(), [&](auto tag) {
    using T = decltype(tag);
    using C = Compute<T>;
    const T* x = in.data<T>();
    T* vals = values.data<T>();
    int64_t* idx = indices.data<int64_t>();
    std::vector<C> best(static_cast<size_t>(inner));
    for (int64_t o = 0; o < outer; ++o) {
      const T* slab = x + o * n * inner;
      int64_t* bi = idx + o * inner;
      for (int64_t j = 0; j < inner; ++j) {
        best[static_cast<size_t>(j)] = detail::load(slab[j]);
        bi[j] = 0;
      }
      for (int64_t k = 1; k < n; ++k) {
        const T* row = slab + k * inner;
        for (int64_t j = 0; j < inner; ++j) {
          const C v = detail::load(row[j]);
          C& b = best[static_cast<size_t>(j)];
          if (!(b != b) && (v > b || v != v)) {
            b = v;
            bi[j] = k;
          }
        }
      }
      for (int64_t j = 0; j < inner; ++j) vals[o * inner + j] = detail::store<T>(best[static_cast<size_t>(j)]);
    }
  });
}

}  // namespace ringtrain::kernels::cpu
