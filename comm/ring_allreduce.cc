// ring_allreduce.cc: ring_allreduce, the algorithm DDP spends its communication in.
//
// What it does. Every rank holds a buffer of S bytes; afterwards every rank holds
// the element-wise reduction of all p buffers. The buffer is cut into p chunks.
//   Phase 1, reduce-scatter (p-1 steps): at each step every rank sends one chunk
//   to its next neighbour and receives one from its previous neighbour, which it
//   reduces into its own copy of that chunk. The chunk a rank forwards at step k
//   is the one it just reduced at step k-1, so after p-1 steps chunk (r+1) mod p
//   on rank r has been through every rank: it is the full result.
//   Phase 2, allgather (p-1 steps): the finished chunks travel once more around
//   the ring, now copied instead of reduced, until every rank has all of them.
//
// Cost (alpha-beta model: sending m bytes costs alpha + m*beta; reducing m bytes
// costs m*gamma):
//   ring:               2(p-1) alpha + 2 (p-1)/p S beta + (p-1)/p S gamma
//   recursive doubling:  log2(p) alpha + log2(p) S beta +  log2(p) S gamma
// The ring sends 2(p-1)/p S bytes per rank, which is the minimum any allreduce
// must send: it is bandwidth-optimal, and the number a benchmark reports as
// "busbw" (algbw * 2(p-1)/p) is exactly the per-link rate this ring achieves.
// Its weakness is the 2(p-1) alpha term: for small S the latency dominates, so
// below ring_latency_threshold_bytes() we take recursive doubling, whose log2(p)
// rounds each move the whole (small) buffer.
//
// Pipelining. Each step is one PeerMesh::exchange, which streams the chunk in
// transport-sized pieces (a shared-memory slot, a TCP staging buffer): while the
// sender copies piece k+1 in, the receiver already reduces piece k straight out
// of the shared slot. So within a step, copy, transfer and reduction overlap. The
// two phases overlap too: the last reduce-scatter step forwards each finished
// piece at once (a FollowUp), so next starts the allgather while we still reduce,
// and the piece is copied out while it is still in this core's cache.
//
// Rounds (shared memory). Done in one pass, the ring touches every byte of the
// buffer in the reduce-scatter and again, much later, in the allgather: from 1 MiB
// up (two ranks) the buffer and the slots no longer fit this core's 512 KiB L2, so
// the second touch comes from L3 or memory. So on shared memory the buffer is
// reduced in rounds of p x ring_chunk_bytes() (64 KiB: 128 KiB per round with two
// ranks), each a complete reduce-scatter + allgather: a round's bytes are copied
// in, reduced, forwarded and copied out while they are still in L2. This is NCCL's
// loop over chunks of nranks x chunkSize. It costs 2(p-1) alpha per round instead
// of once, which the slots hide: a rank that finishes a round starts sending the
// next while its neighbour still copies out. Measured on the 2-core VM, 2 ranks,
// private buffers, rounds of 128 KiB: 12-31% less time at every size from 512 KiB
// to 64 MiB (docs/collective-benchmark.md). Between hosts (TCP) the buffer still
// goes round in one pass: there each exchange also costs a network round trip.
//
// Where it sits. DDP's Reducer -> ProcessGroup::allreduce (queues) -> comm thread
// -> RingProcessGroup::run -> ring_allreduce -> PeerMesh::exchange -> ShmTransport
// or TcpTransport. kAvg is reduced as a sum; each rank divides the chunk it owns
// between the two phases, so the division is done once per element, not p times.
#include <algorithm>
#include <cstring>

#include "comm/launch_env.h"
#include "comm/reduce.h"
#include "comm/ring_algorithms.h"

