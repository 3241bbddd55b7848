// checkpoint.cc: checkpoint files, validation before mutation, keep-last-K.
//
// Load is split in two phases so that a bad checkpoint can never half-load:
//   plan:  open + verify both files, then check every target against them and
//          collect every problem into one message;
//   apply: write model, optimizer, schedule, generator. Should an apply step
//          still throw (a stricter check inside a component), the components
//          already written are rolled back from snapshots taken before apply.
#include "nn/checkpoint.h"

#include <signal.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <set>
#include <sstream>
#include <tuple>

#include "tensor/safetensors.h"

namespace ringtrain::nn {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

constexpr const char* kFormat = "ringtrain-checkpoint";
constexpr int kFormatVersion = 1;
constexpr const char* kModelPrefix = "model.";
constexpr const char* kOptimizerPrefix = "optimizer.";
constexpr const char* kExtraPrefix = "extra.";
// The JSON record's checksum field: CRC-32 of the record's compact dump without it.
constexpr const char* kRecordCrcKey = "record_crc32";

std::string json_path(const std::string& stem) { return stem + ".json"; }
std::string tensors_path(const std::string& stem) { return stem + ".safetensors"; }

// The whole file, or nullopt when it cannot be opened.
std::optional<std::string> slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return std::nullopt;
  std::ostringstream os;
  os << f.rdbuf();
  return os.str();
}

uint32_t crc32_of(const std::string& bytes) {
  return static_cast<uint32_t>(
      crc32_z(crc32(0L, Z_NULL, 0), reinterpret_cast<const Bytef*>(bytes.data()), bytes.size()));
}

json shape_json(const Shape& s) { return json(s); }

std::string join(const std::vector<std::string>& items, size_t max_items = 20) {
  std::string out;
  for (size_t i = 0; i < items.size() && i < max_items; ++i) out += (i ? ", " : "") + items[i];
  if (items.size() > max_items) out += ", ... (" + std::to_string(items.size() - max_items) + " more)";
  return out;
}

// A checkpoint opened and verified: the JSON record and the parsed tensors.
struct OpenedCheckpoint {
  json meta;
  SafetensorsFile tensors;
};

// Reads and checks a checkpoint's JSON record: format, version, progress and the
// fields that name its tensor file. Throws CheckpointError naming the file.
json read_record(const std::string& stem) {
  const std::string jpath = json_path(stem);
  std::optional<std::string> text = slurp(jpath);
  if (!text) throw CheckpointError(jpath + ": checkpoint record not found (or unreadable)");
  json m;
  try {
    m = json::parse(*text);
  } catch (const json::exception& e) {
    throw CheckpointError(jpath + ": malformed JSON (" + e.what() + ")");
  }
  auto need = [&](bool ok, const std::string& what) {
    if (!ok) throw CheckpointError(jpath + ": " + what);
  };
  // Every field's type is checked before it is read: json's value()/get() throw their
  // own type_error on a field of another type (a hand-edited or foreign record), which
  // would escape the callers that skip damaged checkpoints.
  need(m.is_object() && m.contains("format") && m["format"].is_string() && m["format"] == kFormat,
       "not a ringtrain checkpoint (\"format\" is not \"" + std::string(kFormat) + "\")");
  need(m.contains("version") && m["version"].is_number_integer() && m["version"] == kFormatVersion,
       "unsupported checkpoint version " + m.value("version", json()).dump() + " (this build reads " +
           std::to_string(kFormatVersion) + ")");
  // The record's own checksum: the tensors' CRC does not cover the record, and a flipped
  // digit in it (the step, an RNG offset, a learning rate, the batch to resume at) still
  // parses and would load silently. Records written before it existed have none.
  if (m.contains(kRecordCrcKey)) {
    need(m[kRecordCrcKey].is_number_unsigned(), std::string("\"") + kRecordCrcKey + "\" is not an unsigned integer");
    json body = m;
    body.erase(kRecordCrcKey);
    need(crc32_of(body.dump()) == m[kRecordCrcKey].get<uint64_t>(),
         std::string("corrupt: the record's contents do not match its CRC-32 (\"") + kRecordCrcKey +
             "\"); it was damaged or edited. To load an edited record on purpose, delete its \"" +
             kRecordCrcKey + "\" line");
  }
  need(m.contains("epoch") && m["epoch"].is_number_integer() && m.contains("step") &&
           m["step"].is_number_integer(),
       "missing integer \"epoch\"/\"step\"");
  need(m.contains("tensors_file") && m["tensors_file"].is_string() && m.contains("tensors_bytes") &&
           m["tensors_bytes"].is_number_unsigned() && m.contains("tensors_crc32") &&
           m["tensors_crc32"].is_number_unsigned(),
       "missing \"tensors_file\"/\"tensors_bytes\"/\"tensors_crc32\"");
  return m;
}

