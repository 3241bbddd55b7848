// dtype_test.cc: the DType helpers: names and their parsing, sizes, and the
// predicates that decide how a dtype is computed and reduced.
//
// Label: unit.
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>

#include "tensor/dtype.h"

namespace ringtrain {
namespace {

TEST(DType, NamesParseBackToTheSameDType) {
  for (DType dtype : kAllDTypes) EXPECT_EQ(parse_dtype(dtype_name(dtype)), dtype) << dtype_name(dtype);
  EXPECT_EQ(parse_dtype("bf16"), DType::kBFloat16);
  EXPECT_EQ(parse_dtype("half"), DType::kFloat16);
  EXPECT_EQ(parse_dtype("long"), DType::kInt64);
}

TEST(DType, AnUnknownNameListsTheAcceptedOnes) {
  try {
    parse_dtype("float8");
    ADD_FAILURE() << "float8 was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("'float8'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("bfloat16"), std::string::npos) << e.what();
  }
}

TEST(DType, SizesAndKinds) {
  EXPECT_EQ(dtype_size(DType::kFloat32), 4u);
  EXPECT_EQ(dtype_size(DType::kFloat64), 8u);
  EXPECT_EQ(dtype_size(DType::kFloat16), 2u);
  EXPECT_EQ(dtype_size(DType::kBFloat16), 2u);
  EXPECT_EQ(dtype_size(DType::kInt32), 4u);
  EXPECT_EQ(dtype_size(DType::kInt64), 8u);
  for (DType dtype : kAllDTypes) {
    const bool reduced = dtype == DType::kFloat16 || dtype == DType::kBFloat16;
    const bool floating = reduced || dtype == DType::kFloat32 || dtype == DType::kFloat64;
    EXPECT_EQ(is_reduced_precision_float(dtype), reduced) << dtype_name(dtype);
    EXPECT_EQ(is_floating_point(dtype), floating) << dtype_name(dtype);
    EXPECT_EQ(accumulation_dtype(dtype), reduced ? DType::kFloat32 : dtype) << dtype_name(dtype);
  }
}

}  // namespace
}  // namespace ringtrain
