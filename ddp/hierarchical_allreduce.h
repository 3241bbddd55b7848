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
#pragma once

#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>

#include "comm/process_group.h"
#include "ddp/reducer.h"

namespace ringtrain::ddp {

class HierarchicalAllreduce {
 public:
  // Collective over `world`: `node` identifies this rank's node (e.g. SLURM_NODEID,
  // or rank / local_world_size), `local_rank` its place inside the node.
  HierarchicalAllreduce(std::shared_ptr<comm::ProcessGroup> world, int node, int local_rank);
  ~HierarchicalAllreduce();
  HierarchicalAllreduce(const HierarchicalAllreduce&) = delete;
  HierarchicalAllreduce& operator=(const HierarchicalAllreduce&) = delete;

  // Sums `buffer` over all ranks of the world group (asynchronously).
  comm::Work allreduce_sum(comm::BufferRef buffer);
  // A DDP comm hook: sum hierarchically, then divide by the world size.
  CommHook hook();

  bool is_leader() const { return inter_ != nullptr; }
  int nodes() const { return nodes_; }

 private:
  struct Job {
    comm::BufferRef buffer;
    std::shared_ptr<comm::WorkState> state;
  };
  void worker_loop();

  std::shared_ptr<comm::ProcessGroup> world_;
  std::shared_ptr<comm::ProcessGroup> intra_;  // ranks on my node, leader = local rank 0
  std::shared_ptr<comm::ProcessGroup> inter_;  // the node leaders (null on non-leaders)
  int nodes_ = 1;                              // number of nodes (leaders)
  std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<Job> queue_;
  bool stopping_ = false;
  std::thread worker_;
};

}  // namespace ringtrain::ddp
