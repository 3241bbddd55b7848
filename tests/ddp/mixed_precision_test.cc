// O2 mixed precision: half-precision model, float32 masters, dynamic loss scaling.
#include <gtest/gtest.h>

#include <filesystem>
#include <limits>
#include <unistd.h>

#include "autograd/autocast.h"
#include "autograd/autograd.h"
#include "autograd/functions.h"
#include "ddp/loss_scaler.h"
#include "ddp/master_weights.h"
#include "nn/checkpoint.h"
#include "nn/layers.h"
#include "nn/optim.h"
#include "tensor/ops.h"

namespace ringtrain::ddp {
namespace {

std::shared_ptr<nn::Module> make_mlp(uint64_t seed) {
  Generator gen(seed);
  auto seq = nn::make<nn::Sequential>();
  seq->push_back(nn::make<nn::Linear>(8, 32, true, gen));
  seq->push_back(nn::make<nn::ReLU>());
  seq->push_back(nn::make<nn::Linear>(32, 4, true, gen));
  return seq;
}

TEST(MasterWeightsTest, KeepsUpdatesTooSmallForHalfPrecision) {
  auto model = make_mlp(1);
  model->to(DType::kFloat16);
  MasterWeights masters(*model);
  nn::SGD opt(masters.master_params(), {.lr = 1.0});
  Tensor p = model->parameters()[0];
  Tensor before = p.to(DType::kFloat32).clone();
  // A gradient of 1e-5 everywhere: p - 1e-5 rounds back to p in fp16 for |p| > ~0.02.
  autograd::set_grad(p, full(p.shape(), 1e-5, DType::kFloat16));
  masters.copy_grads_to_masters();
  opt.step();
  Tensor master = masters.master_params()[0];
  EXPECT_NEAR(max_abs_diff(master, before), 1e-5, 1e-6);  // the master moved by 1e-5 ...
  EXPECT_FALSE(autograd::grad(p).defined());  // the gradient moved to the master
  for (int i = 0; i < 200; ++i) {              // ... and 200 such steps add up
    autograd::set_grad(p, full(p.shape(), 1e-5, DType::kFloat16));
    masters.copy_grads_to_masters();
    opt.step();
  }
  masters.copy_masters_to_model();
  EXPECT_NEAR(max_abs_diff(sub(before, p.to(DType::kFloat32)), full(p.shape(), 201e-5)), 0.0, 1e-3);
}

// After a checkpoint (or any new weights) is loaded into the half model, the masters take
// them over: before copy_model_to_masters() existed, the next copy_masters_to_model() wrote
// the masters' construction-time weights over the loaded model.
TEST(MasterWeightsTest, LoadedModelWeightsReachTheMasters) {
  auto model = make_mlp(3);
  model->to(DType::kFloat16);
  MasterWeights masters(*model);
  auto trained = make_mlp(4);  // stands in for the weights a checkpoint holds
  trained->to(DType::kFloat16);
  model->load_state_dict(trained->state_dict(), /*strict=*/true);
  masters.copy_model_to_masters();
  masters.copy_masters_to_model();
  auto mine = model->parameters(), loaded = trained->parameters();
  for (size_t i = 0; i < mine.size(); ++i) {
    EXPECT_EQ(mine[i].to(DType::kFloat32).to_vector<float>(), loaded[i].to(DType::kFloat32).to_vector<float>()) << i;
    EXPECT_EQ(masters.master_params()[i].to_vector<float>(), loaded[i].to(DType::kFloat32).to_vector<float>()) << i;
  }
}

// An O2 run that saves its masters with the checkpoint resumes bitwise: the model,
// the masters and the optimizer end exactly where the uninterrupted run ends. (With
// the half model alone the masters lose every bit below half precision.)
TEST(MasterWeightsTest, ResumeWithTheMastersInTheCheckpointIsBitwise) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("rt_o2_resume_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string stem = (dir / "ckpt").string();
  Generator data(11);
  Tensor x = randn({32, 8}, data);
  Tensor y = mul(rand({32}, data), 4.0).to(DType::kInt64);
  struct Run {
    std::shared_ptr<nn::Module> model = make_mlp(9);
    std::unique_ptr<MasterWeights> masters;
    std::unique_ptr<nn::Adam> opt;
    LossScaler scaler;
    Run() {
      model->to(DType::kFloat16);
      masters = std::make_unique<MasterWeights>(*model);
      opt = std::make_unique<nn::Adam>(masters->master_params(), nn::AdamOptions{.lr = 1e-3});
    }
    void steps(int n, const Tensor& x, const Tensor& y) {
      for (int i = 0; i < n; ++i) {
        model->zero_grad();
        Tensor loss = ag::cross_entropy(ag::to(model->forward(x.to(DType::kFloat16)), DType::kFloat32), y);
        autograd::backward(scaler.scale(loss));
        std::vector<Tensor> grads = masters->copy_grads_to_masters();
        if (scaler.step(grads, [&] { opt->step(); })) masters->copy_masters_to_model();
        scaler.update();
      }
    }
    nn::CheckpointTargets targets() {
      return {.model = model.get(), .optimizer = opt.get(), .extra_tensors = masters->checkpoint_tensors()};
    }
  };
  Run straight;
  straight.steps(10, x, y);
  nn::save_checkpoint(stem, straight.targets(), {0, 10}, straight.scaler.state_dict());
  straight.steps(10, x, y);

  Run resumed;
  nn::CheckpointInfo info = nn::load_checkpoint(stem, resumed.targets());
  resumed.scaler.load_state_dict(info.extra);
  resumed.steps(10, x, y);
  auto a = straight.masters->master_params(), b = resumed.masters->master_params();
  auto pa = straight.model->parameters(), pb = resumed.model->parameters();
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].to_vector<float>(), b[i].to_vector<float>()) << "master " << i;
    EXPECT_EQ(pa[i].to(DType::kFloat32).to_vector<float>(), pb[i].to(DType::kFloat32).to_vector<float>())
        << "parameter " << i;
  }
  // A checkpoint without the masters is refused by name when they are asked for.
  nn::save_checkpoint(stem + "-nomasters", {.model = straight.model.get()}, {0, 20});
  try {
    Run other;
    nn::load_checkpoint(stem + "-nomasters", {.model = other.model.get(),
                                              .extra_tensors = other.masters->checkpoint_tensors()});
    ADD_FAILURE() << "a checkpoint without the masters loaded them";
  } catch (const nn::CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("extra tensor 'master_weights.0': not in the checkpoint"),
              std::string::npos) << e.what();
  }
  fs::remove_all(dir);
}

