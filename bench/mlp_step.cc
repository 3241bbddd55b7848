// mlp_step.cc: one training step of an MLP, ringtrain beside PyTorch, in one run.
//
// The model (issue 3's performance target): in_features -> 4 hidden Linear+ReLU
// layers of width 1024 -> classes, cross-entropy, plain SGD, batch 64, float32,
// one thread. One step = zero_grad, forward, loss, backward, optimizer step —
// everything a training loop does except loading data.
//
// How the comparison is kept fair and checked:
//   * Both sides build the same network from the same integer-hash formula
//     (documented in bench/mlp_step_torch.py), so no weights are exchanged and
//     both start from identical float32 values.
//   * Correctness while timing: the losses of the first --check-steps steps of
//     both implementations must agree (relative 1e-4; float32 sums in different
//     orders), and so must the loss of the last step of every timed round and of
//     the phase split (both sides have run the same steps from the same start;
//     relative 1e-3 there, as rounding differences grow over the steps). A failed
//     check is counted in #wrong, the ratio is then reported as unchecked, never as
//     a speed-up, and the program exits 2. With --no-torch the reference is
//     ReferenceMlp (the same network in plain double-precision loops) instead: it
//     runs the first steps beside ours, and after all the timing replays every
//     later step (warm-up, rounds, phase split), so the timed rounds are checked
//     there too (about 0.3 s a step at the default sizes, untimed).
//   * The PyTorch script runs as a child process in --serve mode; the two take
//     turns: each round times --steps steps of ours, then asks PyTorch to time
//     the same number. Both see the same machine load; medians over rounds are
//     quoted.
//   * One thread each: ours is single-threaded by construction (Eigen GEMM,
//     no OpenMP); PyTorch gets torch.set_num_threads(1) and OMP/OPENBLAS=1.
//
// Output: a table with median and min ms/step, steps/s, the ratio ours/PyTorch
// (target <= 1.0), the loss check, and optionally a JSON file with everything.
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <limits>
#include <memory>
#include <new>
#include <string>
#include <utility>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "autograd/functions.h"
#include "bench/bench_cli.h"
#include "examples/example_cli.h"  // positive_real: the examples' --lr check (header only)
#include "nn/layers.h"
#include "nn/optim.h"
#include "tensor/kernels.h"
#include "tensor/ops.h"

#ifndef RINGTRAIN_SOURCE_DIR
#define RINGTRAIN_SOURCE_DIR "."
#endif

namespace {

using namespace ringtrain;
using json = nlohmann::json;

// ---------------------------------------------------------------- the shared formula

// MurmurHash3's 32-bit finalizer; u(key) in [0, 1).
uint32_t fmix32(uint32_t k) {
  k ^= k >> 16;
  k *= 0x85EBCA6Bu;
  k ^= k >> 13;
  k *= 0xC2B2AE35u;
  k ^= k >> 16;
  return k;
}
double u01(uint32_t key) { return static_cast<double>(fmix32(key)) / 4294967296.0; }

void fill_linear(nn::Linear& lin, int64_t fan_in, int64_t fan_out, int layer) {
  const uint32_t salt = static_cast<uint32_t>(static_cast<uint64_t>(layer) * 0x9E3779B9u);
  std::vector<float> w(static_cast<size_t>(fan_out * fan_in)), b(static_cast<size_t>(fan_out));
  const double bound = std::sqrt(6.0 / static_cast<double>(fan_in));
  for (size_t j = 0; j < w.size(); ++j) {
    w[j] = static_cast<float>((2 * u01(static_cast<uint32_t>(j) + salt) - 1) * bound);
  }
  for (size_t o = 0; o < b.size(); ++o) {
    b[o] = static_cast<float>((2 * u01(static_cast<uint32_t>(o) + salt + 0x5BD1E995u) - 1) * 0.01);
  }
  autograd::NoGradGuard no_grad;
  lin.weight().copy_(Tensor::from_vector(w, {fan_out, fan_in}));
  lin.bias().copy_(Tensor::from_vector(b, {fan_out}));
}

// ---------------------------------------------------------------- the check without PyTorch

// The same network in plain double-precision loops, nothing shared with ringtrain's
// kernels or autograd: the reference --no-torch checks our first steps' losses
// against (with PyTorch present, PyTorch's losses are the reference).
// Weights are the float32 values both implementations start from.
class ReferenceMlp {
 public:
  ReferenceMlp(std::vector<int64_t> dims, std::vector<double> x, std::vector<int64_t> y, double lr)
      : dims_(std::move(dims)), x_(std::move(x)), y_(std::move(y)), lr_(lr) {
    for (size_t l = 0; l + 1 < dims_.size(); ++l) {
      nn::Linear lin(dims_[l], dims_[l + 1]);
      fill_linear(lin, dims_[l], dims_[l + 1], static_cast<int>(l));
      std::vector<float> w = lin.weight().to_vector<float>(), b = lin.bias().to_vector<float>();
      w_.emplace_back(w.begin(), w.end());
      b_.emplace_back(b.begin(), b.end());
    }
  }

