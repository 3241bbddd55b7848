// symmetric_memory.cc: SymmetricBuffer::allocate and the address lookups.
//
// Allocation is a small rendezvous through the store, the same one the shared-
// memory transport uses for its inboxes (peer_mesh.cc):
//   1. each rank creates its own segment (sync page + data) and publishes its name
//      and size under `key`;
//   2. each rank reads every peer's entry, checks that all asked for the same size
//      (else every rank throws the same explained error), and maps their segments;
//   3. once everyone has mapped everything (a counter in the store), each rank
//      unlinks its own name, so a crash from then on leaves nothing in /dev/shm.
#include "comm/symmetric_memory.h"

#include <sys/mman.h>
#include <unistd.h>

#include <functional>

#include <nlohmann/json.hpp>

#include "comm/shm_segment.h"
#include "comm/store.h"
#include "comm/transport.h"

namespace ringtrain::comm {

namespace {

constexpr size_t kSyncBytes = 4096;  // the data starts on its own page

size_t round_up_to_page(size_t bytes) { return (bytes + 4095) / 4096 * 4096; }

}  // namespace

std::shared_ptr<SymmetricBuffer> SymmetricBuffer::allocate(PeerMesh& mesh, Store& store,
                                                           const std::string& key, size_t bytes,
                                                           Deadline deadline) {
  RT_CHECK(mesh.all_shared_memory(),
           "symmetric memory needs every rank of the group on this host with the shared-memory "
           "transport (RINGTRAIN_TRANSPORT=auto or shm)");
  static_assert(sizeof(SymmetricSync) <= kSyncBytes);
  const int rank = mesh.rank();
  const int size = mesh.size();
  auto timeout = std::chrono::milliseconds(millis_until(deadline));
  const size_t segment_bytes = kSyncBytes + round_up_to_page(bytes);
  std::shared_ptr<SymmetricBuffer> buffer(new SymmetricBuffer(rank, bytes));
  buffer->segments_.resize(size);

  // 1. our own segment, zero-filled by ftruncate (so every sync counter starts at 0)
  const std::string name = detail::concat(mesh.shm_name_prefix(), "-sym-",
                                          std::hash<std::string>{}(key));
  buffer->segments_[rank] = std::make_shared<ShmSegment>(name, segment_bytes, /*create=*/true);
  try {
    store.set(detail::concat(key, "/", rank),
              nlohmann::json{{"name", name}, {"bytes", bytes}}.dump());
    // 2. everyone's entry: same size, then map it
    for (int r = 0; r < size; ++r) {
      if (r == rank) continue;
      auto entry = nlohmann::json::parse(store.get(detail::concat(key, "/", r), timeout));
      size_t theirs = entry["bytes"].get<size_t>();
      if (theirs != bytes) {
        throw CommError(detail::concat("allocate_symmetric: rank ", rank, " asked for ", bytes,
                                       " bytes but rank ", r, " for ", theirs,
                                       "; every rank must allocate the same size"));
      }
      buffer->segments_[r] = std::make_shared<ShmSegment>(entry["name"].get<std::string>(),
                                                          segment_bytes, /*create=*/false);
    }
    // 3. all mapped: the names can go
    store.add(key + "/mapped", 1);
    store.wait_at_least(key + "/mapped", size, timeout);
  } catch (...) {
    shm_unlink(name.c_str());
    throw;
  }
  shm_unlink(name.c_str());
  return buffer;
}

SymmetricBuffer::~SymmetricBuffer() = default;

char* SymmetricBuffer::peer_data(int r) const { return segments_.at(r)->base() + kSyncBytes; }

SymmetricSync& SymmetricBuffer::sync(int r) const {
  return *reinterpret_cast<SymmetricSync*>(segments_.at(r)->base());
}

int64_t SymmetricBuffer::offset_of(const void* ptr, size_t nbytes) const {
  const char* begin = static_cast<const char*>(data());
  const char* p = static_cast<const char*>(ptr);
  if (p < begin || p + nbytes > begin + bytes_) return -1;
  return p - begin;
}

}  // namespace ringtrain::comm
