// data_parallel.cc: scatter, replicate, parallel_apply, gather (see data_parallel.h).
#include "ddp/data_parallel.h"

#include <condition_variable>
#include <exception>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <thread>

#include "autograd/autocast.h"
#include "autograd/functions.h"
#include "autograd/graph.h"
#include "tensor/cuda/runtime.h"

namespace ringtrain::ddp {

// Worker threads for replicas 1..n-1, started once. A forward hands out one job per
// replica it uses (start), runs replica 0 itself, then waits for all of them (wait).
// Jobs catch their own exceptions; the workers only run them.
class ReplicaWorkers {
 public:
  // Throws Error when a thread cannot be started (the process's thread limit), after
  // stopping the ones that did start: a std::thread still joinable when its vector is
  // destroyed would std::terminate the process instead.
  explicit ReplicaWorkers(size_t count) {
    try {
      for (size_t i = 0; i < count; ++i) threads_.emplace_back([this, i] { loop(i); });
    } catch (const std::exception& e) {  // std::system_error; std::bad_alloc growing the vector
      stop_and_join();
      throw Error(detail::concat("DataParallel: could not start the worker thread of replica ",
                                 threads_.size() + 1, " (", count + 1, " replicas): ", e.what(),
                                 "; use fewer devices, or raise the thread limit (ulimit -u)"));
    }
  }
  ~ReplicaWorkers() { stop_and_join(); }
  ReplicaWorkers(const ReplicaWorkers&) = delete;
  ReplicaWorkers& operator=(const ReplicaWorkers&) = delete;

  // Worker i runs jobs[i]; jobs.size() <= the number of workers.
  void start(std::vector<std::function<void()>> jobs) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      jobs_ = std::move(jobs);
      pending_ = jobs_.size();
      ++generation_;
    }
    work_cv_.notify_all();
  }
  void wait() {
    std::unique_lock<std::mutex> lock(mutex_);
    done_cv_.wait(lock, [this] { return pending_ == 0; });
  }

 private:
  void loop(size_t index) {
    uint64_t seen = 0;
    std::unique_lock<std::mutex> lock(mutex_);
    for (;;) {
      work_cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      if (index >= jobs_.size()) continue;  // this forward's batch had fewer chunks
      std::function<void()> job = jobs_[index];
      lock.unlock();
      job();
      lock.lock();
      if (--pending_ == 0) done_cv_.notify_all();
    }
  }

  void stop_and_join() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    work_cv_.notify_all();
    for (auto& t : threads_) t.join();
  }

  std::mutex mutex_;
  std::condition_variable work_cv_, done_cv_;
  std::vector<std::function<void()>> jobs_;
  uint64_t generation_ = 0;
  size_t pending_ = 0;
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

Tensor to_device(const Tensor& t, Device device) {
  if (t.device() == device) return ag::view(t, t.shape());
  Device source = t.device();
  return autograd::record("to_device", {t}, t.to(device), {},
                          [source](const Tensor& grad, autograd::BackwardContext&) -> std::vector<Tensor> {
                            return {grad.to(source)};
                          });
}

DataParallel::DataParallel(std::shared_ptr<nn::Module> module, std::vector<Device> devices)
    : Module("DataParallel"), module_(std::move(module)), devices_(std::move(devices)) {
  RT_CHECK(module_ != nullptr, "DataParallel: module is null");
  RT_CHECK(!devices_.empty(), "DataParallel: needs at least one device");
  for (auto& [name, p] : module_->named_parameters())
    RT_CHECK(p.device() == devices_[0], "DataParallel: parameter '", name, "' is on ", p.device(),
             " but the module must be on the first device ", devices_[0], "; call module->to(",
             devices_[0], ") first");
  // Registering does not change the module's train/eval flags (nor its children's: a
  // BatchNorm frozen in eval mode inside a training model stays frozen).
  register_module("module", module_);  // parameters appear as "module.<name>", like PyTorch
  replicas_.resize(devices_.size());
  for (size_t i = 1; i < devices_.size(); ++i) {
    replicas_[i] = module_->clone();
    replicas_[i]->to(devices_[i]);
  }
  workers_ = std::make_unique<ReplicaWorkers>(devices_.size() - 1);
}

DataParallel::~DataParallel() = default;

void DataParallel::sync_replica_state(size_t replica, const std::vector<uint64_t>& generator_keys) {
  nn::Module& r = *replicas_[replica];
  // Train/eval flags module by module, as PyTorch's replicate keeps each submodule's own:
  // a frozen BatchNorm (eval) inside a training model. named_modules() lists parents
  // before their children, so each recursive train() below is corrected by the next ones.
  r.train(module_->is_training());
  const auto original_modules = module_->named_modules(), replica_modules = r.named_modules();
  RT_CHECK(original_modules.size() == replica_modules.size(), "DataParallel: the module's structure changed "
           "after it was wrapped (", original_modules.size(), " submodules, the replicas have ",
           replica_modules.size(), "); wrap it after building it");
  for (size_t k = 0; k < original_modules.size(); ++k)
    replica_modules[k].second->train(original_modules[k].second->is_training());
  // Generators a module owns (a Dropout with its own seed): replica i draws from a stream
  // keyed by this forward's key from the original generator, plus i. A copy of the
  // original's state would give every replica the same masks.
  const auto replica_generators = r.named_generators();
  for (size_t k = 0; k < replica_generators.size() && k < generator_keys.size(); ++k)
    *replica_generators[k].second = Generator(generator_keys[k] + replica);
  // Parameters: differentiable copies of the originals (their gradients flow home).
  // Every name, duplicates included: a tied weight lives in several modules' slots (the
  // clone keeps them tied, but assigning through one name replaces only that slot), and
  // each slot must hold this forward's copy, or that use computes with a stale tensor.
  for (auto& [name, p] : module_->named_parameters(true, /*remove_duplicate=*/false))
    r.param(name) = to_device(p, devices_[replica]);
  // Buffers: this forward's copy of the originals' values, as new tensors so that a dtype
  // or device the module was moved to since (dp.to(...)) reaches the replicas too; on the
  // same device a clone, so the replica's BatchNorm updates its own copy.
  // A buffer registered under several names (shared between modules) gets one copy,
  // assigned to every name, so the replica's modules share it as the original's do.
  autograd::NoGradGuard no_grad;
  std::map<const TensorImpl*, Tensor> copies;
  for (auto& [name, b] : module_->named_buffers(true, /*remove_duplicate=*/false)) {
    auto [it, fresh] = copies.try_emplace(b.unsafe_impl());
    if (fresh) it->second = b.device() == devices_[replica] ? b.clone() : b.to(devices_[replica]);
    r.buffer(name) = it->second;
  }
}

