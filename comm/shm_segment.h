// shm_segment.h: ShmSegment, one mmap'ed POSIX shared-memory segment (RAII).
//
// Used by the shared-memory transport (one inbox segment per rank, see
// shm_transport.cc) and by symmetric memory (symmetric_memory.cc). The creator
// makes it with O_EXCL, sizes it (ftruncate zero-fills it) and reserves its pages
// (posix_fallocate: tmpfs reserves nothing at ftruncate, so a full /dev/shm would
// otherwise show up as a SIGBUS at the first write); peers open it by name. The
// name can be unlinked as soon as every peer has mapped it: the mapping lives until
// the last process unmaps it, so a crash leaves nothing in /dev/shm.
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "comm/types.h"
#include "comm/wait_in_slices.h"

namespace ringtrain::comm {

// Some member of a share_shm_segments() call could not create its segment (most
// often: /dev/shm is full or too small). Every member throws it, naming that rank
// and why, so a caller with a fallback (symmetric memory) can take it on every rank.
class ShmCreateError : public CommError {
 public:
  using CommError::CommError;
};

class ShmSegment {
 public:
  // create: make a new segment of `bytes` (fails if the name exists); else open it.
  ShmSegment(const std::string& name, size_t bytes, bool create);
  ~ShmSegment();
  ShmSegment(const ShmSegment&) = delete;
  ShmSegment& operator=(const ShmSegment&) = delete;

  char* base() const { return base_; }

 private:
  size_t bytes_;
  char* base_ = nullptr;
};

class Store;

// Collective among `members` (group ranks on this host, `rank` among them), the
// rendezvous behind the transport's inboxes and symmetric memory:
//   1. each creates its own segment `name` of `bytes` (zero-filled) and publishes
//      name and size in the store under `key`;
//   2. each reads every other member's entry, checks the size, and maps it;
//   3. once every member has mapped every segment (a counter under `key`), each
//      unlinks its own name, so a crash from then on leaves nothing in /dev/shm.
// Sizes must agree: otherwise every member throws "<what>: rank A's shared memory
// segment has X bytes but rank B's has Y; <fix>". A member that cannot create its
// segment publishes why instead of its name, and then every member throws
// ShmCreateError with that reason (none waits for a name that will never come).
// The waits of steps 2 and 3 go in slices until `deadline` (wait_in_slices.h, with
// a last look: a member's published entry or count stays good after it fails);
// between them check_members throws if a member failed or died (a rank killed in
// here is named, with its pid and host, within a second, not after the deadline as
// a store key that "did not appear"). On any failure this rank unlinks its own name, and the
// name of a member that check_members reported lost (it cannot any more); what a
// process killed in here leaves in /dev/shm is ringrun's to remove (docs/comm.md).
// Returns the segments indexed by group rank (nullptr for ranks that are not members).
// Messages name ranks by world rank (world_ranks[group rank]).
std::vector<std::shared_ptr<ShmSegment>> share_shm_segments(
    Store& store, const std::string& key, int rank, int group_size, const std::vector<int>& members,
    const std::vector<int>& world_ranks, const std::string& name, size_t bytes, Deadline deadline,
    const MemberCheck& check_members, const char* what, const char* fix);

}  // namespace ringtrain::comm
