// symmetric_memory.cc: SymmetricBuffer::allocate and the address lookups.
//
// Allocation is the rendezvous the shared-memory transport uses for its inboxes
// (share_shm_segments in shm_segment.h), over every rank of the group, with one
// segment per rank: a sync page, then the data.
#include "comm/symmetric_memory.h"

#include <functional>

#include "comm/shm_segment.h"
#include "comm/transport.h"

namespace ringtrain::comm {

namespace {

constexpr size_t kSyncBytes = 4096;  // the data starts on its own page

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
  std::vector<int> members(size), world_ranks(size);
  for (int r = 0; r < size; ++r) {
    members[r] = r;
    world_ranks[r] = mesh.world_rank(r);
  }
  std::shared_ptr<SymmetricBuffer> buffer(new SymmetricBuffer(rank, bytes));
  // Zero-filled, so every sync counter starts at 0.
  buffer->segments_ = share_shm_segments(
      store, key, rank, size, members, world_ranks,
      detail::concat(mesh.shm_name_prefix(), "-sym-", std::hash<std::string>{}(key)),
      kSyncBytes + bytes, deadline, [&mesh](const std::string& what) { mesh.check_members(what); },
      "allocate_symmetric", "every rank must allocate the same size");
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
