// errors_test.cc: bad input throws an exception whose message names the op and
// the shapes / dtypes / devices involved: never a crash, never a silent broadcast.
#include <string>

#include "tests/tensor/reference.h"

namespace ringtrain {
namespace {

using namespace ref;

TEST(Errors, MismatchedShapesNameOpAndShapes) {
  Tensor a = zeros({2, 3});
  Tensor b = zeros({4, 3});
  EXPECT_TRUE(throws_with([&] { add(a, b); }, {"add", "[2, 3]", "[4, 3]"}));
  EXPECT_TRUE(throws_with([&] { mul(a, zeros({3, 2})); }, {"mul", "[2, 3]", "[3, 2]"}));
  EXPECT_TRUE(throws_with([&] { where(zeros({5}), a, a); }, {"where", "[5]"}));
  // In-place ops never change the destination's shape.
  Tensor row = zeros({1, 3});
  EXPECT_TRUE(throws_with([&] { add_(row, a); }, {"add_", "[1, 3]", "[2, 3]"}));
}

TEST(Errors, MismatchedDtypesNameBoth) {
  Tensor a = zeros({2, 3});
  Tensor b = zeros({2, 3}, DType::kInt64);
  EXPECT_TRUE(throws_with([&] { add(a, b); }, {"add", "float32[2, 3]", "int64[2, 3]"}));
  EXPECT_TRUE(throws_with([&] { where(a, a, b); }, {"where", "float32", "int64"}));
  EXPECT_TRUE(throws_with([&] { gather(a, 1, zeros({2, 1}, DType::kInt32)); }, {"gather", "int64", "int32"}));
}

TEST(Errors, OutOfRangeDims) {
  Tensor a = zeros({2, 3});
  EXPECT_TRUE(throws_with([&] { sum(a, {2}); }, {"sum", "2"}));
  EXPECT_TRUE(throws_with([&] { sum(a, {-3}); }, {"sum", "-3"}));
  EXPECT_TRUE(throws_with([&] { sum(a, {1, 1}); }, {"sum", "twice"}));
  EXPECT_TRUE(throws_with([&] { softmax(a, 5); }, {"softmax", "5"}));
  EXPECT_TRUE(throws_with([&] { max(a, 2); }, {"max", "2"}));
  EXPECT_TRUE(throws_with([&] { a.transpose(0, 2); }, {"transpose", "2"}));
  EXPECT_TRUE(throws_with([&] { a.narrow(1, 2, 2); }, {"narrow", "[2, 3]"}));
  EXPECT_TRUE(throws_with([&] { a.select(0, 2); }, {"select", "2"}));
  EXPECT_TRUE(throws_with([&] { cat({a, a}, 2); }, {"cat", "2"}));
}

TEST(Errors, ViewsThatCannotBeViews) {
  Tensor a = zeros({2, 3});
  EXPECT_TRUE(throws_with([&] { a.t().view({6}); }, {"view", "[3, 2]"}));
  EXPECT_TRUE(throws_with([&] { a.reshape({4, 2}); }, {"reshape", "[2, 3]", "[4, 2]"}));
  EXPECT_TRUE(throws_with([&] { a.view({-1, -1}); }, {"view"}));
  EXPECT_TRUE(throws_with([&] { a.squeeze(2); }, {"squeeze", "2"}));
}

// Shapes whose element or byte count does not fit 64 bits: before, Tensor::empty({2^32, 2^32})
// returned a tensor claiming 0 elements, and reshape({3, 6148914691236517206}) of 2 elements
// passed because 3 * 6148914691236517206 wraps to 2.
TEST(Errors, ShapesWhoseSizeOverflowsAreRejected) {
  const int64_t big = int64_t{1} << 32;
  EXPECT_TRUE(throws_with([&] { Tensor::empty({big, big}, DType::kFloat32); }, {"Tensor::empty", "2^63"}));
  EXPECT_TRUE(throws_with([&] { Tensor::empty({big, big / 2, 2}, DType::kFloat32); }, {"Tensor::empty"}));
  EXPECT_TRUE(throws_with([&] { Tensor::empty({int64_t{1} << 62}, DType::kFloat64); }, {"Tensor::empty"}));
  Tensor two = zeros({2});
  EXPECT_TRUE(throws_with([&] { two.reshape({3, 6148914691236517206}); }, {"reshape", "int64"}));
  EXPECT_TRUE(throws_with([&] { two.view({-1, 3, 6148914691236517206}); }, {"view", "int64"}));
  EXPECT_TRUE(throws_with([&] { shape_numel({big, big, big}); }, {"int64"}));
  // A view that reaches past its storage.
  Tensor four = zeros({4});
  EXPECT_TRUE(throws_with([&] { Tensor::from_storage(four.storage(), {2, 3}, {3, 1}, 0, DType::kFloat32); },
                          {"from_storage", "reach past", "4"}));
  EXPECT_TRUE(throws_with([&] { Tensor::from_storage(four.storage(), {4}, {1}, 1, DType::kFloat32); },
                          {"from_storage"}));
  EXPECT_EQ(Tensor::from_storage(four.storage(), {2, 2}, {1, 2}, 0, DType::kFloat32).numel(), 4);
  EXPECT_EQ(Tensor::empty({0, big, big}, DType::kFloat32).numel(), 0);  // zero elements: fine
}

TEST(Errors, CudaAskedOfACpuOnlyBuild) {
  if (kernels::cuda::is_available()) GTEST_SKIP() << "this build has a usable GPU";
  EXPECT_TRUE(throws_with([&] { Tensor::empty({2, 3}, DType::kFloat32, Device::cuda(0)); }, {"CUDA"}));
  Tensor a = zeros({2, 3});
  EXPECT_TRUE(throws_with([&] { a.to(Device::cuda(0)); }, {"CUDA"}));
  EXPECT_TRUE(throws_with([&] { zeros({4}, DType::kFloat32, Device::parse("cuda:1")); }, {"CUDA"}));
}

TEST(Errors, BadArgumentsToKernelsDirectly) {
  // The kernels check their own contract too (callers other than ops.cc: autograd, comm).
  Tensor a = zeros({2, 3});
  Tensor out = zeros({3, 2});
  EXPECT_TRUE(throws_with([&] { kernels::cpu::unary(kernels::UnaryOp::kExp, a, out); },
                          {"exp", "[2, 3]", "[3, 2]"}));
  EXPECT_TRUE(throws_with([&] { kernels::cpu::copy(out, a); }, {"copy", "[3, 2]", "[2, 3]"}));
  Tensor mm_out = zeros({1, 2, 2});
  EXPECT_TRUE(throws_with([&] { kernels::cpu::batched_matmul(a.unsqueeze(0), a.unsqueeze(0), mm_out); },
                          {"matmul", "[1, 2, 3]"}));
}

TEST(Errors, IntegerOpsThatNeedFloats) {
  Tensor a = zeros({2, 2}, DType::kInt32);
  EXPECT_TRUE(throws_with([&] { softmax(a, 0); }, {"softmax", "int32[2, 2]"}));
  EXPECT_TRUE(throws_with([&] { mean(a); }, {"mean", "int32"}));
  EXPECT_TRUE(throws_with([&] { log(a); }, {"log", "int32"}));
  EXPECT_TRUE(throws_with([&] { conv2d(zeros({1, 1, 3, 3}, DType::kInt64), zeros({1, 1, 2, 2}, DType::kInt64),
                                       Tensor(), Conv2dParams{}); },
                          {"conv2d", "int64"}));
}

}  // namespace
}  // namespace ringtrain