// The tensor file a (checked) record names.
std::string tensors_file_of(const std::string& stem, const json& record) {
  return (fs::path(stem).parent_path() / record["tensors_file"].get<std::string>()).string();
}

OpenedCheckpoint open_checkpoint(const std::string& stem) {
  const std::string jpath = json_path(stem);
  OpenedCheckpoint out;
  out.meta = read_record(stem);
  const json& m = out.meta;
  const std::string tpath = tensors_file_of(stem, m);
  std::optional<std::string> bytes = slurp(tpath);
  if (!bytes) throw CheckpointError(tpath + ": tensor file not found (named by " + jpath + ")");
  const auto expected_bytes = m["tensors_bytes"].get<uint64_t>();
  if (bytes->size() != expected_bytes) {
    throw CheckpointError(tpath + ": " + (bytes->size() < expected_bytes ? "truncated" : "wrong size") + ": " +
                          std::to_string(bytes->size()) + " bytes, the record says " +
                          std::to_string(expected_bytes));
  }
  const auto expected_crc = m["tensors_crc32"].get<uint32_t>();
  if (crc32_of(*bytes) != expected_crc) {
    throw CheckpointError(tpath + ": corrupt: CRC-32 does not match the record in " + jpath);
  }
  try {
    out.tensors = load_safetensors(tpath);
  } catch (const std::exception& e) {
    throw CheckpointError(std::string("checkpoint tensors unreadable: ") + e.what());
  }
  return out;
}

// The optimizer's parameters in global index order (how its state is keyed).
std::vector<Tensor> optimizer_params(const Optimizer& opt) {
  std::vector<Tensor> out;
  for (const ParamGroup& g : opt.param_groups()) out.insert(out.end(), g.params.begin(), g.params.end());
  return out;
}

}  // namespace

// ---------------------------------------------------------------- save

void save_checkpoint(const std::string& stem, const CheckpointTargets& targets, TrainingProgress progress,
                     const json& extra, int64_t save_sequence) {
  RT_CHECK(targets.model != nullptr, "save_checkpoint(", stem, "): targets.model is null");
  std::vector<std::pair<std::string, Tensor>> tensors;
  json model_keys = json::array();
  for (const auto& [name, t] : targets.model->state_dict()) {
    tensors.emplace_back(kModelPrefix + name, t);
    model_keys.push_back({{"name", name}, {"shape", shape_json(t.shape())}, {"dtype", dtype_name(t.dtype())}});
  }
  json meta = {{"format", kFormat},
               {"version", kFormatVersion},
               {"epoch", progress.epoch},
               {"step", progress.step},
               {"model", {{"type", targets.model->type_name()}, {"keys", model_keys}}},
               {"optimizer", nullptr},
               {"lr_scheduler", nullptr},
               {"rng", nullptr},
               {"extra", extra}};
  if (save_sequence > 0) meta["save_sequence"] = save_sequence;
  if (targets.optimizer != nullptr) {
    OptimizerState st = targets.optimizer->state_dict();
    for (auto& [name, t] : st.tensors) tensors.emplace_back(kOptimizerPrefix + name, t);
    meta["optimizer"] = st.scalars;
  }
  {
    std::set<std::string> seen;
    for (const auto& [name, t] : targets.extra_tensors) {
      RT_CHECK(t.defined(), "save_checkpoint(", stem, "): extra tensor '", name, "' is undefined");
      RT_CHECK(seen.insert(name).second, "save_checkpoint(", stem, "): extra tensor '", name, "' given twice");
      tensors.emplace_back(kExtraPrefix + name, t);
    }
  }
  if (targets.scheduler != nullptr) meta["lr_scheduler"] = targets.scheduler->state_dict();
  if (targets.generator != nullptr) {
    meta["rng"] = {{"seed", targets.generator->seed()}, {"offset", targets.generator->offset()}};
  }
  if (!targets.extra_generators.empty()) {
    json extra_rng = json::object();
    for (const auto& [name, gen] : targets.extra_generators) {
      RT_CHECK(gen != nullptr, "save_checkpoint(", stem, "): extra generator '", name, "' is null");
      RT_CHECK(!extra_rng.contains(name), "save_checkpoint(", stem, "): extra generator '", name, "' given twice");
      extra_rng[name] = {{"seed", gen->seed()}, {"offset", gen->offset()}};
    }
    meta["rng_extra"] = extra_rng;
  }

  // Tensors first: until the JSON record lands, this checkpoint does not exist.
  const std::string tpath = tensors_path(stem);
  save_safetensors(tpath, tensors,
                   {{"format", kFormat}, {"epoch", std::to_string(progress.epoch)},
                    {"step", std::to_string(progress.step)}});
  std::optional<std::string> written = slurp(tpath);
  if (!written) throw CheckpointError(tpath + ": cannot read back the file just written");
  meta["tensors_file"] = fs::path(tpath).filename().string();
  meta["tensors_bytes"] = written->size();
  meta["tensors_crc32"] = crc32_of(*written);
  // Last: the checksum of everything above (read_record recomputes it the same way).
  meta[kRecordCrcKey] = crc32_of(meta.dump());
  write_file_atomically(json_path(stem), meta.dump(2) + "\n");
}

