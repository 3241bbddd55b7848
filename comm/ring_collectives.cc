// ring_collectives.cc: the ring backend's other collectives.
//
// Costs in the alpha-beta model of ring_allreduce.cc (p ranks, S bytes per rank's
// buffer, or per rank's block where noted):
//   broadcast       pipelined ring, segments of s bytes: (p-1 + S/s) (alpha + s beta)
//   reduce          reduce-scatter + gather to root: 2(p-1) alpha + 2 (p-1)/p S beta
//   allgather       ring, S = one rank's block: (p-1) alpha + (p-1) S beta
//   reduce_scatter  ring, S = one rank's block: (p-1) alpha + (p-1) S (beta + gamma)
//   all_to_all      p-1 pairwise rounds (round k: send to r+k, receive from r-k)
//   barrier         dissemination: ceil(log2 p) rounds of one byte
#include <cstring>

#include "comm/reduce.h"
#include "comm/ring_algorithms.h"

namespace ringtrain::comm {

namespace {
// Broadcast pipeline segment: large enough to amortize a step, small enough that
// the p-1 hops of a long ring overlap.
constexpr size_t kBroadcastSegmentBytes = 1 << 20;
}  // namespace

void ring_broadcast(RingArgs& args, void* data, size_t nbytes, int root) {
  const int n = args.size();
  if (n == 1 || nbytes == 0) return;
  const int r = args.rank();
  const int position = ring_mod(r - root, n);  // hops from the root
  const int next = ring_mod(r + 1, n);
  const int prev = ring_mod(r - 1, n);
  char* buffer = static_cast<char*>(data);
  if (position == 0) {
    // the root: push the whole buffer to next (the transport streams it; next, if it
    // is a middle rank, takes it in segments: transports are byte streams, transport.h)
    args.mesh.send(next, buffer, nbytes, args.deadline);
    return;
  }
  if (position == n - 1) {
    // the end of the line: only receive
    args.mesh.recv(prev, buffer, nbytes, args.deadline);
    return;
  }
  // in the middle: forward segment k-1 to next while segment k arrives from prev
  const size_t segments = (nbytes + kBroadcastSegmentBytes - 1) / kBroadcastSegmentBytes;
  auto segment_bytes = [&](size_t k) {
    return std::min(kBroadcastSegmentBytes, nbytes - k * kBroadcastSegmentBytes);
  };
  for (size_t k = 0; k <= segments; ++k) {
    const bool forward = k > 0;
    const bool receive = k < segments;
    char* in = buffer + k * kBroadcastSegmentBytes;
    args.mesh.exchange(
        forward ? next : -1, forward ? in - kBroadcastSegmentBytes : nullptr,
        forward ? segment_bytes(k - 1) : 0, receive ? prev : -1, receive ? segment_bytes(k) : 0,
        [in](const void* piece, size_t offset, size_t len) { copy_bytes(in + offset, piece, len); },
        args.deadline);
  }
}

void ring_reduce(RingArgs& args, void* data, size_t count, int root) {
  const int n = args.size();
  if (n == 1 || count == 0) return;
  const int r = args.rank();
  char* buffer = static_cast<char*>(data);
  ChunkLayout chunks(count, n, args.element_bytes());
  // Phase 1: reduce-scatter in place; rank j then owns the finished chunk j+1.
  ring_reduce_scatter_blocks(args, buffer, buffer, chunks, /*shift=*/0);
  const int owned = ring_mod(r + 1, n);
  if (args.op == ReduceOp::kAvg) {
    scale_for_average(buffer + chunks.offset(owned), chunks.elements(owned), args.dtype, n);
  }
  // Phase 2: every rank hands its finished chunk to the root.
  if (r != root) {
    args.mesh.send(root, buffer + chunks.offset(owned), chunks.bytes(owned), args.deadline);
    return;
  }
  for (int j = 0; j < n; ++j) {
    if (j == root) continue;
    const int chunk = ring_mod(j + 1, n);
    args.mesh.recv(j, buffer + chunks.offset(chunk), chunks.bytes(chunk), args.deadline);
  }
}

void ring_allgather(RingArgs& args, const void* input, void* output, size_t count) {
  const int n = args.size();
  const size_t block = count * args.element_bytes();
  char* out = static_cast<char*>(output);
  // our own block goes straight into place; the ring brings the other p-1
  if (block > 0) std::memmove(out + args.rank() * block, input, block);
  if (n == 1 || count == 0) return;
  ChunkLayout blocks(count * n, n, args.element_bytes());
  // shift -1: rank r starts out owning block r
  ring_allgather_blocks(args, out, blocks, /*shift=*/-1);
}

void ring_reduce_scatter(RingArgs& args, const void* input, void* output, size_t count) {
  const int n = args.size();
  const size_t block = count * args.element_bytes();
  const int r = args.rank();
  if (count == 0) return;
  if (n == 1) {
    std::memmove(output, input, block);
    return;
  }
  // Partial sums go to scratch so the caller's input stays untouched.
  if (args.scratch.size() < block * n) args.scratch.resize(block * n);
  char* acc = args.scratch.data();
  ChunkLayout blocks(count * n, n, args.element_bytes());
  // shift -1: rank r ends owning block r, which is what reduce_scatter promises
  ring_reduce_scatter_blocks(args, static_cast<const char*>(input), acc, blocks, /*shift=*/-1);
  std::memcpy(output, acc + blocks.offset(r), block);
  if (args.op == ReduceOp::kAvg) scale_for_average(output, count, args.dtype, n);
}

void pairwise_all_to_all(RingArgs& args, const void* input, void* output, size_t count) {
  const int n = args.size();
  const int r = args.rank();
  const size_t block = count / n * args.element_bytes();
  const char* in = static_cast<const char*>(input);
  char* out = static_cast<char*>(output);
  if (block > 0) std::memmove(out + r * block, in + r * block, block);
  // round k: our block for rank r+k goes out while rank r-k's block for us comes in
  for (int k = 1; k < n && block > 0; ++k) {
    const int to = ring_mod(r + k, n);
    const int from = ring_mod(r - k, n);
    char* into = out + from * block;
    args.mesh.exchange(
        to, in + to * block, block, from, block,
        [into](const void* piece, size_t offset, size_t len) { copy_bytes(into + offset, piece, len); },
        args.deadline);
  }
}

void dissemination_barrier(RingArgs& args) {
  const int n = args.size();
  const int r = args.rank();
  const char token = 1;
  // round k: tell rank r+2^k we are here, hear from rank r-2^k
  for (int distance = 1; distance < n; distance <<= 1) {
    args.mesh.exchange(ring_mod(r + distance, n), &token, 1, ring_mod(r - distance, n), 1,
                       [](const void*, size_t, size_t) {}, args.deadline);
  }
}

}  // namespace ringtrain::comm
