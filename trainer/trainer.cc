// trainer.cc: see trainer.h for the order of things in fit().
#include "trainer/trainer.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <limits>
#include <set>
#include <string>
#include <tuple>

#include "autograd/autocast.h"
#include "autograd/autograd.h"
#include "autograd/functions.h"
#include "comm/init.h"
#include "ddp/data_parallel.h"
#include "ddp/distributed_data_parallel.h"
#include "ddp/distributed_sampler.h"
#include "ddp/loss_scaler.h"
#include "ddp/reducer.h"
#include "nn/checkpoint.h"
#include "nn/data/dataloader.h"
#include "nn/data/sampler.h"
#include "slurm/cluster_environment.h"
#include "slurm/device_parser.h"
#include "slurm/requeue.h"
#include "tensor/cuda/runtime.h"
#include "tensor/ops.h"
#include "tensor/safetensors.h"

namespace ringtrain::trainer {

namespace {

using Clock = std::chrono::steady_clock;

// A run that died without saving (kill -9, a node lost, the OOM killer) after its last
// checkpoint had already logged the steps it trained since; resumed from that
// checkpoint, it trains and logs them again. So before the resumed run appends, the
// rows of a CSV log whose global step (column `step_column`) is past the checkpoint's
// are removed, and every step and epoch keeps one row, as in an uninterrupted run. A
// first line that is not a number (a header) stays; a last line without its newline
// (cut by the crash) goes. Returns the number of lines removed (0: the file is missing
// or was left as it was).
int64_t drop_rows_logged_after(const std::string& path, size_t step_column, int64_t last_step) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return 0;
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::string kept;
  int64_t removed = 0;
  size_t line_start = 0;
  for (bool first = true; line_start < text.size(); first = false) {
    const size_t newline = text.find('\n', line_start);
    if (newline == std::string::npos) {  // the crash cut this line short
      ++removed;
      break;
    }
    const std::string line = text.substr(line_start, newline - line_start);
    line_start = newline + 1;
    size_t field_start = 0;
    for (size_t c = 0; c < step_column && field_start != std::string::npos; ++c) {
      field_start = line.find(',', field_start);
      if (field_start != std::string::npos) ++field_start;
    }
    const char* begin = field_start == std::string::npos ? nullptr : line.c_str() + field_start;
    char* end = nullptr;
    const long long step = begin ? std::strtoll(begin, &end, 10) : 0;
    const bool numeric = begin && end != begin && (*end == ',' || *end == '\0');
    if ((first && !numeric) || (numeric && step <= last_step)) {
      kept += line;
      kept += '\n';
    } else {
      ++removed;
    }
  }
  if (removed > 0) write_file_atomically(path, kept);
  return removed;
}

// `value` as the shortest text that reads back as the same double (Python's repr, which
// is what Lightning's CSVLogger writes). The logs are compared across runs to show that
// a resumed run replays an uninterrupted one bit for bit; the stream default (6
// significant digits) hid any difference below them.
std::string exact(double value) {
  char text[32];
  const auto [end, ec] = std::to_chars(text, text + sizeof text, value);
  return std::string(text, end);
}

// How the model is wrapped, after resolving "auto" against the environment.
enum class Strategy { kNone, kDp, kDdp, kDdp2 };

Strategy resolve_strategy(const std::string& s, int world, size_t local_devices) {
  if (s == "none" || s == "single") return Strategy::kNone;
  if (s == "dp") return Strategy::kDp;
  if (s == "ddp") return Strategy::kDdp;
  if (s == "ddp2") return Strategy::kDdp2;
  RT_CHECK(s == "auto", "Trainer: unknown strategy '", s, "'; expected auto, none, dp, ddp or ddp2");
  if (world > 1) return Strategy::kDdp;
  return local_devices > 1 ? Strategy::kDp : Strategy::kNone;
}

class Context : public StepContext {
 public:
  std::function<Tensor(const Tensor&)> forward_fn;
  Device device_ = Device::cpu();
  int rank_ = 0, world_ = 1;
  Tensor forward(const Tensor& input) override { return forward_fn(input); }
  Device device() const override { return device_; }
  int rank() const override { return rank_; }
  int world_size() const override { return world_; }
};

// The bytes of `text` as int32 words (zero-padded), for collectives on strings.
std::vector<int32_t> pack_words(const std::string& text, size_t words) {
  std::vector<int32_t> out(words, 0);
  std::memcpy(out.data(), text.data(), text.size());
  return out;
}

// Every rank's `text`, indexed by rank (two allgathers: the lengths, then the bytes).
std::vector<std::string> allgather_strings(comm::ProcessGroup& group, const std::string& text) {
  const int world = group.size();
  int64_t length = static_cast<int64_t>(text.size());
  std::vector<int64_t> lengths(world);
  group.allgather({&length, 1, DType::kInt64, Device::cpu()}, {lengths.data(), lengths.size(), DType::kInt64, Device::cpu()})
      .wait();
  const int64_t longest = *std::max_element(lengths.begin(), lengths.end());
  const size_t words = static_cast<size_t>((longest + 3) / 4);
  std::vector<std::string> out(world);
  if (words == 0) return out;
  std::vector<int32_t> mine = pack_words(text, words), all(words * world);
  group.allgather({mine.data(), words, DType::kInt32, Device::cpu()}, {all.data(), all.size(), DType::kInt32, Device::cpu()})
      .wait();
  for (int r = 0; r < world; ++r)
    out[r].assign(reinterpret_cast<const char*>(all.data() + words * r), static_cast<size_t>(lengths[r]));
  return out;
}

// Rank `root`'s `text` on every rank.
std::string broadcast_string(comm::ProcessGroup& group, const std::string& text, int root) {
  int64_t length = static_cast<int64_t>(text.size());
  group.broadcast({&length, 1, DType::kInt64, Device::cpu()}, root).wait();
  const size_t words = static_cast<size_t>((length + 3) / 4);
  if (words == 0) return "";
  std::vector<int32_t> data = pack_words(group.rank() == root ? text : std::string(), words);
  group.broadcast({data.data(), words, DType::kInt32, Device::cpu()}, root).wait();
  return std::string(reinterpret_cast<const char*>(data.data()), static_cast<size_t>(length));
}

// Validation sums over ranks. Ranks may have returned different key sets: one with
// no validation batches (the exact sampler gives ranks different counts) returned
// none at all. Every rank reduces the union of the keys in sorted order, a key it
// lacks counting 0, so every rank issues the same collectives whatever its data.
std::map<std::string, double> allreduce_totals(comm::ProcessGroup& group, const std::map<std::string, double>& totals) {
  std::string names;
  for (const auto& [k, v] : totals) {
    names += k;
    names.push_back('\0');  // the separator: a key may hold any other character
  }
  std::set<std::string> keys;
  for (const std::string& rank_names : allgather_strings(group, names)) {
    size_t start = 0;
    for (size_t end; (end = rank_names.find('\0', start)) != std::string::npos; start = end + 1)
      keys.insert(rank_names.substr(start, end - start));
  }
  std::vector<double> values;
  for (const std::string& k : keys) {
    auto it = totals.find(k);
    values.push_back(it != totals.end() ? it->second : 0.0);
  }
  std::map<std::string, double> out;
  if (values.empty()) return out;
  group.allreduce({values.data(), values.size(), DType::kFloat64, Device::cpu()}, comm::ReduceOp::kSum).wait();
  size_t i = 0;
  for (const std::string& k : keys) out[k] = values[i++];
  return out;
}

// Rank 0's buffers (BatchNorm running statistics) on every rank. DDP broadcasts them
// before each training forward, but each rank's last forward then updated its own
// copy; evaluating with rank 0's makes every rank evaluate the model that is
// checkpointed (rank 0 writes it). One broadcast per buffer, the same on every rank.
void broadcast_buffers_from_rank0(comm::ProcessGroup& group, nn::Module& model) {
  autograd::NoGradGuard no_grad;
  std::vector<comm::Work> works;
  for (Tensor& b : model.buffers())
    if (b.numel() > 0) works.push_back(group.broadcast(ddp::buffer_of(b), 0));
  for (comm::Work& w : works) w.wait();
}

// "[=====>    ]" for the progress line.
std::string bar(int64_t done, int64_t total, int width = 24) {
  int filled = total > 0 ? static_cast<int>(width * done / total) : width;
  return "[" + std::string(filled, '=') + (filled < width ? ">" : "") +
         std::string(std::max(0, width - filled - 1), ' ') + "]";
}

// The states (seed, offset) of this thread's default generator and of every generator
// the model owns, to put back after something that must not consume them.
class GeneratorStates {
 public:
  static GeneratorStates take(nn::Module& model) {
    GeneratorStates states;
    states.add(&default_generator());
    for (auto& [name, gen] : model.named_generators()) states.add(gen);
    return states;
  }
  void restore() const {
    for (const auto& [gen, seed, offset] : saved_) gen->set_state(seed, offset);
  }