// ---------------------------------------------------------------- load

CheckpointInfo read_checkpoint_info(const std::string& stem) {
  OpenedCheckpoint ck = open_checkpoint(stem);
  CheckpointInfo info;
  info.stem = stem;
  info.progress = {ck.meta["epoch"].get<int64_t>(), ck.meta["step"].get<int64_t>()};
  info.extra = ck.meta.value("extra", json());
  info.metadata = ck.meta;
  return info;
}

CheckpointInfo load_checkpoint(const std::string& stem, const CheckpointTargets& targets) {
  RT_CHECK(targets.model != nullptr, "load_checkpoint(", stem, "): targets.model is null");
  OpenedCheckpoint ck = open_checkpoint(stem);
  const json& meta = ck.meta;
  std::vector<std::string> problems;

  // ---- plan: model ----
  std::map<std::string, Tensor> file_model;
  std::map<std::string, Tensor> file_optim;
  std::map<std::string, Tensor> file_extra;
  for (const auto& [name, t] : ck.tensors.tensors) {
    if (name.rfind(kModelPrefix, 0) == 0) file_model.emplace(name.substr(6), t);
    else if (name.rfind(kOptimizerPrefix, 0) == 0) file_optim.emplace(name.substr(10), t);
    else if (name.rfind(kExtraPrefix, 0) == 0) file_extra.emplace(name.substr(6), t);
  }
  StateDict model_state = targets.model->state_dict();
  std::vector<std::string> missing, unexpected, mis_shaped;
  std::map<std::string, bool> in_model;
  StateDict to_load;
  for (const auto& [name, t] : model_state) {
    in_model[name] = true;
    auto it = file_model.find(name);
    if (it == file_model.end()) {
      missing.push_back(name);
    } else if (it->second.shape() != t.shape()) {
      mis_shaped.push_back(name + " (checkpoint " + shape_str(it->second.shape()) + ", model " +
                           shape_str(t.shape()) + ")");
    } else {
      to_load.emplace_back(name, it->second);
    }
  }
  for (const auto& [name, t] : file_model) {
    if (!in_model.count(name)) unexpected.push_back(name);
  }
  if (!missing.empty()) problems.push_back("missing from the checkpoint: " + join(missing));
  if (!unexpected.empty()) problems.push_back("in the checkpoint but not in the model: " + join(unexpected));
  if (!mis_shaped.empty()) problems.push_back("shape mismatch: " + join(mis_shaped));

  // ---- plan: optimizer ----
  OptimizerState opt_state;
  if (targets.optimizer != nullptr) {
    const json& o = meta.value("optimizer", json());
    // Each type checked before value() reads it: on a record of another shape (edited,
    // without its CRC) json throws a bare type_error that names neither file nor field.
    if (o.is_null()) {
      problems.push_back("optimizer: the checkpoint has no optimizer state");
    } else if (!o.is_object()) {
      problems.push_back("optimizer: the record's \"optimizer\" is " + o.dump() +
                         ", not an object {\"type\", \"param_groups\", \"state\"}");
    } else if (!o.contains("type") || !o["type"].is_string() ||
               o["type"].get<std::string>() != targets.optimizer->type_name()) {
      problems.push_back("optimizer: checkpoint has " + o.value("type", json("?")).dump() + ", this run uses " +
                         targets.optimizer->type_name());
    } else {
      const auto& groups = targets.optimizer->param_groups();
      const json& fg = o.value("param_groups", json::array());
      if (!fg.is_array() || fg.size() != groups.size()) {
        problems.push_back("optimizer: checkpoint has " + std::to_string(fg.is_array() ? fg.size() : 0) +
                           " param groups, this optimizer " + std::to_string(groups.size()));
      } else {
        for (size_t g = 0; g < groups.size(); ++g) {
          size_t n = fg[g].contains("params") ? fg[g]["params"].size() : 0;
          if (n != groups[g].params.size()) {
            problems.push_back("optimizer: param group " + std::to_string(g) + " has " + std::to_string(n) +
                               " parameters in the checkpoint, " + std::to_string(groups[g].params.size()) +
                               " here");
          }
        }
        std::vector<Tensor> params = optimizer_params(*targets.optimizer);
        for (const auto& [name, t] : file_optim) {
          std::optional<StateTensorName> state = parse_state_tensor_name(name);
          if (!state || state->param_index >= params.size()) {
            problems.push_back("optimizer: state tensor " + name + " names no parameter of this optimizer");
          } else if (t.shape() != params[state->param_index].shape()) {
            problems.push_back("optimizer: state tensor " + name + " has shape " + shape_str(t.shape()) +
                               ", parameter " + std::to_string(state->param_index) + " has " +
                               shape_str(params[state->param_index].shape()));
          }
          opt_state.tensors.emplace_back(name, t);
        }
      }
      opt_state.scalars = o;
    }
  }

  // ---- plan: schedule, generator ----
  // Every check load_state_dict makes (type, groups, last_epoch, base lrs, each saved
  // hyperparameter in the constructor's range), so a bad state is a problem listed
  // here, not a throw and a rollback in the apply below.
  json sched_state;
  if (targets.scheduler != nullptr) {
    sched_state = meta.value("lr_scheduler", json());
    if (sched_state.is_null()) {
      problems.push_back("lr_scheduler: the checkpoint has no LR schedule state");
    } else {
      try {
        targets.scheduler->check_state_dict(sched_state);
      } catch (const Error& e) {
        problems.push_back(std::string("lr_scheduler: ") + e.what());
      }
    }
  }
  // A generator's state is two unsigned integers; anything else is a problem found
  // here, in the plan, not a throw half-way through the apply below.
  auto is_generator_state = [](const json& state) {
    return state.is_object() && state.contains("seed") && state["seed"].is_number_unsigned() &&
           state.contains("offset") && state["offset"].is_number_unsigned();
  };
  const json& rng = meta.value("rng", json());
  if (targets.generator != nullptr && !is_generator_state(rng)) {
    problems.push_back("rng: the checkpoint has no generator state (unsigned \"seed\" and \"offset\")");
  }
  const json& rng_extra = meta.value("rng_extra", json::object());
  for (const auto& [name, gen] : targets.extra_generators) {
    if (!rng_extra.is_object() || !rng_extra.contains(name) || !is_generator_state(rng_extra[name])) {
      problems.push_back("rng: the checkpoint has no state for generator '" + name + "'");
    }
  }

  // ---- plan: extra tensors ----
  for (const auto& [name, t] : targets.extra_tensors) {
    auto it = file_extra.find(name);
    if (it == file_extra.end()) {
      problems.push_back("extra tensor '" + name + "': not in the checkpoint");
    } else if (!t.defined() || it->second.shape() != t.shape()) {
      problems.push_back("extra tensor '" + name + "': checkpoint " + shape_str(it->second.shape()) +
                         ", here " + (t.defined() ? shape_str(t.shape()) : std::string("undefined")));
    }
  }

  if (!problems.empty()) {
    std::string msg = "checkpoint " + stem + " does not fit this run; nothing was loaded:";
    for (const std::string& p : problems) msg += "\n  " + p;
    if (!missing.empty() || !unexpected.empty() || !mis_shaped.empty()) {
      const json model_meta = meta.value("model", json::object());
      const std::string saved_type = model_meta.is_object() && model_meta.contains("type") &&
                                             model_meta["type"].is_string()
                                         ? model_meta["type"].get<std::string>()
                                         : "?";
      msg += "\n  (was it saved from a different model? checkpoint model type: " + saved_type +
             ", this model: " + targets.model->type_name() + ")";
    }
    throw CheckpointError(msg);
  }

  // ---- apply, with rollback ----
  StateDict model_snapshot;
  for (const auto& [name, t] : model_state) model_snapshot.emplace_back(name, t.clone());
  OptimizerState opt_snapshot;
  if (targets.optimizer != nullptr) {
    opt_snapshot = targets.optimizer->state_dict();
    for (auto& [name, t] : opt_snapshot.tensors) t = t.clone();
  }
  json sched_snapshot = targets.scheduler ? targets.scheduler->state_dict() : json();
  std::vector<Tensor> extra_snapshot;
  for (const auto& [name, t] : targets.extra_tensors) extra_snapshot.push_back(t.clone());
  struct GeneratorSnapshot {
    Generator* generator;
    uint64_t seed, offset;
  };
  std::vector<GeneratorSnapshot> generator_snapshot;
  if (targets.generator != nullptr)
    generator_snapshot.push_back({targets.generator, targets.generator->seed(), targets.generator->offset()});
  for (const auto& [name, gen] : targets.extra_generators) generator_snapshot.push_back({gen, gen->seed(), gen->offset()});
  int stage = 0;
  std::vector<std::string> notes;  // what the checkpoint changed that this run had set otherwise
  try {
    targets.model->load_state_dict(to_load, /*strict=*/true);
    stage = 1;
    if (targets.optimizer != nullptr) targets.optimizer->load_state_dict(opt_state);
    stage = 2;
    if (targets.scheduler != nullptr) {
      std::vector<std::string> changed;
      targets.scheduler->load_state_dict(sched_state, &changed);
      for (const std::string& c : changed) notes.push_back("lr_scheduler: " + c);
    }
    stage = 3;
    if (targets.generator != nullptr) {
      targets.generator->set_state(rng["seed"].get<uint64_t>(), rng["offset"].get<uint64_t>());
    }
    for (const auto& [name, gen] : targets.extra_generators) {
      gen->set_state(rng_extra[name]["seed"].get<uint64_t>(), rng_extra[name]["offset"].get<uint64_t>());
    }
    stage = 4;
    for (const auto& [name, t] : targets.extra_tensors) {
      Tensor target = t;
      target.copy_(file_extra.at(name));
    }
  } catch (const std::exception& e) {
    if (stage >= 4) {
      for (size_t i = 0; i < extra_snapshot.size(); ++i) {
        Tensor target = targets.extra_tensors[i].second;
        target.copy_(extra_snapshot[i]);
      }
    }
    if (stage >= 1) targets.model->load_state_dict(model_snapshot, true);
    if (stage >= 2 && targets.optimizer != nullptr) targets.optimizer->load_state_dict(opt_snapshot);
    if (stage >= 3 && targets.scheduler != nullptr) targets.scheduler->load_state_dict(sched_snapshot);
    if (stage >= 3) {
      for (const GeneratorSnapshot& g : generator_snapshot) g.generator->set_state(g.seed, g.offset);
    }
    throw CheckpointError("checkpoint " + stem + ": restoring failed and was rolled back: " + e.what());
  }

  CheckpointInfo info;
  info.stem = stem;
  info.progress = {meta["epoch"].get<int64_t>(), meta["step"].get<int64_t>()};
  info.extra = meta.value("extra", json());
  info.metadata = meta;
  info.notes = std::move(notes);
  return info;
}

