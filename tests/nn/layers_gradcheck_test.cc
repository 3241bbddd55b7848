// layers_gradcheck_test.cc: every layer's gradients (input and parameters)
// against finite differences, in float64 (Module::to(kFloat64)), plus layer
// semantics that gradcheck cannot see (Dropout scaling and seeding, eval modes).
#include <gtest/gtest.h>

#include <cmath>
#include <memory>

#include "autograd/autograd.h"
#include "autograd/functions.h"
#include "autograd/gradcheck.h"
#include "nn/layers.h"
#include "tensor/ops.h"

namespace ringtrain::nn {
namespace {

// Checks d(layer(x))/dx and d/d(every parameter) with gradcheck.
void check_layer(const char* what, Module& layer, const Shape& input_shape, bool input_grad = true) {
  layer.to(DType::kFloat64);
  Generator gen(11);
  Tensor x = randn(input_shape, gen, DType::kFloat64);
  if (input_grad) autograd::set_requires_grad(x);
  std::vector<Tensor> inputs = {x};
  for (const Tensor& p : layer.parameters()) inputs.push_back(p);
  auto r = autograd::gradcheck([&](const std::vector<Tensor>& in) { return layer.forward(in[0]); }, inputs);
  EXPECT_TRUE(r.ok) << what << ": " << r.message;
}

TEST(LayersGradcheck, Linear) {
  Generator g(1);
  Linear a(4, 3, true, g), b(4, 3, false, g);
  check_layer("Linear", a, {5, 4});
  check_layer("Linear no bias", b, {2, 5, 4});
}

TEST(LayersGradcheck, Conv2d) {
  Generator g(2);
  Conv2d c(2, 3, 3, 1, 1, true, g);
  check_layer("Conv2d", c, {2, 2, 5, 5});
  Conv2d s(2, 4, 3, 2, 0, false, g, 1, 2);
  check_layer("Conv2d stride2 groups2", s, {1, 2, 7, 7});
}

TEST(LayersGradcheck, Pools) {
  MaxPool2d mp(2);
  check_layer("MaxPool2d", mp, {2, 3, 4, 4});
  AvgPool2d ap(3, 2, 1);
  check_layer("AvgPool2d", ap, {1, 2, 5, 5});
}

TEST(LayersGradcheck, Norms) {
  BatchNorm1d bn1(3);
  check_layer("BatchNorm1d train", bn1, {6, 3});
  BatchNorm2d bn2(2);
  check_layer("BatchNorm2d train", bn2, {3, 2, 3, 3});
  bn2.eval();
  check_layer("BatchNorm2d eval", bn2, {3, 2, 3, 3});
  LayerNorm ln({4});
  check_layer("LayerNorm", ln, {3, 4});
  LayerNorm ln2({2, 3});
  check_layer("LayerNorm 2d", ln2, {2, 2, 3});
}

TEST(LayersGradcheck, ActivationsFlattenSequential) {
  ReLU relu;
  check_layer("ReLU", relu, {4, 5});
  GELU gelu;
  check_layer("GELU", gelu, {4, 5});
  Tanh tanh_layer;
  check_layer("Tanh", tanh_layer, {4, 5});
  Flatten flat;
  check_layer("Flatten", flat, {2, 3, 2});
  Generator g(3);
  Sequential seq({make<Conv2d>(1, 2, 3, 1, 1, true, g), make<ReLU>(), make<MaxPool2d>(2), make<Flatten>(),
                  make<Linear>(8, 3, true, g), make<Tanh>()});
  check_layer("small CNN", seq, {2, 1, 4, 4});
}

TEST(LayersGradcheck, EmbeddingAndDropout) {
  Generator g(4);
  Embedding emb(6, 3, g);
  emb.to(DType::kFloat64);
  Tensor idx = Tensor::from_vector<int64_t>({0, 5, 5, 2}, {2, 2});
  auto r = autograd::gradcheck([&](const std::vector<Tensor>&) { return emb.forward(idx); }, {emb.weight()});
  EXPECT_TRUE(r.ok) << r.message;
  EXPECT_EQ(emb.forward(idx).shape(), (Shape{2, 2, 3}));
}

TEST(Layers, DropoutScalesSeedsAndTurnsOffInEval) {
  Dropout d(0.25, /*seed=*/42);
  Tensor x = ones({1000});
  Tensor y = d.forward(x);
  auto v = y.to_vector<float>();
  int zeros_count = 0;
  for (float e : v) {
    EXPECT_TRUE(e == 0.0f || std::fabs(e - 1.0f / 0.75f) < 1e-6f) << e;
    zeros_count += e == 0.0f;
  }
  EXPECT_GT(zeros_count, 180);
  EXPECT_LT(zeros_count, 320);
  Dropout same(0.25, 42);
  EXPECT_EQ(max_abs_diff(same.forward(x), y), 0.0);  // same seed, same mask
  EXPECT_GT(max_abs_diff(d.forward(x), y), 0.0);     // the stream moves on
  d.eval();
  EXPECT_EQ(max_abs_diff(d.forward(x), x), 0.0);
  // Gradient is the mask.
  Tensor p = ones({1000});
  autograd::set_requires_grad(p);
  Dropout d2(0.25, 42);
  Tensor out = d2.forward(p);
  autograd::backward(ag::sum(out));
  EXPECT_EQ(max_abs_diff(autograd::grad(p), out), 0.0);
}

TEST(Layers, BatchNormRunningStatsMatchPyTorchFormula) {
  BatchNorm1d bn(1, 1e-5, 0.1);
  Tensor x = Tensor::from_vector<float>({1, 2, 3, 6}, {4, 1});
  bn.forward(x);
  // mean 3, biased var 3.5, unbiased var 14/3
  EXPECT_NEAR(bn.buffer("running_mean").item(), 0.9 * 0 + 0.1 * 3, 1e-6);
  EXPECT_NEAR(bn.buffer("running_var").item(), 0.9 * 1 + 0.1 * 14.0 / 3.0, 1e-6);
  Tensor y = bn.forward(x);
  EXPECT_NEAR(y.to_vector<double>()[3], 3.0 / std::sqrt(3.5 + 1e-5), 1e-5);
}

}  // namespace
}  // namespace ringtrain::nn
