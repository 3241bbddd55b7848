// trainer.h: a Lightning-style Trainer: the user writes what one step computes,
// the Trainer does the distributed plumbing, precision, checkpoints and requeue.
//
// defines: TrainingModule (what the user subclasses), StepContext, TrainerOptions
//          (parsed the way Lightning parses them), FitResult, Trainer.
//
// What fit() does, in order:
//   0. install the SignalWatcher (SIGUSR1/SIGTERM only set a flag from here on,
//      so a walltime signal during rendezvous or resume cannot kill the process);
//   1. detect how the process was launched (slurm/cluster_environment.h: SLURM,
//      torchrun-style variables, mpirun, or plain local) and join the process
//      group unless it is known to be a single process (a PMIx-only launch gives
//      no size: MPI tells it at init) (comm::init_process_group);
//   2. pick the device (LOCAL_RANK -> GPU for ddp, or the task's own GPU under
//      srun --gpus-per-task; the listed GPUs for dp/ddp2, ddp2 in one process per
//      node or per task with GPUs of its own; CPU with devices=0) and wrap the
//      model: DistributedDataParallel (ddp), DataParallel (dp), or DDP over
//      DataParallel (ddp2);
//   3. shard the data with a DistributedSampler (seed + epoch), evaluate with its
//      exact mode so every validation example counts once;
//   4. resume (resume="auto": the newest valid checkpoint, if any; checkpoints that
//      are all damaged are an error, not a fresh start): rank 0 picks it, every rank
//      loads that one, and if any rank cannot, all fail naming it; a checkpoint taken
//      inside an epoch is continued at that batch only with the same batch size,
//      world size and seed (otherwise the epoch restarts, with a message);
//      module-owned generators (seeded Dropout) are saved and restored too;
//      then one poll: a signal that came during start-up stops the run here
//      (nothing trained, so nothing to save; requeued on SIGUSR1);
//   5. train: accumulate_grad_batches micro-batches per optimizer step (DDP's
//      no_sync on all but the last), autocast + LossScaler for "16-mixed",
//      autocast for "bf16-mixed", gradient clipping after unscaling;
//   6. at every step boundary ask the RequeueCoordinator whether a signal came
//      (all ranks agree): then rank 0 writes a checkpoint, all ranks meet at a
//      barrier, rank 0 runs `scontrol requeue` (SIGUSR1) or not (SIGTERM), and
//      fit() returns with FitResult::stopped_early (and requeued) for the program to
//      choose its exit status (examples/digits_ddp: 0 requeued, 3 stopped with a
//      checkpoint, 4 stopped with nothing saved);
//   7. after each epoch: validation through the model without the DDP wrapper
//      (ranks have different validation batch counts; rank 0's buffers are
//      broadcast first), sums reduced over the union of the ranks' keys (a rank
//      without batches contributes 0), metrics CSV row, checkpoint (keep last K;
//      a second save at the same step gets its own file, nothing is overwritten).
#pragma once

#include <csignal>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "comm/process_group.h"
#include "nn/data/dataset.h"
#include "nn/lr_scheduler.h"
#include "nn/module.h"
#include "nn/optim.h"

