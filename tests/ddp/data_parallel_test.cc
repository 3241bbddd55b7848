// DataParallel over several CPU replicas equals running the single module.
#include "ddp/data_parallel.h"

#include <dlfcn.h>
#include <gtest/gtest.h>
#include <pthread.h>

#include <atomic>
#include <cerrno>
#include <functional>
#include <mutex>
#include <set>
#include <thread>

#include "autograd/autograd.h"
#include "autograd/functions.h"
#include "nn/layers.h"
#include "nn/optim.h"
#include "tensor/ops.h"

// Thread starts fail on demand (as at the process's thread limit): this binary's
// pthread_create is found before libc's, and passes through unless armed.
namespace {
std::atomic<int> g_thread_starts_before_failing{-1};  // -1: never fail
}  // namespace

extern "C" int pthread_create(pthread_t* thread, const pthread_attr_t* attr, void* (*start)(void*), void* arg) {
  using Create = int (*)(pthread_t*, const pthread_attr_t*, void* (*)(void*), void*);
  static const Create real = reinterpret_cast<Create>(dlsym(RTLD_NEXT, "pthread_create"));
  int left = g_thread_starts_before_failing.load();
  while (left > 0 && !g_thread_starts_before_failing.compare_exchange_weak(left, left - 1)) {
  }
  if (left == 0) return EAGAIN;
  return real(thread, attr, start, arg);
}

