// direct_allreduce.cc: direct_allreduce, reduce-scatter + allgather by direct loads
// and stores on symmetric memory (every rank has mapped every rank's buffer).
//
// What it does. The same two phases as the ring (ring_allreduce.cc), but a rank
// reaches its peers' buffers with plain loads and stores instead of streaming
// chunks through a transport:
//   barrier 1: every rank has its input in place (and says which region it reduces);
//   reduce-scatter: rank r loads chunk r from all p buffers and reduces it;
//   allgather:      rank r stores the result into chunk r of all p buffers;
//   barrier 2: every rank has written its chunk everywhere.
// No two ranks touch the same chunk between the barriers, so they need no other
// synchronisation, and each chunk is computed once, by one rank, so every rank
// ends with bit-identical results.
//
// Cost per rank (alpha-beta-gamma as in ring_allreduce.cc, S bytes, p ranks):
//   2 barriers (a few hundred ns each on one host)
//   + loads of p * S/p = S bytes, stores of p * S/p = S bytes, (p-1)/p S gamma.
// The ring over the shared-memory transport, for comparison, moves 2(p-1)/p S
// bytes through slots, and every slot byte is written once and read once more:
// a copy in, then the receiver's reduce or copy out. At p = 2 and 1 MiB the direct
// path does about a third of the memory traffic (docs/collective-benchmark.md).
// The price is the memory itself: the buffer must be allocated by
// ProcessGroup::allocate_symmetric, on every rank, on one host.
//
// Where it sits. RingProcessGroup::run() -> (allreduce on a SymmetricBuffer) ->
// direct_allreduce; waiting goes through PeerMesh::wait_until, so a rank that
// dies, a deadline, or a peer reducing a different region gives a clear error.
#include <algorithm>
#include <vector>

#include "comm/reduce.h"
#include "comm/ring_algorithms.h"
#include "comm/symmetric_memory.h"

namespace ringtrain::comm {

namespace {

// Reduce and store in pieces that stay in L1/L2 between the reduction and the
// stores that follow it.
constexpr size_t kPieceBytes = 32 << 10;

// Blocks until every rank's sync counter reached `value`.
void wait_for_all(RingArgs& args, SymmetricBuffer& buffer, uint64_t value, const char* what) {
  const int n = args.size();
  int next = 0;  // ranks below `next` are known to have arrived
  args.mesh.wait_until(
      [&] {
        while (next < n && buffer.sync(next).arrived.load(std::memory_order_acquire) >= value) ++next;
        return next == n;
      },
      args.deadline, what);
}

std::string describe_region(const SymmetricSync& s) {
  return detail::concat("offset ", s.offset, ", ", s.count, " elements of ",
                        dtype_name(static_cast<DType>(s.dtype)), ", op ",
                        reduce_op_name(static_cast<ReduceOp>(s.op)));
}

}  // namespace

void direct_allreduce(RingArgs& args, SymmetricBuffer& buffer, size_t offset, size_t count) {
  const int n = args.size();
  const int r = args.rank();
  if (n == 1 || count == 0) return;
  const uint64_t epoch = buffer.next_epoch();
  const size_t element = args.element_bytes();

  // Barrier 1: say what we reduce, then that we arrived. The release store on
  // `arrived` publishes the descriptor and our input data to every peer.
  SymmetricSync& mine = buffer.sync(r);
  mine.epoch = epoch;
  mine.offset = offset;
  mine.count = count;
  mine.dtype = static_cast<int32_t>(args.dtype);
  mine.op = static_cast<int32_t>(args.op);
  mine.arrived.store(2 * epoch + 1, std::memory_order_release);
  wait_for_all(args, buffer, 2 * epoch + 1, "the other ranks to reach an allreduce on symmetric "
                                            "memory (did every rank pass a symmetric buffer?)");
  for (int peer = 0; peer < n; ++peer) {
    const SymmetricSync& theirs = buffer.sync(peer);
    if (theirs.epoch != epoch || theirs.offset != offset || theirs.count != count ||
        theirs.dtype != mine.dtype || theirs.op != mine.op) {
      throw CommError(detail::concat(
          "allreduce on symmetric memory: rank ", args.mesh.world_rank(r), " reduces ",
          describe_region(mine), " but rank ", args.mesh.world_rank(peer), " reduces ",
          describe_region(theirs),
          "; every rank must pass the same region of the same symmetric buffer"));
    }
  }

  // The chunk this rank owns, cut into pieces.
  ChunkLayout chunks(count, n, element);
  const size_t chunk_begin = offset + chunks.offset(r);
  const size_t chunk_bytes = chunks.bytes(r);
  std::vector<char*> copies(n);  // chunk r in every rank's buffer
  for (int q = 0; q < n; ++q) copies[q] = buffer.peer_data(q) + chunk_begin;
  const size_t piece_bytes = kPieceBytes / element * element;
  for (size_t done = 0; done < chunk_bytes; done += piece_bytes) {
    const size_t bytes = std::min(piece_bytes, chunk_bytes - done);
    const size_t elements = bytes / element;
    // Reduce-scatter, for this piece: our own copy accumulates everyone's values,
    // loaded straight out of their buffers.
    char* acc = copies[r] + done;
    for (int q = 0; q < n; ++q) {
      if (q != r) reduce_into(acc, copies[q] + done, elements, args.dtype, args.op);
    }
    if (args.op == ReduceOp::kAvg) scale_for_average(acc, elements, args.dtype, n);
    // Allgather, for this piece: store the result into every peer's buffer.
    for (int q = 0; q < n; ++q) {
      if (q != r) copy_bytes(copies[q] + done, acc, bytes);
    }
  }

  // Barrier 2: our stores into the peers are done (release); wait for theirs into us.
  mine.arrived.store(2 * epoch + 2, std::memory_order_release);
  wait_for_all(args, buffer, 2 * epoch + 2,
               "the other ranks to finish an allreduce on symmetric memory");
}

}  // namespace ringtrain::comm
