// ddp_step.cc: the DDP training step, measured the way issue 5 asks.
//
// Model: 784 -> 4 x (Linear 1024 + ReLU) -> 10, cross-entropy, SGD, batch 64 per
// rank, float32, one compute thread per rank (the same MLP as bench/mlp_step).
// Run it under a launcher:   mpirun -np 2 build/bench/ddp_step
//                            build/comm/ringrun --nproc-per-node 2 build/bench/ddp_step
// What one run measures (medians over timed steps, all ranks in lock step):
//   t_local     the step without DDP (this rank's model alone)
//   t_ddp       the DDP step, buckets overlapped with backward (default caps)
//   t_no_ovl    the DDP step with every bucket launched after backward
//   t_comm      the bucket allreduces alone, back to back (no compute)
//   h           hidden fraction of communication: 1 - (t_ddp - t_local) / t_comm
//   comm_cpu    CPU time the communication thread used per DDP step (process CPU
//               time minus the training thread's). When compute keeps every core
//               busy, that time is taken from compute, so h <= 1 - comm_cpu / t_comm:
//               the bound the benchmark prints beside h.
//   sweep       t_ddp for several bucket caps, each with its own h (printed in
//               every row, and the best one last). At the default caps the last
//               bucket holds most gradients and is ready only when backward ends,
//               so h there has a ceiling on any machine (docs/ddp-benchmark.md).
// Timed in rounds: every configuration is built first; then each round runs one
// warm-up step and --steps timed steps of every configuration in turn (--rounds
// rounds), and each result is the median over all its rounds. This machine's speed
// drifts by 10% over a minute; timed in blocks, whichever configuration ran in a
// slow minute looked worse (t_local was once 27.8 ms against 23 ms in the run
// before). Interleaved, a drift moves all configurations alike.
// Correctness while timing: after the rounds, (0) t_local's model, after every step it
// ran, must have moved as a fresh model from the same weights moves in as many steps
// on the same batch, replayed alone (each parameter's change within 1e-3 of the
// largest element of the replay's change, plus two float32 ulps of the largest weight
// per step); then for each DDP configuration, (1) every
// rank's parameters must be bit-identical (a checksum per rank, compared across
// ranks), and (2) one more DDP backward must give each parameter the gradient one
// process computes on the global batch (every rank's data, rebuilt from the seeds)
// with the same weights, within 1e-4 of the largest gradient of that parameter (1e-3
// on a GPU). Identical replicas alone would pass a sum instead of an average, or a
// bucket written back to the wrong parameter on every rank. (3) t_comm's allreduces
// run on known inputs: before each timed repetition (untimed) rank r's buckets are
// filled with r + 1, and after it every element must be their average (n + 1) / 2,
// exact in floating point. Any failure is counted in #wrong and makes the program
// exit 1.
// --trace FILE writes a Chrome trace (open in https://ui.perfetto.dev) of one
// DDP step: backward's gradient-ready instants against the bucket allreduces.
// --device cuda runs the model on GPU (local rank's index modulo the GPUs there):
// each timed step ends with a device synchronize, so the times are the GPU's too;
// with the ring backend the buckets go through host staging, with nccl they stay
// on the device. On a GPU, backward's "gradient ready" instants are when the host
// queued the kernels, not when they ran.
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <limits>
#include <numeric>
#include <stdexcept>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "autograd/autograd.h"
#include "autograd/functions.h"
#include "bench/bench_cli.h"
#include "comm/init.h"
#include "ddp/distributed_data_parallel.h"
#include "ddp/timeline.h"
#include "nn/layers.h"
#include "nn/optim.h"
#include "tensor/cuda/runtime.h"
#include "tensor/kernels.h"
#include "tensor/ops.h"

using namespace ringtrain;
using Clock = std::chrono::steady_clock;

