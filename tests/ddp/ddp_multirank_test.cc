// Multi-rank DDP tests: run under `mpirun -np N` or `ringrun --nproc-per-node N`.
//
// The central check (issue 5): N ranks with per-rank batch b end with the same
// parameters as one process trained on the concatenated N*b batch. Every rank
// trains its DDP model on its slice AND a plain local reference model on the
// whole global batch, so the comparison needs no second program. Tolerance:
// 1e-5 relative (f32; the sums run in another order).
//
// Every rank runs every test in the same order, so their collectives match. A test body
// never returns early on one rank only (no ASSERT_* in a loop or before a collective,
// no `if (HasFailure()) return;`): the other ranks would wait in that rank's next
// collective. Failures are recorded with EXPECT_*/ADD_FAILURE, every rank finishes the
// body, and the fixture's TearDown then has the ranks agree: a test that failed on some
// rank fails on every rank, naming it.
//
// RINGTRAIN_TEST_DEVICE=cuda runs the tests that go through train_and_compare with
// the models and batches on GPU 0 (label cuda: gradients in CUDA buckets, reduced
// through the ring backend (CUDA IPC on one host) or NCCL).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <limits>

#include <nlohmann/json.hpp>
#include <unistd.h>

#include "autograd/autograd.h"
#include "autograd/functions.h"
#include "comm/init.h"
#include "ddp/distributed_data_parallel.h"
#include "ddp/data_parallel.h"
#include "ddp/distributed_sampler.h"
#include "ddp/hierarchical_allreduce.h"
#include "ddp/loss_scaler.h"
#include "ddp/master_weights.h"
#include "ddp/timeline.h"
#include "nn/layers.h"
#include "nn/optim.h"
#include "tensor/cuda/runtime.h"
#include "tensor/ops.h"
#include "tests/common/expect_error.h"

namespace ringtrain::ddp {
namespace {

using ringtrain::testing::expect_error;

std::shared_ptr<comm::ProcessGroup> g_world;
Device g_device = Device::cpu();  // RINGTRAIN_TEST_DEVICE=cuda: Device::cuda(0)

constexpr int64_t kPerRankBatch = 4;
constexpr int64_t kIn = 12, kHidden = 24, kClasses = 5;

// A model with one branch that forward does not use (for find_unused_parameters),
// unless `use_unused` is set: then forward adds it in (a graph that changes from
// micro-batch to micro-batch, or from rank to rank).
class TwoBranch : public nn::Cloneable<TwoBranch> {
 public:
  explicit TwoBranch(Generator& gen) : Cloneable("TwoBranch") {
    used_ = register_module("used", nn::make<nn::Linear>(kIn, kHidden, true, gen));
    unused_ = register_module("unused", nn::make<nn::Linear>(kIn, kHidden, true, gen));
    head_ = register_module("head", nn::make<nn::Linear>(kHidden, kClasses, true, gen));
  }
  Tensor forward(const Tensor& x) override {
    Tensor h = child(used_).forward(x);
    if (use_unused) h = ag::add(h, child(unused_).forward(x));
    return child(head_).forward(ag::relu(h));
  }

  bool use_unused = false;

 private:
  nn::ChildSlot<nn::Linear> used_, unused_, head_;
};

// A trunk and a head, plus an auxiliary head registered last (so with one parameter
// per bucket its parameters fill buckets 0 and 1) that forward never uses.
class AuxHead : public nn::Cloneable<AuxHead> {
 public:
  explicit AuxHead(Generator& gen) : Cloneable("AuxHead") {
    trunk_ = register_module("trunk", nn::make<nn::Linear>(kIn, kHidden, true, gen));
    head_ = register_module("head", nn::make<nn::Linear>(kHidden, kClasses, true, gen));
    aux_ = register_module("aux", nn::make<nn::Linear>(kHidden, kClasses, true, gen));
  }
  Tensor forward(const Tensor& x) override { return child(head_).forward(ag::relu(child(trunk_).forward(x))); }

 private:
  nn::ChildSlot<nn::Linear> trunk_, head_, aux_;
};

std::shared_ptr<nn::Module> make_mlp(uint64_t seed, bool batch_norm = false) {
  Generator gen(seed);
  auto seq = nn::make<nn::Sequential>();
  seq->push_back(nn::make<nn::Linear>(kIn, kHidden, true, gen));
  if (batch_norm) seq->push_back(nn::make<nn::BatchNorm1d>(kHidden));
  seq->push_back(nn::make<nn::ReLU>());
  seq->push_back(nn::make<nn::Linear>(kHidden, kHidden, true, gen));
  seq->push_back(nn::make<nn::Tanh>());
  seq->push_back(nn::make<nn::Linear>(kHidden, kClasses, true, gen));
  return seq;
}

struct Batch {
  Tensor x, y;
};
// The global batch of step `step` (identical on every rank), and this rank's slice.
Batch global_batch(int step) {
  Generator gen(1000 + step);
  int64_t n = kPerRankBatch * g_world->size();
  Tensor x = randn({n, kIn}, gen);
  Tensor y = mul(rand({n}, gen), static_cast<double>(kClasses)).to(DType::kInt64);
  return {x, y};
}
Batch rank_slice(const Batch& b) {
  int64_t start = kPerRankBatch * g_world->rank();
  return {b.x.narrow(0, start, kPerRankBatch).contiguous(), b.y.narrow(0, start, kPerRankBatch).contiguous()};
}

// The global batch of `step` on g_device.
Batch device_batch(int step) {
  Batch b = global_batch(step);
  return {b.x.to(g_device), b.y.to(g_device)};
}

// One forward and backward of this rank's slice through DDP, inside no_sync() if asked.
void ddp_backward(DistributedDataParallel& ddp, const Batch& local, bool no_sync) {
  if (no_sync) {
    auto guard = ddp.no_sync();
    autograd::backward(ag::cross_entropy(ddp(local.x), local.y));
  } else {
    autograd::backward(ag::cross_entropy(ddp(local.x), local.y));
  }
}

// Returns at the first mismatch (one message, not thousands); the caller goes on, so
// that every rank issues the same collectives afterwards.
void expect_same_parameters(nn::Module& a, nn::Module& b, double rtol = 1e-5) {
  auto pa = a.named_parameters(), pb = b.named_parameters();
  ASSERT_EQ(pa.size(), pb.size());
  for (size_t i = 0; i < pa.size(); ++i) {
    std::vector<float> x = pa[i].second.to_vector<float>(), y = pb[i].second.to_vector<float>();
    ASSERT_EQ(x.size(), y.size());
    for (size_t j = 0; j < x.size(); ++j)
      ASSERT_NEAR(x[j], y[j], rtol * std::max(1.0f, std::abs(y[j])))
          << pa[i].first << "[" << j << "] on rank " << g_world->rank();
  }
}

enum class Opt { kSgd, kAdam };
std::unique_ptr<nn::Optimizer> make_optimizer(nn::Module& m, Opt opt) {
  if (opt == Opt::kSgd) return std::make_unique<nn::SGD>(m.parameters(), nn::SGDOptions{.lr = 0.1, .momentum = 0.9});
  return std::make_unique<nn::Adam>(m.parameters(), nn::AdamOptions{.lr = 0.01});
}

// Trains `ddp` on this rank's slices and `reference` on the whole global batch;
// compares the parameters after every step.
void run_and_compare(DistributedDataParallel& ddp, nn::Module& reference, Opt opt, int steps = 4,
                     int micro_batches = 1) {
  auto opt_ddp = make_optimizer(ddp.module(), opt);
  auto opt_ref = make_optimizer(reference, opt);
  for (int step = 0; step < steps; ++step) {
    opt_ddp->zero_grad();
    opt_ref->zero_grad();
    for (int micro = 0; micro < micro_batches; ++micro) {
      Batch global = device_batch(step * 10 + micro);
      // accumulate locally (no_sync), reduce on the last micro-batch
      ddp_backward(ddp, rank_slice(global), /*no_sync=*/micro + 1 < micro_batches);
      autograd::backward(ag::cross_entropy(reference.forward(global.x), global.y));
    }
    opt_ddp->step();
    opt_ref->step();
    expect_same_parameters(ddp.module(), reference);  // no early return: see the top
  }
}

void train_and_compare(std::shared_ptr<nn::Module> model, std::shared_ptr<nn::Module> reference,
                       DdpOptions options, Opt opt, int steps = 4, int micro_batches = 1) {
  model->to(g_device);
  reference->to(g_device);
  DistributedDataParallel ddp(model, g_world, options);
  run_and_compare(ddp, *reference, opt, steps, micro_batches);
}

// The setup the TwoBranch tests that drive each step themselves share: the model
// (initialized differently on each rank, which DDP's construction broadcast must undo)
// and its one-process reference, both on g_device; DDP over the world group; an SGD for
// each. A test runs its forwards and backwards between zero_grad() and step_and_compare().
struct TwoBranchRun {
  TwoBranchRun(uint64_t seed, const DdpOptions& options, nn::SGDOptions sgd = {.lr = 0.1, .momentum = 0.9})
      : model(make_on_device(seed + static_cast<uint64_t>(g_world->rank()))),
        reference(make_on_device(seed)),
        ddp(model, g_world, options),
        opt_ddp(model->parameters(), sgd),
        opt_ref(reference->parameters(), sgd) {}

  void zero_grad() {
    opt_ddp.zero_grad();
    opt_ref.zero_grad();
  }
  // Steps both and compares them; no early return on a mismatch (see expect_same_parameters).
  void step_and_compare() {
    opt_ddp.step();
    opt_ref.step();
    expect_same_parameters(*model, *reference);
  }

