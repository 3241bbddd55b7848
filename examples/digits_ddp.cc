// digits_ddp.cc: the digits classifier on the Trainer — the README's main demo.
//
// The same 8x8 handwritten digits (1797 real examples from Debian's
// python3-sklearn) and MLP/CNN as digits_train, but the training loop is the
// Trainer's: run it with any launcher and it becomes data-parallel by itself.
//
//   build/comm/ringrun --nproc-per-node 2 build/examples/digits_ddp      # 2 ranks, DDP
//   mpirun -np 2 build/examples/digits_ddp                                # the same under Open MPI
//   srun -N2 -n2 build/examples/digits_ddp --num-nodes 2                   # 2 SLURM nodes
//   build/examples/digits_ddp --strategy dp --devices 0                   # one process, 2 CPU replicas
//   build/examples/digits_ddp --strategy dp --devices 2                   # one process, GPUs 0 and 1
//
// (--devices counts GPUs; on the CPU, --strategy dp or ddp2 always runs 2 replicas, as threads.)
//
// With --checkpoint-dir, a SIGUSR1 (#SBATCH --signal=USR1@90) makes every rank
// stop at the next step, rank 0 checkpoint and `scontrol requeue` the job; the
// requeued job resumes from that checkpoint (resume=auto) and finishes.
//
// Exit status (rank 0's; the other ranks exit 0 when they stop for a signal, so a
// launcher reports rank 0's):
//   0  training finished (or there was nothing left to train), or it stopped for the
//      requeue signal and the SLURM job was requeued: SLURM runs it again
//   1  an error (the message says which)
//   3  stopped for a signal before finishing, not requeued (a SIGTERM, or SIGUSR1
//      outside SLURM); --checkpoint-dir holds the state: run the same command to resume
//   4  stopped for a signal before finishing, nothing saved (no --checkpoint-dir)
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <limits>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "autograd/autocast.h"
#include "autograd/autograd.h"
#include "autograd/functions.h"
#include "examples/example_cli.h"
#include "nn/data/dataloader.h"
#include "nn/data/digits.h"
#include "nn/layers.h"
#include "nn/lr_scheduler.h"
#include "nn/optim.h"
#include "slurm/requeue.h"
#include "tensor/ops.h"
#include "trainer/trainer.h"

namespace {

using namespace ringtrain;

class DigitsClassifier : public trainer::TrainingModule {
 public:
  DigitsClassifier(bool cnn, uint64_t seed, double lr, int64_t epochs) : lr_(lr), epochs_(epochs) {
    Generator gen(seed);
    if (cnn) {
      model_ = nn::make<nn::Sequential>(std::vector<std::shared_ptr<nn::Module>>{
          nn::make<nn::Conv2d>(1, 16, 3, 1, 1, true, gen), nn::make<nn::ReLU>(), nn::make<nn::MaxPool2d>(2),
          nn::make<nn::Conv2d>(16, 32, 3, 1, 1, true, gen), nn::make<nn::ReLU>(), nn::make<nn::MaxPool2d>(2),
          nn::make<nn::Flatten>(), nn::make<nn::Linear>(32 * 2 * 2, 10, true, gen)});
    } else {
      model_ = nn::make<nn::Sequential>(std::vector<std::shared_ptr<nn::Module>>{
          nn::make<nn::Linear>(64, 128, true, gen), nn::make<nn::ReLU>(),
          nn::make<nn::Linear>(128, 128, true, gen), nn::make<nn::ReLU>(),
          nn::make<nn::Linear>(128, 10, true, gen)});
    }
  }

  std::shared_ptr<nn::Module> model() override { return model_; }

  Tensor training_step(const data::Batch& batch, trainer::StepContext& ctx) override {
    return ag::cross_entropy(ctx.forward(batch.inputs), batch.targets);
  }

  std::map<std::string, double> validation_step(const data::Batch& batch, trainer::StepContext& ctx) override {
    Tensor logits = ctx.forward(batch.inputs);
    double n = static_cast<double>(batch.size());
    return {{"val_loss_sum", ag::cross_entropy(logits, batch.targets).item() * n},
            {"val_correct", sum(eq(argmax(logits.to(DType::kFloat32), 1), batch.targets)).item()},
            {"val_count", n}};
  }

