// comm_worker: one rank of a small job, for the rendezvous and fault-injection
// tests driven by run_workers.sh (which starts the ranks by hand, so that no
// launcher kills the survivors before they report).
//
//   comm_worker --mode check      init, allreduce + sub-group check, then a send/recv between
//                                 ranks 0 and 1 only and one more allreduce, print "ok" (with
//                                 RINGTRAIN_DEBUG_COLLECTIVES=1: the point-to-point pair must
//                                 not throw the ranks' collective numbering out of step)
//   comm_worker --mode kill       rank --victim SIGKILLs itself in the middle of a 16 MiB allreduce
//                                 (--symmetric: of a symmetric buffer, the direct path;
//                                 --blocking: launched Launch::kBlocking, so it runs on
//                                 the main thread and the failure is thrown by the call)
//   comm_worker --mode throw      rank --victim throws an uncaught exception between allreduces
//   comm_worker --mode abort      a side thread of rank --victim calls ProcessGroup::abort() while
//                                 its allreduces run; the victim's own failure must carry the
//                                 reason too (else it prints "FAIL-VICTIM")
//   comm_worker --mode mismatch   rank --victim issues a broadcast where the others allreduce
//                                 (run with RINGTRAIN_DEBUG_COLLECTIVES=1)
//   comm_worker --mode kill_before rank --victim SIGKILLs itself before it issues an allreduce
//                                 (with RINGTRAIN_DEBUG_COLLECTIVES=1: the others wait in the
//                                 debug check, not in the ring)
//   comm_worker --mode stall      rank --victim + 1 sleeps 6 s before an allreduce and rank
//                                 --victim 1 s (run with RINGTRAIN_TIMEOUT_SEC=2): a rank times
//                                 out and the rest must say so, not that it died
//   comm_worker --mode split_dead rank --victim SIGKILLs itself; the others call split()
//   comm_worker --mode split_mismatch  rank --victim allreduces where the others call
//                                 split() (debug mode): every rank must name the mismatch
//   comm_worker --mode sub_mismatch   split by rank % 2; in the odd group the last rank
//                                 broadcasts where the others allreduce (debug mode); the
//                                 odd ranks print their error and every rank exits 0
//   comm_worker --mode abort_stuck_store   (2 ranks) rank 1 SIGSTOPs rank 0, which runs the
//                                 store, calls abort() and times it: it must return within
//                                 seconds, not after the store's one-minute I/O timeout
//   comm_worker --mode reinit      the world group destroyed and made again twice in this
//                                 process, an allreduce in each (destroy_process_group +
//                                 init_process_group, as PyTorch test suites do)
//   comm_worker --mode broadcast  a broadcast of 3 MiB + 26 bytes (float16) and of 3 MiB + 52
//                                 bytes (int32) from every root, then a 3 MiB + 4 byte allreduce,
//                                 each checked byte for byte against a naive reference; prints
//                                 "rank R: broadcast ok" (run with odd RINGTRAIN_SHM_SLOT_BYTES: a
//                                 middle rank receives the root's one message in 1 MiB segments)
//   comm_worker --mode symmetric_dead  rank --victim SIGKILLs itself; the others call
//                                 allocate_symmetric() and wait for its segment
//   comm_worker --mode symmetric_dead_mapping  rank --victim dies inside allocate_symmetric(),
//                                 once its segment is in /dev/shm (a thread watches for it),
//                                 while it waits for the others' segments; they come 1 s late,
//                                 find its segment, map it, and wait for it to map theirs.
//                                 Both modes print "rank R pid P" first (ringrun's /dev/shm
//                                 cleanup test looks for files with those pids)
//   comm_worker --mode symmetric_alone  rank --victim (env:// init, its RINGTRAIN_TIMEOUT_SEC
//                                 set to 2 by the worker) calls allocate_symmetric() while the
//                                 others wait in a barrier: its timeout must fail the group, so
//                                 the others fail with its reason, not "rank 1 died"
// In check mode, COMM_WORKER_EXIT_AT_ONCE=1 makes a rank _exit(0) after its "ok", group
// and store connection left as they are (as if killed after its last collective).
// Survivors print "rank R failed after X ms: <error>" and exit 3.
#include <signal.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>
#include <span>
#include <thread>
#include <vector>