namespace ringtrain::trainer {

// Given to the user's steps: how to run the (wrapped) model, where data lives.
class StepContext {
 public:
  virtual ~StepContext() = default;
  // Forward through the wrapped model (DDP/DP), so gradients are reduced. In
  // validation_step it runs the model without the DDP wrapper (no collectives).
  virtual Tensor forward(const Tensor& input) = 0;
  virtual Device device() const = 0;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
};

struct Optimizers {
  std::unique_ptr<nn::Optimizer> optimizer;
  std::unique_ptr<nn::LRScheduler> scheduler;  // optional: stepped once per epoch
};

// What a user subclasses (LightningModule's shape).
class TrainingModule {
 public:
  virtual ~TrainingModule() = default;
  // The network. Called once, before wrapping; build it in the constructor.
  virtual std::shared_ptr<nn::Module> model() = 0;
  // The loss of one batch (inputs/targets already on ctx.device()).
  virtual Tensor training_step(const data::Batch& batch, StepContext& ctx) = 0;
  // Sums over one validation batch, e.g. {"loss_sum", "correct", "count"}; the
  // Trainer adds them over batches and ranks (a key missing on a rank counts 0 there;
  // a rank may have no validation batch at all). Runs under no_grad in eval mode.
  virtual std::map<std::string, double> validation_step(const data::Batch& batch, StepContext& ctx) {
    return {};
  }
  virtual Optimizers configure_optimizers(nn::Module& model) = 0;
};

struct TrainerOptions {
  std::string devices = "auto";     // "auto", "0" (CPU), N, "0,1", "[0, 1]", "-1" (all GPUs)
  int num_nodes = 1;                // checked against the launcher's view
  std::string strategy = "auto";    // auto, none, dp, ddp, ddp2
  std::string backend = "auto";     // auto (nccl on GPUs, ring on CPUs), ring, mpi, nccl
  std::string precision = "32";     // 32, 16-mixed, bf16-mixed
  int64_t max_epochs = 10;          // >= 1, or -1: no epoch limit (then max_steps must be set); 0 is an error
  int64_t max_steps = -1;           // optimizer steps in total (a resumed run counts the earlier ones); -1: no limit
  int64_t batch_size = 32;          // per process
  int accumulate_grad_batches = 1;
  double gradient_clip_val = 0;     // 0: no clipping (global L2 norm otherwise)
  uint64_t seed = 0;                // data order (DistributedSampler) and default generator
  std::string checkpoint_dir{};     // empty: no checkpoints
  int keep_last = 3;
  std::string resume = "auto";      // auto (newest valid, if any), never, or a checkpoint's stem
                                    // (a path, or a name in checkpoint_dir: "ckpt-0000000004")
  std::string metrics_csv{};        // per-epoch metrics (rank 0)
  std::string step_log_csv{};       // per-step loss log (rank 0), for exact-replay checks
  bool progress_bar = true;         // rank 0
  std::string requeue_signal = "SIGUSR1";
  // For tests: behave as if the requeue signal arrived after this many steps (-1: never;
  // 0: during start-up, before the first step).
  int64_t simulate_signal_at_step = -1;
};

struct FitResult {
  int64_t epochs_completed = 0;
  int64_t global_step = 0;
  bool stopped_early = false;         // a requeue/termination signal ended the run
  bool requeued = false;              // rank 0 ran scontrol requeue
  int64_t skipped_steps = 0;          // steps the loss scaler skipped (inf/NaN)
  std::map<std::string, double> last_validation;  // summed over the validation set
  std::string resumed_from;           // checkpoint stem, empty when fresh
  int rank = 0;                       // this process's rank (print results on rank 0 only)
  // nn::weights_fingerprint of the trained model. With DDP, fit() ends by comparing it
  // across ranks (an error names the ranks that differ); replicas_compared is then the
  // number of ranks that agreed (0: not compared, e.g. one process).
  uint64_t weights_fingerprint = 0;
  int replicas_compared = 0;
};

class Trainer {
 public:
  explicit Trainer(TrainerOptions options);
  FitResult fit(TrainingModule& module, std::shared_ptr<const data::Dataset> train,
                std::shared_ptr<const data::Dataset> val = nullptr);
  const TrainerOptions& options() const { return options_; }

 private:
  // fit()'s body; `group` is set once this process has joined the others, so that fit()
  // can abort the group with the reason when anything after that throws.
  FitResult run_fit(TrainingModule& module, std::shared_ptr<const data::Dataset> train,
                    std::shared_ptr<const data::Dataset> val, std::shared_ptr<comm::ProcessGroup>& group);

  TrainerOptions options_;
};

}  // namespace ringtrain::trainer