  trainer::Optimizers configure_optimizers(nn::Module& model) override {
    auto sgd = std::make_unique<nn::SGD>(model.parameters(),
                                         nn::SGDOptions{.lr = lr_, .momentum = 0.9, .weight_decay = 1e-4, .nesterov = true});
    // The Trainer steps a schedule once per epoch: cosine over --epochs. A run without
    // an epoch limit (--epochs -1, --max-steps N) has no epoch count to anneal over, so
    // it trains at the constant --lr.
    if (epochs_ < 1) return {std::move(sgd), nullptr};
    auto schedule = std::make_unique<nn::CosineAnnealingLR>(*sgd, epochs_);
    return {std::move(sgd), std::move(schedule)};
  }

 private:
  std::shared_ptr<nn::Module> model_;
  double lr_;
  int64_t epochs_;  // -1: no epoch limit (no schedule)
};

using ringtrain::examples::positive_real;

// A count that is >= 1, or -1 for "no limit" (`what_minus_one_means`): CLI::Range cannot
// leave out the 0 between them.
CLI::Validator count_or_minus_one(const std::string& what_minus_one_means) {
  return CLI::Validator(
      [what_minus_one_means](std::string& text) -> std::string {
        int64_t value = 0;
        if (CLI::detail::lexical_cast(text, value) && (value == -1 || value >= 1)) return {};
        return "must be >= 1, or -1 for " + what_minus_one_means + ", got " + text;
      },
      "-1 OR >= 1");
}

constexpr int kIntMax = std::numeric_limits<int>::max();

// Exit statuses (see the top of the file).
constexpr int kExitStoppedResumable = 3;
constexpr int kExitStoppedNothingSaved = 4;

// --resume STEM names a checkpoint by its path without extension. The Trainer lists
// them in --checkpoint-dir as "ckpt-0000000090", so a bare stem that is not found as
// given (relative to the working directory) is looked for in --checkpoint-dir too. A
// trailing .json or .safetensors is dropped. Throws naming every path it tried.
std::string resolve_resume(const std::string& resume, const std::string& checkpoint_dir) {
  namespace fs = std::filesystem;
  if (resume == "auto" || resume == "never") return resume;
  if (checkpoint_dir.empty()) {
    throw std::runtime_error("--resume " + resume + " needs --checkpoint-dir: the Trainer loads and saves "
                             "checkpoints only with one (give the directory the checkpoint is in)");
  }
  std::string stem = resume;
  for (const std::string ext : {".json", ".safetensors"}) {
    if (stem.size() > ext.size() && stem.compare(stem.size() - ext.size(), ext.size(), ext) == 0) {
      stem.resize(stem.size() - ext.size());
    }
  }
  std::vector<std::string> tried = {stem};
  if (fs::path(stem).is_relative()) tried.push_back((fs::path(checkpoint_dir) / stem).string());
  for (const std::string& candidate : tried) {
    if (fs::exists(candidate + ".json")) return candidate;
  }
  std::string message = "--resume " + resume + ": no checkpoint record at " + tried[0] + ".json";
  if (tried.size() > 1) message += " nor at " + tried[1] + ".json";
  std::error_code error;
  std::vector<std::string> there;
  for (const auto& entry : fs::directory_iterator(checkpoint_dir, error)) {
    if (entry.path().extension() == ".json") there.push_back(entry.path().stem().string());
  }
  std::sort(there.begin(), there.end());
  if (there.empty()) {
    message += "; " + checkpoint_dir + " holds no checkpoint (give a path to one without its extension, auto or never)";
  } else {
    message += "; " + checkpoint_dir + " holds " + there.front() + (there.size() > 1 ? " .. " + there.back() : "") +
               " (give one of those, a path to a checkpoint without its extension, auto or never)";
  }
  throw std::runtime_error(message);
}

// Runs the model itself in this process (no DDP, no collectives).
class LocalContext : public trainer::StepContext {
 public:
  LocalContext(std::shared_ptr<nn::Module> model, Device device) : model_(std::move(model)), device_(device) {}
  Tensor forward(const Tensor& input) override { return (*model_)(input); }
  Device device() const override { return device_; }
  int rank() const override { return 0; }
  int world_size() const override { return 1; }

