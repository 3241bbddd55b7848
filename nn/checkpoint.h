// checkpoint.h: save a training run and resume it exactly.
//
// defines: CheckpointTargets, TrainingProgress, CheckpointInfo, CheckpointError,
//          save_checkpoint(), load_checkpoint(), read_checkpoint_info(),
//          CheckpointManager (numbered checkpoints in a directory, keep the last K,
//          find the newest valid one).
//
// A checkpoint is two files with one stem, e.g. runs/ckpt-0000001200:
//   ckpt-0000001200.safetensors  every tensor: "model.<name>" (parameters and
//                                buffers), "optimizer.state.<i>.<buf>" (momentum,
//                                Adam moments) and "extra.<name>" (the caller's
//                                extra tensors); readable by Python's safetensors.
//   ckpt-0000001200.json         everything else: format version, epoch, step, the
//                                optimizer's hyperparameters and step counts, the LR
//                                schedule, the RNG (seed, offset), the model's key
//                                list with shapes and dtypes, user extras, the
//                                size and CRC-32 of the .safetensors file, and the
//                                record's own CRC-32 ("record_crc32", over its compact
//                                dump without that field; a record without it, from an
//                                older build or edited on purpose, is read unchecked).
//
// Atomicity: both files are written with write_file_atomically (temp file, fsync,
// rename, directory fsync), tensors first, JSON last. The JSON is the commit
// record: a checkpoint exists when its JSON does, and it is valid when the record
// matches its own CRC and the .safetensors file it names has the recorded size and
// CRC. A crash at any point leaves either the previous checkpoint or the complete new one.
//
// Loading validates everything first (both files, model keys and shapes, the
// optimizer's type, groups and state shapes, the schedule's whole state) and only
// then writes into the model, optimizer, schedule and generator. A checkpoint from a
// different model throws CheckpointError listing every missing, unexpected and
// mis-shaped key, and nothing is changed. The schedule's saved hyperparameters win
// over the ones it was built with (PyTorch's semantics); each one that differs is
// listed in CheckpointInfo::notes for the caller to show.
#pragma once

#include <compare>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "nn/lr_scheduler.h"
#include "nn/module.h"
#include "nn/optim.h"
#include "tensor/checks.h"
#include "tensor/ops.h"

namespace ringtrain::nn {

// A checkpoint that is missing, corrupt, or does not fit what it is loaded into.
class CheckpointError : public Error {
 public:
  using Error::Error;
};

// What a checkpoint saves and restores. Only `model` is required; a null pointer
// means "not saved" (save) or "leave alone" (load). On load, a target that is
// present but absent from the checkpoint is an error (you asked for it).
struct CheckpointTargets {
  Module* model = nullptr;
  Optimizer* optimizer = nullptr;
  LRScheduler* scheduler = nullptr;
  Generator* generator = nullptr;  // e.g. &default_generator(): dropout, init, augmentation
  // Further named streams, e.g. {"dropout1", &dropout_layer->generator()} for a Dropout
  // built with its own seed. Saved under "rng_extra" in the JSON record.
  std::vector<std::pair<std::string, Generator*>> extra_generators = {};
  // Further tensors, saved as "extra.<name>" in the .safetensors file and loaded in
  // place (into the very tensor given here, converted to its dtype; same shape
  // required), e.g. O2's float32 master weights (ddp::MasterWeights::checkpoint_tensors).
  std::vector<std::pair<std::string, Tensor>> extra_tensors = {};
};

// Where training was: the epoch to run next and the global step (optimizer updates so far).
struct TrainingProgress {
  int64_t epoch = 0;
  int64_t step = 0;
};

struct CheckpointInfo {
  std::string stem;          // path without extension
  TrainingProgress progress;
  nlohmann::json extra;      // the user's extras given to save (null when none)
  nlohmann::json metadata;   // the whole JSON record
  // load_checkpoint only: each value the checkpoint restored over a different one this
  // run had set, one line each, e.g. "lr_scheduler: CosineAnnealingLR t_max: the loaded
  // state's 30 replaces 40 (...)". Loading succeeded; a caller should show these (once, e.g.
  // beside its "resumed from"), since the run now follows the checkpoint's values.
  std::vector<std::string> notes;
};

// Writes <stem>.safetensors then <stem>.json, each atomically. `save_sequence` (> 0) is
// recorded for CheckpointManager, which orders its checkpoints by it; 0 records none.
void save_checkpoint(const std::string& stem, const CheckpointTargets& targets, TrainingProgress progress,
                     const nlohmann::json& extra = nullptr, int64_t save_sequence = 0);

// Reads and verifies <stem>.json and <stem>.safetensors (size, CRC-32, parse) without
// touching any model. Throws CheckpointError naming the file and what is wrong.
CheckpointInfo read_checkpoint_info(const std::string& stem);

// Validates the checkpoint against every target, then restores them. Throws
// CheckpointError (changing nothing) on any mismatch.
CheckpointInfo load_checkpoint(const std::string& stem, const CheckpointTargets& targets);

// Numbered checkpoints in one directory: <dir>/<prefix>-<step, 10 digits>.{safetensors,json},
// and <prefix>-<step>-<n>.{safetensors,json} (n = 1, 2, ...) for later saves at a step
// that already has a checkpoint. A committed checkpoint is never written over.
class CheckpointManager {
 public:
  // keep_last >= 1: after each save, complete checkpoints older than the newest keep_last
  // complete ones are deleted. "Newest" is the order of saving (each record carries a
  // save sequence), not the step: a run resumed from an earlier checkpoint, or started
  // over in a directory of higher-step checkpoints, keeps its own newest ones and
  // resumes from them; the abandoned run's are pruned first. A damaged one (unreadable record, tensor file of the
  // wrong size) is never deleted and does not count: it is left for a person.
  explicit CheckpointManager(std::string directory, int keep_last = 3, std::string prefix = "ckpt");

