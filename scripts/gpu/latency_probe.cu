// latency_probe.cu: what one host-side wait on the GPU costs on this machine.
//
// Medians of 2000 repetitions of: an empty stream synchronize, a 1-thread kernel +
// synchronize, 4-byte and 16 MB device-to-device copies + synchronize, a 4-byte
// device-to-host copy, and an event create + record + synchronize. Run it alone,
// then two at once on one GPU: the difference is what the GPU's time slicing
// between two processes adds to every wait (docs/gpu-validation.md).
// Built by scripts/gpu/make_bundle.sh; run by scripts/gpu/validate.sh (step probe).
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

#define PROBE_CHECK(x)                                                        \
  do {                                                                        \
    cudaError_t e = (x);                                                      \
    if (e != cudaSuccess) {                                                   \
      std::fprintf(stderr, "%s: %s\n", #x, cudaGetErrorString(e));            \
      return 1;                                                               \
    }                                                                         \
  } while (0)

__global__ void touch(float* p) { p[threadIdx.x] += 1.0f; }

template <class F>
double median_us(F f, int n = 2000) {
  using Clock = std::chrono::steady_clock;
  std::vector<double> t;
  for (int i = 0; i < n; ++i) {
    auto a = Clock::now();
    f();
    t.push_back(std::chrono::duration<double, std::micro>(Clock::now() - a).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

int main() {
  PROBE_CHECK(cudaSetDevice(0));
  cudaStream_t s;
  PROBE_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  float *a, *b, *h;
  PROBE_CHECK(cudaMalloc(&a, 64 << 20));
  PROBE_CHECK(cudaMalloc(&b, 64 << 20));
  PROBE_CHECK(cudaMallocHost(&h, 1 << 20));
  PROBE_CHECK(cudaMemset(a, 0, 64 << 20));
  PROBE_CHECK(cudaDeviceSynchronize());
  std::printf("empty stream sync         %8.1f us\n", median_us([&] { cudaStreamSynchronize(s); }));
  std::printf("kernel + sync             %8.1f us\n", median_us([&] {
    touch<<<1, 32, 0, s>>>(a);
    cudaStreamSynchronize(s);
  }));
  std::printf("D2D 4 B + sync            %8.1f us\n", median_us([&] {
    cudaMemcpyAsync(b, a, 4, cudaMemcpyDeviceToDevice, s);
    cudaStreamSynchronize(s);
  }));
  std::printf("D2D 16 MB + sync          %8.1f us\n", median_us([&] {
    cudaMemcpyAsync(b, a, 16 << 20, cudaMemcpyDeviceToDevice, s);
    cudaStreamSynchronize(s);
  }, 200));
  std::printf("D2H 4 B pinned + sync     %8.1f us\n", median_us([&] {
    cudaMemcpyAsync(h, a, 4, cudaMemcpyDeviceToHost, s);
    cudaStreamSynchronize(s);
  }));
  std::printf("event create+record+sync  %8.1f us\n", median_us([&] {
    cudaEvent_t e;
    cudaEventCreate(&e);
    cudaEventRecord(e, 0);
    cudaEventSynchronize(e);
    cudaEventDestroy(e);
  }));
  PROBE_CHECK(cudaGetLastError());
  return 0;
}