// ---------------------------------------------------------------- manager

CheckpointManager::CheckpointManager(std::string directory, int keep_last, std::string prefix)
    : directory_(std::move(directory)), keep_last_(keep_last), prefix_(std::move(prefix)) {
  RT_CHECK(keep_last_ >= 1, "CheckpointManager: keep_last must be >= 1, got ", keep_last_);
  RT_CHECK(!prefix_.empty() && prefix_.find('/') == std::string::npos,
           "CheckpointManager: prefix must be a non-empty file name part, got '", prefix_, "'");
}

std::string CheckpointManager::save(const CheckpointTargets& targets, TrainingProgress progress,
                                    const json& extra) {
  RT_CHECK(progress.step >= 0, "CheckpointManager::save: step must be non-negative, got ", progress.step);
  std::error_code ec;
  fs::create_directories(directory_, ec);
  if (ec) throw CheckpointError("CheckpointManager: cannot create the checkpoint directory " + directory_ + ": " + ec.message());
  // Never write over a committed checkpoint: overwriting is two renames (tensors,
  // then record), and a crash between them would leave a record whose CRC no longer
  // matches, i.e. no valid checkpoint at that step at all. A second save at a step
  // that already has one (a run stopped on the last batch of an epoch saves again
  // at the epoch end after resuming) takes the next free "-<n>" suffix instead.
  char number[32];
  std::snprintf(number, sizeof(number), "%010lld", static_cast<long long>(progress.step));
  std::string name = prefix_ + "-" + number;
  int64_t last_seq = -1, last_saved = 0;
  for (const Saved& existing : list_saved()) {
    if (existing.key.step == progress.step) last_seq = std::max(last_seq, existing.key.seq);
    if (existing.save_sequence != std::numeric_limits<int64_t>::max())  // an unreadable record
      last_saved = std::max(last_saved, existing.save_sequence);
  }
  if (last_seq >= 0) name += "-" + std::to_string(last_seq + 1);
  std::string stem = (fs::path(directory_) / name).string();
  save_checkpoint(stem, targets, progress, extra, last_saved + 1);
  prune(stem);
  return stem;
}