  // One SGD step on the whole batch; returns the loss before the update.
  double step() {
    const size_t layers = w_.size(), batch = y_.size();
    // Forward: acts[l] is layer l's input (batch x dims[l]); ReLU between layers.
    std::vector<std::vector<double>> acts{x_};
    for (size_t l = 0; l < layers; ++l) {
      const size_t in = dims_[l], out = dims_[l + 1];
      std::vector<double> z(batch * out);
      for (size_t n = 0; n < batch; ++n)
        for (size_t o = 0; o < out; ++o) {
          double v = b_[l][o];
          for (size_t i = 0; i < in; ++i) v += acts[l][n * in + i] * w_[l][o * in + i];
          z[n * out + o] = (l + 1 < layers) ? std::max(v, 0.0) : v;
        }
      acts.push_back(std::move(z));
    }
    // Cross-entropy (mean over the batch) and its gradient: (softmax - onehot) / batch.
    const size_t classes = dims_.back();
    std::vector<double> grad(batch * classes);
    double loss = 0;
    for (size_t n = 0; n < batch; ++n) {
      const double* z = &acts.back()[n * classes];
      const double m = *std::max_element(z, z + classes);
      double sum = 0;
      for (size_t c = 0; c < classes; ++c) sum += std::exp(z[c] - m);
      loss += m + std::log(sum) - z[y_[n]];
      for (size_t c = 0; c < classes; ++c)
        grad[n * classes + c] = (std::exp(z[c] - m) / sum - (static_cast<int64_t>(c) == y_[n])) / batch;
    }
    // Backward, last layer first: dW = dZ^T A, db = column sums of dZ, dA = dZ W
    // masked by the ReLU of the layer below; then the SGD update.
    for (size_t l = layers; l-- > 0;) {
      const size_t in = dims_[l], out = dims_[l + 1];
      std::vector<double> dw(out * in, 0.0), db(out, 0.0), da(l > 0 ? batch * in : 0, 0.0);
      for (size_t n = 0; n < batch; ++n)
        for (size_t o = 0; o < out; ++o) {
          const double g = grad[n * out + o];
          db[o] += g;
          for (size_t i = 0; i < in; ++i) dw[o * in + i] += g * acts[l][n * in + i];
          if (l > 0)
            for (size_t i = 0; i < in; ++i) da[n * in + i] += g * w_[l][o * in + i];
        }
      if (l > 0)
        for (size_t k = 0; k < da.size(); ++k)
          if (acts[l][k] <= 0) da[k] = 0;  // ReLU: no gradient where the output was 0
      for (size_t k = 0; k < dw.size(); ++k) w_[l][k] -= lr_ * dw[k];
      for (size_t o = 0; o < out; ++o) b_[l][o] -= lr_ * db[o];
      grad = std::move(da);
    }
    return loss / static_cast<double>(batch);
  }