  static std::shared_ptr<TwoBranch> make_on_device(uint64_t seed) {
    Generator gen(seed);
    auto m = std::make_shared<TwoBranch>(gen);
    m->to(g_device);
    return m;
  }

  std::shared_ptr<TwoBranch> model, reference;
  DistributedDataParallel ddp;
  nn::SGD opt_ddp, opt_ref;
};

// Every test of this suite runs on every rank. TearDown has the ranks agree on the
// outcome (one small allgather on the world group): a failure recorded on one rank
// fails the test on every rank, naming the rank whose output says why.
class DdpMultiRank : public ::testing::Test {
 protected:
  void TearDown() override {
    int32_t failed_here = HasFailure() ? 1 : 0;
    std::vector<int32_t> failed(g_world->size());
    g_world->allgather({&failed_here, 1, DType::kInt32, Device::cpu()},
                       {failed.data(), failed.size(), DType::kInt32, Device::cpu()})
        .wait();
    for (int r = 0; r < g_world->size(); ++r)
      if (failed[r] && r != g_world->rank()) ADD_FAILURE() << "the test failed on rank " << r << " (its output says why)";
  }
};

struct Case {
  const char* name;
  size_t bucket_cap;
  size_t first_bucket;
  bool grad_as_view;
  bool symmetric = true;  // buckets in symmetric memory where the group has it
};

TEST_F(DdpMultiRank, MatchesSingleProcessOnTheConcatenatedBatchForEveryBucketSize) {
  const Case cases[] = {
      {"one parameter per bucket", 1, 1, false},
      {"default caps", kDefaultBucketBytesCap, kDefaultFirstBucketBytes, false},
      {"everything in one bucket", size_t{1} << 40, size_t{1} << 40, false},
      {"small buckets, gradient_as_bucket_view", 2048, 1024, true},
      {"default caps, ordinary bucket memory", kDefaultBucketBytesCap, kDefaultFirstBucketBytes, false, false},
      {"small buckets, gradient_as_bucket_view, ordinary memory", 2048, 1024, true, false},
  };
  for (const Case& c : cases) {
    for (Opt opt : {Opt::kSgd, Opt::kAdam}) {
      SCOPED_TRACE(std::string(c.name) + (opt == Opt::kSgd ? ", SGD" : ", Adam"));
      DdpOptions options;
      options.bucket_cap_bytes = c.bucket_cap;
      options.first_bucket_bytes = c.first_bucket;
      options.gradient_as_bucket_view = c.grad_as_view;
      options.symmetric_buckets = c.symmetric;
      // Rank-dependent init: DDP's broadcast from rank 0 must make them equal.
      auto model = make_mlp(7 + g_world->rank());
      auto reference = make_mlp(7);
      train_and_compare(model, reference, options, opt);
    }
  }
}

// With the ring backend and every rank on this host, buckets live in symmetric memory
// (two buffers per bucket in copying mode, one with gradient_as_bucket_view);
// elsewhere in ordinary memory. The equivalence test above checks the results.
TEST_F(DdpMultiRank, BucketsUseSymmetricMemoryWhereTheGroupHasIt) {
  const bool expect_symmetric = g_world->size() > 1 && std::string(g_world->backend_name()) == "ring" &&
                                !std::getenv("RINGTRAIN_TRANSPORT");
  auto model = make_mlp(3);
  DistributedDataParallel copying(model, g_world, DdpOptions{});
  for (const Bucket& bucket : copying.reducer().buckets()) EXPECT_EQ(bucket.spare.defined(), expect_symmetric);
  auto viewing_model = make_mlp(3);
  DistributedDataParallel viewing(viewing_model, g_world, DdpOptions{.gradient_as_bucket_view = true});
  for (const Bucket& bucket : viewing.reducer().buckets()) EXPECT_FALSE(bucket.spare.defined());
  auto plain_model = make_mlp(3);
  DistributedDataParallel plain(plain_model, g_world, DdpOptions{.symmetric_buckets = false});
  for (const Bucket& bucket : plain.reducer().buckets()) EXPECT_FALSE(bucket.spare.defined());
}

TEST_F(DdpMultiRank, OneParameterPerBucketReallyMakesOneBucketPerParameter) {
  auto model = make_mlp(3);
  DistributedDataParallel ddp(model, g_world, DdpOptions{.bucket_cap_bytes = 1, .first_bucket_bytes = 1});
  EXPECT_EQ(ddp.reducer().buckets().size(), model->parameters().size());
  auto all = make_mlp(3);
  DistributedDataParallel one(all, g_world, DdpOptions{.bucket_cap_bytes = size_t{1} << 40, .first_bucket_bytes = size_t{1} << 40});
  EXPECT_EQ(one.reducer().buckets().size(), 1u);
}

// The layer registered first is applied last: backward makes its gradients first, the
// opposite of the initial (reverse registration) bucket order, so a rebuild that kept
// the initial layout, or used another order, is told apart from a right one.
class AppliedInReverse : public nn::Cloneable<AppliedInReverse> {
 public:
  explicit AppliedInReverse(Generator& gen) : Cloneable("AppliedInReverse") {
    late_ = register_module("late", nn::make<nn::Linear>(kHidden, kClasses, true, gen));    // params 0, 1
    early_ = register_module("early", nn::make<nn::Linear>(kIn, kHidden, true, gen));       // params 2, 3
  }
  Tensor forward(const Tensor& x) override { return child(late_).forward(ag::relu(child(early_).forward(x))); }

