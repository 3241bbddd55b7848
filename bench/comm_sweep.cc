// comm_sweep: allreduce bus bandwidth from 8 B to 256 MiB, ours beside
// MPI_Allreduce on the same buffers, in the same run, with memcpy as the roof.
//
//   mpirun -np 2 --oversubscribe --allow-run-as-root build/bench/comm_sweep --backend ring
//   ringrun --nproc-per-node 2 build/bench/comm_sweep            (no MPI reference: not under mpirun)
//   srun -n 2 build/bench/comm_sweep                             (idem)
//
// Columns follow nccl-tests (src/common.cu): size, count, type, redop, time (the
// median over --iters timed repetitions after --warmup untimed ones, the slowest
// rank's median), algbw = size / time, busbw = algbw * 2(n-1)/n (what each link
// carries in a ring allreduce, comparable across rank counts), and #wrong: the
// elements that differ from the exact answer, checked after every timed
// repetition (inputs are small integers, so every sum is exact). A run with any
// #wrong exits 1: a benchmark that times wrong results is worthless.
//
// --buffers symmetric puts the buffer (the one both ours and MPI_Allreduce run on)
// in memory from ProcessGroup::allocate_symmetric, so the ring backend reduces it
// in place by direct loads and stores (comm/direct_allreduce.cc) - the way DDP's
// buckets are allocated. MPI sees ordinary memory either way.
//
// --launch blocking (the default) times allreduce(..., Launch::kBlocking), which on
// an idle group runs on the calling thread the way MPI_Allreduce does; --launch
// async times the queued path DDP uses (allreduce on the comm thread, Work::wait).
//
// --device cuda puts our buffer on the GPU (local rank's index modulo the GPUs):
// the ring backend reduces it through CUDA IPC on one host, or host staging
// (RINGTRAIN_CUDA_IPC=0, or across hosts); nccl natively. The timed call ends
// when the result is in device memory. MPI_Allreduce stays on host memory (this
// Open MPI is not CUDA-aware), so its column is then a reference, not a twin, and
// the CPU targets are not printed.
//
// Each repetition restores the input from a pristine copy (untimed) because the
// allreduce is in place, then a barrier lines the ranks up, then the timed call.
// The same barrier before both (MPI_Barrier when MPI runs beside us): each time
// includes how unevenly the barrier released the ranks, and with two barrier
// implementations the small-message ratio would compare those too. Ours and
// MPI_Allreduce alternate repetition by repetition.
//
// --json writes the rows, the roofs and which MPI library the reference column is
// (MPI_Get_library_version; bench/plot_allreduce.py names it in the legend).
//
// Before and after the sweep: memcpy on rank 0 (the memory's roof; its copies are
// checked too) and, with two or more ranks on host buffers, the stream from rank 0 to
// rank 1 through the group's send/recv (the roof between two cores, and the mark of
// this VM's slow mode; docs/collective-benchmark.md).
#include <mpi.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <vector>

#include "bench/bench_cli.h"
#include "comm/cuda_staging.h"
#include "comm/init.h"
#include "comm/mpi_runtime.h"
#include "comm/symmetric_memory.h"
#include "tensor/cuda/runtime.h"
#include "tensor/storage.h"

using namespace ringtrain;
using namespace ringtrain::comm;

