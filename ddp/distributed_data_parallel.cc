// distributed_data_parallel.cc: construction checks, state broadcast, forward.
#include "ddp/distributed_data_parallel.h"

#include "autograd/graph.h"

#include <iterator>
#include <sstream>

#include "autograd/autograd.h"
#include "tensor/ops.h"

namespace ringtrain::ddp {

namespace {
constexpr size_t kMaxDims = 8;
// One tensor's signature: dtype, requires_grad, rank, dims. requires_grad is in it
// because it decides which parameters the Reducer buckets: a parameter frozen on one
// rank only would give the ranks different bucket layouts, and the first allreduce
// would fail on a size mismatch that names no parameter. A tensor of more than
// kMaxDims dims keeps its first kMaxDims - 1 sizes and a hash of the rest.
constexpr size_t kSignatureWords = 3 + kMaxDims;

void fill_signature(const Tensor& t, bool is_parameter, int64_t* s) {
  s[0] = static_cast<int64_t>(t.dtype());
  s[1] = is_parameter && autograd::requires_grad(t) ? 1 : 0;
  s[2] = t.dim();
  const int64_t kept = t.dim() <= static_cast<int64_t>(kMaxDims) ? t.dim() : kMaxDims - 1;
  for (int64_t d = 0; d < kept; ++d) s[3 + d] = t.size(d);
  if (kept < t.dim()) {
    uint64_t hash = 1469598103934665603ull;  // FNV-1a over the remaining sizes
    for (int64_t d = kept; d < t.dim(); ++d) hash = (hash ^ static_cast<uint64_t>(t.size(d))) * 1099511628211ull;
    s[3 + kept] = static_cast<int64_t>(hash);
  }
}

std::string describe_signature(const int64_t* s, bool is_parameter) {
  std::ostringstream os;
  os << dtype_name(static_cast<DType>(s[0])) << "[";
  const bool folded = s[2] > static_cast<int64_t>(kMaxDims);
  const int64_t shown = folded ? kMaxDims - 1 : s[2];
  for (int64_t d = 0; d < shown; ++d) os << (d ? ", " : "") << s[3 + d];
  if (folded) os << ", ... (" << s[2] << " dims)";
  os << "]";
  if (is_parameter) os << (s[1] ? " requiring grad" : " frozen (requires_grad=false)");
  return os.str();
}
}  // namespace

DistributedDataParallel::DistributedDataParallel(std::shared_ptr<nn::Module> module,
                                                 std::shared_ptr<comm::ProcessGroup> group,
                                                 DdpOptions options)
    : module_(std::move(module)), group_(std::move(group)), options_(options) {
  RT_CHECK(module_ != nullptr, "DistributedDataParallel: module is null");
  RT_CHECK(group_ != nullptr, "DistributedDataParallel: process group is null; call "
                              "comm::init_process_group() first");
  verify_same_state();
  // Buffers only with broadcast_buffers, as PyTorch's _sync_module_states: a model whose
  // buffers differ by design (per-rank statistics) keeps them.
  broadcast_state(/*parameters=*/true, /*buffers=*/options_.broadcast_buffers);
  std::vector<Tensor> params;
  std::vector<std::string> names;
  for (auto& [name, p] : module_->named_parameters()) {
    if (!autograd::requires_grad(p)) continue;  // frozen parameters are not reduced
    params.push_back(p);
    names.push_back(name);
  }
  ReducerOptions reducer_options;
  reducer_options.first_bucket_bytes = options_.first_bucket_bytes;
  reducer_options.bucket_bytes_cap = options_.bucket_cap_bytes;
  reducer_options.find_unused_parameters = options_.find_unused_parameters;
  reducer_options.static_graph = options_.static_graph;
  reducer_options.gradient_as_bucket_view = options_.gradient_as_bucket_view;
  reducer_options.symmetric_buckets = options_.symmetric_buckets;
  reducer_options.overlap = options_.overlap;
  reducer_ = std::make_shared<Reducer>(std::move(params), std::move(names), group_, reducer_options);
}

void DistributedDataParallel::verify_same_state() {
  // The options first: broadcast_buffers decides below whether buffers are compared
  // (a collective), so ranks that disagree on it must be stopped before that.
  verify_same_options();
  verify_same_tensors(module_->named_parameters(), /*parameters=*/true);
  // Buffers only when they are broadcast, as PyTorch checks parameters only: with
  // broadcast_buffers=false each rank keeps its own buffers, and they may legitimately
  // differ (per-rank statistics, a per-rank cache of another size).
  if (options_.broadcast_buffers) verify_same_tensors(module_->named_buffers(), /*parameters=*/false);
}

void DistributedDataParallel::verify_same_options() {
  // The options that decide which collectives DDP issues, and in what order or size:
  // the bucket layout (caps; symmetric allocations are collective themselves, and
  // copying mode allocates a spare and allreduces which spares to replace), the
  // used-parameter allreduce (find_unused_parameters, static_graph), the buffer
  // broadcasts. Ranks that disagree on one would average unrelated buffers or wait in
  // a collective the others never issue. `overlap` is not among them: it moves the
  // launches in time, not the sequence.
  struct Field {
    const char* name;
    int64_t value;
    bool is_bool;
  };
  const Field fields[] = {
      {"bucket_cap_bytes", static_cast<int64_t>(options_.bucket_cap_bytes), false},
      {"first_bucket_bytes", static_cast<int64_t>(options_.first_bucket_bytes), false},
      {"find_unused_parameters", options_.find_unused_parameters, true},
      {"static_graph", options_.static_graph, true},
      {"gradient_as_bucket_view", options_.gradient_as_bucket_view, true},
      {"symmetric_buckets", options_.symmetric_buckets, true},
      {"broadcast_buffers", options_.broadcast_buffers, true},
  };
  constexpr size_t kFields = std::size(fields);
  const int world = group_->size();
  std::vector<int64_t> mine(kFields), all(kFields * world);
  for (size_t f = 0; f < kFields; ++f) mine[f] = fields[f].value;
  group_->allgather({mine.data(), mine.size(), DType::kInt64, Device::cpu()}, {all.data(), all.size(), DType::kInt64, Device::cpu()})
      .wait(group_->options().timeout);
  auto show = [](const Field& field, int64_t value) -> std::string {
    if (field.is_bool) return value ? "true" : "false";
    return std::to_string(value);
  };
  std::ostringstream differences;
  for (size_t f = 0; f < kFields; ++f) {
    const int64_t reference = all[f];
    std::ostringstream others;
    for (int r = 1; r < world; ++r) {
      const int64_t value = all[r * kFields + f];
      if (value == reference) continue;
      others << (others.tellp() > 0 ? ", " : "") << show(fields[f], value) << " on rank " << r;
    }
    if (others.tellp() == 0) continue;
    differences << (differences.tellp() > 0 ? "; " : "") << fields[f].name << " is "
                << show(fields[f], reference) << " on rank 0 but " << others.str();
  }
  if (differences.tellp() == 0) return;
  throw Error(detail::concat(
      "DistributedDataParallel: ranks were given different DdpOptions: ", differences.str(),
      ". These options decide which collectives DDP issues (bucket layout, buffer broadcasts, the "
      "unused-parameter allreduce), so every rank must pass the same values"));
}

void DistributedDataParallel::verify_same_tensors(const std::vector<std::pair<std::string, Tensor>>& named,
                                                  bool parameters) {
  const char* kind = parameters ? "parameter" : "buffer";
  const int world = group_->size();
  // 1. the number of tensors on every rank
  int64_t count = static_cast<int64_t>(named.size());
  std::vector<int64_t> counts(world);
  group_->allgather({&count, 1, DType::kInt64, Device::cpu()}, {counts.data(), counts.size(), DType::kInt64, Device::cpu()})
      .wait(group_->options().timeout);
  for (int r = 0; r < world; ++r) {
    if (counts[r] == counts[0]) continue;
    std::ostringstream os;
    os << "DistributedDataParallel: ranks have different models: rank 0 has " << counts[0] << " " << kind
       << "s but rank " << r << " has " << counts[r]
       << "; every rank must construct the same model before wrapping it in DDP";
    throw Error(os.str());
  }
  // 2. dtype, requires_grad and shape of each, in order
  std::vector<int64_t> mine(named.size() * kSignatureWords, 0);
  for (size_t i = 0; i < named.size(); ++i) fill_signature(named[i].second, parameters, &mine[i * kSignatureWords]);
  std::vector<int64_t> all(mine.size() * world);
  group_->allgather({mine.data(), mine.size(), DType::kInt64, Device::cpu()}, {all.data(), all.size(), DType::kInt64, Device::cpu()})
      .wait(group_->options().timeout);
  for (size_t i = 0; i < named.size(); ++i) {
    const int64_t* reference = &all[i * kSignatureWords];
    for (int r = 1; r < world; ++r) {
      const int64_t* other = &all[(r * named.size() + i) * kSignatureWords];
      if (std::equal(reference, reference + kSignatureWords, other)) continue;
      std::ostringstream os;
      os << "DistributedDataParallel: ranks have different models: " << kind << " #" << i << " ('"
         << named[i].first << "' here on rank " << group_->rank() << ") is "
         << describe_signature(reference, parameters) << " on rank 0 but " << describe_signature(other, parameters)
         << " on rank " << r << "; every rank must construct the same model"
         << (parameters ? ", and freeze the same parameters," : "") << " before wrapping it in DDP";
      throw Error(os.str());
    }
  }
}

void DistributedDataParallel::broadcast_state(bool parameters, bool buffers) {
  if (group_->size() == 1) return;
  autograd::NoGradGuard no_grad;
  std::vector<comm::Work> works;
  // A collective needs contiguous memory; a tensor that is not (a transposed weight, a
  // strided slice) goes through a contiguous copy, written back once the broadcast is done.
  std::vector<std::pair<Tensor, Tensor>> staged;  // (tensor, its contiguous copy)
  auto send = [&](const Tensor& t) {
    if (t.numel() == 0) return;
    if (t.is_contiguous()) {
      works.push_back(group_->broadcast(buffer_of(t), 0));
      return;
    }
    staged.emplace_back(t, t.contiguous());
    works.push_back(group_->broadcast(buffer_of(staged.back().second), 0));
  };
  std::vector<Tensor> written;
  if (parameters)
    for (auto& p : module_->parameters()) written.push_back(p);
  if (buffers)
    for (auto& b : module_->buffers()) written.push_back(b);
  for (Tensor& t : written) send(t);
  for (auto& w : works) w.wait(group_->options().timeout);
  for (auto& [tensor, copy] : staged) tensor.copy_(copy);
  // An in-place write like any other (on rank 0 too, so every rank counts alike): whoever
  // copied these tensors before (MasterWeights' float32 masters) can tell they changed.
  for (Tensor& t : written) t.bump_version();
}

// Buffers (BatchNorm's running statistics) are broadcast from rank 0 before a forward
// when the forward before it was a synced training forward (grad mode on, outside
// no_sync()), and before the very first one: PyTorch DDP's rule. So the first forward
// of an evaluation under NoGradGuard still evaluates rank 0's statistics, and the ones
// after it issue no collective, which lets ranks run different numbers of evaluation
// forwards (uneven validation shards) without their collectives going out of step.
void DistributedDataParallel::pre_forward() {
  forward_start_ = std::chrono::steady_clock::now();
  if (options_.broadcast_buffers && sync_buffers_next_forward_)
    broadcast_state(/*parameters=*/false, /*buffers=*/true);
}

std::vector<Tensor> DistributedDataParallel::post_forward(const std::vector<Tensor>& outputs) {
  // With grad mode off there will be no backward to reduce for, and the reducer is left
  // alone: a no-grad forward between a forward and its backward (a teacher or EMA target
  // computed with the same model) must not turn that backward into a no_sync one, which
  // would skip its allreduces on every rank. PyTorch skips prepare_for_backward too.
  // The same holds for a forward inside no_sync(): only a synced forward prepares the
  // reducer, so a grad-enabled no_sync forward between a synced forward and its backward
  // leaves that backward synced.
  bool will_backward = autograd::grad_enabled();
  sync_buffers_next_forward_ = sync_ && will_backward;
  if (will_backward && sync_) reducer_->prepare_for_backward(outputs, true);
  // Which forward a backward belongs to is known only when backward runs: each output
  // passes through an identity node whose backward tells the reducer "synced" or
  // "no_sync" before any gradient hook of that backward fires (every parameter's
  // gradient reaches it through these outputs). So the backward of a no_sync forward
  // stays local even when a synced forward was prepared after it or before it and never
  // backpropagated (PyTorch's _DDPSink plays the same part).
  std::vector<Tensor> marked = outputs;
  if (will_backward) {
    std::weak_ptr<Reducer> reducer = reducer_;
    const bool synced = sync_;
    // This forward's outputs' grad_fns (weak: the markers must not keep the graph alive),
    // for a second backward through the same graph (Reducer::note_backward_of_forward).
    std::vector<std::weak_ptr<autograd::Node>> roots;
    for (const Tensor& t : outputs)
      if (t.defined())
        if (auto fn = autograd::grad_fn(t)) roots.push_back(fn);
    for (Tensor& t : marked) {
      if (!t.defined() || !autograd::requires_grad(t)) continue;
      t = autograd::record("DDPForwardOutput", {t}, t, {},
                           [reducer, synced, roots](const Tensor& grad, autograd::BackwardContext&) {
                             if (auto r = reducer.lock()) r->note_backward_of_forward(synced, roots);
                             return std::vector<Tensor>{grad};
                           });
    }
  }
  reducer_->mutable_stats().forward_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - forward_start_).count();
  return marked;
}

Tensor DistributedDataParallel::forward(const Tensor& input) {
  pre_forward();
  Tensor output = module_->forward(input);
  return post_forward({output}).front();
}

}  // namespace ringtrain::ddp