std::optional<CheckpointManager::CheckpointKey> CheckpointManager::parse_key(const std::string& filename,
                                                                             const std::string& ext) const {
  // "<prefix>-<step>" or "<prefix>-<step>-<seq>" followed by ext.
  const std::string head = prefix_ + "-";
  if (filename.size() <= head.size() + ext.size() || filename.rfind(head, 0) != 0 ||
      filename.compare(filename.size() - ext.size(), ext.size(), ext) != 0) {
    return std::nullopt;
  }
  const char* b = filename.data() + head.size();
  const char* e = filename.data() + filename.size() - ext.size();
  CheckpointKey key;
  auto [ptr, ec] = std::from_chars(b, e, key.step);
  if (ec != std::errc() || key.step < 0) return std::nullopt;
  if (ptr == e) return key;
  if (*ptr != '-' || ptr + 1 == e) return std::nullopt;
  auto [ptr2, ec2] = std::from_chars(ptr + 1, e, key.seq);
  if (ec2 != std::errc() || ptr2 != e || key.seq < 1) return std::nullopt;
  return key;
}

std::vector<CheckpointManager::Saved> CheckpointManager::list_saved() const {
  std::vector<Saved> found;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(directory_, ec)) {
    std::string name = entry.path().filename().string();
    if (std::optional<CheckpointKey> key = parse_key(name, ".json")) {
      // The record's save sequence: 0 for a record written without one (older files),
      // so it sorts before every sequenced one. A record that cannot be read at all sorts
      // last, as if newest: latest_valid() then tries it first and reports why it skipped
      // it, and prune() never counts or deletes it (it is not complete).
      Saved saved{std::numeric_limits<int64_t>::max(), *key,
                  (fs::path(directory_) / name.substr(0, name.size() - 5)).string()};
      if (std::optional<std::string> text = slurp(entry.path().string())) {
        const json record = json::parse(*text, nullptr, /*allow_exceptions=*/false);
        if (record.is_object()) {
          saved.save_sequence = 0;
          if (record.contains("save_sequence") && record["save_sequence"].is_number_integer())
            saved.save_sequence = std::max<int64_t>(0, record["save_sequence"].get<int64_t>());
        }
      }
      found.push_back(std::move(saved));
    }
  }
  std::sort(found.begin(), found.end(), [](const Saved& a, const Saved& b) {
    return std::tie(a.save_sequence, a.key) < std::tie(b.save_sequence, b.key);
  });
  return found;
}

