// Must NOT compile with -Werror=unused-result (test ddp.no_sync_guard_must_be_kept): a
// no_sync() guard that is not kept in a variable ends at once, so the micro-batches after
// it would be reduced every time.
#include "ddp/distributed_data_parallel.h"

void accumulate(ringtrain::ddp::DistributedDataParallel& ddp) { ddp.no_sync(); }
