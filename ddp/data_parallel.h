// data_parallel.h: single-process, multi-device data parallelism (PyTorch's
// nn.DataParallel), and the device-transfer op it is built from.
//
// defines: to_device (differentiable copy between devices), DataParallel.
//
// One forward, the four steps of DataParallel:
//   1. scatter  the batch is chunked along dim 0, one chunk per device;
//   2. replicate each replica's parameters are made differentiable copies (or,
//               on the same device, aliases) of the original parameters, so that
//               backward sums every replica's gradient into the original .grad
//               — the autograd engine does the summing, no extra code;
//   3. parallel_apply  the replicas run their forward in parallel: replica 0 on the
//                      calling thread, each other one on a worker thread of its own
//                      that lives as long as the DataParallel (PyTorch starts threads
//                      per forward; each exit would drop that thread's cuBLAS/cuDNN
//                      handles, and creating them is slow); on CUDA each replica
//                      runs on the caller's current stream of its device, as in
//                      PyTorch (a worker's own would not wait for the caller's copies);
//   4. gather   the outputs are moved to the first device and concatenated (scalar
//               outputs become a vector of one value per replica).
// Replica 0 is the wrapped module itself on devices[0]: its buffers (BatchNorm
// running statistics) are the real ones; the other replicas get copies of the
// buffers at each forward and their updates are discarded, as in PyTorch.
//
// Works with CUDA devices and with several CPU "devices" (threads), which is how
// it is tested on machines without GPUs. It is a Module, so DDP can wrap it: that
// is ddp2 (DataParallel inside a node, DDP across nodes).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "nn/module.h"

namespace ringtrain::ddp {

class ReplicaWorkers;  // data_parallel.cc: the worker threads of replicas 1..n-1

// A copy of `t` on `device` whose gradient flows back to `t` on its own device.
// On the same device it returns a differentiable alias (no copy).
Tensor to_device(const Tensor& t, Device device);

class DataParallel : public nn::Module {
 public:
  // `devices` may repeat (e.g. {cpu, cpu, cpu}: three CPU replicas). The module
  // must already live on devices[0].
  DataParallel(std::shared_ptr<nn::Module> module, std::vector<Device> devices);
  ~DataParallel() override;  // stops and joins the worker threads

  Tensor forward(const Tensor& input) override;

  nn::Module& module() { return *module_; }
  const std::vector<Device>& devices() const { return devices_; }

 private:
  // Before each forward: replica's train/eval flags, parameters (differentiable copies),
  // buffers (values) and owned generators (keyed by generator_keys) from the original.
  void sync_replica_state(size_t replica, const std::vector<uint64_t>& generator_keys);

  std::shared_ptr<nn::Module> module_;                 // the original (= replica 0)
  std::vector<Device> devices_;                        // one replica per entry
  std::vector<std::shared_ptr<nn::Module>> replicas_;  // replicas 1..n-1 (index 0 unused)
  std::unique_ptr<ReplicaWorkers> workers_;            // one thread per replica 1..n-1
};

}  // namespace ringtrain::ddp