std::vector<std::string> CheckpointManager::list() const {
  std::vector<std::string> out;
  for (Saved& saved : list_saved()) out.push_back(std::move(saved.stem));
  return out;
}

std::optional<std::string> CheckpointManager::latest_valid(std::vector<std::string>* skipped) const {
  std::vector<std::string> stems = list();
  for (auto it = stems.rbegin(); it != stems.rend(); ++it) {
    try {
      read_checkpoint_info(*it);
      return *it;
    } catch (const CheckpointError& e) {
      if (skipped != nullptr) skipped->push_back(e.what());
    }
  }
  return std::nullopt;
}

std::optional<std::string> CheckpointManager::resume_point(const std::string& how_to_start_fresh,
                                                           std::vector<std::string>* skipped) const {
  std::vector<std::string> problems;
  std::optional<std::string> stem = latest_valid(&problems);
  if (skipped != nullptr) skipped->insert(skipped->end(), problems.begin(), problems.end());
  if (stem || problems.empty()) return stem;
  // Starting fresh here would soon rotate the damaged checkpoints away; they may be
  // all that is left of the run (a bad JSON record, say, with intact tensors).
  std::string reasons;
  for (const std::string& p : problems) reasons += "\n  " + p;
  throw CheckpointError(directory_ + " holds " + std::to_string(problems.size()) +
                        " checkpoint(s) and none is valid, so resuming will not start over on top of "
                        "them (nothing was deleted). Repair or move them, or " + how_to_start_fresh + ":" +
                        reasons);
}

