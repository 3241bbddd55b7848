#include "comm/reduce.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#if defined(__AVX2__) || defined(__F16C__)
#include <immintrin.h>
#elif defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace ringtrain::comm {

namespace {

// max/min that propagate NaN whichever side it is on (as the tensor ops do). std::max(a, b)
// returns a when the comparison fails, so max(NaN, 1) = NaN but max(1, NaN) = 1: in
// recursive doubling each partner combines (own, incoming), so ranks would disagree.
// A NaN result is the canonical quiet NaN (NaNs from different sources differ in sign and
// payload), so these are commutative to the bit and every rank ends with the same bits.
template <typename C>
inline C nan_max(C a, C b) {
  if constexpr (std::is_floating_point_v<C>) {
    if (a != a || b != b) return std::numeric_limits<C>::quiet_NaN();
  }
  return a < b ? b : a;
}
template <typename C>
inline C nan_min(C a, C b) {
  if constexpr (std::is_floating_point_v<C>) {
    if (a != a || b != b) return std::numeric_limits<C>::quiet_NaN();
  }
  return b < a ? b : a;
}

template <typename C>
inline C combine(C a, C b, ReduceOp op) {
  // Integer sums and products wrap around (two's complement), as MPI's and NCCL's do,
  // instead of being signed overflow, which is undefined behaviour in C++ (dtype.h).
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg: return wrapping_add(a, b);
    case ReduceOp::kProd: return wrapping_mul(a, b);
    case ReduceOp::kMax: return nan_max(a, b);
    case ReduceOp::kMin: return nan_min(a, b);
  }
  return a;
}

// One loop per (type, op) so the compiler sees a fixed operation and vectorizes it.
template <typename T, ReduceOp kOp>
void reduce_loop(T* __restrict dst, const T* __restrict a, const T* __restrict b, size_t count) {
  using C = typename ComputeType<T>::type;
  for (size_t i = 0; i < count; ++i) {
    C value = combine<C>(static_cast<C>(a[i]), static_cast<C>(b[i]), kOp);
    dst[i] = T(value);
  }
}

// 16-bit floats are combined in float, rounded once per combine. The conversions are
// inline here: Half's and BFloat16's own (tensor/dtype.cc, out of line so that dtype.h
// need not include Eigen) cost three calls per element, which made an f16 sum 30x
// slower per element than an f32 one. Both round to nearest even exactly as those do:
// F16C's instructions are what Eigen's half uses on these machines, and the bfloat16
// rounding below is Eigen's (NaN becomes the quiet NaN of its sign). The unit test
// Reduce.InlineSixteenBitConversionsMatchTheDtypeOnes compares them bit for bit.
inline float to_float(BFloat16 v) {
  const uint32_t bits = static_cast<uint32_t>(v.bits) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}
inline BFloat16 to_bfloat16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  BFloat16 out;
  if (f != f) {
    out.bits = static_cast<uint16_t>((bits & 0x80000000u) ? 0xFFC0u : 0x7FC0u);
  } else {
    out.bits = static_cast<uint16_t>((bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16);
  }
  return out;
}
#if defined(__F16C__)
inline float to_float(Half v) { return _cvtsh_ss(v.bits); }
inline Half to_half(float f) {
  Half out;
  out.bits = static_cast<uint16_t>(_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT));
  return out;
}
#else
inline float to_float(Half v) { return static_cast<float>(v); }
inline Half to_half(float f) { return Half(f); }
#endif
template <typename T>
inline T from_float(float f) {
  if constexpr (std::is_same_v<T, Half>) return to_half(f);
  else return to_bfloat16(f);
}

