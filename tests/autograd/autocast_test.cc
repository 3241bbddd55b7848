// Autocast (O1): GEMM-like ops in half precision, softmax/losses in float32,
// float32 weights receiving float32 gradients.
#include "autograd/autocast.h"

#include <gtest/gtest.h>

#include <cmath>

#include "autograd/autograd.h"
#include "autograd/functions.h"
#include "tensor/ops.h"

namespace ringtrain::autograd {
namespace {

TEST(AutocastTest, GuardSetsAndRestoresThreadState) {
  EXPECT_FALSE(autocast_enabled());
  {
    AutocastGuard guard(DType::kBFloat16);
    EXPECT_TRUE(autocast_enabled());
    EXPECT_EQ(autocast_dtype(), DType::kBFloat16);
    {
      AutocastSuspend suspend;
      EXPECT_FALSE(autocast_enabled());
    }
    EXPECT_TRUE(autocast_enabled());
  }
  EXPECT_FALSE(autocast_enabled());
  EXPECT_THROW(AutocastGuard(DType::kFloat32), Error);
}

TEST(AutocastTest, LinearRunsInHalfAndWeightsGetFloat32Gradients) {
  for (DType half : {DType::kFloat16, DType::kBFloat16}) {
    SCOPED_TRACE(dtype_name(half));
    Generator gen(3);
    Tensor x = randn({8, 16}, gen);
    Tensor w = mul(randn({4, 16}, gen), 0.25);
    Tensor b = randn({4}, gen);
    set_requires_grad(w);
    set_requires_grad(b);
    Tensor y = mul(rand({8}, gen), 4.0).to(DType::kInt64);
    // float32 reference
    backward(ag::cross_entropy(ag::linear(x, w, b), y));
    Tensor gw_ref = grad(w).clone(), gb_ref = grad(b).clone();
    set_grad(w, Tensor());
    set_grad(b, Tensor());
    Tensor logits, loss;
    {
      AutocastGuard guard(half);
      logits = ag::linear(x, w, b);
      loss = ag::cross_entropy(logits, y);
    }
    EXPECT_EQ(logits.dtype(), half);             // the GEMM ran in half precision
    EXPECT_EQ(loss.dtype(), DType::kFloat32);    // the loss was computed in float32
    backward(loss);
    EXPECT_EQ(grad(w).dtype(), DType::kFloat32);  // gradients reach the float32 weights
    double tol = half == DType::kFloat16 ? 5e-3 : 3e-2;
    EXPECT_LT(max_abs_diff(grad(w), gw_ref), tol);
    EXPECT_LT(max_abs_diff(grad(b), gb_ref), tol);
  }
}

// Models that worked under torch.autocast failed here: a Linear followed by BatchNorm or
// LayerNorm, a residual x + linear(x), cat of float32 and half ("operands have different
// dtypes"); and float64 inputs were cast down, which torch.autocast never does.
TEST(AutocastTest, NormsResidualsJoinsAndFloat64WorkAsInTorch) {
  for (DType half : {DType::kFloat16, DType::kBFloat16}) {
    SCOPED_TRACE(dtype_name(half));
    Generator gen(7);
    Tensor x = randn({6, 8}, gen);
    Tensor w = mul(randn({8, 8}, gen), 0.3);
    set_requires_grad(w);
    Tensor gamma = ones({8}), beta = zeros({8});
    set_requires_grad(gamma);
    Tensor running_mean = zeros({8}), running_var = ones({8});
    Tensor out;
    {
      AutocastGuard guard(half);
      Tensor h = ag::linear(x, w, Tensor());
      EXPECT_EQ(h.dtype(), half);
      Tensor bn = ag::batch_norm(h, gamma, beta, running_mean, running_var, /*training=*/true, 0.1, 1e-5);
      EXPECT_EQ(bn.dtype(), DType::kFloat32);
      Tensor ln = ag::layer_norm(h, {8}, gamma, beta, 1e-5);
      EXPECT_EQ(ln.dtype(), DType::kFloat32);
      Tensor residual = ag::add(x, h);  // float32 + half -> float32
      EXPECT_EQ(residual.dtype(), DType::kFloat32);
      Tensor joined = ag::cat({x, h}, 1);
      EXPECT_EQ(joined.dtype(), DType::kFloat32);
      EXPECT_EQ(ag::mul(h, h).dtype(), half);  // same dtypes: nothing changes
      out = ag::sum(ag::add(ag::add(bn, ln), ag::add(residual, ag::sum(joined))));
      // float64 stays float64 in a GEMM and in a float32-list op
      Tensor d = randn({3, 4}, gen).to(DType::kFloat64);
      EXPECT_EQ(ag::matmul(d, d.t()).dtype(), DType::kFloat64);
      EXPECT_EQ(ag::softmax(d, 1).dtype(), DType::kFloat64);
    }
    EXPECT_NE(running_mean.to_vector<float>(), std::vector<float>(8, 0.0f));  // updated in place
    backward(out);
    EXPECT_EQ(grad(w).dtype(), DType::kFloat32);
    EXPECT_TRUE(all_finite(grad(w)));
    EXPECT_EQ(grad(gamma).dtype(), DType::kFloat32);
  }
}

// sum, exp, log and pow are on torch.autocast's float32 list: a user's loss over a half GEMM
// output must not overflow (here 4096 values of 2048 sum to 8388608, far past float16's 65504).
TEST(AutocastTest, SumExpLogAndPowComputeInFloat32) {
  Tensor x = full({64, 64}, 0.5);
  Tensor w = full({64, 64}, 1.0);
  set_requires_grad(w);
  AutocastGuard guard(DType::kFloat16);
  Tensor h = ag::matmul(ag::mul(x, 64.0), w);  // 32 * 64 = 2048 per element, float16
  ASSERT_EQ(h.dtype(), DType::kFloat16);
  Tensor total = ag::sum(h);
  EXPECT_EQ(total.dtype(), DType::kFloat32);
  EXPECT_EQ(total.item(), 2048.0 * 64 * 64);  // float16 would be inf
  EXPECT_EQ(ag::exp(full({1}, 16.0, DType::kFloat16)).dtype(), DType::kFloat32);
  EXPECT_NEAR(ag::exp(full({1}, 16.0, DType::kFloat16)).item(), std::exp(16.0), 1.0);  // 8.9e6
  EXPECT_EQ(ag::log(full({1}, 2.0, DType::kFloat16)).dtype(), DType::kFloat32);
  EXPECT_EQ(ag::pow(h, 2.0).dtype(), DType::kFloat32);
  EXPECT_EQ(ag::pow(h, h).dtype(), DType::kFloat32);
  backward(total);
  EXPECT_EQ(grad(w).dtype(), DType::kFloat32);
  EXPECT_TRUE(all_finite(grad(w)));
}

TEST(AutocastTest, OutsideTheScopeNothingIsCast) {
  Generator gen(1);
  Tensor a = randn({3, 5}, gen), b = randn({5, 2}, gen);
  EXPECT_EQ(ag::matmul(a, b).dtype(), DType::kFloat32);
  AutocastGuard guard(DType::kFloat16, /*enabled=*/false);
  EXPECT_EQ(ag::matmul(a, b).dtype(), DType::kFloat32);
}

}  // namespace
}  // namespace ringtrain::autograd