// A model parameter written again with the values it already had (load_checkpoint's
// rollback after a failed load, DDP's constructor broadcasting weights every rank already
// holds, a second DDP wrapping the trained model) leaves the masters as they are: they
// still round to the model. Before, any write the masters did not see re-took them from
// the half model, dropping every bit below half precision the run had accumulated.
TEST(MasterWeightsTest, RewritingTheSameHalfWeightsKeepsTheMastersBitsBelowHalfPrecision) {
  auto model = make_mlp(13);
  model->to(DType::kFloat16);
  MasterWeights masters(*model);
  nn::SGD opt(masters.master_params(), {.lr = 1.0});
  auto params = model->parameters();
  auto set_small_grads = [&] {
    for (auto& p : params) autograd::set_grad(p, full(p.shape(), 1e-5, DType::kFloat16));
  };
  for (int step = 0; step < 3; ++step) {  // updates of 1e-5: mostly below half precision
    set_small_grads();
    masters.copy_grads_to_masters();
    opt.step();
    masters.copy_masters_to_model();
  }
  std::vector<std::vector<float>> trained;
  for (const Tensor& m : masters.master_params()) trained.push_back(m.to_vector<float>());
  ASSERT_NE(trained[0], params[0].to(DType::kFloat32).to_vector<float>()) << "the masters hold no bits below half";

  nn::StateDict same = model->state_dict();
  for (auto& [name, t] : same) t = t.clone();
  model->load_state_dict(same, /*strict=*/true);  // as load_checkpoint's rollback does
  for (auto& p : params) p.bump_version();         // as DDP's broadcast does
  set_small_grads();
  masters.copy_grads_to_masters();
  for (size_t i = 0; i < trained.size(); ++i)
    EXPECT_EQ(masters.master_params()[i].to_vector<float>(), trained[i]) << "master " << i;

  // New values are still taken over: only parameter 0 changes.
  {
    autograd::NoGradGuard no_grad;
    add_(params[0], full(params[0].shape(), 0.5, DType::kFloat16));
  }
  set_small_grads();
  masters.copy_grads_to_masters();
  EXPECT_EQ(masters.master_params()[0].to_vector<float>(), params[0].to(DType::kFloat32).to_vector<float>());
  for (size_t i = 1; i < trained.size(); ++i)
    EXPECT_EQ(masters.master_params()[i].to_vector<float>(), trained[i]) << "master " << i;
}