Tensor DataParallel::forward(const Tensor& input) {
  const size_t n = devices_.size();
  if (n == 1) return module_->forward(input.device() == devices_[0] ? input : to_device(input, devices_[0]));
  RT_CHECK(input.dim() >= 1, "DataParallel: input ", input.describe(), " has no batch dim to scatter");

  // 1. scatter (fewer chunks than devices when the batch is small, like torch.chunk; an
  // empty batch, a filtered one with no rows left, gives empty chunks and so the empty
  // output one device gives, as in PyTorch)
  std::vector<Tensor> chunks = ag::chunk(input, static_cast<int64_t>(n), 0);
  const size_t used = chunks.size();
  // 2. replicate. All graph wiring for the originals happens here, on this thread,
  // so the replica threads only touch their own tensors. One key per generator the
  // module owns, drawn from it: the original (replica 0) moves on, and checkpoints that
  // save its state reproduce every replica's stream.
  std::vector<uint64_t> generator_keys;
  if (used > 1)
    for (auto& [name, gen] : module_->named_generators()) {
      uint32_t words[2];
      gen->next_uint32(words, 2);
      generator_keys.push_back((static_cast<uint64_t>(words[1]) << 32) | words[0]);
    }
  for (size_t i = 1; i < used; ++i) {
    sync_replica_state(i, generator_keys);
    chunks[i] = to_device(chunks[i], devices_[i]);
  }
  if (chunks[0].device() != devices_[0]) chunks[0] = to_device(chunks[0], devices_[0]);

  // 3. parallel_apply: replica 0 on this thread, the others on their own.
  std::vector<Tensor> outputs(used);
  std::vector<std::exception_ptr> errors(used);
  const bool grad_mode = autograd::grad_enabled();
  const bool autocast = autograd::autocast_enabled();
  const DType autocast_dtype = autograd::autocast_dtype();
  // Randomness (dropout without its own seed): each replica draws from its own stream, keyed by
  // a seed taken from this thread's default generator, so the masks depend on the replica index
  // and the generator's state (which checkpoints save), never on which thread draws first.
  uint32_t key[2];
  default_generator().next_uint32(key, 2);
  const uint64_t stream_seed = (static_cast<uint64_t>(key[1]) << 32) | key[0];
  std::vector<Generator> replica_generators;
  for (size_t i = 0; i < used; ++i) replica_generators.emplace_back(stream_seed + i);
  // CUDA: replica i runs on this thread's current stream of its device, as PyTorch's
  // parallel_apply does. Current streams are per thread, and a worker's is the legacy
  // default stream, which does not wait for a non-blocking stream the caller set
  // (cuda::StreamGuard): the replica would read its chunk and weights before this
  // thread's copies of them finished, and backward (on this thread's stream) would read
  // its activations before they were written.
  std::vector<void*> replica_streams(used, nullptr);
  for (size_t i = 1; i < used; ++i)
    if (devices_[i].is_cuda()) replica_streams[i] = cuda::current_stream(devices_[i].index).handle();
  auto run = [&](size_t i) {
    try {
      autograd::set_grad_enabled(grad_mode);  // grad mode and autocast are per thread
      autograd::AutocastGuard autocast_scope(autocast ? autocast_dtype : DType::kFloat16, autocast);
      ScopedDefaultGenerator generator_scope(replica_generators[i]);
      std::optional<cuda::StreamGuard> stream_scope;
      if (i > 0 && devices_[i].is_cuda())
        stream_scope.emplace(cuda::Stream::borrowed(replica_streams[i], devices_[i].index));
      nn::Module& replica = i == 0 ? *module_ : *replicas_[i];
      outputs[i] = replica.forward(chunks[i]);
    } catch (...) {
      errors[i] = std::current_exception();
    }
  };
  std::vector<std::function<void()>> jobs;  // worker i - 1 runs replica i
  for (size_t i = 1; i < used; ++i) jobs.emplace_back([&run, i] { run(i); });
  workers_->start(std::move(jobs));
  run(0);
  workers_->wait();
  for (size_t i = 0; i < used; ++i)
    if (errors[i]) {
      try {
        std::rethrow_exception(errors[i]);
      } catch (const std::exception& e) {
        throw Error("DataParallel: replica " + std::to_string(i) + " on " + devices_[i].str() +
                    " failed: " + e.what());
      }
    }

  // 4. gather on the first device. Scalar outputs (a loss computed inside forward) are
  // gathered as a vector of one value per replica, as PyTorch's gather does.
  for (size_t i = 0; i < used; ++i) {
    if (outputs[i].dim() == 0) outputs[i] = ag::reshape(outputs[i], {1});
    if (i > 0) outputs[i] = to_device(outputs[i], devices_[0]);
  }
  return ag::cat(outputs, 0);
}

}  // namespace ringtrain::ddp
