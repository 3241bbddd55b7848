// hierarchical_allreduce.h: a two-level allreduce for DDP across nodes.
//
// defines: HierarchicalAllreduce (owns the node-local and the cross-node
//          sub-groups and a worker that chains the three collectives).
//
// The algorithm, for G ranks on each of M nodes:
//   1. reduce    inside each node onto the node's local rank 0  (fast links)
//   2. allreduce among the M node leaders                      (the network)
//   3. broadcast inside each node from the leader
// Cost (alpha-beta, n bytes): the network carries 2(M-1)/M * n per leader instead
// of 2(GM-1)/(GM) * n per rank over a flat ring that crosses nodes G times more
// often, which is why NCCL and Horovod do this for many GPUs per node. With
// ddp2 (one process per node running DataParallel) each node has one rank and
// only step 2 remains.
//
// The three steps depend on each other but run on different process groups
// (each with its own comm thread), so a small worker thread chains them and
// completes one Work per bucket; buckets are processed in the order they are
// issued, which is identical on every rank.
//
// Failure: when a step throws on one rank (a leader's network allreduce lost a
// peer, say), that rank cannot finish the chain, and its node's members would wait
// in the step-3 broadcast, then pair the next bucket's reduce with it. So the
// worker aborts both sub-groups with the reason (the peers fail at once, quoting
// it) and fails every queued and later allreduce of this object with it.
#pragma once

#include <memory>
#include <string>

#include "comm/process_group.h"
#include "ddp/reducer.h"

namespace ringtrain::ddp {

class HierarchicalAllreduce {
 public:
  // Collective over `world`: `node` identifies this rank's node (e.g. SLURM_NODEID,
  // or rank / local_world_size), `local_rank` its place inside the node.
  HierarchicalAllreduce(std::shared_ptr<comm::ProcessGroup> world, int node, int local_rank);
  // The groups and the worker live on while a hook() still holds them (DDP may
  // outlive this object); the last holder stops the worker.
  ~HierarchicalAllreduce() = default;
  HierarchicalAllreduce(const HierarchicalAllreduce&) = delete;
  HierarchicalAllreduce& operator=(const HierarchicalAllreduce&) = delete;

  // Sums `buffer` over all ranks of the world group (asynchronously).
  comm::Work allreduce_sum(comm::BufferRef buffer);
  // A DDP comm hook: sum hierarchically, then divide by the world size. The DDP it
  // is registered with must reduce over the same ProcessGroup object this was built
  // on (else the hook throws, naming both): it sums over this object's groups, not
  // over the group DDP passes.
  CommHook hook() const;
  // Fails this object on purpose (the caller cannot go on): aborts the node and
  // leader sub-groups with `reason`, so that the peers fail with it instead of at
  // the collective timeout, and fails every queued and later allreduce_sum. The
  // world group itself is left alone.
  void abort(const std::string& reason);

  bool is_leader() const;
  int nodes() const;

 private:
  struct State;  // groups, queue and worker; shared with the hooks handed out
  std::shared_ptr<State> state_;
};

}  // namespace ringtrain::ddp
