// Trainer, single process: option checks, learning, precision, accumulation, resume.
#include "trainer/trainer.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "autograd/functions.h"
#include "nn/layers.h"
#include "tensor/ops.h"

namespace ringtrain::trainer {
namespace {

namespace fs = std::filesystem;

// Three Gaussian blobs in 4-D: easy, but only learnable by actually training.
std::shared_ptr<data::TensorDataset> blobs(int64_t n, uint64_t seed) {
  Generator gen(seed);
  Tensor y = mul(rand({n}, gen), 3.0).to(DType::kInt64);
  Tensor centers = Tensor::from_vector<float>({2, 0, 0, 0, 0, 2, 0, 0, 0, 0, 2, 0}, {3, 4});
  Tensor x = add(index_select(centers, 0, y), mul(randn({n, 4}, gen), 0.5));
  return std::make_shared<data::TensorDataset>(x, y);
}

class BlobClassifier : public TrainingModule {
 public:
  explicit BlobClassifier(uint64_t seed = 1) {
    Generator gen(seed);
    model_ = nn::make<nn::Sequential>(std::vector<std::shared_ptr<nn::Module>>{
        nn::make<nn::Linear>(4, 16, true, gen), nn::make<nn::ReLU>(), nn::make<nn::Linear>(16, 3, true, gen)});
  }
  std::shared_ptr<nn::Module> model() override { return model_; }
  Tensor training_step(const data::Batch& b, StepContext& ctx) override {
    return ag::cross_entropy(ctx.forward(b.inputs), b.targets);
  }
  std::map<std::string, double> validation_step(const data::Batch& b, StepContext& ctx) override {
    Tensor logits = ctx.forward(b.inputs);
    return {{"correct", sum(eq(argmax(logits.to(DType::kFloat32), 1), b.targets)).item()},
            {"count", static_cast<double>(b.size())}};
  }
  Optimizers configure_optimizers(nn::Module& m) override {
    return {std::make_unique<nn::SGD>(m.parameters(), nn::SGDOptions{.lr = 0.1}), nullptr};
  }
  std::shared_ptr<nn::Module> model_;
};

TrainerOptions quiet(TrainerOptions o) {
  o.progress_bar = false;
  o.devices = "0";
  return o;
}

double accuracy(const FitResult& r) { return r.last_validation.at("correct") / r.last_validation.at("count"); }

TEST(TrainerTest, RejectsBadOptionsWithTheFix) {
  EXPECT_THROW(Trainer(quiet({.precision = "8-bit"})), Error);
  EXPECT_THROW(Trainer(quiet({.batch_size = 0})), Error);
  EXPECT_THROW(Trainer(quiet({.accumulate_grad_batches = 0})), Error);
  BlobClassifier m;
  try {
    Trainer(quiet({.strategy = "fsdp", .max_epochs = 1})).fit(m, blobs(32, 1));
    FAIL() << "expected an unknown-strategy error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("ddp2"), std::string::npos) << e.what();
  }
  try {
    Trainer(quiet({.num_nodes = 4, .max_epochs = 1})).fit(m, blobs(32, 1));
    FAIL() << "expected a num_nodes error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("num_nodes"), std::string::npos) << e.what();
  }
}

TEST(TrainerTest, LearnsAndWritesMetrics) {
  fs::path csv = fs::temp_directory_path() / ("rt_trainer_metrics_" + std::to_string(::getpid()) + ".csv");
  fs::remove(csv);
  BlobClassifier m;
  FitResult r = Trainer(quiet({.max_epochs = 5, .batch_size = 16, .metrics_csv = csv.string()}))
                    .fit(m, blobs(400, 1), blobs(200, 2));
  EXPECT_EQ(r.epochs_completed, 5);
  EXPECT_EQ(r.global_step, 5 * 25);
  EXPECT_GT(accuracy(r), 0.95);
  std::ifstream in(csv);
  std::string header;
  std::getline(in, header);
  EXPECT_EQ(header, "epoch,step,train_loss,seconds,lr,correct,count");
  int rows = 0;
  for (std::string line; std::getline(in, line);) ++rows;
  EXPECT_EQ(rows, 5);
  fs::remove(csv);
}

TEST(TrainerTest, DataParallelOnCpuReplicasAndMixedPrecisionAlsoLearn) {
  for (const char* precision : {"32", "16-mixed", "bf16-mixed"}) {
    for (const char* strategy : {"none", "dp"}) {
      SCOPED_TRACE(std::string(precision) + " " + strategy);
      BlobClassifier m;
      FitResult r = Trainer(quiet({.strategy = strategy, .precision = precision, .max_epochs = 4, .batch_size = 16}))
                        .fit(m, blobs(400, 1), blobs(200, 2));
      EXPECT_GT(accuracy(r), 0.9);
    }
  }
}

TEST(TrainerTest, AccumulatingTwoHalfBatchesEqualsOneFullBatch) {
  BlobClassifier a(3), b(3);
  auto data = blobs(128, 4);
  Trainer(quiet({.max_epochs = 2, .batch_size = 16})).fit(a, data);
  Trainer(quiet({.max_epochs = 2, .batch_size = 8, .accumulate_grad_batches = 2})).fit(b, data);
  auto pa = a.model_->parameters(), pb = b.model_->parameters();
  for (size_t i = 0; i < pa.size(); ++i) EXPECT_LT(max_abs_diff(pa[i], pb[i]), 1e-5) << "parameter " << i;
}

TEST(TrainerTest, MaxStepsAndResumeContinueExactly) {
  fs::path dir = fs::temp_directory_path() / ("rt_trainer_ckpt_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  auto data = blobs(160, 5);
  BlobClassifier straight(7);
  Trainer(quiet({.max_epochs = 3, .batch_size = 16})).fit(straight, data);

  BlobClassifier first(7);
  FitResult r1 = Trainer(quiet({.max_epochs = 3, .max_steps = 13, .batch_size = 16, .checkpoint_dir = dir.string()}))
                     .fit(first, data);
  EXPECT_EQ(r1.global_step, 13);  // stopped mid-epoch 1 (10 steps per epoch)
  // Save happens at epoch ends; stop by signal instead to save mid-epoch.
  BlobClassifier second(99);  // different initial weights: the checkpoint must replace them
  FitResult r2 = Trainer(quiet({.max_epochs = 3, .batch_size = 16, .checkpoint_dir = dir.string(),
                                .simulate_signal_at_step = 17}))
                     .fit(second, data);
  EXPECT_TRUE(r2.stopped_early);
  EXPECT_FALSE(r2.requeued);  // not in a SLURM job: nothing to requeue
  BlobClassifier third(42);
  FitResult r3 = Trainer(quiet({.max_epochs = 3, .batch_size = 16, .checkpoint_dir = dir.string()})).fit(third, data);
  EXPECT_NE(r3.resumed_from.find("ckpt-0000000017"), std::string::npos) << r3.resumed_from;
  EXPECT_EQ(r3.global_step, 30);
  auto ps = straight.model_->parameters(), pt = third.model_->parameters();
  for (size_t i = 0; i < ps.size(); ++i)
    EXPECT_EQ(ps[i].to_vector<float>(), pt[i].to_vector<float>()) << "parameter " << i;
  fs::remove_all(dir);
}

}  // namespace
}  // namespace ringtrain::trainer