 private:
  nn::ChildSlot<nn::Linear> late_, early_;
};

std::vector<int64_t> flatten(const std::vector<std::vector<size_t>>& assignment) {
  std::vector<int64_t> out;
  for (const auto& bucket : assignment) out.insert(out.end(), bucket.begin(), bucket.end());
  return out;
}

TEST_F(DdpMultiRank, BucketsAreRebuiltFromTheRealGradientOrderAfterStepOne) {
  Generator gen(5);
  auto model = std::make_shared<AppliedInReverse>(gen);
  DistributedDataParallel ddp(model, g_world, DdpOptions{.bucket_cap_bytes = 1, .first_bucket_bytes = 1});
  EXPECT_FALSE(ddp.reducer().buckets_rebuilt());
  // Before: one parameter per bucket, in reverse registration order (early.bias first).
  EXPECT_EQ(flatten(ddp.reducer().bucket_assignment()), (std::vector<int64_t>{3, 2, 1, 0}));
  Batch b = rank_slice(global_batch(0));
  autograd::backward(ag::cross_entropy(ddp(b.x), b.y));
  EXPECT_TRUE(ddp.reducer().buckets_rebuilt());
  const StepStats& stats = ddp.last_stats();
  EXPECT_EQ(stats.buckets, model->parameters().size());
  EXPECT_GT(stats.backward_ms, 0.0);
  EXPECT_GE(stats.backward_ms, stats.backward_compute_ms);
  EXPECT_GE(stats.comm_ms, stats.overlapped_ms);
  // Collectives run one at a time inside the backward step, so their busy time fits in it,
  // and the overlapped part fits in the compute window (before, time queued behind earlier
  // buckets counted as communication, and at one rank the empty Works counted until finalize).
  EXPECT_LE(stats.comm_ms, stats.backward_ms + 1e-6);
  EXPECT_LE(stats.overlapped_ms, stats.backward_compute_ms + 1e-6);
  if (g_world->size() == 1) EXPECT_EQ(stats.comm_ms, 0.0);  // one rank: nothing is communicated
  EXPECT_EQ(ddp.reducer().last_bucket_timings().size(), stats.buckets);
  // The order the gradients really arrived in on this rank; rank 0's is the one every
  // rank rebuilds with (and, one graph everywhere, the same as this rank's).
  std::vector<int64_t> ready;
  for (const auto& [index, ms] : ddp.reducer().last_grad_ready_times()) ready.push_back(static_cast<int64_t>(index));
  EXPECT_EQ(ready.size(), model->parameters().size());
  std::vector<int64_t> rank0_order = ready;
  rank0_order.resize(model->parameters().size(), -1);  // same size on every rank for the broadcast
  g_world->broadcast({rank0_order.data(), rank0_order.size(), DType::kInt64, Device::cpu()}, 0).wait();
  EXPECT_EQ(ready, rank0_order);
  // late's gradients come first, early's last: not the initial layout.
  std::vector<int64_t> late_first(rank0_order.begin(), rank0_order.begin() + 2);
  std::sort(late_first.begin(), late_first.end());
  EXPECT_EQ(late_first, (std::vector<int64_t>{0, 1})) << "rank 0's gradients arrived in an unexpected order";
  EXPECT_EQ(flatten(ddp.reducer().bucket_assignment()), rank0_order)
      << "the buckets were not rebuilt in the order the gradients arrived on rank 0";
}

TEST_F(DdpMultiRank, FindUnusedParametersHandlesABranchForwardNeverUses) {
  for (Opt opt : {Opt::kSgd, Opt::kAdam}) {
    Generator g1(11 + g_world->rank()), g2(11);
    auto model = std::make_shared<TwoBranch>(g1);
    auto reference = std::make_shared<TwoBranch>(g2);
    DdpOptions options;
    options.find_unused_parameters = true;
    options.bucket_cap_bytes = 4096;
    options.first_bucket_bytes = 1024;
    train_and_compare(model, reference, options, opt);
    // No rank used the branch: like single-process training, it has no gradient.
    EXPECT_FALSE(autograd::grad(model->param("unused.weight")).defined());
  }
}

// A parameter no rank uses keeps the .grad it had, as in single-process training: after
// zero_grad(set_to_none=false) that is zeros, which SGD's weight decay still acts on.
// (Before, DDP dropped it, so a decayed unused weight diverged from the reference.)
TEST_F(DdpMultiRank, UnusedParameterKeepsItsZeroedGradient) {
  for (bool bucket_view : {false, true}) {
    SCOPED_TRACE(bucket_view ? "gradient_as_bucket_view" : "copying");
    Generator g1(31);
    auto model = std::make_shared<TwoBranch>(g1);
    DdpOptions options;
    options.find_unused_parameters = true;
    options.gradient_as_bucket_view = bucket_view;
    DistributedDataParallel ddp(model, g_world, options);
    nn::SGD sgd(model->parameters(), nn::SGDOptions{.lr = 0.1, .weight_decay = 0.5});
    const Tensor unused = model->param("unused.weight");
    autograd::set_grad(unused, zeros_like(unused));  // as if an earlier step had used it
    const std::vector<float> start = unused.to_vector<float>();
    for (int step = 0; step < 3; ++step) {
      sgd.zero_grad(/*set_to_none=*/false);
      Batch b = rank_slice(global_batch(step));
      autograd::backward(ag::cross_entropy(ddp(b.x), b.y));
      Tensor g = autograd::grad(unused);
      EXPECT_TRUE(g.defined()) << "step " << step;
      if (g.defined()) EXPECT_EQ(g.to_vector<float>(), std::vector<float>(g.numel(), 0.0f)) << "step " << step;
      sgd.step();
    }
    // Three decayed steps: w * (1 - lr * wd)^3, on every rank alike.
    std::vector<float> now = unused.to_vector<float>();
    for (size_t i = 0; i < now.size(); ++i) EXPECT_FLOAT_EQ(now[i], start[i] * 0.95f * 0.95f * 0.95f) << i;
  }
}

// A grad-enabled forward that no backward follows (a loss logged on a held-out batch)
// must issue no collective, since ranks may run different numbers of them. The unused
// head used to be marked ready, and its buckets launched, by the forward itself: the
// extra allreduces were then paired with another rank's training ones, and the next
// forward reset those buckets under them. Now it is marked at the first gradient hook.
TEST_F(DdpMultiRank, ForwardsWithoutBackwardIssueNoCollectives) {
  for (bool static_graph : {false, true}) {
    SCOPED_TRACE(static_graph ? "static_graph" : "find_unused_parameters");
    Generator g1(37 + g_world->rank()), g2(37);
    auto model = std::make_shared<AuxHead>(g1);
    auto reference = std::make_shared<AuxHead>(g2);
    DdpOptions options;
    options.bucket_cap_bytes = options.first_bucket_bytes = 1;
    options.find_unused_parameters = !static_graph;
    options.static_graph = static_graph;
    DistributedDataParallel ddp(model, g_world, options);
    nn::SGD opt_ddp(model->parameters(), nn::SGDOptions{.lr = 0.1});
    nn::SGD opt_ref(reference->parameters(), nn::SGDOptions{.lr = 0.1});
    for (int step = 0; step < 3; ++step) {
      for (int i = 0; i <= g_world->rank(); ++i) (void)ddp(rank_slice(global_batch(60 + i)).x);
      opt_ddp.zero_grad();
      opt_ref.zero_grad();
      Batch global = global_batch(step);
      Batch local = rank_slice(global);
      autograd::backward(ag::cross_entropy(ddp(local.x), local.y));
      autograd::backward(ag::cross_entropy(reference->forward(global.x), global.y));
      opt_ddp.step();
      opt_ref.step();
      expect_same_parameters(*model, *reference);  // no early return: see the top
    }
  }
}

TEST_F(DdpMultiRank, StaticGraphLearnsTheUnusedSetInStepOne) {
  Generator g1(13 + g_world->rank()), g2(13);
  auto model = std::make_shared<TwoBranch>(g1);
  auto reference = std::make_shared<TwoBranch>(g2);
  train_and_compare(model, reference, DdpOptions{.static_graph = true}, Opt::kSgd);
}

// A parameter used only in the no_sync micro-batches of a step: the synced backward
// does not reach it, but .grad holds what the micro-batches accumulated, and that
// sum must be averaged like every other gradient (not zeroed, not dropped).
TEST_F(DdpMultiRank, NoSyncGradientOfAParameterTheSyncedBackwardDoesNotUseIsReduced) {
  for (bool as_view : {false, true}) {
    SCOPED_TRACE(as_view ? "gradient_as_bucket_view" : "copying mode");
    TwoBranchRun run(43, DdpOptions{.bucket_cap_bytes = 2048, .first_bucket_bytes = 512,
                                    .find_unused_parameters = true, .gradient_as_bucket_view = as_view});
    for (int step = 0; step < 3; ++step) {
      run.zero_grad();
      for (int micro = 0; micro < 2; ++micro) {
        // micro-batch 0 (no_sync) uses the branch, micro-batch 1 (synced) does not.
        run.model->use_unused = run.reference->use_unused = micro == 0;
        Batch global = device_batch(step * 10 + micro);
        ddp_backward(run.ddp, rank_slice(global), /*no_sync=*/micro == 0);
        autograd::backward(ag::cross_entropy(run.reference->forward(global.x), global.y));
      }
      Tensor got = autograd::grad(run.model->param("unused.weight"));
      EXPECT_TRUE(got.defined()) << "the no_sync gradient of unused.weight was dropped on rank "
                                 << g_world->rank();
      if (got.defined()) {
        EXPECT_LT(max_abs_diff(got, autograd::grad(run.reference->param("unused.weight"))), 1e-5)
            << "step " << step << " rank " << g_world->rank();
      }
      run.step_and_compare();
    }
  }
}

// static_graph with a parameter only rank 0 uses: every rank must pre-mark what *it*
// did not use in step 1. Pre-marking only what no rank used left rank 1's bucket
// incomplete from step 2 on, while rank 0 waited for it in the allreduce (a hang).
// The reference: one process computing the same mean of the ranks' losses.
TEST_F(DdpMultiRank, StaticGraphWithAParameterOnlyRankZeroUsesTrainsLikeOneProcess) {
  TwoBranchRun run(47, DdpOptions{.bucket_cap_bytes = 2048, .first_bucket_bytes = 512, .static_graph = true},
                   nn::SGDOptions{.lr = 0.1});
  run.model->use_unused = g_world->rank() == 0;
  const int world = g_world->size();
  for (int step = 0; step < 4; ++step) {
    run.zero_grad();
    Batch global = device_batch(step);
    ddp_backward(run.ddp, rank_slice(global), /*no_sync=*/false);
    // DDP averages the ranks' mean losses: the reference sums each rank's slice loss
    // (computed with that rank's branch choice) over the world size.
    Tensor loss;
    for (int r = 0; r < world; ++r) {
      run.reference->use_unused = r == 0;
      Tensor x = global.x.narrow(0, kPerRankBatch * r, kPerRankBatch).contiguous();
      Tensor y = global.y.narrow(0, kPerRankBatch * r, kPerRankBatch).contiguous();
      Tensor l = ag::cross_entropy(run.reference->forward(x), y);
      loss = loss.defined() ? ag::add(loss, l) : l;
    }
    autograd::backward(ag::div(loss, static_cast<double>(world)));
    run.step_and_compare();
  }
}

// The same Linear used twice (weights tied): DDP lists and reduces it once, the
// engine sums both uses into its one gradient, and training matches one process.
TEST_F(DdpMultiRank, ModelThatReusesASubmoduleTrainsLikeOneProcess) {
  auto make_tied = [](uint64_t seed) {
    Generator gen(seed);
    auto shared = nn::make<nn::Linear>(kIn, kIn, true, gen);
    auto seq = nn::make<nn::Sequential>();
    seq->push_back(shared);
    seq->push_back(nn::make<nn::Tanh>());
    seq->push_back(shared);
    seq->push_back(nn::make<nn::ReLU>());
    seq->push_back(nn::make<nn::Linear>(kIn, kClasses, true, gen));
    return seq;
  };
  for (Opt opt : {Opt::kSgd, Opt::kAdam}) {
    SCOPED_TRACE(opt == Opt::kSgd ? "SGD" : "Adam");
    auto model = make_tied(53 + g_world->rank());
    auto reference = make_tied(53);
    model->to(g_device);
    reference->to(g_device);
    DistributedDataParallel ddp(model, g_world, DdpOptions{.bucket_cap_bytes = 1, .first_bucket_bytes = 1});
    EXPECT_EQ(ddp.reducer().buckets().size(), 4u);  // 0.weight, 0.bias, 4.weight, 4.bias
    run_and_compare(ddp, *reference, opt);
  }
}

// Frozen on one rank only: the ranks would bucket different parameter sets, and
// the first collective would fail on a size that names no parameter. Construction
// must name the parameter and the ranks instead.
TEST_F(DdpMultiRank, ParameterFrozenOnOneRankOnlyIsNamedAtConstruction) {
  if (g_world->size() < 2) GTEST_SKIP() << "needs a second rank to disagree with";
  for (bool symmetric : {true, false}) {
    SCOPED_TRACE(symmetric ? "symmetric buckets" : "ordinary bucket memory");
    Generator gen(59);
    auto model = std::make_shared<TwoBranch>(gen);
    if (g_world->rank() == 1) autograd::set_requires_grad(model->param("used.weight"), false);
    try {
      DistributedDataParallel ddp(model, g_world, DdpOptions{.symmetric_buckets = symmetric});
      ADD_FAILURE() << "expected a model mismatch error on rank " << g_world->rank();
    } catch (const Error& e) {
      std::string msg = e.what();
      EXPECT_NE(msg.find("used.weight"), std::string::npos) << msg;
      EXPECT_NE(msg.find("requires_grad"), std::string::npos) << msg;
      EXPECT_NE(msg.find("rank 1"), std::string::npos) << msg;
    }
  }
}

// (On a sub-group: DDP aborts the group it reduces on, and the world group must live on.)
TEST_F(DdpMultiRank, UnusedParameterWithoutTheFlagFailsAtTheNextIterationNamingIt) {
  auto group = g_world->split(0, g_world->rank());
  Generator gen(17);
  auto model = std::make_shared<TwoBranch>(gen);
  DistributedDataParallel ddp(model, group, DdpOptions{.bucket_cap_bytes = 1, .first_bucket_bytes = 1});
  Batch b = rank_slice(global_batch(0));
  autograd::backward(ag::cross_entropy(ddp(b.x), b.y));  // completes; the error is recorded
  expect_error([&] { ddp(b.x); }, {"unused.weight", "received no gradient", "find_unused_parameters"});
  g_world->barrier().wait();
}

// Only rank 0 uses the branch: it launches that bucket and waits for it, and the other
// ranks never will. Rank 0 must fail within seconds, naming the parameters (not after
// the 10-minute collective timeout with a sequence mismatch); the others at their
// next forward, as above.
TEST_F(DdpMultiRank, ParameterUnusedOnSomeRanksOnlyFailsEveryRankNamingIt) {
  if (g_world->size() < 2) GTEST_SKIP() << "needs a second rank to disagree with";
  auto group = g_world->split(0, g_world->rank());
  Generator gen(18);
  auto model = std::make_shared<TwoBranch>(gen);
  model->use_unused = g_world->rank() == 0;
  DistributedDataParallel ddp(model, group, DdpOptions{.bucket_cap_bytes = 1, .first_bucket_bytes = 1});
  Batch b = rank_slice(global_batch(0));
  const auto start = std::chrono::steady_clock::now();
  if (g_world->rank() == 0) {
    expect_error([&] { autograd::backward(ag::cross_entropy(ddp(b.x), b.y)); },
                 {"unused.weight", "received no gradient", "on rank "});
  } else {
    autograd::backward(ag::cross_entropy(ddp(b.x), b.y));
    expect_error([&] { ddp(b.x); }, {"unused.weight", "received no gradient"});
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(60));
  g_world->barrier().wait();
}

// A communication hook that throws on rank 1 (via `throw_it`) makes backward fail on
// every rank within seconds with an Error holding `own` (rank 1) or `peers` (the others).
void expect_a_throwing_hook_fails_every_rank(const std::function<void()>& throw_it,
                                             const std::vector<std::string>& own,
                                             const std::vector<std::string>& peers) {
  auto group = g_world->split(0, g_world->rank());
  auto model = make_mlp(43);
  DistributedDataParallel ddp(model, group);
  const bool fail_here = g_world->rank() == 1;
  ddp.register_comm_hook([fail_here, throw_it](comm::ProcessGroup& pg, Bucket& bucket) -> CommHookResult {
    if (fail_here) throw_it();
    return allreduce_average_hook(pg, bucket);
  });
  Batch b = rank_slice(global_batch(0));
  const auto start = std::chrono::steady_clock::now();
  try {
    autograd::backward(ag::cross_entropy(ddp(b.x), b.y));
    ADD_FAILURE() << "expected the hook's failure on rank " << g_world->rank();
  } catch (const Error& e) {
    for (const std::string& part : fail_here ? own : peers)
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
  } catch (...) {
    // Caught here, not let out of the test: this rank must still reach the barrier below.
    ADD_FAILURE() << "something other than a ringtrain::Error came out of backward on rank " << g_world->rank();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(60));
  g_world->barrier().wait();
}

// A communication hook that throws on one rank aborts the group: the other ranks fail at
// once with its message. Before, they waited in that bucket's allreduce for the collective
// timeout (10 minutes by default).
TEST_F(DdpMultiRank, ACommHookThrowingOnOneRankFailsEveryRankWithItsMessage) {
  if (g_world->size() < 2) GTEST_SKIP() << "needs a second rank to wait for the failing one";
  expect_a_throwing_hook_fails_every_rank([] { throw Error("the user's hook failed on purpose"); },
                                          {"communication hook failed for bucket 0 on rank 1",
                                           "the user's hook failed on purpose"},
                                          {"the user's hook failed on purpose"});
}

// The same with a hook that throws something that is no std::exception (an int): that
// escaped the reducer's catch, so the group was not aborted and the peers waited in the
// bucket's allreduce until the timeout.
TEST_F(DdpMultiRank, ACommHookThrowingANonStandardExceptionOnOneRankFailsEveryRank) {
  if (g_world->size() < 2) GTEST_SKIP() << "needs a second rank to wait for the failing one";
  expect_a_throwing_hook_fails_every_rank([] { throw 42; },
                                          {"communication hook failed for bucket 0 on rank 1",
                                           "an exception not derived from std::exception"},
                                          {"communication hook failed for bucket 0 on rank 1"});
}

// Without overlap the buckets launch once backward is done. A hook that threw there
// left overlap switched on (the reducer turned it on for the launch and back off only
// on success): later steps overlapped anyway. One rank per group: nothing to abort.
TEST_F(DdpMultiRank, OverlapOffStaysOffAfterAHookThrewAtTheEndOfBackward) {
  auto alone = g_world->split(g_world->rank(), 0);
  auto model = make_mlp(79);
  DistributedDataParallel ddp(model, alone,
                              DdpOptions{.bucket_cap_bytes = 1, .first_bucket_bytes = 1, .overlap = false});
  bool fail = true;
  ddp.register_comm_hook([&fail](comm::ProcessGroup& pg, Bucket& bucket) -> CommHookResult {
    if (fail) throw Error("the hook fails once on purpose");
    return allreduce_average_hook(pg, bucket);
  });
  Batch b = rank_slice(global_batch(0));
  expect_error([&] { autograd::backward(ag::cross_entropy(ddp(b.x), b.y)); }, {"the hook fails once on purpose"});
  fail = false;
  model->zero_grad();
  autograd::backward(ag::cross_entropy(ddp(b.x), b.y));
  const auto& timings = ddp.reducer().last_bucket_timings();
  EXPECT_EQ(timings.size(), model->parameters().size());
  for (const auto& t : timings)
    EXPECT_GE(t.launch_ms, ddp.last_stats().backward_compute_ms)
        << "bucket " << t.bucket << " was launched during backward although overlap is off";
}

// A misuse found inside backward on one rank only (here a weight penalty outside forward
// on a parameter find_unused_parameters found unreachable): that rank throws, and its
// peers fail at once with its message instead of waiting in the bucket's allreduce until
// the timeout.
TEST_F(DdpMultiRank, AMisuseFoundInBackwardOnOneRankFailsEveryRankWithItsMessage) {
  if (g_world->size() < 2) GTEST_SKIP() << "needs a second rank to wait for the failing one";
  auto group = g_world->split(0, g_world->rank());
  Generator gen(61);
  auto model = nn::make<TwoBranch>(gen);
  DdpOptions options;
  options.find_unused_parameters = true;
  DistributedDataParallel ddp(model, group, options);
  Batch b = rank_slice(global_batch(0));
  const bool fail_here = g_world->rank() == 1;
  const auto start = std::chrono::steady_clock::now();
  expect_error(
      [&] {
        Tensor loss = ag::cross_entropy(ddp(b.x), b.y);
        if (fail_here) {
          Tensor unused_weight = model->parameters()[2];  // unused.weight
          loss = ag::add(loss, ag::sum(ag::mul(unused_weight, unused_weight)));
        }
        autograd::backward(loss);
      },
      {"DDP: parameter 'unused.weight' received a gradient, but find_unused_parameters found it unreachable"});
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(60));
  g_world->barrier().wait();
}

TEST_F(DdpMultiRank, NoSyncAccumulatesLocallyAndReducesTheSum) {
  auto model = make_mlp(19 + g_world->rank());
  auto reference = make_mlp(19);
  train_and_compare(model, reference, DdpOptions{.bucket_cap_bytes = 2048, .first_bucket_bytes = 512},
                    Opt::kSgd, /*steps=*/3, /*micro_batches=*/3);
}

TEST_F(DdpMultiRank, BatchNormBuffersFollowRankZero) {
  auto model = make_mlp(23 + g_world->rank(), /*batch_norm=*/true);
  DistributedDataParallel ddp(model, g_world);
  nn::SGD sgd(model->parameters(), nn::SGDOptions{.lr = 0.05});
  for (int step = 0; step < 3; ++step) {
    sgd.zero_grad();
    Batch b = rank_slice(global_batch(step));
    autograd::backward(ag::cross_entropy(ddp(b.x), b.y));
    sgd.step();
  }
  // Buffers are broadcast at the start of forward; in eval mode the forward itself
  // leaves them alone, so afterwards every rank holds exactly rank 0's.
  model->eval();
  {
    autograd::NoGradGuard no_grad;
    ddp(rank_slice(global_batch(99)).x);
  }
  // Every rank now holds rank 0's buffers and (by DDP) the same parameters.
  for (auto& [name, t] : model->named_buffers()) {
    Tensor mine = t.to(DType::kFloat64).contiguous();
    Tensor root = mine.clone();
    g_world->broadcast({root.data_ptr(), static_cast<size_t>(root.numel()), DType::kFloat64, Device::cpu()}, 0).wait();
    EXPECT_EQ(mine.to_vector<double>(), root.to_vector<double>()) << name;
  }
  for (auto& [name, p] : model->named_parameters()) {
    Tensor mine = p.contiguous();
    Tensor root = mine.clone();
    g_world->broadcast({root.data_ptr(), static_cast<size_t>(root.numel()), DType::kFloat32, Device::cpu()}, 0).wait();
    EXPECT_EQ(mine.to_vector<float>(), root.to_vector<float>()) << name;
  }
}

// Only the first forward after a synced training forward broadcasts buffers (PyTorch's
// rule), so ranks may run different numbers of no_grad forwards, as with uneven
// validation shards, and train on with their collectives in step. Before, every forward
// broadcast: rank 1's extra evaluation forwards issued broadcasts rank 0 never matched.
TEST_F(DdpMultiRank, UnevenNumbersOfNoGradForwardsKeepCollectivesInStep) {
  auto model = make_mlp(29, /*batch_norm=*/true);
  DistributedDataParallel ddp(model, g_world);
  nn::SGD sgd(model->parameters(), nn::SGDOptions{.lr = 0.05});
  for (int step = 0; step < 4; ++step) {
    model->eval();
    {
      autograd::NoGradGuard no_grad;
      for (int i = 0; i <= g_world->rank() * 2; ++i) ddp(rank_slice(global_batch(50 + i)).x);
    }
    model->train();
    sgd.zero_grad();
    Batch b = rank_slice(global_batch(step));
    autograd::backward(ag::cross_entropy(ddp(b.x), b.y));
    sgd.step();
  }
  for (auto& [name, p] : model->named_parameters()) {
    Tensor mine = p.contiguous();
    Tensor root = mine.clone();
    g_world->broadcast({root.data_ptr(), static_cast<size_t>(root.numel()), DType::kFloat32, Device::cpu()}, 0).wait();
    EXPECT_EQ(mine.to_vector<float>(), root.to_vector<float>()) << name;
  }
}

// Three SGD steps of a DDP model (built from seed + rank: DDP must make it rank 0's) against
// one process on the global batch (built from seed). `step_body(ddp, reference, step)` runs
// one step's forwards and backwards on both; the parameters must match after every step. No
// early return on a mismatch: a rank that left the loop alone would strand its peers.
void three_steps_against_one_process(
    uint64_t seed, const std::function<void(DistributedDataParallel&, nn::Module&, int)>& step_body) {
  auto model = make_mlp(seed + g_world->rank());
  auto reference = make_mlp(seed);
  DistributedDataParallel ddp(model, g_world);
  nn::SGD opt(model->parameters(), nn::SGDOptions{.lr = 0.1});
  nn::SGD opt_ref(reference->parameters(), nn::SGDOptions{.lr = 0.1});
  for (int step = 0; step < 3; ++step) {
    opt.zero_grad();
    opt_ref.zero_grad();
    step_body(ddp, *reference, step);
    opt.step();
    opt_ref.step();
    expect_same_parameters(*model, *reference);
  }
}

// A no-grad forward between a forward and its backward (a teacher or EMA target computed
// with the same model) leaves that backward synced. It used to turn it into a no_sync
// backward: no allreduce on any rank, and the replicas drifted apart without an error.
TEST_F(DdpMultiRank, ANoGradForwardBeforeTheBackwardKeepsItSynced) {
  three_steps_against_one_process(41, [](DistributedDataParallel& ddp, nn::Module& reference, int step) {
    Batch global = global_batch(step);
    Batch local = rank_slice(global);
    Tensor out = ddp(local.x);
    {
      autograd::NoGradGuard no_grad;
      ddp(local.x);  // the "teacher" forward
    }
    autograd::backward(ag::cross_entropy(out, local.y));
    autograd::backward(ag::cross_entropy(reference.forward(global.x), global.y));
  });
}

// The same with grad mode on but inside no_sync(): that forward's outputs will never be
// backpropagated, and it must not turn the pending backward into a local one (it did:
// the replicas drifted apart by 0.05 in three steps, silently).
TEST_F(DdpMultiRank, ANoSyncForwardBetweenAForwardAndItsBackwardKeepsItSynced) {
  three_steps_against_one_process(43, [](DistributedDataParallel& ddp, nn::Module& reference, int step) {
    Batch global = global_batch(step);
    Batch local = rank_slice(global);
    Tensor out = ddp(local.x);
    {
      auto guard = ddp.no_sync();
      ddp(local.x);  // an auxiliary forward, never backpropagated
    }
    autograd::backward(ag::cross_entropy(out, local.y));
    autograd::backward(ag::cross_entropy(reference.forward(global.x), global.y));
  });
}

// And the other way round: a synced forward that is never backpropagated (an evaluation
// with grad mode on), on rank 0 only, then gradient accumulation. The no_sync
// micro-batch's backward must stay local on every rank, or rank 0 alone would reduce it
// and its collectives would pair with the peers' next ones.
TEST_F(DdpMultiRank, ASyncedForwardWithoutBackwardOnOneRankLeavesNoSyncBackwardsLocal) {
  three_steps_against_one_process(47, [](DistributedDataParallel& ddp, nn::Module& reference, int step) {
    if (g_world->rank() == 0) ddp(rank_slice(global_batch(99)).x);  // grad on, no backward
    for (int micro = 0; micro < 2; ++micro) {
      Batch global = global_batch(step * 10 + micro);
      ddp_backward(ddp, rank_slice(global), /*no_sync=*/micro == 0);
      autograd::backward(ag::cross_entropy(reference.forward(global.x), global.y));
    }
  });
}

// O2 with the masters taken before DDP's constructor broadcast rank 0's weights (apex's
// order: amp.initialize, then DDP). The masters of ranks other than 0 held their own
// initial weights and wrote them back at the first step: the replicas never agreed again.
TEST_F(DdpMultiRank, MasterWeightsTakenBeforeDdpFollowRankZerosWeights) {
  auto model = make_mlp(53 + g_world->rank());
  auto reference = make_mlp(53);
  MasterWeights masters(*model);  // before DDP: this rank's own initial weights
  DistributedDataParallel ddp(model, g_world);
  MasterWeights reference_masters(*reference);
  nn::SGD opt(masters.master_params(), nn::SGDOptions{.lr = 0.1});
  nn::SGD opt_ref(reference_masters.master_params(), nn::SGDOptions{.lr = 0.1});
  for (int step = 0; step < 3; ++step) {
    opt.zero_grad();
    opt_ref.zero_grad();
    Batch global = global_batch(step);
    Batch local = rank_slice(global);
    autograd::backward(ag::cross_entropy(ddp(local.x), local.y));
    autograd::backward(ag::cross_entropy(reference->forward(global.x), global.y));
    masters.copy_grads_to_masters();
    reference_masters.copy_grads_to_masters();
    opt.step();
    opt_ref.step();
    masters.copy_masters_to_model();
    reference_masters.copy_masters_to_model();
    expect_same_parameters(*model, *reference);  // no early return: a rank that left the
                                                 // loop alone would strand its peers
  }
}

// Copying mode (the default) over symmetric buckets hands a bucket's buffer to .grad and
// reuses it two steps later: a .grad kept by the user past zero_grad() must not change
// afterwards, as in PyTorch (it did, by 0.1, on the shared-memory ring).
TEST_F(DdpMultiRank, AGradientKeptAcrossStepsIsNotOverwrittenLater) {
  auto model = make_mlp(59);
  DistributedDataParallel ddp(model, g_world);
  nn::SGD opt(model->parameters(), nn::SGDOptions{.lr = 0.1});
  std::vector<Tensor> kept;
  std::vector<std::vector<float>> values;
  for (int step = 0; step < 4; ++step) {
    opt.zero_grad();  // set_to_none: the next backward makes new gradients
    Batch local = rank_slice(global_batch(step));
    autograd::backward(ag::cross_entropy(ddp(local.x), local.y));
    opt.step();
    Tensor g = autograd::grad(model->parameters().front());
    kept.push_back(g);  // kept without a copy
    values.push_back(g.to_vector<float>());
  }
  for (size_t s = 0; s < kept.size(); ++s)
    EXPECT_EQ(kept[s].to_vector<float>(), values[s]) << "the gradient of step " << s << " changed afterwards";
}

// A hook that counts its calls before handing the bucket to `hook`: a test of a hook
// must see it run, or it passes just as well when the hook is never called.
CommHook counting(CommHook hook, int* calls) {
  return [hook = std::move(hook), calls](comm::ProcessGroup& group, Bucket& bucket) {
    ++*calls;
    return hook(group, bucket);
  };
}

TEST_F(DdpMultiRank, CompressionHooksStayCloseToTheExactAverage) {
  struct Compression {
    const char* name;
    CommHook hook;
    DType wire;
  };
  for (const Compression& c : {Compression{"fp16", fp16_compress_hook, DType::kFloat16},
                               Compression{"bf16", bf16_compress_hook, DType::kBFloat16}}) {
    SCOPED_TRACE(c.name);
    auto model = make_mlp(29);
    auto exact = make_mlp(29);
    DistributedDataParallel ddp(model, g_world);
    DistributedDataParallel ddp_exact(exact, g_world);
    int calls = 0;
    ddp.register_comm_hook(counting(c.hook, &calls));
    Batch b = rank_slice(global_batch(0));
    autograd::backward(ag::cross_entropy(ddp(b.x), b.y));
    autograd::backward(ag::cross_entropy(ddp_exact(b.x), b.y));
    // It ran, once per bucket of the step.
    EXPECT_GT(calls, 0);
    EXPECT_EQ(static_cast<size_t>(calls), ddp.reducer().last_bucket_timings().size());
    auto pa = model->parameters(), pb = exact->parameters();
    size_t differing = 0, off_the_wire_grid = 0;
    for (size_t i = 0; i < pa.size(); ++i) {
      Tensor ga = autograd::grad(pa[i]), gb = autograd::grad(pb[i]);
      double scale = std::max(1e-3, amax(abs(gb)).item());
      EXPECT_LT(max_abs_diff(ga, gb) / scale, 1e-2) << "parameter " << i;
      std::vector<float> a = ga.to_vector<float>(), e = gb.to_vector<float>();
      // The sum travelled in the wire dtype and was cast back: every value is one the
      // wire dtype can hold, where the exact float32 average mostly is not.
      std::vector<float> rounded = ga.to(c.wire).to(DType::kFloat32).to_vector<float>();
      for (size_t j = 0; j < a.size(); ++j) {
        differing += std::memcmp(&a[j], &e[j], sizeof(float)) != 0;
        off_the_wire_grid += std::memcmp(&a[j], &rounded[j], sizeof(float)) != 0;
      }
    }
    EXPECT_GT(differing, 0u) << "every gradient equals the exact average bitwise: nothing was compressed";
    EXPECT_EQ(off_the_wire_grid, 0u) << "some averaged gradients are not " << dtype_name(c.wire) << " values";
  }
}

TEST_F(DdpMultiRank, Ddp2DataParallelInsideEachRankMatchesTheReference) {
  // ddp2: each rank (a "node") runs DataParallel over 2 local replicas; DDP across ranks.
  auto inner = make_mlp(37 + g_world->rank());
  auto dp = std::make_shared<DataParallel>(inner, std::vector<Device>{Device::cpu(), Device::cpu()});
  auto reference = make_mlp(37);
  DistributedDataParallel ddp(dp, g_world, DdpOptions{.bucket_cap_bytes = 2048, .first_bucket_bytes = 512});
  run_and_compare(ddp, *reference, Opt::kSgd, /*steps=*/3);
}

TEST_F(DdpMultiRank, HierarchicalAllreduceHookMatchesTheFlatAverage) {
  // Pretend ranks 2k and 2k+1 share a node.
  HierarchicalAllreduce hierarchical(g_world, g_world->rank() / 2, g_world->rank() % 2);
  EXPECT_EQ(hierarchical.nodes(), (g_world->size() + 1) / 2);
  std::vector<double> values(37);
  for (size_t i = 0; i < values.size(); ++i) values[i] = (g_world->rank() + 1) * 1000.0 + static_cast<double>(i);
  hierarchical.allreduce_sum({values.data(), values.size(), DType::kFloat64, Device::cpu()}).wait();
  double rank_sum = g_world->size() * (g_world->size() + 1) / 2.0;
  size_t wrong = 0;  // counted, not ASSERTed: no early return on one rank
  for (size_t i = 0; i < values.size(); ++i) wrong += values[i] != rank_sum * 1000.0 + g_world->size() * static_cast<double>(i);
  EXPECT_EQ(wrong, 0u) << "of " << values.size() << " sums on rank " << g_world->rank();

  auto model = make_mlp(41 + g_world->rank());
  auto reference = make_mlp(41);
  DistributedDataParallel ddp(model, g_world, DdpOptions{.bucket_cap_bytes = 2048, .first_bucket_bytes = 512});
  int calls = 0;
  ddp.register_comm_hook(counting(hierarchical.hook(), &calls));
  run_and_compare(ddp, *reference, Opt::kSgd, /*steps=*/3);
  // The result above proves something averaged; this, that it was the hook (every bucket of
  // the last step, and at least one per earlier step).
  EXPECT_GE(static_cast<size_t>(calls), 2 + ddp.reducer().last_bucket_timings().size());
  EXPECT_GT(ddp.reducer().last_bucket_timings().size(), 1u);
}

// fp16 gradients are averaged without overflowing where the average fits: every rank's
// gradient is 40000, the fp16 sum of two is inf, the average is 40000. Before, both the
// default hook (allreduce kAvg: sum, then divide) and the hierarchical hook gave inf.
TEST_F(DdpMultiRank, HalfPrecisionGradientsAreAveragedWithoutOverflow) {
  HierarchicalAllreduce hierarchical(g_world, g_world->rank() / 2, g_world->rank() % 2);
  for (DType dtype : {DType::kFloat16}) {  // (bf16 has float32's range: its sum does not overflow)
    for (bool hierarchical_hook : {false, true}) {
      SCOPED_TRACE(std::string(dtype_name(dtype)) + (hierarchical_hook ? " hierarchical" : " default hook"));
      Generator gen(5);
      auto model = nn::make<nn::Linear>(1, 1, /*bias=*/false, gen);
      model->to(dtype);
      DistributedDataParallel ddp(model, g_world);
      int calls = 0;
      if (hierarchical_hook) ddp.register_comm_hook(counting(hierarchical.hook(), &calls));
      Tensor x = full({1, 1}, 40000.0, dtype);
      autograd::backward(ag::sum(ddp(x)));
      EXPECT_EQ(calls, hierarchical_hook ? 1 : 0);  // one bucket, through the hook when it is set
      Tensor g = autograd::grad(model->param("weight"));
      EXPECT_TRUE(g.defined());
      if (g.defined()) EXPECT_EQ(g.to(DType::kFloat64).item(), 40000.0);  // exact in fp16
    }
  }
}

// A step that fails on a node leader (here its network allreduce, because the other
// node's leader aborted) must fail the leader's node members at once, naming the
// reason, and every allreduce queued behind it. Before, the leader skipped the step-3
// broadcast its members were waiting in, and paired the next bucket's reduce with it:
// the members hung until the collective timeout (10 minutes by default).
TEST_F(DdpMultiRank, AHierarchicalStepFailingOnALeaderFailsItsNodeAtOnceWithTheReason) {
  if (g_world->size() < 3) GTEST_SKIP() << "needs two nodes, one with a member besides its leader";
  // Nodes of two ranks: {0, 1}, {2, 3}, ...; rank 2 leads node 1 and gives up.
  HierarchicalAllreduce hierarchical(g_world, g_world->rank() / 2, g_world->rank() % 2);
  const std::string reason = "rank 2 gave up on purpose";
  if (g_world->rank() == 2) hierarchical.abort(reason);
  std::vector<double> first(16, 1.0), second(16, 1.0);
  const auto start = std::chrono::steady_clock::now();
  comm::Work a = hierarchical.allreduce_sum({first.data(), first.size(), DType::kFloat64, Device::cpu()});
  comm::Work b = hierarchical.allreduce_sum({second.data(), second.size(), DType::kFloat64, Device::cpu()});
  expect_error([&] { a.wait(); }, {reason});
  expect_error([&] { b.wait(); }, {reason});  // queued behind it: failed with it, not run
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(30)) << "on rank " << g_world->rank();
  g_world->barrier().wait();
}

