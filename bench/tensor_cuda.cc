// tensor_cuda.cc: GPU kernel benchmarks for the tensor library, each figure beside its ceiling.
//
// What it prints (Google Benchmark, one row per case; use
// --benchmark_repetitions=5 --benchmark_report_aggregates_only=true for medians):
//   BM_Gemm/<dtype>/<n>         our matmul (cuBLAS via kernels::cuda::batched_matmul) on
//                               n x n x n: TFLOP/s, and x_ceiling = ours / a direct
//                               cublasGemmEx call on the same buffers measured at start-up;
//                               #wrong = elements of the last timed product further from
//                               a float64 product of the same inputs than the dtype allows
//                               (relative: 2e-3 float32 (TF32 included) and float16, 1e-2
//                               bfloat16; the inputs are in [0, 1), so no cancellation).
//   BM_Add/<n>                  c = a + b on n float32: GB/s (3 * 4n bytes moved) and
//                               x_ceiling = ours / cudaMemcpyAsync device-to-device GB/s;
//                               #wrong = elements of the last timed c that are not a + b
//                               (all n of them, on the host: IEEE addition is exact there too).
//   BM_Sum/<n>                  sum(a) of n random float32 in [0, 1): GB/s (4n bytes read),
//                               x_ceiling as above; #wrong = 1 when the last timed sum is
//                               more than 1e-5 relative from the float64 sum on the host.
// Times are CUDA-event times on the current stream (manual time), after warm-up. The
// ceilings are measured at start-up, each the median of kCeilingSamples samples (10
// direct GEMM calls, or 20 copies, per sample; one sample alone would carry whatever
// clock ramp or hiccup it met), while "ours" is the benchmark's sustained loop:
// x_ceiling still compares two differently timed figures (timing both alternately
// inside BM_Gemm would remove that).
// Any #wrong makes the program exit 1 after the table (the rows stay, marked).
// Without a usable GPU the program prints the reason and exits 0 (built only with CUDA).
#include <benchmark/benchmark.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "bench/bench_cli.h"
#include "tensor/checks.h"
#include "tensor/cuda/runtime.h"
#include "tensor/ops.h"

