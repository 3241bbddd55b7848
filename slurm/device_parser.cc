// device_parser.cc: text -> (count | index list | all | cpu) -> checked indices.
//
// Lightning normalises a string first (device_parser._normalize_parse_gpu_string_input):
// "-1" is -1, a string with a comma is a list of ints, anything else is int(s). We
// follow that and add the bracketed list "[0, 1]" (what str(list) gives in a
// config) and the words "auto", "cpu", "none".
#include "slurm/device_parser.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <set>

#include "slurm/subprocess.h"
#include "tensor/cuda/runtime.h"

namespace ringtrain::slurm {
namespace {

std::string trim(const std::string& text) {
  size_t begin = 0, end = text.size();
  while (begin < end && std::isspace(static_cast<unsigned char>(text[begin]))) ++begin;
  while (end > begin && std::isspace(static_cast<unsigned char>(text[end - 1]))) --end;
  return text.substr(begin, end - begin);
}

std::string lower(std::string text) {
  for (char& c : text) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return text;
}

int parse_int(const std::string& item, const std::string& spec) {
  std::string text = trim(item);
  char* end = nullptr;
  errno = 0;
  long value = text.empty() ? 0 : std::strtol(text.c_str(), &end, 10);
  if (text.empty() || errno != 0 || *end != '\0' || value < -1000000 || value > 1000000) {
    throw SlurmError("devices='" + spec + "': '" + text +
                     "' is not an integer; write a count (2), a list of GPU indices (\"0,1\" or "
                     "\"[0, 1]\"), -1 or \"auto\" for all GPUs, or 0 / \"cpu\" for the CPU");
  }
  return static_cast<int>(value);
}

std::string available_text(int available_gpus) {
  return available_gpus == 0 ? std::string("this machine has no usable GPU")
                             : "this machine has " + std::to_string(available_gpus) + " GPU" +
                                   (available_gpus == 1 ? "" : "s") + " (indices 0-" +
                                   std::to_string(available_gpus - 1) + ")";
}

}  // namespace

std::string DeviceSelection::describe() const {
  if (is_cpu()) return "cpu";
  std::string text = "cuda:";
  for (size_t i = 0; i < cuda_devices.size(); ++i) {
    if (i) text += ",";
    text += std::to_string(cuda_devices[i]);
  }
  return text;
}

DeviceSelection parse_devices(int count, int available_gpus) {
  DeviceSelection selection;
  if (count == 0) return selection;
  if (count == -1) {
    if (available_gpus == 0) {
      throw SlurmError("devices=-1 asks for every GPU, but " + available_text(0) +
                       "; use devices=0 (or \"cpu\") to train on the CPU, or \"auto\" to use GPUs when present");
    }
    count = available_gpus;
  }
  if (count < 0) {
    throw SlurmError("devices=" + std::to_string(count) +
                     " is not valid: a count must be >= 0, or -1 for all GPUs");
  }
  if (count > available_gpus) {
    throw SlurmError("devices=" + std::to_string(count) + " asks for " + std::to_string(count) +
                     " GPUs, but " + available_text(available_gpus) +
                     "; ask for at most that many, or 0 for the CPU");
  }
  for (int i = 0; i < count; ++i) selection.cuda_devices.push_back(i);
  return selection;
}

int ddp_device_for_local_rank(const DeviceSelection& selection, int local_rank, int local_processes,
                              int gpus_per_task, int visible_gpus) {
  if (selection.is_cpu()) throw SlurmError("ddp_device_for_local_rank: the selection names no GPU");
  const int gpus = static_cast<int>(selection.cuda_devices.size());
  if (gpus_per_task > 0 && visible_gpus == gpus_per_task) {
    // srun bound this task to GPUs of its own: they are not indexed by the local rank
    // (every task's first GPU is its device 0). One of them per process.
    if (gpus == 1) return selection.cuda_devices.front();
    const std::string k = std::to_string(gpus_per_task);
    throw SlurmError("devices=" + selection.describe() + " with strategy ddp: srun --gpus-per-task=" + k +
                     " gave this process " + k + " GPUs of its own, but ddp trains on one GPU per process, so " +
                     std::to_string(gpus - 1) + " would idle; launch with --gpus-per-task=1 (one task per GPU), " +
                     "use strategy ddp2 (DDP between the tasks, DataParallel over each task's " + k +
                     " GPUs), or select one GPU (devices=1)");
  }
  if (local_processes != gpus) {
    std::string bound;
    if (gpus_per_task > 0) {
      bound = ". srun --gpus-per-task=" + std::to_string(gpus_per_task) + " (SLURM_GPUS_PER_TASK) is set, but this "
              "process sees " + std::to_string(visible_gpus) + " GPU(s), not GPUs of its own (was --gpu-bind "
              "given?)";
    } else if (gpus == 1 && local_processes > 1) {
      bound = ". If SLURM gives each task a GPU of its own, launch with srun --gpus-per-task=1: srun then says so "
              "(SLURM_GPUS_PER_TASK) and each process trains on its own GPU; nothing here says so, so these " +
              std::to_string(local_processes) + " processes would share one GPU. Or request the GPUs per node (--gres=gpu:" +
              std::to_string(local_processes) + " or --gpus-per-node=" + std::to_string(local_processes) +
              "), so that every process sees the node's GPUs";
    }
    throw SlurmError("devices=" + selection.describe() + " with strategy ddp needs " + std::to_string(gpus) +
                     " process(es) on this node, one per GPU, but the launcher started " +
                     std::to_string(local_processes) + "; launch " + std::to_string(gpus) +
                     " per node (ringrun --nproc-per-node " + std::to_string(gpus) + ", srun --ntasks-per-node=" +
                     std::to_string(gpus) + ") or select " + std::to_string(local_processes) + " GPU(s)" +
                     (local_processes == 1 ? " (or strategy dp: one process driving every GPU)" : "") + bound);
  }
  if (local_rank < 0 || local_rank >= local_processes) {
    throw SlurmError("local rank " + std::to_string(local_rank) + " is not in 0.." + std::to_string(local_processes - 1));
  }
  return selection.cuda_devices[local_rank];
}

void check_ddp2_devices(const DeviceSelection& selection, int local_processes, int gpus_per_task, int visible_gpus) {
  if (selection.is_cpu() || local_processes <= 1) return;  // CPU replicas are threads: nothing to share
  if (gpus_per_task > 0 && visible_gpus == gpus_per_task) return;  // every task drives its own GPUs
  throw SlurmError("devices=" + selection.describe() + " with strategy ddp2: each process drives every selected GPU "
                   "(DataParallel), but the launcher started " + std::to_string(local_processes) +
                   " processes on this node, so they would all share them; launch one process per node "
                   "(srun --ntasks-per-node=1, ringrun --nproc-per-node 1), give each task GPUs of its own "
                   "(srun --gpus-per-task=k), or use strategy ddp (one process per GPU)");
}

void check_single_device_strategy(const DeviceSelection& selection) {
  if (selection.cuda_devices.size() <= 1) return;
  const std::string n = std::to_string(selection.cuda_devices.size());
  throw SlurmError("devices=" + selection.describe() + " selects " + n +
                   " GPUs, but strategy none trains on one device, so all but the first would sit idle; use "
                   "strategy dp (one process driving the " + n + " GPUs) or ddp (one process per GPU: ringrun "
                   "--nproc-per-node " + n + "), or select one GPU (devices=1)");
}

DeviceSelection parse_device_list(const std::vector<int>& indices, int available_gpus) {
  DeviceSelection selection;
  std::set<int> seen;
  for (int index : indices) {
    if (index < 0 || index >= available_gpus) {
      throw SlurmError("GPU index " + std::to_string(index) + " in the device list does not exist: " +
                       available_text(available_gpus));
    }
    if (!seen.insert(index).second) {
      throw SlurmError("GPU index " + std::to_string(index) +
                       " appears twice in the device list; list each GPU once");
    }
    selection.cuda_devices.push_back(index);
  }
  return selection;
}

DeviceSelection parse_devices(const std::string& spec, int available_gpus) {
  if (available_gpus < 0) available_gpus = 0;
  std::string text = trim(spec);
  std::string word = lower(text);
  if (word.empty() || word == "none" || word == "cpu" || word == "null") return {};
  if (word == "auto") return parse_devices(available_gpus, available_gpus);  // all GPUs, or CPU
  bool bracketed = text.front() == '[' || text.front() == '(';
  if (bracketed) {
    char close = text.front() == '[' ? ']' : ')';
    if (text.back() != close) {
      throw SlurmError("devices='" + spec + "': unbalanced brackets; write a list like \"[0, 1]\"");
    }
    text = trim(text.substr(1, text.size() - 2));
  }
  if (bracketed || text.find(',') != std::string::npos) {
    std::vector<int> indices;
    size_t pos = 0;
    while (pos <= text.size()) {
      size_t comma = text.find(',', pos);
      if (comma == std::string::npos) comma = text.size();
      std::string item = trim(text.substr(pos, comma - pos));
      // "1," is the list [1] (Lightning drops empty items); "[]" is the empty list (CPU)
      if (!item.empty()) indices.push_back(parse_int(item, spec));
      pos = comma + 1;
    }
    return parse_device_list(indices, available_gpus);
  }
  return parse_devices(parse_int(text, spec), available_gpus);
}

DeviceSelection parse_devices(const std::string& spec) {
  return parse_devices(spec, cuda::device_count());
}

}  // namespace ringtrain::slurm
