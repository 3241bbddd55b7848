// shm_segment.cc: ShmSegment (see shm_segment.h).
#include "comm/shm_segment.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "comm/types.h"

namespace ringtrain::comm {

ShmSegment::ShmSegment(const std::string& name, size_t bytes, bool create)
    : name_(name), bytes_(bytes) {
  int flags = create ? (O_CREAT | O_EXCL | O_RDWR) : O_RDWR;
  int fd = shm_open(name.c_str(), flags, 0600);
  if (fd < 0) {
    throw CommError(detail::concat("shm_open(", name, ") failed: ", std::strerror(errno),
                                   create ? " (a stale segment from a crashed run? remove /dev/shm"
                                          : " (the owner has not created it)",
                                   create ? name + ")" : ""));
  }
  // The descriptor is closed on every path below; the mapping survives it.
  struct FdCloser {
    int fd;
    ~FdCloser() { ::close(fd); }
  } closer{fd};
  if (create && ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    int err = errno;
    shm_unlink(name.c_str());
    throw CommError(detail::concat("cannot size shared memory segment ", name, " to ", bytes,
                                   " bytes: ", std::strerror(err), " (is /dev/shm full?)"));
  }
  void* base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED) {
    throw CommError(detail::concat("mmap of shared memory segment ", name, " failed: ",
                                   std::strerror(errno)));
  }
  base_ = static_cast<char*>(base);
}

ShmSegment::~ShmSegment() { munmap(base_, bytes_); }

}  // namespace ringtrain::comm