 private:
  void add(Generator* gen) { saved_.emplace_back(gen, gen->seed(), gen->offset()); }
  std::vector<std::tuple<Generator*, uint64_t, uint64_t>> saved_;
};

}  // namespace

Trainer::Trainer(TrainerOptions options) : options_(std::move(options)) {
  // Lightning's rule: max_epochs=-1 runs until max_steps; 0 would train nothing.
  RT_CHECK(options_.max_steps == -1 || options_.max_steps >= 1, "Trainer: max_steps must be -1 (no limit) or >= 1, got ",
           options_.max_steps);
  RT_CHECK(options_.max_epochs != 0,
           "Trainer: max_epochs=0 would train nothing; set max_epochs >= 1, or max_epochs=-1 (no epoch limit) "
           "with max_steps=N to stop after N optimizer steps");
  RT_CHECK(options_.max_epochs >= -1, "Trainer: max_epochs must be >= 1, or -1 for no epoch limit, got ",
           options_.max_epochs);
  RT_CHECK(options_.max_epochs >= 1 || options_.max_steps >= 1,
           "Trainer: max_epochs=-1 and max_steps=-1 would train forever; set max_steps >= 1 (or max_epochs >= 1)");
  RT_CHECK(options_.batch_size >= 1, "Trainer: batch_size must be >= 1, got ", options_.batch_size);
  RT_CHECK(options_.accumulate_grad_batches >= 1, "Trainer: accumulate_grad_batches must be >= 1, got ",
           options_.accumulate_grad_batches);
  RT_CHECK(options_.precision == "32" || options_.precision == "16-mixed" || options_.precision == "bf16-mixed",
           "Trainer: precision must be 32, 16-mixed or bf16-mixed, got '", options_.precision, "'");
  RT_CHECK(options_.num_nodes >= 1, "Trainer: num_nodes must be >= 1");
  RT_CHECK(options_.backend == "auto" || options_.backend == "ring" || options_.backend == "mpi" ||
               options_.backend == "nccl",
           "Trainer: backend must be auto, ring, mpi or nccl, got '", options_.backend, "'");
  RT_CHECK(std::isfinite(options_.gradient_clip_val) && options_.gradient_clip_val >= 0,
           "Trainer: gradient_clip_val must be >= 0 (0: no clipping), got ", options_.gradient_clip_val);
  RT_CHECK(options_.keep_last >= 1, "Trainer: keep_last must be >= 1, got ", options_.keep_last);
  RT_CHECK(!options_.resume.empty(), "Trainer: resume must be \"auto\", \"never\" or a checkpoint stem, got ''");
  RT_CHECK(options_.resume == "auto" || options_.resume == "never" || !options_.checkpoint_dir.empty(),
           "Trainer: resume='", options_.resume, "' names a checkpoint but checkpoint_dir is empty; set "
           "checkpoint_dir (the run's checkpoints go there), or resume=\"never\"");
}

