// backends.h: the constructors of the three backends, one translation unit each.
//
// defines: make_ring_process_group (ring_process_group.cc, always built),
//          make_mpi_process_group (mpi_process_group.cc, always built: MPI is a
//          required dependency), make_nccl_process_group (nccl_process_group.cc
//          with CUDA; nccl_unavailable.cc, which throws, without).
// Each is a collective over the members of `context`.
#pragma once

#include <memory>

#include "comm/process_group.h"

namespace ringtrain::comm {

std::shared_ptr<ProcessGroup> make_ring_process_group(GroupContext context);
std::shared_ptr<ProcessGroup> make_mpi_process_group(GroupContext context);
std::shared_ptr<ProcessGroup> make_nccl_process_group(GroupContext context);
// True when this build has NCCL (the CUDA build).
bool nccl_is_built();

}  // namespace ringtrain::comm
