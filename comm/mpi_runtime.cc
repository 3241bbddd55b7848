#include "comm/mpi_runtime.h"

#include <cstdlib>

#include "tensor/checks.h"

namespace ringtrain::comm {

namespace {
bool g_thread_multiple = false;

void finalize_at_exit() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}
}  // namespace

void ensure_mpi_initialized() {
  static std::once_flag once;
  std::call_once(once, [] {
    int initialized = 0;
    MPI_CHECK(MPI_Initialized(&initialized));
    if (initialized) {
      int provided = 0;
      MPI_CHECK(MPI_Query_thread(&provided));
      g_thread_multiple = provided == MPI_THREAD_MULTIPLE;
      return;  // the application owns MPI's lifetime
    }
    int provided = 0;
    MPI_CHECK(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided));
    RT_CHECK(provided >= MPI_THREAD_SERIALIZED, "MPI provides thread level ", provided,
             " but ringtrain's comm thread needs at least MPI_THREAD_SERIALIZED");
    g_thread_multiple = provided == MPI_THREAD_MULTIPLE;
    std::atexit(finalize_at_exit);
  });
}

bool mpi_thread_multiple() { return g_thread_multiple; }

std::mutex& mpi_call_mutex() {
  static std::mutex mutex;
  return mutex;
}

// Frees `comm` unless MPI is already finalized. Another group's comm thread may be in
// MPI_Test meanwhile: without MPI_THREAD_MULTIPLE, MPI requires the calls serialized,
// so this takes mpi_call_mutex like every other MPI call. With it, no mutex, as for
// MPI_Comm_split: MPI_Comm_free is a collective in the standard, and one that waited
// for the peers under the mutex would hold every other MPI call of this process.
// (MPI_Finalized may be called from any thread at any time.)
void MpiComm::free() {
  if (comm_ == MPI_COMM_NULL) return;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  std::unique_lock<std::mutex> lock(mpi_call_mutex(), std::defer_lock);
  if (!mpi_thread_multiple()) lock.lock();
  MPI_Comm_free(&comm_);
}

MpiComm::~MpiComm() { free(); }

MpiComm& MpiComm::operator=(MpiComm&& other) noexcept {
  if (this != &other) {
    free();
    comm_ = other.comm_;
    other.comm_ = MPI_COMM_NULL;
  }
  return *this;
}

}  // namespace ringtrain::comm
