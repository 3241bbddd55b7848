// loops.h: shared machinery of the CPU kernels (private to tensor/cpu/*.cc).
//
// defines: fast scalar conversions between the storage types and their compute
//          types (Half/BFloat16 <-> float with F16C when the build has it),
//          bulk conversions of runs of 16-bit floats, apply_vectorized (Eigen
//          array functions with every element on the SIMD path), and StridedLoop:
//          the N-d iterator every elementwise-style kernel is built on.
//
// StridedLoop takes a shape and, for each of N operands, strides in elements. It
// drops size-1 dims, optionally orders the dims by one operand's strides (so that
// operand is walked in memory order), and coalesces neighbouring dims that are
// contiguous with each other in *every* operand: a contiguous [64, 128, 256]
// tensor becomes one run of 2M elements, a transposed view stays 2-D. The kernel
// sees only the innermost run: inner(ptrs, byte_strides, n), so it can pick a
// tight loop when every stride equals the element size (GCC vectorises those)
// and a scalar strided loop otherwise. Cost: one call per innermost run, plus an
// odometer step over the outer dims.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <type_traits>
#include <vector>

#if defined(__F16C__)
#include <immintrin.h>
#endif

#include <Eigen/Core>

#include "tensor/dtype.h"
#include "tensor/tensor.h"

namespace ringtrain::kernels::cpu::detail {

// ---------------------------------------------------------------- scalar conversions

inline float half_to_float(Half h) {
#if defined(__F16C__)
  return _cvtsh_ss(h.bits);
#else
  return half_bits_to_float(h.bits);
#endif
}
inline Half float_to_half(float f) {
  Half h;
#if defined(__F16C__)
  h.bits = static_cast<uint16_t>(_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT));
#else
  h.bits = float_to_half_bits(f);
#endif
  return h;
}
inline float bf16_to_float(BFloat16 b) {
  uint32_t u = static_cast<uint32_t>(b.bits) << 16;
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}
// Round to nearest even; NaN stays a (quiet) NaN.
inline BFloat16 float_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  BFloat16 b;
  if ((u & 0x7fffffffu) > 0x7f800000u) {
    b.bits = static_cast<uint16_t>((u >> 16) | 0x40u);
  } else {
    u += 0x7fffu + ((u >> 16) & 1u);
    b.bits = static_cast<uint16_t>(u >> 16);
  }
  return b;
}

template <typename T>
inline constexpr bool kIsReduced = std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>;
template <typename T>
inline constexpr bool kIsFloat = kIsReduced<T> || std::is_floating_point_v<T>;

template <typename T>
using Compute = typename ComputeType<T>::type;

// Storage -> compute type.
template <typename T>
inline Compute<T> load(T v) {
  if constexpr (std::is_same_v<T, Half>) return half_to_float(v);
  else if constexpr (std::is_same_v<T, BFloat16>) return bf16_to_float(v);
  else return v;
}
// Any arithmetic value -> storage type (through float for the 16-bit floats).
// Float -> integer saturates and maps NaN to 0 (saturating_float_to_int, dtype.h);
// integer -> narrower integer wraps (two's complement, defined in C++20).
template <typename T, typename V>
inline T store(V v) {
  if constexpr (std::is_same_v<T, Half>) return float_to_half(static_cast<float>(v));
  else if constexpr (std::is_same_v<T, BFloat16>) return float_to_bf16(static_cast<float>(v));
  else if constexpr (std::is_integral_v<T> && std::is_floating_point_v<V>)
    return saturating_float_to_int<T>(v);
  else return static_cast<T>(v);
}
// Any storage type -> any storage type.
template <typename D, typename S>
inline D convert(S s) {
  if constexpr (std::is_same_v<D, S>) return s;
  else return store<D>(load(s));
}

// ---------------------------------------------------------------- bulk conversions
// n values with element strides (1 = contiguous) between a storage type and its compute type.

template <typename T>
inline void load_run(const T* src, int64_t stride, Compute<T>* dst, int64_t n) {
  int64_t i = 0;
#if defined(__F16C__) && defined(__AVX__)
  if constexpr (std::is_same_v<T, Half>) {
    if (stride == 1) {
      for (; i + 8 <= n; i += 8) {
        __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(h));
      }
    }
  }
#endif
  if constexpr (std::is_same_v<T, BFloat16>) {
    if (stride == 1) {
      const uint16_t* s = reinterpret_cast<const uint16_t*>(src);
      for (; i < n; ++i) {
        uint32_t u = static_cast<uint32_t>(s[i]) << 16;
        std::memcpy(dst + i, &u, sizeof(float));
      }
    }
  }
  for (; i < n; ++i) dst[i] = load(src[i * stride]);
}

template <typename T>
inline void store_run(const Compute<T>* src, T* dst, int64_t stride, int64_t n) {
  int64_t i = 0;
#if defined(__F16C__) && defined(__AVX__)
  if constexpr (std::is_same_v<T, Half>) {
    if (stride == 1) {
      for (; i + 8 <= n; i += 8) {
        __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT);
        _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), h);
      }
    }
  }