template <typename T, ReduceOp kOp>
void reduce_loop_16(T* dst, const T* a, const T* b, size_t count) {
  size_t i = 0;
#if defined(__F16C__) && defined(__AVX__)
  if constexpr (std::is_same_v<T, Half> && (kOp == ReduceOp::kSum || kOp == ReduceOp::kProd)) {
    // Eight at a time: widen, add (or multiply) in float, round back (the same rounding
    // as to_half). dst may alias a (reduce_into): each block is loaded before it is stored.
    for (; i + 8 <= count; i += 8) {
      const __m256 x = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a + i)));
      const __m256 y = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + i)));
      const __m256 r = kOp == ReduceOp::kSum ? _mm256_add_ps(x, y) : _mm256_mul_ps(x, y);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), _mm256_cvtps_ph(r, _MM_FROUND_TO_NEAREST_INT));
    }
  }
#endif
  for (; i < count; ++i) dst[i] = from_float<T>(combine<float>(to_float(a[i]), to_float(b[i]), kOp));
}

template <typename T>
void reduce_typed(T* dst, const T* a, const T* b, size_t count, ReduceOp op) {
  constexpr bool k16 = std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>;
  auto run = [&](auto op_tag) {
    constexpr ReduceOp kOp = decltype(op_tag)::value;
    if constexpr (k16) {
      reduce_loop_16<T, kOp>(dst, a, b, count);
    } else {
      reduce_loop<T, kOp>(dst, a, b, count);
    }
  };
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg: run(std::integral_constant<ReduceOp, ReduceOp::kSum>{}); break;
    case ReduceOp::kProd: run(std::integral_constant<ReduceOp, ReduceOp::kProd>{}); break;
    case ReduceOp::kMax: run(std::integral_constant<ReduceOp, ReduceOp::kMax>{}); break;
    case ReduceOp::kMin: run(std::integral_constant<ReduceOp, ReduceOp::kMin>{}); break;
  }
}

}  // namespace

void reduce_into3(void* dst, const void* a, const void* b, size_t count, DType dtype,
                  ReduceOp op) {
  dispatch_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    reduce_typed<T>(static_cast<T*>(dst), static_cast<const T*>(a), static_cast<const T*>(b),
                    count, op);
  });
}

void reduce_into(void* dst, const void* src, size_t count, DType dtype, ReduceOp op) {
  if (dtype == DType::kFloat16 || dtype == DType::kBFloat16) {
    reduce_into3(dst, dst, src, count, dtype, op);  // the 16-bit loops allow dst == a
    return;
  }
  // dst aliases a: element i is read before it is written, so the in-place form is safe
  // even though the loop's pointers are declared restrict only for the 3-operand kernel
  // (here dst == a, which the loops handle since each index is independent).
  dispatch_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    using C = typename ComputeType<T>::type;
    T* d = static_cast<T*>(dst);
    const T* s = static_cast<const T*>(src);
    auto loop = [&](auto fn) {
      for (size_t i = 0; i < count; ++i) d[i] = T(fn(static_cast<C>(d[i]), static_cast<C>(s[i])));
    };
    switch (op) {  // the same operations as combine(): wrapping integers, NaN-propagating max/min
      case ReduceOp::kSum:
      case ReduceOp::kAvg: loop([](C x, C y) { return wrapping_add(x, y); }); break;
      case ReduceOp::kProd: loop([](C x, C y) { return wrapping_mul(x, y); }); break;
      case ReduceOp::kMax: loop([](C x, C y) { return nan_max(x, y); }); break;
      case ReduceOp::kMin: loop([](C x, C y) { return nan_min(x, y); }); break;
    }
  });
}

void scale_for_average(void* data, size_t count, DType dtype, int world_size) {
  dispatch_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    using C = typename ComputeType<T>::type;
    T* d = static_cast<T*>(data);
    C n = static_cast<C>(world_size);
    if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>) {
      for (size_t i = 0; i < count; ++i) d[i] = from_float<T>(to_float(d[i]) / n);
    } else {
      for (size_t i = 0; i < count; ++i) d[i] = T(static_cast<C>(d[i]) / n);
    }
  });
}