namespace ringtrain::comm {

// Both at most 1 GiB: larger values mean nothing more ("always" / "one pass") and
// could overflow the round arithmetic (chunk / element * p wrapping to 0 never ends).
constexpr size_t kMaxRingSettingBytes = size_t{1} << 30;

size_t ring_latency_threshold_bytes() {
  static const size_t threshold = env_size("RINGTRAIN_RING_LATENCY_BYTES", 16384, 0, kMaxRingSettingBytes);
  return threshold;
}

size_t ring_chunk_bytes() {
  static const size_t chunk = env_size("RINGTRAIN_RING_CHUNK_BYTES", 65536, 0, kMaxRingSettingBytes);
  return chunk;
}

void ring_reduce_scatter_blocks(RingArgs& args, const char* src, char* acc,
                                const ChunkLayout& layout, int shift,
                                PeerMesh::FollowUp* forward_result) {
  const int n = args.size();
  const int r = args.rank();
  const int next = ring_mod(r + 1, n);
  const int prev = ring_mod(r - 1, n);
  const size_t element = args.element_bytes();
  for (int step = 0; step < n - 1; ++step) {
    const int send_chunk = ring_mod(r - step + shift, n);
    const int recv_chunk = ring_mod(r - step - 1 + shift, n);
    const bool last_step = step == n - 2;
    // step 0: push our own contribution of send_chunk to next;
    // steps 1..p-2: forward the chunk we reduced in the previous step.
    const char* send_from = (step == 0 ? src : acc) + layout.offset(send_chunk);
    // meanwhile: receive prev's partial sum of recv_chunk and reduce our contribution into it
    const char* mine = src + layout.offset(recv_chunk);
    char* into = acc + layout.offset(recv_chunk);
    // In the last step every reduced piece is final; with forward_result it is
    // averaged (kAvg) and handed straight on to next as the allgather's first message.
    PeerMesh::FollowUp* forward = last_step ? forward_result : nullptr;
    args.mesh.exchange(
        next, send_from, layout.bytes(send_chunk), prev, layout.bytes(recv_chunk),
        [&](const void* piece, size_t offset, size_t nbytes) {
          if (mine == into) {
            reduce_into(into + offset, piece, nbytes / element, args.dtype, args.op);
          } else {
            reduce_into3(into + offset, mine + offset, piece, nbytes / element, args.dtype, args.op);
          }
          if (forward) {
            if (args.op == ReduceOp::kAvg) {
              scale_for_average(into + offset, nbytes / element, args.dtype, n);
            }
            forward->ready = offset + nbytes;
          }
        },
        args.deadline, forward);
  }
  // step p-1 is done: acc's chunk (r + 1 + shift) mod p now holds the reduction of all p ranks
}

void ring_allgather_blocks(RingArgs& args, char* data, const ChunkLayout& layout, int shift,
                           size_t first_bytes_sent) {
  const int n = args.size();
  const int r = args.rank();
  const int next = ring_mod(r + 1, n);
  const int prev = ring_mod(r - 1, n);
  for (int step = 0; step < n - 1; ++step) {
    const int send_chunk = ring_mod(r + 1 + shift - step, n);
    const int recv_chunk = ring_mod(r + shift - step, n);
    // step 0: push the chunk we own to next; steps 1..p-2: forward the one just received.
    // meanwhile: copy the finished chunk coming from prev into place
    char* into = data + layout.offset(recv_chunk);
    // (step 0: the reduce-scatter may have sent the head of our chunk already)
    const size_t skip = step == 0 ? first_bytes_sent : 0;
    args.mesh.exchange(
        next, data + layout.offset(send_chunk) + skip, layout.bytes(send_chunk) - skip, prev,
        layout.bytes(recv_chunk),
        [into](const void* piece, size_t offset, size_t nbytes) {
          copy_bytes(into + offset, piece, nbytes);
        },
        args.deadline);
  }
}

namespace {

// One reduce-scatter + allgather over all of [data, data + count).
void ring_allreduce_pass(RingArgs& args, char* buffer, size_t count) {
  const int n = args.size();
  ChunkLayout chunks(count, n, args.element_bytes());
  // Phase 1, reduce-scatter: p-1 steps of "receive, reduce, forward". In its last
  // step each piece of the chunk this rank owns is final the moment it is reduced
  // (and averaged, for kAvg); it goes on to next at once, the head of phase 2's
  // first message, while the rest is still arriving (NCCL's recvReduceCopySend).
  const int owned = ring_mod(args.rank() + 1, n);
  PeerMesh::FollowUp forward{.data = buffer + chunks.offset(owned)};
  ring_reduce_scatter_blocks(args, buffer, buffer, chunks, /*shift=*/0, &forward);
  // Phase 2, allgather: p-1 steps of "receive, copy, forward"; step 0 sends what
  // the reduce-scatter could not forward yet.
  ring_allgather_blocks(args, buffer, chunks, /*shift=*/0, forward.sent);
}

}  // namespace

void ring_allreduce(RingArgs& args, void* data, size_t count) {
  const int n = args.size();
  if (n == 1 || count == 0) return;
  char* buffer = static_cast<char*>(data);
  const size_t element = args.element_bytes();
  // Rounds of p chunks while every peer is in shared memory (see the top of the
  // file); RINGTRAIN_RING_CHUNK_BYTES=0 turns them off.
  size_t round = count;
  if (args.mesh.all_shared_memory() && ring_chunk_bytes() > 0) {
    round = std::max<size_t>(1, ring_chunk_bytes() / element) * static_cast<size_t>(n);
  }
  for (size_t first = 0; first < count; first += round) {
    // round k: elements [first, first + round) go once around the ring, both phases
    ring_allreduce_pass(args, buffer + first * element, std::min(round, count - first));
  }
}

// Recursive doubling: in round k every rank swaps its whole buffer with the rank
// whose number differs in bit k and reduces. After log2(p) rounds all have the
// result, and all computed the same floating-point expression (a+b == b+a), so
// the ranks agree bit for bit. With p not a power of two, the p - 2^m extra ranks
// first hand their buffer to a partner among the first 2^m, wait, and get the
// result back at the end.
void recursive_doubling_allreduce(RingArgs& args, void* data, size_t count) {
  const int n = args.size();
  const int r = args.rank();
  if (n == 1 || count == 0) return;
  const size_t bytes = count * args.element_bytes();
  char* buffer = static_cast<char*>(data);
  if (args.scratch.size() < bytes) args.scratch.resize(bytes);
  char* incoming = args.scratch.data();
  auto copy_in = [incoming](const void* piece, size_t offset, size_t nbytes) {
    copy_bytes(incoming + offset, piece, nbytes);
  };
  int pow2 = 1;
  while (pow2 * 2 <= n) pow2 *= 2;
  const int extra = n - pow2;
  // fold in: rank pow2 + i gives its buffer to rank i
  if (r >= pow2) {
    args.mesh.send(r - pow2, buffer, bytes, args.deadline);
  } else {
    if (r < extra) {
      args.mesh.exchange(-1, nullptr, 0, r + pow2, bytes, copy_in, args.deadline);
      reduce_into(buffer, incoming, count, args.dtype, args.op);
    }
    // log2(pow2) rounds: swap with the partner across bit k, reduce
    for (int mask = 1; mask < pow2; mask <<= 1) {
      const int partner = r ^ mask;
      args.mesh.exchange(partner, buffer, bytes, partner, bytes, copy_in, args.deadline);
      reduce_into(buffer, incoming, count, args.dtype, args.op);
    }
    if (args.op == ReduceOp::kAvg) scale_for_average(buffer, count, args.dtype, n);
  }
  // fold out: the extra ranks get the result back
  if (r >= pow2) {
    args.mesh.recv(r - pow2, buffer, bytes, args.deadline);
  } else if (r < extra) {
    args.mesh.send(r + pow2, buffer, bytes, args.deadline);
  }
}

}  // namespace ringtrain::comm