  // Saves as <prefix>-<progress.step>, or <prefix>-<progress.step>-<n> with the next
  // free n when that step already has a checkpoint; returns the stem. Creates the
  // directory if needed. Then prunes to keep_last, never deleting the new one.
  std::string save(const CheckpointTargets& targets, TrainingProgress progress,
                   const nlohmann::json& extra = nullptr);

  // Stems of every checkpoint record (.json) in the directory (valid or not), oldest
  // first in the order they were saved; records without a save sequence (older files)
  // come first and unreadable ones last, each by (step, n).
  std::vector<std::string> list() const;
  // The newest checkpoint that passes read_checkpoint_info; invalid newer ones are
  // skipped (their problems are appended to `skipped` when given).
  std::optional<std::string> latest_valid(std::vector<std::string>* skipped = nullptr) const;
  // Where an automatic resume starts: latest_valid(), or nullopt when the directory
  // holds no checkpoint at all. When it holds some and none is valid it throws
  // CheckpointError listing why each was rejected, ending with `how_to_start_fresh`
  // (e.g. "drop --resume to start fresh"): starting over would soon prune them, and
  // they may be all that is left of the run.
  std::optional<std::string> resume_point(const std::string& how_to_start_fresh,
                                          std::vector<std::string>* skipped = nullptr) const;
  // load_checkpoint(latest_valid()) or nullopt when there is none.
  std::optional<CheckpointInfo> restore_latest(const CheckpointTargets& targets,
                                               std::vector<std::string>* skipped = nullptr) const;

  const std::string& directory() const { return directory_; }
  int keep_last() const { return keep_last_; }

 private:
  // A checkpoint's name: step, then the n of "-<n>" (0 for none).
  struct CheckpointKey {
    int64_t step = 0;
    int64_t seq = 0;
    auto operator<=>(const CheckpointKey&) const = default;
  };
  // (save sequence from the record, 0 when it has none, then the name's key), stem.
  struct Saved {
    int64_t save_sequence = 0;
    CheckpointKey key;
    std::string stem;
  };
  std::vector<Saved> list_saved() const;  // in save order
  // The key of "<prefix>-<step>[-<n>]<ext>", or nullopt for any other name.
  std::optional<CheckpointKey> parse_key(const std::string& filename, const std::string& ext) const;
  void prune(const std::string& just_written) const;
  std::string directory_;
  int keep_last_;
  std::string prefix_;
};

}  // namespace ringtrain::nn
