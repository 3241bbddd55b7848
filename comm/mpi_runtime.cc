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

MpiComm::~MpiComm() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (comm_ != MPI_COMM_NULL && !finalized) MPI_Comm_free(&comm_);
}

MpiComm& MpiComm::operator=(MpiComm&& other) noexcept {
  if (this != &other) {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (comm_ != MPI_COMM_NULL && !finalized) MPI_Comm_free(&comm_);
    comm_ = other.comm_;
    other.comm_ = MPI_COMM_NULL;
  }
  return *this;
}

}  // namespace ringtrain::comm