// DDP may outlive the HierarchicalAllreduce whose hook it holds: the hook keeps the
// groups and the worker alive. (It captured `this`: the buckets then went to a freed
// object.)
TEST_F(DdpMultiRank, AHierarchicalHookOutlivesTheObjectThatMadeIt) {
  auto model = make_mlp(67 + g_world->rank());
  auto reference = make_mlp(67);
  DistributedDataParallel ddp(model, g_world, DdpOptions{.bucket_cap_bytes = 2048, .first_bucket_bytes = 512});
  int calls = 0;
  {
    auto hierarchical = std::make_unique<HierarchicalAllreduce>(g_world, g_world->rank() / 2, g_world->rank() % 2);
    ddp.register_comm_hook(counting(hierarchical->hook(), &calls));
  }  // destroyed here; the hook is all that is left of it
  run_and_compare(ddp, *reference, Opt::kSgd, /*steps=*/2);
  EXPECT_GE(calls, 2);
}

// The hook sums over the groups split from the world it was built on; a DDP over another
// group (here one with the same ranks, which DDP aborts when the hook throws) is refused,
// naming both groups, instead of having its buckets summed over ranks it does not know.
TEST_F(DdpMultiRank, AHierarchicalHookRegisteredWithADdpOverAnotherGroupIsRefused) {
  HierarchicalAllreduce hierarchical(g_world, g_world->rank() / 2, g_world->rank() % 2);
  auto group = g_world->split(0, g_world->rank());
  auto model = make_mlp(71);
  DistributedDataParallel ddp(model, group);
  ddp.register_comm_hook(hierarchical.hook());
  Batch b = rank_slice(global_batch(0));
  expect_error([&] { autograd::backward(ag::cross_entropy(ddp(b.x), b.y)); },
               {"communication hook failed", "not the one this HierarchicalAllreduce was built on",
                "same ProcessGroup object"});
  g_world->barrier().wait();
}

