// init.h: joining the job. The one call a training program makes first.
//
// defines: InitOptions, init_process_group, random_job_token.
//
//   auto pg = ringtrain::comm::init_process_group({.backend = "ring"});
//   pg->allreduce({grad, n, DType::kFloat32}).wait();
//
// Steps: resolve how we were launched (launch_env.h: env://, slurm://, mpi://,
// tcp://, file://, or auto-detected), start the store on world rank 0 and
// connect every rank to it, then build the backend's group (a collective).
// Environment overrides of the options: RINGTRAIN_TIMEOUT_SEC (each collective),
// RINGTRAIN_RENDEZVOUS_TIMEOUT_SEC (joining), RINGTRAIN_DEBUG_COLLECTIVES=1,
// RINGTRAIN_TRANSPORT, RINGTRAIN_INIT_METHOD.
// An uncaught exception on any rank afterwards is published to the store (a
// std::terminate handler), so the other ranks fail with its message.
#pragma once

#include <memory>
#include <string>

#include "comm/launch_env.h"
#include "comm/process_group.h"

namespace ringtrain::comm {

struct InitOptions {
  std::string backend = "ring";       // "ring", "mpi" or "nccl"
  std::string init_method = "auto";   // see resolve_launch
  int rank = -1;                      // tcp:// and file:// only; <0: from the environment
  int world_size = -1;
  ProcessGroupOptions group;          // timeout, debug mode, transport
  // How long joining the job (the store, then the world group's connections, or
  // NCCL's communicator) may take before failing: every rank must have started
  // by then. RINGTRAIN_RENDEZVOUS_TIMEOUT_SEC overrides it.
  std::chrono::milliseconds rendezvous_timeout = std::chrono::minutes(5);
};

std::shared_ptr<ProcessGroup> init_process_group(const InitOptions& options = {});
// What init_process_group resolved for this process (valid after it returned).
const LaunchInfo& launch_info();
// The GPU this process uses unless told otherwise: its local rank modulo the GPUs
// of this node (valid after init_process_group). Throws when no GPU is usable.
int local_cuda_device();
// 32 hex characters from /dev/urandom.
std::string random_job_token();

}  // namespace ringtrain::comm
