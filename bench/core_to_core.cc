// core_to_core.cc: how fast data moves between two CPU cores of this machine — the roof
// of every shared-memory collective, and the number that says which mode a VM is in.
//
// Two threads, pinned to two CPUs, measure:
//   * latency: one cache line bounced between them (a release store, an acquire spin on the
//     other side), half the round trip;
//   * stream bandwidth: a producer copies a message into a ring of fixed-size slots and
//     publishes each slot; the consumer copies it out and frees the slot — the shape of
//     ShmTransport (comm/shm_transport.cc), with its copy routine (comm::copy_bytes) and its
//     default slots (128 KiB x 8). Every message is checked on arrival (#wrong).
//   * single-core memcpy of 64 MiB, for comparison (the memory system, not the interconnect),
//     through the same copy routine, its result compared with the source afterwards.
// Bandwidths are medians over --reps repetitions; the latency is the mean over 20000 round
// trips of one measurement (a single trip is too short for the clock).
//
// Why it exists: on the 2-vCPU VM this project is developed on, the ring allreduce has a
// "slow mode" in which it runs at half speed while memcpy does not change. Run alternately
// with comm_sweep, this probe showed the stream between the two cores halving (14 -> 6 GB/s)
// and the line latency quadrupling (55 -> 200 ns) at exactly those times
// (docs/collective-benchmark.md): the vCPUs' placement on the host, not our code.
//
//   build/bench/core_to_core                 # the first two CPUs this process may run on
//   build/bench/core_to_core --cpus 2,5 --message 4M --reps 100
//
// "May run on" is the process's affinity mask (sched_getaffinity), which a cgroup cpuset
// (a container's --cpuset-cpus, a SLURM allocation) or taskset narrows; the number of
// CPUs online says nothing about it. With fewer than two CPUs in the mask the probe skips
// (exit 77); --cpus outside it is an error naming the CPUs it holds.
#include <pthread.h>
#include <sched.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "bench/bench_cli.h"
#include "comm/reduce.h"
#include "comm/transport.h"

namespace {

using Clock = std::chrono::steady_clock;

struct alignas(64) Flag {
  std::atomic<uint64_t> value{0};
};

// The CPUs this process may run on, in increasing order (empty if the system does not say).
std::vector<int> allowed_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::vector<int> cpus;
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return cpus;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu)
    if (CPU_ISSET(cpu, &set)) cpus.push_back(cpu);
  return cpus;
}

std::string join_cpus(const std::vector<int>& cpus) {
  std::string text;
  for (int cpu : cpus) text += (text.empty() ? "" : ",") + std::to_string(cpu);
  return text;
}

void pin_to(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  if (pthread_setaffinity_np(pthread_self(), sizeof(set), &set) != 0) {
    throw std::runtime_error("cannot pin a thread to CPU " + std::to_string(cpu) +
                             " (is it in this process's affinity mask? see `taskset -p $$`)");
  }
}

inline void spin_pause() {
#if defined(__x86_64__)
  __builtin_ia32_pause();
#endif
}

// A helper thread pinned to `cpu` before it runs `body`. The caller is pinned first
// and waits for the helper's pin: a failure on either side is an exception on the
// calling thread with the helper joined (never std::terminate, never a partner
// spinning for a peer that is not coming).
class PinnedThread {
 public:
  template <typename Body>
  PinnedThread(int caller_cpu, int cpu, Body body) {
    pin_to(caller_cpu);
    thread_ = std::thread([this, cpu, body]() mutable {
      try {
        pin_to(cpu);
      } catch (const std::exception& e) {
        error_ = e.what();
        state_.store(kFailed, std::memory_order_release);
        return;
      }
      state_.store(kPinned, std::memory_order_release);
      body();
    });
    int state;
    while ((state = state_.load(std::memory_order_acquire)) == kStarting) spin_pause();
    if (state == kFailed) {
      thread_.join();
      throw std::runtime_error(error_);
    }
  }
  ~PinnedThread() {
    if (thread_.joinable()) thread_.join();
  }
  PinnedThread(const PinnedThread&) = delete;
  PinnedThread& operator=(const PinnedThread&) = delete;
  void join() { thread_.join(); }

 private:
  enum { kStarting, kPinned, kFailed };
  std::atomic<int> state_{kStarting};
  std::string error_;  // written before state_ says kFailed
  std::thread thread_;
};

using ringtrain::bench::median;

