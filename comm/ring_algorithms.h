// ring_algorithms.h: the algorithms of the ring backend, written against
// PeerMesh::exchange (send to one peer while receiving from another).
//
// defines: ChunkLayout, RingArgs, and one function per algorithm:
//   ring_allreduce              reduce-scatter + allgather around the ring (bandwidth path)
//   recursive_doubling_allreduce  log2(n) pairwise exchanges (latency path)
//   direct_allreduce            reduce-scatter + allgather by loads/stores on symmetric memory
//   ring_reduce_scatter_blocks  the reduce-scatter half, shared by allreduce,
//                               reduce_scatter and reduce
//   ring_allgather_blocks       the allgather half, shared by allreduce and allgather
//   ring_broadcast, ring_reduce, ring_allgather, ring_reduce_scatter,
//   pairwise_all_to_all, dissemination_barrier
// Each definition opens with what it does and its cost; see ring_allreduce.cc
// for the alpha-beta model they are all measured against.
#pragma once

#include <cstddef>
#include <vector>

#include "comm/transport.h"
#include "comm/types.h"

namespace ringtrain::comm {

// n chunks over `count` elements, as equal as possible: the first count % n
// chunks have one element more. Offsets and sizes in bytes.
class ChunkLayout {
 public:
  ChunkLayout(size_t count, int n, size_t element_bytes)
      : base_(count / n), extra_(count % n), element_bytes_(element_bytes) {}
  size_t offset(int chunk) const {
    size_t c = static_cast<size_t>(chunk);
    return (c * base_ + std::min(c, extra_)) * element_bytes_;
  }
  size_t bytes(int chunk) const { return elements(chunk) * element_bytes_; }
  size_t elements(int chunk) const { return base_ + (static_cast<size_t>(chunk) < extra_ ? 1 : 0); }

 private:
  size_t base_;
  size_t extra_;
  size_t element_bytes_;
};

// What every algorithm gets: the mesh, the element type and reduction, the deadline,
// and a scratch buffer it may grow (kept by the process group between calls).
struct RingArgs {
  PeerMesh& mesh;
  DType dtype;
  ReduceOp op;
  Deadline deadline;
  std::vector<char>& scratch;

  int rank() const { return mesh.rank(); }
  int size() const { return mesh.size(); }
  size_t element_bytes() const { return dtype_size(dtype); }
};

// (a mod n) for possibly negative a.
inline int ring_mod(int a, int n) { return ((a % n) + n) % n; }

void ring_allreduce(RingArgs& args, void* data, size_t count);
class SymmetricBuffer;
// Allreduce of `count` elements at byte `offset` of a symmetric buffer, by direct
// loads and stores into every rank's copy (direct_allreduce.cc).
void direct_allreduce(RingArgs& args, SymmetricBuffer& buffer, size_t offset, size_t count);
void recursive_doubling_allreduce(RingArgs& args, void* data, size_t count);
// Below this many bytes allreduce takes the latency path. RINGTRAIN_RING_LATENCY_BYTES.
size_t ring_latency_threshold_bytes();
// On shared memory the ring allreduce runs in rounds of p chunks of this many bytes
// (64 KiB; 0 = one pass over the whole buffer). RINGTRAIN_RING_CHUNK_BYTES.
size_t ring_chunk_bytes();

// Reduce-scatter over n blocks laid out by `layout`: this rank's contribution is
// read from `src`, partial sums accumulate in `acc` (acc may equal src). With
// shift s, rank r ends holding the full reduction of block (r + 1 + s) mod n in acc.
// forward_result (allreduce): data = that block; each piece of it is averaged
// (kAvg) and streamed to the next rank as soon as it is final.
void ring_reduce_scatter_blocks(RingArgs& args, const char* src, char* acc,
                                const ChunkLayout& layout, int shift,
                                PeerMesh::FollowUp* forward_result = nullptr);
// Allgather over n blocks of `data`: rank r starts holding block (r + 1 + s) mod n
// (what ring_reduce_scatter_blocks left there) and ends holding all of them.
// first_bytes_sent: how much of this rank's block went out already (forward_result.sent).
void ring_allgather_blocks(RingArgs& args, char* data, const ChunkLayout& layout, int shift,
                           size_t first_bytes_sent = 0);

void ring_broadcast(RingArgs& args, void* data, size_t nbytes, int root);
void ring_reduce(RingArgs& args, void* data, size_t count, int root);
void ring_allgather(RingArgs& args, const void* input, void* output, size_t count);
void ring_reduce_scatter(RingArgs& args, const void* input, void* output, size_t count);
void pairwise_all_to_all(RingArgs& args, const void* input, void* output, size_t count);
void dissemination_barrier(RingArgs& args);

}  // namespace ringtrain::comm
