// tensor_ops.cc: CPU kernel benchmarks of the tensor library, each figure read as
// a fraction of this machine's ceiling measured in the same run.
//
//   bench_tensor_ops                 # full sizes, 5 repetitions, medians + ratio table
//   bench_tensor_ops --smoke         # tiny sizes, 1 repetition (the bench-smoke ctest)
//   (Google Benchmark's --benchmark_* flags are passed through. The program sets its own
//   repetitions, minimum time and warm-up per benchmark, and those would override the
//   flags, so it sets each only where its flag was not given; the console table is its
//   own, so --benchmark_format other than console is refused: --benchmark_out=FILE
//   --benchmark_out_format=json writes JSON beside it.)
//
// Ceilings:  memcpy bandwidth (bytes read + written per second, the STREAM
//            convention, so a copy of N bytes moves 2N), and Debian's OpenBLAS
//            SGEMM pinned to one thread (openblas_set_num_threads(1)) on the same
//            shapes as our GEMM. Everything is single-threaded: Eigen is built
//            without OpenMP, and data-parallel training runs one rank per core.
// Figures:   GEMM GFLOP/s (2 m n k per product) through ringtrain::matmul;
//            elementwise add/mul/relu/exp and reductions in GB/s (bytes read +
//            written). "kernel" rows call kernels::cpu::* with preallocated
//            outputs, exactly as memcpy is measured; "op" rows go through ops.h
//            (validation + a fresh output allocation per call, page faults included).
// Checking:  every timed result is compared afterwards with an independent
//            computation (OpenBLAS for GEMM, a float64 loop otherwise); the
//            counter `wrong` is the number of elements out of tolerance, and the
//            program exits 1 if any benchmark had a wrong element.
#include <unistd.h>

#include <benchmark/benchmark.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#ifdef RINGTRAIN_HAVE_OPENBLAS
#include <cblas.h>
#endif

#include "tensor/kernels.h"
#include "tensor/ops.h"

namespace {

using ringtrain::DType;
using ringtrain::Generator;
using ringtrain::Tensor;
namespace kcpu = ringtrain::kernels::cpu;
using ringtrain::kernels::BinaryOp;
using ringtrain::kernels::ReduceOp;
using ringtrain::kernels::UnaryOp;

bool g_smoke = false;
int64_t g_total_wrong = 0;

int64_t elementwise_n() { return g_smoke ? (1 << 12) : (1 << 24); }  // 64 MiB of f32 per tensor
std::vector<int64_t> gemm_sizes() {
  if (g_smoke) return {32, 64};
  return {256, 512, 1024};
}

Tensor rand_f32(const ringtrain::Shape& shape, uint64_t seed, double lo = -1.0, double hi = 1.0) {
  Generator gen(seed);
  Tensor t = Tensor::empty(shape, DType::kFloat32);
  ringtrain::uniform_(t, lo, hi, gen);
  return t;
}

void record_wrong(benchmark::State& state, int64_t wrong) {
  state.counters["wrong"] = static_cast<double>(wrong);
  g_total_wrong += wrong;
}

void set_bytes(benchmark::State& state, double bytes_per_iter) {
  state.counters["GB"] = benchmark::Counter(bytes_per_iter * static_cast<double>(state.iterations()) / 1e9,
                                              benchmark::Counter::kIsRate);
}

// ---------------------------------------------------------------- ceilings

void BM_Memcpy(benchmark::State& state) {
  const int64_t n = elementwise_n();
  Tensor src = rand_f32({n}, 1);
  Tensor dst = Tensor::empty({n}, DType::kFloat32);
  std::memcpy(dst.data_ptr(), src.data_ptr(), src.nbytes());  // warm-up: fault pages in
  for (auto _ : state) {
    std::memcpy(dst.data_ptr(), src.data_ptr(), src.nbytes());
    benchmark::ClobberMemory();
  }
  set_bytes(state, 2.0 * static_cast<double>(src.nbytes()));
  record_wrong(state, std::memcmp(dst.data_ptr(), src.data_ptr(), src.nbytes()) == 0 ? 0 : n);
}

#ifdef RINGTRAIN_HAVE_OPENBLAS
void BM_OpenBlasSgemm(benchmark::State& state) {
  const int64_t n = state.range(0);
  Tensor a = rand_f32({n, n}, 2), b = rand_f32({n, n}, 3);
  Tensor c = Tensor::empty({n, n}, DType::kFloat32);
  auto run = [&] {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(n), static_cast<int>(n),
                static_cast<int>(n), 1.0f, a.data<float>(), static_cast<int>(n), b.data<float>(),
                static_cast<int>(n), 0.0f, c.data<float>(), static_cast<int>(n));
  };
  run();  // warm-up
  for (auto _ : state) {
    run();
    benchmark::ClobberMemory();
  }
  state.counters["GFLOP"] = benchmark::Counter(2.0 * n * n * n * static_cast<double>(state.iterations()) / 1e9,
                                                 benchmark::Counter::kIsRate);
  // Check a sample of entries against a float64 dot product.
  const float* A = a.data<float>();
  const float* B = b.data<float>();
  const float* C = c.data<float>();
  int64_t wrong = 0;
  for (int64_t s = 0; s < 64; ++s) {
    const int64_t i = (s * 7919) % n, j = (s * 104729) % n;
    double ref = 0;
    for (int64_t k = 0; k < n; ++k) ref += static_cast<double>(A[i * n + k]) * B[k * n + j];
    wrong += std::fabs(C[i * n + j] - ref) > 1e-4 * n;
  }
  record_wrong(state, wrong);
}
#endif