 private:
  std::vector<int64_t> dims_;
  std::vector<double> x_;
  std::vector<int64_t> y_;
  double lr_;
  std::vector<std::vector<double>> w_, b_;
};

// ---------------------------------------------------------------- the PyTorch child process

// The python script, running in --serve mode, with a pipe each way. RAII: the
// destructor says quit, closes the pipes and reaps the child. A child that ended
// early (no torch in that python, a wrong --python) is an error naming its exit
// status, not a silent SIGPIPE of ours: main() ignores SIGPIPE, so a write to the
// dead child fails with EPIPE and the missing answer is what reports it.
class TorchProcess {
 public:
  explicit TorchProcess(const std::vector<std::string>& argv) : command_(argv.at(0) + " " + argv.at(1)) {
    int to_child[2], from_child[2];
    if (pipe(to_child) != 0 || pipe(from_child) != 0) throw std::runtime_error("pipe() failed");
    pid_ = fork();
    if (pid_ < 0) throw std::runtime_error("fork() failed");
    if (pid_ == 0) {
      dup2(to_child[0], 0);
      dup2(from_child[1], 1);
      close(to_child[1]);
      close(from_child[0]);
      setenv("OMP_NUM_THREADS", "1", 1);
      setenv("OPENBLAS_NUM_THREADS", "1", 1);
      std::vector<char*> args;
      for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
      args.push_back(nullptr);
      execvp(args[0], args.data());
      std::fprintf(stderr, "mlp_step: cannot exec %s: %s\n", args[0], std::strerror(errno));
      _exit(127);
    }
    close(to_child[0]);
    close(from_child[1]);
    out_ = fdopen(to_child[1], "w");
    in_ = fdopen(from_child[0], "r");
  }
  ~TorchProcess() {
    if (out_) {
      std::fputs("quit\n", out_);
      std::fclose(out_);
    }
    if (in_) std::fclose(in_);
    if (pid_ > 0) waitpid(pid_, nullptr, 0);
  }
  TorchProcess(const TorchProcess&) = delete;
  TorchProcess& operator=(const TorchProcess&) = delete;

  json read_line() {
    std::string line;
    int c;
    while ((c = std::fgetc(in_)) != EOF && c != '\n') line.push_back(static_cast<char>(c));
    if (line.empty()) {
      throw std::runtime_error("the PyTorch side (" + command_ + ") ended without an answer: " + reap() +
                               " (its stderr is above); it needs a python with torch (Debian: apt-get install "
                               "python3-torch; --python names another), or run with --no-torch for ours alone");
    }
    return json::parse(line);
  }
  // After its stdout closed: closes its stdin (the script stops reading there), waits
  // for the child and says how it ended.
  std::string reap() {
    if (out_) {
      std::fclose(out_);  // may fail with EPIPE: the child is gone, which is the point
      out_ = nullptr;
    }
    int status = 0;
    const pid_t pid = pid_;
    pid_ = -1;
    if (pid <= 0 || waitpid(pid, &status, 0) != pid) return "its exit status is unknown";
    if (WIFEXITED(status)) {
      return "it exited with status " + std::to_string(WEXITSTATUS(status)) +
             (WEXITSTATUS(status) == 127 ? " (could not start it)" : "");
    }
    if (WIFSIGNALED(status)) return "it was killed by signal " + std::to_string(WTERMSIG(status));
    return "it stopped";
  }
  json phases(int steps) {
    std::fprintf(out_, "phases %d\n", steps);
    std::fflush(out_);
    return read_line();
  }
  // {ms per step, the last step's loss}
  std::pair<double, double> time_steps(int steps) {
    std::fprintf(out_, "time %d\n", steps);
    std::fflush(out_);
    json reply = read_line();
    return {reply.at("ms_per_step").get<double>(), reply.at("loss").get<double>()};
  }

