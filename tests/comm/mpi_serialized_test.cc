// MPI initialized by the application with less than MPI_THREAD_MULTIPLE (here
// MPI_THREAD_SERIALIZED, which ensure_mpi_initialized then takes as it is): every MPI
// call of ringtrain must hold mpi_call_mutex, since other groups' comm threads poll
// with MPI_Test meanwhile. Open MPI grants MPI_THREAD_MULTIPLE when ringtrain asks, so
// the other tests never take this path. Runs as one process (under mpirun -np 1).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

#include "comm/mpi_runtime.h"

namespace ringtrain::comm {
namespace {

using namespace std::chrono_literals;

MpiComm new_comm() {
  MPI_Comm dup = MPI_COMM_NULL;
  EXPECT_EQ(MPI_Comm_dup(MPI_COMM_SELF, &dup), MPI_SUCCESS);
  return MpiComm(dup);
}

// `free_it` frees a communicator (MPI_Comm_free inside) on another thread while this
// thread holds mpi_call_mutex, as a comm thread in MPI_Test would: it must wait.
void expect_free_waits_for_the_mutex(const std::function<void()>& free_it) {
  std::atomic<bool> freed{false};
  std::unique_lock<std::mutex> lock(mpi_call_mutex());
  std::thread other([&] {
    free_it();
    freed = true;
  });
  std::this_thread::sleep_for(300ms);
  EXPECT_FALSE(freed) << "MPI_Comm_free ran while another thread held mpi_call_mutex";
  lock.unlock();
  other.join();
  EXPECT_TRUE(freed);
}

TEST(MpiSerialized, TheApplicationsThreadLevelIsTaken) {
  ensure_mpi_initialized();
  EXPECT_FALSE(mpi_thread_multiple());
}

TEST(MpiSerialized, DestroyingACommunicatorHoldsTheMpiMutex) {
  ensure_mpi_initialized();
  auto comm = std::make_unique<MpiComm>(new_comm());
  expect_free_waits_for_the_mutex([&] { comm.reset(); });
}

TEST(MpiSerialized, MoveAssigningOverACommunicatorHoldsTheMpiMutex) {
  ensure_mpi_initialized();
  MpiComm comm = new_comm();
  expect_free_waits_for_the_mutex([&] { comm = MpiComm(); });
  EXPECT_EQ(comm.get(), MPI_COMM_NULL);
}

}  // namespace
}  // namespace ringtrain::comm

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided);
  if (provided != MPI_THREAD_SERIALIZED) {
    std::printf("SKIP: MPI granted thread level %d, not MPI_THREAD_SERIALIZED\n", provided);
    MPI_Finalize();
    return 0;
  }
  const int result = RUN_ALL_TESTS();
  MPI_Finalize();
  return result;
}
