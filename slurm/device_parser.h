// device_parser.h: "which devices?" answered the way PyTorch Lightning answers it.
//
// defines: DeviceSelection, parse_devices (from text or an int), parse_device_list.
//
// Lightning's `gpus` / `devices` argument takes many spellings; users bring them
// from their scripts and sbatch files, so we accept the same ones and mean the same
// thing by them:
//
//   spelling                 | meaning
//   -------------------------+-----------------------------------------------------
//   0, "0", "", "none",      | CPU (no GPU)
//   "None", "cpu", []        |
//   N > 0, "N"               | the first N GPUs: 0..N-1 (an int COUNTS; "2" is 2 GPUs)
//   -1, "-1", "auto"         | every GPU there is ("auto": CPU when there is none)
//   "0,1", "1,", "[0, 1]",   | exactly these GPU indices (a comma or brackets make a
//   {0, 1}                   | LIST: "1," is GPU 1, "1" is one GPU, i.e. GPU 0)
//
// The result is checked against the GPUs this machine has: asking for more than
// there are, an index that does not exist, a repeated index, or -1 with no GPU at
// all is an error that says what was asked, what is there, and what to write.
#pragma once

#include <string>
#include <vector>

namespace ringtrain::slurm {

struct DeviceSelection {
  std::vector<int> cuda_devices;  // the chosen GPU indices, in the order given; empty: CPU
  bool is_cpu() const { return cuda_devices.empty(); }
  std::string describe() const;  // "cpu" or "cuda:0,1"
};

// `spec` as a user writes it (command line, config file). `available_gpus` is how
// many GPUs this process can see; the overload without it asks the CUDA runtime
// (tensor/cuda/runtime.h; 0 on a machine without a GPU or driver).
DeviceSelection parse_devices(const std::string& spec, int available_gpus);
DeviceSelection parse_devices(const std::string& spec);
// An int as Lightning takes it: 0 CPU, N the first N, -1 all.
DeviceSelection parse_devices(int count, int available_gpus);

// DDP on GPUs runs one process per selected GPU on each node: the GPU of the process
// with `local_rank` among `local_processes`. A count that differs is a launch mistake
// Lightning refuses too: fewer processes leave GPUs idle (devices=4 in one process
// trains on one GPU), more make processes share a GPU. Throws SlurmError naming both
// numbers and the launch that fits.
//
// Unless SLURM bound GPUs to each task: `gpus_per_task` is
// ClusterEnvironment::gpus_per_task (srun --gpus-per-task=k, 0: not given) and
// `visible_gpus` how many GPUs this process sees. When both are k, the GPUs this
// process sees are its own (srun set CUDA_VISIBLE_DEVICES per task), not the node's,
// so the local rank does not index them: the selection must name one GPU, and that is
// the one (devices "auto" with k=1: device 0). With k > 1, "auto" selects k GPUs for
// a one-GPU-per-process strategy, k-1 of which would idle: an error that says to ask
// --gpus-per-task=1, strategy ddp2 (DDP between tasks, DataParallel over each task's
// k GPUs) or devices=1. When the process sees another number (srun --gpu-bind=none:
// every task sees the node's GPUs), the rule above applies.
int ddp_device_for_local_rank(const DeviceSelection& selection, int local_rank, int local_processes,
                              int gpus_per_task = 0, int visible_gpus = 0);
// strategy ddp2: one process per node drives every selected GPU (DataParallel), and DDP
// runs between the nodes' processes. With `local_processes` > 1 they would all drive
// the same GPUs (each putting its master copy on the first), unless SLURM bound GPUs to
// each task (`gpus_per_task` and `visible_gpus` as above: then each drives its own).
// Throws SlurmError naming the launches that fit.
void check_ddp2_devices(const DeviceSelection& selection, int local_processes, int gpus_per_task = 0,
                        int visible_gpus = 0);
// strategy none (one process, one device): a selection of more than one GPU is refused,
// as Lightning's single-device strategy refuses it (the others would sit idle while the
// run looked like it used them). Throws SlurmError naming the strategies that use them.
void check_single_device_strategy(const DeviceSelection& selection);
// An explicit index list (Lightning's gpus=[0, 1]); empty: CPU.
DeviceSelection parse_device_list(const std::vector<int>& indices, int available_gpus);

}  // namespace ringtrain::slurm
