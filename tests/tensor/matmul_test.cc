// matmul_test.cc: matmul (2-D, batched, broadcast batch dims, 1-D operands,
// k = 0, size-0 dims) and linear against the float64 reference, with operands
// that are transposed (column-major Map), sliced (neither stride 1: copied),
// expanded and offset, in f32/f64/f16/bf16.
#include <cstdlib>
#include <string>

#include "tensor/kernels.h"

#include "tests/tensor/reference.h"

namespace ringtrain {
namespace {

using namespace ref;

const DType kFloatTypes[] = {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16};

const std::pair<Shape, Shape> kCases[] = {
    {{3, 4}, {4, 5}},          {{1, 1}, {1, 1}},          {{7, 0}, {0, 3}},
    {{0, 3}, {3, 2}},          {{3, 2}, {2, 0}},          {{2, 3, 4}, {2, 4, 5}},
    {{2, 3, 4}, {4, 5}},       {{4}, {4, 3}},             {{3, 4}, {4}},
    {{4}, {4}},                {{2, 1, 3, 4}, {5, 4, 2}}, {{65, 33}, {33, 17}},
    {{1, 9}, {9, 1}},          {{3, 130, 70}, {70, 40}},
};

int64_t inner_dim(const Shape& a) { return a.back(); }

TEST(Matmul, ShapesLayoutsDtypes) {
  uint64_t seed = 1;
  for (const auto& [sa, sb] : kCases) {
    for (DType dtype : kFloatTypes) {
      for (Layout la : kAllLayouts) {
        for (Layout lb : {Layout::kContiguous, Layout::kTransposed, Layout::kSliced}) {
          SCOPED_TRACE(std::string(dtype_name(dtype)) + " " + shape_str(sa) + " " + layout_name(la) +
                       " @ " + shape_str(sb) + " " + layout_name(lb));
          Tensor a = random_view(sa, dtype, ++seed, la);
          Tensor b = random_view(sb, dtype, ++seed, lb);
          Tensor y = matmul(a, b);
          EXPECT_EQ(y.dtype(), dtype);
          EXPECT_TRUE(expect_close(y, ref_matmul(to_ref(a), to_ref(b)),
                                   accumulate_tolerance_for(dtype, inner_dim(sa))));
        }
      }
    }
  }
}

TEST(Matmul, BroadcastBatchWithZeroStride) {
  for (DType dtype : {DType::kFloat32, DType::kFloat64}) {
    SCOPED_TRACE(dtype_name(dtype));
    Tensor a = random_expanded({1, 5, 6}, {4, 5, 6}, dtype, 3);
    Tensor b = random_view({4, 6, 3}, dtype, 4, Layout::kPermuted);
    EXPECT_TRUE(expect_close(matmul(a, b), ref_matmul(to_ref(a), to_ref(b)), accumulate_tolerance_for(dtype, 6)));
    // Rows broadcast inside a matrix (row stride 0): must not be mapped as is.
    Tensor c = random_expanded({1, 6}, {5, 6}, dtype, 5);
    EXPECT_TRUE(expect_close(matmul(c, b.select(0, 1)), ref_matmul(to_ref(c), to_ref(b.select(0, 1))),
                             accumulate_tolerance_for(dtype, 6)));
  }
}

TEST(Matmul, LargeSquareFloat32) {
  // Big enough for Eigen's blocked GEMM with several panels in every dim.
  Tensor a = random_tensor({300, 520}, DType::kFloat32, 7);
  Tensor b = random_view({520, 260}, DType::kFloat32, 8, Layout::kTransposed);
  EXPECT_TRUE(expect_close(matmul(a, b), ref_matmul(to_ref(a), to_ref(b)),
                           accumulate_tolerance_for(DType::kFloat32, 520)));
}

// The packed SGEMM's tiles (AVX-512 8x32, AVX2 6x16), its k slices (384 / 256 deep), A blocks
// (144 rows) and B blocks (4096 columns): every size just below, at and above a boundary, with
// the layouts that take different packing paths (B transposed: the 8x8 register transposes;
// B contiguous: the memcpy rows; sliced: the strided gathers). CTest runs this binary a second
// time with RINGTRAIN_CPU_GEMM=avx2, so both tiles are checked on an AVX-512 machine.
TEST(Matmul, EveryEdgeOfTheSgemmTilesAndBlocks) {
  struct Case {
    int64_t m, n, k;
  };
  const Case cases[] = {
      {1, 1, 1},     {8, 32, 8},    {7, 31, 9},     {9, 33, 7},    {6, 16, 383},  {5, 15, 384},
      {17, 47, 385}, {64, 64, 255}, {63, 65, 256},  {65, 17, 257}, {143, 40, 20}, {144, 48, 33},
      {145, 30, 12}, {12, 100, 400}, {3, 4100, 5},  {16, 4097, 17}, {64, 10, 769}, {2, 784, 64},
  };
  uint64_t seed = 100;
  for (const Case& c : cases) {
    for (Layout la : {Layout::kContiguous, Layout::kTransposed, Layout::kSliced}) {
      for (Layout lb : {Layout::kContiguous, Layout::kTransposed, Layout::kSliced}) {
        SCOPED_TRACE(std::to_string(c.m) + "x" + std::to_string(c.k) + " @ " + std::to_string(c.k) +
                     "x" + std::to_string(c.n) + " " + layout_name(la) + " @ " + layout_name(lb) +
                     " with " + kernels::cpu::sgemm_kernel_name());
        Tensor a = random_view({c.m, c.k}, DType::kFloat32, ++seed, la);
        Tensor b = random_view({c.k, c.n}, DType::kFloat32, ++seed, lb);
        EXPECT_TRUE(expect_close(matmul(a, b), ref_matmul(to_ref(a), to_ref(b)),
                                 accumulate_tolerance_for(DType::kFloat32, c.k)));
      }
    }
  }
}

// Which micro-kernel runs: the widest the build targets on this CPU, or the one
// RINGTRAIN_CPU_GEMM names. A build that silently fell back to Eigen or to the narrower tile
// would still pass every numeric test above, at a fraction of the speed.
TEST(Matmul, TheGemmKernelIsTheWidestTheBuildTargetsOrTheOneAskedFor) {
  const std::string name = kernels::cpu::sgemm_kernel_name();
  const char* env = std::getenv("RINGTRAIN_CPU_GEMM");
  if (env != nullptr && std::string(env) == "avx2") {
    EXPECT_EQ(name, "avx2 6x16");
    return;
  }
#if RINGTRAIN_TEST_NATIVE_BUILD && defined(__x86_64__)
  if (__builtin_cpu_supports("avx512f")) {
    EXPECT_EQ(name, "avx512 8x32");
  } else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    EXPECT_EQ(name, "avx2 6x16");
  } else {
    EXPECT_EQ(name, "eigen");
  }
#else
  GTEST_SKIP() << "RINGTRAIN_NATIVE is off: the kernel (" << name << ") depends on the compiler's defaults";
#endif
}

TEST(Matmul, IntegerAndMismatchedOperandsThrow) {
  Tensor ai = random_tensor({2, 3}, DType::kInt64, 1, 0, 3);
  EXPECT_TRUE(throws_with([&] { matmul(ai, ai.t()); }, {"matmul", "int64"}));
  Tensor a = random_tensor({2, 3}, DType::kFloat32, 1);
  Tensor b = random_tensor({4, 5}, DType::kFloat32, 2);
  EXPECT_TRUE(throws_with([&] { matmul(a, b); }, {"matmul", "[2, 3]", "[4, 5]"}));
  Tensor c = random_tensor({3, 5}, DType::kFloat64, 2);
  EXPECT_TRUE(throws_with([&] { matmul(a, c); }, {"matmul", "float32", "float64"}));
}

TEST(Matmul, OutVariantWritesTheSameResultIntoTheGivenTensor) {
  for (DType dtype : kFloatTypes) {
    SCOPED_TRACE(dtype_name(dtype));
    Tensor a = random_view({9, 7}, dtype, 21, Layout::kTransposed);
    Tensor b = random_view({7, 5}, dtype, 22, Layout::kSliced);
    Tensor flat = full({50}, 123.0, dtype);  // old values must be overwritten, not read
    Tensor out = flat.narrow(0, 3, 45).view({9, 5});
    matmul_out(a, b, out);
    EXPECT_EQ(out.to_vector<double>(), matmul(a, b).to_vector<double>());
    EXPECT_EQ(flat.to_vector<double>()[2], 123.0);  // nothing outside `out` touched
    EXPECT_EQ(flat.to_vector<double>()[48], 123.0);
  }
  Tensor a = random_tensor({2, 3}, DType::kFloat32, 1);
  Tensor b = random_tensor({3, 4}, DType::kFloat32, 2);
  EXPECT_TRUE(throws_with([&] { matmul_out(a, b, full({4, 2}, 0.0)); }, {"matmul_out", "[2, 4]", "[4, 2]"}));
  EXPECT_TRUE(throws_with([&] { matmul_out(a, b, full({4, 2}, 0.0).t()); }, {"matmul_out", "contiguous"}));
  EXPECT_TRUE(throws_with([&] { matmul_out(a, b, full({2, 4}, 0.0, DType::kFloat64)); },
                          {"matmul_out", "float32", "float64"}));
}

TEST(Linear, WithAndWithoutBias) {
  for (DType dtype : kFloatTypes) {
    SCOPED_TRACE(dtype_name(dtype));
    Tensor x = random_view({2, 3, 8}, dtype, 11, Layout::kSliced);
    Tensor w = random_tensor({5, 8}, dtype, 12);
    Tensor bias = random_tensor({5}, dtype, 13);
    Tolerance tol = accumulate_tolerance_for(dtype, 9);
    EXPECT_TRUE(expect_close(linear(x, w, bias), ref_linear(to_ref(x), to_ref(w), to_ref(bias)), tol));
    EXPECT_TRUE(expect_close(linear(x, w, Tensor()), ref_linear(to_ref(x), to_ref(w), std::nullopt), tol));
  }
  Tensor x = random_tensor({2, 7}, DType::kFloat32, 1);
  Tensor w = random_tensor({5, 8}, DType::kFloat32, 2);
  EXPECT_TRUE(throws_with([&] { linear(x, w, Tensor()); }, {"linear", "[2, 7]", "[5, 8]"}));
}

}  // namespace
}  // namespace ringtrain