namespace ringtrain::ddp {
namespace {

std::shared_ptr<nn::Module> make_mlp(uint64_t seed) {
  Generator gen(seed);
  auto seq = nn::make<nn::Sequential>();
  seq->push_back(nn::make<nn::Linear>(6, 16, true, gen));
  seq->push_back(nn::make<nn::ReLU>());
  seq->push_back(nn::make<nn::Linear>(16, 3, true, gen));
  return seq;
}

// Trains `single` and `dp` (which wraps an identical copy) side by side with SGD (lr 0.1)
// on the same random batches of `batch` rows; after_step(step) checks whatever it likes.
void train_side_by_side(nn::Module& single, DataParallel& dp, int steps, int64_t batch, uint64_t seed,
                        const std::function<void(int)>& after_step = nullptr) {
  nn::SGD a(single.parameters(), {.lr = 0.1}), b(dp.parameters(), {.lr = 0.1});
  for (int step = 0; step < steps; ++step) {
    Generator gen(seed + static_cast<uint64_t>(step));
    Tensor x = randn({batch, 6}, gen);
    Tensor y = mul(rand({batch}, gen), 3.0).to(DType::kInt64);
    a.zero_grad();
    b.zero_grad();
    autograd::backward(ag::cross_entropy(single.forward(x), y));
    autograd::backward(ag::cross_entropy(dp.forward(x), y));
    a.step();
    b.step();
    if (after_step) after_step(step);
  }
}

TEST(DataParallelTest, OutputsAndGradientsEqualTheSingleModule) {
  for (int replicas : {1, 2, 3, 4}) {
    SCOPED_TRACE(std::to_string(replicas) + " replicas");
    auto single = make_mlp(5);
    auto wrapped = make_mlp(5);
    DataParallel dp(wrapped, std::vector<Device>(replicas, Device::cpu()));
    Generator gen(9);
    Tensor x = randn({10, 6}, gen);  // 10 rows over up to 4 replicas: uneven chunks
    Tensor y = mul(rand({10}, gen), 3.0).to(DType::kInt64);

    Tensor out_single = single->forward(x);
    Tensor out_dp = dp.forward(x);
    EXPECT_LT(max_abs_diff(out_single, out_dp), 1e-6);

    autograd::backward(ag::cross_entropy(out_single, y));
    autograd::backward(ag::cross_entropy(out_dp, y));
    auto ps = single->named_parameters(), pd = wrapped->named_parameters();
    for (size_t i = 0; i < ps.size(); ++i) {
      Tensor gs = autograd::grad(ps[i].second), gd = autograd::grad(pd[i].second);
      ASSERT_TRUE(gd.defined()) << ps[i].first;
      EXPECT_LT(max_abs_diff(gs, gd), 1e-6) << ps[i].first;
    }
  }
}

// A submodule used twice: parameters() lists its weight once, but every replica
// (a clone, in which the two uses are separate tensors) must get the weight under
// both names, or its second use computes with the stale copy made at construction.
TEST(DataParallelTest, ReusedSubmoduleGetsItsGradientFromEveryReplica) {
  auto make_tied = [] {
    Generator gen(13);
    auto shared = nn::make<nn::Linear>(6, 6, true, gen);
    auto seq = nn::make<nn::Sequential>();
    seq->push_back(shared);
    seq->push_back(nn::make<nn::Tanh>());
    seq->push_back(shared);
    seq->push_back(nn::make<nn::Linear>(6, 3, true, gen));
    return seq;
  };
  auto single = make_tied(), wrapped = make_tied();
  DataParallel dp(wrapped, std::vector<Device>(3, Device::cpu()));
  train_side_by_side(*single, dp, /*steps=*/3, /*batch=*/9, /*seed=*/200, [&](int step) {
    auto ps = single->named_parameters(), pd = wrapped->named_parameters();
    ASSERT_EQ(ps.size(), pd.size());
    for (size_t i = 0; i < ps.size(); ++i)
      EXPECT_LT(max_abs_diff(ps[i].second, pd[i].second), 1e-5) << ps[i].first << " step " << step;
  });
}

TEST(DataParallelTest, TrainsLikeTheSingleModuleAndNamesParametersLikePyTorch) {
  auto single = make_mlp(11);
  auto wrapped = make_mlp(11);
  DataParallel dp(wrapped, std::vector<Device>(3, Device::cpu()));
  EXPECT_EQ(dp.named_parameters().front().first, "module.0.weight");
  train_side_by_side(*single, dp, /*steps=*/5, /*batch=*/12, /*seed=*/100);
  auto ps = single->parameters(), pd = wrapped->parameters();
  for (size_t i = 0; i < ps.size(); ++i) EXPECT_LT(max_abs_diff(ps[i], pd[i]), 1e-5);
}

// Replicas with an unseeded Dropout draw from default_generator(). Before, the replica threads
// shared the process-wide generator (a data race, and masks that depended on which thread drew
// first); now each replica has its own stream keyed from the caller's generator, so the same
// generator state gives the same output every time.
TEST(DataParallelTest, UnseededDropoutInReplicasIsDeterministic) {
  Generator init(3);
  auto seq = nn::make<nn::Sequential>();
  seq->push_back(nn::make<nn::Linear>(6, 64, true, init));
  seq->push_back(nn::make<nn::Dropout>(0.5));
  DataParallel dp(seq, std::vector<Device>(4, Device::cpu()));
  Generator data(4);
  Tensor x = randn({1, 6}, data).expand({16, 6}).contiguous();  // every row the same
  std::vector<float> first;
  for (int run = 0; run < 20; ++run) {
    default_generator().set_state(77, 0);
    std::vector<float> out = dp.forward(x).to_vector<float>();
    if (run == 0) first = out;
    ASSERT_EQ(out, first) << "run " << run;
  }
  // The replicas' masks differ from one another (not one stream replayed 4 times): replica 0's
  // first row and replica 1's first row have the same input.
  Tensor out = dp.forward(x);
  EXPECT_NE(out.select(0, 0).to_vector<float>(), out.select(0, 4).to_vector<float>());
}

// A Dropout with its own seed owns its generator; each replica is a clone holding a copy
// of it. Before, every replica drew the same masks as replica 0 at every forward.
TEST(DataParallelTest, SeededDropoutDrawsADifferentMaskInEveryReplica) {
  Generator init(3);
  auto seq = nn::make<nn::Sequential>();
  seq->push_back(nn::make<nn::Linear>(6, 64, true, init));
  seq->push_back(nn::make<nn::Dropout>(0.5, /*seed=*/1234));
  DataParallel dp(seq, std::vector<Device>(4, Device::cpu()));
  Generator data(4);
  Tensor x = randn({1, 6}, data).expand({8, 6}).contiguous();  // every row the same
  for (int step = 0; step < 2; ++step) {
    Tensor out = dp.forward(x);  // 2 rows per replica
    for (int64_t replica = 1; replica < 4; ++replica)
      EXPECT_NE(out.select(0, 0).to_vector<float>(), out.select(0, 2 * replica).to_vector<float>())
          << "replica " << replica << " step " << step;
  }
}

// Train/eval flags are kept module by module: a BatchNorm frozen in eval mode inside a
// training model stays frozen when the model is wrapped (registering it used to set every
// submodule to the parent's mode) and in every replica (which used to get the root's flag).
TEST(DataParallelTest, SubmodulesKeepTheirOwnTrainEvalModes) {
  auto make = [] {
    Generator gen(21);
    auto seq = nn::make<nn::Sequential>();
    seq->push_back(nn::make<nn::Linear>(6, 5, true, gen));
    seq->push_back(nn::make<nn::BatchNorm1d>(5));
    return seq;
  };
  auto single = make(), wrapped = make();
  single->named_modules()[1].second->eval();  // frozen BatchNorm: uses its running stats
  wrapped->named_modules()[1].second->eval();
  DataParallel dp(wrapped, std::vector<Device>(2, Device::cpu()));
  EXPECT_TRUE(wrapped->is_training());
  EXPECT_FALSE(wrapped->named_modules()[1].second->is_training());
  Generator gen(22);
  Tensor x = randn({8, 6}, gen);
  EXPECT_LT(max_abs_diff(single->forward(x), dp.forward(x)), 1e-6);  // both replicas frozen
}

// A module whose forward returns a scalar (a loss computed inside forward).
class MeanLoss : public nn::Cloneable<MeanLoss> {
 public:
  MeanLoss() : Cloneable("MeanLoss") {}
  Tensor forward(const Tensor& input) override { return ag::mean(input); }
};

// dp.to(dtype) after construction reaches the replicas' buffers too (they were copied
// into the replicas' old float32 tensors), and a scalar output is gathered as a vector.
TEST(DataParallelTest, MovedModulesAndScalarOutputsWork) {
  Generator gen(23);
  auto seq = nn::make<nn::Sequential>();
  seq->push_back(nn::make<nn::Linear>(6, 5, true, gen));
  seq->push_back(nn::make<nn::BatchNorm1d>(5));
  DataParallel dp(seq, std::vector<Device>(2, Device::cpu()));
  dp.to(Device::cpu(), DType::kFloat64);
  dp.eval();
  Tensor x = randn({4, 6}, gen).to(DType::kFloat64);
  Tensor out = dp.forward(x);
  EXPECT_EQ(out.dtype(), DType::kFloat64);
  EXPECT_LT(max_abs_diff(out, seq->forward(x)), 1e-12);

  DataParallel scalar(std::make_shared<MeanLoss>(), std::vector<Device>(2, Device::cpu()));
  Tensor losses = scalar.forward(Tensor::from_vector<float>({1, 3, 5, 7}, {4, 1}));
  EXPECT_EQ(losses.to_vector<float>(), (std::vector<float>{2, 6}));
}

// A number per thread, new for every thread ever started (thread ids may be reused once a
// thread is joined, so they cannot tell a new thread from an old one).
int thread_serial() {
  static std::atomic<int> next{0};
  thread_local const int serial = next++;
  return serial;
}

// Records the thread each forward runs on (the replicas are clones sharing `seen`).
class ThreadProbe : public nn::Cloneable<ThreadProbe> {
 public:
  struct Seen {
    std::mutex mutex;
    std::vector<int> threads;
  };
  ThreadProbe() : Cloneable("ThreadProbe"), seen(std::make_shared<Seen>()) {}
  Tensor forward(const Tensor& input) override {
    std::lock_guard<std::mutex> lock(seen->mutex);
    seen->threads.push_back(thread_serial());
    return input;
  }
  std::shared_ptr<Seen> seen;
};

// Replicas 1..n-1 run on worker threads that live as long as the DataParallel (a thread
// started per forward would drop its cuBLAS/cuDNN handles at every exit).
TEST(DataParallelTest, ReplicasRunOnTheSameWorkerThreadsEveryForward) {
  auto probe = std::make_shared<ThreadProbe>();
  DataParallel dp(probe, std::vector<Device>(3, Device::cpu()));
  for (int step = 0; step < 4; ++step) dp.forward(zeros({step == 3 ? 2 : 6, 1}));  // the last uses 2 replicas
  std::set<int> workers;
  size_t on_caller = 0;
  for (int serial : probe->seen->threads) {
    if (serial == thread_serial()) ++on_caller;
    else workers.insert(serial);
  }
  EXPECT_EQ(probe->seen->threads.size(), 3u * 3 + 2);
  EXPECT_EQ(on_caller, 4u);        // replica 0: the calling thread
  EXPECT_EQ(workers.size(), 2u);   // replicas 1 and 2: the same two threads throughout
}

// Two modules sharing one buffer tensor: the first bumps it in place, the second adds it.
class BumpBuffer : public nn::Cloneable<BumpBuffer> {
 public:
  explicit BumpBuffer(Tensor shared) : Cloneable("BumpBuffer") { slot_ = register_buffer("count", shared); }
  Tensor forward(const Tensor& input) override {
    autograd::NoGradGuard no_grad;
    add_(buffer(slot_), ones({1}));
    return input;
  }
  nn::BufferSlot slot_;
};
class AddBuffer : public nn::Cloneable<AddBuffer> {
 public:
  explicit AddBuffer(Tensor shared) : Cloneable("AddBuffer") { slot_ = register_buffer("count", shared); }
  Tensor forward(const Tensor& input) override { return ag::add(input, buffer(slot_)); }
  nn::BufferSlot slot_;
};

// A buffer shared between modules stays shared in every replica (each buffer name used
// to get its own copy, so the second module read a stale value in replicas 1..n-1).
TEST(DataParallelTest, ABufferSharedBetweenModulesStaysSharedInTheReplicas) {
  Tensor shared = zeros({1});
  auto seq = nn::make<nn::Sequential>();
  seq->push_back(std::make_shared<BumpBuffer>(shared));
  seq->push_back(std::make_shared<AddBuffer>(shared));
  DataParallel dp(seq, std::vector<Device>(2, Device::cpu()));
  std::vector<float> out = dp.forward(zeros({4, 1})).to_vector<float>();
  EXPECT_EQ(out, std::vector<float>(4, 1.0f));  // every row saw its replica's bump
}

// A worker thread that cannot be started is an Error naming the replica, after the
// workers already started are stopped; they used to be left joinable in a vector being
// destroyed, which calls std::terminate.
TEST(DataParallelTest, AWorkerThreadThatCannotStartIsAnErrorNotAnAbort) {
  auto m = make_mlp(2);
  g_thread_starts_before_failing = 1;  // replica 1's worker starts, replica 2's does not
  try {
    DataParallel dp(m, std::vector<Device>(3, Device::cpu()));
    ADD_FAILURE() << "expected an error: the second worker thread could not start";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("worker thread of replica 2"), std::string::npos) << e.what();
  }
  g_thread_starts_before_failing = -1;
  DataParallel dp(m, std::vector<Device>(3, Device::cpu()));  // the module is still usable
  EXPECT_EQ(dp.forward(randn({6, 6}, default_generator())).size(0), 6);
}

// An empty batch (no rows left after filtering) gives the empty output one device gives,
// and backward through it leaves zero gradients; it used to throw "has no batch dim to
// scatter" with two or more replicas only.
TEST(DataParallelTest, AnEmptyBatchGivesAnEmptyOutputAsWithOneDevice) {
  for (int replicas : {1, 3}) {
    SCOPED_TRACE(std::to_string(replicas) + " replicas");
    auto m = make_mlp(3);
    DataParallel dp(m, std::vector<Device>(replicas, Device::cpu()));
    Tensor out;
    EXPECT_NO_THROW(out = dp.forward(zeros({0, 6})));
    if (!out.defined()) continue;
    EXPECT_EQ(out.shape(), (Shape{0, 3}));
    autograd::backward(ag::sum(out));
    Tensor g = autograd::grad(m->parameters().front());
    if (g.defined()) EXPECT_EQ(max_abs_diff(g, zeros_like(g)), 0.0);
  }
}

TEST(DataParallelTest, ClearErrors) {
  auto m = make_mlp(1);
  EXPECT_THROW(DataParallel(m, {}), Error);
  try {
    DataParallel dp(m, {Device::cuda(0)});
    FAIL() << "expected an error: the module is on the CPU";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("first device"), std::string::npos) << e.what();
  }
  DataParallel dp(m, {Device::cpu(), Device::cpu()});
  EXPECT_THROW(dp.forward(randn({4, 7}, default_generator())), Error);  // wrong feature size
}

}  // namespace
}  // namespace ringtrain::ddp