TEST_F(DdpMultiRank, MismatchedModelsAreNamedAtConstruction) {
  if (g_world->size() < 2) GTEST_SKIP() << "needs a second rank to disagree with";
  Generator gen(31);
  auto seq = nn::make<nn::Sequential>();
  seq->push_back(nn::make<nn::Linear>(kIn, g_world->rank() == 1 ? kHidden + 1 : kHidden, true, gen));
  try {
    DistributedDataParallel ddp(seq, g_world);
    ADD_FAILURE() << "expected a model mismatch error";
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("0.weight"), std::string::npos) << msg;
    EXPECT_NE(msg.find("rank 1"), std::string::npos) << msg;
  }
}

// A module with one parameter and one buffer whose shapes the test chooses per rank.
class Shaped : public nn::Module {
 public:
  Shaped(const Shape& param_shape, const Shape& buffer_shape) : Module("Shaped") {
    register_parameter("w", zeros(param_shape));
    register_buffer("stats", zeros(buffer_shape));
  }
};

// Buffers are verified like parameters: before, a buffer of another size on one rank
// made the constructor's broadcast time out (10 minutes) or fail on a byte count that
// named no buffer.
TEST_F(DdpMultiRank, MismatchedBuffersAreNamedAtConstruction) {
  if (g_world->size() < 2) GTEST_SKIP() << "needs a second rank to disagree with";
  auto model = std::make_shared<Shaped>(Shape{3}, Shape{g_world->rank() == 1 ? 5 : 3});
  expect_error([&] { DistributedDataParallel ddp(model, g_world); },
               {"different models", "buffer #0", "'stats'", "float32[3] on rank 0", "float32[5] on rank 1"});
}

