// cuda_ops_test.cc: every tensor op on CUDA tensors against the same op on the CPU.
//
// Inputs are made on the GPU (contiguous and as non-contiguous views: transposed,
// sliced, offset, permuted, broadcast), copied to the CPU, and both devices run
// the op from tensor/ops.h; the results must agree within the dtype's tolerance
// (exactly for integers and indices). Covers elementwise math (unary, binary with
// broadcasting, scalar, where, in-place on strided views), reductions (all three
// kernel shapes: thread-per-output, block-per-output, chunked), max/argmax,
// matmul (transposed and batched operands, f16/bf16 tensor-core paths),
// conv2d forward/backward (stride, padding, dilation, groups), pooling,
// softmax/log_softmax forward/backward, cross-entropy, gather/index_select/
// index_add, all_finite, cat/stack, factories and seeded random numbers.
//
// Label: cuda. Without a usable GPU every test skips with the runtime's reason.
#include <cmath>
#include <initializer_list>
#include <limits>
#include <string>
#include <vector>

#include "tests/tensor/cuda_test_util.h"

namespace ringtrain {
namespace {

using namespace ref;
using cuda_test::CudaTest;
using cuda_test::expect_matches_cpu;
using cuda_test::kCuda;
using cuda_test::kFloatTypes;
using cuda_test::trace;
using cuda_test::twice;

// ---------------------------------------------------------------- elementwise

struct UnaryCase {
  const char* name;
  Tensor (*fn)(const Tensor&);
  double lo, hi;
};
const UnaryCase kUnary[] = {
    {"neg", &neg, -3, 3},          {"exp", &exp, -3, 3},       {"log", &log, 0.05, 5},
    {"sqrt", &sqrt, 0, 5},         {"abs", &abs, -3, 3},       {"relu", &relu, -3, 3},
    {"gelu", &gelu, -4, 4},        {"gelu_grad", &gelu_grad, -4, 4},
    {"tanh", &tanh, -5, 5},        {"sigmoid", &sigmoid, -8, 8}, {"isfinite", &isfinite, -3, 3},
};

TEST_F(CudaTest, UnaryMatchesCpuOnEveryLayoutAndDtype) {
  uint64_t seed = 100;
  for (const auto& c : kUnary) {
    for (DType dtype : kFloatTypes) {
      for (const Shape& shape : std::vector<Shape>{{}, {7}, {3, 5}, {0, 4}, {4, 3, 33}}) {
        for (Layout layout : kAllLayouts) {
          SCOPED_TRACE(std::string(c.name) + " " + trace(dtype, shape, layout));
          Tensor x = random_view(shape, dtype, ++seed, layout, c.lo, c.hi, kCuda);
          EXPECT_TRUE(expect_matches_cpu(c.fn(x), c.fn(x.to(Device::cpu())),
                                         twice(tolerance_for(dtype))));
        }
      }
    }
  }
}

struct BinaryCase {
  const char* name;
  Tensor (*fn)(const Tensor&, const Tensor&);
  double lo, hi;
};
const BinaryCase kBinary[] = {
    {"add", &add, -3, 3}, {"sub", &sub, -3, 3}, {"mul", &mul, -3, 3}, {"div", &div, 0.5, 3},
    {"pow", &pow, 0.5, 2}, {"maximum", &maximum, -3, 3}, {"minimum", &minimum, -3, 3},
    {"eq", &eq, -3, 3}, {"ne", &ne, -3, 3}, {"lt", &lt, -3, 3}, {"le", &le, -3, 3},
    {"gt", &gt, -3, 3}, {"ge", &ge, -3, 3},
};

TEST_F(CudaTest, BinaryBroadcastingMatchesCpu) {
  uint64_t seed = 200;
  for (const auto& c : kBinary) {
    for (DType dtype : kFloatTypes) {
      for (Layout layout : kAllLayouts) {
        SCOPED_TRACE(std::string(c.name) + " " + trace(dtype, {4, 3, 5}, layout));
        Tensor a = random_view({4, 3, 5}, dtype, ++seed, layout, c.lo, c.hi, kCuda);
        Tensor b = random_view({3, 5}, dtype, ++seed, layout, c.lo, c.hi, kCuda);
        Tensor col = random_tensor({4, 1, 1}, dtype, ++seed, c.lo, c.hi, kCuda);
        auto tol = twice(tolerance_for(dtype));
        EXPECT_TRUE(expect_matches_cpu(c.fn(a, b), c.fn(a.to(Device::cpu()), b.to(Device::cpu())), tol));
        EXPECT_TRUE(expect_matches_cpu(c.fn(col, b), c.fn(col.to(Device::cpu()), b.to(Device::cpu())), tol));
        // Equal operands make the comparisons interesting (ties).
        EXPECT_TRUE(expect_matches_cpu(c.fn(a, a), c.fn(a.to(Device::cpu()), a.to(Device::cpu())), tol));
      }
    }
  }
}

TEST_F(CudaTest, IntegerArithmeticIsExact) {
  for (DType dtype : {DType::kInt32, DType::kInt64}) {
    SCOPED_TRACE(dtype_name(dtype));
    Tensor a = random_tensor({5, 6}, dtype, 1, -50, 50, kCuda);
    Tensor b = random_tensor({6}, dtype, 2, 1, 9, kCuda);
    Tensor ac = a.to(Device::cpu()), bc = b.to(Device::cpu());
    for (auto fn : {&add, &sub, &mul, &div, &maximum, &minimum, &lt, &eq}) {
      EXPECT_TRUE(expect_matches_cpu(fn(a, b), fn(ac, bc), {0, 0}));
    }
    EXPECT_TRUE(expect_matches_cpu(neg(a), neg(ac), {0, 0}));
    EXPECT_TRUE(expect_matches_cpu(abs(a), abs(ac), {0, 0}));
    EXPECT_TRUE(expect_matches_cpu(relu(a), relu(ac), {0, 0}));
    EXPECT_TRUE(expect_matches_cpu(mul(a, 3.0), mul(ac, 3.0), {0, 0}));
  }
}

// Overflow wraps around (two's complement) on both devices: the CUDA kernels share the
// CPU's wrapping_* helpers (dtype.h), so the results agree bit for bit. The CPU's values
// themselves are checked in errors_test (Misuse.IntegerOverflowWrapsAround).
TEST_F(CudaTest, IntegerOverflowWrapsAsOnTheCpu) {
  const int32_t max32 = std::numeric_limits<int32_t>::max(), min32 = std::numeric_limits<int32_t>::min();
  const int64_t max64 = std::numeric_limits<int64_t>::max(), min64 = std::numeric_limits<int64_t>::min();
  const Tensor inputs[][2] = {
      {Tensor::from_vector<int32_t>({max32, min32, min32, 65536, -7}, {5}),
       Tensor::from_vector<int32_t>({1, -1, 1, 65536, -1}, {5})},
      {Tensor::from_vector<int64_t>({max64, min64, min64, int64_t{1} << 32, -7}, {5}),
       Tensor::from_vector<int64_t>({1, -1, 1, int64_t{1} << 32, -1}, {5})}};
  for (const auto& [ac, bc] : inputs) {
    SCOPED_TRACE(dtype_name(ac.dtype()));
    Tensor a = ac.to(kCuda), b = bc.to(kCuda);
    using BinaryFn = Tensor (*)(const Tensor&, const Tensor&);
    for (BinaryFn fn : std::initializer_list<BinaryFn>{&add, &sub, &mul, &div, &pow}) {
      EXPECT_TRUE(expect_matches_cpu(fn(a, b), fn(ac, bc), {0, 0}));
    }
    EXPECT_TRUE(expect_matches_cpu(neg(a), neg(ac), {0, 0}));
    EXPECT_TRUE(expect_matches_cpu(abs(a), abs(ac), {0, 0}));
    EXPECT_TRUE(expect_matches_cpu(sum(a.narrow(0, 0, 1).expand({3})), sum(ac.narrow(0, 0, 1).expand({3})), {0, 0}));
  }
}

// Edge cases where the CUDA kernels once differed from the CPU's (review of the 11th session).
TEST_F(CudaTest, KernelEdgeCasesMatchTheCpu) {
  // A scalar that does not fit the integer dtype saturates as on the CPU (it was a
  // static_cast: INT_MIN on x86); an integer division by a scalar that is 0 as an integer throws.
  Tensor ints_cpu = Tensor::from_vector<int32_t>({1, -1, 3}, {3});
  Tensor ints = ints_cpu.to(kCuda);
  EXPECT_TRUE(expect_matches_cpu(mul(ints, 1e30), mul(ints_cpu, 1e30), {0, 0}));
  EXPECT_TRUE(expect_matches_cpu(mul(ints, std::nan("")), mul(ints_cpu, std::nan("")), {0, 0}));
  EXPECT_THROW(div(ints, 0.5), Error);
  // Integer pow is exact (3^39 needs 62 bits).
  Tensor base = Tensor::from_vector<int64_t>({3, -1, 5}, {3});
  Tensor expo = Tensor::from_vector<int64_t>({39, -3, -1}, {3});
  EXPECT_TRUE(expect_matches_cpu(pow(base.to(kCuda), expo.to(kCuda)), pow(base, expo), {0, 0}));
  // Softmax of a 0-d tensor is 1 (log_softmax 0), as on the CPU.
  Tensor scalar_cpu = full({}, 2.5);
  EXPECT_TRUE(expect_matches_cpu(softmax(scalar_cpu.to(kCuda), 0), softmax(scalar_cpu, 0), {0, 0}));
  EXPECT_TRUE(expect_matches_cpu(log_softmax(scalar_cpu.to(kCuda), 0), log_softmax(scalar_cpu, 0), {0, 0}));
  // index_add_ with a 2-d index ([2, 3] positions into dim 0 of [10, 4]).
  Tensor idx = Tensor::from_vector<int64_t>({0, 9, 3, 3, 5, 0}, {2, 3});
  Tensor src = arange(0, 24, 1).reshape({2, 3, 4});
  Tensor acc_cpu = zeros({10, 4});
  Tensor acc = acc_cpu.to(kCuda);
  index_add_(acc_cpu, 0, idx, src);
  index_add_(acc, 0, idx.to(kCuda), src.to(kCuda));
  EXPECT_TRUE(expect_matches_cpu(acc, acc_cpu, {0, 0}));
  // max_pool2d_backward with indices outside the input plane adds nothing there (it was an
  // out-of-bounds atomicAdd).
  // (The CPU kernel throws for an index past the plane; a kernel cannot, so it skips it.)
  Tensor bad = Tensor::from_vector<int64_t>({0, 4, -5, 3}, {1, 1, 2, 2});
  Tensor g = full({1, 1, 2, 2}, 1.0);
  EXPECT_EQ(max_pool2d_backward(g.to(kCuda), bad.to(kCuda), {1, 1, 2, 2}).to(Device::cpu()).to_vector<float>(),
            (std::vector<float>{1, 0, 0, 1}));
  // add_ with alpha in float16 rounds once: -60000 + 2 * 60000 = 60000, not inf.
  Tensor y_cpu = full({3}, -60000.0, DType::kFloat16), x_cpu = full({3}, 60000.0, DType::kFloat16);
  Tensor y = y_cpu.to(kCuda);
  add_(y_cpu, x_cpu, 2.0);
  add_(y, x_cpu.to(kCuda), 2.0);
  EXPECT_TRUE(expect_matches_cpu(y, y_cpu, {0, 0}));
  EXPECT_EQ(y.to(Device::cpu()).to(DType::kFloat32).to_vector<float>()[0], 60000.0f);
  // Cross-entropy targets outside the classes throw on the GPU too (gather reads 0 there).
  Tensor logits = zeros({2, 3}).to(kCuda);
  EXPECT_THROW(cross_entropy(logits, Tensor::from_vector<int64_t>({0, 3}, {2}).to(kCuda)), Error);
}

TEST_F(CudaTest, ScalarOpsMatchCpu) {
  uint64_t seed = 300;
  for (DType dtype : kFloatTypes) {
    for (Layout layout : kAllLayouts) {
      SCOPED_TRACE(trace(dtype, {6, 7}, layout));
      Tensor a = random_view({6, 7}, dtype, ++seed, layout, 0.2, 3, kCuda);
      Tensor c = a.to(Device::cpu());
      auto tol = twice(tolerance_for(dtype));
      EXPECT_TRUE(expect_matches_cpu(add(a, 2.5), add(c, 2.5), tol));
      EXPECT_TRUE(expect_matches_cpu(sub(a, 0.75), sub(c, 0.75), tol));
      EXPECT_TRUE(expect_matches_cpu(mul(a, -1.5), mul(c, -1.5), tol));
      EXPECT_TRUE(expect_matches_cpu(div(a, 3.0), div(c, 3.0), tol));
      EXPECT_TRUE(expect_matches_cpu(pow(a, 2.0), pow(c, 2.0), tol));
      EXPECT_TRUE(expect_matches_cpu(gt(a, 1.0), gt(c, 1.0), tol));
      EXPECT_TRUE(expect_matches_cpu(lt(a, 1.0), lt(c, 1.0), tol));
      EXPECT_TRUE(expect_matches_cpu(eq(a, 1.0), eq(c, 1.0), tol));
    }
  }
}

TEST_F(CudaTest, WhereAndMaskedFillMatchCpu) {
  for (DType dtype : kFloatTypes) {
    SCOPED_TRACE(dtype_name(dtype));
    Tensor cond = gt(random_tensor({4, 1, 5}, dtype, 1, -1, 1, kCuda), 0.0);
    Tensor a = random_view({4, 3, 5}, dtype, 2, Layout::kTransposed, -1, 1, kCuda);
    Tensor b = random_tensor({3, 5}, dtype, 3, -1, 1, kCuda);
    Tensor cc = cond.to(Device::cpu()), ac = a.to(Device::cpu()), bc = b.to(Device::cpu());
    EXPECT_TRUE(expect_matches_cpu(where(cond, a, b), where(cc, ac, bc), {0, 0}));
    EXPECT_TRUE(expect_matches_cpu(masked_fill(a, cond, -7.0), masked_fill(ac, cc, -7.0), {0, 0}));
  }
}

TEST_F(CudaTest, InPlaceOpsWriteThroughStridedViews) {
  for (DType dtype : kFloatTypes) {
    SCOPED_TRACE(dtype_name(dtype));
    auto tol = twice(tolerance_for(dtype));
    Tensor base = random_tensor({6, 8}, dtype, 1, -1, 1, kCuda);
    Tensor base_cpu = base.to(Device::cpu());
    Tensor view = base.t();  // [8, 6], column-major: writes go through strides
    Tensor view_cpu = base_cpu.t();
    Tensor row = random_tensor({6}, dtype, 2, -1, 1, kCuda);
    add_(view, row, 0.5);
    add_(view_cpu, row.to(Device::cpu()), 0.5);
    mul_(view, 1.25);
    mul_(view_cpu, 1.25);
    div_(view, 2.0);
    div_(view_cpu, 2.0);
    EXPECT_TRUE(expect_matches_cpu(base, base_cpu, tol));
    Tensor narrow = base.narrow(1, 2, 3);
    Tensor narrow_cpu = base_cpu.narrow(1, 2, 3);
    fill_(narrow, 4.5);
    fill_(narrow_cpu, 4.5);
    EXPECT_TRUE(expect_matches_cpu(base, base_cpu, tol));
  }
}

TEST_F(CudaTest, AllFiniteFindsInfAndNan) {
  for (DType dtype : kFloatTypes) {
    SCOPED_TRACE(dtype_name(dtype));
    Tensor a = random_tensor({1000, 37}, dtype, 5, -1, 1, kCuda);
    EXPECT_TRUE(all_finite(a));
    Tensor with_inf = a.clone();
    Tensor spot = with_inf.narrow(0, 999, 1).narrow(1, 36, 1);
    fill_(spot, std::numeric_limits<double>::infinity());
    EXPECT_FALSE(all_finite(with_inf));
    Tensor with_nan = a.clone();
    Tensor spot2 = with_nan.narrow(0, 10, 1).narrow(1, 3, 1);
    fill_(spot2, std::nan(""));
    EXPECT_FALSE(all_finite(with_nan));
    EXPECT_FALSE(all_finite(with_nan.t()));  // strided view
    EXPECT_TRUE(expect_matches_cpu(isfinite(with_nan), isfinite(with_nan.to(Device::cpu())), {0, 0}));
  }
  EXPECT_TRUE(all_finite(zeros({0}, DType::kFloat32, kCuda)));
}

// ---------------------------------------------------------------- reductions

TEST_F(CudaTest, ReductionsMatchCpuOverDimSets) {
  struct Case {
    Shape shape;
    std::vector<int64_t> dims;
  };
  // Shapes chosen to hit each kernel: small rows (thread per output), long contiguous rows
  // (block per output), outer-dim sums (coalesced thread per output), whole-tensor (chunked).
  const Case cases[] = {
      {{3, 5, 7}, {}},        {{3, 5, 7}, {1}},        {{3, 5, 7}, {0, 2}},
      {{8, 4096}, {1}},       {{4096, 8}, {0}},        {{300000}, {}},
      {{2, 3, 70000}, {2}},   {{70000, 3}, {0}},       {{1, 1, 5}, {0, 1}},
      {{4, 0, 3}, {1}},
  };
  uint64_t seed = 400;
  for (const auto& c : cases) {
    for (DType dtype : kFloatTypes) {
      for (Layout layout : {Layout::kContiguous, Layout::kTransposed, Layout::kSliced}) {
        SCOPED_TRACE(trace(dtype, c.shape, layout) + " dims " + shape_str(c.dims));
        Tensor a = random_view(c.shape, dtype, ++seed, layout, -1, 1, kCuda);
        Tensor ac = a.to(Device::cpu());
        int64_t terms = 1;
        for (int64_t d : c.dims) terms *= c.shape[d];
        if (c.dims.empty()) terms = shape_numel(c.shape);
        auto tol = twice(accumulate_tolerance_for(dtype, terms));
        EXPECT_TRUE(expect_matches_cpu(sum(a, c.dims), sum(ac, c.dims), tol));
        EXPECT_TRUE(expect_matches_cpu(mean(a, c.dims, true), mean(ac, c.dims, true), tol));
        if (shape_numel(c.shape) > 0) {
          EXPECT_TRUE(expect_matches_cpu(amax(a, c.dims), amax(ac, c.dims), {0, 0}));
          EXPECT_TRUE(expect_matches_cpu(amin(a, c.dims, true), amin(ac, c.dims, true), {0, 0}));
        }
      }
    }
  }
}

TEST_F(CudaTest, IntegerSumsAreExact) {
  for (DType dtype : {DType::kInt32, DType::kInt64}) {
    Tensor a = random_tensor({513, 77}, dtype, 9, -100, 100, kCuda);
    Tensor ac = a.to(Device::cpu());
    EXPECT_TRUE(expect_matches_cpu(sum(a), sum(ac), {0, 0}));
    EXPECT_TRUE(expect_matches_cpu(sum(a, {0}), sum(ac, {0}), {0, 0}));
    EXPECT_TRUE(expect_matches_cpu(amax(a, {1}), amax(ac, {1}), {0, 0}));
  }
}

TEST_F(CudaTest, MaxAndArgmaxMatchCpu) {
  uint64_t seed = 500;
  for (DType dtype : kFloatTypes) {
    for (const auto& [shape, dim] : std::vector<std::pair<Shape, int64_t>>{
             {{5, 9}, 1}, {{5, 9}, 0}, {{3, 4, 5}, 1}, {{2, 100000}, 1}, {{1}, 0}}) {
      SCOPED_TRACE(trace(dtype, shape, Layout::kContiguous) + " dim " + std::to_string(dim));
      Tensor a = random_view(shape, dtype, ++seed, Layout::kSliced, -1, 1, kCuda);
      Tensor ac = a.to(Device::cpu());
      auto [v, i] = max(a, dim);
      auto [vc, ic] = max(ac, dim);
      EXPECT_TRUE(expect_matches_cpu(v, vc, {0, 0}));
      EXPECT_TRUE(expect_matches_cpu(i, ic, {0, 0}));
      EXPECT_TRUE(expect_matches_cpu(argmax(a, dim, true), argmax(ac, dim, true), {0, 0}));
    }
    Tensor a = random_tensor({123457}, dtype, 77, -1, 1, kCuda);
    EXPECT_TRUE(expect_matches_cpu(argmax(a), argmax(a.to(Device::cpu())), {0, 0}));
  }
  // Ties resolve to the first index on both devices.
  Tensor ties = zeros({3, 10}, DType::kFloat32, kCuda);
  EXPECT_TRUE(expect_matches_cpu(argmax(ties, 1), argmax(ties.to(Device::cpu()), 1), {0, 0}));
}

// ---------------------------------------------------------------- matmul

TEST_F(CudaTest, MatmulMatchesCpuForLayoutsAndDtypes) {
  struct Case {
    Shape a, b;
  };
  const Case cases[] = {
      {{17, 33}, {33, 9}},       {{1, 64}, {64, 1}},         {{64, 1}, {1, 64}},
      {{3, 20, 30}, {3, 30, 10}}, {{20, 30}, {2, 3, 30, 11}}, {{128, 256}, {256, 64}},
      {{5, 0}, {0, 4}},          {{7}, {7, 3}},              {{4, 6}, {6}},
  };
  uint64_t seed = 600;
  for (const auto& c : cases) {
    for (DType dtype : kFloatTypes) {
      for (Layout layout : kAllLayouts) {
        SCOPED_TRACE(std::string(dtype_name(dtype)) + " " + shape_str(c.a) + " @ " +
                     shape_str(c.b) + " " + layout_name(layout));
        Tensor a = random_view(c.a, dtype, ++seed, layout, -1, 1, kCuda);
        Tensor b = random_view(c.b, dtype, ++seed, layout, -1, 1, kCuda);
        int64_t k = c.a.back();
        auto tol = twice(accumulate_tolerance_for(dtype, k));
        EXPECT_TRUE(expect_matches_cpu(matmul(a, b), matmul(a.to(Device::cpu()), b.to(Device::cpu())), tol));
      }
    }
  }
}

TEST_F(CudaTest, MatmulOfTransposedViewsUsesNoCopyAndMatches) {
  // x @ w.t() is the Linear layer's shape; both operand layouts go to cuBLAS as op flags.
  for (DType dtype : kFloatTypes) {
    SCOPED_TRACE(dtype_name(dtype));
    Tensor x = random_tensor({32, 48}, dtype, 1, -1, 1, kCuda);
    Tensor w = random_tensor({16, 48}, dtype, 2, -1, 1, kCuda);
    Tensor bias = random_tensor({16}, dtype, 3, -1, 1, kCuda);
    auto tol = twice(accumulate_tolerance_for(dtype, 48));
    Tensor xc = x.to(Device::cpu()), wc = w.to(Device::cpu());
    EXPECT_TRUE(expect_matches_cpu(matmul(x, w.t()), matmul(xc, wc.t()), tol));
    EXPECT_TRUE(expect_matches_cpu(matmul(w, x.t()), matmul(wc, xc.t()), tol));
    EXPECT_TRUE(expect_matches_cpu(matmul(x.t(), x), matmul(xc.t(), xc), twice(accumulate_tolerance_for(dtype, 32))));
    EXPECT_TRUE(expect_matches_cpu(linear(x, w, bias), linear(xc, wc, bias.to(Device::cpu())), tol));
  }
}

// ---------------------------------------------------------------- conv, pooling

TEST_F(CudaTest, Conv2dForwardAndBackwardMatchCpu) {
  struct Case {
    Shape input, weight;
    Conv2dParams p;
  };
  const Case cases[] = {
      {{2, 3, 9, 8}, {4, 3, 3, 3}, {}},
      {{2, 3, 9, 8}, {4, 3, 3, 3}, {2, 2, 1, 1, 1, 1, 1}},
      {{1, 4, 11, 10}, {6, 2, 3, 2}, {1, 2, 2, 1, 2, 1, 2}},  // dilation + groups
      {{3, 1, 28, 28}, {8, 1, 5, 5}, {1, 1, 2, 2, 1, 1, 1}},
  };
  uint64_t seed = 700;
  for (const auto& c : cases) {
    for (DType dtype : kFloatTypes) {
      SCOPED_TRACE(std::string(dtype_name(dtype)) + " input " + shape_str(c.input) + " weight " +
                   shape_str(c.weight));
      Tensor x = random_view(c.input, dtype, ++seed, Layout::kSliced, -1, 1, kCuda);
      Tensor w = random_tensor(c.weight, dtype, ++seed, -1, 1, kCuda);
      Tensor b = random_tensor({c.weight[0]}, dtype, ++seed, -1, 1, kCuda);
      Tensor xc = x.to(Device::cpu()), wc = w.to(Device::cpu()), bc = b.to(Device::cpu());
      int64_t terms = c.weight[1] * c.weight[2] * c.weight[3];
      auto tol = twice(accumulate_tolerance_for(dtype, terms));
      Tensor y = conv2d(x, w, b, c.p);
      Tensor yc = conv2d(xc, wc, bc, c.p);
      EXPECT_TRUE(expect_matches_cpu(y, yc, tol));
      EXPECT_TRUE(expect_matches_cpu(conv2d(x, w, Tensor(), c.p), conv2d(xc, wc, Tensor(), c.p), tol));
      Tensor g = random_tensor(y.shape(), dtype, ++seed, -1, 1, kCuda);
      Tensor gc = g.to(Device::cpu());
      int64_t terms_in = c.weight[0] * c.weight[2] * c.weight[3];
      int64_t terms_w = y.shape()[0] * y.shape()[2] * y.shape()[3];
      EXPECT_TRUE(expect_matches_cpu(conv2d_backward_input(g, w, c.input, c.p),
                                     conv2d_backward_input(gc, wc, c.input, c.p),
                                     twice(accumulate_tolerance_for(dtype, terms_in))));
      EXPECT_TRUE(expect_matches_cpu(conv2d_backward_weight(g, x, c.weight, c.p),
                                     conv2d_backward_weight(gc, xc, c.weight, c.p),
                                     twice(accumulate_tolerance_for(dtype, terms_w))));
    }
  }
}

TEST_F(CudaTest, PoolingForwardAndBackwardMatchCpu) {
  const Pool2dParams params[] = {
      {2, 2, 2, 2, 0, 0},  // the classic 2x2
      {3, 3, 2, 2, 1, 1},  // overlapping windows with padding
      {3, 2, 1, 2, 1, 0},
  };
  uint64_t seed = 800;
  for (const auto& p : params) {
    for (DType dtype : kFloatTypes) {
      SCOPED_TRACE(std::string(dtype_name(dtype)) + " kernel " + std::to_string(p.kernel_h) + "x" +
                   std::to_string(p.kernel_w));
      Shape shape = {2, 3, 9, 10};
      Tensor x = random_view(shape, dtype, ++seed, Layout::kPermuted, -1, 1, kCuda);
      Tensor xc = x.to(Device::cpu());
      auto tol = twice(tolerance_for(dtype));
      auto [y, idx] = max_pool2d(x, p);
      auto [yc, idxc] = max_pool2d(xc, p);
      EXPECT_TRUE(expect_matches_cpu(y, yc, {0, 0}));
      EXPECT_TRUE(expect_matches_cpu(idx, idxc, {0, 0}));
      Tensor g = random_tensor(y.shape(), dtype, ++seed, -1, 1, kCuda);
      Tensor gc = g.to(Device::cpu());
      // Overlapping windows accumulate up to kh*kw grads into one input (atomics on the GPU).
      auto acc_tol = twice(accumulate_tolerance_for(dtype, p.kernel_h * p.kernel_w));
      EXPECT_TRUE(expect_matches_cpu(max_pool2d_backward(g, idx, shape),
                                     max_pool2d_backward(gc, idxc, shape), acc_tol));
      Tensor a = avg_pool2d(x, p);
      EXPECT_TRUE(expect_matches_cpu(a, avg_pool2d(xc, p), acc_tol));
      Tensor ga = random_tensor(a.shape(), dtype, ++seed, -1, 1, kCuda);
      EXPECT_TRUE(expect_matches_cpu(avg_pool2d_backward(ga, shape, p),
                                     avg_pool2d_backward(ga.to(Device::cpu()), shape, p), acc_tol));
      (void)tol;
    }
  }
}

// ---------------------------------------------------------------- softmax, losses

TEST_F(CudaTest, SoftmaxForwardAndBackwardMatchCpu) {
  uint64_t seed = 900;
  for (DType dtype : kFloatTypes) {
    for (const auto& [shape, dim] : std::vector<std::pair<Shape, int64_t>>{
             {{4, 10}, 1}, {{4, 10}, 0}, {{2, 5, 3}, 1}, {{3, 5000}, -1}, {{1, 1}, 0}}) {
      SCOPED_TRACE(trace(dtype, shape, Layout::kTransposed) + " dim " + std::to_string(dim));
      Tensor x = random_view(shape, dtype, ++seed, Layout::kTransposed, -4, 4, kCuda);
      Tensor xc = x.to(Device::cpu());
      int64_t n = shape[dim < 0 ? dim + shape.size() : dim];
      auto tol = twice(accumulate_tolerance_for(dtype, n));
      Tensor s = softmax(x, dim), sc = softmax(xc, dim);
      Tensor ls = log_softmax(x, dim), lsc = log_softmax(xc, dim);
      EXPECT_TRUE(expect_matches_cpu(s, sc, tol));
      EXPECT_TRUE(expect_matches_cpu(ls, lsc, tol));
      Tensor g = random_tensor(shape, dtype, ++seed, -1, 1, kCuda);
      Tensor gc = g.to(Device::cpu());
      EXPECT_TRUE(expect_matches_cpu(softmax_backward(g, s, dim), softmax_backward(gc, sc, dim), tol));
      EXPECT_TRUE(expect_matches_cpu(log_softmax_backward(g, ls, dim),
                                     log_softmax_backward(gc, lsc, dim), tol));
    }
  }
}

TEST_F(CudaTest, CrossEntropyMatchesCpu) {
  for (DType dtype : {DType::kFloat32, DType::kFloat64}) {
    Tensor logits = random_tensor({16, 10}, dtype, 1, -3, 3, kCuda);
    Tensor targets = random_index({16}, 10, 2, kCuda);
    Tensor lc = logits.to(Device::cpu()), tc = targets.to(Device::cpu());
    auto tol = twice(accumulate_tolerance_for(dtype, 160));
    EXPECT_TRUE(expect_matches_cpu(cross_entropy(logits, targets), cross_entropy(lc, tc), tol));
    EXPECT_TRUE(expect_matches_cpu(cross_entropy(logits, targets, 3, 0.1),
                                   cross_entropy(lc, tc, 3, 0.1), tol));
  }
}

// ---------------------------------------------------------------- indexing, joining

TEST_F(CudaTest, GatherIndexSelectIndexAddMatchCpu) {
  const DType all[] = {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16,
                       DType::kInt32, DType::kInt64};
  uint64_t seed = 1000;
  for (DType dtype : all) {
    SCOPED_TRACE(dtype_name(dtype));
    Tensor a = random_view({6, 7}, dtype, ++seed, Layout::kTransposed, -5, 5, kCuda);
    Tensor ac = a.to(Device::cpu());
    Tensor gi = random_index({6, 4}, 7, ++seed, kCuda);
    EXPECT_TRUE(expect_matches_cpu(gather(a, 1, gi), gather(ac, 1, gi.to(Device::cpu())), {0, 0}));
    // Embedding lookup: rows chosen by a [2, 5] index.
    Tensor table = random_tensor({11, 8}, dtype, ++seed, -5, 5, kCuda);
    Tensor tokens = random_index({2, 5}, 11, ++seed, kCuda);
    EXPECT_TRUE(expect_matches_cpu(index_select(table, 0, tokens),
                                   index_select(table.to(Device::cpu()), 0, tokens.to(Device::cpu())),
                                   {0, 0}));
    Tensor cols = Tensor::from_vector<int64_t>({6, 0, 2, 6}, {4}, kCuda);
    EXPECT_TRUE(expect_matches_cpu(index_select(a, 1, cols),
                                   index_select(ac, 1, cols.to(Device::cpu())), {0, 0}));
    // Embedding gradient: repeated indices must accumulate (atomics on the GPU).
    Tensor idx = Tensor::from_vector<int64_t>({3, 1, 3, 0, 3}, {5}, kCuda);
    Tensor src = random_tensor({5, 8}, dtype, ++seed, -2, 2, kCuda);
    Tensor grad = zeros({11, 8}, dtype, kCuda);
    Tensor grad_cpu = zeros({11, 8}, dtype);
    index_add_(grad, 0, idx, src);
    index_add_(grad_cpu, 0, idx.to(Device::cpu()), src.to(Device::cpu()));
    EXPECT_TRUE(expect_matches_cpu(grad, grad_cpu, twice(accumulate_tolerance_for(dtype, 3))));
  }
}

TEST_F(CudaTest, CatStackChunkAndOneHotMatchCpu) {
  for (DType dtype : kFloatTypes) {
    Tensor a = random_tensor({2, 3}, dtype, 1, -1, 1, kCuda);
    Tensor b = random_view({4, 3}, dtype, 2, Layout::kTransposed, -1, 1, kCuda);
    Tensor ac = a.to(Device::cpu()), bc = b.to(Device::cpu());
    EXPECT_TRUE(expect_matches_cpu(cat({a, b}, 0), cat({ac, bc}, 0), {0, 0}));
    EXPECT_TRUE(expect_matches_cpu(stack({a, a}, 1), stack({ac, ac}, 1), {0, 0}));
    auto parts = cat({a, b}, 0).chunk(3, 0);
    auto parts_cpu = cat({ac, bc}, 0).chunk(3, 0);
    ASSERT_EQ(parts.size(), parts_cpu.size());
    for (size_t i = 0; i < parts.size(); ++i)
      EXPECT_TRUE(expect_matches_cpu(parts[i].contiguous(), parts_cpu[i].contiguous(), {0, 0}));
  }
  Tensor labels = random_index({9}, 5, 3, kCuda);
  EXPECT_TRUE(expect_matches_cpu(one_hot(labels, 5), one_hot(labels.to(Device::cpu()), 5), {0, 0}));
}

// ---------------------------------------------------------------- factories, random

TEST_F(CudaTest, FactoriesAndSeededRandomMatchCpu) {
  EXPECT_TRUE(expect_matches_cpu(zeros({3, 4}, DType::kFloat16, kCuda), zeros({3, 4}, DType::kFloat16), {0, 0}));
  EXPECT_TRUE(expect_matches_cpu(ones({5}, DType::kInt32, kCuda), ones({5}, DType::kInt32), {0, 0}));
  EXPECT_TRUE(expect_matches_cpu(full({2, 2}, -2.5, DType::kBFloat16, kCuda), full({2, 2}, -2.5, DType::kBFloat16), {0, 0}));
  EXPECT_TRUE(expect_matches_cpu(arange(0, 10, 3, DType::kInt64, kCuda), arange(0, 10, 3), {0, 0}));
  Generator g1(42), g2(42);
  EXPECT_TRUE(expect_matches_cpu(randn({64}, g1, DType::kFloat32, kCuda), randn({64}, g2), {0, 0}));
  EXPECT_TRUE(expect_matches_cpu(rand({8, 8}, g1, DType::kFloat64, kCuda), rand({8, 8}, g2, DType::kFloat64), {0, 0}));
}

}  // namespace
}  // namespace ringtrain