// An error after rendezvous may be one rank's alone (rank 0's output paths or its
// checkpoint writes, a rank's bad batch): the others would wait for it in their next
// collective until the timeout, told only that it died. So it aborts the group with
// its reason, and every rank fails at once with that message.
FitResult Trainer::fit(TrainingModule& module, std::shared_ptr<const data::Dataset> train,
                       std::shared_ptr<const data::Dataset> val) {
  std::shared_ptr<comm::ProcessGroup> group;
  try {
    return run_fit(module, std::move(train), std::move(val), group);
  } catch (const std::exception& e) {
    if (group && group->size() > 1 && !group->failed())
      group->abort(detail::concat("Trainer: rank ", group->rank(), " failed: ", e.what()));
    throw;
  }
}

FitResult Trainer::run_fit(TrainingModule& module, std::shared_ptr<const data::Dataset> train,
                           std::shared_ptr<const data::Dataset> val, std::shared_ptr<comm::ProcessGroup>& group) {
  RT_CHECK(train != nullptr && train->size() > 0, "Trainer::fit: the training data set is empty");
  const TrainerOptions& o = options_;
  FitResult result;

  // ---- 0. watch for the walltime signal from the very start. SLURM may send it
  // soon after a (re)start (docs/slurm.md), while we still wait for the other ranks
  // in rendezvous or load a checkpoint; without a handler it would kill us.
  slurm::SignalWatcher watcher(slurm::SignalWatcher::parse_signal(o.requeue_signal));

  // ---- 1. who are we, and join the others
  slurm::ClusterEnvironment env = slurm::detect_cluster_environment();
  RT_CHECK(env.num_nodes == o.num_nodes || (env.launcher == slurm::Launcher::kLocal && o.num_nodes == 1),
           "Trainer: num_nodes=", o.num_nodes, " but the launcher (", slurm::launcher_name(env.launcher),
           ") started this job on ", env.num_nodes, " node(s); pass num_nodes=", env.num_nodes,
           " or launch on ", o.num_nodes, " nodes (e.g. srun -N", o.num_nodes, ")");
  slurm::DeviceSelection selection;
  try {
    selection = slurm::parse_devices(o.devices);
  } catch (const slurm::SlurmError& e) {
    // Lightning's devices=N under SLURM is the node's GPU count; a task bound to GPUs
    // of its own sees only those, so say what to write.
    if (env.gpus_per_task == 0) throw;
    throw slurm::SlurmError(detail::concat(e.what(), ". srun --gpus-per-task=", env.gpus_per_task, " gave this task ",
                                           env.gpus_per_task, " GPU(s) of its own, and devices names GPUs this "
                                           "process sees, not the node's: write devices=auto (every task its own)"));
  }
  RT_CHECK(o.backend != "nccl" || !selection.is_cpu(), "Trainer: backend=nccl needs GPUs, but devices='", o.devices,
           "' trains on the CPU; use backend=ring (or auto), or devices that name GPUs");
  const size_t local_devices = std::max<size_t>(1, selection.cuda_devices.size());
  auto check_strategy_fits = [&](int processes, Strategy strategy) {
    RT_CHECK(processes == 1 || strategy == Strategy::kDdp || strategy == Strategy::kDdp2,
             "Trainer: ", processes, " processes were launched but strategy '", o.strategy,
             "' runs in one process; use strategy=ddp (or ddp2), or launch a single process");
  };
  // A known multi-process launch with a one-process strategy fails before rendezvous.
  if (env.world_size > 1) check_strategy_fits(env.world_size, resolve_strategy(o.strategy, env.world_size, local_devices));

  // world_size -1: the launcher gave the rank only (PMIx); MPI tells the size at init.
  // Anything but a known single process therefore joins a group.
  if (env.world_size != 1) {
    comm::InitOptions init;
    init.backend = o.backend != "auto" ? o.backend : (selection.is_cpu() ? "ring" : "nccl");
    init.init_method = env.init_method;
    group = comm::init_process_group(init);
  }
  const int rank = group ? group->rank() : 0;
  const int world = group ? group->size() : 1;
  // What "k batches into the epoch" depends on: written with every checkpoint and
  // compared on resume (one definition, so the two can never drift apart).
  const nlohmann::json data_layout = {
      {"batch_size", o.batch_size}, {"world_size", world}, {"seed", o.seed}, {"samples", train->size()}};
  const bool global_zero = rank == 0;
  // Rank 0 writes checkpoints and logs: its output paths fail now, not after the first
  // epoch has trained (fit() aborts the group with the reason, so the others stop too).
  if (global_zero && !o.checkpoint_dir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(o.checkpoint_dir, ec);
    RT_CHECK(!ec && access(o.checkpoint_dir.c_str(), W_OK) == 0, "Trainer: cannot create or write checkpoint_dir '",
             o.checkpoint_dir, "': ", ec ? ec.message() : std::strerror(errno));
  }
  // Checked now, so that they fail before anything trains; opened later: the step log
  // once the resume has dropped what a crashed run logged after its checkpoint, the
  // metrics CSV at each epoch's end (its header names the metrics, known then).
  const auto check_writable = [](const std::string& path) {
    const std::filesystem::path p(path);
    const std::string dir = p.has_parent_path() ? p.parent_path().string() : ".";
    const bool ok = access(p.c_str(), F_OK) == 0 ? access(p.c_str(), W_OK) == 0 : access(dir.c_str(), W_OK) == 0;
    RT_CHECK(ok, "Trainer: cannot write '", path, "': ", std::strerror(errno),
             " (the directory must exist and be writable)");
  };
  if (global_zero && !o.step_log_csv.empty()) check_writable(o.step_log_csv);
  if (global_zero && !o.metrics_csv.empty()) check_writable(o.metrics_csv);
  result.rank = rank;
  Strategy strategy = resolve_strategy(o.strategy, world, local_devices);
  check_strategy_fits(world, strategy);

  // ---- 2. device and wrapping
  Device device = Device::cpu();
  std::vector<Device> dp_devices;
  if (!selection.is_cpu()) {
    if (strategy == Strategy::kDdp) {
      // one process per GPU on each node (a PMIx-only launch knows no local count: one per rank)
      const int local_processes = env.world_size > 0 ? env.local_world_size : 1;
      // (srun --gpus-per-task: each task's own GPUs, whatever its local rank)
      const int index = slurm::ddp_device_for_local_rank(selection, env.local_rank, local_processes,
                                                         env.gpus_per_task, cuda::device_count());
      cuda::set_device(index);
      device = Device::cuda(index);
    } else {
      // ddp2: one process per node (or per task with GPUs of its own) drives the GPUs
      if (strategy == Strategy::kDdp2)
        slurm::check_ddp2_devices(selection, env.world_size > 0 ? env.local_world_size : 1, env.gpus_per_task,
                                  cuda::device_count());
      if (strategy == Strategy::kNone) slurm::check_single_device_strategy(selection);
      for (int i : selection.cuda_devices) dp_devices.push_back(Device::cuda(i));
      device = dp_devices.front();
    }
  } else if (strategy == Strategy::kDp || strategy == Strategy::kDdp2) {
    // CPU data parallelism: one replica per requested "device" (threads).
    int replicas = std::max(2, static_cast<int>(selection.cuda_devices.size()));
    dp_devices.assign(replicas, Device::cpu());
  }
  default_generator().manual_seed(o.seed + static_cast<uint64_t>(rank));
  std::shared_ptr<nn::Module> model = module.model();
  RT_CHECK(model != nullptr, "Trainer::fit: the module's model() returned null; return the network to train");
  model->to(device);
  std::shared_ptr<nn::Module> wrapped = model;
  if (strategy == Strategy::kDp || strategy == Strategy::kDdp2)
    wrapped = std::make_shared<ddp::DataParallel>(model, dp_devices);
  std::unique_ptr<ddp::DistributedDataParallel> ddp_model;
  if (group && (strategy == Strategy::kDdp || strategy == Strategy::kDdp2))
    ddp_model = std::make_unique<ddp::DistributedDataParallel>(wrapped, group);
  Optimizers optimizers = module.configure_optimizers(*model);
  RT_CHECK(optimizers.optimizer != nullptr, "Trainer: configure_optimizers returned no optimizer");
  nn::Optimizer& optimizer = *optimizers.optimizer;

  Context ctx;
  ctx.device_ = device;
  ctx.rank_ = rank;
  ctx.world_ = world;
  // Training goes through DDP (gradient reduction). Validation does not: DDP's forward
  // starts with collectives (the buffer broadcast), and ranks get different numbers
  // of validation batches (the exact sampler), so they would not match.
  auto train_forward = [&](const Tensor& x) { return ddp_model ? ddp_model->forward(x) : wrapped->forward(x); };
  auto eval_forward = [&](const Tensor& x) { return wrapped->forward(x); };
  ctx.forward_fn = train_forward;

  // ---- precision
  const bool autocast = o.precision != "32";
  const DType autocast_dtype = o.precision == "bf16-mixed" ? DType::kBFloat16 : DType::kFloat16;
  ddp::LossScalerOptions scaler_options;
  scaler_options.enabled = o.precision == "16-mixed";  // bf16 has float32's range: no scaling
  ddp::LossScaler scaler(scaler_options, group);

  // ---- 3. data
  std::shared_ptr<data::Sampler> train_sampler;
  if (world > 1) {
    train_sampler = std::make_shared<ddp::DistributedSampler>(train->size(), rank, world,
                                                              ddp::DistributedSamplerOptions{.shuffle = true, .seed = o.seed});
  } else {
    train_sampler = std::make_shared<data::RandomSampler>(train->size(), o.seed);
  }
  data::DataLoader train_loader(train, {.batch_size = o.batch_size, .device = device}, train_sampler);
  std::unique_ptr<data::DataLoader> val_loader;
  if (val && val->size() > 0) {
    auto val_sampler = std::make_shared<ddp::DistributedSampler>(
        val->size(), rank, world, ddp::DistributedSamplerOptions{.shuffle = false, .exact = true});
    val_loader = std::make_unique<data::DataLoader>(val, data::DataLoaderOptions{.batch_size = o.batch_size, .device = device},
                                                    val_sampler);
  }

  // ---- 4. resume
  std::unique_ptr<nn::CheckpointManager> checkpoints;
  nn::CheckpointTargets targets{.model = model.get(), .optimizer = &optimizer,
                                .scheduler = optimizers.scheduler.get(), .generator = &default_generator()};
  // Random streams the model's layers own (a Dropout built with a seed): without
  // them a resumed run would draw other masks than an uninterrupted one.
  for (auto& [name, gen] : model->named_generators()) targets.extra_generators.emplace_back("model." + name, gen);
  int64_t start_epoch = 0, global_step = 0, skip_batches = 0;
  // The running train_loss sum and count of the epoch in progress (rank 0's batches; the
  // metrics row reports their mean). Saved with a checkpoint taken inside an epoch and
  // restored with it, so an epoch a signal cut reports the same mean as an uninterrupted one.
  double epoch_loss_sum = 0;
  int64_t epoch_loss_count = 0;
  if (!o.checkpoint_dir.empty()) {
    checkpoints = std::make_unique<nn::CheckpointManager>(o.checkpoint_dir, o.keep_last);
    // Rank 0 chooses the checkpoint and every rank loads that one: ranks choosing on
    // their own could disagree (a directory that is not shared, a save racing the
    // listing) and would then train from different states without noticing.
    // Rank 0's choice travels as {"stem": ..., "error": ...}: when it cannot choose,
    // every rank fails with its reason instead of waiting.
    nlohmann::json choice{{"stem", ""}, {"error", ""}};
    if (global_zero) {
      if (o.resume == "auto") {
        std::vector<std::string> skipped;
        try {
          choice["stem"] = checkpoints->resume_point("set resume=\"never\" to start fresh", &skipped)
                               .value_or("");
        } catch (const nn::CheckpointError& e) {
          choice["error"] = std::string("Trainer: resume=\"auto\": ") + e.what();
        }
        if (choice["error"] == "") {  // the error lists them itself
          for (const auto& s : skipped) std::cerr << "trainer: skipped an invalid checkpoint: " << s << "\n";
        }
      } else if (o.resume != "never") {
        // A checkpoint's path without its extension, or its name as checkpoint_dir lists
        // it ("ckpt-0000000090"): a relative stem not found as given is looked for there.
        std::string stem = o.resume;
        for (const std::string ext : {".json", ".safetensors"})
          if (stem.size() > ext.size() && stem.compare(stem.size() - ext.size(), ext.size(), ext) == 0)
            stem.resize(stem.size() - ext.size());
        const std::filesystem::path in_dir = std::filesystem::path(o.checkpoint_dir) / stem;
        if (std::filesystem::exists(stem + ".json")) {
          choice["stem"] = stem;
        } else if (std::filesystem::path(stem).is_relative() && std::filesystem::exists(in_dir.string() + ".json")) {
          choice["stem"] = in_dir.string();
        } else {
          choice["error"] = detail::concat("Trainer: resume='", o.resume, "': no checkpoint record at ", stem,
                                           ".json", std::filesystem::path(stem).is_relative()
                                                        ? " nor at " + in_dir.string() + ".json"
                                                        : std::string(),
                                           "; give a checkpoint's path without its extension, the name of one in "
                                           "checkpoint_dir, \"auto\" or \"never\"");
        }
      }
    }
    if (group) choice = nlohmann::json::parse(broadcast_string(*group, choice.dump(), 0));
    if (!choice["error"].get<std::string>().empty()) throw Error(choice["error"].get<std::string>());
    const std::string stem = choice["stem"].get<std::string>();
    std::optional<nn::CheckpointInfo> info;
    if (!stem.empty()) {
      if (!group) {
        info = nn::load_checkpoint(stem, targets);
      } else {
        std::string error;
        try {
          info = nn::load_checkpoint(stem, targets);
        } catch (const std::exception& e) {
          error = e.what();
        }
        std::vector<std::string> errors = allgather_strings(*group, error);
        std::string failed, first_error;
        for (int r = 0; r < world; ++r) {
          if (errors[r].empty()) continue;
          failed += (failed.empty() ? "" : ", ") + std::to_string(r);
          if (first_error.empty()) first_error = "rank " + std::to_string(r) + ": " + errors[r];
        }
        RT_CHECK(failed.empty(), "Trainer: rank(s) ", failed, " could not load checkpoint ", stem,
                 " (chosen by rank 0); every rank must resume from the same checkpoint, so none did. Is ",
                 o.checkpoint_dir, " the same directory on every node (a shared file system)? ", first_error);
      }
    }
    if (info) {
      start_epoch = info->progress.epoch;
      global_step = info->progress.step;
      if (info->extra.is_object()) {
        skip_batches = info->extra.value("batches_into_epoch", int64_t{0});
        // "k batches into the epoch" names the same samples only with the same batch
        // size, world size and seed (the sampler's order). Otherwise the epoch starts
        // over: some samples are seen twice, none is skipped.
        const nlohmann::json saved_layout = info->extra.value("data_layout", nlohmann::json());
        if (skip_batches > 0 && saved_layout.is_object() && saved_layout != data_layout) {
          if (global_zero)
            std::printf("trainer: %s stopped %lld batches into epoch %lld with %s; this run has %s, so that "
                        "position means other samples: epoch %lld restarts from its first batch\n",
                        info->stem.c_str(), (long long)skip_batches, (long long)info->progress.epoch,
                        saved_layout.dump().c_str(), data_layout.dump().c_str(), (long long)info->progress.epoch);
          skip_batches = 0;
        }
        if (skip_batches > 0) {
          const nlohmann::json saved = info->extra.value("epoch_loss", nlohmann::json());
          // (a sum that was not finite was written as null)
          if (saved.is_object() && saved.contains("count") && saved["count"].is_number_integer() &&
              saved["count"].get<int64_t>() > 0 && saved.contains("sum") &&
              (saved["sum"].is_number() || saved["sum"].is_null())) {
            epoch_loss_count = saved["count"].get<int64_t>();
            epoch_loss_sum = saved["sum"].is_number() ? saved["sum"].get<double>()
                                                      : std::numeric_limits<double>::quiet_NaN();
          }
        }
        if (info->extra.contains("scaler")) scaler.load_state_dict(info->extra["scaler"]);
        result.skipped_steps = info->extra.value("skipped_steps", int64_t{0});
      }
      // Every rank continues its own random stream (the checkpoint holds rank 0's).
      default_generator().set_state(default_generator().seed() + static_cast<uint64_t>(rank),
                                    default_generator().offset());
      result.resumed_from = info->stem;
      if (global_zero) {
        std::printf("trainer: resumed from %s (epoch %lld, step %lld, %lld batches into the epoch)\n",
                    info->stem.c_str(), (long long)start_epoch, (long long)global_step, (long long)skip_batches);
        // Values the checkpoint replaced (a schedule's t_max, say): the saved ones win, as
        // in PyTorch, so a resumed run with other settings keeps the saved curve. Say so.
        for (const std::string& note : info->notes) std::fprintf(stderr, "trainer: warning: %s\n", note.c_str());
      }
    }
  }
  // Rows a crashed run logged after the checkpoint it is resumed from: trained again now.
  if (global_zero && !result.resumed_from.empty()) {
    const auto drop = [&](const std::string& path, size_t step_column) {
      if (path.empty()) return;
      if (const int64_t removed = drop_rows_logged_after(path, step_column, global_step); removed > 0) {
        std::fprintf(stderr,
                     "trainer: removed %lld line(s) of %s logged after step %lld, the checkpoint's (the run "
                     "before stopped without saving them); they are trained and logged again\n",
                     (long long)removed, path.c_str(), (long long)global_step);
      }
    };
    drop(o.step_log_csv, 0);  // global_step,epoch,loss
    drop(o.metrics_csv, 1);   // epoch,step,train_loss,...
  }
  std::ofstream step_log;  // for the whole run
  if (global_zero && !o.step_log_csv.empty()) {
    step_log.open(o.step_log_csv, std::ios::app);
    RT_CHECK(step_log.good(), "Trainer: cannot write '", o.step_log_csv, "': ", std::strerror(errno),
             " (the directory must exist and be writable)");
  }
  // A requeued job (SLURM_RESTART_COUNT > 0) that finds nothing to resume from starts
  // over; say so, since the usual cause is a checkpoint_dir the new nodes do not share.
  if (global_zero && env.restart_count > 0 && result.resumed_from.empty() && o.resume != "never")
    std::fprintf(stderr,
                 "trainer: warning: this job was requeued %d time(s) (SLURM_RESTART_COUNT) but %s, so it starts "
                 "from step 0; give it a checkpoint_dir on a file system every node shares\n",
                 env.restart_count,
                 o.checkpoint_dir.empty() ? "has no checkpoint_dir"
                                          : ("'" + o.checkpoint_dir + "' holds no checkpoint").c_str());
  if (global_zero)
    std::printf("trainer: %s | strategy %s | device %s | precision %s | world %d\n", env.describe().c_str(),
                o.strategy.c_str(), device.str().c_str(), o.precision.c_str(), world);

  // Rank 0 alone writes, and the others go on to the next collective: a failed save
  // (disk full, say) reaches them through fit()'s abort, with its reason.
  auto save = [&](int64_t epoch, int64_t batches_into_epoch) {
    if (!checkpoints || !global_zero) return;
    checkpoints->save(targets, {epoch, global_step},
                      nlohmann::json{{"batches_into_epoch", batches_into_epoch},
                                     {"data_layout", data_layout},
                                     {"epoch_loss", batches_into_epoch > 0
                                                        ? nlohmann::json{{"sum", epoch_loss_sum},
                                                                         {"count", epoch_loss_count}}
                                                        : nlohmann::json{{"sum", 0.0}, {"count", 0}}},
                                     {"scaler", scaler.state_dict()},
                                     {"skipped_steps", result.skipped_steps}});
  };

  // ---- 5/6. train
  slurm::RequeueCoordinator coordinator(watcher, group);
  // A requeue/termination decision (the same on every rank): save (when there is
  // something new), meet, requeue on SIGUSR1 inside a SLURM job, and leave.
  auto stop_for_signal = [&](slurm::RequeueDecision decision, bool save_first, int64_t epoch, int64_t index) {
    // The walltime signal with no checkpoint_dir: a requeued run would have nothing to
    // resume from and start again at step 0, to be stopped again at its walltime, for
    // as long as the job may be requeued. So stop without requeueing (fit() returns,
    // and the program may still save the model it holds) and say how to resume.
    if (decision == slurm::RequeueDecision::kCheckpointAndRequeue && !checkpoints) {
      if (global_zero)
        std::printf("\ntrainer: the walltime signal (%s) arrived at step %lld; no checkpoint_dir, so nothing was "
                    "saved and the job is not requeued (it would start again from step 0); set checkpoint_dir "
                    "to resume after the walltime\n",
                    strsignal(watcher.requeue_signal()), (long long)global_step);
      result.stopped_early = true;
      return;
    }
    // carry_out: rank 0 saves, everyone meets (the checkpoint is on disk before anyone
    // leaves), rank 0 requeues inside a SLURM job; a failure there aborts the group.
    slurm::RequeueAction action = coordinator.carry_out(decision, env, [&] {
      if (save_first) save(epoch, index);
    });
    if (global_zero) {
      std::printf("\ntrainer: %s received at step %lld; %s\n", slurm::requeue_decision_name(decision),
                  (long long)global_step,
                  !checkpoints ? "no checkpoint_dir, nothing saved"
                  : save_first ? "checkpoint written"
                               : "nothing trained since the last checkpoint, nothing to save");
      if (action.requeued) std::printf("trainer: requeued job %s (%s)\n", env.requeue_id.c_str(), action.message.c_str());
    }
    result.requeued = action.requeued;
    result.stopped_early = true;
  };
  result.epochs_completed = start_epoch;  // the epochs a resumed run had finished before
  // A signal during start-up (rendezvous, resume): no step has run since the state
  // on disk (the checkpoint just loaded, or a fresh start that a restart repeats
  // exactly), so stop without saving rather than begin an epoch the walltime will cut.
  if (o.simulate_signal_at_step == 0 && global_step == 0 && global_zero) std::raise(watcher.requeue_signal());
  if (slurm::RequeueDecision decision = coordinator.poll(); decision != slurm::RequeueDecision::kContinue) {
    stop_for_signal(decision, /*save_first=*/false, start_epoch, skip_batches);
    result.global_step = global_step;
    return result;
  }
  const int accumulate = o.accumulate_grad_batches;
  const int64_t max_epochs = o.max_epochs > 0 ? o.max_epochs : std::numeric_limits<int64_t>::max();
  bool done = o.max_steps > 0 && global_step >= o.max_steps;  // a finished run resumed
  for (int64_t epoch = start_epoch; epoch < max_epochs && !done; ++epoch) {
    // The learning rate this epoch trains with (the metrics CSV reports it; the schedule
    // steps at the epoch's end, before the row is written).
    const double epoch_lr = optimizer.param_groups().front().lr();
    model->train();
    train_loader.set_epoch(epoch);
    // Resuming mid-epoch: the run starts at the first batch not yet trained on; the
    // batches before it are not read again. (A checkpoint without a data layout, from
    // an epoch with more batches, ends this epoch at once.)
    auto run = train_loader.epoch(std::min(skip_batches, train_loader.num_batches()));
    const int64_t batches = run.num_batches();
    int64_t index = std::min(skip_batches, batches), micro = 0;
    // Over the epoch (a resumed one continues its checkpoint's sum); over this step's micro-batches.
    double& loss_sum = epoch_loss_sum;
    int64_t& loss_count = epoch_loss_count;
    if (index == 0) loss_sum = 0, loss_count = 0;
    double step_loss_sum = 0;
    auto epoch_start = Clock::now();
    while (auto batch = run.next()) {
      ++index;
      // One micro-batch; DDP reduces only on the last micro-batch of a step.
      const bool last_micro = (micro + 1) % accumulate == 0 || index == batches;
      Tensor loss;
      {
        std::optional<ddp::DistributedDataParallel::NoSyncGuard> no_sync;
        if (ddp_model && !last_micro) no_sync.emplace(*ddp_model);
        {
          autograd::AutocastGuard guard(autocast_dtype, autocast);
          loss = module.training_step(*batch, ctx);
        }
        // Lightning skips a batch whose training_step returns None; here every rank must
        // take part in every step (DDP's reduction), so an empty loss is an error.
        RT_CHECK(loss.defined(), "Trainer: training_step returned an undefined Tensor (epoch ", epoch, ", batch ",
                 index - 1, "); return the batch's loss, a scalar. Skipping a batch by returning nothing (Lightning's "
                 "None) is not supported: under DDP every rank must compute every step; return a zero loss "
                 "(e.g. the loss times 0) to train nothing on it");
        Tensor scaled = scaler.scale(accumulate > 1 ? ag::div(loss, static_cast<double>(accumulate)) : loss);
        autograd::backward(scaled);
      }
      ++micro;
      double loss_value = loss.item();
      loss_sum += loss_value;
      step_loss_sum += loss_value;
      ++loss_count;
      if (!last_micro) continue;
      const double step_loss = step_loss_sum / static_cast<double>(micro);  // mean over the micro-batches
      step_loss_sum = 0;
      micro = 0;

      // The optimizer step, with unscaling and clipping first.
      std::vector<Tensor> params = model->parameters(), grads;
      for (auto& p : params) grads.push_back(autograd::grad(p));
      scaler.unscale_(grads);
      if (o.gradient_clip_val > 0) nn::clip_grad_norm_(params, o.gradient_clip_val);
      if (!scaler.step(grads, [&] { optimizer.step(); })) ++result.skipped_steps;
      scaler.update();
      optimizer.zero_grad();
      ++global_step;
      if (step_log.is_open()) {
        step_log << global_step << "," << epoch << "," << exact(step_loss) << "\n" << std::flush;
        RT_CHECK(step_log.good(), "Trainer: writing the step log '", o.step_log_csv, "' failed: ", std::strerror(errno),
                 " (disk full?)");
      }
      if (global_zero && o.progress_bar && (index % 5 == 0 || index == batches)) {
        std::printf("\repoch %lld %s %lld/%lld loss %.4f", (long long)epoch, bar(index, batches).c_str(),
                    (long long)index, (long long)batches, loss_sum / loss_count);
        std::fflush(stdout);
      }

      if (o.simulate_signal_at_step >= 0 && global_step == o.simulate_signal_at_step && global_zero)
        std::raise(watcher.requeue_signal());
      // The last step: the run is finished (saved below); a signal now needs no requeue.
      // (Every rank reaches max_steps at the same step, so none polls here.)
      if (o.max_steps > 0 && global_step >= o.max_steps) {
        done = true;
        break;
      }
      // The last step of the last epoch likewise: validation and the final save follow.
      // (Every rank has the same number of batches per epoch.)
      if (epoch + 1 == max_epochs && index == batches) break;
      // Step boundary: did a signal arrive on any rank? (collective; every rank asks)
      slurm::RequeueDecision decision = coordinator.poll();
      if (decision != slurm::RequeueDecision::kContinue) {
        stop_for_signal(decision, /*save_first=*/true, epoch, index);
        done = true;
        break;
      }
    }
    skip_batches = 0;
    if (result.stopped_early) break;
    // max_steps can end an epoch early: then it is not complete (no schedule step,
    // and a checkpoint that resumes inside it).
    const bool epoch_complete = index >= batches;
    if (epoch_complete && optimizers.scheduler) optimizers.scheduler->step();

    // ---- 7. validation, metrics, checkpoint
    std::map<std::string, double> totals;
    if (val_loader) {
      // Validation must not move the training's random streams: ranks validate different
      // numbers of batches (the exact sampler), DataParallel draws a key from the default
      // generator and from the model's own ones at every forward, and a checkpoint keeps
      // rank 0's state only, so a resumed run would differ on the other ranks.
      const GeneratorStates training_streams = GeneratorStates::take(*model);
      model->eval();
      autograd::NoGradGuard no_grad;
      if (ddp_model) broadcast_buffers_from_rank0(*group, *model);
      ctx.forward_fn = eval_forward;
      val_loader->set_epoch(epoch);
      for (auto& vb : val_loader->epoch()) {
        autograd::AutocastGuard guard(autocast_dtype, autocast);
        for (auto& [k, v] : module.validation_step(vb, ctx)) totals[k] += v;
      }
      ctx.forward_fn = train_forward;
      training_streams.restore();
      if (group) totals = allreduce_totals(*group, totals);
      result.last_validation = totals;
    }
    double seconds = std::chrono::duration<double>(Clock::now() - epoch_start).count();
    if (global_zero) {
      std::printf("\repoch %lld %s train_loss %.4f", (long long)epoch, bar(1, 1).c_str(),
                  loss_count ? loss_sum / loss_count : 0.0);
      for (auto& [k, v] : totals) std::printf(" %s %.4g", k.c_str(), v);
      std::printf(" (%.1f s)\n", seconds);
      if (!o.metrics_csv.empty()) {
        bool fresh = access(o.metrics_csv.c_str(), F_OK) != 0;
        std::ofstream csv(o.metrics_csv, std::ios::app);
        if (fresh) {
          csv << "epoch,step,train_loss,seconds,lr";
          for (auto& [k, v] : totals) csv << "," << k;
          csv << "\n";
        }
        RT_CHECK(csv.good(), "Trainer: cannot write metrics_csv '", o.metrics_csv, "': ", std::strerror(errno));
        csv << epoch << "," << global_step << "," << exact(loss_count ? loss_sum / loss_count : 0.0) << ","
            << seconds << "," << exact(epoch_lr);
        for (auto& [k, v] : totals) csv << "," << exact(v);
        csv << "\n" << std::flush;
        RT_CHECK(csv.good(), "Trainer: writing metrics_csv '", o.metrics_csv, "' failed: ", std::strerror(errno),
                 " (disk full?)");
      }
    }
    if (epoch_complete) {
      result.epochs_completed = epoch + 1;
      save(epoch + 1, 0);
    } else {
      save(epoch, index);
    }
  }
  result.global_step = global_step;
  // DDP keeps the replicas bitwise equal (same averaged gradients, same optimizer
  // step): check that it did, so that a run reporting success also reports that the
  // ranks trained one model. One allgather of a 64-bit hash.
  result.weights_fingerprint = nn::weights_fingerprint(*model);
  if (ddp_model) {
    int64_t mine = static_cast<int64_t>(result.weights_fingerprint);
    std::vector<int64_t> all(static_cast<size_t>(world));
    group->allgather({&mine, 1, DType::kInt64, Device::cpu()}, {all.data(), all.size(), DType::kInt64, Device::cpu()})
        .wait();
    std::string differing;
    for (int r = 0; r < world; ++r)
      if (all[r] != all[0]) differing += detail::concat(differing.empty() ? "" : ", ", "rank ", r);
    RT_CHECK(differing.empty(), "Trainer: after training the model replicas differ: ", differing,
             " ended with other weights than rank 0 (weights_fingerprint). DDP averages the same gradients on "
             "every rank, so something changed parameters on some ranks only (an update outside the optimizer, "
             "a rank-dependent optimizer setting) or the gradients were not averaged: compare the ranks' "
             "options, and report it if they match");
    result.replicas_compared = world;
  }
  if (group) group->barrier().wait();
  return result;
}

}  // namespace ringtrain::trainer