// ---------------------------------------------------------------- GEMM

void BM_RingtrainMatmul(benchmark::State& state) {
  const int64_t n = state.range(0);
  Tensor a = rand_f32({n, n}, 2), b = rand_f32({n, n}, 3);
  Tensor c = ringtrain::matmul(a, b);  // warm-up
  for (auto _ : state) {
    c = ringtrain::matmul(a, b);
    benchmark::DoNotOptimize(c.data_ptr());
  }
  state.counters["GFLOP"] = benchmark::Counter(2.0 * n * n * n * static_cast<double>(state.iterations()) / 1e9,
                                                 benchmark::Counter::kIsRate);
  // Whole-matrix check against OpenBLAS when present, else sampled float64 dot products.
  const float* C = c.data<float>();
  int64_t wrong = 0;
#ifdef RINGTRAIN_HAVE_OPENBLAS
  Tensor ref = Tensor::empty({n, n}, DType::kFloat32);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(n), static_cast<int>(n),
              static_cast<int>(n), 1.0f, a.data<float>(), static_cast<int>(n), b.data<float>(),
              static_cast<int>(n), 0.0f, ref.data<float>(), static_cast<int>(n));
  const float* R = ref.data<float>();
  for (int64_t i = 0; i < n * n; ++i) wrong += std::fabs(C[i] - R[i]) > 1e-5 * n + 1e-5 * std::fabs(R[i]);
#else
  const float* A = a.data<float>();
  const float* B = b.data<float>();
  for (int64_t s = 0; s < 64; ++s) {
    const int64_t i = (s * 7919) % n, j = (s * 104729) % n;
    double r = 0;
    for (int64_t k = 0; k < n; ++k) r += static_cast<double>(A[i * n + k]) * B[k * n + j];
    wrong += std::fabs(C[i * n + j] - r) > 1e-4 * n;
  }
#endif
  record_wrong(state, wrong);
}

// ---------------------------------------------------------------- elementwise

double ref_binary(BinaryOp op, double a, double b) {
  return op == BinaryOp::kAdd ? a + b : a * b;
}