// A parameter of more than 8 dims is compared too (its trailing sizes as a hash), not
// refused on the rank that has it while the others wait.
TEST_F(DdpMultiRank, ParametersOfManyDimsAreComparedNotRefused) {
  const Shape nine(9, 1);
  EXPECT_NO_THROW(DistributedDataParallel(std::make_shared<Shaped>(nine, Shape{2}), g_world));
  if (g_world->size() < 2) return;
  Shape other = nine;
  if (g_world->rank() == 1) other[8] = 2;
  expect_error([&] { DistributedDataParallel ddp(std::make_shared<Shaped>(other, Shape{2}), g_world); },
               {"different models", "parameter #0", "'w'", "(9 dims)"});
}

// With broadcast_buffers=false the constructor leaves each rank's buffers alone (as
// PyTorch's _sync_module_states does); parameters are still broadcast.
TEST_F(DdpMultiRank, BroadcastBuffersFalseKeepsEachRanksBuffers) {
  auto model = std::make_shared<Shaped>(Shape{2}, Shape{2});
  Tensor stats = model->named_buffers()[0].second, w = model->named_parameters()[0].second;
  fill_(stats, g_world->rank());
  fill_(w, g_world->rank() + 10);
  DistributedDataParallel ddp(model, g_world, DdpOptions{.broadcast_buffers = false});
  EXPECT_EQ(model->named_buffers()[0].second.to_vector<float>(),
            std::vector<float>(2, static_cast<float>(g_world->rank())));
  EXPECT_EQ(model->named_parameters()[0].second.to_vector<float>(), std::vector<float>(2, 10.0f));
}