#include "comm/init.h"
#include "comm/symmetric_memory.h"

using namespace ringtrain;
using namespace ringtrain::comm;

int main(int argc, char** argv) {
  CLI::App app{"comm_worker: a rank for rendezvous and fault-injection tests"};
  std::string mode = "check";
  std::string backend = "ring";
  std::string init_method = "auto";
  int victim = 1;
  bool symmetric = false;
  bool blocking = false;
  app.add_flag("--symmetric", symmetric, "kill/throw/mismatch: allreduce a symmetric buffer");
  app.add_flag("--blocking", blocking, "kill/throw/mismatch: launch the allreduces Launch::kBlocking");
  app.add_option("--mode", mode)->check(CLI::IsMember(
      {"check", "kill", "throw", "abort", "mismatch", "kill_before", "stall", "split_dead",
       "sub_mismatch", "abort_stuck_store", "reinit", "split_setup_failure", "split_mismatch",
       "broadcast", "symmetric_dead", "symmetric_dead_mapping", "symmetric_alone"}));
  app.add_option("--backend", backend);
  app.add_option("--init", init_method);
  app.add_option("--victim", victim);
  CLI11_PARSE(app, argc, argv);

  if (mode == "symmetric_alone" && std::getenv("RANK") && std::atoi(std::getenv("RANK")) == victim) {
    setenv("RINGTRAIN_TIMEOUT_SEC", "2", 1);  // the others keep the default (minutes)
  }
  InitOptions options;
  options.backend = backend;
  options.init_method = init_method;
  auto pg = init_process_group(options);
  const int rank = pg->rank();
  const int n = pg->size();

  if (mode == "check") {
    std::vector<float> data(100003, static_cast<float>(rank + 1));
    pg->allreduce({data.data(), data.size(), DType::kFloat32}).wait();
    auto sub = pg->split(rank % 2, rank);
    int32_t one = 1;
    sub->allreduce({&one, 1, DType::kInt32}).wait();
    // A send/recv between ranks 0 and 1 only, then one more collective of everyone.
    if (n >= 2 && rank <= 1) {
      int32_t token = rank == 0 ? 42 : 0;
      if (rank == 0) pg->send({&token, 1, DType::kInt32}, 1).wait();
      if (rank == 1) pg->recv({&token, 1, DType::kInt32}, 0).wait();
      if (token != 42) {
        std::cerr << "rank " << rank << ": recv got " << token << " (want 42)\n";
        return 1;
      }
    }
    int32_t count = 1;
    pg->allreduce({&count, 1, DType::kInt32}).wait();
    if (count != n) {
      std::cerr << "rank " << rank << ": the allreduce after send/recv gave " << count << " (want " << n << ")\n";
      return 1;
    }
    const float want = static_cast<float>(n * (n + 1) / 2);
    if (data.front() != want || data.back() != want || one != sub->size()) {
      std::cerr << "rank " << rank << ": wrong result " << data.front() << " (want " << want << ")\n";
      return 1;
    }
    // mpi:// and file://: rank 0 reaches its own store over loopback, but must publish
    // for the mesh the address the other ranks reached the store at (a peer on
    // another host cannot use 127.0.0.1).
    const std::string method = launch_info().method;
    if (rank == 0 && n > 1 && pg->backend_name() == std::string("ring") &&
        (method == "mpi" || method == "file")) {
      auto mesh = nlohmann::json::parse(pg->store().get("rt/world/ring/mesh/0", std::chrono::seconds(5)));
      if (mesh["addr"] != launch_info().master_addr) {
        std::cerr << "rank 0: published mesh address " << mesh["addr"] << ", but the ranks reach rank 0 at "
                  << launch_info().master_addr << "\n";
        return 1;
      }
    }
    std::cout << "rank " << rank << " of " << n << ": ok (init " << launch_info().method
              << ", backend " << pg->backend_name() << ")" << std::endl;
    // COMM_WORKER_EXIT_AT_ONCE=1: leave without destroying the group (no check-out, no
    // goodbye to the store), as a rank killed after its last collective; rank 0 must
    // not wait the shutdown's whole minute for it.
    if (const char* at_once = std::getenv("COMM_WORKER_EXIT_AT_ONCE"); at_once && std::string(at_once) == "1") {
      _exit(0);
    }
    return 0;
  }

  const auto start = std::chrono::steady_clock::now();
  auto report = [&](const std::exception& e) {
    auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start);
    std::cerr << "rank " << rank << " failed after " << ms.count() << " ms: " << e.what() << std::endl;
    return 3;
  };
  if (mode == "broadcast") {
    // Element i of root r's buffer: a pattern no other root or offset shares, so a
    // piece landing at the wrong offset (or from the wrong message) shows.
    auto pattern = [](int root, size_t i) { return static_cast<uint16_t>(i * 2654435761u + root * 40503u + 1); };
    int bad = 0;
    try {
      for (DType dtype : {DType::kFloat16, DType::kInt32}) {
        const size_t element = dtype_size(dtype);
        const size_t count = (size_t{3} << 20) / element + 13;  // 3 MiB + 13 elements
        std::vector<char> buffer(count * element), want(count * element);
        for (int root = 0; root < n; ++root) {
          // raw 16-bit patterns (the broadcast moves bytes: any float16 bits survive)
          auto fill = [&](std::vector<char>& bytes, int who) {
            for (size_t i = 0; i < bytes.size() / 2; ++i) {
              const uint16_t v = pattern(who, i);
              std::memcpy(bytes.data() + 2 * i, &v, 2);
            }
          };
          fill(buffer, rank == root ? root : n + rank);  // non-roots start with other bytes
          fill(want, root);
          pg->broadcast({buffer.data(), count, dtype}, root).wait();
          if (buffer != want) {
            size_t first = 0;
            while (buffer[first] == want[first]) ++first;
            std::cerr << "rank " << rank << ": broadcast of " << buffer.size() << " bytes (" << dtype_name(dtype)
                      << ") from root " << root << " differs from the root's first at byte " << first << "\n";
            ++bad;
          }
        }
      }
      // the allreduce over the same transport: 3 MiB + 4 bytes of int32
      std::vector<int32_t> values((size_t{3} << 20) / 4 + 1);
      for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<int32_t>((i * 7 + rank * 3) % 101);
      pg->allreduce({values.data(), values.size(), DType::kInt32}).wait();
      for (size_t i = 0; i < values.size(); ++i) {
        int32_t want = 0;
        for (int r = 0; r < n; ++r) want += static_cast<int32_t>((i * 7 + r * 3) % 101);
        if (values[i] != want) {
          std::cerr << "rank " << rank << ": allreduce element " << i << " is " << values[i] << ", want " << want << "\n";
          ++bad;
          break;
        }
      }
    } catch (const std::exception& e) {
      return report(e);
    }
    if (bad > 0) return 1;
    std::cout << "rank " << rank << ": broadcast ok" << std::endl;
    return 0;
  }
  if (mode == "reinit") {
    for (int round = 0; round < 3; ++round) {
      if (round > 0) {
        pg.reset();  // every rank checks out; rank 0's store closes once all have
        pg = init_process_group(options);
      }
      int32_t one = 1;
      pg->allreduce({&one, 1, DType::kInt32}).wait();
      if (one != n) {
        std::cerr << "rank " << rank << ": round " << round << " allreduce gave " << one << " (want " << n << ")\n";
        return 1;
      }
    }
    std::cout << "rank " << rank << ": 3 rounds ok" << std::endl;
    return 0;
  }
  if (mode == "abort_stuck_store") {
    if (rank == 0) pg->store().set("test/pid0", std::to_string(getpid()));
    pg->barrier().wait();
    if (rank == 1) {
      const pid_t pid0 = std::stoi(pg->store().get("test/pid0", std::chrono::seconds(10)));
      kill(pid0, SIGSTOP);
      const auto t0 = std::chrono::steady_clock::now();
      pg->abort("injected: rank 0 stopped answering");
      const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      kill(pid0, SIGCONT);
      std::cout << "rank 1 abort() returned after " << took << " s" << std::endl;
      return took < 10 ? 0 : 1;
    }
    if (rank == 0) {
      try {
        std::vector<float> x(16, 1.0f);
        pg->allreduce({x.data(), x.size(), DType::kFloat32}).wait();
      } catch (const std::exception& e) {
        std::cout << "rank 0 saw: " << e.what() << std::endl;
      }
    }
    return 0;
  }
  if (mode == "symmetric_dead" || mode == "symmetric_dead_mapping") {
    std::cout << "rank " << rank << " pid " << getpid() << std::endl;
    pg->barrier().wait();
    if (rank == victim && mode == "symmetric_dead") {
      std::cerr << "victim: SIGKILL now" << std::endl;
      raise(SIGKILL);
    }
    if (rank == victim) {
      // die once this process's symmetric segment exists (and is published, 100 ms
      // later), while this rank waits for the others' segments: they are a second late
      std::thread([] {
        const std::string mine = "-p" + std::to_string(getpid()) + "-sym-";
        while (true) {
          for (const auto& file : std::filesystem::directory_iterator("/dev/shm")) {
            if (file.path().filename().string().find(mine) != std::string::npos) {
              std::this_thread::sleep_for(std::chrono::milliseconds(100));
              std::cerr << "victim: SIGKILL now, in allocate_symmetric (" << file.path().string() << ")" << std::endl;
              raise(SIGKILL);
            }
          }
          std::this_thread::sleep_for(std::chrono::milliseconds(1));
        }
      }).detach();
    }
    if (rank != victim && mode == "symmetric_dead_mapping") std::this_thread::sleep_for(std::chrono::seconds(1));
    try {
      pg->allocate_symmetric(1 << 20);
    } catch (const std::exception& e) {
      return report(e);
    }
    std::cerr << "rank " << rank << ": no failure was observed" << std::endl;
    return 0;
  }
  if (mode == "symmetric_alone") {
    pg->barrier().wait();
    try {
      if (rank == victim) {
        pg->allocate_symmetric(1 << 20);  // alone: times out after 2 s
      } else {
        pg->barrier().wait();  // where the victim is not: fails once the victim gives up
      }
    } catch (const std::exception& e) {
      return report(e);
    }
    std::cerr << "rank " << rank << ": no failure was observed" << std::endl;
    return 0;
  }
  if (mode == "split_dead" || mode == "split_setup_failure") {
    // split_dead: the victim dies before the split. split_setup_failure: the victim cannot
    // build its part of the sub-group (a slot size it refuses); the others, waiting for it
    // in the sub-group's setup, must hear why within seconds.
    pg->barrier().wait();
    if (rank == victim) {
      if (mode == "split_dead") raise(SIGKILL);
      setenv("RINGTRAIN_SHM_SLOT_BYTES", "100", 1);
    }
    try {
      pg->split(0, rank);
    } catch (const std::exception& e) {
      return report(e);
    }
    std::cerr << "rank " << rank << ": no failure was observed" << std::endl;
    return 0;
  }
  if (mode == "split_mismatch") {
    std::vector<float> values(10, 1.0f);
    try {
      pg->allreduce({values.data(), values.size(), DType::kFloat32}).wait();  // the same everywhere
      if (rank == victim) {
        pg->allreduce({values.data(), values.size(), DType::kFloat32}).wait();
      } else {
        pg->split(0, rank);
      }
    } catch (const std::exception& e) {
      return report(e);
    }
    std::cerr << "rank " << rank << ": no error (the mismatch went unseen)" << std::endl;
    return 0;
  }
  if (mode == "sub_mismatch") {
    auto sub = pg->split(rank % 2, rank);
    std::vector<float> values(10, 1.0f);
    if (rank % 2 == 1) {
      try {
        if (sub->rank() == sub->size() - 1) {
          sub->broadcast({values.data(), values.size(), DType::kFloat32}, 0).wait();
        } else {
          sub->allreduce({values.data(), values.size(), DType::kFloat32}).wait();
        }
      } catch (const std::exception& e) {
        report(e);
      }
    }
    return 0;
  }
  std::vector<float> private_data((16u << 20) / sizeof(float), 1.0f);
  std::span<float> data(private_data);
  std::shared_ptr<SymmetricBuffer> shared;
  if (symmetric) {
    shared = pg->allocate_symmetric(private_data.size() * sizeof(float));
    if (!shared) throw std::runtime_error("--symmetric: this group has no symmetric memory");
    data = std::span<float>(static_cast<float*>(shared->data()), private_data.size());
    std::fill(data.begin(), data.end(), 1.0f);
  }
  struct JoinedAtExit {
    std::thread thread;
    ~JoinedAtExit() {
      if (thread.joinable()) thread.join();
    }
  } watchdog;
  try {
    for (int iteration = 0; iteration < 200; ++iteration) {
      if (rank == victim && iteration == 3) {
        if (mode == "kill") {
          // die in the middle of the next allreduce, as kill -9 from outside would
          std::thread([] {
            std::this_thread::sleep_for(std::chrono::milliseconds(5));
            std::cerr << "victim: SIGKILL now" << std::endl;
            raise(SIGKILL);
          }).detach();
        } else if (mode == "abort") {
          // a watchdog on another thread gives up while the next allreduce runs (joined
          // before the group is destroyed: it uses the group)
          watchdog.thread = std::thread([&pg] {
            std::this_thread::sleep_for(std::chrono::milliseconds(5));
            pg->abort("injected abort: the watchdog of rank 1 gave up");
          });
        } else if (mode == "throw") {
          throw std::runtime_error("injected failure: the data loader of rank " + std::to_string(rank) + " broke");
        } else if (mode == "kill_before") {
          std::cerr << "victim: SIGKILL now" << std::endl;
          raise(SIGKILL);
        } else if (mode == "mismatch") {
          pg->broadcast({data.data(), 10, DType::kFloat32}, 0).wait();
          continue;
        }
      }
      if (mode == "stall" && iteration == 3) {
        // (victim + 1) is stuck long past the timeout; victim comes 1 s late
        if (rank == (victim + 1) % n) std::this_thread::sleep_for(std::chrono::seconds(6));
        if (rank == victim) std::this_thread::sleep_for(std::chrono::seconds(1));
      }
      pg->allreduce({data.data(), data.size(), DType::kFloat32}, ReduceOp::kSum,
                    blocking ? Launch::kBlocking : Launch::kAsync)
          .wait();
    }
  } catch (const std::exception& e) {
    // the injected exception must stay uncaught: that is what the test is about
    if (mode == "throw" && rank == victim) throw;
    if (mode == "abort" && rank == victim &&
        std::string(e.what()).find("injected abort") == std::string::npos) {
      std::cerr << "FAIL-VICTIM: rank " << rank << "'s own failure lacks the abort's reason" << std::endl;
    }
    return report(e);
  }
  std::cerr << "rank " << rank << ": no failure was observed" << std::endl;
  return 0;
}