std::optional<CheckpointInfo> CheckpointManager::restore_latest(const CheckpointTargets& targets,
                                                                std::vector<std::string>* skipped) const {
  std::optional<std::string> stem = latest_valid(skipped);
  if (!stem) return std::nullopt;
  return load_checkpoint(*stem, targets);
}

namespace {
// The cheap half of open_checkpoint's checks, for pruning: the record passes
// read_record (so a record of another format version does not count) and its tensor
// file has the recorded size (no CRC: reading every kept checkpoint back at each
// save would double the checkpoint I/O).
bool looks_complete(const std::string& stem) {
  json record;
  try {
    record = read_record(stem);
  } catch (const std::exception&) {  // CheckpointError, or a file-system error reading it
    return false;
  }
  std::error_code ec;
  const auto size = fs::file_size(tensors_file_of(stem, record), ec);
  return !ec && size == record["tensors_bytes"].get<uint64_t>();
}
}  // namespace

void CheckpointManager::prune(const std::string& just_written) const {
  std::error_code ec;
  // Temporary files of atomic writes whose writer died (".<file>.tmp.<pid>", see
  // write_file_atomically): the process is gone, so nobody will ever rename them.
  // (Only the saving rank prunes, so a pid here is one of this host's processes.)
  for (const auto& entry : fs::directory_iterator(directory_, ec)) {
    const std::string name = entry.path().filename().string();
    const std::string tmp_tag = ".tmp.";
    const size_t tag = name.rfind(tmp_tag);
    if (name.rfind("." + prefix_ + "-", 0) == 0 && tag != std::string::npos) {
      pid_t writer = static_cast<pid_t>(std::atol(name.c_str() + tag + tmp_tag.size()));
      if (writer > 0 && writer != ::getpid() && ::kill(writer, 0) != 0 && errno == ESRCH) fs::remove(entry.path(), ec);
    }
  }
  // Only complete checkpoints count towards keep_last and only they are deleted: a
  // damaged one (a bad record, a truncated file) is left for a person to look at,
  // and must not push the last good ones out.
  // In save order, so the ones dropped are the least recently saved, whatever their steps.
  std::vector<Saved> complete;
  for (Saved& saved : list_saved())
    if (saved.stem == just_written || looks_complete(saved.stem)) complete.push_back(std::move(saved));
  if (static_cast<int>(complete.size()) <= keep_last_) return;
  const size_t n_drop = complete.size() - static_cast<size_t>(keep_last_);
  for (size_t i = 0; i < n_drop; ++i) {
    // The checkpoint just written is valid (save read it back for its CRC): never drop
    // it (it is the newest anyway), or the directory could be left without a valid one.
    if (complete[i].stem == just_written) continue;
    fs::remove(json_path(complete[i].stem), ec);  // un-commit first, then the data
    fs::remove(tensors_path(complete[i].stem), ec);
  }
  // Tensor files whose record never landed (a crash mid-save), numbered below every
  // checkpoint kept.
  CheckpointKey oldest_kept = complete[n_drop].key;
  for (size_t i = n_drop; i < complete.size(); ++i) oldest_kept = std::min(oldest_kept, complete[i].key);
  for (const auto& entry : fs::directory_iterator(directory_, ec)) {
    std::string name = entry.path().filename().string();
    std::optional<CheckpointKey> key = parse_key(name, ".safetensors");
    if (key && *key < oldest_kept &&
        !fs::exists(entry.path().parent_path() / (name.substr(0, name.size() - 12) + ".json"))) {
      fs::remove(entry.path(), ec);
    }
  }
}

}  // namespace ringtrain::nn