namespace {

struct Config {
  int64_t in_features = 784, width = 1024, hidden = 4, classes = 10, batch = 64;
  int warmup = 3, rounds = 5, steps = 3;  // warm-up per configuration, then rounds x steps timed
  std::vector<double> sweep_mb = {0.25, 1, 5, 25, 100};
  std::string backend = "ring";
  std::string device = "cpu";
  bool grad_as_view = false;
  std::string trace;
  std::string json_out;
};

std::shared_ptr<nn::Module> make_mlp(const Config& c, uint64_t seed) {
  Generator gen(seed);
  auto seq = nn::make<nn::Sequential>();
  int64_t in = c.in_features;
  for (int64_t i = 0; i < c.hidden; ++i) {
    seq->push_back(nn::make<nn::Linear>(in, c.width, true, gen));
    seq->push_back(nn::make<nn::ReLU>());
    in = c.width;
  }
  seq->push_back(nn::make<nn::Linear>(in, c.classes, true, gen));
  return seq;
}

using bench::median;

// CPU time of the whole process and of the calling thread (ms). Their difference
// over a step is what the other threads used: here, the communication thread.
double cpu_ms(clockid_t clock) {
  timespec ts{};
  clock_gettime(clock, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

double ms_since(Clock::time_point t) { return std::chrono::duration<double, std::milli>(Clock::now() - t).count(); }

// One step on every rank, started together after a barrier; returns the slowest
// rank's time, as a real job sees it.
template <typename Step>
double time_one_step(comm::ProcessGroup& pg, Step&& step) {
  pg.barrier().wait();
  auto t0 = Clock::now();
  step();
  double slowest = ms_since(t0);
  pg.allreduce({&slowest, 1, DType::kFloat64, Device::cpu()}, comm::ReduceOp::kMax).wait();
  return slowest;
}

// 1 when the parameters differ between ranks (they must be bit-identical).
int replicas_differ(comm::ProcessGroup& pg, nn::Module& m) {
  double checksum = 0;
  for (auto& p : m.parameters())
    for (float v : p.to_vector<float>()) checksum = checksum * 1.000001 + v;
  double lo = checksum, hi = checksum;
  pg.allreduce({&lo, 1, DType::kFloat64, Device::cpu()}, comm::ReduceOp::kMin).wait();
  pg.allreduce({&hi, 1, DType::kFloat64, Device::cpu()}, comm::ReduceOp::kMax).wait();
  return lo == hi ? 0 : 1;
}

// The number of parameters of `ddp_model` whose gradient (after a DDP backward) is not
// the gradient `reference` (same weights, one process) computes on the global batch.
int gradients_differ(nn::Module& ddp_model, nn::Module& reference, double rtol, int rank) {
  int differ = 0;
  auto mine = ddp_model.named_parameters(), ref = reference.named_parameters();
  for (size_t i = 0; i < mine.size(); ++i) {
    Tensor g = autograd::grad(mine[i].second), r = autograd::grad(ref[i].second);
    if (!g.defined() || !r.defined()) {
      ++differ;
      continue;
    }
    const double scale = amax(abs(r)).to(Device::cpu()).item();
    const double err = max_abs_diff(g, r);
    if (!(err <= rtol * scale + 1e-7)) {
      std::fprintf(stderr, "ddp_step: rank %d: the gradient of '%s' differs from the single-process gradient of "
                   "the global batch by %.3g (largest gradient %.3g)\n", rank, mine[i].first.c_str(), err, scale);
      ++differ;
    }
  }
  return differ;
}

// The number of parameters of `model` whose change since `initial` (the weights both
// started from) is not `reference`'s change, within rtol of the largest element of
// reference's change. Changes, not weights: a step is ~1e-3 of a weight, so a step
// missing from `model` would hide inside any tolerance on the weights themselves.
// Plus two float32 ulps of the parameter's largest weight per step: on a GPU, whose
// reductions may add in a different order each run, a weight plus its update can
// round differently now and then, and one ulp of a weight can be 1e-3 of its change
// (on the CPU the replay is bit-identical).
int changes_differ(nn::Module& model, nn::Module& reference, nn::Module& initial, double rtol, int steps, int rank,
                   const char* what) {
  int differ = 0;
  auto mine = model.named_parameters(), ref = reference.named_parameters(), start = initial.named_parameters();
  for (size_t i = 0; i < mine.size(); ++i) {
    const Tensor change = sub(mine[i].second, start[i].second), ref_change = sub(ref[i].second, start[i].second);
    const double scale = amax(abs(ref_change)).to(Device::cpu()).item();
    const double err = max_abs_diff(change, ref_change);
    const double ulps = 2.0 * steps * std::ldexp(amax(abs(ref[i].second)).to(Device::cpu()).item(), -23);
    if (!(err <= rtol * scale + ulps)) {
      std::fprintf(stderr, "ddp_step: rank %d: %s: the change of '%s' differs from the reference's by %.3g "
                   "(its largest element %.3g)\n", rank, what, mine[i].first.c_str(), err, scale);
      ++differ;
    }
  }
  return differ;
}

// A bucket cap in MiB that DdpOptions can take: at least one byte, at most 1 TiB.
CLI::Validator bucket_cap_mib() {
  return CLI::Validator(
      [](std::string& text) {
        double mib = 0;
        if (!CLI::detail::lexical_cast(text, mib) || !(mib * (1 << 20) >= 1 && mib <= (1 << 20)))
          return "'" + text + "' is not a bucket cap in MiB from 1 byte (1/1048576) to 1048576 (1 TiB)";
        return std::string();
      },
      "", "bucket cap");
}

// The program; main() turns its exceptions into a message and an exit code.
int run(int argc, char** argv, std::shared_ptr<comm::ProcessGroup>& pg) {
  Config c;
  constexpr int kIntMax = std::numeric_limits<int>::max();
  constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();
  CLI::App app{"DDP step benchmark: overlap, bucket sizes, hidden communication (run under mpirun/ringrun)"};
  app.add_option("--backend", c.backend, "ring, mpi or nccl")
      ->check(CLI::IsMember({"ring", "mpi", "nccl"}))
      ->capture_default_str();
  app.add_option("--device", c.device, "cpu or cuda")->check(CLI::IsMember({"cpu", "cuda"}))->capture_default_str();
  app.add_option("--in-features", c.in_features, "input features of the MLP")
      ->check(CLI::Range(int64_t{1}, kInt64Max))
      ->capture_default_str();
  app.add_option("--width", c.width, "width of each hidden layer")
      ->check(CLI::Range(int64_t{1}, kInt64Max))
      ->capture_default_str();
  app.add_option("--hidden", c.hidden, "hidden layers (Linear + ReLU); 0: one Linear to the classes")
      ->check(CLI::Range(int64_t{0}, kInt64Max))
      ->capture_default_str();
  app.add_option("--batch", c.batch, "per-rank batch")->check(CLI::Range(int64_t{1}, kInt64Max))->capture_default_str();
  app.add_option("--warmup", c.warmup, "untimed steps per configuration before the first round")
      ->check(CLI::Range(0, kIntMax))
      ->capture_default_str();
  app.add_option("--rounds", c.rounds, "rounds; each times every configuration in turn")
      ->check(CLI::Range(1, kIntMax))
      ->capture_default_str();
  app.add_option("--steps", c.steps, "timed steps per configuration per round (after one warm-up step)")
      ->check(CLI::Range(1, kIntMax))
      ->capture_default_str();
  app.add_option("--sweep-mb", c.sweep_mb, "bucket caps to sweep (MiB), one DDP configuration each")
      ->check(bucket_cap_mib())
      ->capture_default_str();
  app.add_flag("--gradient-as-bucket-view", c.grad_as_view,
               "DdpOptions::gradient_as_bucket_view: .grad stays a view of its bucket between steps (one "
               "buffer per bucket); without it, each step hands the bucket's buffer to .grad and swaps a "
               "fresh (or spare) one into the bucket. Either way backward writes the gradients into "
               "bucket memory (autograd's gradient destinations)");
  app.add_option("--trace", c.trace,
                 "write a Chrome trace of one DDP step (rank 0's view; checked before the run)");
  app.add_option("--json", c.json_out, "write the results as JSON (rank 0; checked before the run)");
  CLI11_PARSE(app, argc, argv);

  comm::InitOptions init;
  init.backend = c.backend;
  pg = comm::init_process_group(init);
  const int rank = pg->rank(), world = pg->size();
  // The output files are rank 0's; found unwritable there, every rank stops now,
  // not after the benchmark.
  std::string path_error;
  if (rank == 0) {
    if (!c.trace.empty()) path_error = bench::check_writable("--trace", c.trace);
    if (path_error.empty() && !c.json_out.empty()) path_error = bench::check_writable("--json", c.json_out);
  }
  // Said before the others learn of it: a launcher may stop rank 0 once a rank exits.
  if (!path_error.empty()) std::fprintf(stderr, "ddp_step: %s\n", path_error.c_str());
  int unwritable = path_error.empty() ? 0 : 1;
  pg->allreduce({&unwritable, 1, DType::kInt32, Device::cpu()}, comm::ReduceOp::kMax).wait();
  if (unwritable) return 2;
  // A lower bound of what this rank allocates: the batch, and weights and gradients
  // of every configuration's model (local, overlap, no overlap, the sweep).
  // (In doubles: products of large arguments must not wrap.)
  const double in = static_cast<double>(c.in_features), width = static_cast<double>(c.width);
  const double params = (in + 1) * width + static_cast<double>(std::max<int64_t>(c.hidden - 1, 0)) * (width + 1) * width +
                        ((c.hidden > 0 ? width : in) + 1) * static_cast<double>(c.classes);
  const double models = 3.0 + static_cast<double>(c.sweep_mb.size());
  if (std::string error = bench::check_fits_in_memory(
          4.0 * (2.0 * models * params + static_cast<double>(c.batch) * in),
          "the MLP (--in-features, --width, --hidden, --batch) in " + std::to_string(static_cast<int>(models)) +
              " configurations");
      !error.empty()) {
    throw std::runtime_error(error);
  }
  int wrong = 0;
  Device device = Device::cpu();
  if (c.device == "cuda") {
    if (!cuda::is_available()) {
      std::fprintf(stderr, "ddp_step: --device cuda, but no usable GPU here: %s\n", cuda::unavailable_reason());
      return 2;
    }
    device = Device::cuda(comm::local_cuda_device());
    cuda::set_device(device.index);
  }
  // A step on the GPU has only been queued when the host returns: wait for it.
  auto finish = [&] {
    if (device.is_cuda()) cuda::synchronize_device(device.index);
  };

  // Rank r's batch comes from Generator(100 + r), so any rank can rebuild the global
  // batch (every rank's rows, in rank order) for the correctness check.
  auto batch_of = [&](int r) {
    Generator gen(100 + r);
    Tensor bx = randn({c.batch, c.in_features}, gen).to(device);
    Tensor by = mul(rand({c.batch}, gen), static_cast<double>(c.classes)).to(DType::kInt64).to(device);
    return std::pair{bx, by};
  };
  auto [x, y] = batch_of(rank);

  // ---- every configuration, built up front
  // t_local: no DDP at all, this rank's model alone.
  auto local_model = make_mlp(c, 1);
  local_model->to(device);
  nn::SGD local_opt(local_model->parameters(), {.lr = 0.01});
  int local_steps = 0;  // every call, warm-up and timed: the replay below runs as many
  auto local_step = [&] {
    ++local_steps;
    local_opt.zero_grad();
    autograd::backward(ag::cross_entropy(local_model->forward(x), y));
    local_opt.step();
    finish();
  };
  std::vector<double> local_times;

  struct Row {
    std::string name;
    double cap_mb;
    bool overlap;
    std::shared_ptr<nn::Module> model;
    std::unique_ptr<ddp::DistributedDataParallel> ddp;
    std::unique_ptr<nn::SGD> opt;
    std::vector<double> times, waits, comm_cpu, comm_times;
    double t_ms = 0, comm_wait_ms = 0, t_comm = 0, comm_cpu_ms = 0;
    int64_t comm_wrong = 0;  // elements of t_comm's allreduces that were not the average
    size_t buckets = 0;
  };
  std::vector<Row> rows;
  auto add_row = [&rows](std::string name, double cap_mb, bool overlap) {
    Row& row = rows.emplace_back();
    row.name = std::move(name), row.cap_mb = cap_mb, row.overlap = overlap;
  };
  add_row("overlap", 25, true);
  add_row("no overlap", 25, false);
  for (double mb : c.sweep_mb) add_row("sweep", mb, true);
  for (Row& row : rows) {
    row.model = make_mlp(c, 1);
    row.model->to(device);
    ddp::DdpOptions options;
    options.bucket_cap_bytes = static_cast<size_t>(row.cap_mb * (1 << 20));
    options.overlap = row.overlap;
    options.gradient_as_bucket_view = c.grad_as_view;
    row.ddp = std::make_unique<ddp::DistributedDataParallel>(row.model, pg, options);
    row.opt = std::make_unique<nn::SGD>(row.model->parameters(), nn::SGDOptions{.lr = 0.01});
  }
  auto ddp_step = [&](Row& row) {
    row.opt->zero_grad();
    autograd::backward(ag::cross_entropy((*row.ddp)(x), y));
    row.opt->step();
    finish();
  };
  // t_comm: the same buckets' allreduces alone, launched back to back, on known
  // inputs: fill_buckets writes r + 1 into rank r's buckets (untimed; between steps the
  // buckets hold nothing the next step reads), and buckets_wrong counts the elements
  // that are not the average over the ranks, (n + 1) / 2.
  auto fill_buckets = [&](Row& row) {
    for (const auto& b : row.ddp->reducer().buckets()) {
      Tensor flat = b.flat;
      fill_(flat, rank + 1.0);
    }
    finish();
  };
  auto buckets_wrong = [&](Row& row) {
    int64_t wrong_elements = 0;
    for (const auto& b : row.ddp->reducer().buckets())
      wrong_elements += static_cast<int64_t>(sum(ne(b.flat, (world + 1) / 2.0).to(DType::kFloat64)).item());
    return wrong_elements;
  };
  auto comm_only = [&](Row& row) {
    std::vector<comm::Work> works;
    for (const auto& b : row.ddp->reducer().buckets())
      works.push_back(pg->allreduce({b.flat.data_ptr(), static_cast<size_t>(b.flat.numel()), b.flat.dtype(), b.flat.device()},
                                    comm::ReduceOp::kAvg));
    for (auto& w : works) w.wait();
    finish();
  };

  // ---- warm-up (includes step 1, after which DDP rebuilds its buckets), then rounds
  for (int i = 0; i < c.warmup; ++i) {
    local_step();
    for (Row& row : rows) ddp_step(row);
  }
  for (int round = 0; round < c.rounds; ++round) {
    local_step();
    for (int i = 0; i < c.steps; ++i) local_times.push_back(time_one_step(*pg, local_step));
    for (Row& row : rows) {
      ddp_step(row);
      for (int i = 0; i < c.steps; ++i) {
        double comm_cpu = 0;
        row.times.push_back(time_one_step(*pg, [&] {
          const double process0 = cpu_ms(CLOCK_PROCESS_CPUTIME_ID), thread0 = cpu_ms(CLOCK_THREAD_CPUTIME_ID);
          ddp_step(row);
          // what the communication thread used: process CPU time minus this thread's
          comm_cpu = (cpu_ms(CLOCK_PROCESS_CPUTIME_ID) - process0) - (cpu_ms(CLOCK_THREAD_CPUTIME_ID) - thread0);
        }));
        row.waits.push_back(row.ddp->last_stats().comm_wait_ms);
        row.comm_cpu.push_back(comm_cpu);
      }
      comm_only(row);
      for (int i = 0; i < c.steps; ++i) {
        fill_buckets(row);
        row.comm_times.push_back(time_one_step(*pg, [&] { comm_only(row); }));
        row.comm_wrong += buckets_wrong(row);
      }
    }
  }
  const double t_local = median(local_times);
  for (Row& row : rows) {
    row.t_ms = median(row.times);
    row.comm_wait_ms = median(row.waits);
    row.t_comm = median(row.comm_times);
    row.comm_cpu_ms = median(row.comm_cpu);  // averaged over the ranks:
    pg->allreduce({&row.comm_cpu_ms, 1, DType::kFloat64, Device::cpu()}, comm::ReduceOp::kAvg).wait();
    row.buckets = row.ddp->reducer().buckets().size();
    wrong += replicas_differ(*pg, *row.model);
    if (row.comm_wrong > 0) {
      std::fprintf(stderr, "ddp_step: rank %d: %s (cap %.2f MiB): %lld elements of the t_comm allreduces were not the "
                   "average over the ranks\n", rank, row.name.c_str(), row.cap_mb, static_cast<long long>(row.comm_wrong));
      ++wrong;
    }
  }
  {
    // t_local's result: its model after every step it ran, against a fresh model from
    // the same weights trained as many steps on the same batch alone (no DDP model
    // beside it, no barrier, no timing). A timed step that skipped its update or its
    // backward, or that anything else touched, ends elsewhere.
    auto replay = make_mlp(c, 1), initial = make_mlp(c, 1);
    replay->to(device);
    initial->to(device);
    nn::SGD replay_opt(replay->parameters(), {.lr = 0.01});
    for (int i = 0; i < local_steps; ++i) {
      replay_opt.zero_grad();
      autograd::backward(ag::cross_entropy(replay->forward(x), y));
      replay_opt.step();
    }
    finish();
    if (changes_differ(*local_model, *replay, *initial, 1e-3, local_steps, rank, "t_local's model") > 0) ++wrong;
  }
  {
    // The gradients themselves: one more DDP backward per configuration against one
    // process's backward on the global batch with the same weights.
    std::vector<Tensor> xs, ys;
    for (int r = 0; r < world; ++r) {
      auto [bx, by] = batch_of(r);
      xs.push_back(bx);
      ys.push_back(by);
    }
    const Tensor global_x = cat(xs, 0), global_y = cat(ys, 0);
    const double rtol = device.is_cuda() ? 1e-3 : 1e-4;
    for (Row& row : rows) {
      row.opt->zero_grad();
      autograd::backward(ag::cross_entropy((*row.ddp)(x), y));
      finish();
      auto reference = make_mlp(c, 2);
      reference->to(device);
      reference->load_state_dict(row.model->state_dict());
      autograd::backward(ag::cross_entropy(reference->forward(global_x), global_y));
      finish();
      wrong += gradients_differ(*row.model, *reference, rtol, rank) > 0 ? 1 : 0;
    }
  }
  pg->allreduce({&wrong, 1, DType::kInt32, Device::cpu()}, comm::ReduceOp::kMax).wait();  // rank 0 prints it
  if (!c.trace.empty()) {
    // One more step of the default configuration, recorded for the timeline.
    Row& row = rows[0];
    row.opt->zero_grad();
    auto t0 = Clock::now();
    Tensor out = (*row.ddp)(x);
    double forward_ms = ms_since(t0);
    autograd::backward(ag::cross_entropy(out, y));
    if (rank == 0) ddp::write_chrome_trace(c.trace, row.ddp->reducer(), forward_ms, rank);
  }

  if (rank == 0) {
    const Row& ovl = rows[0];
    const Row& no = rows[1];
    // The hidden fraction of one configuration. At one rank nothing is communicated
    // (t_comm is the pass-through's microseconds), so there it means nothing.
    auto has_h = [&](const Row& r) { return world > 1 && r.t_comm > 0; };
    auto hidden_fraction = [&](const Row& r) { return r.t_comm > 0 ? 1.0 - (r.t_ms - t_local) / r.t_comm : 0; };
    double h = hidden_fraction(ovl);
    double h_bound = ovl.t_comm > 0 ? 1.0 - ovl.comm_cpu_ms / ovl.t_comm : 0;
    std::printf("# DDP step: MLP %lld-%lldx%lld-%lld, batch %lld per rank, f32, %d rank(s), backend %s, %s%s%s%s\n",
                (long long)c.in_features, (long long)c.hidden, (long long)c.width, (long long)c.classes,
                (long long)c.batch, world, c.backend.c_str(), device.str().c_str(),
                c.grad_as_view ? ", gradient_as_bucket_view" : "", device.is_cpu() ? ", GEMM kernel " : "",
                device.is_cpu() ? kernels::cpu::sgemm_kernel_name() : "");
    std::printf("%-12s %9s %8s %10s %10s %10s %13s %7s\n", "config", "cap(MiB)", "buckets", "step(ms)", "t_comm(ms)",
                "wait(ms)", "comm_cpu(ms)", "h");
    std::printf("%-12s %9s %8s %10.2f %10s %10s %13s %7s\n", "local", "-", "-", t_local, "-", "-", "-", "-");
    for (const Row& r : rows) {
      char h_text[16] = "-";
      if (has_h(r)) std::snprintf(h_text, sizeof h_text, "%.2f", hidden_fraction(r));
      std::printf("%-12s %9.2f %8zu %10.2f %10.2f %10.2f %13.2f %7s\n", r.name.c_str(), r.cap_mb, r.buckets, r.t_ms,
                  r.t_comm, r.comm_wait_ms, r.comm_cpu_ms, h_text);
    }
    std::printf("overhead vs local: overlap %.1f%%, no overlap %.1f%%\n", 100.0 * (ovl.t_ms / t_local - 1),
                100.0 * (no.t_ms / t_local - 1));
    if (world > 1) {
      std::printf("hidden fraction h = 1 - (t_ddp - t_local) / t_comm = %.2f\n", h);
      // The default caps put most gradients in a bucket that is ready only when backward
      // ends, which no machine can hide; the sweep's rows show h at other caps.
      const Row* best = nullptr;
      for (const Row& r : rows)
        if (r.name == "sweep" && has_h(r) && (best == nullptr || hidden_fraction(r) > hidden_fraction(*best)))
          best = &r;
      if (best != nullptr)
        std::printf("best h over the cap sweep: %.2f at %.2f MiB (%zu buckets)\n", hidden_fraction(*best),
                    best->cap_mb, best->buckets);
      std::printf("bound with every core computing: h <= 1 - comm_cpu / t_comm = %.2f\n", h_bound);
    } else {
      std::printf("hidden fraction h: n/a (one rank communicates nothing)\n");
    }
    std::printf("# t_local's model equal to its %d steps replayed alone; replicas identical, DDP gradients equal "
                "to the global batch's and t_comm's allreduces equal to the average, every configuration: "
                "#wrong = %d\n", local_steps, wrong);
    if (!c.json_out.empty()) {
      nlohmann::json j = {{"world", world}, {"backend", c.backend}, {"device", device.str()}, {"t_local_ms", t_local},
                         {"h", world > 1 ? nlohmann::json(h) : nlohmann::json(nullptr)},
                         {"h_bound", world > 1 ? nlohmann::json(h_bound) : nlohmann::json(nullptr)},
                         {"wrong", wrong}};
      for (const Row& r : rows)
        j["rows"].push_back({{"name", r.name}, {"cap_mb", r.cap_mb}, {"buckets", r.buckets}, {"step_ms", r.t_ms},
                             {"t_comm_ms", r.t_comm}, {"comm_wait_ms", r.comm_wait_ms},
                             {"comm_cpu_ms", r.comm_cpu_ms},
                             {"h", has_h(r) ? nlohmann::json(hidden_fraction(r)) : nlohmann::json(nullptr)}});
      if (std::string error = bench::write_text_file("--json", c.json_out, j.dump(2) + "\n"); !error.empty())
        throw std::runtime_error(error);
    }
  }
  return wrong ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  // Every error after parsing ends here: printed, and the other ranks told
  // (ProcessGroup::abort) so that they fail with it instead of a timeout.
  std::shared_ptr<comm::ProcessGroup> pg;
  try {
    return run(argc, argv, pg);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ddp_step: %s\n", e.what());
    if (pg) pg->abort(e.what());
    return 2;
  }
}