namespace inline_conversion {
float sixteen_bit_to_float(uint16_t bits, DType dtype) {
  Half h;
  BFloat16 b;
  h.bits = b.bits = bits;
  return dtype == DType::kFloat16 ? to_float(h) : to_float(b);
}
uint16_t float_to_sixteen_bit(float value, DType dtype) {
  return dtype == DType::kFloat16 ? to_half(value).bits : to_bfloat16(value).bits;
}
}  // namespace inline_conversion

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return "sum";
    case ReduceOp::kAvg: return "avg";
    case ReduceOp::kMax: return "max";
    case ReduceOp::kMin: return "min";
    case ReduceOp::kProd: return "prod";
  }
  return "?";
}

ReduceOp parse_reduce_op(const std::string& name) {
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax, ReduceOp::kMin,
                      ReduceOp::kProd}) {
    if (name == reduce_op_name(op)) return op;
  }
  throw CommError("unknown reduce op '" + name + "' (expected sum, avg, max, min or prod)");
}

const char* collective_op_name(CollectiveOp op) {
  switch (op) {
    case CollectiveOp::kAllreduce: return "allreduce";
    case CollectiveOp::kBroadcast: return "broadcast";
    case CollectiveOp::kReduce: return "reduce";
    case CollectiveOp::kAllgather: return "allgather";
    case CollectiveOp::kReduceScatter: return "reduce_scatter";
    case CollectiveOp::kAllToAll: return "all_to_all";
    case CollectiveOp::kBarrier: return "barrier";
    case CollectiveOp::kSend: return "send";
    case CollectiveOp::kRecv: return "recv";
  }
  return "?";
}

namespace {

// The vector body of both copies: whole groups of four vectors (AVX2: 4 x 32 bytes, SSE2:
// 4 x 16) from offset i while they fit; returns where it stopped. kStream: non-temporal
// stores, which need `out + i` aligned to the vector size.
template <bool kStream>
size_t copy_vector_groups(char* out, const char* in, size_t i, size_t n) {
#if defined(__AVX2__)
  for (; i + 128 <= n; i += 128) {
    __m256i v[4];
    for (int k = 0; k < 4; ++k) v[k] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(in + i + 32 * k));
    for (int k = 0; k < 4; ++k) {
      auto* to = reinterpret_cast<__m256i*>(out + i + 32 * k);
      if constexpr (kStream) {
        _mm256_stream_si256(to, v[k]);
      } else {
        _mm256_storeu_si256(to, v[k]);
      }
    }
  }
#elif defined(__SSE2__)
  for (; i + 64 <= n; i += 64) {
    __m128i v[4];
    for (int k = 0; k < 4; ++k) v[k] = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i + 16 * k));
    for (int k = 0; k < 4; ++k) {
      auto* to = reinterpret_cast<__m128i*>(out + i + 16 * k);
      if constexpr (kStream) {
        _mm_stream_si128(to, v[k]);
      } else {
        _mm_storeu_si128(to, v[k]);
      }
    }
  }
#endif
  return i;
}

}  // namespace

void copy_bytes(void* dst, const void* src, size_t n) {
  char* out = static_cast<char*>(dst);
  const char* in = static_cast<const char*>(src);
  const size_t i = copy_vector_groups<false>(out, in, 0, n);
  // the tail (and everything on a CPU without the vector paths): a short memcpy
  if (i < n) std::memcpy(out + i, in + i, n - i);
}

void copy_bytes_streaming(void* dst, const void* src, size_t n) {
#if defined(__SSE2__)
  char* out = static_cast<char*>(dst);
  const char* in = static_cast<const char*>(src);
  // Streaming stores need an aligned destination: ordinary stores up to the first
  // 32-byte boundary, then whole vectors, then the tail.
  size_t i = std::min(n, (32 - reinterpret_cast<uintptr_t>(out) % 32) % 32);
  std::memcpy(out, in, i);
  i = copy_vector_groups<true>(out, in, i, n);
  if (i < n) std::memcpy(out + i, in + i, n - i);
  // Streaming stores are weakly ordered, even against a later release store: without
  // the fence the peer could see the slot published before its bytes arrive.
  _mm_sfence();
#else
  copy_bytes(dst, src, n);
#endif
}

}  // namespace ringtrain::comm