 private:
  std::shared_ptr<nn::Module> model_;
  Device device_;
};

// The module's validation sums over `data`, in this process, the way the Trainer
// evaluates (eval mode, no grad, autocast for mixed precision). For a run that trained
// nothing, e.g. one resumed from a checkpoint of a run that had already finished.
std::map<std::string, double> evaluate(trainer::TrainingModule& module, std::shared_ptr<const data::Dataset> data,
                                       int64_t batch_size, const std::string& precision) {
  std::shared_ptr<nn::Module> model = module.model();
  model->eval();
  autograd::NoGradGuard no_grad;
  const Device device = model->parameters().front().device();
  data::DataLoader loader(std::move(data), {.batch_size = batch_size, .prefetch = 0, .device = device});
  LocalContext ctx(model, device);
  std::map<std::string, double> totals;
  for (auto& batch : loader.epoch()) {
    autograd::AutocastGuard autocast(precision == "bf16-mixed" ? DType::kBFloat16 : DType::kFloat16,
                                     precision != "32");
    for (const auto& [key, value] : module.validation_step(batch, ctx)) totals[key] += value;
  }
  return totals;
}

}  // namespace

int main(int argc, char** argv) {
  trainer::TrainerOptions options;
  options.max_epochs = 20;
  options.batch_size = 16;
  std::string model = "mlp", data_path = data::kDigitsDefaultPath;
  uint64_t split_seed = 0;
  double lr = 0.05;
  bool no_progress = false;

  CLI::App app{"Digits classifier on the ringtrain Trainer (DDP/DP/ddp2, mixed precision, SLURM requeue)"};
  app.add_option("--model", model, "mlp or cnn")->check(CLI::IsMember({"mlp", "cnn"}))->capture_default_str();
  app.add_option("--devices", options.devices,
                 "auto (the GPUs when there are any, else the CPU), 0 or cpu (CPU), N (the first N GPUs), "
                 "\"0,1\" (these GPUs), -1 (all GPUs); on the CPU, --strategy dp/ddp2 runs 2 replicas")
      ->capture_default_str();
  app.add_option("--num-nodes", options.num_nodes, "nodes the launcher started")
      ->check(CLI::Range(1, 100000))->capture_default_str();
  app.add_option("--strategy", options.strategy, "auto (ddp with several processes, dp with several GPUs), "
                 "none, dp, ddp, ddp2")
      ->check(CLI::IsMember({"auto", "none", "dp", "ddp", "ddp2"}))->capture_default_str();
  app.add_option("--backend", options.backend, "collectives between processes: auto (nccl on GPUs, ring on the "
                 "CPU), ring, mpi, nccl")
      ->check(CLI::IsMember({"auto", "ring", "mpi", "nccl"}))->capture_default_str();
  app.add_option("--precision", options.precision, "32, 16-mixed, bf16-mixed")
      ->check(CLI::IsMember({"32", "16-mixed", "bf16-mixed"}))->capture_default_str();
  app.add_option("--epochs", options.max_epochs, "epochs to train (a resumed run counts the earlier ones); "
                 "-1: no epoch limit, --max-steps ends the run")
      ->check(count_or_minus_one("no epoch limit (with --max-steps N)"))->capture_default_str();
  app.add_option("--max-steps", options.max_steps, "stop after this many optimizer steps in total (-1: no limit)")
      ->check(count_or_minus_one("no limit"))->capture_default_str();
  app.add_option("--batch-size", options.batch_size, "examples per step per process")
      ->check(CLI::Range(1, kIntMax))->capture_default_str();
  app.add_option("--accumulate-grad-batches", options.accumulate_grad_batches,
                 "batches whose gradients add up to one optimizer step")
      ->check(CLI::Range(1, kIntMax))->capture_default_str();
  app.add_option("--gradient-clip-val", options.gradient_clip_val,
                 "clip the gradients' global L2 norm to this (0: no clipping)")
      ->check(positive_real(true))->capture_default_str();
  app.add_option("--lr", lr, "peak learning rate of the cosine schedule over --epochs (constant with --epochs -1)")->check(positive_real())->capture_default_str();
  app.add_option("--seed", options.seed, "data order and initial weights")->capture_default_str();
  app.add_option("--split-seed", split_seed, "train/test split")->capture_default_str();
  app.add_option("--data", data_path, "digits.csv(.gz)")->capture_default_str();
  app.add_option("--checkpoint-dir", options.checkpoint_dir, "checkpoint after every epoch and on signals");
  app.add_option("--keep-last", options.keep_last, "checkpoints to keep")
      ->check(CLI::Range(1, kIntMax))->capture_default_str();
  app.add_option("--resume", options.resume, "auto (the newest valid checkpoint in --checkpoint-dir, if any), never, or one checkpoint: its "
                 "stem as listed in --checkpoint-dir (ckpt-0000000090) or its path without the extension")->capture_default_str();
  app.add_option("--metrics-csv", options.metrics_csv, "per-epoch metrics (rank 0)");
  app.add_option("--step-log", options.step_log_csv, "per-step loss log: step,epoch,loss (rank 0)");
  app.add_option("--requeue-signal", options.requeue_signal, "signal that means 'walltime is near'")
      ->check(CLI::Validator(
          [](std::string& name) -> std::string {
            try {
              slurm::SignalWatcher::parse_signal(name);
              return {};
            } catch (const std::exception& e) {
              return e.what();
            }
          },
          "SIGNAL"))
      ->capture_default_str();
  app.add_option("--simulate-signal-at-step", options.simulate_signal_at_step,
                 "raise the requeue signal on rank 0 after this optimizer step (testing; 0: during start-up, "
                 "-1: never)")
      ->check(CLI::Range(int64_t{-1}, int64_t{std::numeric_limits<int64_t>::max()}))->capture_default_str();
  app.add_flag("--no-progress", no_progress, "no progress bar");
  CLI11_PARSE(app, argc, argv);
  options.progress_bar = !no_progress;

  try {
    auto all = data::load_digits({.path = data_path, .normalize = true, .as_images = model == "cnn"});
    auto [train_set, test_set] = data::train_test_split(all, 0.2, split_seed);
    auto train = std::make_shared<data::TensorDataset>(std::move(train_set));
    auto test = std::make_shared<data::TensorDataset>(std::move(test_set));
    options.resume = resolve_resume(options.resume, options.checkpoint_dir);
    DigitsClassifier module(model == "cnn", options.seed, lr, options.max_epochs);
    trainer::Trainer trainer(options);
    trainer::FitResult r = trainer.fit(module, train, test);
    std::map<std::string, double> v = r.last_validation;
    std::string note;
    if (r.rank == 0 && !r.stopped_early && v.empty() && !r.resumed_from.empty()) {
      // The checkpoint was of a finished run (--epochs / --max-steps reached): nothing
      // was trained, so nothing validated; report the restored model.
      v = evaluate(module, test, options.batch_size, options.precision);
      note = "; nothing left to train, evaluated the model restored from " + r.resumed_from;
    }
    if (r.rank != 0) {
      // rank 0 reports for the job, in its output and its exit status
    } else if (r.stopped_early && r.requeued) {
      std::printf("stopped at step %lld for a signal; job requeued\n", (long long)r.global_step);
    } else if (r.stopped_early && !options.checkpoint_dir.empty()) {
      std::printf("stopped at step %lld for a signal before finishing; not requeued; run the same command again "
                  "to resume from %s (exit status %d)\n",
                  (long long)r.global_step, options.checkpoint_dir.c_str(), kExitStoppedResumable);
      return kExitStoppedResumable;
    } else if (r.stopped_early) {
      std::printf("stopped at step %lld for a signal before finishing; nothing saved (no --checkpoint-dir) "
                  "(exit status %d)\n",
                  (long long)r.global_step, kExitStoppedNothingSaved);
      return kExitStoppedNothingSaved;
    } else if (v.count("val_count") && v.at("val_count") > 0) {
      std::printf("final test accuracy %.2f%% (%g/%g), test loss %.4f, %lld steps%s\n",
                  100.0 * v.at("val_correct") / v.at("val_count"), v.at("val_correct"), v.at("val_count"),
                  v.at("val_loss_sum") / v.at("val_count"), (long long)r.global_step, note.c_str());
    }
    if (r.rank == 0 && r.replicas_compared > 0)  // (fit() fails when they differ)
      std::printf("model replicas identical on %d ranks (weights fingerprint %016llx)\n", r.replicas_compared,
                  static_cast<unsigned long long>(r.weights_fingerprint));
  } catch (const std::exception& e) {
    std::cerr << "digits_ddp: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