// The options that decide DDP's collectives are compared at construction: before, ranks
// that disagreed built different buckets (a size mismatch naming nothing, or averages of
// unrelated gradients) or waited in a symmetric allocation or a buffer broadcast the
// others never issued. (Each case on a group of its own: without the check, some cases
// leave their group waiting in a collective only one rank issued.)
TEST_F(DdpMultiRank, MismatchedDdpOptionsAreNamedAtConstruction) {
  if (g_world->size() < 2) GTEST_SKIP() << "needs a second rank to disagree with";
  struct OptionCase {
    std::function<void(DdpOptions&)> change;  // applied on rank 1 only
    std::string expected;
  };
  const OptionCase cases[] = {
      {[](DdpOptions& o) { o.bucket_cap_bytes = 2048; },
       "bucket_cap_bytes is " + std::to_string(kDefaultBucketBytesCap) + " on rank 0 but 2048 on rank 1"},
      {[](DdpOptions& o) { o.first_bucket_bytes = 512; },
       "first_bucket_bytes is " + std::to_string(kDefaultFirstBucketBytes) + " on rank 0 but 512 on rank 1"},
      {[](DdpOptions& o) { o.find_unused_parameters = true; },
       "find_unused_parameters is false on rank 0 but true on rank 1"},
      {[](DdpOptions& o) { o.static_graph = true; }, "static_graph is false on rank 0 but true on rank 1"},
      {[](DdpOptions& o) { o.gradient_as_bucket_view = true; },
       "gradient_as_bucket_view is false on rank 0 but true on rank 1"},
      {[](DdpOptions& o) { o.symmetric_buckets = false; }, "symmetric_buckets is true on rank 0 but false on rank 1"},
      {[](DdpOptions& o) { o.broadcast_buffers = false; }, "broadcast_buffers is true on rank 0 but false on rank 1"},
  };
  for (const OptionCase& c : cases) {
    SCOPED_TRACE(c.expected);
    auto group = g_world->split(0, g_world->rank());
    DdpOptions options;
    if (g_world->rank() == 1) c.change(options);
    auto model = make_mlp(3, /*batch_norm=*/true);  // with buffers, for broadcast_buffers
    expect_error([&] { DistributedDataParallel ddp(model, group, options); },
                 {"ranks were given different DdpOptions", c.expected, "every rank must pass the same values"});
  }
  // Two at once: both named.
  auto group = g_world->split(0, g_world->rank());
  DdpOptions options;
  if (g_world->rank() == 1) options = DdpOptions{.static_graph = true, .symmetric_buckets = false};
  expect_error([&] { DistributedDataParallel ddp(make_mlp(3), group, options); },
               {"static_graph is false on rank 0 but true on rank 1", "symmetric_buckets is true on rank 0 but false on rank 1"});
  g_world->barrier().wait();
}

// With broadcast_buffers=false each rank keeps its own buffers, so they may differ, even in
// shape (PyTorch checks parameters only). They were verified like parameters and refused.
TEST_F(DdpMultiRank, BuffersMayDifferAcrossRanksWithoutBroadcastBuffers) {
  if (g_world->size() < 2) GTEST_SKIP() << "needs a second rank to differ from";
  auto model = std::make_shared<Shaped>(Shape{3}, Shape{g_world->rank() == 1 ? 5 : 3});
  EXPECT_NO_THROW(DistributedDataParallel(model, g_world, DdpOptions{.broadcast_buffers = false}));
  EXPECT_EQ(model->named_buffers()[0].second.numel(), g_world->rank() == 1 ? 5 : 3);
  // Parameters are still compared with it.
  auto other = std::make_shared<Shaped>(Shape{g_world->rank() == 1 ? 4 : 3}, Shape{3});
  expect_error([&] { DistributedDataParallel ddp(other, g_world, DdpOptions{.broadcast_buffers = false}); },
               {"different models", "parameter #0", "'w'"});
}

// module->to() after wrapping converts the parameters in place, but the buckets keep the
// dtype they were built with: the next forward says so, at every world size. (Before, one
// rank ran on without a word and several ranks failed with an unrelated message.) On a
// group of its own: the reducer aborts the group it reduces on.
TEST_F(DdpMultiRank, AModuleConvertedAfterWrappingIsNamedAtTheNextForward) {
  auto group = g_world->split(0, g_world->rank());
  auto model = make_mlp(73);
  DistributedDataParallel ddp(model, group);
  model->to(DType::kFloat64);
  Tensor x = rank_slice(global_batch(0)).x.to(DType::kFloat64);
  expect_error([&] { ddp(x); },
               {"parameter '0.weight' is float64 but was float32 when DDP was built", "call module->to() before wrapping"});
  g_world->barrier().wait();
}

// The timeline draws "waiting for its turn" only for a bucket whose predecessor was
// launched after it became ready. After the rebuild, buckets become ready in index order,
// so none waits; the span used to be drawn for every bucket (launch and ready are two
// clock readings, so launch > ready always held).
TEST_F(DdpMultiRank, TimelineDrawsAWaitOnlyForABucketThatWaited) {
  auto model = make_mlp(47);  // one parameter per bucket: 4 buckets
  DistributedDataParallel ddp(model, g_world, DdpOptions{.bucket_cap_bytes = 1, .first_bucket_bytes = 1});
  for (int step = 0; step < 3; ++step) {  // step 1 rebuilds the buckets in ready order
    Batch b = rank_slice(global_batch(step));
    autograd::backward(ag::cross_entropy(ddp(b.x), b.y));
  }
  const std::string path = "/tmp/ringtrain-timeline-test-" + std::to_string(getpid()) + ".json";
  write_chrome_trace(path, ddp.reducer(), 1.0, g_world->rank());
  nlohmann::json trace = nlohmann::json::parse(std::ifstream(path));
  std::remove(path.c_str());
  size_t allreduces = 0, waits = 0;
  for (const auto& event : trace.at("traceEvents")) {
    const std::string name = event.at("name");
    allreduces += name.rfind("allreduce bucket", 0) == 0;
    waits += name.find("waiting for its turn") != std::string::npos;
  }
  EXPECT_EQ(allreduces, ddp.reducer().buckets().size());
  EXPECT_GE(allreduces, 4u);
  EXPECT_EQ(waits, 0u);
}

TEST_F(DdpMultiRank, LossScalerSkipsTheSameStepsOnEveryRank) {
  LossScalerOptions options;
  options.init_scale = 1024;
  options.growth_interval = 2;
  LossScaler scaler(options, g_world);
  std::vector<double> scales;
  for (int step = 0; step < 5; ++step) {
    Tensor grad = full({3}, 1.0);
    // Only the last rank overflows, and only on steps 1 and 3.
    if (g_world->rank() == g_world->size() - 1 && step % 2 == 1)
      fill_(grad, std::numeric_limits<double>::infinity());
    bool stepped = scaler.step({grad}, [] {});
    EXPECT_EQ(stepped, step % 2 == 0) << "step " << step << " rank " << g_world->rank();
    scaler.update();
    scales.push_back(scaler.get_scale());
  }
  EXPECT_EQ(scales, (std::vector<double>{1024, 512, 512, 256, 256}));
}

