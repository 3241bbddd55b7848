// gradcheck_ops_test.cc: every differentiable op in autograd/functions.h checked
// against central finite differences in float64 (autograd/gradcheck.h), with
// broadcasting, non-contiguous inputs and the ops' options exercised.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "autograd/autograd.h"
#include "autograd/functions.h"
#include "autograd/gradcheck.h"
#include "autograd/graph.h"
#include "tensor/ops.h"
#include "tests/common/expect_error.h"

namespace ringtrain {
namespace {

using autograd::gradcheck;
using Inputs = std::vector<Tensor>;

// A float64 leaf that requires grad, values uniform in [low, high).
Tensor leaf(const Shape& shape, uint64_t seed, double low = -1.0, double high = 1.0) {
  Generator gen(seed);
  Tensor t = Tensor::empty(shape, DType::kFloat64);
  uniform_(t, low, high, gen);
  autograd::set_requires_grad(t);
  return t;
}

void expect_gradcheck(const char* what, const std::function<Tensor(const Inputs&)>& f, const Inputs& in,
                      autograd::GradcheckOptions opt = {}) {
  auto r = gradcheck(f, in, opt);
  EXPECT_TRUE(r.ok) << what << ": " << r.message << " (max abs error " << r.max_abs_error << ")";
}

TEST(GradcheckOps, BinaryBroadcasting) {
  Inputs in = {leaf({3, 4}, 1), leaf({4}, 2, 0.5, 1.5)};
  expect_gradcheck("add", [](const Inputs& x) { return ag::add(x[0], x[1]); }, in);
  expect_gradcheck("sub", [](const Inputs& x) { return ag::sub(x[0], x[1]); }, in);
  expect_gradcheck("mul", [](const Inputs& x) { return ag::mul(x[0], x[1]); }, in);
  expect_gradcheck("div", [](const Inputs& x) { return ag::div(x[0], x[1]); }, in);
  expect_gradcheck("maximum", [](const Inputs& x) { return ag::maximum(x[0], x[1]); }, in);
  expect_gradcheck("minimum", [](const Inputs& x) { return ag::minimum(x[0], x[1]); }, in);
  Inputs pos = {leaf({2, 3}, 3, 0.5, 2.0), leaf({2, 1}, 4, -1.0, 2.0)};
  expect_gradcheck("pow(t,t)", [](const Inputs& x) { return ag::pow(x[0], x[1]); }, pos);
}

TEST(GradcheckOps, Scalar) {
  Inputs in = {leaf({2, 5}, 5, 0.5, 2.0)};
  expect_gradcheck("add s", [](const Inputs& x) { return ag::add(x[0], 3.0); }, in);
  expect_gradcheck("sub s", [](const Inputs& x) { return ag::sub(x[0], 3.0); }, in);
  expect_gradcheck("mul s", [](const Inputs& x) { return ag::mul(x[0], -2.5); }, in);
  expect_gradcheck("div s", [](const Inputs& x) { return ag::div(x[0], 4.0); }, in);
  expect_gradcheck("pow s", [](const Inputs& x) { return ag::pow(x[0], 2.5); }, in);
}

// At a = 0 the pow formulas meet 0 * inf: b * a^(b-1) with b = 0, and y * log(a) with b >= 0.
// PyTorch takes the limits (0); so do we (before, both gradients were NaN).
TEST(GradcheckOps, PowAtZeroHasFiniteGradients) {
  Tensor a = Tensor::from_vector(std::vector<double>{0.0, 0.0, 2.0}, {3});
  autograd::set_requires_grad(a);
  autograd::backward(ag::sum(ag::pow(a, 0.0)));
  EXPECT_EQ(autograd::grad(a).to_vector<double>(), (std::vector<double>{0.0, 0.0, 0.0}));

  Tensor x = Tensor::from_vector(std::vector<double>{0.0, 0.0, 3.0}, {3});
  Tensor e = Tensor::from_vector(std::vector<double>{0.0, 2.0, 2.0}, {3});
  autograd::set_requires_grad(x);
  autograd::set_requires_grad(e);
  autograd::backward(ag::sum(ag::pow(x, e)));
  // d/dx: 0 (b = 0), 2 * 0^1 = 0, 2 * 3 = 6; d/de: 0 (a = 0), 0 (a = 0), 9 * log 3.
  EXPECT_EQ(autograd::grad(x).to_vector<double>(), (std::vector<double>{0.0, 0.0, 6.0}));
  std::vector<double> ge = autograd::grad(e).to_vector<double>();
  EXPECT_EQ(ge[0], 0.0);
  EXPECT_EQ(ge[1], 0.0);
  EXPECT_NEAR(ge[2], 9.0 * std::log(3.0), 1e-12);
}

TEST(GradcheckOps, Unary) {
  Inputs in = {leaf({3, 4}, 6)};
  Inputs pos = {leaf({3, 4}, 7, 0.2, 2.0)};
  expect_gradcheck("neg", [](const Inputs& x) { return ag::neg(x[0]); }, in);
  expect_gradcheck("exp", [](const Inputs& x) { return ag::exp(x[0]); }, in);
  expect_gradcheck("log", [](const Inputs& x) { return ag::log(x[0]); }, pos);
  expect_gradcheck("sqrt", [](const Inputs& x) { return ag::sqrt(x[0]); }, pos);
  expect_gradcheck("abs", [](const Inputs& x) { return ag::abs(x[0]); }, in);
  expect_gradcheck("relu", [](const Inputs& x) { return ag::relu(x[0]); }, in);
  expect_gradcheck("gelu", [](const Inputs& x) { return ag::gelu(x[0]); }, in);
  expect_gradcheck("tanh", [](const Inputs& x) { return ag::tanh(x[0]); }, in);
  expect_gradcheck("sigmoid", [](const Inputs& x) { return ag::sigmoid(x[0]); }, in);
}

TEST(GradcheckOps, WhereMaskedFill) {
  Inputs in = {leaf({3, 4}, 8), leaf({4}, 9)};
  Tensor cond = gt(Tensor::from_vector<double>({1, 0, 1, 1, 0, 0, 1, 0, 1, 1, 0, 1}, {3, 4}), 0.5);
  expect_gradcheck("where", [&](const Inputs& x) { return ag::where(cond, x[0], x[1]); }, in);
  expect_gradcheck("masked_fill", [&](const Inputs& x) { return ag::masked_fill(x[0], cond, 7.0); }, in);
  // A mask larger than the input broadcasts it ([4] -> [3, 4]): the gradient is summed back.
  // (The rule returned the [3, 4] gradient, which the engine rejected for the [4] input.)
  expect_gradcheck("masked_fill broadcasting mask", [&](const Inputs& x) { return ag::masked_fill(x[1], cond, 7.0); },
                   in);
  expect_gradcheck("masked_fill column mask", [&](const Inputs& x) {
    return ag::masked_fill(x[0], gt(Tensor::from_vector<double>({1, 0, 1}, {3, 1}), 0.5), -1.0);
  }, in);
}

TEST(GradcheckOps, Reductions) {
  Inputs in = {leaf({2, 3, 4}, 10)};
  expect_gradcheck("sum all", [](const Inputs& x) { return ag::sum(x[0]); }, in);
  expect_gradcheck("sum dims", [](const Inputs& x) { return ag::sum(x[0], {0, 2}); }, in);
  expect_gradcheck("sum keepdim", [](const Inputs& x) { return ag::sum(x[0], {1}, true); }, in);
  expect_gradcheck("mean", [](const Inputs& x) { return ag::mean(x[0], {-1}); }, in);
  expect_gradcheck("mean all", [](const Inputs& x) { return ag::mean(x[0]); }, in);
  expect_gradcheck("amax", [](const Inputs& x) { return ag::amax(x[0], {1}); }, in);
  expect_gradcheck("amin", [](const Inputs& x) { return ag::amin(x[0], {2}, true); }, in);
  expect_gradcheck("max dim", [](const Inputs& x) { return ag::max(x[0], 1).first; }, in);
  expect_gradcheck("max keepdim", [](const Inputs& x) { return ag::max(x[0], 2, true).first; }, in);
}

TEST(GradcheckOps, Matmul) {
  expect_gradcheck("2d", [](const Inputs& x) { return ag::matmul(x[0], x[1]); },
                   {leaf({3, 4}, 11), leaf({4, 5}, 12)});
  expect_gradcheck("batched broadcast", [](const Inputs& x) { return ag::matmul(x[0], x[1]); },
                   {leaf({2, 3, 4}, 13), leaf({4, 2}, 14)});
  expect_gradcheck("vector-matrix", [](const Inputs& x) { return ag::matmul(x[0], x[1]); },
                   {leaf({4}, 15), leaf({4, 3}, 16)});
  expect_gradcheck("matrix-vector", [](const Inputs& x) { return ag::matmul(x[0], x[1]); },
                   {leaf({3, 4}, 17), leaf({4}, 18)});
  expect_gradcheck("transposed view", [](const Inputs& x) { return ag::matmul(ag::transpose(x[0], 0, 1), x[1]); },
                   {leaf({4, 3}, 19), leaf({4, 2}, 20)});
  expect_gradcheck("linear", [](const Inputs& x) { return ag::linear(x[0], x[1], x[2]); },
                   {leaf({5, 4}, 21), leaf({3, 4}, 22), leaf({3}, 23)});
  expect_gradcheck("linear 3d no bias", [](const Inputs& x) { return ag::linear(x[0], x[1], Tensor()); },
                   {leaf({2, 5, 4}, 24), leaf({3, 4}, 25)});
}

TEST(GradcheckOps, Views) {
  Inputs in = {leaf({2, 3, 4}, 26)};
  expect_gradcheck("reshape", [](const Inputs& x) { return ag::reshape(x[0], {6, 4}); }, in);
  expect_gradcheck("view", [](const Inputs& x) { return ag::view(x[0], {4, -1}); }, in);
  expect_gradcheck("flatten", [](const Inputs& x) { return ag::flatten(x[0], 1); }, in);
  expect_gradcheck("transpose", [](const Inputs& x) { return ag::transpose(x[0], 0, 2); }, in);
  expect_gradcheck("permute", [](const Inputs& x) { return ag::permute(x[0], {2, 0, 1}); }, in);
  expect_gradcheck("narrow", [](const Inputs& x) { return ag::narrow(x[0], 2, 1, 2); }, in);
  expect_gradcheck("slice step", [](const Inputs& x) { return ag::slice(x[0], 2, 0, 4, 2); }, in);
  expect_gradcheck("select", [](const Inputs& x) { return ag::select(x[0], 1, 2); }, in);
  expect_gradcheck("unsqueeze", [](const Inputs& x) { return ag::unsqueeze(x[0], 1); }, in);
  expect_gradcheck("squeeze", [](const Inputs& x) { return ag::squeeze(ag::narrow(x[0], 1, 0, 1), 1); }, in);
  expect_gradcheck("contiguous", [](const Inputs& x) { return ag::contiguous(ag::transpose(x[0], 1, 2)); }, in);
  expect_gradcheck("clone", [](const Inputs& x) { return ag::clone(x[0]); }, in);
  expect_gradcheck("expand", [](const Inputs& x) { return ag::expand(x[0], {3, 2, 3, 4}); }, in);
  expect_gradcheck("expand 1", [](const Inputs& x) { return ag::expand(x[0], {3, 4}); }, {leaf({3, 1}, 27)});
  expect_gradcheck("view of view", [](const Inputs& x) {
    return ag::mul(ag::transpose(ag::reshape(x[0], {6, 4}), 0, 1), 2.0);
  }, in);
}

TEST(GradcheckOps, Joins) {
  Inputs in = {leaf({2, 3}, 28), leaf({2, 1}, 29), leaf({2, 3}, 30)};
  expect_gradcheck("cat", [](const Inputs& x) { return ag::cat({x[0], x[1], x[2]}, 1); }, in);
  expect_gradcheck("stack", [](const Inputs& x) { return ag::stack({x[0], x[2]}, 1); }, in);
  expect_gradcheck("chunk", [](const Inputs& x) {
    auto parts = ag::chunk(x[0], 3, 1);
    return ag::add(ag::mul(parts[0], 2.0), ag::mul(parts[2], parts[1]));
  }, in);
  expect_gradcheck("split", [](const Inputs& x) {
    auto parts = ag::split(x[0], 1, 0);
    return ag::sub(parts[0], ag::mul(parts[1], 3.0));
  }, in);
  expect_gradcheck("reused input", [](const Inputs& x) {
    return ag::mul(ag::add(x[0], x[0]), ag::exp(x[0]));
  }, in);
}

TEST(GradcheckOps, ConvPool) {
  Conv2dParams p;
  p.stride_h = p.stride_w = 2;
  p.pad_h = p.pad_w = 1;
  expect_gradcheck("conv2d", [&](const Inputs& x) { return ag::conv2d(x[0], x[1], x[2], p); },
                   {leaf({2, 3, 5, 5}, 31), leaf({4, 3, 3, 3}, 32), leaf({4}, 33)});
  Conv2dParams g;
  g.groups = 2;
  expect_gradcheck("conv2d groups", [&](const Inputs& x) { return ag::conv2d(x[0], x[1], Tensor(), g); },
                   {leaf({1, 4, 4, 4}, 34), leaf({2, 2, 3, 3}, 35)});
  Pool2dParams pp;
  expect_gradcheck("max_pool2d", [&](const Inputs& x) { return ag::max_pool2d(x[0], pp); },
                   {leaf({2, 2, 4, 6}, 36)});
  Pool2dParams ap;
  ap.kernel_h = ap.kernel_w = 3;
  ap.stride_h = ap.stride_w = 2;
  ap.pad_h = ap.pad_w = 1;
  expect_gradcheck("avg_pool2d", [&](const Inputs& x) { return ag::avg_pool2d(x[0], ap); },
                   {leaf({2, 2, 5, 5}, 37)});
}

TEST(GradcheckOps, SoftmaxAndNorms) {
  Inputs in = {leaf({3, 5}, 38, -2, 2)};
  expect_gradcheck("softmax", [](const Inputs& x) { return ag::softmax(x[0], 1); }, in);
  expect_gradcheck("softmax dim0", [](const Inputs& x) { return ag::softmax(x[0], 0); }, in);
  expect_gradcheck("log_softmax", [](const Inputs& x) { return ag::log_softmax(x[0], -1); }, in);
  Inputs bn = {leaf({4, 3, 2, 2}, 39), leaf({3}, 40), leaf({3}, 41)};
  expect_gradcheck("batch_norm train", [](const Inputs& x) {
    return ag::batch_norm(x[0], x[1], x[2], Tensor(), Tensor(), true, 0.1, 1e-5);
  }, bn);
  Tensor rm = Tensor::from_vector<double>({0.1, -0.2, 0.3}, {3});
  Tensor rv = Tensor::from_vector<double>({1.5, 0.5, 2.0}, {3});
  expect_gradcheck("batch_norm eval", [&](const Inputs& x) {
    return ag::batch_norm(x[0], x[1], x[2], rm, rv, false, 0.1, 1e-5);
  }, bn);
  expect_gradcheck("batch_norm 1d no affine", [](const Inputs& x) {
    return ag::batch_norm(x[0], Tensor(), Tensor(), Tensor(), Tensor(), true, 0.1, 1e-5);
  }, {leaf({6, 3}, 42)});
  Inputs ln = {leaf({2, 3, 4}, 43), leaf({3, 4}, 44), leaf({3, 4}, 45)};
  expect_gradcheck("layer_norm", [](const Inputs& x) { return ag::layer_norm(x[0], {3, 4}, x[1], x[2], 1e-5); }, ln);
  expect_gradcheck("layer_norm last", [](const Inputs& x) {
    return ag::layer_norm(x[0], {4}, Tensor(), Tensor(), 1e-5);
  }, {leaf({2, 3, 4}, 46)});
}

// At a tie the max/min subgradient is split as in PyTorch: g / 2 to each input (it used to
// go all to a), so maximum(x, x) has gradient 1, not 2 or 0. Where either is NaN, both get g.
TEST(GradcheckOps, MaximumMinimumSplitTheGradientAtTies) {
  const double nan = std::nan("");
  auto grads = [](bool is_max, std::vector<double> av, std::vector<double> bv, Shape bshape) {
    Tensor a = Tensor::from_vector<double>(av, {static_cast<int64_t>(av.size())});
    Tensor b = Tensor::from_vector<double>(bv, bshape);
    autograd::set_requires_grad(a);
    autograd::set_requires_grad(b);
    autograd::backward(ag::sum(is_max ? ag::maximum(a, b) : ag::minimum(a, b)));
    return std::make_pair(autograd::grad(a).to_vector<double>(), autograd::grad(b).to_vector<double>());
  };
  using V = std::vector<double>;
  EXPECT_EQ(grads(true, {1, 2, 3, 4, nan}, {1, 0, 5, 4, 1}, {5}),
            std::make_pair(V{0.5, 1, 0, 0.5, 1}, V{0.5, 0, 1, 0.5, 1}));
  EXPECT_EQ(grads(false, {1, 2, 3, 4, nan}, {1, 0, 5, 4, 1}, {5}),
            std::make_pair(V{0.5, 0, 1, 0.5, 1}, V{0.5, 1, 0, 0.5, 1}));
  // Broadcast: the tied halves of a [1] operand are summed back.
  EXPECT_EQ(grads(true, {1, 2, 3, 2}, {2}, {1}), std::make_pair(V{0, 0.5, 1, 0.5}, V{2}));
  EXPECT_EQ(grads(false, {1, 2, 3, 2}, {2}, {1}), std::make_pair(V{1, 0.5, 0, 0.5}, V{2}));
  // The same tensor on both sides: two halves, one whole gradient.
  Tensor x = Tensor::from_vector<double>({-1, 0, 2}, {3});
  autograd::set_requires_grad(x);
  autograd::backward(ag::sum(ag::add(ag::maximum(x, x), ag::minimum(x, x))));
  EXPECT_EQ(autograd::grad(x).to_vector<double>(), (V{2, 2, 2}));
}

// BatchNorm and LayerNorm compute their statistics in float32 for float16/bfloat16 input, as
// PyTorch does. In half, {0, 600, 0, 600} squared its centred values (300^2 = 90000 > 65504):
// the variance was inf, the output all 0, the running variance inf and the input gradient 0;
// in bfloat16, the mean of {256, 258, 256, 258} rounded to 256 before the centring
// (outputs 0 and 1.41). Each run is compared with the same run in float32.
struct NormRun {
  std::vector<float> y, dx, dw, db, running_mean, running_var;
};
NormRun run_norm(bool batch, const std::vector<float>& values, DType dtype, bool affine) {
  Tensor x = Tensor::from_vector<float>(values, batch ? Shape{4, 1} : Shape{1, 4}).to(dtype);
  autograd::set_requires_grad(x);
  const Shape param_shape = batch ? Shape{1} : Shape{4};
  Tensor w = full(param_shape, 2.0, dtype), b = full(param_shape, 0.5, dtype);
  if (affine) {
    autograd::set_requires_grad(w);
    autograd::set_requires_grad(b);
  }
  Tensor rm = zeros({1}, dtype), rv = ones({1}, dtype);
  Tensor y = batch ? ag::batch_norm(x, affine ? w : Tensor(), affine ? b : Tensor(), rm, rv, true, 0.1, 1e-5)
                   : ag::layer_norm(x, {4}, affine ? w : Tensor(), affine ? b : Tensor(), 1e-5);
  EXPECT_EQ(y.dtype(), dtype);
  Tensor v = Tensor::from_vector<float>({1, 2, 3, 4}, y.shape()).to(dtype);
  autograd::backward(ag::sum(ag::mul(y, v)));
  EXPECT_EQ(autograd::grad(x).dtype(), dtype);
  auto f32 = [](const Tensor& t) { return t.to(DType::kFloat32).to_vector<float>(); };
  NormRun run{f32(y), f32(autograd::grad(x)), {}, {}, f32(rm), f32(rv)};
  if (affine) {
    run.dw = f32(autograd::grad(w));
    run.db = f32(autograd::grad(b));
  }
  return run;
}
void expect_close_to(const std::vector<float>& got, const std::vector<float>& want, double rel,
                     const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_TRUE(std::isfinite(got[i])) << what << "[" << i << "] = " << got[i];
    EXPECT_NEAR(got[i], want[i], rel * std::max(1e-3, std::fabs(static_cast<double>(want[i]))))
        << what << "[" << i << "]";
  }
}

TEST(GradcheckOps, NormsOfHalfInputsComputeStatisticsInFloat32) {
  for (DType dtype : {DType::kFloat16, DType::kBFloat16}) {
    for (bool batch : {true, false}) {
      for (const std::vector<float>& values :
           {std::vector<float>{0, 600, 0, 600}, std::vector<float>{256, 258, 256, 258}}) {
        for (bool affine : {false, true}) {
          SCOPED_TRACE(std::string(dtype_name(dtype)) + (batch ? " batch_norm" : " layer_norm") + " x0 " +
                       std::to_string(values[0]) + (affine ? " affine" : ""));
          NormRun half = run_norm(batch, values, dtype, affine);
          NormRun ref = run_norm(batch, values, DType::kFloat32, affine);
          if (!affine) expect_close_to(half.y, {-1, 1, -1, 1}, 1e-2, "y");
          expect_close_to(half.y, ref.y, 1e-2, "y");
          expect_close_to(half.dx, ref.dx, 2e-2, "dx");
          expect_close_to(half.dw, ref.dw, 2e-2, "dw");
          expect_close_to(half.db, ref.db, 2e-2, "db");
          if (batch) {
            expect_close_to(half.running_mean, ref.running_mean, 1e-2, "running_mean");
            expect_close_to(half.running_var, ref.running_var, 1e-2, "running_var");
          }
        }
      }
    }
  }
}

TEST(GradcheckOps, DropoutEmbeddingIndex) {
  expect_gradcheck("dropout", [](const Inputs& x) {
    Generator gen(7);  // same mask on every call: f stays deterministic
    return ag::dropout(x[0], 0.4, true, gen);
  }, {leaf({4, 5}, 47)});
  Tensor idx = Tensor::from_vector<int64_t>({0, 2, 2, 4, 1, 0}, {2, 3});
  expect_gradcheck("embedding", [&](const Inputs& x) { return ag::embedding(x[0], idx); }, {leaf({5, 3}, 48)});
  Tensor idx1 = Tensor::from_vector<int64_t>({3, 0, 3}, {3});
  expect_gradcheck("index_select", [&](const Inputs& x) { return ag::index_select(x[0], 1, idx1); },
                   {leaf({2, 4}, 49)});
}

TEST(GradcheckOps, Losses) {
  Tensor targets = Tensor::from_vector<int64_t>({1, 0, 3, -100, 2}, {5});
  Inputs in = {leaf({5, 4}, 50, -2, 2)};
  expect_gradcheck("cross_entropy", [&](const Inputs& x) { return ag::cross_entropy(x[0], targets); }, in);
  expect_gradcheck("cross_entropy smoothing", [&](const Inputs& x) {
    return ag::cross_entropy(x[0], targets, -100, 0.2);
  }, in);
  expect_gradcheck("cross_entropy ignore 3", [&](const Inputs& x) {
    return ag::cross_entropy(x[0], Tensor::from_vector<int64_t>({1, 0, 3, 3, 2}, {5}), 3, 0.1);
  }, in);
  expect_gradcheck("mse", [](const Inputs& x) { return ag::mse_loss(x[0], x[1]); },
                   {leaf({3, 4}, 51), leaf({3, 4}, 52)});
}

TEST(GradcheckOps, ToDtype) {
  expect_gradcheck("to f32 and back", [](const Inputs& x) {
    return ag::to(ag::mul(ag::to(x[0], DType::kFloat32), 2.0), DType::kFloat64);
  }, {leaf({3}, 53)}, {1e-3, 1e-3, 1e-2, 0});
}

// Non-contiguous leaves (a weight stored transposed, every other row of a buffer) are
// checked as they are: gradcheck used to refuse any non-contiguous input, so the
// accumulation of a gradient into a strided leaf's .grad was never compared with finite
// differences. An expanded input still throws, naming the dim.
Tensor strided_leaf(const Tensor& base_values, const std::function<Tensor(const Tensor&)>& view) {
  Tensor t = view(base_values.clone());
  autograd::set_requires_grad(t);
  return t;
}
TEST(GradcheckOps, NonContiguousLeavesAreCheckedWhereTheyLive) {
  Tensor wt = strided_leaf(leaf({4, 3}, 60), [](const Tensor& b) { return b.transpose(0, 1); });  // [3, 4]
  Tensor rows = strided_leaf(leaf({10, 4}, 61), [](const Tensor& b) { return b.slice(0, 1, 10, 2); });  // [5, 4]
  Tensor bias = strided_leaf(leaf({2, 3}, 62), [](const Tensor& b) { return b.select(0, 1); });  // [3], offset 3
  ASSERT_FALSE(wt.is_contiguous());
  ASSERT_FALSE(rows.is_contiguous());
  expect_gradcheck("linear, transposed weight, strided input",
                   [](const Inputs& x) { return ag::linear(x[0], x[1], x[2]); }, {rows, wt, bias});
  expect_gradcheck("mul, two strided leaves", [](const Inputs& x) { return ag::mul(x[0], ag::transpose(x[1], 0, 1)); },
                   {leaf({4, 3}, 63), wt});
  // A wrong rule on a strided leaf still fails.
  auto wrong = [](const Inputs& x) {
    return autograd::record("wrong_row_sum", {x[0]}, sum(x[0], {1}), {},
                            [](const Tensor& g, autograd::BackwardContext&) -> std::vector<Tensor> {
                              return {mul(g.unsqueeze(1).expand({3, 4}), 2.0)};
                            });
  };
  EXPECT_FALSE(gradcheck(wrong, {wt}).ok);
  Tensor expanded = strided_leaf(leaf({1, 3}, 64), [](const Tensor& b) { return b.expand({4, 3}); });
  testing::expect_error([&] { gradcheck([](const Inputs& x) { return ag::mul(x[0], 2.0); }, {expanded}); },
                        {"input 0", "stride 0 in dim 0", "expanded"});
}

TEST(GradcheckOps, DetectsAWrongRule) {
  // A deliberately wrong rule must fail: the checker itself can fail.
  auto wrong = [](const Inputs& x) {
    return autograd::record("wrong_square", {x[0]}, mul(x[0], x[0]), {x[0]},
                            [](const Tensor& g, autograd::BackwardContext& c) -> std::vector<Tensor> {
                              return {mul(g, c.saved(0))};  // missing the factor 2
                            });
  };
  EXPECT_FALSE(gradcheck(wrong, {leaf({4}, 54)}).ok);
}

// A rule that returns NaN (or inf) must fail too: every comparison with NaN is false, so the
// old test err > tol passed it, and the report's max_abs_error hid it (std::max drops NaN).
TEST(GradcheckOps, DetectsANaNOrInfiniteRule) {
  for (double bad : {std::nan(""), HUGE_VAL, -HUGE_VAL}) {
    SCOPED_TRACE(bad);
    auto broken = [bad](const Inputs& x) {
      return autograd::record("broken_double", {x[0]}, mul(x[0], 2.0), {},
                              [bad](const Tensor& g, autograd::BackwardContext&) -> std::vector<Tensor> {
                                return {mul(g, bad)};
                              });
    };
    auto r = gradcheck(broken, {leaf({3}, 55)});
    EXPECT_FALSE(r.ok) << "max abs error " << r.max_abs_error;
    EXPECT_NE(r.message.find("analytic"), std::string::npos) << r.message;
    if (std::isnan(bad)) {
      EXPECT_TRUE(std::isnan(r.max_abs_error)) << r.max_abs_error;
    } else {
      EXPECT_TRUE(std::isinf(r.max_abs_error)) << r.max_abs_error;
    }
  }
}

// A 0-d tensor takes dim 0 or -1 in the reductions and max(dim), as in PyTorch and as the
// tensor ops do (the autograd versions threw 'dim 0 is out of range' building their node).
TEST(GradcheckOps, ZeroDimReductionsTakeDimZeroOrMinusOne) {
  const Inputs in = {leaf({}, 56)};
  for (int64_t d : {0, -1}) {
    for (bool keepdim : {false, true}) {
      SCOPED_TRACE("dim " + std::to_string(d) + (keepdim ? " keepdim" : ""));
      expect_gradcheck("sum", [&](const Inputs& x) { return ag::sum(x[0], {d}, keepdim); }, in);
      expect_gradcheck("mean", [&](const Inputs& x) { return ag::mean(x[0], {d}, keepdim); }, in);
      expect_gradcheck("amax", [&](const Inputs& x) { return ag::amax(x[0], {d}, keepdim); }, in);
      expect_gradcheck("amin", [&](const Inputs& x) { return ag::amin(x[0], {d}, keepdim); }, in);
      expect_gradcheck("max", [&](const Inputs& x) { return ag::max(x[0], d, keepdim).first; }, in);
      EXPECT_EQ(ag::sum(in[0], {d}, keepdim).dim(), 0);
      EXPECT_EQ(ag::max(in[0], d, keepdim).first.dim(), 0);
    }
  }
  testing::expect_error([&] { ag::sum(in[0], {1}); }, {"0-d"});
  testing::expect_error([&] { ag::max(in[0], 1); }, {"0-d"});
}

// cat skips a 1-d empty tensor (the empty start of an accumulation) whatever the others'
// rank, as PyTorch and rt::cat do; its gradient is an empty [0]. ag::cat asked the skipped
// tensor for its size along the cat dim (forward threw for dim >= 1) and gave it a gradient
// of the wrong shape (backward failed the engine's shape check for dim 0).
TEST(GradcheckOps, CatSkipsAOneDimEmptyTensorOfAnotherRank) {
  for (int64_t d : {0, 1}) {
    SCOPED_TRACE("dim " + std::to_string(d));
    const Inputs in = {leaf({0}, 57), leaf({2, 3}, 58), leaf({2, 3}, 59)};
    expect_gradcheck("cat", [&](const Inputs& x) { return ag::cat({x[0], x[1], x[2]}, d); }, in);
    Tensor out = ag::cat({in[0], in[1], in[2]}, d);
    autograd::backward(ag::sum(out));
    ASSERT_TRUE(autograd::grad(in[0]).defined());
    EXPECT_EQ(autograd::grad(in[0]).shape(), Shape{0});
    EXPECT_EQ(autograd::grad(in[1]).shape(), (Shape{2, 3}));
  }
}

}  // namespace
}  // namespace ringtrain