#endif
  for (; i < n; ++i) dst[i * stride] = store<T>(src[i]);
}

// ---------------------------------------------------------------- Eigen array functions

// Computes y[0..n) = f(x[0..n)) with an Eigen array expression so that *every* element goes
// through Eigen's packet (SIMD) functions. Left to itself Eigen evaluates the elements before
// the first aligned address of y, and the tail after the last full packet, with the scalar
// functions (std::exp, ...), which round differently from the packet ones (pexp, ...): the
// result would then depend on an element's position and on where the heap put a buffer, and
// a resumed training run would diverge bitwise from an uninterrupted one. So: the bulk is
// mapped directly when y is 32-byte aligned (tensor storage is 64-byte aligned), everything
// else goes through an aligned, zero-padded block of kVecBlock elements.
// f is called as f(Map<const Array> x, Map<Array, Aligned32> y), e.g. [](auto x, auto y) { y = x.exp(); }.
template <typename C, typename F>
void apply_vectorized(const C* x, C* y, int64_t n, F&& f) {
  using A = Eigen::Array<C, Eigen::Dynamic, 1>;
  using In = Eigen::Map<const A>;
  using Out = Eigen::Map<A, Eigen::Aligned32>;
  constexpr int64_t kVecBlock = 256;  // a multiple of every packet size
  int64_t body = 0;
  if (reinterpret_cast<uintptr_t>(y) % 32 == 0) {
    body = n / kVecBlock * kVecBlock;
    if (body > 0) f(In(x, body), Out(y, body));
  }
  alignas(64) C xb[kVecBlock];
  alignas(64) C yb[kVecBlock];
  for (int64_t i0 = body; i0 < n; i0 += kVecBlock) {
    const int64_t m = std::min(kVecBlock, n - i0);
    std::copy(x + i0, x + i0 + m, xb);
    std::fill(xb + m, xb + kVecBlock, C(0));
    f(In(xb, kVecBlock), Out(yb, kVecBlock));
    std::copy(yb, yb + m, y + i0);
  }
}

// Eigen's packet exp (pexp) clamps its argument to [-88.72, 88.72] for float and
// [-709.78, 709.78] for double, so exp(-inf) came out as 2.9e-39 (float) instead of 0, and
// exp(-100.f) as 2.9e-39 instead of 3.7e-44. Below kExpNormalLow (a little above the log of the
// smallest normal number, where Eigen's results are still exact to its usual ulp) the results
// are subnormal or zero; those elements are recomputed with std::exp (apply_packet_fixing_low).
// The choice is by value, never by position, so the result stays independent of alignment.
template <typename C>
inline constexpr C kExpNormalLow = std::is_same_v<C, float> ? C(-87.0) : C(-708.0);

// y[0..n) = Functor's packet function of x[0..n) (an Eigen functor, e.g.
// Eigen::internal::scalar_exp_op<C>: the function Y = X.exp() uses, so the results are
// those of apply_vectorized), with the elements whose input is below `low` recomputed
// by exact() (std::exp ...): Eigen's packet exp clamps its argument (kExpNormalLow).
// One pass over memory: each packet's lanes are compared with `low` and the
// comparisons OR-ed into one flag per block of kVecBlock elements; only a flagged
// block (rare) is walked again, from x, which therefore must still hold the inputs:
// when y overlaps x (in place), each block is computed into a buffer first.
// The tail goes through a zero-padded block, every element on the packet path.
// Measured on 16 M floats (Zen 5): a packet pass, then a scalar search over all of x,
// 8.6-12 ms; with a vectorised search 6 ms; a compare and branch per packet 4.1 ms;
// this, 3.0-3.3 ms, as fast as the packet exp alone and as relu. noinline: inlined
// into the big switch of unary_contiguous, GCC kept the polynomial's constants on
// the stack and the same loop took 6.4 ms.
template <typename Functor, typename C, typename Exact>
[[gnu::noinline]] void apply_packet_fixing_low(const C* x, C* y, int64_t n, C low, Exact&& exact) {
  using namespace Eigen::internal;
  using P = typename packet_traits<C>::type;
  constexpr int64_t kP = unpacket_traits<P>::size;
  constexpr int64_t kVecBlock = 256;  // a multiple of every packet size
  const Functor op;
  // One block: out[0..kVecBlock) from in[0..kVecBlock); returns whether a lane was low.
  auto block = [&op, low](const C* in, C* out) {
    const P low_p = pset1<P>(low);
    P flag = pzero(low_p);
    for (int64_t i = 0; i < kVecBlock; i += kP) {
      const P v = ploadu<P>(in + i);
      pstoreu(out + i, op.packetOp(v));
      flag = por(flag, pcmp_lt(v, low_p));
    }
    return predux_any(flag);
  };
  auto mend = [&](const C* in, C* out, int64_t m) {
    for (int64_t i = 0; i < m; ++i)
      if (in[i] < low) out[i] = exact(in[i]);
  };
  const bool in_place = !(y + n <= x || x + n <= y);
  alignas(64) C buffer[kVecBlock];
  int64_t i0 = 0;
  if (!in_place) {
    for (; i0 + kVecBlock <= n; i0 += kVecBlock) {
      if (block(x + i0, y + i0)) mend(x + i0, y + i0, kVecBlock);
    }
  } else {
    for (; i0 + kVecBlock <= n; i0 += kVecBlock) {
      if (block(x + i0, buffer)) mend(x + i0, buffer, kVecBlock);
      std::copy(buffer, buffer + kVecBlock, y + i0);
    }
  }
  const int64_t m = n - i0;
  if (m == 0) return;
  alignas(64) C padded[kVecBlock] = {};
  std::copy(x + i0, x + n, padded);
  if (block(padded, buffer)) mend(padded, buffer, m);
  std::copy(buffer, buffer + m, y + i0);
}

