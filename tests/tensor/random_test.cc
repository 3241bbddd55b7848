// random_test.cc: the seeded Philox generator: known-answer vectors from the
// Philox4x32-10 specification (Random123's kat_vectors), same seed -> same numbers,
// state save/restore, and the statistics of uniform/normal/bernoulli/randperm.
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <set>
#include <string>
#include <utility>

#include "tests/tensor/reference.h"

namespace ringtrain {
namespace {

using namespace ref;

TEST(Generator, PhiloxKnownAnswers) {
  // Random123 kat_vectors: philox4x32 10, counter {0,0,0,0}, key {0,0}.
  Generator gen(0);
  uint32_t words[4];
  gen.next_uint32(words, 4);
  EXPECT_EQ(words[0], 0x6627e8d5u);
  EXPECT_EQ(words[1], 0xe169c58du);
  EXPECT_EQ(words[2], 0xbc57ac4cu);
  EXPECT_EQ(words[3], 0x9b00dbd8u);
  // Counter block 5 under key (lo, hi) of the seed, from the same specification.
  Generator g2(0x123456789abcdef0ULL);
  g2.set_state(0x123456789abcdef0ULL, 20);
  g2.next_uint32(words, 4);
  EXPECT_EQ(words[0], 0x6e774984u);
  EXPECT_EQ(words[1], 0xbd12799eu);
  EXPECT_EQ(words[2], 0xe50d5f10u);
  EXPECT_EQ(words[3], 0x28d3e2a7u);
}

TEST(Generator, SameSeedSameNumbersAndRestorableState) {
  Generator a(1234), b(1234), c(1235);
  Tensor x = randn({1000}, a);
  Tensor y = randn({1000}, b);
  Tensor z = randn({1000}, c);
  EXPECT_EQ(x.to_vector<float>(), y.to_vector<float>());
  EXPECT_NE(x.to_vector<float>(), z.to_vector<float>());
  // Offsets advance by the words consumed; restoring the state replays the stream.
  uint64_t offset = a.offset();
  EXPECT_EQ(offset, 1000u);
  Tensor next = rand({17}, a);
  a.set_state(1234, offset);
  EXPECT_EQ(rand({17}, a).to_vector<float>(), next.to_vector<float>());
  // Word-by-word consumption gives the same stream as a bulk request.
  Generator d(99), e(99);
  std::vector<uint32_t> bulk(11), single(11);
  d.next_uint32(bulk.data(), bulk.size());
  for (auto& w : single) e.next_uint32(&w, 1);
  EXPECT_EQ(bulk, single);
  a.manual_seed(1234);
  EXPECT_EQ(randn({1000}, a).to_vector<float>(), x.to_vector<float>());
}

TEST(Generator, UniformStatistics) {
  Generator gen(7);
  Tensor u = rand({200000}, gen, DType::kFloat64);
  std::vector<double> v = u.to_vector<double>();
  EXPECT_GE(*std::min_element(v.begin(), v.end()), 0.0);
  EXPECT_LT(*std::max_element(v.begin(), v.end()), 1.0);
  double mean = std::accumulate(v.begin(), v.end(), 0.0) / v.size();
  double var = 0;
  for (double x : v) var += (x - mean) * (x - mean);
  var /= v.size();
  // Standard errors: mean 0.29/sqrt(n) = 6.5e-4, variance ~1.9e-4: allow 5 sigma.
  EXPECT_NEAR(mean, 0.5, 3.3e-3);
  EXPECT_NEAR(var, 1.0 / 12.0, 1e-3);
  Tensor w = Tensor::empty({1000}, DType::kFloat32);
  uniform_(w, -3.0, 5.0, gen);
  std::vector<float> wv = w.to_vector<float>();
  EXPECT_GE(*std::min_element(wv.begin(), wv.end()), -3.0f);
  EXPECT_LT(*std::max_element(wv.begin(), wv.end()), 5.0f);
}

TEST(Generator, NormalStatistics) {
  Generator gen(8);
  Tensor n = randn({200001}, gen, DType::kFloat64);  // odd count: Box-Muller pairs + one
  std::vector<double> v = n.to_vector<double>();
  double mean = std::accumulate(v.begin(), v.end(), 0.0) / v.size();
  double var = 0, fourth = 0;
  for (double x : v) {
    var += (x - mean) * (x - mean);
    fourth += std::pow(x - mean, 4);
  }
  var /= v.size();
  fourth /= v.size();
  EXPECT_NEAR(mean, 0.0, 0.012);         // 5 sigma of 1/sqrt(n)
  EXPECT_NEAR(var, 1.0, 0.016);          // 5 sigma of sqrt(2/n)
  EXPECT_NEAR(fourth / (var * var), 3.0, 0.06);  // kurtosis of a normal
  size_t within1 = std::count_if(v.begin(), v.end(), [](double x) { return std::fabs(x) < 1.0; });
  EXPECT_NEAR(static_cast<double>(within1) / v.size(), 0.6827, 0.005);
  Tensor m = Tensor::empty({50000}, DType::kFloat32);
  normal_(m, 10.0, 0.5, gen);
  EXPECT_NEAR(ringtrain::mean(m).item(), 10.0, 0.012);
}

TEST(Generator, BernoulliAndRandperm) {
  Generator gen(9);
  Tensor b = Tensor::empty({100000}, DType::kFloat32);
  bernoulli_(b, 0.3, gen);
  std::vector<float> bv = b.to_vector<float>();
  EXPECT_TRUE(std::all_of(bv.begin(), bv.end(), [](float x) { return x == 0.0f || x == 1.0f; }));
  double p = std::accumulate(bv.begin(), bv.end(), 0.0) / bv.size();
  EXPECT_NEAR(p, 0.3, 0.0075);  // 5 sigma of sqrt(p(1-p)/n)
  Tensor perm = randperm(1000, gen);
  EXPECT_EQ(perm.dtype(), DType::kInt64);
  std::vector<int64_t> pv = perm.to_vector<int64_t>();
  std::vector<int64_t> sorted = pv;
  std::sort(sorted.begin(), sorted.end());
  for (int64_t i = 0; i < 1000; ++i) EXPECT_EQ(sorted[static_cast<size_t>(i)], i);
  int64_t fixed = 0;
  for (int64_t i = 0; i < 1000; ++i) fixed += pv[static_cast<size_t>(i)] == i;
  EXPECT_LT(fixed, 8);  // a random permutation has ~1 fixed point
  Generator again(9);
  Tensor skip = Tensor::empty({100000}, DType::kFloat32);
  bernoulli_(skip, 0.3, again);
  EXPECT_EQ(randperm(1000, again).to_vector<int64_t>(), pv);
}

TEST(Generator, UniformStaysBelowHighInEveryDtype) {
  // Rounding a draw just below 1 to bfloat16 (8-bit significand) or float16 gives 1.0 for
  // about 0.2% / 0.02% of the values; those become `low`, as in PyTorch.
  for (DType dtype : {DType::kBFloat16, DType::kFloat16, DType::kFloat32}) {
    SCOPED_TRACE(dtype_name(dtype));
    Generator gen(7);
    std::vector<float> v = rand({200000}, gen, dtype).to(DType::kFloat32).to_vector<float>();
    EXPECT_LT(*std::max_element(v.begin(), v.end()), 1.0f);
    EXPECT_GE(*std::min_element(v.begin(), v.end()), 0.0f);
    Tensor t = Tensor::empty({200000}, dtype);
    uniform_(t, 1.0, 2.0, gen);
    std::vector<float> u = t.to(DType::kFloat32).to_vector<float>();
    EXPECT_LT(*std::max_element(u.begin(), u.end()), 2.0f);
    EXPECT_GE(*std::min_element(u.begin(), u.end()), 1.0f);
  }
}

// Non-finite bounds or a range whose width overflows used to fill the tensor with inf/NaN
// (low + (high - low) * u); bounds a narrow dtype cannot hold were stored as inf.
TEST(Generator, UniformRejectsNonFiniteBoundsAndRanges) {
  const double inf = std::numeric_limits<double>::infinity(), nan = std::nan("");
  Generator gen(1);
  Tensor t = Tensor::empty({4}, DType::kFloat64);
  for (auto [low, high] :
       {std::pair{0.0, inf}, std::pair{-inf, 0.0}, std::pair{nan, 1.0}, std::pair{0.0, nan}}) {
    SCOPED_TRACE(std::to_string(low) + ", " + std::to_string(high));
    EXPECT_TRUE(throws_with([&] { uniform_(t, low, high, gen); }, {"uniform_", "finite"}));
  }
  const double big = std::numeric_limits<double>::max();
  EXPECT_TRUE(throws_with([&] { uniform_(t, -big, big, gen); }, {"uniform_", "too wide", "overflows"}));
  Tensor h = Tensor::empty({4}, DType::kFloat16);
  EXPECT_TRUE(throws_with([&] { uniform_(h, -1e5, 1e5, gen); }, {"uniform_", "float16", "out of range"}));
  // The widest finite cases still work, and every value is finite.
  uniform_(t, -big / 2, big / 2, gen);
  for (double v : t.to_vector<double>()) EXPECT_TRUE(std::isfinite(v)) << v;
  uniform_(h, -65504.0, 65504.0, gen);
  for (float v : h.to(DType::kFloat32).to_vector<float>()) EXPECT_TRUE(std::isfinite(v)) << v;
}

}  // namespace
}  // namespace ringtrain
