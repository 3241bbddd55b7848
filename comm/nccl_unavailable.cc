// The build without CUDA: the nccl backend exists by name and says why it cannot run.
#include "comm/backends.h"

namespace ringtrain::comm {

std::shared_ptr<ProcessGroup> make_nccl_process_group(GroupContext) {
  throw CommError("the nccl backend needs a CUDA build: this build has no CUDA; rebuild with "
                  "-DRINGTRAIN_CUDA=ON, or use the ring or mpi backend");
}

bool nccl_is_built() { return false; }

}  // namespace ringtrain::comm