TEST_F(DdpMultiRank, DistributedSamplerShardsCoverTheDataSet) {
  DistributedSampler sampler(10, g_world->rank(), g_world->size(), {.shuffle = true, .seed = 3});
  sampler.set_epoch(2);
  std::vector<int64_t> mine = sampler.indices();
  int64_t n = static_cast<int64_t>(mine.size());
  std::vector<int64_t> all(n * g_world->size());
  g_world->allgather({mine.data(), mine.size(), DType::kInt64, Device::cpu()}, {all.data(), all.size(), DType::kInt64, Device::cpu()}).wait();
  std::vector<int> seen(10, 0);
  for (int64_t i : all) seen.at(i)++;
  for (int c : seen) EXPECT_GE(c, 1);  // padding repeats some, none is missing
}

// Backward twice through one synced forward's graph (retain_graph=true), and two synced
// forwards before their two backwards: the forward's preparation was used by the first
// backward, so the second one's hooks only accumulated locally and the ranks' parameters
// drifted apart (each kept its own second gradient). Now each backward is reduced, and the
// step matches one process on the global batch doing the same.
TEST_F(DdpMultiRank, EveryBackwardThroughASyncedForwardIsReducedEvenTwicePerForward) {
  struct Variant {
    const char* name;
    DdpOptions options;
    bool two_forwards;  // forward, forward, backward, backward (else one forward, two backwards)
  };
  const Variant variants[] = {
      {"retain_graph, copying", DdpOptions{}, false},
      {"retain_graph, gradient_as_bucket_view", DdpOptions{.gradient_as_bucket_view = true}, false},
      {"retain_graph, find_unused_parameters, small buckets",
       DdpOptions{.bucket_cap_bytes = 1, .first_bucket_bytes = 1, .find_unused_parameters = true}, false},
      {"two forwards, then two backwards", DdpOptions{}, true},
  };
  for (const Variant& v : variants) {
    SCOPED_TRACE(v.name);
    TwoBranchRun run(61, v.options);
    // Every parameter used, except where find_unused_parameters is on to handle the branch.
    run.model->use_unused = run.reference->use_unused = !v.options.find_unused_parameters;
    for (int step = 0; step < 3; ++step) {
      run.zero_grad();
      Batch global = device_batch(step);
      Batch local = rank_slice(global);
      Batch global2 = device_batch(100 + step);
      Batch local2 = rank_slice(global2);
      try {
        if (v.two_forwards) {
          Tensor a = ag::cross_entropy(run.ddp(local.x), local.y);
          Tensor b = ag::cross_entropy(run.ddp(local2.x), local2.y);
          autograd::backward(a);
          autograd::backward(b);
        } else {
          Tensor loss = ag::cross_entropy(run.ddp(local.x), local.y);
          autograd::backward(loss, Tensor(), /*retain_graph=*/true);
          autograd::backward(loss);
        }
      } catch (const std::exception& e) {
        ADD_FAILURE() << e.what();
      }
      Tensor ref = ag::cross_entropy(run.reference->forward(global.x), global.y);
      autograd::backward(ref, Tensor(), /*retain_graph=*/true);
      if (v.two_forwards) ref = ag::cross_entropy(run.reference->forward(global2.x), global2.y);
      autograd::backward(ref);
      run.step_and_compare();
    }
  }
}

// Parameters that are not contiguous (here transposes: strides [1, 5]). DDP's construction
// broadcast handed them straight to the collective, which refused them ("collectives need
// contiguous memory", naming no parameter), so such a model could not be wrapped at all.
// Now they go through a contiguous copy and train like one process, in both bucket modes.
class TransposedWeights : public nn::Cloneable<TransposedWeights> {
 public:
  explicit TransposedWeights(Generator& gen) : Cloneable("TransposedWeights") {
    first_ = register_parameter("first", randn({kIn, kClasses}, gen).t());
    second_ = register_parameter("second", randn({kIn, kClasses}, gen).t());
  }
  Tensor forward(const Tensor& x) override {
    return ag::add(ag::linear(x, param(first_), Tensor()), ag::tanh(ag::linear(x, param(second_), Tensor())));
  }

 private:
  nn::ParamSlot first_, second_;
};

TEST_F(DdpMultiRank, NonContiguousParametersAreBroadcastAndTrainLikeOneProcess) {
  for (bool as_view : {false, true}) {
    SCOPED_TRACE(as_view ? "gradient_as_bucket_view" : "copying mode");
    Generator g1(71 + g_world->rank()), g2(71);  // rank-dependent init: the broadcast must fix it
    auto model = std::make_shared<TransposedWeights>(g1);
    auto reference = std::make_shared<TransposedWeights>(g2);
    EXPECT_FALSE(model->param("first").is_contiguous());
    try {
      train_and_compare(model, reference,
                        DdpOptions{.bucket_cap_bytes = 1, .first_bucket_bytes = 1, .gradient_as_bucket_view = as_view},
                        Opt::kAdam);
    } catch (const std::exception& e) {
      ADD_FAILURE() << e.what();  // the same on every rank: none is left waiting
    }
  }
}


// Two synced forwards, then their two backwards, with find_unused_parameters: the first
// forward uses a branch the second does not. The reducer was prepared by the second
// forward (branch unreachable, so marked ready as unused), and the first backward, which
// does reach the branch, failed with "received a gradient, but find_unused_parameters
// found it unreachable". Each backward now walks the graph of its own forward.
TEST_F(DdpMultiRank, TwoSyncedForwardsBackpropagatedInTurnEachFindTheirOwnUnusedParameters) {
  for (bool as_view : {false, true}) {
    SCOPED_TRACE(as_view ? "gradient_as_bucket_view" : "copying mode");
    TwoBranchRun run(73, DdpOptions{.bucket_cap_bytes = 2048, .first_bucket_bytes = 512,
                                    .find_unused_parameters = true, .gradient_as_bucket_view = as_view});
    for (int step = 0; step < 3; ++step) {
      run.zero_grad();
      Batch global_a = device_batch(step), global_b = device_batch(100 + step);
      Batch local_a = rank_slice(global_a), local_b = rank_slice(global_b);
      try {
        run.model->use_unused = true;
        Tensor a = ag::cross_entropy(run.ddp(local_a.x), local_a.y);
        run.model->use_unused = false;
        Tensor b = ag::cross_entropy(run.ddp(local_b.x), local_b.y);
        autograd::backward(a);
        autograd::backward(b);
      } catch (const std::exception& e) {
        ADD_FAILURE() << e.what();  // thrown on every rank alike: none is left waiting
      }
      run.reference->use_unused = true;
      autograd::backward(ag::cross_entropy(run.reference->forward(global_a.x), global_a.y));
      run.reference->use_unused = false;
      autograd::backward(ag::cross_entropy(run.reference->forward(global_b.x), global_b.y));
      run.step_and_compare();
    }
  }
}

// static_graph with no_sync micro-batches whose graph differs from the synced one's, the
// same in every step: micro-batch 0 (no_sync) uses the branch, micro-batch 1 (synced) does
// not. Step 1 counted the branch as used (its no_sync gradient), so later steps did not
// pre-mark it, its bucket never completed, and step 2 failed with "received no gradient ...
// static_graph=true promised the graph of the first step". What the synced backward did not
// reach is what gets pre-marked now, and training matches one process.
TEST_F(DdpMultiRank, StaticGraphWithAParameterOnlyTheNoSyncMicroBatchesUseTrainsLikeOneProcess) {
  for (bool find_unused : {false, true}) {
    SCOPED_TRACE(find_unused ? "static_graph and find_unused_parameters" : "static_graph");
    TwoBranchRun run(79, DdpOptions{.find_unused_parameters = find_unused, .static_graph = true});
    for (int step = 0; step < 3; ++step) {
      run.zero_grad();
      for (int micro = 0; micro < 2; ++micro) {
        run.model->use_unused = run.reference->use_unused = micro == 0;
        Batch global = device_batch(step * 10 + micro);
        try {
          ddp_backward(run.ddp, rank_slice(global), /*no_sync=*/micro == 0);
        } catch (const std::exception& e) {
          ADD_FAILURE() << e.what();  // thrown on every rank alike: none is left waiting
        }
        autograd::backward(ag::cross_entropy(run.reference->forward(global.x), global.y));
      }
      run.step_and_compare();
    }
  }
}

}  // namespace
}  // namespace ringtrain::ddp

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  const char* backend = std::getenv("RINGTRAIN_TEST_BACKEND");
  const char* device = std::getenv("RINGTRAIN_TEST_DEVICE");
  if (device && std::string(device) == "cuda") {
    if (!ringtrain::cuda::is_available()) {
      std::printf("SKIP: RINGTRAIN_TEST_DEVICE=cuda: no usable GPU here (%s)\n", ringtrain::cuda::unavailable_reason());
      return 0;
    }
    ringtrain::ddp::g_device = ringtrain::Device::cuda(0);
  }
  ringtrain::comm::InitOptions options;
  options.backend = backend ? backend : "ring";
  ringtrain::ddp::g_world = ringtrain::comm::init_process_group(options);
  int rc = RUN_ALL_TESTS();
  ringtrain::ddp::g_world.reset();
  return rc;
}