namespace ringtrain {
namespace {

const Device kCuda = Device::cuda(0);

double g_total_wrong = 0;  // over every case; main() exits 1 when it is not 0

// Times `fn` (which queues GPU work on the current stream) with CUDA events: seconds per call.
template <typename Fn>
double time_gpu(Fn&& fn, int reps) {
  cuda::Stream stream = cuda::current_stream(0);
  cuda::Event start = cuda::Event::create(0, true);
  cuda::Event stop = cuda::Event::create(0, true);
  start.record(stream);
  for (int i = 0; i < reps; ++i) fn();
  stop.record(stream);
  stop.synchronize();
  return start.elapsed_ms(stop) / 1e3 / reps;
}

cudaDataType_t cuda_type(DType dtype) {
  switch (dtype) {
    case DType::kFloat16: return CUDA_R_16F;
    case DType::kBFloat16: return CUDA_R_16BF;
    default: return CUDA_R_32F;
  }
}

// ---------------------------------------------------------------- ceilings, measured once

constexpr int kCeilingSamples = 5;  // each ceiling: the median of this many samples

// The median over kCeilingSamples samples of time_gpu(fn, reps): seconds per call.
template <typename Fn>
double median_time_gpu(Fn&& fn, int reps) {
  std::vector<double> samples;
  for (int i = 0; i < kCeilingSamples; ++i) samples.push_back(time_gpu(fn, reps));
  return bench::median(samples);
}

// Direct cublasGemmEx (row-major trick as in matmul.cu), f32 accumulation, no TF32.
struct DirectGemm {
  cublasHandle_t handle = nullptr;
  DirectGemm() { CUBLAS_CHECK(cublasCreate(&handle)); }
  ~DirectGemm() { (void)cublasDestroy(handle); }
  DirectGemm(const DirectGemm&) = delete;
  DirectGemm& operator=(const DirectGemm&) = delete;
  void run(const Tensor& a, const Tensor& b, const Tensor& c, int n) {
    float one = 1.0f, zero = 0.0f;
    CUBLAS_CHECK(cublasSetStream(handle, static_cast<cudaStream_t>(cuda::current_stream(0).handle())));
    cudaDataType_t t = cuda_type(a.dtype());
    CUBLAS_CHECK(cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one, b.data_ptr(), t, n,
                              a.data_ptr(), t, n, &zero, c.data_ptr(), t, n, CUBLAS_COMPUTE_32F,
                              CUBLAS_GEMM_DEFAULT));
  }
};

std::map<std::string, double>& gemm_ceiling() {  // "dtype/n" -> TFLOP/s of the direct call
  static std::map<std::string, double> m;
  return m;
}
double& memcpy_gbps() {
  static double v = 0;
  return v;
}

void measure_ceilings(const std::vector<DType>& dtypes, const std::vector<int>& sizes) {
  DirectGemm direct;
  for (DType dtype : dtypes) {
    for (int n : sizes) {
      Generator gen(1);
      Tensor a = rand({n, n}, gen, dtype, kCuda), b = rand({n, n}, gen, dtype, kCuda);
      Tensor c = Tensor::empty({n, n}, dtype, kCuda);
      for (int i = 0; i < 3; ++i) direct.run(a, b, c, n);
      double s = median_time_gpu([&] { direct.run(a, b, c, n); }, 10);
      gemm_ceiling()[std::string(dtype_name(dtype)) + "/" + std::to_string(n)] =
          2.0 * n * n * n / s / 1e12;
    }
  }
  size_t bytes = size_t{256} << 20;
  Tensor src = zeros({static_cast<int64_t>(bytes / 4)}, DType::kFloat32, kCuda);
  Tensor dst = zeros({static_cast<int64_t>(bytes / 4)}, DType::kFloat32, kCuda);
  auto copy = [&] {
    CUDA_CHECK(cudaMemcpyAsync(dst.data_ptr(), src.data_ptr(), bytes, cudaMemcpyDeviceToDevice,
                               static_cast<cudaStream_t>(cuda::current_stream(0).handle())));
  };
  copy();
  memcpy_gbps() = 2.0 * bytes / median_time_gpu(copy, 20) / 1e9;  // read + write
}

// ---------------------------------------------------------------- benchmarks

void BM_Gemm(benchmark::State& state, DType dtype) {
  int n = static_cast<int>(state.range(0));
  Generator gen(1);
  Tensor a = rand({n, n}, gen, dtype, kCuda), b = rand({n, n}, gen, dtype, kCuda);
  Tensor ours = matmul(a, b);
  for (auto _ : state) {
    double s = time_gpu([&] { ours = matmul(a, b); }, 5);
    state.SetIterationTime(s);
  }
  // Checked: the last timed product against float64 on the same (rounded) inputs. With
  // inputs in [0, 1) every product term is positive, so a relative bound per element holds.
  Tensor exact = matmul(a.to(DType::kFloat64), b.to(DType::kFloat64));
  const double rtol = dtype == DType::kBFloat16 ? 1e-2 : 2e-3;
  Tensor wrong = gt(abs(sub(ours.to(DType::kFloat64), exact)), mul(exact, rtol));
  double n_wrong = sum(wrong.to(DType::kFloat64)).item();
  g_total_wrong += n_wrong;
  double tflops = 2.0 * n * n * n / 1e12;
  state.counters["TFLOP/s"] = benchmark::Counter(tflops, benchmark::Counter::kIsIterationInvariantRate);
  double ceiling = gemm_ceiling()[std::string(dtype_name(dtype)) + "/" + std::to_string(n)];
  state.counters["ceiling_TFLOP/s"] = ceiling;
  state.counters["#wrong"] = n_wrong;
  state.SetLabel(std::string(dtype_name(dtype)) + " vs direct cublasGemmEx");
  state.counters["x_ceiling"] = benchmark::Counter(
      ceiling > 0 ? tflops / ceiling : 0, benchmark::Counter::kIsIterationInvariantRate);
}

void BM_Add(benchmark::State& state) {
  int64_t n = state.range(0);
  Generator gen(2);
  Tensor a = rand({n}, gen, DType::kFloat32, kCuda), b = rand({n}, gen, DType::kFloat32, kCuda);
  Tensor c = add(a, b);
  for (auto _ : state) {
    double s = time_gpu([&] { c = add(a, b); }, 10);
    state.SetIterationTime(s);
  }
  // Checked on the host, every element of the last timed result: IEEE float addition
  // gives the same bits on both devices.
  std::vector<float> av = a.to_vector<float>(), bv = b.to_vector<float>(), cv = c.to_vector<float>();
  double n_wrong = 0;
  for (int64_t i = 0; i < n; ++i) n_wrong += cv[i] != av[i] + bv[i] ? 1 : 0;
  g_total_wrong += n_wrong;
  double gb = 3.0 * 4 * n / 1e9;
  state.counters["GB/s"] = benchmark::Counter(gb, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["memcpy_GB/s"] = memcpy_gbps();
  state.counters["x_ceiling"] = benchmark::Counter(
      memcpy_gbps() > 0 ? gb / memcpy_gbps() : 0, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["#wrong"] = n_wrong;
}

void BM_Sum(benchmark::State& state) {
  int64_t n = state.range(0);
  Generator gen(3);
  Tensor a = rand({n}, gen, DType::kFloat32, kCuda);  // random: a lost or repeated block shows
  Tensor s = sum(a);
  for (auto _ : state) {
    double t = time_gpu([&] { s = sum(a); }, 10);
    state.SetIterationTime(t);
  }
  // Checked: the last timed sum against a float64 sum of the same values on the host.
  double exact = 0;
  for (float v : a.to_vector<float>()) exact += v;
  double wrong = std::abs(s.item() - exact) > 1e-5 * exact ? 1 : 0;
  g_total_wrong += wrong;
  double gb = 4.0 * n / 1e9;
  state.counters["GB/s"] = benchmark::Counter(gb, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["x_ceiling"] = benchmark::Counter(
      memcpy_gbps() > 0 ? gb / memcpy_gbps() : 0, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["#wrong"] = wrong;
}

}  // namespace
}  // namespace ringtrain

int main(int argc, char** argv) {
  using namespace ringtrain;
  if (!cuda::is_available()) {
    std::printf("bench_tensor_cuda: skipped, no usable GPU: %s\n", cuda::unavailable_reason());
    return 0;
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 2;
  const std::vector<DType> dtypes = {DType::kFloat32, DType::kFloat16, DType::kBFloat16};
  const std::vector<int> sizes = {1024, 2048, 4096};
  measure_ceilings(dtypes, sizes);
  for (DType dtype : dtypes) {
    auto* b = benchmark::RegisterBenchmark((std::string("BM_Gemm/") + dtype_name(dtype)).c_str(),
                                           BM_Gemm, dtype);
    for (int n : sizes) b->Arg(n);
    b->UseManualTime()->Unit(benchmark::kMillisecond);
  }
  benchmark::RegisterBenchmark("BM_Add", BM_Add)
      ->Arg(int64_t{1} << 20)->Arg(int64_t{1} << 24)->Arg(int64_t{1} << 26)
      ->UseManualTime()->Unit(benchmark::kMicrosecond);
  benchmark::RegisterBenchmark("BM_Sum", BM_Sum)
      ->Arg(int64_t{1} << 20)->Arg(int64_t{1} << 24)->Arg(int64_t{1} << 26)
      ->UseManualTime()->Unit(benchmark::kMicrosecond);
  if (benchmark::RunSpecifiedBenchmarks() == 0) {
    std::fprintf(stderr, "bench_tensor_cuda: no benchmark ran: --benchmark_filter='%s' matches none of them "
                         "(--benchmark_list_tests lists them)\n",
                 benchmark::GetBenchmarkFilter().c_str());
    benchmark::Shutdown();
    return 2;
  }
  benchmark::Shutdown();
  if (g_total_wrong > 0) {
    std::fprintf(stderr, "bench_tensor_cuda: %.0f wrong result(s) (the #wrong column); the numbers above do not "
                         "count\n", g_total_wrong);
    return 1;
  }
  return 0;
}