// kernel rows: preallocated output, kernels::cpu directly (same conditions as memcpy).
void BM_BinaryKernel(benchmark::State& state, BinaryOp op) {
  const int64_t n = elementwise_n();
  Tensor a = rand_f32({n}, 4), b = rand_f32({n}, 5);
  Tensor out = Tensor::empty({n}, DType::kFloat32);
  kcpu::binary(op, a, b, out);  // warm-up
  for (auto _ : state) {
    kcpu::binary(op, a, b, out);
    benchmark::ClobberMemory();
  }
  set_bytes(state, 3.0 * static_cast<double>(out.nbytes()));
  const float *A = a.data<float>(), *B = b.data<float>(), *O = out.data<float>();
  int64_t wrong = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double r = ref_binary(op, A[i], B[i]);
    wrong += std::fabs(O[i] - r) > 1e-6 * (1.0 + std::fabs(r));
  }
  record_wrong(state, wrong);
}

double ref_unary(UnaryOp op, double x) {
  switch (op) {
    case UnaryOp::kRelu: return x < 0 ? 0.0 : x;
    case UnaryOp::kExp: return std::exp(x);
    case UnaryOp::kGelu: return 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0)));
    default: return std::nan("");
  }
}

void BM_UnaryKernel(benchmark::State& state, UnaryOp op) {
  const int64_t n = elementwise_n();
  Tensor a = rand_f32({n}, 6, -4.0, 4.0);
  Tensor out = Tensor::empty({n}, DType::kFloat32);
  kcpu::unary(op, a, out);  // warm-up
  for (auto _ : state) {
    kcpu::unary(op, a, out);
    benchmark::ClobberMemory();
  }
  set_bytes(state, 2.0 * static_cast<double>(out.nbytes()));
  const float *A = a.data<float>(), *O = out.data<float>();
  int64_t wrong = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double r = ref_unary(op, A[i]);
    wrong += !(std::fabs(O[i] - r) <= 2e-6 * (1.0 + std::fabs(r)));
  }
  record_wrong(state, wrong);
}

// op rows: the public API, output allocated per call.
void BM_AddOp(benchmark::State& state) {
  const int64_t n = elementwise_n();
  Tensor a = rand_f32({n}, 4), b = rand_f32({n}, 5);
  Tensor out = ringtrain::add(a, b);
  for (auto _ : state) {
    out = ringtrain::add(a, b);
    benchmark::DoNotOptimize(out.data_ptr());
  }
  set_bytes(state, 3.0 * static_cast<double>(out.nbytes()));
  const float *A = a.data<float>(), *B = b.data<float>(), *O = out.data<float>();
  int64_t wrong = 0;
  for (int64_t i = 0; i < n; ++i) wrong += std::fabs(O[i] - (static_cast<double>(A[i]) + B[i])) > 1e-6;
  record_wrong(state, wrong);
}

// Broadcast row add: [rows, cols] + [cols] (bias add), kernel with preallocated output.
void BM_BroadcastAddKernel(benchmark::State& state) {
  const int64_t cols = 1024, rows = elementwise_n() / cols;
  Tensor a = rand_f32({rows, cols}, 7), bias = rand_f32({cols}, 8);
  Tensor out = Tensor::empty({rows, cols}, DType::kFloat32);
  Tensor be = bias.expand({rows, cols});
  kcpu::binary(BinaryOp::kAdd, a, be, out);
  for (auto _ : state) {
    kcpu::binary(BinaryOp::kAdd, a, be, out);
    benchmark::ClobberMemory();
  }
  set_bytes(state, 2.0 * static_cast<double>(out.nbytes()));  // bias stays in cache
  const float *A = a.data<float>(), *B = bias.data<float>(), *O = out.data<float>();
  int64_t wrong = 0;
  for (int64_t i = 0; i < rows * cols; ++i) wrong += std::fabs(O[i] - (static_cast<double>(A[i]) + B[i % cols])) > 1e-6;
  record_wrong(state, wrong);
}

// ---------------------------------------------------------------- reductions

