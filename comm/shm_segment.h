// shm_segment.h: ShmSegment, one mmap'ed POSIX shared-memory segment (RAII).
//
// Used by the shared-memory transport (one inbox segment per rank, see
// shm_transport.cc) and by symmetric memory (symmetric_memory.cc). The creator
// makes it with O_EXCL and sizes it (ftruncate zero-fills it); peers open it by
// name. The name can be unlinked as soon as every peer has mapped it: the mapping
// lives until the last process unmaps it, so a crash leaves nothing in /dev/shm.
#pragma once

#include <cstddef>
#include <string>

namespace ringtrain::comm {

class ShmSegment {
 public:
  // create: make a new segment of `bytes` (fails if the name exists); else open it.
  ShmSegment(const std::string& name, size_t bytes, bool create);
  ~ShmSegment();
  ShmSegment(const ShmSegment&) = delete;
  ShmSegment& operator=(const ShmSegment&) = delete;

  char* base() const { return base_; }
  size_t bytes() const { return bytes_; }
  const std::string& name() const { return name_; }

 private:
  std::string name_;
  size_t bytes_;
  char* base_ = nullptr;
};

}  // namespace ringtrain::comm