TEST(MasterWeightsTest, HalfPrecisionTrainingWithScalingTracksFloat32) {
  for (DType half : {DType::kFloat16, DType::kBFloat16}) {
    SCOPED_TRACE(dtype_name(half));
    auto reference = make_mlp(3);
    auto model = make_mlp(3);
    model->to(half);
    MasterWeights masters(*model);
    nn::SGD opt(masters.master_params(), {.lr = 0.2});
    nn::SGD opt_ref(reference->parameters(), {.lr = 0.2});
    LossScaler scaler;
    Generator gen(5);
    Tensor x = randn({64, 8}, gen);
    Tensor y = mul(rand({64}, gen), 4.0).to(DType::kInt64);
    double first_loss = 0, last_loss = 0;
    for (int step = 0; step < 30; ++step) {
      // The recipe of master_weights.h as written: no model->zero_grad(), because
      // copy_grads_to_masters() moves the gradients (they used to add up across steps).
      opt.zero_grad();
      opt_ref.zero_grad();
      Tensor loss = ag::cross_entropy(ag::to(model->forward(x.to(half)), DType::kFloat32), y);
      autograd::backward(scaler.scale(loss));
      std::vector<Tensor> grads = masters.copy_grads_to_masters();
      if (scaler.step(grads, [&] { opt.step(); })) masters.copy_masters_to_model();
      scaler.update();
      autograd::backward(ag::cross_entropy(reference->forward(x), y));
      opt_ref.step();
      if (step == 0) first_loss = loss.item();
      last_loss = loss.item();
    }
    EXPECT_LT(last_loss, first_loss - 0.05);  // it learns
    auto pm = masters.master_params(), pr = reference->parameters();
    for (size_t i = 0; i < pm.size(); ++i)
      EXPECT_LT(max_abs_diff(pm[i], pr[i]), half == DType::kFloat16 ? 2e-2 : 6e-2) << "parameter " << i;
  }
}

TEST(MasterWeightsTest, OverflowSkipsTheStepAndLeavesTheModelUntouched) {
  auto model = make_mlp(7);
  model->to(DType::kFloat16);
  MasterWeights masters(*model);
  nn::SGD opt(masters.master_params(), {.lr = 0.1});
  LossScaler scaler;
  std::vector<std::vector<float>> before;
  for (auto& p : model->parameters()) before.push_back(p.to_vector<float>());
  for (auto& p : model->parameters()) autograd::set_grad(p, full(p.shape(), 1.0, DType::kFloat16));
  Tensor g0 = autograd::grad(model->parameters()[0]);
  Tensor one = g0.narrow(0, 0, 1);
  fill_(one, std::numeric_limits<double>::infinity());
  std::vector<Tensor> grads = masters.copy_grads_to_masters();
  bool stepped = scaler.step(grads, [&] { opt.step(); });
  if (stepped) masters.copy_masters_to_model();
  scaler.update();
  EXPECT_FALSE(stepped);
  EXPECT_EQ(scaler.get_scale(), 32768.0);
  auto params = model->parameters();
  for (size_t i = 0; i < params.size(); ++i) EXPECT_EQ(params[i].to_vector<float>(), before[i]);
}

TEST(AutocastTrainingTest, O1WithLossScalingTracksFloat32) {
  // O1: float32 weights, GEMMs in float16 under autocast, losses in float32,
  // gradients scaled against float16 underflow.
  auto model = make_mlp(9);
  auto reference = make_mlp(9);
  nn::SGD opt(model->parameters(), {.lr = 0.2}), opt_ref(reference->parameters(), {.lr = 0.2});
  LossScaler scaler;
  Generator gen(13);
  Tensor x = randn({64, 8}, gen);
  Tensor y = mul(rand({64}, gen), 4.0).to(DType::kInt64);
  for (int step = 0; step < 20; ++step) {
    opt.zero_grad();
    opt_ref.zero_grad();
    Tensor loss;
    {
      autograd::AutocastGuard autocast(DType::kFloat16);
      loss = ag::cross_entropy(model->forward(x), y);
    }
    ASSERT_EQ(loss.dtype(), DType::kFloat32);
    autograd::backward(scaler.scale(loss));
    std::vector<Tensor> grads;
    for (auto& p : model->parameters()) grads.push_back(autograd::grad(p));
    ASSERT_EQ(grads[0].dtype(), DType::kFloat32);
    scaler.step(grads, [&] { opt.step(); });
    scaler.update();
    autograd::backward(ag::cross_entropy(reference->forward(x), y));
    opt_ref.step();
  }
  auto pm = model->parameters(), pr = reference->parameters();
  for (size_t i = 0; i < pm.size(); ++i) EXPECT_LT(max_abs_diff(pm[i], pr[i]), 2e-2) << "parameter " << i;
}

}  // namespace
}  // namespace ringtrain::ddp