// dims: 0 = sum over everything, 1 = sum over rows (dim 0 of [r, c]), 2 = over columns (dim 1).
void BM_ReduceKernel(benchmark::State& state, ReduceOp op, int which) {
  const int64_t cols = 4096, rows = elementwise_n() / cols;
  Tensor a = rand_f32({rows, cols}, 9, 0.0, 1.0);
  std::vector<bool> mask = which == 0 ? std::vector<bool>{true, true}
                                      : (which == 1 ? std::vector<bool>{true, false} : std::vector<bool>{false, true});
  ringtrain::Shape out_shape = {mask[0] ? 1 : rows, mask[1] ? 1 : cols};
  Tensor out = Tensor::empty(out_shape, DType::kFloat32);
  kcpu::reduce(op, a, mask, out);
  for (auto _ : state) {
    kcpu::reduce(op, a, mask, out);
    benchmark::ClobberMemory();
  }
  set_bytes(state, static_cast<double>(a.nbytes() + out.nbytes()));
  // float64 reference.
  const float* A = a.data<float>();
  std::vector<double> ref(static_cast<size_t>(out.numel()), op == ReduceOp::kSum ? 0.0 : -INFINITY);
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) {
      const size_t o = static_cast<size_t>((mask[0] ? 0 : i) * (mask[1] ? 1 : cols) + (mask[1] ? 0 : j));
      ref[o] = op == ReduceOp::kSum ? ref[o] + A[i * cols + j] : std::max(ref[o], static_cast<double>(A[i * cols + j]));
    }
  const float* O = out.data<float>();
  int64_t wrong = 0;
  for (size_t o = 0; o < ref.size(); ++o) wrong += std::fabs(O[o] - ref[o]) > 1e-6 * std::fabs(ref[o]) + 1e-6;
  record_wrong(state, wrong);
}

// ---------------------------------------------------------------- registration + ratio table

// Captures the medians so the ratio table can be printed after all benchmarks ran.
class RatioReporter : public benchmark::ConsoleReporter {
 public:
  explicit RatioReporter(OutputOptions options) : ConsoleReporter(options) {}
  void ReportRuns(const std::vector<Run>& runs) override {
    ConsoleReporter::ReportRuns(runs);
    for (const Run& run : runs) {
      const bool is_median = run.run_type == Run::RT_Aggregate && run.aggregate_name == "median";
      const bool single = run.run_type == Run::RT_Iteration;
      std::string key = run.run_name.function_name;
      if (!run.run_name.args.empty()) key += "/" + run.run_name.args;
      if (!is_median && !(single && run.repetitions <= 1)) continue;
      auto& v = values_[key];
      for (const auto& [key, counter] : run.counters) v[key] = counter.value;
    }
  }
  double get(const std::string& name, const std::string& key) const {
    auto it = values_.find(name);
    if (it == values_.end()) return NAN;
    auto jt = it->second.find(key);
    return jt == it->second.end() ? NAN : jt->second;
  }

 private:
  std::map<std::string, std::map<std::string, double>> values_;
};

// A figure of the table, or "-" where a benchmark it needs did not run (--benchmark_filter).
std::string figure(double value, int precision) {
  if (std::isnan(value)) return "-";
  char text[32];
  std::snprintf(text, sizeof(text), "%.*f", precision, value);
  return text;
}

