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
//   sweep       t_ddp for several bucket caps
// Correctness while timing: after each DDP configuration every rank's parameters
// must be bit-identical (a checksum per rank, compared across ranks); any
// difference is counted in #wrong and makes the program exit 1.
// --trace FILE writes a Chrome trace (open in https://ui.perfetto.dev) of one
// DDP step: backward's gradient-ready instants against the bucket allreduces.
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <numeric>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "autograd/autograd.h"
#include "autograd/functions.h"
#include "comm/init.h"
#include "ddp/distributed_data_parallel.h"
#include "ddp/timeline.h"
#include "nn/layers.h"
#include "nn/optim.h"
#include "tensor/ops.h"

using namespace ringtrain;
using Clock = std::chrono::steady_clock;

namespace {

struct Config {
  int64_t in_features = 784, width = 1024, hidden = 4, classes = 10, batch = 64;
  int warmup = 3, steps = 15;
  std::vector<double> sweep_mb = {0.25, 1, 5, 25, 100};
  std::string backend = "ring";
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

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// CPU time of the whole process and of the calling thread (ms). Their difference
// over a step is what the other threads used: here, the communication thread.
double cpu_ms(clockid_t clock) {
  timespec ts{};
  clock_gettime(clock, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

double ms_since(Clock::time_point t) { return std::chrono::duration<double, std::milli>(Clock::now() - t).count(); }

// Times `step` (warm-up first); all ranks start each step together so the
// median is the step time of the slowest rank, as a real job sees it.
template <typename Step>
double time_steps(comm::ProcessGroup& pg, const Config& c, Step&& step) {
  for (int i = 0; i < c.warmup; ++i) step();
  std::vector<double> times;
  for (int i = 0; i < c.steps; ++i) {
    pg.barrier().wait();
    auto t0 = Clock::now();
    step();
    double local = ms_since(t0);
    double slowest = local;
    pg.allreduce({&slowest, 1, DType::kFloat64, Device::cpu()}, comm::ReduceOp::kMax).wait();
    times.push_back(slowest);
  }
  return median(times);
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

}  // namespace

int main(int argc, char** argv) {
  Config c;
  CLI::App app{"DDP step benchmark: overlap, bucket sizes, hidden communication (run under mpirun/ringrun)"};
  app.add_option("--backend", c.backend, "ring or mpi")->capture_default_str();
  app.add_option("--in-features", c.in_features)->capture_default_str();
  app.add_option("--width", c.width)->capture_default_str();
  app.add_option("--hidden", c.hidden)->capture_default_str();
  app.add_option("--batch", c.batch, "per-rank batch")->capture_default_str();
  app.add_option("--warmup", c.warmup)->capture_default_str();
  app.add_option("--steps", c.steps, "timed steps per configuration")->capture_default_str();
  app.add_option("--sweep-mb", c.sweep_mb, "bucket caps to sweep (MiB)");
  app.add_flag("--gradient-as-bucket-view", c.grad_as_view,
               "DdpOptions::gradient_as_bucket_view (no copy of gradients into buckets)");
  app.add_option("--trace", c.trace, "write a Chrome trace of one DDP step (rank 0's view)");
  app.add_option("--json", c.json_out, "write the results as JSON (rank 0)");
  CLI11_PARSE(app, argc, argv);

  comm::InitOptions init;
  init.backend = c.backend;
  auto pg = comm::init_process_group(init);
  const int rank = pg->rank(), world = pg->size();
  int wrong = 0;

  Generator data_gen(100 + rank);
  Tensor x = randn({c.batch, c.in_features}, data_gen);
  Tensor y = mul(rand({c.batch}, data_gen), static_cast<double>(c.classes)).to(DType::kInt64);

  // ---- t_local: no DDP at all
  auto local_model = make_mlp(c, 1);
  nn::SGD local_opt(local_model->parameters(), {.lr = 0.01});
  double t_local = time_steps(*pg, c, [&] {
    local_opt.zero_grad();
    autograd::backward(ag::cross_entropy(local_model->forward(x), y));
    local_opt.step();
  });

  // ---- DDP configurations
  struct Row {
    std::string name;
    double cap_mb;
    bool overlap;
    double t_ms = 0, comm_wait_ms = 0, t_comm = 0, comm_cpu_ms = 0;
    size_t buckets = 0;
  };
  auto run_ddp = [&](Row& row) {
    auto model = make_mlp(c, 1);
    ddp::DdpOptions options;
    options.bucket_cap_bytes = static_cast<size_t>(row.cap_mb * (1 << 20));
    options.overlap = row.overlap;
    options.gradient_as_bucket_view = c.grad_as_view;
    ddp::DistributedDataParallel ddp(model, pg, options);
    nn::SGD opt(model->parameters(), {.lr = 0.01});
    std::vector<double> waits, comm_cpu;
    row.t_ms = time_steps(*pg, c, [&] {
      const double process0 = cpu_ms(CLOCK_PROCESS_CPUTIME_ID), thread0 = cpu_ms(CLOCK_THREAD_CPUTIME_ID);
      opt.zero_grad();
      autograd::backward(ag::cross_entropy(ddp(x), y));
      opt.step();
      waits.push_back(ddp.last_stats().comm_wait_ms);
      comm_cpu.push_back((cpu_ms(CLOCK_PROCESS_CPUTIME_ID) - process0) - (cpu_ms(CLOCK_THREAD_CPUTIME_ID) - thread0));
    });
    row.comm_wait_ms = median(waits);
    row.comm_cpu_ms = median(comm_cpu);  // averaged over the ranks:
    pg->allreduce({&row.comm_cpu_ms, 1, DType::kFloat64, Device::cpu()}, comm::ReduceOp::kAvg).wait();
    row.buckets = ddp.reducer().buckets().size();
    // t_comm: the same buckets' allreduces alone, launched back to back.
    row.t_comm = time_steps(*pg, c, [&] {
      std::vector<comm::Work> works;
      for (const auto& b : ddp.reducer().buckets())
        works.push_back(pg->allreduce({b.flat.data_ptr(), static_cast<size_t>(b.flat.numel()), b.flat.dtype(), b.flat.device()},
                                      comm::ReduceOp::kAvg));
      for (auto& w : works) w.wait();
    });
    wrong += replicas_differ(*pg, *model);
    if (!c.trace.empty() && row.name == "overlap") {
      // One more step, recorded for the timeline.
      opt.zero_grad();
      auto t0 = Clock::now();
      Tensor out = ddp(x);
      double forward_ms = ms_since(t0);
      autograd::backward(ag::cross_entropy(out, y));
      if (rank == 0) ddp::write_chrome_trace(c.trace, ddp.reducer(), forward_ms, rank);
    }
  };

  std::vector<Row> rows = {{"overlap", 25, true}, {"no overlap", 25, false}};
  for (double mb : c.sweep_mb) rows.push_back({"sweep", mb, true});
  for (Row& row : rows) run_ddp(row);

  if (rank == 0) {
    const Row& ovl = rows[0];
    const Row& no = rows[1];
    double h = ovl.t_comm > 0 ? 1.0 - (ovl.t_ms - t_local) / ovl.t_comm : 0;
    double h_bound = ovl.t_comm > 0 ? 1.0 - ovl.comm_cpu_ms / ovl.t_comm : 0;
    std::printf("# DDP step: MLP %lld-%lldx%lld-%lld, batch %lld per rank, f32, %d rank(s), backend %s%s\n",
                (long long)c.in_features, (long long)c.hidden, (long long)c.width, (long long)c.classes,
                (long long)c.batch, world, c.backend.c_str(), c.grad_as_view ? ", gradient_as_bucket_view" : "");
    std::printf("%-12s %9s %8s %10s %10s %10s %13s\n", "config", "cap(MiB)", "buckets", "step(ms)", "t_comm(ms)",
                "wait(ms)", "comm_cpu(ms)");
    std::printf("%-12s %9s %8s %10.2f %10s %10s %13s\n", "local", "-", "-", t_local, "-", "-", "-");
    for (const Row& r : rows)
      std::printf("%-12s %9.2f %8zu %10.2f %10.2f %10.2f %13.2f\n", r.name.c_str(), r.cap_mb, r.buckets, r.t_ms,
                  r.t_comm, r.comm_wait_ms, r.comm_cpu_ms);
    std::printf("overhead vs local: overlap %.1f%%, no overlap %.1f%%\n", 100.0 * (ovl.t_ms / t_local - 1),
                100.0 * (no.t_ms / t_local - 1));
    std::printf("hidden fraction h = 1 - (t_ddp - t_local) / t_comm = %.2f\n", h);
    std::printf("bound with every core computing: h <= 1 - comm_cpu / t_comm = %.2f\n", h_bound);
    std::printf("# replicas identical after every configuration: #wrong = %d\n", wrong);
    if (!c.json_out.empty()) {
      nlohmann::json j = {{"world", world}, {"backend", c.backend}, {"t_local_ms", t_local}, {"h", h},
                         {"h_bound", h_bound}, {"wrong", wrong}};
      for (const Row& r : rows)
        j["rows"].push_back({{"name", r.name}, {"cap_mb", r.cap_mb}, {"buckets", r.buckets}, {"step_ms", r.t_ms},
                             {"t_comm_ms", r.t_comm}, {"comm_wait_ms", r.comm_wait_ms},
                             {"comm_cpu_ms", r.comm_cpu_ms}});
      std::ofstream(c.json_out) << j.dump(2) << "\n";
    }
  }
  int any_wrong = wrong;
  pg->allreduce({&any_wrong, 1, DType::kInt32, Device::cpu()}, comm::ReduceOp::kMax).wait();
  return any_wrong ? 1 : 0;
}