 private:
  std::string command_;  // python and script, for messages
  pid_t pid_ = -1;
  FILE* out_ = nullptr;
  FILE* in_ = nullptr;
};

// `value` as a decimal that reads back exactly (std::to_string prints 6 decimals:
// --lr 1e-7 reached PyTorch as 0.000000).
std::string exact_decimal(double value) {
  char text[32];
  std::snprintf(text, sizeof text, "%.17g", value);
  return text;
}

using bench::median;

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"MLP training step: ringtrain vs PyTorch (one thread, same model, same run)"};
  int64_t in_features = 784, width = 1024, hidden = 4, classes = 10, batch = 64;
  double lr = 0.01;
  int warmup = 5, steps = 10, rounds = 7, check_steps = 5;
  bool no_torch = false;
  std::string python = "/usr/bin/python3";
  std::string script = std::string(RINGTRAIN_SOURCE_DIR) + "/bench/mlp_step_torch.py";
  std::string json_out;
  constexpr int kIntMax = std::numeric_limits<int>::max();
  constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();
  app.add_option("--in-features", in_features, "input width")
      ->check(CLI::Range(int64_t{1}, kInt64Max))
      ->capture_default_str();
  app.add_option("--width", width, "hidden width")->check(CLI::Range(int64_t{1}, kInt64Max))->capture_default_str();
  app.add_option("--hidden", hidden, "number of hidden layers (0: one Linear to the classes)")
      ->check(CLI::Range(int64_t{0}, kInt64Max))
      ->capture_default_str();
  app.add_option("--classes", classes, "output classes")->check(CLI::Range(int64_t{1}, kInt64Max))->capture_default_str();
  app.add_option("--batch", batch, "batch size")->check(CLI::Range(int64_t{1}, kInt64Max))->capture_default_str();
  app.add_option("--lr", lr, "SGD learning rate")->check(examples::positive_real())->capture_default_str();
  app.add_option("--warmup", warmup, "untimed steps before timing")->check(CLI::Range(0, kIntMax))->capture_default_str();
  app.add_option("--steps", steps, "steps per timed round")->check(CLI::Range(1, kIntMax))->capture_default_str();
  app.add_option("--rounds", rounds, "timed rounds (ours, then PyTorch, alternating)")
      ->check(CLI::Range(1, kIntMax))
      ->capture_default_str();
  app.add_option("--check-steps", check_steps, "steps whose losses are compared")
      ->check(CLI::Range(1, kIntMax))
      ->capture_default_str();
  app.add_flag("--no-torch", no_torch,
               "time ringtrain only; every step's loss is then checked against the double-precision reference, "
               "which replays the steps after the timing (about 0.3 s a step at the default sizes)");
  app.add_option("--python", python, "python with torch (Debian's python3-torch)")->capture_default_str();
  app.add_option("--torch-script", script, "the PyTorch side")->capture_default_str();
  app.add_option("--json", json_out, "also write the results here as JSON (checked before the run)");
  CLI11_PARSE(app, argc, argv);
  // A write to a PyTorch child that has died fails (EPIPE) instead of killing us
  // silently; TorchProcess then says how the child ended.
  std::signal(SIGPIPE, SIG_IGN);

  try {
    if (!json_out.empty()) {
      if (std::string error = bench::check_writable("--json", json_out); !error.empty()) {
        std::fprintf(stderr, "mlp_step: %s\n", error.c_str());
        return 1;
      }
    }
    // A lower bound of what the model allocates: the batch, the weights and their gradients.
    // (In doubles: products of large arguments must not wrap.)
    const double in = static_cast<double>(in_features), wide = static_cast<double>(width);
    const double params = (in + 1) * wide + static_cast<double>(std::max<int64_t>(hidden - 1, 0)) * (wide + 1) * wide +
                          ((hidden > 0 ? wide : in) + 1) * static_cast<double>(classes);
    if (std::string error = bench::check_fits_in_memory(
            4.0 * (2.0 * params + static_cast<double>(batch) * in),
            "the MLP (--in-features, --width, --hidden, --classes, --batch)");
        !error.empty()) {
      std::fprintf(stderr, "mlp_step: %s\n", error.c_str());
      return 1;
    }
    // ---- ours
    std::vector<int64_t> dims = {in_features};
    for (int64_t h = 0; h < hidden; ++h) dims.push_back(width);
    dims.push_back(classes);
    auto model = std::make_shared<nn::Sequential>();
    std::vector<std::shared_ptr<nn::Linear>> linears;
    for (size_t l = 0; l + 1 < dims.size(); ++l) {
      auto lin = nn::make<nn::Linear>(dims[l], dims[l + 1]);
      fill_linear(*lin, dims[l], dims[l + 1], static_cast<int>(l));
      model->push_back(lin);
      if (l + 2 < dims.size()) model->push_back(nn::make<nn::ReLU>());
    }
    std::vector<float> xv(static_cast<size_t>(batch * in_features));
    for (size_t j = 0; j < xv.size(); ++j) xv[j] = static_cast<float>(2 * u01(static_cast<uint32_t>(j) + 0x27D4EB2Fu) - 1);
    Tensor x = Tensor::from_vector(xv, {batch, in_features});
    std::vector<int64_t> yv(static_cast<size_t>(batch));
    for (int64_t n = 0; n < batch; ++n) yv[n] = n % classes;
    Tensor y = Tensor::from_vector(yv, {batch});
    nn::SGD opt(model->parameters(), {.lr = lr});

    auto step = [&] {
      opt.zero_grad();
      Tensor loss = ag::cross_entropy((*model)(x), y);
      autograd::backward(loss);
      opt.step();
      return loss;
    };
    // ms per step over k steps; the last step's loss into *last_loss.
    auto time_ours = [&](int k, double* last_loss = nullptr) {
      auto t0 = std::chrono::steady_clock::now();
      Tensor loss;
      for (int i = 0; i < k; ++i) loss = step();
      const double value = loss.item();
      if (last_loss != nullptr) *last_loss = value;
      return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / k;
    };

    // Where one step's time goes: forward+loss, backward, zero_grad+optimizer step; and
    // the last step's loss, checked like a round's.
    auto phases_ours = [&](int k) {
      using clock = std::chrono::steady_clock;
      auto ms = [](clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); };
      double fwd = 0, bwd = 0, upd = 0;
      Tensor loss;
      for (int i = 0; i < k; ++i) {
        auto t0 = clock::now();
        opt.zero_grad();
        auto t1 = clock::now();
        loss = ag::cross_entropy((*model)(x), y);
        auto t2 = clock::now();
        autograd::backward(loss);
        auto t3 = clock::now();
        opt.step();
        auto t4 = clock::now();
        fwd += ms(t2 - t1);
        bwd += ms(t3 - t2);
        upd += ms(t1 - t0) + ms(t4 - t3);
      }
      return json{{"forward_ms", fwd / k}, {"backward_ms", bwd / k}, {"optimizer_ms", upd / k}, {"loss", loss.item()}};
    };

    std::vector<double> our_losses;
    for (int i = 0; i < check_steps; ++i) our_losses.push_back(step().item());

    // ---- PyTorch, started now so that its setup overlaps nothing we time
    std::unique_ptr<TorchProcess> torch;
    json torch_info;
    if (!no_torch) {
      torch = std::make_unique<TorchProcess>(std::vector<std::string>{
          python, script, "--serve", "--in-features", std::to_string(in_features), "--width",
          std::to_string(width), "--hidden", std::to_string(hidden), "--classes", std::to_string(classes),
          "--batch", std::to_string(batch), "--lr", exact_decimal(lr), "--check-steps",
          std::to_string(check_steps)});
      torch_info = torch->read_line();
    }

    // ---- correctness: the same losses, step by step (PyTorch's, or without it the
    // double-precision reference's; both relative 1e-4)
    int wrong = 0;
    double max_rel = 0;
    // Without PyTorch, the reference lives on: after the timing it replays every later
    // step, to check the timed rounds' losses too.
    std::unique_ptr<ReferenceMlp> reference;
    if (!torch) reference = std::make_unique<ReferenceMlp>(dims, std::vector<double>(xv.begin(), xv.end()), yv, lr);
    {
      std::vector<double> tl;
      if (torch) {
        tl = torch_info.at("losses").get<std::vector<double>>();
      } else {
        for (int i = 0; i < check_steps; ++i) tl.push_back(reference->step());
      }
      for (int i = 0; i < check_steps; ++i) {
        double rel = std::abs(our_losses[i] - tl.at(i)) / std::max(1e-12, std::abs(tl[i]));
        max_rel = std::max(max_rel, rel);
        if (!(rel <= 1e-4)) ++wrong;
      }
    }

    // ---- timing, taking turns
    if (warmup > 0) {
      time_ours(warmup);
      if (torch) (void)torch->time_steps(warmup);
    }
    // The loss at the end of each timed round (and of the phase split below) against
    // the reference's after as many steps: PyTorch's, answered with its times, or
    // without it the double-precision replay after all the timing.
    std::vector<double> ours_ms, torch_ms, round_losses, reference_round_losses;
    int rounds_wrong = 0;
    double round_max_rel = 0;
    auto check_round = [&](double ours, double reference_loss) {
      const double rel = std::abs(ours - reference_loss) / std::max(1e-12, std::abs(reference_loss));
      round_max_rel = std::max(round_max_rel, rel);
      if (!(rel <= 1e-3)) ++rounds_wrong;
    };
    for (int r = 0; r < rounds; ++r) {
      double our_loss = 0;
      ours_ms.push_back(time_ours(steps, &our_loss));
      round_losses.push_back(our_loss);
      if (torch) {
        auto [ms, torch_loss] = torch->time_steps(steps);
        torch_ms.push_back(ms);
        reference_round_losses.push_back(torch_loss);
      }
    }

    // One phase split each, after the timed rounds (its times informational: the ratio
    // uses the rounds; its last loss checked as a round's).
    json our_phases = phases_ours(steps);
    json torch_phases = torch ? torch->phases(steps) : json();
    round_losses.push_back(our_phases.at("loss").get<double>());
    if (torch) {
      reference_round_losses.push_back(torch_phases.at("loss").get<double>());
    } else {
      for (int i = 0; i < warmup; ++i) reference->step();
      for (int r = 0; r <= rounds; ++r) {  // the rounds, then the phase split
        double loss = 0;
        for (int i = 0; i < steps; ++i) loss = reference->step();
        reference_round_losses.push_back(loss);
      }
    }
    for (size_t r = 0; r < round_losses.size(); ++r) check_round(round_losses[r], reference_round_losses.at(r));
    wrong += rounds_wrong;

    // Forward and the weight-gradient GEMM for every layer, the input-gradient GEMM for
    // every layer but the first (its input needs no gradient, so neither side computes it).
    const double flops = [&] {
      double f = 0;
      for (size_t l = 0; l + 1 < dims.size(); ++l) f += (l == 0 ? 2.0 : 3.0) * 2.0 * batch * dims[l] * dims[l + 1];
      return f;
    }();
    double om = median(ours_ms), omin = *std::min_element(ours_ms.begin(), ours_ms.end());
    std::printf("MLP step: %lld -> %lld x %lld -> %lld, batch %lld, float32, SGD lr %g, one thread; "
                "%d rounds x %d steps, median quoted; our GEMM kernel: %s\n",
                static_cast<long long>(in_features), static_cast<long long>(hidden),
                static_cast<long long>(width), static_cast<long long>(classes), static_cast<long long>(batch),
                lr, rounds, steps, kernels::cpu::sgemm_kernel_name());
    std::printf("%-10s %14s %11s %9s %9s %8s\n", "impl", "median ms/step", "min ms", "GFLOP/s", "ratio", "#wrong");
    std::printf("%-10s %14.3f %11.3f %9.1f %9s %8d\n", "ringtrain", om, omin, flops / om * 1e-6, "", wrong);
    auto print_phases = [](const char* who, const json& p) {
      std::printf("  %-9s forward+loss %7.3f ms  backward %7.3f ms  zero_grad+step %7.3f ms\n", who,
                  p.value("forward_ms", 0.0), p.value("backward_ms", 0.0), p.value("optimizer_ms", 0.0));
    };
    json result = {{"ours_ms", ours_ms}, {"ours_median_ms", om}, {"our_losses", our_losses},
                   {"our_phases", our_phases}, {"loss_max_rel_diff", max_rel}, {"wrong", wrong},
                   {"our_round_losses", round_losses}, {"reference_round_losses", reference_round_losses},
                   {"round_loss_max_rel_diff", round_max_rel},
                   {"loss_reference", torch ? "pytorch" : "double-precision loops"}};
    if (!torch) {
      std::printf("loss check against a double-precision reference (plain loops), every step replayed: max "
                  "relative difference %.2e over the first %d steps, %.2e at the end of each of %d timed rounds "
                  "and of the phase split, %d wrong\n", max_rel, check_steps, round_max_rel, rounds, wrong);
      std::printf("phases (%d steps, after the rounds):\n", steps);
      print_phases("ringtrain", our_phases);
    }
    if (torch) {
      double tm = median(torch_ms), tmin = *std::min_element(torch_ms.begin(), torch_ms.end());
      std::printf("%-10s %14.3f %11.3f %9.1f %9s %8s\n", "pytorch", tm, tmin, flops / tm * 1e-6, "", "");
      std::printf("ratio ringtrain/pytorch (median): %.3f  (target <= 1.0: %s)\n", om / tm,
                  wrong > 0 ? "UNCHECKED: the losses differ, see below" : om / tm <= 1.0 ? "met" : "NOT met");
      std::printf("loss check over %d steps and %d timed rounds: max relative difference %.2e (first steps), "
                  "%.2e (end of each round and of the phase split), %d wrong\n",
                  check_steps, rounds, max_rel, round_max_rel, wrong);
      std::printf("pytorch %s, BLAS: %s\n", torch_info.value("version", "?").c_str(),
                  torch_info.value("blas", "?").c_str());
      std::printf("phases (%d steps each, after the rounds):\n", steps);
      print_phases("ringtrain", our_phases);
      print_phases("pytorch", torch_phases);
      result["torch_phases"] = torch_phases;
      result["torch_ms"] = torch_ms;
      result["torch_median_ms"] = tm;
      result["ratio"] = om / tm;
      result["torch"] = torch_info;
    }
    if (!json_out.empty()) {
      if (std::string error = bench::write_text_file("--json", json_out, result.dump(2) + "\n"); !error.empty()) {
        std::fprintf(stderr, "mlp_step: %s\n", error.c_str());
        return 1;
      }
    }
    return wrong == 0 ? 0 : 2;
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "mlp_step: out of memory for this MLP; make --in-features, --width, --hidden, "
                         "--classes or --batch smaller\n");
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "mlp_step: %s\n", e.what());
    return 1;
  }
}
