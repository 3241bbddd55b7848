#include "tensor/dtype.h"

#include <Eigen/Core>
#include <stdexcept>

namespace ringtrain {

size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return 4;
    case DType::kFloat64: return 8;
    case DType::kFloat16: return 2;
    case DType::kBFloat16: return 2;
    case DType::kInt32: return 4;
    case DType::kInt64: return 8;
  }
  throw std::invalid_argument("dtype_size: unknown DType value " +
                              std::to_string(static_cast<int>(dtype)));
}

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return "float32";
    case DType::kFloat64: return "float64";
    case DType::kFloat16: return "float16";
    case DType::kBFloat16: return "bfloat16";
    case DType::kInt32: return "int32";
    case DType::kInt64: return "int64";
  }
  return "unknown";
}

DType parse_dtype(std::string_view name) {
  if (name == "float32" || name == "f32" || name == "fp32" || name == "float") return DType::kFloat32;
  if (name == "float64" || name == "f64" || name == "fp64" || name == "double") return DType::kFloat64;
  if (name == "float16" || name == "f16" || name == "fp16" || name == "half") return DType::kFloat16;
  if (name == "bfloat16" || name == "bf16") return DType::kBFloat16;
  if (name == "int32" || name == "i32" || name == "int") return DType::kInt32;
  if (name == "int64" || name == "i64" || name == "long") return DType::kInt64;
  throw std::invalid_argument("parse_dtype: unknown dtype '" + std::string(name) +
                              "'; expected one of float32, float64, float16, bfloat16, int32, int64");
}

bool is_reduced_precision_float(DType dtype) {
  return dtype == DType::kFloat16 || dtype == DType::kBFloat16;
}

DType accumulation_dtype(DType dtype) { return is_reduced_precision_float(dtype) ? DType::kFloat32 : dtype; }

bool is_floating_point(DType dtype) {
  return dtype == DType::kFloat32 || dtype == DType::kFloat64 || dtype == DType::kFloat16 ||
         dtype == DType::kBFloat16;
}

// The rounding itself is Eigen's (round to nearest even, NaN and inf kept).
float half_bits_to_float(uint16_t bits) {
  return static_cast<float>(Eigen::numext::bit_cast<Eigen::half>(bits));
}
uint16_t float_to_half_bits(float value) {
  return Eigen::numext::bit_cast<uint16_t>(Eigen::half(value));
}
float bfloat16_bits_to_float(uint16_t bits) {
  return static_cast<float>(Eigen::numext::bit_cast<Eigen::bfloat16>(bits));
}
uint16_t float_to_bfloat16_bits(float value) {
  return Eigen::numext::bit_cast<uint16_t>(Eigen::bfloat16(value));
}

}  // namespace ringtrain
