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
//     max/min use extreme_of_block (packet accumulators, NaN looked for apart);
//   * "accumulate a run into a run" (reducing an outer dim): acc[i] += x[i].
// A contiguous input whose leading dims are reduced (sum over dim 0 of [R, C]: the
// bias gradient) skips the StridedLoop: reduce_leading_rows combines four input rows
// per pass over the accumulator row, each accumulator still taking its rows in order.
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

// max (or min) of x[0..n), NaN if any element is NaN. Four packet accumulators (pmax
// has a latency of several cycles) and a separate NaN test: x86's max returns one of
// its operands when the other is NaN, so the NaN is looked for, not relied on to
// propagate. Eigen's maxCoeff<PropagateNaN>, before, ran at 29 GB/s on Zen 5 against
// 45-50 for sum. The tail is combined element by element.
template <ReduceOp OP, typename C>
C extreme_of_block(const C* x, int64_t n) {
  using namespace Eigen::internal;
  using P = typename packet_traits<C>::type;
  constexpr int64_t kP = unpacket_traits<P>::size;
  auto pick = [](const P& a, const P& b) { return OP == ReduceOp::kMax ? pmax(a, b) : pmin(a, b); };
  const P start = pset1<P>(identity<OP, C>());
  P m0 = start, m1 = start, m2 = start, m3 = start;
  P all_numbers = ptrue(start);  // lanes stay all-ones while no NaN was seen
  int64_t i = 0;
  for (; i + 4 * kP <= n; i += 4 * kP) {
    const P v0 = ploadu<P>(x + i), v1 = ploadu<P>(x + i + kP);
    const P v2 = ploadu<P>(x + i + 2 * kP), v3 = ploadu<P>(x + i + 3 * kP);
    m0 = pick(m0, v0);
    m1 = pick(m1, v1);
    m2 = pick(m2, v2);
    m3 = pick(m3, v3);
    all_numbers = pand(all_numbers, pand(pand(pcmp_eq(v0, v0), pcmp_eq(v1, v1)), pand(pcmp_eq(v2, v2), pcmp_eq(v3, v3))));
  }
  const P m = pick(pick(m0, m1), pick(m2, m3));
  C s = OP == ReduceOp::kMax ? predux_max(m) : predux_min(m);
  if (predux_any(pcmp_eq(all_numbers, pzero(all_numbers)))) return std::numeric_limits<C>::quiet_NaN();
  for (; i < n; ++i) s = combine<OP, C>(s, x[i]);
  return s;
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
      } else {
        s = combine<OP, A>(s, static_cast<A>(extreme_of_block<OP>(run, m)));
      }
    }
  } else {
    for (int64_t i = 0; i < n; ++i) s = combine<OP, A>(s, static_cast<A>(x[i * xs]));
  }
  return s;
}

// Reducing the leading dims of a contiguous tensor (sum over dim 0 of [R, C], the bias
// gradient's shape): rows of C elements combined into a row of C accumulators. One row
// at a time, the accumulator row (C doubles for a float sum) is loaded and stored once
// per input row, and for C = 4096 it no longer fits in L1 beside the input (24 of 45
// GB/s memcpy on Zen 5); four rows per pass load and store it a quarter as often
// (27-31 GB/s in bench_tensor_ops). Each accumulator still takes its rows one by one, in order, so the
// result is bit for bit the one-row-at-a-time result.
template <ReduceOp OP, typename T>
void reduce_leading_rows(const T* x, int64_t rows, int64_t cols, std::vector<Acc<OP, T>>& acc) {
  using A = Acc<OP, T>;
  A* __restrict a = acc.data();
  auto in = [](T v) { return static_cast<A>(detail::load(v)); };
  int64_t r = 0;
  for (; r + 4 <= rows; r += 4) {
    const T* __restrict x0 = x + r * cols;
    const T* __restrict x1 = x0 + cols;
    const T* __restrict x2 = x1 + cols;
    const T* __restrict x3 = x2 + cols;
    for (int64_t i = 0; i < cols; ++i) {
      a[i] = combine<OP, A>(combine<OP, A>(combine<OP, A>(combine<OP, A>(a[i], in(x0[i])), in(x1[i])), in(x2[i])),
                            in(x3[i]));
    }
  }
  for (; r < rows; ++r) {
    const T* __restrict xr = x + r * cols;
    for (int64_t i = 0; i < cols; ++i) a[i] = combine<OP, A>(a[i], in(xr[i]));
  }
}

// Whether `mask` reduces only leading dims of `in` (size-1 dims aside): then a contiguous
// `in` is [rows, cols] with the rows reduced.
bool reduces_leading_dims(const Tensor& in, const std::vector<bool>& mask, int64_t* rows, int64_t* cols) {
  *rows = 1;
  *cols = 1;
  bool kept_seen = false;
  for (int64_t d = 0; d < in.dim(); ++d) {
    if (in.size(d) == 1) continue;
    if (mask[static_cast<size_t>(d)]) {
      if (kept_seen) return false;
      *rows *= in.size(d);
    } else {
      kept_seen = true;
      *cols *= in.size(d);
    }
  }
  return true;
}

// Any layout, any reduced dims: the StridedLoop walk described at the top.
template <ReduceOp OP, typename T>
void reduce_strided(const Tensor& in, const std::vector<bool>& mask, const Tensor& out, std::vector<Acc<OP, T>>& acc) {
  using A = Acc<OP, T>;
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
}

template <ReduceOp OP, typename T>
void reduce_typed(const Tensor& in, const std::vector<bool>& mask, const Tensor& out) {
  using A = Acc<OP, T>;
  std::vector<A> acc(static_cast<size_t>(out.numel()), identity<OP, A>());
  int64_t rows = 0, cols = 0;
  if (in.numel() > 0 && in.is_contiguous() && reduces_leading_dims(in, mask, &rows, &cols) && rows > 1 &&
      cols >= 16) {
    reduce_leading_rows<OP, T>(in.data<T>(), rows, cols, acc);
  } else {
    reduce_strided<OP, T>(in, mask, out, acc);
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
