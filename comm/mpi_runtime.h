// mpi_runtime.h: MPI's process-wide state, owned once.
//
// defines: ensure_mpi_initialized (MPI_Init_thread once, MPI_Finalize at exit),
//          mpi_call_mutex (serializes MPI calls when MPI_THREAD_MULTIPLE was not
//          granted), MpiComm (RAII over an MPI communicator, move-only).
//
// Both the mpi:// init method (which uses MPI only to share the store address)
// and the mpi backend go through here, so MPI is initialized exactly once and
// finalized exactly once, after every MpiComm is gone.
#pragma once

#include <mpi.h>

#include <mutex>

namespace ringtrain::comm {

void ensure_mpi_initialized();
// True when MPI granted MPI_THREAD_MULTIPLE (then the mutex is still used; it is cheap),
// except around calls that may wait for the peers (MPI_Comm_split, MPI_Comm_dup,
// MPI_Comm_free), which take it only without MPI_THREAD_MULTIPLE.
bool mpi_thread_multiple();
std::mutex& mpi_call_mutex();

class MpiComm {
 public:
  MpiComm() = default;
  explicit MpiComm(MPI_Comm comm) : comm_(comm) {}
  ~MpiComm();
  MpiComm(MpiComm&& other) noexcept : comm_(other.comm_) { other.comm_ = MPI_COMM_NULL; }
  MpiComm& operator=(MpiComm&& other) noexcept;
  MpiComm(const MpiComm&) = delete;
  MpiComm& operator=(const MpiComm&) = delete;

  MPI_Comm get() const { return comm_; }

 private:
  void free();  // MPI_Comm_free, serialized with the other MPI calls (see mpi_call_mutex)

  MPI_Comm comm_ = MPI_COMM_NULL;
};

}  // namespace ringtrain::comm