// Half the round-trip time of one cache line between the two CPUs, in nanoseconds.
double line_latency_ns(int cpu_a, int cpu_b, int trips) {
  Flag ping, pong;
  PinnedThread other(cpu_a, cpu_b, [&] {
    for (uint64_t i = 1; i <= static_cast<uint64_t>(trips); ++i) {
      while (ping.value.load(std::memory_order_acquire) != i) spin_pause();
      pong.value.store(i, std::memory_order_release);
    }
  });
  auto start = Clock::now();
  for (uint64_t i = 1; i <= static_cast<uint64_t>(trips); ++i) {
    ping.value.store(i, std::memory_order_release);
    while (pong.value.load(std::memory_order_acquire) != i) spin_pause();
  }
  double ns = std::chrono::duration<double, std::nano>(Clock::now() - start).count();
  other.join();
  return ns / trips / 2;
}

struct StreamResult {
  double median_us = 0;
  int wrong = 0;  // messages that arrived different from what was sent
};

// The producer on cpu_a sends `reps` messages through `slots` slots of `slot_bytes`; the
// consumer on cpu_b copies each into its buffer, and checks it once the message is complete.
StreamResult stream(int cpu_a, int cpu_b, size_t message, size_t slot_bytes, size_t slots, int reps) {
  std::vector<unsigned char> source(message), sink(message);
  // slot_bytes <= 1 GiB and slots <= 1024 (checked in main): the product cannot wrap.
  std::unique_ptr<unsigned char, decltype(&std::free)> ring(
      static_cast<unsigned char*>(std::aligned_alloc(64, slot_bytes * slots)), &std::free);
  if (!ring) {
    throw std::runtime_error("cannot allocate the ring of --slots " + std::to_string(slots) + " x --slot-bytes " +
                             ringtrain::bench::format_byte_size(slot_bytes) + ": out of memory; use fewer or smaller slots");
  }
  std::memset(ring.get(), 0, slot_bytes * slots);
  Flag head, tail, round;  // slots published, slots consumed; the round being checked
  std::atomic<int> wrong{0};
  const size_t pieces = (message + slot_bytes - 1) / slot_bytes;
  PinnedThread consumer(cpu_a, cpu_b, [&] {
    uint64_t k = 0;
    for (int r = 0; r < reps; ++r) {
      for (size_t piece = 0; piece < pieces; ++piece, ++k) {
        // Wait for slot k, copy it out, hand it back.
        while (head.value.load(std::memory_order_acquire) <= k) spin_pause();
        const size_t offset = piece * slot_bytes, n = std::min(slot_bytes, message - offset);
        ringtrain::comm::copy_bytes(sink.data() + offset, ring.get() + (k % slots) * slot_bytes, n);
        tail.value.store(k + 1, std::memory_order_release);
      }
      // The whole message has arrived: it must be what round r sent.
      for (size_t i = 0; i < message; ++i)
        if (sink[i] != static_cast<unsigned char>(i * 7 + static_cast<size_t>(r))) {
          wrong.fetch_add(1);
          break;
        }
      round.value.store(static_cast<uint64_t>(r) + 1, std::memory_order_release);
    }
  });
  std::vector<double> times;
  uint64_t k = 0;
  for (int r = 0; r < reps; ++r) {
    // Fill round r's message (untimed), after the consumer checked the previous one.
    while (round.value.load(std::memory_order_acquire) < static_cast<uint64_t>(r)) spin_pause();
    for (size_t i = 0; i < message; ++i) source[i] = static_cast<unsigned char>(i * 7 + static_cast<size_t>(r));
    auto start = Clock::now();
    for (size_t piece = 0; piece < pieces; ++piece, ++k) {
      // Wait for a free slot, fill it, publish it.
      while (k - tail.value.load(std::memory_order_acquire) >= slots) spin_pause();
      const size_t offset = piece * slot_bytes, n = std::min(slot_bytes, message - offset);
      ringtrain::comm::copy_bytes(ring.get() + (k % slots) * slot_bytes, source.data() + offset, n);
      head.value.store(k + 1, std::memory_order_release);
    }
    while (tail.value.load(std::memory_order_acquire) < k) spin_pause();  // all consumed
    times.push_back(std::chrono::duration<double, std::micro>(Clock::now() - start).count());
  }
  consumer.join();
  return {median(times), wrong.load()};
}

struct MemcpyResult {
  double gbps = 0;
  int wrong = 0;  // 1 when the copy's destination is not its source afterwards
};

