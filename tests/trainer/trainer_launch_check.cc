// trainer_launch_check: a short Trainer fit that prints what it joined, for launcher
// tests: "rank R world W steps S". Exits 1 when the world size is not --expect-world.
//   trainer_launch_check <strategy> <expected world size>
// Under `mpirun -np 2 env -u OMPI_COMM_WORLD_SIZE ...` only PMIX_RANK tells this is an MPI
// launch (world size unknown until MPI_Init): each process used to train alone.
#include <cstdio>
#include <cstdlib>
#include <string>

#include "autograd/functions.h"
#include "nn/layers.h"
#include "tensor/ops.h"
#include "trainer/trainer.h"

using namespace ringtrain;
using namespace ringtrain::trainer;

namespace {

class Blobs : public TrainingModule {
 public:
  Blobs() {
    Generator gen(1);
    model_ = nn::make<nn::Sequential>(std::vector<std::shared_ptr<nn::Module>>{
        nn::make<nn::Linear>(4, 8, true, gen), nn::make<nn::ReLU>(), nn::make<nn::Linear>(8, 3, true, gen)});
  }
  std::shared_ptr<nn::Module> model() override { return model_; }
  Tensor training_step(const data::Batch& b, StepContext& ctx) override {
    world_ = ctx.world_size();
    return ag::cross_entropy(ctx.forward(b.inputs), b.targets);
  }
  Optimizers configure_optimizers(nn::Module& m) override {
    return {std::make_unique<nn::SGD>(m.parameters(), nn::SGDOptions{.lr = 0.1}), nullptr};
  }
  int world_ = 0;

 private:
  std::shared_ptr<nn::Module> model_;
};

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s <strategy> <expected world size>\n", argv[0]);
    return 2;
  }
  const int expected = std::atoi(argv[2]);
  try {
    Generator gen(3);
    Tensor y = mul(rand({64}, gen), 3.0).to(DType::kInt64);
    Tensor x = randn({64, 4}, gen);
    Blobs module;
    FitResult r = Trainer({.devices = "0", .strategy = argv[1], .max_epochs = 1, .batch_size = 8, .progress_bar = false})
                      .fit(module, std::make_shared<data::TensorDataset>(x, y));
    std::printf("rank %d world %d steps %lld\n", r.rank, module.world_, static_cast<long long>(r.global_step));
    return module.world_ == expected ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