void print_ratios(const RatioReporter& r) {
  const double mem = r.get("memcpy", "GB");
  std::printf("\n== ratios to this machine's ceilings (medians, single thread; - : not run) ==\n");
  std::printf("memcpy bandwidth (read+write): %s GB/s\n", figure(mem, 2).c_str());
  std::printf("%-34s %10s %10s %8s   (our kernel: %s)\n", "GEMM f32 (n = m = k)", "ours", "OpenBLAS", "ratio",
              ringtrain::kernels::cpu::sgemm_kernel_name());
  for (int64_t n : gemm_sizes()) {
    const double ours = r.get("matmul_f32/" + std::to_string(n), "GFLOP");
    const double blas = r.get("openblas_sgemm_1thread/" + std::to_string(n), "GFLOP");
    std::printf("%-34s %10s %10s %8s   (GFLOP/s)\n", ("n=" + std::to_string(n)).c_str(), figure(ours, 2).c_str(),
                figure(blas, 2).c_str(), figure(ours / blas, 3).c_str());
  }
  std::printf("%-34s %10s %10s\n", "elementwise / reduction (f32)", "GB/s", "/memcpy");
  for (const char* name : {"add_kernel", "mul_kernel", "relu_kernel", "exp_kernel", "gelu_kernel",
                           "add_bias_broadcast_kernel", "add_op", "sum_all_kernel", "sum_dim0_kernel",
                           "sum_dim1_kernel", "amax_all_kernel"}) {
    const double gbs = r.get(name, "GB");
    std::printf("%-34s %10s %10s\n", name, figure(gbs, 2).c_str(), figure(gbs / mem, 3).c_str());
  }
  std::printf("wrong elements in all timed results: %lld\n", static_cast<long long>(g_total_wrong));
}

// The Google Benchmark flags a user gave on the command line, among those that the
// per-benchmark settings below would otherwise override without a word.
struct GivenFlags {
  bool repetitions = false, min_time = false, min_warmup_time = false, aggregates_only = false;
};

void register_all(const GivenFlags& given) {
  const int reps = g_smoke ? 1 : 5;
  auto setup = [reps, given](benchmark::internal::Benchmark* b) {
    b->Unit(benchmark::kMillisecond);
    if (!given.repetitions) b->Repetitions(reps);
    if (!given.aggregates_only && !given.repetitions) b->ReportAggregatesOnly(reps > 1);
    if (g_smoke) {
      if (!given.min_time) b->Iterations(2);
    } else {
      if (!given.min_warmup_time) b->MinWarmUpTime(0.2);
      if (!given.min_time) b->MinTime(0.5);
    }
  };
  setup(benchmark::RegisterBenchmark("memcpy", BM_Memcpy));
  for (int64_t n : gemm_sizes()) {
#ifdef RINGTRAIN_HAVE_OPENBLAS
    setup(benchmark::RegisterBenchmark("openblas_sgemm_1thread", BM_OpenBlasSgemm)->Arg(n));
#endif
    setup(benchmark::RegisterBenchmark("matmul_f32", BM_RingtrainMatmul)->Arg(n));
  }
  setup(benchmark::RegisterBenchmark("add_kernel", BM_BinaryKernel, BinaryOp::kAdd));
  setup(benchmark::RegisterBenchmark("mul_kernel", BM_BinaryKernel, BinaryOp::kMul));
  setup(benchmark::RegisterBenchmark("relu_kernel", BM_UnaryKernel, UnaryOp::kRelu));
  setup(benchmark::RegisterBenchmark("exp_kernel", BM_UnaryKernel, UnaryOp::kExp));
  setup(benchmark::RegisterBenchmark("gelu_kernel", BM_UnaryKernel, UnaryOp::kGelu));
  setup(benchmark::RegisterBenchmark("add_bias_broadcast_kernel", BM_BroadcastAddKernel));
  setup(benchmark::RegisterBenchmark("add_op", BM_AddOp));
  setup(benchmark::RegisterBenchmark("sum_all_kernel", BM_ReduceKernel, ReduceOp::kSum, 0));
  setup(benchmark::RegisterBenchmark("sum_dim0_kernel", BM_ReduceKernel, ReduceOp::kSum, 1));
  setup(benchmark::RegisterBenchmark("sum_dim1_kernel", BM_ReduceKernel, ReduceOp::kSum, 2));
  setup(benchmark::RegisterBenchmark("amax_all_kernel", BM_ReduceKernel, ReduceOp::kMax, 0));
}

// True when `arg` is Google Benchmark's `flag`, as --flag or --flag=value.
bool is_flag(const char* arg, const char* flag) {
  const size_t n = std::strlen(flag);
  return std::strncmp(arg, flag, n) == 0 && (arg[n] == '\0' || arg[n] == '=');
}

