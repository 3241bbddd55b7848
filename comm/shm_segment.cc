// shm_segment.cc: ShmSegment (see shm_segment.h).
#include "comm/shm_segment.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>

#include "comm/store.h"
#include "comm/types.h"
#include "comm/wait_in_slices.h"

namespace ringtrain::comm {

ShmSegment::ShmSegment(const std::string& name, size_t bytes, bool create)
    : bytes_(bytes) {
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
  // tmpfs hands out pages only when they are first touched; without this, a full
  // /dev/shm (a container's default is 64 MiB) kills the process with SIGBUS at
  // its first write into the segment, with no message at all.
  if (create) {
    int err = 0;
    do {
      err = posix_fallocate(fd, 0, static_cast<off_t>(bytes));
    } while (err == EINTR);
    if (err != 0) {
      shm_unlink(name.c_str());
      throw CommError(detail::concat(
          "cannot reserve ", bytes, " bytes of shared memory for segment ", name, ": ", std::strerror(err),
          " (/dev/shm is full or too small: see `df -h /dev/shm`; in a container raise it, e.g. "
          "docker run --shm-size=2g)"));
    }
  }
  void* base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED) {
    int err = errno;
    // A segment we created and cannot map would stay in /dev/shm forever: no one
    // else knows its name yet.
    if (create) shm_unlink(name.c_str());
    throw CommError(detail::concat("mmap of shared memory segment ", name, " (", bytes,
                                   " bytes) failed: ", std::strerror(err),
                                   " (too large for this machine? see RINGTRAIN_SHM_SLOT_BYTES "
                                   "and RINGTRAIN_SHM_SLOTS)"));
  }
  base_ = static_cast<char*>(base);
}

ShmSegment::~ShmSegment() { munmap(base_, bytes_); }

std::vector<std::shared_ptr<ShmSegment>> share_shm_segments(
    Store& store, const std::string& key, int rank, int group_size, const std::vector<int>& members,
    const std::vector<int>& world_ranks, const std::string& name, size_t bytes, Deadline deadline,
    const MemberCheck& check_members, const char* what, const char* fix) {
  const Deadline start = Clock::now();
  auto waited_seconds = [&] {
    return std::chrono::duration_cast<std::chrono::seconds>(Clock::now() - start).count();
  };
  std::vector<std::shared_ptr<ShmSegment>> segments(group_size);
  std::vector<nlohmann::json> entries(group_size);
  // 1. ours, zero-filled, its pages reserved. A rank that cannot create it publishes
  //    why in place of its name, so that every rank fails now, the same way.
  std::string create_error;
  try {
    segments[rank] = std::make_shared<ShmSegment>(name, bytes, /*create=*/true);
  } catch (const CommError& e) {
    create_error = e.what();
  }
  try {
    store.set(detail::concat(key, "/", rank),
              create_error.empty() ? nlohmann::json{{"name", name}, {"bytes", bytes}}.dump()
                                   : nlohmann::json{{"error", create_error}}.dump());
    // 2. everyone else's entry; any rank's creation failure fails all of them
    std::string failed = create_error.empty() ? "" : detail::concat("rank ", world_ranks[rank], ": ", create_error);
    for (int r : members) {
      if (r == rank) continue;
      const std::string entry_key = detail::concat(key, "/", r);
      try {
        entries[r] = nlohmann::json::parse(wait_in_slices(
            deadline, check_members, detail::concat("rank ", world_ranks[r], "'s segment (", what, ")"),
            [&](Deadline slice_end) { return store.get(entry_key, std::chrono::milliseconds(millis_until(slice_end))); },
            LastLook::kYes));
      } catch (const CommTimeoutError&) {
        throw CommTimeoutError(detail::concat(
            what, ": rank ", world_ranks[r], " did not create its shared memory segment within ", waited_seconds(),
            " s (rank ", world_ranks[rank], " waited for it): it is stuck before this call, or not every rank of "
            "the group made it (each must, with the same size)"));
      }
      if (failed.empty() && entries[r].contains("error")) {
        failed = detail::concat("rank ", world_ranks[r], ": ", entries[r]["error"].get<std::string>());
      }
    }
    if (!failed.empty()) {
      throw ShmCreateError(detail::concat(what, ": a rank could not create its shared memory segment (",
                                          failed, ")"));
    }
    // then the same size everywhere, and map them
    for (int r : members) {
      if (r == rank) continue;
      const nlohmann::json& entry = entries[r];
      const size_t theirs = entry["bytes"].get<size_t>();
      if (theirs != bytes) {
        throw CommError(detail::concat(what, ": rank ", world_ranks[rank], "'s shared memory segment has ", bytes,
                                       " bytes but rank ", world_ranks[r], "'s has ", theirs, "; ", fix));
      }
      try {
        segments[r] = std::make_shared<ShmSegment>(entry["name"].get<std::string>(), bytes,
                                                   /*create=*/false);
      } catch (const CommError&) {
        // gone: most likely its owner died and a survivor removed it; say so if so
        check_members(detail::concat("rank ", world_ranks[r], "'s segment (", what, "), found gone from /dev/shm"));
        throw;
      }
    }
    // 3. all mapped everywhere: the names can go. The count is what is waited for;
    //    each rank's own mark (set before it counts itself) lets a timeout name the
    //    ranks that never got here.
    const std::string mapped_key = key + "/mapped";
    const auto count = static_cast<int64_t>(members.size());
    store.set(detail::concat(mapped_key, "/", rank), "1");
    store.add(mapped_key, 1);
    try {
      wait_in_slices(
          deadline, check_members, detail::concat("every rank to map the segments (", what, ")"),
          [&](Deadline slice_end) {
            store.wait_at_least(mapped_key, count, std::chrono::milliseconds(millis_until(slice_end)));
            return 0;
          },
          LastLook::kYes);
    } catch (const CommTimeoutError&) {
      const int64_t mapped = store.add(mapped_key, 0);
      std::vector<int> missing;  // world ranks
      for (int r : members) {
        if (!store.try_get(detail::concat(mapped_key, "/", r))) missing.push_back(world_ranks[r]);
      }
      if (missing.empty()) {  // (each counts itself right after its mark: a late one)
        throw CommTimeoutError(detail::concat(what, ": ", mapped, " of ", count,
                                              " ranks had mapped every shared memory segment after ", waited_seconds(),
                                              " s (rank ", world_ranks[rank], " waited for the rest)"));
      }
      std::string names;
      for (int world_rank : missing) names += detail::concat(names.empty() ? "" : ", ", world_rank);
      const bool one = missing.size() == 1;
      throw CommTimeoutError(detail::concat(
          what, ": rank", one ? " " : "s ", names, " had not mapped every shared memory segment after ",
          waited_seconds(), " s (", mapped, " of ", count, " ranks had; rank ", world_ranks[rank], " waited for ",
          one ? "it" : "them", "): ", one ? "it" : "they", " made and published ", one ? "its" : "their",
          " own segment but did not finish mapping the others'; stuck in this call, or failed in it and went on "
          "without the group?"));
    }
  } catch (const PeerLostError& e) {
    if (segments[rank]) shm_unlink(name.c_str());  // not a name we failed to create
    // The lost member cannot remove its name any more (killed): we can, when we read it.
    for (int r : members) {
      if (world_ranks[r] == e.rank() && entries[r].contains("name")) {
        shm_unlink(entries[r]["name"].get<std::string>().c_str());
      }
    }
    throw;
  } catch (...) {
    if (segments[rank]) shm_unlink(name.c_str());
    throw;
  }
  shm_unlink(name.c_str());
  return segments;
}

}  // namespace ringtrain::comm