// ---------------------------------------------------------------- the strided loop

template <int N>
class StridedLoop {
 public:
  // `strides[k]` are operand k's strides in elements for `shape`; elem_size[k] its element size.
  // sort_by >= 0 orders the dims by that operand's |stride|, largest outermost.
  StridedLoop(const Shape& shape, const std::array<const Shape*, N>& strides,
              const std::array<int64_t, N>& elem_size, int sort_by = -1) {
    std::vector<int64_t> dims;
    for (size_t d = 0; d < shape.size(); ++d) {
      if (shape[d] != 1) dims.push_back(static_cast<int64_t>(d));
    }
    if (sort_by >= 0) {
      const Shape& s = *strides[static_cast<size_t>(sort_by)];
      std::stable_sort(dims.begin(), dims.end(), [&](int64_t x, int64_t y) {
        return std::abs(s[static_cast<size_t>(x)]) > std::abs(s[static_cast<size_t>(y)]);
      });
    }
    for (int64_t d : dims) {
      shape_.push_back(shape[static_cast<size_t>(d)]);
      for (int k = 0; k < N; ++k) {
        strides_[k].push_back((*strides[k])[static_cast<size_t>(d)] * elem_size[k]);
      }
    }
    // Coalesce: dim i (outer) merges into i+1 (inner) when stride[i] == stride[i+1] * shape[i+1]
    // for every operand. Walk from the inside out, building the result innermost-first.
    std::vector<int64_t> cshape;
    std::array<std::vector<int64_t>, N> cstrides;
    for (int64_t i = static_cast<int64_t>(shape_.size()) - 1; i >= 0; --i) {
      bool merge = !cshape.empty();
      for (int k = 0; k < N && merge; ++k) {
        merge = strides_[k][static_cast<size_t>(i)] == cstrides[k].back() * cshape.back();
      }
      if (merge) {
        cshape.back() *= shape_[static_cast<size_t>(i)];
      } else {
        cshape.push_back(shape_[static_cast<size_t>(i)]);
        for (int k = 0; k < N; ++k) cstrides[k].push_back(strides_[k][static_cast<size_t>(i)]);
      }
    }
    if (cshape.empty()) {  // a single element
      cshape.push_back(1);
      for (int k = 0; k < N; ++k) cstrides[k].push_back(0);
    }
    std::reverse(cshape.begin(), cshape.end());
    for (int k = 0; k < N; ++k) std::reverse(cstrides[k].begin(), cstrides[k].end());
    shape_ = std::move(cshape);
    strides_ = std::move(cstrides);
  }

  int64_t ndim() const { return static_cast<int64_t>(shape_.size()); }
  int64_t inner_size() const { return shape_.back(); }
  int64_t inner_stride(int k) const { return strides_[k].back(); }

  // inner(std::array<char*, N> ptrs, const std::array<int64_t, N>& byte_strides, int64_t n)
  // for every innermost run. Callers skip numel == 0.
  template <typename F>
  void run(std::array<char*, N> base, F&& inner) const {
    const int64_t nd = ndim();
    const int64_t n = shape_.back();
    std::array<int64_t, N> in_strides;
    for (int k = 0; k < N; ++k) in_strides[k] = strides_[k].back();
    if (nd == 1) {
      inner(base, in_strides, n);
      return;
    }
    std::vector<int64_t> counter(static_cast<size_t>(nd - 1), 0);
    std::array<char*, N> ptrs = base;
    while (true) {
      inner(ptrs, in_strides, n);
      int64_t d = nd - 2;
      for (; d >= 0; --d) {
        const size_t ud = static_cast<size_t>(d);
        if (++counter[ud] < shape_[ud]) {
          for (int k = 0; k < N; ++k) ptrs[k] += strides_[k][ud];
          break;
        }
        for (int k = 0; k < N; ++k) ptrs[k] -= strides_[k][ud] * (shape_[ud] - 1);
        counter[ud] = 0;
      }
      if (d < 0) return;
    }
  }

 private:
  std::vector<int64_t> shape_;
  std::array<std::vector<int64_t>, N> strides_;
};

inline char* byte_ptr(const Tensor& t) { return static_cast<char*>(t.data_ptr()); }

}  // namespace ringtrain::kernels::cpu::detail
