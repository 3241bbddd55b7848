// elementwise_test.cc: unary, binary (broadcasting), scalar, where/masked_fill,
// in-place arithmetic and finiteness checks against the float64 reference, over
// several shapes (incl. size-0 and size-1 dims, 0-d), memory layouts (transposed,
// sliced, offset, permuted, expanded) and every relevant dtype.
#include <cmath>
#include <limits>
#include <string>

#include "tests/tensor/reference.h"

namespace ringtrain {
namespace {

using kernels::BinaryOp;
using kernels::UnaryOp;
using namespace ref;

const DType kFloatTypes[] = {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16};
const DType kIntTypes[] = {DType::kInt32, DType::kInt64};

const std::vector<Shape> kShapes = {{}, {1}, {7}, {3, 5}, {0, 4}, {2, 1, 6}, {4, 3, 33}, {2, 3, 4, 5}};

std::string trace(DType dtype, const Shape& shape, Layout layout) {
  return std::string(dtype_name(dtype)) + shape_str(shape) + " " + layout_name(layout);
}

// Rounds every expected value to the output dtype (integer semantics: truncation).
RefTensor rounded(RefTensor r, DType dtype) {
  for (auto& v : r.data) v = round_to_dtype(v, dtype);
  return r;
}

// ---------------------------------------------------------------- unary

struct UnaryCase {
  UnaryOp op;
  Tensor (*fn)(const Tensor&);
  double lo, hi;
};

const UnaryCase kUnaryCases[] = {
    {UnaryOp::kNeg, &neg, -3, 3},      {UnaryOp::kExp, &exp, -3, 3},
    {UnaryOp::kLog, &log, 0.05, 5},    {UnaryOp::kSqrt, &sqrt, 0.0, 5},
    {UnaryOp::kAbs, &abs, -3, 3},      {UnaryOp::kRelu, &relu, -3, 3},
    {UnaryOp::kGelu, &gelu, -4, 4},    {UnaryOp::kGeluGrad, &gelu_grad, -4, 4},
    {UnaryOp::kTanh, &tanh, -5, 5},    {UnaryOp::kSigmoid, &sigmoid, -8, 8},
    {UnaryOp::kIsFinite, &isfinite, -3, 3},
};

TEST(Unary, FloatOpsMatchReferenceOnEveryLayout) {
  uint64_t seed = 1;
  for (const auto& c : kUnaryCases) {
    for (DType dtype : kFloatTypes) {
      for (const Shape& shape : kShapes) {
        for (Layout layout : kAllLayouts) {
          SCOPED_TRACE(std::string(kernels::unary_op_name(c.op)) + " " + trace(dtype, shape, layout));
          Tensor a = random_view(shape, dtype, ++seed, layout, c.lo, c.hi);
          Tensor y = c.fn(a);
          EXPECT_EQ(y.dtype(), dtype);
          EXPECT_TRUE(y.is_contiguous());
          EXPECT_TRUE(expect_close(y, ref_unary(c.op, to_ref(a)), tolerance_for(dtype)));
        }
      }
    }
  }
}

TEST(Unary, LargeContiguousRunsUseTheVectorPathCorrectly) {
  // Long runs (not a multiple of the SIMD width or the 16-bit conversion block).
  for (DType dtype : kFloatTypes) {
    for (const auto& c : kUnaryCases) {
      SCOPED_TRACE(std::string(kernels::unary_op_name(c.op)) + " " + dtype_name(dtype));
      Tensor a = random_tensor({10007}, dtype, 77, c.lo, c.hi);
      EXPECT_TRUE(expect_close(c.fn(a), ref_unary(c.op, to_ref(a)), tolerance_for(dtype)));
    }
  }
}

TEST(Unary, ResultsDoNotDependOnPositionOrAlignment) {
  // The same value must give bitwise the same result wherever it sits (inside a long SIMD
  // run, in a short tail, in a misaligned view): a resumed training run must reproduce an
  // uninterrupted one bit for bit.
  for (DType dtype : {DType::kFloat32, DType::kFloat64}) {
    for (const auto& c : kUnaryCases) {
      SCOPED_TRACE(std::string(kernels::unary_op_name(c.op)) + " " + dtype_name(dtype));
      Tensor values = random_tensor({515}, dtype, 5, c.lo, c.hi);
      const std::vector<double> all = c.fn(values).to_vector<double>();
      int64_t differ = 0;
      for (int64_t i = 0; i < 515; ++i) {
        differ += c.fn(values.narrow(0, i, 1)).item() != all[static_cast<size_t>(i)];
      }
      EXPECT_EQ(differ, 0) << "elements whose value depends on their position";
      for (int64_t offset : {1, 3, 7}) {
        std::vector<double> shifted = c.fn(values.narrow(0, offset, 500)).to_vector<double>();
        EXPECT_TRUE(std::equal(shifted.begin(), shifted.end(), all.begin() + offset)) << "offset " << offset;
      }
    }
  }
}

TEST(Unary, IntegerNegAbsRelu) {
  for (DType dtype : kIntTypes) {
    for (const Shape& shape : kShapes) {
      for (Layout layout : kAllLayouts) {
        SCOPED_TRACE(trace(dtype, shape, layout));
        Tensor a = random_view(shape, dtype, 5, layout, -50, 50);
        RefTensor r = to_ref(a);
        EXPECT_TRUE(expect_equal(neg(a), ref_unary(UnaryOp::kNeg, r)));
        EXPECT_TRUE(expect_equal(abs(a), ref_unary(UnaryOp::kAbs, r)));
        EXPECT_TRUE(expect_equal(relu(a), ref_unary(UnaryOp::kRelu, r)));
      }
    }
  }
}

TEST(Unary, TranscendentalOnIntegersThrowsNamingTheOp) {
  Tensor a = random_tensor({2, 3}, DType::kInt64, 1, 0, 5);
  EXPECT_TRUE(throws_with([&] { exp(a); }, {"exp", "int64[2, 3]"}));
  EXPECT_TRUE(throws_with([&] { sigmoid(a); }, {"sigmoid", "int64"}));
}

TEST(Unary, SpecialValues) {
  const double inf = std::numeric_limits<double>::infinity();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (DType dtype : kFloatTypes) {
    SCOPED_TRACE(dtype_name(dtype));
    RefTensor r({6}, std::vector<double>{0.0, -0.0, inf, -inf, nan, 1.0});
    Tensor a = from_ref(r, dtype);
    EXPECT_TRUE(expect_close(exp(a), ref_unary(UnaryOp::kExp, r), tolerance_for(dtype)));
    EXPECT_TRUE(expect_close(relu(a), ref_unary(UnaryOp::kRelu, r), tolerance_for(dtype)));
    EXPECT_TRUE(expect_close(tanh(a), ref_unary(UnaryOp::kTanh, r), tolerance_for(dtype)));
    EXPECT_TRUE(expect_close(sigmoid(a), ref_unary(UnaryOp::kSigmoid, r), tolerance_for(dtype)));
    EXPECT_TRUE(expect_equal(isfinite(a), RefTensor({6}, std::vector<double>{1, 1, 0, 0, 0, 1})));
  }
}

// The same, in a tensor long enough for whole blocks (256 elements) besides the tail: the
// underflowing inputs are found and recomputed wherever they sit (first and last element of
// a block, the tail), in place as well (the kernel with one tensor as input and output,
// where the inputs are gone once the packet results are stored), and every other element
// equals the value it gets alone (position does not change a result).
TEST(Unary, UnderflowIsExactAtEveryPositionAndInPlace) {
  const int64_t n = 256 * 3 + 37;
  for (DType dtype : {DType::kFloat32, DType::kFloat64}) {
    for (UnaryOp op : {UnaryOp::kExp, UnaryOp::kSigmoid}) {
      SCOPED_TRACE(std::string(dtype_name(dtype)) + " " + kernels::unary_op_name(op));
      std::vector<double> xs(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) xs[static_cast<size_t>(i)] = std::sin(0.37 * static_cast<double>(i)) * 20.0;
      const bool f32 = dtype == DType::kFloat32;
      for (int64_t i : {0, 255, 256, 511, 600, 767, 768, 804}) xs[static_cast<size_t>(i)] = f32 ? -100.0 - i % 3 : -740.0 - i % 3;
      Tensor x = Tensor::from_vector(xs, {n}).to(dtype);
      Tensor out = Tensor::empty({n}, dtype);
      kernels::cpu::unary(op, x, out);
      Tensor in_place = x.clone();
      kernels::cpu::unary(op, in_place, in_place);
      const std::vector<double> got = out.to(DType::kFloat64).to_vector<double>();
      const std::vector<double> got_in_place = in_place.to(DType::kFloat64).to_vector<double>();
      for (int64_t i = 0; i < n; ++i) {
        const size_t k = static_cast<size_t>(i);
        Tensor one = Tensor::empty({1}, dtype);
        kernels::cpu::unary(op, x.slice(0, i, i + 1).contiguous(), one);
        const double alone = one.to(DType::kFloat64).item();
        const double c_library = f32 ? static_cast<double>(std::exp(static_cast<float>(xs[k]))) : std::exp(xs[k]);
        const double want = xs[k] <= -100.0 ? c_library : alone;
        ASSERT_EQ(got[k], want) << "element " << i << " of " << n << ", x = " << xs[k];
        ASSERT_EQ(got_in_place[k], want) << "in place, element " << i << " of " << n << ", x = " << xs[k];
      }
    }
  }
}

// Eigen's packet exp clamps its argument (to -88.7 for float, -709.8 for double) and its
// float sqrt is an approximation: these compare bit for bit with the C library, which is
// correctly rounded for sqrt and exact in the underflow range. (SpecialValues above uses a
// tolerance, so 2.9e-39 passed as exp(-inf) there.)
TEST(Unary, UnderflowSubnormalsAndSqrtAreExact) {
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<double> xs = {-inf, -1e30, -745.5, -708.5, -200.0, -103.5, -100.0, -88.5, -87.5, -50.0};
  for (DType dtype : {DType::kFloat32, DType::kFloat64}) {
    SCOPED_TRACE(dtype_name(dtype));
    Tensor x = Tensor::from_vector(xs, {static_cast<int64_t>(xs.size())}).to(dtype);
    std::vector<double> e = exp(x).to(DType::kFloat64).to_vector<double>();
    std::vector<double> sg = sigmoid(x).to(DType::kFloat64).to_vector<double>();
    std::vector<double> gg = gelu_grad(x).to(DType::kFloat64).to_vector<double>();
    for (size_t i = 0; i < xs.size(); ++i) {
      SCOPED_TRACE(xs[i]);
      // Exact (the C library's value) where the result is subnormal or 0, within Eigen's
      // usual few ulp elsewhere; e^x / (1 + e^x) rounds to e^x for all of these x.
      const bool f32 = dtype == DType::kFloat32;
      const double want = f32 ? static_cast<double>(std::exp(static_cast<float>(xs[i]))) : std::exp(xs[i]);
      const double normal = f32 ? std::numeric_limits<float>::min() : std::numeric_limits<double>::min();
      if (want < normal) {
        EXPECT_EQ(e[i], want);
        EXPECT_EQ(sg[i], want);
      } else {
        const double rel = f32 ? 1e-6 : 1e-14;
        EXPECT_NEAR(e[i], want, rel * want);
        EXPECT_NEAR(sg[i], want, rel * want);
      }
      if (xs[i] <= -50.0) EXPECT_EQ(gg[i], 0.0);  // Phi(x) + x phi(x) underflows to 0
    }
    EXPECT_EQ(gelu_grad(full({1}, inf, dtype)).item(), 1.0);
    EXPECT_EQ(gelu_grad(full({1}, -inf, dtype)).item(), 0.0);
    // log of subnormals
    const double tiny = dtype == DType::kFloat32 ? 1e-45 : 5e-324;
    Tensor t = full({3}, tiny, dtype);
    std::vector<double> l = log(t).to(DType::kFloat64).to_vector<double>();
    const double expected = dtype == DType::kFloat32 ? static_cast<double>(std::log(1e-45f)) : std::log(5e-324);
    for (double v : l) EXPECT_EQ(v, expected);
  }
  // sqrt is correctly rounded for every float (here 300000 spread over the exponent range,
  // subnormals included), so Adam's denominator is PyTorch's bit for bit.
  std::vector<float> values;
  for (int i = 0; i < 300000; ++i) values.push_back(std::ldexp(1.0f + static_cast<float>(i % 997) / 997.0f, i % 300 - 150));
  Tensor f = Tensor::from_vector(values, {static_cast<int64_t>(values.size())});
  std::vector<float> r = sqrt(f).to_vector<float>();
  int wrong = 0;
  for (size_t i = 0; i < values.size(); ++i) wrong += r[i] != std::sqrt(values[i]);
  EXPECT_EQ(wrong, 0);
}

TEST(Unary, SoftmaxOfMaskedEntriesIsExactlyZero) {
  const double inf = std::numeric_limits<double>::infinity();
  for (DType dtype : {DType::kFloat32, DType::kFloat64}) {
    SCOPED_TRACE(dtype_name(dtype));
    Tensor x = Tensor::from_vector(std::vector<double>{0.0, 1e30, -1e30, -inf}, {1, 4}).to(dtype);
    std::vector<double> p = softmax(x, 1).to(DType::kFloat64).to_vector<double>();
    EXPECT_EQ(p, (std::vector<double>{0.0, 1.0, 0.0, 0.0}));
  }
}

// ---------------------------------------------------------------- binary

struct BinaryCase {
  BinaryOp op;
  Tensor (*fn)(const Tensor&, const Tensor&);
  bool integer_ok;
};

const BinaryCase kBinaryCases[] = {
    {BinaryOp::kAdd, &add, true},     {BinaryOp::kSub, &sub, true},
    {BinaryOp::kMul, &mul, true},     {BinaryOp::kDiv, &div, true},
    {BinaryOp::kPow, &pow, true},     {BinaryOp::kMax, &maximum, true},
    {BinaryOp::kMin, &minimum, true}, {BinaryOp::kEq, &eq, true},
    {BinaryOp::kNe, &ne, true},       {BinaryOp::kLt, &lt, true},
    {BinaryOp::kLe, &le, true},       {BinaryOp::kGt, &gt, true},
    {BinaryOp::kGe, &ge, true},
};

// Shape pairs that broadcast (incl. 0-d, size-0 and size-1 dims).
const std::pair<Shape, Shape> kBroadcastPairs[] = {
    {{3, 4}, {3, 4}},   {{3, 4}, {4}},        {{3, 1}, {1, 4}},       {{2, 3, 4}, {3, 1}},
    {{}, {2, 3}},       {{0, 3}, {3}},        {{5, 1, 7}, {1, 6, 1}}, {{1}, {9}},
    {{4, 1}, {4, 33}},  {{2, 3, 40}, {2, 3, 40}},
};

// Inputs for op: values that keep pow/div well defined; comparisons use small integers so
// that equality actually occurs.
std::pair<double, double> range_a(BinaryOp op, bool integer) {
  if (op == BinaryOp::kPow) return integer ? std::pair{-3.0, 3.0} : std::pair{0.25, 2.0};
  if (op >= BinaryOp::kEq || integer) return {-4.0, 4.0};
  return {-3.0, 3.0};
}
std::pair<double, double> range_b(BinaryOp op, bool integer) {
  if (op == BinaryOp::kPow) return integer ? std::pair{0.0, 4.0} : std::pair{-2.0, 2.0};
  if (op == BinaryOp::kDiv) return integer ? std::pair{1.0, 5.0} : std::pair{0.5, 3.0};
  if (op >= BinaryOp::kEq || integer) return {-4.0, 4.0};
  return {-3.0, 3.0};
}

// A random tensor whose values are small integers (stored in a float dtype too).
Tensor small_int_view(const Shape& shape, DType dtype, uint64_t seed, Layout layout, double lo, double hi) {
  Tensor t = random_view(shape, dtype, seed, layout, lo, hi);
  if (is_floating_point(dtype) && t.numel() > 0) {
    // Round the values in place through the naive accessor (the view keeps its layout).
    for_each_index(shape, [&](const Index& idx) { set_element(t, idx, std::round(get_element(t, idx))); });
  }
  return t;
}

TEST(Binary, AllOpsBroadcastOverLayoutsAndDtypes) {
  uint64_t seed = 100;
  for (const auto& c : kBinaryCases) {
    for (DType dtype : kAllDTypes) {
      const bool integer = !is_floating_point(dtype);
      if (integer && !c.integer_ok) continue;
      const bool compare = c.op >= BinaryOp::kEq;
      for (const auto& [sa, sb] : kBroadcastPairs) {
        for (Layout la : {Layout::kContiguous, Layout::kTransposed, Layout::kSliced, Layout::kPermuted}) {
          SCOPED_TRACE(std::string(kernels::binary_op_name(c.op)) + " " + trace(dtype, sa, la) +
                       " with " + shape_str(sb));
          auto [alo, ahi] = range_a(c.op, integer);
          auto [blo, bhi] = range_b(c.op, integer);
          Tensor a = compare ? small_int_view(sa, dtype, ++seed, la, alo, ahi)
                             : random_view(sa, dtype, ++seed, la, alo, ahi);
          Tensor b = compare ? small_int_view(sb, dtype, ++seed, Layout::kOffset, blo, bhi)
                             : random_view(sb, dtype, ++seed, Layout::kOffset, blo, bhi);
          Tensor y = c.fn(a, b);
          RefTensor expected = ref_binary(c.op, to_ref(a), to_ref(b));
          if (integer) {
            EXPECT_TRUE(expect_equal(y, rounded(expected, dtype)));
          } else {
            EXPECT_TRUE(expect_close(y, expected, tolerance_for(dtype)));
          }
        }
      }
    }
  }
}

TEST(Binary, ComparisonsReturnOneAndZeroInTheOperandDtype) {
  Tensor a = Tensor::from_vector<float>({1, 2, 3}, {3});
  Tensor b = Tensor::from_vector<float>({3, 2, 1}, {3});
  Tensor y = lt(a, b);
  EXPECT_EQ(y.dtype(), DType::kFloat32);
  EXPECT_EQ(y.to_vector<float>(), (std::vector<float>{1, 0, 0}));
  EXPECT_EQ(eq(a, b).to_vector<float>(), (std::vector<float>{0, 1, 0}));
  EXPECT_EQ(ge(a, b).to_vector<float>(), (std::vector<float>{0, 1, 1}));
}

TEST(Binary, ExpandedOperandsWithZeroStrides) {
  for (DType dtype : kFloatTypes) {
    SCOPED_TRACE(dtype_name(dtype));
    Tensor a = random_expanded({1, 5}, {4, 5}, dtype, 1);
    Tensor b = random_expanded({4, 1}, {4, 5}, dtype, 2);
    EXPECT_EQ(a.stride(0), 0);
    EXPECT_TRUE(expect_close(mul(a, b), ref_binary(BinaryOp::kMul, to_ref(a), to_ref(b)),
                             tolerance_for(dtype)));
    EXPECT_TRUE(expect_close(add(a, a), ref_binary(BinaryOp::kAdd, to_ref(a), to_ref(a)),
                             tolerance_for(dtype)));
  }
}

TEST(Binary, IntegerDivisionTruncatesAndZeroDivisorThrows) {
  Tensor a = Tensor::from_vector<int64_t>({7, -7, 9, 0}, {4});
  Tensor b = Tensor::from_vector<int64_t>({2, 2, -4, 3}, {4});
  EXPECT_EQ(div(a, b).to_vector<int64_t>(), (std::vector<int64_t>{3, -3, -2, 0}));
  Tensor z = Tensor::from_vector<int64_t>({1, 0, 1, 1}, {4});
  EXPECT_TRUE(throws_with([&] { div(a, z); }, {"div", "zero"}));
  EXPECT_TRUE(throws_with([&] { div(a, 0.0); }, {"div", "zero"}));
}

TEST(Binary, MaximumMinimumPropagateNaN) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  Tensor a = Tensor::from_vector<float>({nan, 1, 2}, {3});
  Tensor b = Tensor::from_vector<float>({1, nan, 1}, {3});
  std::vector<float> mx = maximum(a, b).to_vector<float>();
  std::vector<float> mn = minimum(a, b).to_vector<float>();
  EXPECT_TRUE(std::isnan(mx[0]) && std::isnan(mx[1]));
  EXPECT_EQ(mx[2], 2.0f);
  EXPECT_TRUE(std::isnan(mn[0]) && std::isnan(mn[1]));
  EXPECT_EQ(mn[2], 1.0f);
}

// ---------------------------------------------------------------- scalar

struct ScalarCase {
  BinaryOp op;
  Tensor (*fn)(const Tensor&, double);
};
const ScalarCase kScalarCases[] = {
    {BinaryOp::kAdd, &add}, {BinaryOp::kSub, &sub}, {BinaryOp::kMul, &mul}, {BinaryOp::kDiv, &div},
    {BinaryOp::kPow, &pow}, {BinaryOp::kGt, &gt},   {BinaryOp::kLt, &lt},   {BinaryOp::kEq, &eq},
};

TEST(BinaryScalar, AllOpsAllDtypes) {
  uint64_t seed = 500;
  for (const auto& c : kScalarCases) {
    for (DType dtype : kAllDTypes) {
      const bool integer = !is_floating_point(dtype);
      for (const Shape& shape : kShapes) {
        for (Layout layout : {Layout::kContiguous, Layout::kSliced, Layout::kTransposed}) {
          SCOPED_TRACE(std::string(kernels::binary_op_name(c.op)) + " " + trace(dtype, shape, layout));
          const double scalar = c.op == BinaryOp::kPow ? 2.0 : (c.op == BinaryOp::kEq ? 1.0 : (integer ? 3.0 : 1.75));
          Tensor a = c.op == BinaryOp::kEq ? small_int_view(shape, dtype, ++seed, layout, -2, 2)
                                           : random_view(shape, dtype, ++seed, layout,
                                                         integer ? -20 : 0.1, integer ? 20 : 3);
          RefTensor expected = ref_binary_scalar(c.op, to_ref(a), scalar);
          if (integer) {
            EXPECT_TRUE(expect_equal(c.fn(a, scalar), rounded(expected, dtype)));
          } else {
            EXPECT_TRUE(expect_close(c.fn(a, scalar), expected, tolerance_for(dtype)));
          }
        }
      }
    }
  }
}

// An integer tensor compared with a scalar it cannot hold: the scalar used to be truncated to
// the dtype (2.5 -> 2, -0.5 -> 0, NaN -> 0, 1e30 -> max), so lt(int{2}, 2.5) was 0 and
// eq(int{2}, 2.5) was 1. The answers are now those of comparing the exact values, as
// PyTorch gives.
TEST(BinaryScalar, IntegerComparedWithAFractionIsExact) {
  using Fn = Tensor (*)(const Tensor&, double);
  struct Case {
    const char* name;
    Fn fn;
    bool (*exact)(double, double);
  };
  const Case cases[] = {
      {"lt", &lt, [](double x, double s) { return x < s; }},
      {"le", &le, [](double x, double s) { return x <= s; }},
      {"gt", &gt, [](double x, double s) { return x > s; }},
      {"ge", &ge, [](double x, double s) { return x >= s; }},
      {"eq", &eq, [](double x, double s) { return x == s; }},
      {"ne", &ne, [](double x, double s) { return x != s; }},
  };
  const double inf = std::numeric_limits<double>::infinity();
  const std::vector<double> xs = {-3, -1, 0, 1, 2, 3};
  for (DType dtype : kIntTypes) {
    Tensor a = Tensor::from_vector<double>(xs, {6}).to(dtype);
    for (double s : {2.5, -0.5, 2.0, 1e30, -1e30, inf, -inf, std::nan("")}) {
      for (const Case& c : cases) {
        SCOPED_TRACE(std::string(c.name) + " " + dtype_name(dtype) + " vs " + std::to_string(s));
        std::vector<int64_t> want;
        for (double x : xs) want.push_back(c.exact(x, s) ? 1 : 0);
        Tensor y = c.fn(a, s);
        EXPECT_EQ(y.dtype(), dtype);
        EXPECT_EQ(y.to(DType::kInt64).to_vector<int64_t>(), want);
      }
    }
  }
  // int64 near its limits: exact, where a comparison in double would round x (2^53 + 1).
  const int64_t big = (int64_t{1} << 53) + 1, max = std::numeric_limits<int64_t>::max();
  Tensor a = Tensor::from_vector<int64_t>({big, max, std::numeric_limits<int64_t>::min()}, {3});
  EXPECT_EQ(eq(a, 9007199254740992.0).to_vector<int64_t>(), (std::vector<int64_t>{0, 0, 0}));
  EXPECT_EQ(gt(a, 9007199254740992.0).to_vector<int64_t>(), (std::vector<int64_t>{1, 1, 0}));
  EXPECT_EQ(lt(a, 9223372036854775808.0).to_vector<int64_t>(), (std::vector<int64_t>{1, 1, 1}));  // 2^63
  EXPECT_EQ(ge(a, -9223372036854775808.0).to_vector<int64_t>(), (std::vector<int64_t>{1, 1, 1}));
}

TEST(BinaryScalar, OperatorsMatchFunctions) {
  Tensor a = random_tensor({3, 4}, DType::kFloat64, 9);
  Tensor b = random_tensor({4}, DType::kFloat64, 10);
  RefTensor ra = to_ref(a), rb = to_ref(b);
  Tolerance tol = tolerance_for(DType::kFloat64);
  EXPECT_TRUE(expect_close(a + b, ref_binary(BinaryOp::kAdd, ra, rb), tol));
  EXPECT_TRUE(expect_close(a - b, ref_binary(BinaryOp::kSub, ra, rb), tol));
  EXPECT_TRUE(expect_close(a * b, ref_binary(BinaryOp::kMul, ra, rb), tol));
  EXPECT_TRUE(expect_close(-a, ref_unary(UnaryOp::kNeg, ra), tol));
  EXPECT_TRUE(expect_close(a * 2.5, ref_binary_scalar(BinaryOp::kMul, ra, 2.5), tol));
  EXPECT_TRUE(expect_close(a / 4.0, ref_binary_scalar(BinaryOp::kDiv, ra, 4.0), tol));
  EXPECT_TRUE(expect_close(a - 1.0, ref_binary_scalar(BinaryOp::kSub, ra, 1.0), tol));
}

// ---------------------------------------------------------------- where, masked_fill

TEST(Where, BroadcastsConditionAndValues) {
  uint64_t seed = 900;
  for (DType dtype : kAllDTypes) {
    for (DType cond_dtype : {dtype, DType::kInt64, DType::kFloat32}) {
      SCOPED_TRACE(std::string(dtype_name(dtype)) + " cond " + dtype_name(cond_dtype));
      Tensor cond = random_view({3, 1}, cond_dtype, ++seed, Layout::kSliced, 0, 1);
      if (is_floating_point(cond_dtype)) cond = gt(cond, 0.5);
      Tensor a = random_view({3, 4}, dtype, ++seed, Layout::kTransposed, -9, 9);
      Tensor b = random_tensor({4}, dtype, ++seed, -9, 9);
      EXPECT_TRUE(expect_equal(where(cond, a, b), ref_where(to_ref(cond), to_ref(a), to_ref(b))));
      Tensor cond_full = random_view({2, 3, 4}, cond_dtype, ++seed, Layout::kPermuted, 0, 1);
      EXPECT_TRUE(expect_equal(where(cond_full, a, b),
                               ref_where(to_ref(cond_full), to_ref(a), to_ref(b))));
    }
  }
}

TEST(Where, MaskedFill) {
  Tensor a = random_tensor({4, 5}, DType::kFloat32, 3);
  Tensor mask = gt(a, 0.0);
  RefTensor expected = ref_where(to_ref(mask), RefTensor({}, -7.0), to_ref(a));
  EXPECT_TRUE(expect_equal(masked_fill(a, mask, -7.0), expected));
}

// ---------------------------------------------------------------- in-place

TEST(InPlace, AddMulDivIntoViews) {
  for (DType dtype : kFloatTypes) {
    SCOPED_TRACE(dtype_name(dtype));
    Tensor base = random_tensor({6, 8}, dtype, 11);
    RefTensor before = to_ref(base);
    Tensor view = base.slice(1, 1, 8, 2).t();  // [4, 6], non-contiguous
    Tensor b = random_tensor({6}, dtype, 12);
    RefTensor expected_view = ref_binary(BinaryOp::kAdd, to_ref(view),
                                         ref_binary_scalar(BinaryOp::kMul, to_ref(b), 0.5));
    add_(view, b, 0.5);
    EXPECT_TRUE(expect_close(view, expected_view, tolerance_for(dtype)));
    // Columns of base that the view does not cover are untouched.
    RefTensor after = to_ref(base);
    for (int64_t i = 0; i < 6; ++i)
      for (int64_t j = 0; j < 8; j += 2) EXPECT_EQ(after.at({i, j}), before.at({i, j}));
    RefTensor v = to_ref(view);
    mul_(view, 3.0);
    EXPECT_TRUE(expect_close(view, ref_binary_scalar(BinaryOp::kMul, v, 3.0), tolerance_for(dtype)));
    v = to_ref(view);
    div_(view, 2.0);
    EXPECT_TRUE(expect_close(view, ref_binary_scalar(BinaryOp::kDiv, v, 2.0), tolerance_for(dtype)));
    v = to_ref(view);
    Tensor m = random_tensor({4, 1}, dtype, 13);
    mul_(view, m);
    EXPECT_TRUE(expect_close(view, ref_binary(BinaryOp::kMul, v, to_ref(m)), tolerance_for(dtype)));
  }
}

// As PyTorch: a source that partly overlaps the destination is an error (the result would
// depend on the order of writes); the very same view is fine; so is a disjoint view of
// the same storage.
// Two views that differ only in the stride of a size-1 dim (x.view({1, 3}) and x, broadcast to
// [1, 3] with stride 0 there; a row taken with narrow and with select) are the same elements in
// the same order: an elementwise in-place op between them is x op= x, as in PyTorch. They were
// refused as "partly overlapping".
TEST(InPlace, ViewsDifferingOnlyInASizeOneDimStrideAreTheSameElements) {
  Tensor x = Tensor::from_vector(std::vector<float>{1, 2, 3}, {3});
  Tensor row = x.view({1, 3});
  add_(row, x);
  EXPECT_EQ(x.to_vector<float>(), (std::vector<float>{2, 4, 6}));
  mul_(row, x);
  EXPECT_EQ(x.to_vector<float>(), (std::vector<float>{4, 16, 36}));
  row.copy_(x);  // a no-op
  EXPECT_EQ(x.to_vector<float>(), (std::vector<float>{4, 16, 36}));
  Tensor m = Tensor::from_vector(std::vector<float>{1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor first = m.narrow(0, 1, 1);  // [1, 3], stride 3 in dim 0
  add_(first, m.select(0, 1), 2.0);  // [3] broadcast to [1, 3], stride 0 in dim 0
  EXPECT_EQ(m.to_vector<float>(), (std::vector<float>{1, 2, 3, 12, 15, 18}));
  // Still refused: a shifted view of the same memory, here with a size-1 dim too.
  Tensor four = Tensor::from_vector(std::vector<float>{1, 2, 3, 4}, {4});
  Tensor head = four.narrow(0, 0, 3).view({1, 3});
  EXPECT_THROW(add_(head, four.narrow(0, 1, 3)), Error);
  EXPECT_EQ(four.to_vector<float>(), (std::vector<float>{1, 2, 3, 4}));
}

TEST(InPlace, OverlappingSourceAndDestinationAreRejected) {
  Tensor x = Tensor::from_vector(std::vector<float>{1, 2, 3, 4}, {2, 2});
  Tensor t = x.t();
  EXPECT_THROW(add_(x, t), Error);
  EXPECT_THROW(mul_(x, t), Error);
  EXPECT_THROW(x.copy_(t), Error);
  Tensor row = x.select(0, 0);
  EXPECT_THROW(add_(x, row), Error);  // a row of x broadcast over x
  try {
    add_(x, t);
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("clone()"), std::string::npos) << e.what();
  }
  EXPECT_EQ(x.to_vector<float>(), (std::vector<float>{1, 2, 3, 4}));  // nothing was written
  add_(x, x);                                                          // same view: x = 2x
  EXPECT_EQ(x.to_vector<float>(), (std::vector<float>{2, 4, 6, 8}));
  add_(x, t.clone());  // the fix the message names: [[2, 4], [6, 8]] + [[2, 6], [4, 8]]
  EXPECT_EQ(x.to_vector<float>(), (std::vector<float>{4, 10, 10, 16}));
  Tensor flat = Tensor::from_vector(std::vector<float>{1, 2, 3, 4, 5, 6}, {6});
  Tensor head = flat.slice(0, 0, 3), tail = flat.slice(0, 3, 6);
  add_(head, tail);  // disjoint halves of one storage
  EXPECT_EQ(flat.to_vector<float>(), (std::vector<float>{5, 7, 9, 4, 5, 6}));
  x.copy_(x);  // a no-op
  EXPECT_EQ(x.to_vector<float>(), (std::vector<float>{4, 10, 10, 16}));
  // A destination with several elements at one address (an expanded view).
  Tensor one = Tensor::from_vector(std::vector<float>{1}, {1});
  Tensor expanded = one.expand({3});
  EXPECT_THROW(add_(expanded, Tensor::from_vector(std::vector<float>{1, 2, 3}, {3})), Error);
}

TEST(InPlace, AddWithAlphaContiguousFastPathAndIntegers) {
  for (DType dtype : kFloatTypes) {
    SCOPED_TRACE(dtype_name(dtype));
    Tensor a = random_tensor({1000}, dtype, 21);
    Tensor b = random_tensor({1000}, dtype, 22);
    RefTensor expected = ref_binary(BinaryOp::kAdd, to_ref(a), ref_binary_scalar(BinaryOp::kMul, to_ref(b), -0.25));
    add_(a, b, -0.25);  // the optimizers' update: one fused pass
    EXPECT_TRUE(expect_close(a, expected, tolerance_for(dtype)));
  }
  Tensor i = arange(0, 10, 1, DType::kInt64);
  add_(i, arange(0, 10, 1, DType::kInt64), 2.0);
  EXPECT_EQ(i.to_vector<int64_t>(), (std::vector<int64_t>{0, 3, 6, 9, 12, 15, 18, 21, 24, 27}));
}

// ---------------------------------------------------------------- finiteness

TEST(Finite, AllFiniteFindsInfAndNaNAnywhere) {
  const double specials[] = {std::numeric_limits<double>::infinity(),
                             -std::numeric_limits<double>::infinity(),
                             std::numeric_limits<double>::quiet_NaN()};
  uint64_t seed = 40;
  for (DType dtype : kFloatTypes) {
    for (Layout layout : kAllLayouts) {
      SCOPED_TRACE(trace(dtype, {37, 41}, layout));
      Tensor a = random_view({37, 41}, dtype, ++seed, layout);
      EXPECT_TRUE(all_finite(a));
      EXPECT_TRUE(expect_equal(isfinite(a), RefTensor({37, 41}, 1.0)));
      for (double s : specials) {
        const Index where_idx = {static_cast<int64_t>(seed % 37), static_cast<int64_t>((seed * 7) % 41)};
        const double old = get_element(a, where_idx);
        set_element(a, where_idx, s);
        EXPECT_FALSE(all_finite(a)) << "special " << s;
        RefTensor expected({37, 41}, 1.0);
        expected.at(where_idx) = 0.0;
        EXPECT_TRUE(expect_equal(isfinite(a), expected));
        set_element(a, where_idx, old);
        EXPECT_TRUE(all_finite(a));
      }
    }
  }
  // The last element of a long contiguous run (past the vector body) is checked too.
  Tensor big = zeros({100003});
  set_element(big, {100002}, std::numeric_limits<double>::infinity());
  EXPECT_FALSE(all_finite(big));
  // Integers are always finite; empty tensors too.
  EXPECT_TRUE(all_finite(random_tensor({5}, DType::kInt32, 1, -9, 9)));
  EXPECT_TRUE(all_finite(zeros({0, 3})));
}

// The test helpers compare like torch.allclose: equal values are close, equal infinities too
// (their difference is NaN, so allclose(inf, inf) was false and max_abs_diff inf); a NaN, an
// infinity of the other sign, or a finite value against an infinity is not (an infinite b made
// the tolerance rtol * |b| infinite, so allclose(1, inf) was true).
TEST(Compare, EqualInfinitiesAreCloseAndNaNIsNot) {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  Tensor a = Tensor::from_vector<float>({1, inf, -inf}, {3});
  EXPECT_TRUE(allclose(a, a.clone()));
  EXPECT_EQ(max_abs_diff(a, a.clone()), 0.0);
  EXPECT_TRUE(allclose(a, Tensor::from_vector<float>({1.000001f, inf, -inf}, {3})));
  EXPECT_FALSE(allclose(a, Tensor::from_vector<float>({1, -inf, -inf}, {3})));
  EXPECT_EQ(max_abs_diff(a, Tensor::from_vector<float>({1, -inf, -inf}, {3})), inf);
  EXPECT_FALSE(allclose(a, Tensor::from_vector<float>({1, 3e38f, -inf}, {3})));
  EXPECT_EQ(max_abs_diff(a, Tensor::from_vector<float>({1, 3e38f, -inf}, {3})), inf);
  EXPECT_FALSE(allclose(Tensor::from_vector<float>({1}, {1}), Tensor::from_vector<float>({inf}, {1})));
  EXPECT_FALSE(allclose(Tensor::from_vector<float>({-inf}, {1}), Tensor::from_vector<float>({inf}, {1})));
  Tensor n = Tensor::from_vector<float>({nan}, {1});
  EXPECT_FALSE(allclose(n, n));
  EXPECT_EQ(max_abs_diff(n, n), inf);
  EXPECT_EQ(max_abs_diff(Tensor::from_vector<float>({1, 2}, {2}), Tensor::from_vector<float>({1.5f, 2}, {2})), 0.5);
}

}  // namespace
}  // namespace ringtrain
