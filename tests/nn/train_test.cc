// train_test.cc: end-to-end single-process training on synthetic data: an MLP
// classifier must reach high accuracy, a regression must drive MSE down, a small
// CNN must learn, and two runs from the same seed must end bitwise identical.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "autograd/autograd.h"
#include "autograd/functions.h"
#include "nn/layers.h"
#include "nn/loss.h"
#include "nn/lr_scheduler.h"
#include "nn/optim.h"
#include "tensor/ops.h"

namespace ringtrain::nn {
namespace {

// Three Gaussian blobs in 2-D, 300 points, labels 0..2.
std::pair<Tensor, Tensor> blobs(uint64_t seed) {
  Generator gen(seed);
  const int n = 300;
  Tensor x = randn({n, 2}, gen);
  std::vector<int64_t> labels(n);
  std::vector<float> centers = {0, 3, 3, -2, -3, -2};
  auto xv = x.to_vector<float>();
  for (int i = 0; i < n; ++i) {
    labels[i] = i % 3;
    xv[2 * i] = xv[2 * i] * 0.7f + centers[2 * labels[i]];
    xv[2 * i + 1] = xv[2 * i + 1] * 0.7f + centers[2 * labels[i] + 1];
  }
  return {Tensor::from_vector<float>(xv, {n, 2}), Tensor::from_vector<int64_t>(labels, {n})};
}

double accuracy(const Tensor& logits, const Tensor& targets) {
  return mean(eq(argmax(logits, 1), targets).to(DType::kFloat64)).item();
}

std::vector<float> train_mlp(uint64_t seed, double* final_accuracy) {
  auto [x, y] = blobs(7);
  Generator gen(seed);
  Sequential model({make<Linear>(2, 32, true, gen), make<ReLU>(), make<Linear>(32, 32, true, gen),
                    make<GELU>(), make<Linear>(32, 3, true, gen)});
  SGD opt(model.parameters(), {.lr = 0.1, .momentum = 0.9});
  CosineAnnealingLR sched(opt, 60);
  double first_loss = 0, last_loss = 0;
  for (int step = 0; step < 60; ++step) {
    opt.zero_grad();
    Tensor loss = nn::cross_entropy(model.forward(x), y, -100, 0.05);
    if (step == 0) first_loss = loss.item();
    last_loss = loss.item();
    autograd::backward(loss);
    clip_grad_norm_(model.parameters(), 5.0);
    opt.step();
    sched.step();
  }
  EXPECT_LT(last_loss, 0.5 * first_loss);
  autograd::NoGradGuard g;
  model.eval();
  *final_accuracy = accuracy(model.forward(x), y);
  std::vector<float> flat;
  for (auto& p : model.parameters())
    for (float v : p.to_vector<float>()) flat.push_back(v);
  return flat;
}

TEST(Train, MLPClassifierConvergesAndIsDeterministic) {
  double acc1 = 0, acc2 = 0;
  auto a = train_mlp(1, &acc1);
  auto b = train_mlp(1, &acc2);
  EXPECT_GE(acc1, 0.97);
  EXPECT_EQ(a, b);  // bitwise identical from the same seed
}

TEST(Train, RegressionWithAdamW) {
  Generator gen(3);
  Tensor x = randn({128, 4}, gen);
  Tensor w_true = Tensor::from_vector<float>({1.5f, -2.0f, 0.5f, 3.0f}, {4, 1});
  Tensor y = add(matmul(x, w_true), 0.7);
  Sequential model({make<Linear>(4, 16, true, gen), make<Tanh>(), make<Linear>(16, 1, true, gen)});
  AdamWOptions o;
  o.lr = 0.02;
  AdamW opt(model.parameters(), o);
  LinearWarmup sched(opt, 10, 0.1);
  double first = 0, last = 0;
  for (int step = 0; step < 300; ++step) {
    opt.zero_grad();
    Tensor loss = nn::mse_loss(model.forward(x), y);
    if (step == 0) first = loss.item();
    last = loss.item();
    autograd::backward(loss);
    opt.step();
    sched.step();
  }
  EXPECT_LT(last, 0.02 * first) << "first " << first << " last " << last;
}

TEST(Train, SmallCNNLearnsBars) {
  // 8x8 images with a horizontal (class 0) or vertical (class 1) bar at a random place.
  Generator gen(5);
  const int n = 64;
  std::vector<float> img(n * 64, 0.0f);
  std::vector<int64_t> labels(n);
  for (int i = 0; i < n; ++i) {
    labels[i] = i % 2;
    int pos = static_cast<int>(gen.next_uniform() * 8);
    for (int k = 0; k < 8; ++k) img[i * 64 + (labels[i] == 0 ? pos * 8 + k : k * 8 + pos)] = 1.0f;
  }
  Tensor x = Tensor::from_vector<float>(img, {n, 1, 8, 8});
  Tensor y = Tensor::from_vector<int64_t>(labels, {n});
  Sequential model({make<Conv2d>(1, 4, 3, 1, 1, true, gen), make<BatchNorm2d>(4), make<ReLU>(),
                    make<MaxPool2d>(2), make<Flatten>(), make<Dropout>(0.1, 9),
                    make<Linear>(64, 2, true, gen)});
  Adam opt(model.parameters(), {.lr = 0.01});
  for (int step = 0; step < 40; ++step) {
    opt.zero_grad();
    autograd::backward(nn::cross_entropy(model.forward(x), y));
    opt.step();
  }
  autograd::NoGradGuard g;
  model.eval();
  EXPECT_GE(accuracy(model.forward(x), y), 0.95);
}

}  // namespace
}  // namespace ringtrain::nn