// --benchmark_color's value, read as Google Benchmark reads it; the table is printed by
// our reporter, which does not see the flag.
benchmark::ConsoleReporter::OutputOptions console_options(const char* color) {
  std::string value = color == nullptr ? "auto" : color;
  const bool colored = value == "auto" ? isatty(STDOUT_FILENO) != 0
                                       : (value == "true" || value == "yes" || value == "1" || value == "force");
  return colored ? benchmark::ConsoleReporter::OO_Defaults : benchmark::ConsoleReporter::OO_Tabular;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<char*> args;
  GivenFlags given;
  const char* color = nullptr;
  for (int i = 0; i < argc; ++i) {
    const char* arg = argv[i];
    if (std::strcmp(arg, "--smoke") == 0) {
      g_smoke = true;
      continue;
    }
    if (i > 0 && (std::strcmp(arg, "--help") == 0 || std::strcmp(arg, "-h") == 0)) {
      // Ours first; Google Benchmark's Initialize then prints its flags and exits.
      std::printf("bench_tensor_ops: CPU kernel benchmarks (memcpy, GEMM vs OpenBLAS, elementwise, reductions),\n"
                  "each result checked (exit 1 on a wrong element), then a table of ratios to the ceilings.\n"
                  "  --smoke   tiny sizes, 2 iterations, 1 repetition (the bench-smoke ctest)\n"
                  "  default   full sizes; per benchmark 5 repetitions (medians), 0.5 s minimum time and\n"
                  "            0.2 s warm-up, each replaced by its --benchmark_repetitions, --benchmark_min_time\n"
                  "            or --benchmark_min_warmup_time when given\n"
                  "  --benchmark_format: console only (the table is this program's); JSON with\n"
                  "            --benchmark_out=FILE --benchmark_out_format=json\n"
                  "Google Benchmark's flags:\n");
      std::fflush(stdout);
    }
    given.repetitions |= is_flag(arg, "--benchmark_repetitions");
    given.min_time |= is_flag(arg, "--benchmark_min_time");
    given.min_warmup_time |= is_flag(arg, "--benchmark_min_warmup_time");
    given.aggregates_only |= is_flag(arg, "--benchmark_report_aggregates_only");
    if (is_flag(arg, "--benchmark_color")) {
      const char* value = std::strchr(arg, '=');
      color = value != nullptr ? value + 1 : "true";
    }
    if (is_flag(arg, "--benchmark_format") && std::strcmp(arg, "--benchmark_format=console") != 0) {
      std::fprintf(stderr, "bench_tensor_ops: %s: the console table is this program's own; for JSON or CSV add "
                           "--benchmark_out=FILE --benchmark_out_format=json (or csv) instead\n", arg);
      return 2;
    }
    args.push_back(argv[i]);
  }
  int n = static_cast<int>(args.size());
#ifdef RINGTRAIN_HAVE_OPENBLAS
  openblas_set_num_threads(1);
#else
  std::printf("OpenBLAS was not found at build time: the SGEMM ceiling is not measured\n");
#endif
  benchmark::Initialize(&n, args.data());
  if (benchmark::ReportUnrecognizedArguments(n, args.data())) return 2;
  register_all(given);
  RatioReporter reporter(console_options(color));
  const size_t ran = benchmark::RunSpecifiedBenchmarks(&reporter);
  if (ran == 0) {
    // A filter that matches nothing: no figure, and no check, to report.
    std::fprintf(stderr, "bench_tensor_ops: no benchmark ran: --benchmark_filter='%s' matches none of them "
                         "(--benchmark_list_tests lists them)\n",
                 benchmark::GetBenchmarkFilter().c_str());
    benchmark::Shutdown();
    return 2;
  }
  print_ratios(reporter);
  benchmark::Shutdown();
  return g_total_wrong == 0 ? 0 : 1;
}