// Single-core copy of 64 MiB (GB/s), pinned to cpu, through the transport's copy
// routine; the destination is compared with the source after the timed copies (a
// pattern, not a constant, so that a misplaced or partial copy shows).
MemcpyResult memcpy_gbps(int cpu) {
  pin_to(cpu);
  const size_t bytes = size_t{64} << 20;
  std::vector<unsigned char> a(bytes), b(bytes, 0);
  for (size_t i = 0; i < bytes; ++i) a[i] = static_cast<unsigned char>(i * 7 + i / 4093);
  std::vector<double> seconds;
  for (int r = 0; r < 5; ++r) {
    auto start = Clock::now();
    ringtrain::comm::copy_bytes(b.data(), a.data(), bytes);
    seconds.push_back(std::chrono::duration<double>(Clock::now() - start).count());
  }
  return {static_cast<double>(bytes) / median(seconds) / 1e9, std::memcmp(a.data(), b.data(), bytes) == 0 ? 0 : 1};
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"core_to_core: cache-line latency and slot-stream bandwidth between two CPUs, beside memcpy"};
  using ringtrain::comm::ShmLayout;
  std::vector<int> cpus;  // empty: the first two CPUs this process may run on
  uint64_t message = uint64_t{1} << 20, slot_bytes = uint64_t{128} << 10;
  size_t slots = 8;
  int reps = 200;
  app.add_option("--cpus", cpus, "the two CPUs (producer, consumer); default: the first two this process may run on "
                 "(its affinity mask)")
      ->delimiter(',')
      ->expected(2);
  ringtrain::bench::add_byte_size_option(app, "--message", message, "bytes per message", 1);
  // The transport's own bounds (comm/transport.h), which keep slots x slot size within 1 TiB.
  ringtrain::bench::add_byte_size_option(app, "--slot-bytes", slot_bytes,
                                         "slot size, as RINGTRAIN_SHM_SLOT_BYTES: a multiple of 64", 64,
                                         ShmLayout::kMaxSlotBytes)
      ->check(CLI::Validator(
          [](std::string& text) {  // the byte count in digits, after the transform
            return std::stoull(text) % 64 == 0 ? std::string() : text + " bytes is not a multiple of 64 (a cache line)";
          },
          "", "multiple of 64"));
  app.add_option("--slots", slots, "slots in the ring, as RINGTRAIN_SHM_SLOTS")
      ->check(CLI::Range(size_t{1}, static_cast<size_t>(ShmLayout::kMaxSlots)))
      ->capture_default_str();
  app.add_option("--reps", reps, "messages timed (median)")->check(CLI::Range(1, 1000000))->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  try {
    // The message twice (sent, received), the ring, and memcpy's 2 x 64 MiB.
    const std::string too_large = ringtrain::bench::check_fits_in_memory(
        2.0 * static_cast<double>(message) + static_cast<double>(slot_bytes) * static_cast<double>(slots) +
            static_cast<double>(size_t{128} << 20),
        "--message " + ringtrain::bench::format_byte_size(message) + " (twice) with --slots " +
            std::to_string(slots) + " x --slot-bytes " + ringtrain::bench::format_byte_size(slot_bytes));
    if (!too_large.empty()) {
      std::fprintf(stderr, "core_to_core: %s\n", too_large.c_str());
      return 2;
    }
    // The affinity mask, not the CPUs online: in a container or job limited to some
    // CPUs the others are online but cannot be pinned to.
    const std::vector<int> allowed = allowed_cpus();
    if (allowed.size() < 2) {
      std::printf("SKIP: core_to_core needs two CPUs this process may run on; its affinity mask is {%s}\n",
                  join_cpus(allowed).c_str());
      return 77;
    }
    if (cpus.empty()) cpus = {allowed[0], allowed[1]};
    auto may_run_on = [&](int cpu) { return std::find(allowed.begin(), allowed.end(), cpu) != allowed.end(); };
    if (cpus[0] == cpus[1] || !may_run_on(cpus[0]) || !may_run_on(cpus[1])) {
      std::fprintf(stderr,
                   "core_to_core: --cpus %d,%d: needs two different CPUs this process may run on; its affinity mask "
                   "is {%s}\n",
                   cpus[0], cpus[1], join_cpus(allowed).c_str());
      return 2;
    }
    const double latency = line_latency_ns(cpus[0], cpus[1], 20000);
    const StreamResult s = stream(cpus[0], cpus[1], message, slot_bytes, slots, reps);
    const MemcpyResult copy = memcpy_gbps(cpus[0]);
    std::printf("# core_to_core: CPUs %d -> %d, message %zu B through %zu x %zu B slots, %d reps (median)\n",
                cpus[0], cpus[1], message, slots, slot_bytes, reps);
    const int wrong = s.wrong + copy.wrong;
    std::printf("cache-line latency %.0f ns | stream %.1f us = %.2f GB/s, messages wrong %d | memcpy 64 MiB on CPU "
                "%d %.2f GB/s, copy wrong %d | #wrong %d\n",
                latency, s.median_us, static_cast<double>(message) / s.median_us / 1e3, s.wrong, cpus[0], copy.gbps,
                copy.wrong, wrong);
    return wrong == 0 ? 0 : 1;
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "core_to_core: out of memory for --message %s; use a smaller one\n",
                 ringtrain::bench::format_byte_size(message).c_str());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "core_to_core: %s\n", e.what());
    return 2;
  }
}