namespace {

using Seconds = std::chrono::duration<double>;

using bench::median;

struct Result {
  double time_us = 0;
  double algbw = 0;
  double busbw = 0;
  int64_t wrong = 0;
};

// The input of rank r, element i: small integers, so the sum is exact in float.
float input_value(int rank, size_t i) { return static_cast<float>(rank + static_cast<int>(i % 7)); }
float expected_sum(int n, size_t i) {
  return static_cast<float>(n * static_cast<int>(i % 7) + n * (n - 1) / 2);
}

// The largest --max-bytes: MPI_Allreduce counts its elements in an int, and the
// sweep doubles the size up to it.
constexpr uint64_t kMaxBytes = uint64_t{4} << 30;

// The program; main() turns its exceptions into a message and an exit code.
int run(int argc, char** argv, std::shared_ptr<ProcessGroup>& pg) {
  CLI::App app{"comm_sweep: allreduce bandwidth sweep (nccl-tests columns), ours vs MPI_Allreduce"};
  std::string backend = "ring";
  uint64_t min_bytes = 8;
  uint64_t max_bytes = uint64_t{256} << 20;
  int warmup = 3;
  int iters = 20;
  bool mpi_reference = true;
  std::string json_path;
  app.add_option("--backend", backend, "ring, mpi or nccl")
      ->check(CLI::IsMember({"ring", "mpi", "nccl"}))
      ->capture_default_str();
  bench::add_byte_size_option(app, "--min-bytes", min_bytes, "smallest size, rounded down to whole floats (4 bytes), at least one float", 0,
                              kMaxBytes);
  bench::add_byte_size_option(app, "--max-bytes", max_bytes,
                              "largest size, at most 4G (MPI_Allreduce counts elements in an int)", 4, kMaxBytes);
  app.add_option("--warmup", warmup, "untimed repetitions per size")
      ->check(CLI::Range(0, std::numeric_limits<int>::max()))
      ->capture_default_str();
  app.add_option("--iters", iters,
                 "timed repetitions per size; above 16 MiB fewer (the bytes of --iters at 16 MiB), but at least "
                 "5, never more than --iters")
      ->check(CLI::Range(1, std::numeric_limits<int>::max()))
      ->capture_default_str();
  app.add_flag("!--no-mpi", mpi_reference, "skip the MPI_Allreduce reference");
  std::string buffers = "private";
  app.add_option("--buffers", buffers,
                 "private (ordinary memory) or symmetric (ProcessGroup::allocate_symmetric)")
      ->check(CLI::IsMember({"private", "symmetric"}))
      ->capture_default_str();
  std::string launch_text = "blocking";
  app.add_option("--launch", launch_text,
                 "blocking (Launch::kBlocking: runs on the calling thread when the group is "
                 "idle, as MPI_Allreduce does) or async (queued on the comm thread, then "
                 "Work::wait: DDP's path)")
      ->check(CLI::IsMember({"blocking", "async"}))
      ->capture_default_str();
  app.add_option("--json", json_path, "also write the rows as JSON (for the plot; checked before the sweep)");
  std::string device_text = "cpu";
  app.add_option("--device", device_text, "where our buffer lives: cpu or cuda")
      ->check(CLI::IsMember({"cpu", "cuda"}))->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  const Launch launch = launch_text == "blocking" ? Launch::kBlocking : Launch::kAsync;
  // Whole floats, so that every row's bytes are the bytes reduced (6 bytes would time 4
  // and report the bandwidth of 6).
  min_bytes = std::max<uint64_t>(4, min_bytes / 4 * 4);
  if (min_bytes > max_bytes) {
    std::fprintf(stderr, "comm_sweep: --min-bytes %llu is larger than --max-bytes %llu: no size to measure\n",
                 static_cast<unsigned long long>(min_bytes), static_cast<unsigned long long>(max_bytes));
    return 2;
  }

  if (device_text == "cuda" && !cuda::is_available()) {
    std::fprintf(stderr, "comm_sweep: --device cuda, but no usable GPU here: %s\n", cuda::unavailable_reason());
    return 2;
  }
  InitOptions options;
  options.backend = backend;
  pg = init_process_group(options);
  Device device = Device::cpu();
  if (device_text == "cuda") {
    device = Device::cuda(local_cuda_device());
    cuda::set_device(device.index);
  }
  const int rank = pg->rank();
  const int n = pg->size();
  // The MPI reference needs MPI's world to be ours: only under mpirun (mpi:// init).
  int mpi_initialized = 0;
  MPI_Initialized(&mpi_initialized);
  if (mpi_reference && (!mpi_initialized || launch_info().method != "mpi")) {
    if (rank == 0) std::printf("# MPI reference skipped: not launched by mpirun (init %s)\n", launch_info().method.c_str());
    mpi_reference = false;
  }
  // Which MPI the reference column is, as the library says (the JSON carries it to the
  // plot's legend): the first line of MPI_Get_library_version, whitespace collapsed.
  std::string mpi_library;
  if (mpi_reference) {
    char text[MPI_MAX_LIBRARY_VERSION_STRING] = {};
    int length = 0;
    MPI_Get_library_version(text, &length);
    for (int i = 0; i < length && text[i] != '\0' && text[i] != '\n'; ++i) {
      const bool blank = std::isspace(static_cast<unsigned char>(text[i])) != 0;
      if (!blank) mpi_library.push_back(text[i]);
      else if (!mpi_library.empty() && mpi_library.back() != ' ') mpi_library.push_back(' ');
    }
    while (!mpi_library.empty() && mpi_library.back() == ' ') mpi_library.pop_back();
  }
  // The output file is rank 0's; found unwritable there, every rank stops now, not
  // after the sweep.
  int unwritable = 0;
  std::string path_error;
  if (rank == 0 && !json_path.empty()) {
    path_error = bench::check_writable("--json", json_path);
    unwritable = path_error.empty() ? 0 : 1;
  }
  // Said before the others learn of it: a launcher may stop rank 0 once a rank exits.
  if (unwritable) std::fprintf(stderr, "comm_sweep: %s\n", path_error.c_str());
  pg->allreduce({&unwritable, 1, DType::kInt32}, ReduceOp::kMax).wait();
  if (unwritable) return 2;
  const size_t capacity = max_bytes / sizeof(float) + 1;
  // The input's pristine copy and the buffer reduced in place, on every rank.
  if (std::string error = bench::check_fits_in_memory(
          2.0 * static_cast<double>(capacity * sizeof(float)),
          "--max-bytes " + bench::format_byte_size(max_bytes) + " (two buffers of it per rank)");
      !error.empty()) {
    throw std::runtime_error(error + "; use a smaller --max-bytes");
  }

  // ---- memcpy bandwidth, the roof: rank 0 copies 64 MiB while the others wait.
  // Measured before the sweep (the target's roof) and again after it: this VM has
  // slow phases of seconds to minutes, and a drop between the two says one fell
  // inside the run.
  int64_t memcpy_wrong = 0;  // rank 0's copies that did not leave both buffers equal
  auto measure_memcpy = [&] {
    // 64 MiB whatever the sweep's range: a copy that fits in the last-level cache
    // (32 MiB here) measures the cache, 2-3x the memory's rate on this VM.
    const size_t bytes = 64u << 20;
    std::vector<char> a(bytes, 1), b(bytes, 2);
    double gbps = 0;
    pg->barrier().wait();
    if (rank == 0) {
      std::vector<double> times;
      for (int i = 0; i < 11; ++i) {
        auto t0 = std::chrono::steady_clock::now();
        std::memcpy(i % 2 ? a.data() : b.data(), i % 2 ? b.data() : a.data(), bytes);
        times.push_back(Seconds(std::chrono::steady_clock::now() - t0).count());
      }
      gbps = bytes / median(times) / 1e9;
      // Checked: a held 1s and b 2s, and every copy moves 1s; a partial or missing copy
      // leaves 2s in b.
      if (a[0] != 1 || std::memcmp(a.data(), b.data(), bytes) != 0) ++memcpy_wrong;
    }
    pg->barrier().wait();
    return gbps;
  };
  // ---- the stream between ranks 0 and 1: 1 MiB messages one way through this
  // backend's send/recv. With the ring backend on one host that is the shared-memory
  // transport copying from one core to another, the roof of the allreduce. This VM
  // has a "slow mode" in which the host halves the bandwidth between its two vCPUs
  // while memcpy stays where it was (docs/collective-benchmark.md), so the memcpy
  // line cannot show it and this one can: printed before and after the sweep, it
  // says which mode the run was in. Every message is checked on arrival.
  int64_t stream_wrong = 0;
  auto measure_stream = [&] {
    constexpr size_t kCount = size_t{1} << 18;  // floats: 1 MiB
    constexpr int kMessages = 16, kTrials = 5;
    std::vector<float> message(kCount);
    std::vector<double> times;
    for (int trial = 0; trial < kTrials; ++trial) {
      pg->barrier().wait();
      auto t0 = std::chrono::steady_clock::now();
      for (int m = 0; m < kMessages; ++m) {
        const float stamp = static_cast<float>(trial * kMessages + m);
        if (rank == 0) {
          std::fill(message.begin(), message.end(), stamp);
          pg->send({message.data(), kCount, DType::kFloat32}, 1).wait();
        } else if (rank == 1) {
          pg->recv({message.data(), kCount, DType::kFloat32}, 0).wait();
          stream_wrong += std::count_if(message.begin(), message.end(), [&](float v) { return v != stamp; });
        }
      }
      // Rank 1 acknowledges the last message, so rank 0's clock covers its arrival.
      int ack = 0;
      if (rank == 1) pg->send({&ack, 1, DType::kInt32}, 0).wait();
      if (rank == 0) pg->recv({&ack, 1, DType::kInt32}, 1).wait();
      times.push_back(Seconds(std::chrono::steady_clock::now() - t0).count());
    }
    return kMessages * kCount * sizeof(float) / median(times) / 1e9;  // meaningful on rank 0
  };
  // Host memory between two ranks only; the CUDA paths have their own roofs.
  const bool stream_measured = n >= 2 && device.is_cpu();
  const double memcpy_gbps = measure_memcpy();
  const double stream_gbps = stream_measured ? measure_stream() : 0.0;

  if (rank == 0) {
    std::printf("# comm_sweep: allreduce, %d ranks, backend %s, init %s, %s buffers on %s, %s launch, warmup %d, iters %d (median; ours and MPI alternate)\n",
                n, backend.c_str(), launch_info().method.c_str(), buffers.c_str(), device.str().c_str(),
                launch_text.c_str(), warmup, iters);
    if (mpi_reference) std::printf("# MPI reference: MPI_Allreduce of %s\n", mpi_library.c_str());
    std::printf("# memcpy bandwidth (rank 0, 64 MiB, same run): %.2f GB/s, copies #wrong %lld\n", memcpy_gbps,
                static_cast<long long>(memcpy_wrong));
    if (stream_measured) {
      std::printf("# stream rank 0 -> 1 (1 MiB messages, this backend's send/recv): %.2f GB/s\n", stream_gbps);
    }
    std::printf("#\n# %10s %12s %8s %6s | %10s %8s %8s %7s |%s\n", "size", "count", "type", "redop",
                "time", "algbw", "busbw", "#wrong",
                mpi_reference ? "   MPI time  MPI busbw  #wrong | busbw ratio" : "");
    std::printf("# %10s %12s %8s %6s | %10s %8s %8s %7s |%s\n", "(B)", "(elements)", "", "", "(us)",
                "(GB/s)", "(GB/s)", "", mpi_reference ? "       (us)     (GB/s)         |  ours/MPI" : "");
  }

  nlohmann::json rows = nlohmann::json::array();
  int64_t total_wrong = 0;
  std::vector<float> pristine(capacity), private_data;
  for (size_t i = 0; i < capacity; ++i) pristine[i] = input_value(rank, i);
  std::shared_ptr<SymmetricBuffer> symmetric;
  float* data = nullptr;  // what ours and MPI_Allreduce reduce in place
  if (buffers == "symmetric") {
    symmetric = pg->allocate_symmetric(capacity * sizeof(float));
    if (!symmetric) {
      if (rank == 0) std::fprintf(stderr, "comm_sweep: backend %s cannot allocate symmetric memory "
                                          "(ring backend, all ranks on one host); use --buffers private\n",
                                  backend.c_str());
      return 2;
    }
    data = static_cast<float*>(symmetric->data());
  } else {
    private_data.resize(capacity);
    data = private_data.data();
  }
  DataPtr device_data;  // --device cuda: our buffer; `data` is then MPI's and the check's
  if (device.is_cuda()) {
    if (symmetric) {
      if (rank == 0) std::fprintf(stderr, "comm_sweep: --buffers symmetric is host memory; drop it with --device cuda\n");
      return 2;
    }
    device_data = allocate_bytes(capacity * sizeof(float), device);
  }

  for (uint64_t bytes = min_bytes; bytes <= max_bytes; bytes *= 2) {
    const size_t count = bytes / sizeof(float);
    // Above 16 MiB, fewer repetitions (the same bytes as iters at 16 MiB), at least 5,
    // but never more than --iters (with --iters 3 they used to become 5).
    const size_t kLarge = size_t{16} << 20;
    const int reps = bytes > kLarge
                         ? std::min(iters, std::max(5, static_cast<int>(static_cast<size_t>(iters) * kLarge / bytes)))
                         : iters;
    // One repetition of one implementation: restore the input (untimed), line the
    // ranks up, time the call, check every element.
    struct Samples {
      std::vector<double> times;
      int64_t wrong = 0;
    };
    // The ranks are lined up by the same barrier before ours and before MPI's, so that
    // both times include the same release skew (at 8 B, where a call takes a few
    // microseconds, two barrier implementations would differ by as much as the calls):
    // MPI_Barrier when MPI runs beside us, else ours.
    auto line_up = [&] {
      if (mpi_reference) {
        std::lock_guard<std::mutex> lock(mpi_call_mutex());
        MPI_Barrier(MPI_COMM_WORLD);
      } else {
        pg->barrier().wait();
      }
    };
    auto repeat_once = [&](Samples& samples, bool timed, auto&& allreduce) {
      std::memcpy(data, pristine.data(), count * sizeof(float));
      line_up();
      auto t0 = std::chrono::steady_clock::now();
      allreduce();
      double t = Seconds(std::chrono::steady_clock::now() - t0).count();
      if (!timed) return;
      samples.times.push_back(t);
      for (size_t i = 0; i < count; ++i) samples.wrong += data[i] != expected_sum(n, i);
    };
    auto ours_once = [&](Samples& samples, bool timed) {
      if (device.is_cuda()) {
        copy_host_to_device(device_data.get(), pristine.data(), count * sizeof(float), device.index);
        line_up();
        auto t0 = std::chrono::steady_clock::now();
        pg->allreduce({device_data.get(), count, DType::kFloat32, device}, ReduceOp::kSum, launch).wait();
        double t = Seconds(std::chrono::steady_clock::now() - t0).count();
        if (!timed) return;
        samples.times.push_back(t);
        copy_device_to_host(data, device_data.get(), count * sizeof(float), device.index);
        for (size_t i = 0; i < count; ++i) samples.wrong += data[i] != expected_sum(n, i);
        return;
      }
      repeat_once(samples, timed, [&] { pg->allreduce({data, count, DType::kFloat32}, ReduceOp::kSum, launch).wait(); });
    };
    auto mpi_once = [&](Samples& samples, bool timed) {
      repeat_once(samples, timed, [&] {
        std::lock_guard<std::mutex> lock(mpi_call_mutex());
        MPI_Allreduce(MPI_IN_PLACE, data, static_cast<int>(count), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      });
    };
    auto summarize = [&](const Samples& samples) {
      // the slowest rank's median is the collective's time
      double slowest = median(samples.times);
      int64_t wrong = samples.wrong;
      pg->allreduce({&slowest, 1, DType::kFloat64}, ReduceOp::kMax).wait();
      pg->allreduce({&wrong, 1, DType::kInt64}, ReduceOp::kSum).wait();
      Result result;
      result.time_us = slowest * 1e6;
      result.algbw = bytes / slowest / 1e9;
      result.busbw = result.algbw * 2.0 * (n - 1) / n;
      result.wrong = wrong;
      return result;
    };
    // Ours and MPI alternate repetition by repetition, so that this VM's drift (its
    // memcpy rate moves by 2x within minutes) falls on both alike.
    Samples ours_samples, mpi_samples;
    for (int rep = 0; rep < warmup + reps; ++rep) {
      ours_once(ours_samples, rep >= warmup);
      if (mpi_reference) mpi_once(mpi_samples, rep >= warmup);
    }
    Result ours = summarize(ours_samples);
    Result mpi;
    if (mpi_reference) mpi = summarize(mpi_samples);
    total_wrong += ours.wrong + mpi.wrong;
    if (rank == 0) {
      std::printf("  %10zu %12zu %8s %6s | %10.2f %8.3f %8.3f %7lld |", bytes, count, "float", "sum",
                  ours.time_us, ours.algbw, ours.busbw, static_cast<long long>(ours.wrong));
      if (mpi_reference) {
        // The busbw ratio, taken from the times: the same for two or more ranks, and a
        // number at one rank too, whose busbw is 0 (0 / 0 printed -nan).
        std::printf(" %10.2f %10.3f %7lld | %8.2f", mpi.time_us, mpi.busbw,
                    static_cast<long long>(mpi.wrong), mpi.time_us / ours.time_us);
      }
      std::printf("\n");
      std::fflush(stdout);
      nlohmann::json row{{"bytes", bytes}, {"time_us", ours.time_us}, {"busbw", ours.busbw},
                         {"algbw", ours.algbw}, {"wrong", ours.wrong}, {"reps", reps}};
      if (mpi_reference) {
        row["mpi_time_us"] = mpi.time_us;
        row["mpi_busbw"] = mpi.busbw;
        row["mpi_wrong"] = mpi.wrong;
      }
      rows.push_back(row);
    }
  }

  const double memcpy_after_gbps = measure_memcpy();
  pg->allreduce({&memcpy_wrong, 1, DType::kInt64}, ReduceOp::kSum).wait();  // rank 0's, told to all
  total_wrong += memcpy_wrong;
  const double stream_after_gbps = stream_measured ? measure_stream() : 0.0;
  if (stream_measured) {
    pg->allreduce({&stream_wrong, 1, DType::kInt64}, ReduceOp::kSum).wait();
    total_wrong += stream_wrong;
  }
  if (rank == 0) {
    std::printf("# memcpy bandwidth after the sweep: %.2f GB/s (before: %.2f); copies #wrong %lld (both)\n",
                memcpy_after_gbps, memcpy_gbps, static_cast<long long>(memcpy_wrong));
    if (stream_measured) {
      std::printf("# stream rank 0 -> 1 after the sweep: %.2f GB/s (before: %.2f); messages' #wrong %lld\n",
                  stream_after_gbps, stream_gbps, static_cast<long long>(stream_wrong));
    }
    // The targets (host buffers), computed from the rows above.
    if (mpi_reference && device.is_cpu()) {
      double min_ratio = 1e9;
      double min_busbw = 1e9;
      for (const auto& row : rows) {
        size_t b = row["bytes"];
        if (b >= (1u << 20) && b <= (64u << 20)) {
          min_ratio = std::min(min_ratio, row["busbw"].get<double>() / row["mpi_busbw"].get<double>());
          min_busbw = std::min(min_busbw, row["busbw"].get<double>());
        }
      }
      if (min_ratio < 1e9) {
        std::printf("# target: busbw >= 1.25x MPI at every size from 1 to 64 MiB: worst ratio %.2f -> %s\n",
                    min_ratio, min_ratio >= 1.25 ? "met" : "MISSED");
        std::printf("# target: busbw >= memcpy/2 = %.2f GB/s at every size from 1 to 64 MiB: worst %.2f GB/s -> %s\n",
                    memcpy_gbps / 2, min_busbw, min_busbw >= memcpy_gbps / 2 ? "met" : "MISSED");
      }
      const auto& first = rows.front();
      if (first["bytes"].get<size_t>() == 8) {
        double ratio = first["time_us"].get<double>() / first["mpi_time_us"].get<double>();
        std::printf("# target: 8 B latency <= 2x MPI: %.2f us vs %.2f us = %.2fx -> %s\n",
                    first["time_us"].get<double>(), first["mpi_time_us"].get<double>(), ratio,
                    ratio <= 2.0 ? "met" : "MISSED");
      }
    }
    std::printf("# total #wrong: %lld\n", static_cast<long long>(total_wrong));
    if (!json_path.empty()) {
      const std::string text = nlohmann::json{{"ranks", n}, {"backend", backend}, {"buffers", buffers}, {"device", device.str()}, {"launch", launch_text}, {"memcpy_gbps", memcpy_gbps}, {"memcpy_after_gbps", memcpy_after_gbps},
                                             {"mpi_library", mpi_reference ? nlohmann::json(mpi_library) : nlohmann::json(nullptr)},
                                             {"stream_gbps", stream_measured ? nlohmann::json(stream_gbps) : nlohmann::json(nullptr)},
                                             {"stream_after_gbps", stream_measured ? nlohmann::json(stream_after_gbps) : nlohmann::json(nullptr)},
                                             {"rows", rows}}.dump(1);
      if (std::string error = bench::write_text_file("--json", json_path, text); !error.empty()) {
        std::fprintf(stderr, "comm_sweep: %s\n", error.c_str());
        return 2;
      }
    }
  }
  symmetric.reset();
  pg.reset();
  return total_wrong == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  // Every error after parsing ends here: printed, and the other ranks told
  // (ProcessGroup::abort) so that they fail with it instead of a timeout.
  std::shared_ptr<ProcessGroup> pg;
  try {
    return run(argc, argv, pg);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "comm_sweep: %s\n", e.what());
    if (pg) pg->abort(e.what());
    return 2;
  }
}
