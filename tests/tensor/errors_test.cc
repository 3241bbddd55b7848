// errors_test.cc: bad input throws an exception whose message names the op and
// the shapes / dtypes / devices involved: never a crash, never a silent broadcast.
#include <cmath>
#include <functional>
#include <limits>
#include <string>

#include "tests/common/expect_error.h"
#include "tests/tensor/reference.h"

namespace ringtrain {
namespace {

using namespace ref;
using testing::expect_error;

TEST(Errors, MismatchedShapesNameOpAndShapes) {
  Tensor a = zeros({2, 3});
  Tensor b = zeros({4, 3});
  EXPECT_TRUE(throws_with([&] { add(a, b); }, {"add", "[2, 3]", "[4, 3]"}));
  EXPECT_TRUE(throws_with([&] { mul(a, zeros({3, 2})); }, {"mul", "[2, 3]", "[3, 2]"}));
  EXPECT_TRUE(throws_with([&] { where(zeros({5}), a, a); }, {"where", "[5]"}));
  // In-place ops never change the destination's shape.
  Tensor row = zeros({1, 3});
  EXPECT_TRUE(throws_with([&] { add_(row, a); }, {"add_", "[1, 3]", "[2, 3]"}));
  // copy_ names itself and both tensors (its error used to come from Tensor::expand, an op
  // the caller never called), and still broadcasts a source that fits.
  Tensor dst = zeros({2, 3});
  EXPECT_TRUE(throws_with([&] { dst.copy_(zeros({2})); }, {"Tensor::copy_", "float32[2] on cpu", "[2, 3]", "broadcast"}));
  EXPECT_TRUE(throws_with([&] { dst.copy_(zeros({1, 2, 3})); }, {"Tensor::copy_", "[1, 2, 3]", "[2, 3]"}));
  dst.copy_(Tensor::from_vector<float>({1, 2, 3}, {3}));
  EXPECT_EQ(dst.to_vector<float>(), (std::vector<float>{1, 2, 3, 1, 2, 3}));
  dst.copy_(scalar_tensor(4.0));
  EXPECT_EQ(dst.to_vector<float>(), std::vector<float>(6, 4.0f));
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
  EXPECT_TRUE(throws_with([&] { Tensor::from_storage(four.storage(), {-2, -3}, {0, 0}, 0, DType::kFloat32); },
                          {"from_storage", "negative size", "[-2, -3]"}));
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


// ---- API misuse: each of these used to crash, read out of bounds or give a silently wrong result.

constexpr int64_t kMax64 = std::numeric_limits<int64_t>::max();

TEST(Misuse, NarrowWithHugeStartOrLengthThrows) {
  Tensor t = arange(0, 4, 1, DType::kFloat32);
  EXPECT_TRUE(throws_with([&] { t.narrow(0, kMax64, 2); }, {"narrow", "out of bounds"}));
  EXPECT_TRUE(throws_with([&] { t.narrow(0, 2, kMax64); }, {"narrow", "out of bounds"}));
  EXPECT_TRUE(throws_with([&] { t.narrow(0, 5, 0); }, {"narrow"}));
  EXPECT_EQ(t.narrow(0, 4, 0).shape(), (Shape{0}));
  EXPECT_EQ(t.narrow(0, -1, 1).to_vector<float>(), (std::vector<float>{3}));
  // Same overflow patterns in slice / split / chunk.
  EXPECT_EQ(t.slice(0, 0, 4, kMax64).to_vector<float>(), (std::vector<float>{0}));
  EXPECT_EQ(t.slice(0, 1, 4, kMax64 - 1).shape(), (Shape{1}));
  EXPECT_EQ(t.chunk(kMax64).size(), 4u);
  EXPECT_EQ(t.split(kMax64).size(), 1u);
  EXPECT_TRUE(throws_with([&] { t.split_with_sizes({kMax64, 2}); }, {"split"}));
}

TEST(Misuse, IntegerDivisionOfMinByMinusOneWraps) {
  const int32_t min32 = std::numeric_limits<int32_t>::min();
  const int64_t min64 = std::numeric_limits<int64_t>::min();
  Tensor a32 = Tensor::from_vector<int32_t>({min32, 7, min32}, {3});
  Tensor b32 = Tensor::from_vector<int32_t>({-1, -2, 1}, {3});
  EXPECT_EQ(div(a32, b32).to_vector<int32_t>(), (std::vector<int32_t>{min32, -3, min32}));
  EXPECT_EQ(div(a32, -1.0).to_vector<int32_t>(), (std::vector<int32_t>{min32, -7, min32}));
  Tensor a64 = Tensor::from_vector<int64_t>({min64, 7}, {2});
  Tensor b64 = Tensor::from_vector<int64_t>({-1, -1}, {2});
  EXPECT_EQ(div(a64, b64).to_vector<int64_t>(), (std::vector<int64_t>{min64, -7}));
  EXPECT_EQ(div(a64, -1.0).to_vector<int64_t>(), (std::vector<int64_t>{min64, -7}));
  // The other integer ops wrap the same way (two's complement), without signed-overflow UB.
  EXPECT_EQ(neg(a64).to_vector<int64_t>(), (std::vector<int64_t>{min64, -7}));
  EXPECT_EQ(abs(a32).to_vector<int32_t>(), (std::vector<int32_t>{min32, 7, min32}));
  EXPECT_EQ(add(a32, -1.0).to_vector<int32_t>()[0], std::numeric_limits<int32_t>::max());
  EXPECT_TRUE(throws_with([&] { div(a32, 0.0); }, {"div", "zero"}));
}

TEST(Misuse, ExpandTakesMinusOneAndRejectsOtherNegativeSizes) {
  Tensor t = arange(0, 3, 1, DType::kFloat32).reshape({1, 3});
  EXPECT_EQ(t.expand({-1, 3}).shape(), (Shape{1, 3}));
  EXPECT_EQ(t.expand({4, -1}).shape(), (Shape{4, 3}));
  EXPECT_EQ(t.expand({2, -1, -1}).shape(), (Shape{2, 1, 3}));
  EXPECT_TRUE(throws_with([&] { t.expand({-2, 3}); }, {"expand", "-2"}));
  EXPECT_TRUE(throws_with([&] { t.expand({-1, 1, 3}); }, {"expand", "new leading dim"}));
  EXPECT_TRUE(throws_with([&] { t.expand({-5, 1, 3}); }, {"expand", "-5"}));
}

TEST(Misuse, ConvAndPoolParamsAreValidatedWithoutOverflow) {
  Tensor x = zeros({1, 1, 4, 4});
  Tensor w = zeros({1, 1, 3, 3});
  Conv2dParams p;
  p.dilation_h = p.dilation_w = kMax64;
  EXPECT_TRUE(throws_with([&] { conv2d(x, w, Tensor(), p); }, {"conv2d", "dilated kernel size", "overflow"}));
  p = Conv2dParams{};
  p.pad_h = kMax64;
  EXPECT_TRUE(throws_with([&] { conv2d(x, w, Tensor(), p); }, {"conv2d", "padded input size", "overflow"}));
  p = Conv2dParams{};
  p.dilation_w = 0;
  EXPECT_TRUE(throws_with([&] { conv2d(x, w, Tensor(), p); }, {"conv2d", "dilation must be at least 1"}));
  p = Conv2dParams{};
  p.stride_h = -1;
  EXPECT_TRUE(throws_with([&] { conv2d(x, w, Tensor(), p); }, {"conv2d", "stride must be at least 1"}));
  p = Conv2dParams{};
  p.pad_w = -1;
  EXPECT_TRUE(throws_with([&] { conv2d(x, w, Tensor(), p); }, {"conv2d", "padding must be non-negative"}));
  p = Conv2dParams{};
  EXPECT_EQ(conv2d(x, w, Tensor(), p).shape(), (Shape{1, 1, 2, 2}));

  Pool2dParams q;
  q.pad_h = -1;
  EXPECT_TRUE(throws_with([&] { max_pool2d(x, q); }, {"max_pool2d", "padding must be non-negative"}));
  q = Pool2dParams{};
  q.kernel_h = kMax64;
  q.pad_h = kMax64 / 2;
  EXPECT_TRUE(throws_with([&] { avg_pool2d(x, q); }, {"avg_pool2d", "overflow"}));
  q = Pool2dParams{};
  q.pad_w = 2;
  EXPECT_TRUE(throws_with([&] { max_pool2d(x, q); }, {"max_pool2d", "at most half the kernel size"}));
}

TEST(Misuse, InPlaceScalarOpsRejectExpandedDestinations) {
  Tensor base = ones({1, 1});
  Tensor e = base.expand({4, 3});
  EXPECT_TRUE(throws_with([&] { mul_(e, 2.0); }, {"mul_", "stride 0"}));
  EXPECT_TRUE(throws_with([&] { div_(e, 2.0); }, {"div_", "stride 0"}));
  EXPECT_EQ(base.item(), 1.0);
  fill_(e, 5.0);  // every element gets the same value: allowed, as in PyTorch
  EXPECT_EQ(base.item(), 5.0);
  Tensor c = ones({2, 2});
  mul_(c, 3.0);
  div_(c, 2.0);
  EXPECT_EQ(c.to_vector<float>(), (std::vector<float>{1.5f, 1.5f, 1.5f, 1.5f}));
}

TEST(Misuse, OneHotRangeChecksItsIndices) {
  EXPECT_TRUE(throws_with([&] { one_hot(Tensor::from_vector<int64_t>({0, 3}, {2}), 3); },
                          {"one_hot", "[0, 3]", "[0, 2]", "raise num_classes"}));
  EXPECT_TRUE(throws_with([&] { one_hot(Tensor::from_vector<int64_t>({-1, 1}, {2}), 3); },
                          {"one_hot", "-1"}));
  EXPECT_EQ(one_hot(Tensor::from_vector<int64_t>({2, 0}, {2}), 3).to_vector<float>(),
            (std::vector<float>{0, 0, 1, 1, 0, 0}));
  EXPECT_EQ(one_hot(Tensor::empty({0}, DType::kInt64), 3).shape(), (Shape{0, 3}));
}

TEST(Misuse, ArangeWithNonFiniteOrHugeBoundsThrowsRingtrainError) {
  // A ringtrain::Error naming arange, not a std::length_error from deep inside.
  expect_error([] { arange(0, INFINITY); }, {"arange"});
  expect_error([] { arange(0, 1e30); }, {"arange"});
  expect_error([] { arange(0, NAN); }, {"arange"});
  expect_error([] { arange(0, 4, NAN); }, {"arange"});
  EXPECT_TRUE(throws_with([] { arange(0, 1e30); }, {"arange", "1e+30", "step 1"}));
  EXPECT_EQ(arange(0, 4).to_vector<int64_t>(), (std::vector<int64_t>{0, 1, 2, 3}));
  EXPECT_EQ(arange(3, 0, -1.5, DType::kFloat32).to_vector<float>(), (std::vector<float>{3, 1.5f}));
}

// Integer aranges are computed exactly in int64 from the truncated bounds and step. Through
// double and a truncation at the end they repeated values (arange(-2.5, 2): -2, -1, 0, 0, 1)
// and, past 2^53, repeated and overshot end (2^53, 2^53, 2^53 + 2, 2^53 + 4 for [2^53, 2^53 + 4)).
TEST(Misuse, IntegerArangeIsExact) {
  using V = std::vector<int64_t>;
  EXPECT_EQ(arange(-2.5, 2).to_vector<int64_t>(), (V{-2, -1, 0, 1}));
  EXPECT_EQ(arange(0.5, 3.9, 1.5).to_vector<int64_t>(), (V{0, 1, 2}));
  EXPECT_EQ(arange(5, 0, -2).to_vector<int64_t>(), (V{5, 3, 1}));
  EXPECT_EQ(arange(0, 5, -1).numel(), 0);
  const double two53 = 9007199254740992.0;
  EXPECT_EQ(arange(two53, two53 + 4).to_vector<int64_t>(),
            (V{9007199254740992, 9007199254740993, 9007199254740994, 9007199254740995}));
  // The whole int64 range in two steps: i * step alone would overflow.
  EXPECT_EQ(arange(-9e18, 9e18, 9e18).to_vector<int64_t>(), (V{-9000000000000000000, 0}));
  EXPECT_EQ(arange(-3, 3, 2, DType::kInt32).to_vector<int32_t>(), (std::vector<int32_t>{-3, -1, 1}));
  EXPECT_TRUE(throws_with([] { arange(0, 3, 0.5); }, {"arange", "step 0.5", "truncates to 0", "int64"}));
  EXPECT_TRUE(throws_with([] { arange(0, 4e9, 1e9, DType::kInt32); }, {"arange", "3000000000", "int32"}));
}

TEST(Misuse, TransposeShorthandIsTwoDimsOnly) {
  EXPECT_TRUE(throws_with([] { zeros({2, 3, 4}).t(); }, {"Tensor::t", "[2, 3, 4]", "transpose"}));
  EXPECT_EQ(zeros({2, 3}).t().shape(), (Shape{3, 2}));
  EXPECT_EQ(zeros({3}).t().shape(), (Shape{3}));
  EXPECT_EQ(scalar_tensor(1.0).t().shape(), (Shape{}));
}

// A 0-element shape may have dims whose strides do not fit in int64 (Errors.ShapesWhoseSize...
// accepts such tensors): the strides saturate instead of wrapping negative, and the tensor works.
TEST(Misuse, ReshapeOfAnEmptyTensorGetsNoOverflowedStrides) {
  Tensor t = zeros({0});
  for (const Shape& shape : {Shape{0, kMax64, 4}, Shape{0, int64_t{1} << 62, 4, 2}}) {
    Tensor r = t.reshape(shape);
    EXPECT_EQ(r.shape(), shape);
    for (int64_t s : r.strides()) EXPECT_GE(s, 0) << shape_str(r.strides());
    EXPECT_EQ(r.strides().back(), 1);
    EXPECT_EQ(r.clone().numel(), 0);
    EXPECT_EQ(Tensor::empty(shape).strides(), r.strides());
  }
}

TEST(Misuse, IntegerOverflowWrapsAround) {
  const int32_t max32 = std::numeric_limits<int32_t>::max(), min32 = std::numeric_limits<int32_t>::min();
  const int64_t min64 = std::numeric_limits<int64_t>::min();
  Tensor a = Tensor::from_vector<int32_t>({max32, min32, min32, 65536, -7}, {5});
  Tensor b = Tensor::from_vector<int32_t>({1, -1, 1, 65536, -1}, {5});
  EXPECT_EQ(add(a, b).to_vector<int32_t>(), (std::vector<int32_t>{min32, max32, min32 + 1, 131072, -8}));
  EXPECT_EQ(sub(a, b).to_vector<int32_t>(), (std::vector<int32_t>{max32 - 1, min32 + 1, max32, 0, -6}));
  EXPECT_EQ(mul(a, b).to_vector<int32_t>(), (std::vector<int32_t>{max32, min32, min32, 0, 7}));
  EXPECT_EQ(neg(a).to_vector<int32_t>(), (std::vector<int32_t>{-max32, min32, min32, -65536, 7}));
  Tensor c = Tensor::from_vector<int64_t>({kMax64, min64}, {2});
  EXPECT_EQ(add(c, c).to_vector<int64_t>(), (std::vector<int64_t>{-2, 0}));
  EXPECT_EQ(mul(c, c).to_vector<int64_t>(), (std::vector<int64_t>{1, 0}));
  EXPECT_EQ(sum(c.narrow(0, 0, 1).expand({3})).to_vector<int64_t>()[0], kMax64 - 2);  // 3 * max wraps
}

TEST(Misuse, IntegerPowIsExactAndWrapsLikeMul) {
  // 3^39 needs 62 bits: a detour through double (53-bit significand) gives ...256.
  Tensor base = Tensor::from_vector<int64_t>({3, 3, -3, 2, 1, -1, -1, 5, 0, 7}, {10});
  Tensor exponent = Tensor::from_vector<int64_t>({39, 41, 3, 64, -5, -3, -4, -1, 0, 1}, {10});
  EXPECT_EQ(pow(base, exponent).to_vector<int64_t>(),
            (std::vector<int64_t>{4052555153018976267, -420491770248316829, -27, 0, 1, -1, 1, 0, 1, 7}));
  // Tensor-scalar: the scalar exponent takes the tensor's dtype; 2^40 and (-2)^40 wrap to 0
  // in int32 and 3^40 to its low 32 bits, as PyTorch gives.
  EXPECT_EQ(pow(Tensor::from_vector<int32_t>({2, -2, 3}, {3}), 40.0).to_vector<int32_t>(),
            (std::vector<int32_t>{0, 0, 689956897}));
  EXPECT_EQ(pow(Tensor::from_vector<int32_t>({-3}, {1}), 21.0).to_vector<int32_t>()[0], -1870418611);
}

TEST(Misuse, IntegerAddWithAlphaIsExactAndTakesOnlyIntegerAlphas) {
  // 2^53 + 1 + 2 * 1: through double it would round to 2^53 + 2.
  const int64_t big = (int64_t{1} << 53) + 1;
  Tensor a = Tensor::from_vector<int64_t>({big, kMax64}, {2});
  add_(a, Tensor::from_vector<int64_t>({1, 1}, {2}), 2.0);
  EXPECT_EQ(a.to_vector<int64_t>(), (std::vector<int64_t>{big + 2, std::numeric_limits<int64_t>::min() + 1}));
  Tensor i32 = Tensor::from_vector<int32_t>({std::numeric_limits<int32_t>::max()}, {1});
  add_(i32, Tensor::from_vector<int32_t>({1}, {1}), -3.0);  // wraps below as mul and add do
  EXPECT_EQ(i32.to_vector<int32_t>()[0], std::numeric_limits<int32_t>::max() - 3);
  EXPECT_TRUE(throws_with([&] { add_(i32, i32.clone(), 0.5); }, {"add_", "alpha", "0.5", "integer"}));
  // index_add_ on integers wraps too (it was a signed overflow).
  Tensor dst = Tensor::from_vector<int32_t>({std::numeric_limits<int32_t>::max()}, {1});
  index_add_(dst, 0, Tensor::from_vector<int64_t>({0}, {1}), Tensor::from_vector<int32_t>({1}, {1}));
  EXPECT_EQ(dst.to_vector<int32_t>()[0], std::numeric_limits<int32_t>::min());
}

TEST(Misuse, OpsThatReadOtherElementsRefuseAnOutputSharingTheirInput) {
  // matmul_out(a, b, a) would repack rows of `a` it has already overwritten.
  Tensor a = Tensor::from_vector<double>({1, 2, 3, 4}, {2, 2});
  Tensor swap = Tensor::from_vector<double>({0, 1, 1, 0}, {2, 2});
  EXPECT_TRUE(throws_with([&] { matmul_out(a, swap, a); }, {"matmul_out", "shares memory", "clone()"}));
  EXPECT_TRUE(throws_with([&] { matmul_out(swap, a.t(), a); }, {"matmul_out", "shares memory"}));
  Tensor out = Tensor::empty({2, 2}, DType::kFloat64);
  matmul_out(a, swap, out);
  EXPECT_EQ(out.to_vector<double>(), (std::vector<double>{2, 1, 4, 3}));
  // index_add_(a, 0, idx, a): a scatter reads rows it has already updated.
  Tensor v = Tensor::from_vector<float>({1, 2, 3}, {3});
  Tensor idx = Tensor::from_vector<int64_t>({1, 2, 0}, {3});
  EXPECT_TRUE(throws_with([&] { index_add_(v, 0, idx, v); }, {"index_add_", "shares memory"}));
  index_add_(v, 0, idx, v.clone());
  EXPECT_EQ(v.to_vector<float>(), (std::vector<float>{4, 3, 5}));
  // index_add_ into an int64 tensor whose memory holds the index too: the first add turned
  // the index still to be read from 0 into 100 (checked as 0 before), and the second add
  // wrote 400 bytes past the destination's end. The overlap is refused, the destination
  // left as it was.
  Tensor w = Tensor::from_vector<int64_t>({0, 2, 0, 0}, {4});
  Tensor own_index = w.narrow(0, 1, 2);  // {2, 0}: a[2] += 100 makes the next index 100
  Tensor add = Tensor::from_vector<int64_t>({100, 5}, {2});
  EXPECT_TRUE(throws_with([&] { index_add_(w, 0, own_index, add); }, {"index_add_", "shares memory"}));
  EXPECT_EQ(w.to_vector<int64_t>(), (std::vector<int64_t>{0, 2, 0, 0}));
  index_add_(w, 0, own_index.clone(), add);
  EXPECT_EQ(w.to_vector<int64_t>(), (std::vector<int64_t>{5, 2, 100, 0}));
}

TEST(Misuse, HalfMeansAndLossesDoNotOverflowWhereTheirSumsWould) {
  // 10000 tens sum to 100000 > 65504 (float16's max), but their mean is 10.
  for (DType dtype : {DType::kFloat16, DType::kBFloat16}) {
    SCOPED_TRACE(dtype_name(dtype));
    Tensor m = mean(full({10000}, 10.0, dtype));
    EXPECT_EQ(m.dtype(), dtype);
    EXPECT_EQ(m.to_vector<float>()[0], 10.0f);
    EXPECT_EQ(mean(full({4, 20000}, 3.0, dtype), {1}).to_vector<float>(), std::vector<float>(4, 3.0f));
  }
  // Cross-entropy over 70000 samples: the count of valid targets is not representable in
  // float16 (it was inf, so the loss was 0), nor is the sum of the per-sample losses.
  Tensor logits32 = zeros({70000, 2});
  Tensor targets = zeros({70000}, DType::kInt64);
  const float expected = cross_entropy(logits32, targets).to_vector<float>()[0];  // log 2
  EXPECT_NEAR(expected, std::log(2.0f), 1e-6);
  EXPECT_NEAR(cross_entropy(logits32.to(DType::kFloat16), targets).to_vector<float>()[0], expected, 1e-3);
}

TEST(Misuse, CrossEntropyNamesTargetsOutsideTheClasses) {
  Tensor logits = zeros({3, 4});
  EXPECT_TRUE(throws_with([&] { cross_entropy(logits, Tensor::from_vector<int64_t>({0, 4, 1}, {3})); },
                          {"cross_entropy", "targets", "[0, 4]", "[0, 3]", "ignore_index"}));
  EXPECT_TRUE(throws_with([&] { cross_entropy(logits, Tensor::from_vector<int64_t>({-1, 2, 1}, {3})); },
                          {"cross_entropy", "targets", "-1"}));
  // ignore_index itself is not a class: -100 and 7 are skipped, not refused.
  EXPECT_NO_THROW(cross_entropy(logits, Tensor::from_vector<int64_t>({-100, 2, 1}, {3})));
  EXPECT_NO_THROW(cross_entropy(logits, Tensor::from_vector<int64_t>({7, 2, 1}, {3}), 7));
}

TEST(Misuse, IntegerSumsAccumulateInInt64AndWrapIntoTheInputDtype) {
  Tensor a = Tensor::from_vector<int32_t>({2000000000, 2000000000, 2000000000}, {3});
  Tensor s = sum(a);
  EXPECT_EQ(s.dtype(), DType::kInt32);
  // 6e9 in int64, then cast to int32 with two's-complement wrap-around (documented in ops.h).
  EXPECT_EQ(s.to_vector<int32_t>()[0], static_cast<int32_t>(int64_t{6000000000}));
  Tensor b = Tensor::from_vector<int64_t>({kMax64, 1}, {2});
  EXPECT_EQ(sum(b).to_vector<int64_t>()[0], std::numeric_limits<int64_t>::min());
}

TEST(Misuse, FloatToIntegerConversionsSaturateAndMapNaNToZero) {
  const int64_t min64 = std::numeric_limits<int64_t>::min();
  const int32_t max32 = std::numeric_limits<int32_t>::max(), min32 = std::numeric_limits<int32_t>::min();
  EXPECT_EQ(full({1}, NAN, DType::kInt64).to_vector<int64_t>()[0], 0);
  EXPECT_EQ(full({1}, INFINITY, DType::kInt64).to_vector<int64_t>()[0], kMax64);
  EXPECT_EQ(full({1}, -INFINITY, DType::kInt64).to_vector<int64_t>()[0], min64);
  Tensor f = Tensor::from_vector<float>({1e10f, -1e10f, NAN, 2.7f, -2.7f, INFINITY}, {6});
  EXPECT_EQ(f.to(DType::kInt32).to_vector<int32_t>(),
            (std::vector<int32_t>{max32, min32, 0, 2, -2, max32}));
  EXPECT_EQ(f.to(DType::kFloat16).to(DType::kInt64).to_vector<int64_t>()[5], kMax64);
  Tensor ints = Tensor::from_vector<int64_t>({1, 2}, {2});
  Tensor mask = Tensor::from_vector<int64_t>({1, 0}, {2});
  EXPECT_EQ(masked_fill(ints, mask, NAN).to_vector<int64_t>(), (std::vector<int64_t>{0, 2}));
  EXPECT_EQ(mul(mask, 1e300).to_vector<int64_t>(), (std::vector<int64_t>{kMax64, 0}));  // scalar saturates
  EXPECT_EQ(saturating_float_to_int<int64_t>(9.3e18), kMax64);
  EXPECT_EQ(saturating_float_to_int<int32_t>(-2147483648.0), min32);
  EXPECT_EQ(saturating_float_to_int<int32_t>(2147483647.9), max32);
}

}  // namespace
}  // namespace ringtrain
