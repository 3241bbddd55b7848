// dtype.h: the element types a Tensor (and a collective buffer) can hold.
//
// defines: DType, dtype_size, dtype_name, parse_dtype, is_floating_point,
//          is_reduced_precision_float, accumulation_dtype,
//          Half/BFloat16 storage types with float conversions, dispatch_dtype,
//          saturating_float_to_int and the wrapping_* integer arithmetic that
//          every CPU and CUDA kernel shares.
//
// Half and BFloat16 are 16-bit storage types with the same bit layout as CUDA's
// __half / __nv_bfloat16 and Eigen::half / Eigen::bfloat16. Arithmetic on them
// always goes through float (compute in f32, round on store), which is what
// both PyTorch's CPU kernels and cuBLAS with f32 accumulation do.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <limits>
#include <string_view>
#include <type_traits>

namespace ringtrain {

enum class DType : uint8_t { kFloat32, kFloat64, kFloat16, kBFloat16, kInt32, kInt64 };

inline constexpr DType kAllDTypes[] = {DType::kFloat32, DType::kFloat64, DType::kFloat16,
                                       DType::kBFloat16, DType::kInt32, DType::kInt64};

size_t dtype_size(DType dtype);
// "float32", "float64", "float16", "bfloat16", "int32", "int64".
const char* dtype_name(DType dtype);
// Accepts the names above and the usual short forms (f32, fp32, half, bf16, int, long...).
// Throws std::invalid_argument listing the accepted names.
DType parse_dtype(std::string_view name);
bool is_floating_point(DType dtype);
// float16 or bfloat16: the dtypes with 16-bit storage and an 8-bit or 11-bit
// significand, which mixed precision computes in and must not accumulate in.
bool is_reduced_precision_float(DType dtype);
// The dtype sums of `dtype` values are taken in before rounding back once: float32 for
// float16/bfloat16 (their sums pass 65504 long before their means do), else `dtype`.
DType accumulation_dtype(DType dtype);

// IEEE binary16 storage. Conversions round to nearest even.
struct Half {
  uint16_t bits = 0;
  Half() = default;
  explicit Half(float value);
  explicit operator float() const;
};

// bfloat16 storage: the top 16 bits of an f32. Conversions round to nearest even.
struct BFloat16 {
  uint16_t bits = 0;
  BFloat16() = default;
  explicit BFloat16(float value);
  explicit operator float() const;
};

float half_bits_to_float(uint16_t bits);
uint16_t float_to_half_bits(float value);
float bfloat16_bits_to_float(uint16_t bits);
uint16_t float_to_bfloat16_bits(float value);

inline Half::Half(float value) : bits(float_to_half_bits(value)) {}
inline Half::operator float() const { return half_bits_to_float(bits); }
inline BFloat16::BFloat16(float value) : bits(float_to_bfloat16_bits(value)) {}
inline BFloat16::operator float() const { return bfloat16_bits_to_float(bits); }

// Float -> integer conversion with a defined result for every input (a plain
// static_cast is undefined behaviour for NaN, inf and out-of-range values): the
// value is truncated toward zero, saturated to [min, max] of I, and NaN gives 0.
// Every float -> int32/int64 conversion in the CPU kernels goes through this
// (copy/to(), fill/full, masked_fill, tensor-scalar ops); it is
// also what CUDA's cvt.rzi instruction does, so both devices agree.
template <typename I, typename F>
constexpr I saturating_float_to_int(F v) {
  static_assert(std::is_integral_v<I> && std::is_signed_v<I> && std::is_floating_point_v<F>);
  if (v != v) return I(0);
  // 2^digits (2^31 or 2^63) is exact in every float type; max() itself may not be.
  constexpr F kLimit = static_cast<F>(I(1) << (std::numeric_limits<I>::digits - 1)) * F(2);
  if (v >= kLimit) return std::numeric_limits<I>::max();
  if (v <= -kLimit) return std::numeric_limits<I>::min();
  return static_cast<I>(v);
}

// Two's-complement arithmetic: for signed integers, add/sub/mul/neg wrap around on
// overflow (INT_MAX + 1 == INT_MIN, -INT_MIN == INT_MIN), as PyTorch, numpy, MPI and
// NCCL give, instead of being undefined behaviour (which the optimizer may exploit).
// The work is done in the unsigned type, where wrap-around is defined. For any other
// T they are the plain operators, so a kernel templated on the element type calls
// them for every dtype. One definition for the CPU elementwise, reduction and
// collective kernels and their CUDA counterparts (constexpr: device code may call it).
template <typename T>
constexpr bool kWrapsInUnsigned = std::is_integral_v<T> && std::is_signed_v<T>;

template <typename T>
constexpr T wrapping_add(T a, T b) {
  if constexpr (kWrapsInUnsigned<T>) {
    using U = std::make_unsigned_t<T>;
    static_assert(sizeof(U) >= sizeof(unsigned), "narrow types would promote back to int");
    return static_cast<T>(static_cast<U>(a) + static_cast<U>(b));
  } else {
    return a + b;
  }
}

template <typename T>
constexpr T wrapping_sub(T a, T b) {
  if constexpr (kWrapsInUnsigned<T>) {
    using U = std::make_unsigned_t<T>;
    static_assert(sizeof(U) >= sizeof(unsigned), "narrow types would promote back to int");
    return static_cast<T>(static_cast<U>(a) - static_cast<U>(b));
  } else {
    return a - b;
  }
}

template <typename T>
constexpr T wrapping_mul(T a, T b) {
  if constexpr (kWrapsInUnsigned<T>) {
    using U = std::make_unsigned_t<T>;
    static_assert(sizeof(U) >= sizeof(unsigned), "narrow types would promote back to int");
    return static_cast<T>(static_cast<U>(a) * static_cast<U>(b));
  } else {
    return a * b;
  }
}

template <typename T>
constexpr T wrapping_neg(T v) {
  return wrapping_sub(T(0), v);
}

// |v|, with |INT_MIN| == INT_MIN as in PyTorch and numpy.
template <typename T>
constexpr T wrapping_abs(T v) {
  return v < T(0) ? wrapping_neg(v) : v;
}

// Integer a / b with b != 0 (the caller checks): a / -1 is negation, so INT_MIN / -1 wraps
// to INT_MIN instead of trapping (SIGFPE on x86).
template <typename T>
constexpr T wrapping_div(T a, T b) {
  if constexpr (kWrapsInUnsigned<T>) {
    if (b == T(-1)) return wrapping_neg(a);
  }
  return a / b;
}

// Integer a ** b, exact and wrapping like the products it is made of (as PyTorch computes
// integer pow): 3 ** 39 in int64 is 4052555153018976267, which a detour through double
// (53-bit significand) would miss. A negative exponent gives the real result truncated
// toward zero: 1 ** b == 1, (-1) ** b == +-1, and 0 for every other base (0 included).
// Square-and-multiply: at most 2 * 64 multiplies.
template <typename T>
constexpr T wrapping_pow(T base, T exponent) {
  static_assert(std::is_integral_v<T>, "wrapping_pow is for integer dtypes");
  if (exponent < T(0)) {
    if (base == T(1)) return T(1);
    if (base == T(-1)) return (exponent % T(2) == T(0)) ? T(1) : T(-1);
    return T(0);
  }
  T result = T(1);
  while (exponent > T(0)) {
    if (exponent & T(1)) result = wrapping_mul(result, base);
    exponent >>= 1;
    if (exponent > T(0)) base = wrapping_mul(base, base);
  }
  return result;
}

// The C++ type stored for each DType.
template <DType D> struct DTypeTraits;
template <> struct DTypeTraits<DType::kFloat32> { using type = float; };
template <> struct DTypeTraits<DType::kFloat64> { using type = double; };
template <> struct DTypeTraits<DType::kFloat16> { using type = Half; };
template <> struct DTypeTraits<DType::kBFloat16> { using type = BFloat16; };
template <> struct DTypeTraits<DType::kInt32> { using type = int32_t; };
template <> struct DTypeTraits<DType::kInt64> { using type = int64_t; };

template <typename T> constexpr DType dtype_of();
template <> constexpr DType dtype_of<float>() { return DType::kFloat32; }
template <> constexpr DType dtype_of<double>() { return DType::kFloat64; }
template <> constexpr DType dtype_of<Half>() { return DType::kFloat16; }
template <> constexpr DType dtype_of<BFloat16>() { return DType::kBFloat16; }
template <> constexpr DType dtype_of<int32_t>() { return DType::kInt32; }
template <> constexpr DType dtype_of<int64_t>() { return DType::kInt64; }

// The type arithmetic is done in for a storage type: float for the 16-bit
// floats, the type itself otherwise.
template <typename T> struct ComputeType { using type = T; };
template <> struct ComputeType<Half> { using type = float; };
template <> struct ComputeType<BFloat16> { using type = float; };

// Calls fn(T{}) with T the storage type of `dtype`:
//   dispatch_dtype(t.dtype(), [&](auto tag) { using T = decltype(tag); ... });
template <typename Fn>
decltype(auto) dispatch_dtype(DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::kFloat32: return fn(float{});
    case DType::kFloat64: return fn(double{});
    case DType::kFloat16: return fn(Half{});
    case DType::kBFloat16: return fn(BFloat16{});
    case DType::kInt32: return fn(int32_t{});
    case DType::kInt64: return fn(int64_t{});
  }
  return fn(float{});  // unreachable: every enumerator is handled above
}

}  // namespace ringtrain
