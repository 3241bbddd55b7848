// symmetric_memory.h: SymmetricBuffer, a buffer of the same size on every rank of
// a group, where each rank can also read and write every other rank's copy.
//
// defines: SymmetricBuffer (allocate collectively, then data(), peer_data(r)),
//          SymmetricSync (the per-rank header the direct algorithms synchronise on).
//
// Why. A collective on ordinary (private) memory has to move every byte through a
// transport: the sender copies into a shared slot, the receiver reads it out. When
// the buffer itself lives in shared memory that every rank has mapped, a rank can
// load its peer's data directly, so an allreduce on it needs no copies at all, only
// the loads and stores of the reduction (direct_allreduce.cc). This is the idea of
// NCCL's user-buffer registration (ncclMemAlloc + ncclCommWindowRegister),
// MPI_Win_allocate_shared and PyTorch's SymmetricMemory, for processes on one host.
//
// Where it sits. ProcessGroup::allocate_symmetric() makes one (ring backend, every
// member on this host; other groups return nullptr). DDP allocates its gradient
// buckets there when it can (ddp/reducer.cc). RingProcessGroup::run() notices an
// allreduce whose buffer lies inside a SymmetricBuffer and takes the direct path;
// everything else treats it as ordinary memory.
//
// Layout of each rank's segment: one page of SymmetricSync, then the data
// (page aligned). Every rank maps every other rank's segment.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "comm/types.h"

namespace ringtrain::comm {

class PeerMesh;
class ShmSegment;
class Store;

// Written only by the rank that owns the segment, read by its peers.
struct SymmetricSync {
  // 2 * epoch + 1: arrived at the start of collective number `epoch` on this buffer;
  // 2 * epoch + 2: finished its part of it (no more loads or stores into peers).
  alignas(64) std::atomic<uint64_t> arrived;
  // What this rank is reducing in the current epoch; peers compare it with theirs.
  alignas(64) uint64_t epoch;
  uint64_t offset;  // bytes from the start of the data
  uint64_t count;   // elements
  int32_t dtype;
  int32_t op;
};

class SymmetricBuffer {
 public:
  // Collective over the mesh's group (every member must call it, in the same order
  // relative to other allocations, with the same `bytes`). Every member must share
  // memory with this rank (PeerMesh::all_shared_memory()). `key` names the
  // allocation in the store and must be the same on every rank.
  static std::shared_ptr<SymmetricBuffer> allocate(PeerMesh& mesh, Store& store,
                                                   const std::string& key, size_t bytes,
                                                   Deadline deadline);
  ~SymmetricBuffer();
  SymmetricBuffer(const SymmetricBuffer&) = delete;
  SymmetricBuffer& operator=(const SymmetricBuffer&) = delete;

  // This rank's copy (zero-filled at allocation).
  void* data() const { return peer_data(rank_); }
  size_t bytes() const { return bytes_; }
  int rank() const { return rank_; }
  int size() const { return static_cast<int>(segments_.size()); }
  // Group rank r's copy, as mapped in this process.
  char* peer_data(int r) const;
  SymmetricSync& sync(int r) const;
  // Offset of [ptr, ptr + nbytes) in data(), or -1 if it is not entirely inside.
  int64_t offset_of(const void* ptr, size_t nbytes) const;
  // The number of the next collective on this buffer (same on every rank, because
  // every rank issues the same sequence of collectives).
  uint64_t next_epoch() { return epoch_++; }

 private:
  SymmetricBuffer(int rank, size_t bytes) : rank_(rank), bytes_(bytes) {}

  int rank_;
  size_t bytes_;
  uint64_t epoch_ = 0;
  std::vector<std::shared_ptr<ShmSegment>> segments_;  // indexed by group rank
};

}  // namespace ringtrain::comm
