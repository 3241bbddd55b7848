// engine_test.cc: the backward engine's contract: accumulation into leaves,
// graph freeing and retain_graph, no_grad/detach, the hook order DDP relies on,
// queued callbacks, gradient destinations (set_grad_destination, what DDP's
// buckets use), and the errors for misuse (each must name the problem).
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "autograd/autograd.h"
#include "autograd/functions.h"
#include "autograd/graph.h"
#include "tensor/ops.h"
#include "tests/common/expect_error.h"

namespace ringtrain {
namespace {

using autograd::backward;
using autograd::grad;

Tensor param(std::vector<float> values, Shape shape) {
  Tensor t = Tensor::from_vector<float>(values, shape);
  autograd::set_requires_grad(t);
  return t;
}

std::vector<float> values(const Tensor& t) { return t.to_vector<float>(); }

using ringtrain::testing::expect_error;

TEST(Engine, ChainRuleAndAccumulation) {
  Tensor x = param({1, 2, 3}, {3});
  // y = sum(x * x + 3x) -> dy/dx = 2x + 3
  Tensor y = ag::sum(ag::add(ag::mul(x, x), ag::mul(x, 3.0)));
  EXPECT_FLOAT_EQ(static_cast<float>(y.item()), 1 + 4 + 9 + 3 * 6);
  backward(y);
  EXPECT_EQ(values(grad(x)), (std::vector<float>{5, 7, 9}));
  // A second graph accumulates into the same .grad.
  backward(ag::sum(ag::mul(x, 2.0)));
  EXPECT_EQ(values(grad(x)), (std::vector<float>{7, 9, 11}));
  EXPECT_TRUE(autograd::is_leaf(x));
  EXPECT_FALSE(autograd::is_leaf(y));
  EXPECT_EQ(autograd::grad_fn(y)->name(), "sum");
}

TEST(Engine, DiamondRunsEachNodeOnce) {
  Tensor x = param({2}, {1});
  Tensor a = ag::mul(x, 3.0);             // a = 3x
  Tensor b = ag::add(ag::mul(a, a), a);   // b = a^2 + a, both branches from a
  backward(ag::sum(b));                   // db/dx = (2a + 1) * 3 = 39
  EXPECT_FLOAT_EQ(values(grad(x))[0], 39.0f);
}

TEST(Engine, NoGradAndDetach) {
  Tensor x = param({1, 2}, {2});
  {
    autograd::NoGradGuard guard;
    Tensor y = ag::mul(x, 2.0);
    EXPECT_FALSE(autograd::requires_grad(y));
    {
      autograd::EnableGradGuard enable;
      EXPECT_TRUE(autograd::requires_grad(ag::mul(x, 2.0)));
    }
  }
  EXPECT_TRUE(autograd::grad_enabled());
  Tensor d = autograd::detach(ag::mul(x, 2.0));
  EXPECT_FALSE(autograd::requires_grad(d));
  EXPECT_EQ(d.storage(), d.storage());
  // detach shares storage with the original
  Tensor y = ag::mul(x, 1.0);
  EXPECT_EQ(autograd::detach(y).storage().get(), y.storage().get());
}

TEST(Engine, ErrorsNameTheProblem) {
  Tensor x = param({1, 2, 3}, {3});
  expect_error([&] { backward(ag::mul(x, 2.0)); }, {"scalar", "float32[3]"});
  Tensor c = Tensor::from_vector<float>({1}, {1});
  expect_error([&] { backward(ag::mul(c, 2.0)); }, {"does not require grad"});

  Tensor loss = ag::sum(ag::mul(x, x));
  backward(loss);
  expect_error([&] { backward(loss); }, {"second time", "sum", "retain_graph"});

  // In-place change of a saved tensor is detected and names the op.
  Tensor w = param({1, 2, 3}, {3});
  Tensor y = ag::sum(ag::exp(w));  // exp saves its output
  Tensor e = autograd::detach(w);
  Tensor y2 = ag::sum(ag::mul(w, w));  // mul saves w itself
  {
    autograd::NoGradGuard guard;
    add_(w, ones({3}));  // modifies w in place (bumps its version)
  }
  expect_error([&] { backward(y2); }, {"mul", "modified by an in-place operation"});
  backward(y);  // exp saved its output, not w: still fine
}

// Misuse of the composite ops is named by the op the caller called, not by the tensor op
// it is built on (embedding's errors used to say index_select, mse_loss's said sub, linear's
// said matmul or add_).
TEST(Engine, CompositeOpsNameThemselvesInTheirErrors) {
  Tensor table = param({1, 2, 3, 4, 5, 6}, {3, 2});
  expect_error([&] { ag::embedding(table, Tensor::from_vector<int32_t>({0}, {1})); },
               {"embedding", "int64", "int32[1]"});
  expect_error([&] { ag::embedding(table, Tensor::from_vector<int64_t>({1, 3}, {2})); },
               {"embedding", "indices", "[1, 3]", "[0, 3)", "enlarge the table"});
  expect_error([&] { ag::embedding(table, Tensor::from_vector<int64_t>({-1}, {1})); }, {"embedding", "[-1, -1]"});
  expect_error([&] { ag::mse_loss(table, ones({3, 2}, DType::kFloat64)); },
               {"mse_loss", "float32[3, 2]", "float64[3, 2]", "dtype"});
  Tensor x = ones({4, 2});
  expect_error([&] { ag::linear(x.to(DType::kFloat64), table, Tensor()); },
               {"linear", "float64[4, 2]", "float32[3, 2]"});
  expect_error([&] { ag::linear(x, table, ones({3}, DType::kFloat64)); }, {"linear", "float64[3]"});
  // Valid calls are unchanged.
  EXPECT_EQ(values(ag::embedding(table, Tensor::from_vector<int64_t>({2}, {1}))), (std::vector<float>{5, 6}));
  EXPECT_EQ(values(ag::linear(x, table, zeros({3}))), (std::vector<float>{3, 7, 11, 3, 7, 11, 3, 7, 11, 3, 7, 11}));
}

// A grad hook that returns another dtype (or shape) is named with the hook, wherever it sits.
// It used to be converted silently on a leaf without .grad, to fail in add_ on a leaf with one,
// and to fail inside the next rule ("mul: operands have different dtypes") on a non-leaf.
TEST(Engine, AHookThatChangesTheGradientsDtypeIsNamed) {
  auto to_double = [](const Tensor& g) { return g.to(DType::kFloat64); };
  Tensor fresh = param({1, 2, 3}, {3});
  autograd::register_hook(fresh, to_double);
  expect_error([&] { backward(ag::sum(ag::mul(fresh, 2.0))); },
               {"grad hook on leaf float32[3]", "returned float64[3]", "dtype"});
  EXPECT_FALSE(grad(fresh).defined());

  Tensor accumulated = param({1, 2, 3}, {3});
  autograd::set_grad(accumulated, zeros({3}));
  autograd::register_hook(accumulated, to_double);
  expect_error([&] { backward(ag::sum(ag::mul(accumulated, 2.0))); }, {"grad hook on leaf", "float64[3]"});
  EXPECT_EQ(values(grad(accumulated)), (std::vector<float>{0, 0, 0}));

  Tensor x = param({1, 2, 3}, {3});
  Tensor y = ag::exp(x);
  autograd::register_hook(y, to_double);
  expect_error([&] { backward(ag::sum(y)); }, {"grad hook on the output of exp", "float64[3]", "float32[3]"});
  Tensor z = ag::mul(x, 3.0);
  autograd::register_hook(z, [](const Tensor& g) { return g.reshape({3, 1}); });
  expect_error([&] { backward(ag::sum(z)); }, {"grad hook on the output of mul", "float32[3, 1]"});
}

// set_requires_grad(t, true) on a computed tensor is a no-op, as requires_grad_() is in
// PyTorch (it threw "not a leaf"); turning it off still throws and names detach().
TEST(Engine, SetRequiresGradTrueOnAComputedTensorIsANoOp) {
  Tensor x = param({1, 2}, {2});
  Tensor y = ag::mul(x, 3.0);
  autograd::set_requires_grad(y);
  EXPECT_TRUE(autograd::requires_grad(y));
  EXPECT_EQ(autograd::grad_fn(y)->name(), "mul");
  backward(ag::sum(y));
  EXPECT_EQ(values(grad(x)), (std::vector<float>{3, 3}));
  Tensor z = ag::mul(x, 3.0);
  expect_error([&] { autograd::set_requires_grad(z, false); }, {"float32[2]", "not a leaf", "mul", "detach()"});
}

TEST(Engine, RetainGraphAllowsSecondBackward) {
  Tensor x = param({1, 2}, {2});
  Tensor loss = ag::sum(ag::mul(x, x));
  backward(loss, Tensor(), /*retain_graph=*/true);
  backward(loss);
  EXPECT_EQ(values(grad(x)), (std::vector<float>{4, 8}));
}

TEST(Engine, ExplicitRootGradient) {
  Tensor x = param({1, 2, 3}, {3});
  Tensor y = ag::mul(x, 2.0);
  backward(y, Tensor::from_vector<float>({1, 10, 100}, {3}));
  EXPECT_EQ(values(grad(x)), (std::vector<float>{2, 20, 200}));
}

TEST(Engine, GradHookCanReplaceGradient) {
  Tensor x = param({1, 2}, {2});
  std::vector<std::string> order;
  autograd::register_hook(x, [&](const Tensor& g) {
    order.push_back("leaf hook");
    return mul(g, 10.0);
  });
  Tensor h = ag::mul(x, 3.0);
  autograd::register_hook(h, [&](const Tensor& g) {
    order.push_back("non-leaf hook");
    return add(g, 1.0);
  });
  autograd::register_post_accumulate_grad_hook(x, [&](const Tensor& leaf) {
    order.push_back("post-accumulate");
    EXPECT_TRUE(grad(leaf).defined());
  });
  backward(ag::sum(h));
  // dL/dh = 1 -> hook -> 2; dL/dx = 3 * 2 = 6 -> leaf hook -> 60
  EXPECT_EQ(values(grad(x)), (std::vector<float>{60, 60}));
  EXPECT_EQ(order, (std::vector<std::string>{"non-leaf hook", "leaf hook", "post-accumulate"}));
}

TEST(Engine, HookHandleRemoves) {
  Tensor x = param({1}, {1});
  int calls = 0;
  auto handle = autograd::register_post_accumulate_grad_hook(x, [&](const Tensor&) { ++calls; });
  backward(ag::sum(x));
  handle.remove();
  backward(ag::sum(x));
  EXPECT_EQ(calls, 1);
}

TEST(Engine, PostAccumulateHooksFireInReadyOrderAndCallbackRunsLast) {
  // A 3-layer chain: the last layer's parameter is ready first (reverse of forward).
  Tensor w1 = param({1}, {1}), w2 = param({1}, {1}), w3 = param({1}, {1});
  Tensor x = Tensor::from_vector<float>({2}, {1});
  std::vector<std::string> events;
  int queued = 0;
  for (auto [w, name] : {std::pair{w1, "w1"}, std::pair{w2, "w2"}, std::pair{w3, "w3"}}) {
    std::string n = name;
    autograd::register_post_accumulate_grad_hook(w, [&, n](const Tensor&) {
      events.push_back(n);
      if (queued++ == 0)
        autograd::queue_callback([&] {
          events.push_back("end");
          EXPECT_TRUE(autograd::in_backward());
          autograd::queue_callback([&] { events.push_back("end2"); });  // callbacks may queue more
        });
    });
  }
  Tensor y = ag::mul(ag::mul(ag::mul(x, w1), w2), w3);
  backward(ag::sum(y));
  EXPECT_EQ(events, (std::vector<std::string>{"w3", "w2", "w1", "end", "end2"}));
  EXPECT_FALSE(autograd::in_backward());
  expect_error([] { autograd::queue_callback([] {}); }, {"no backward pass is running"});
}

TEST(Engine, StealsGradientWithoutCopy) {
  // The first gradient of a leaf is adopted, later ones are added in place.
  Tensor w = param({1, 2, 3, 4}, {2, 2});
  Tensor x = Tensor::from_vector<float>({1, 1}, {1, 2});
  backward(ag::sum(ag::matmul(x, w)));
  Tensor g1 = grad(w);
  backward(ag::sum(ag::matmul(x, w)));
  EXPECT_TRUE(grad(w).is_same(g1));  // same tensor, updated in place
  EXPECT_EQ(values(grad(w)), (std::vector<float>{2, 2, 2, 2}));
}

TEST(Engine, FreesGraphWhenDone) {
  std::weak_ptr<autograd::Node> node;
  Tensor x = param({1, 2}, {2});
  {
    Tensor loss = ag::sum(ag::exp(x));
    node = autograd::grad_fn(loss);
    backward(loss);
    EXPECT_TRUE(node.lock()->released());
  }
  EXPECT_TRUE(node.expired());  // no reference cycle keeps the graph alive
}

TEST(Engine, SavingOutputMakesNoCycle) {
  std::weak_ptr<autograd::Node> node;
  {
    Tensor x = param({1, 2}, {2});
    Tensor y = ag::exp(x);  // saves its own output
    node = autograd::grad_fn(y);
  }
  EXPECT_TRUE(node.expired());
}

TEST(Engine, SharedWeightFiresPostHookOnceWithSummedGradient) {
  Tensor w = param({2}, {1});
  int calls = 0;
  float seen = 0;
  autograd::register_post_accumulate_grad_hook(w, [&](const Tensor& leaf) {
    ++calls;
    seen = values(grad(leaf))[0];
  });
  Tensor x = Tensor::from_vector<float>({3}, {1});
  Tensor h = ag::mul(x, w);        // first use
  Tensor y = ag::mul(ag::tanh(h), w);  // second use, later in the graph
  backward(ag::sum(y));
  EXPECT_EQ(calls, 1);
  // dy/dw = tanh(3w) + w * (1 - tanh(3w)^2) * 3
  float t = std::tanh(6.0f);
  EXPECT_NEAR(seen, t + 2.0f * (1 - t * t) * 3.0f, 1e-5);
}

TEST(Engine, MultipleRoots) {
  Tensor x = param({1, 2}, {2});
  backward({ag::sum(ag::mul(x, 2.0)), ag::mul(x, 3.0)},
           {Tensor(), Tensor::from_vector<float>({1, 1}, {2})});
  EXPECT_EQ(values(grad(x)), (std::vector<float>{5, 5}));
}

// ---------------------------------------------------------------- gradient destinations

// An op whose rule writes 2*g into the destination of input 0 when it is offered
// one, and reports whether it was.
Tensor doubled(const Tensor& w, std::vector<bool>& offered) {
  return autograd::record("doubled", {w}, mul(w, 2.0), {},
                          [&offered](const Tensor& g, autograd::BackwardContext& c) -> std::vector<Tensor> {
                            Tensor slot = c.destination(0);
                            offered.push_back(slot.defined());
                            if (!slot.defined()) return {mul(g, 2.0)};
                            slot.copy_(mul(g, 2.0));
                            return {slot};
                          });
}

TEST(Engine, GradientLandsInItsDestinationWhichBecomesGrad) {
  Tensor w = param({1, 2, 3, 4}, {2, 2});
  Tensor slot = Tensor::from_vector<float>({-7, -7, -7, -7}, {2, 2});  // old values never read
  autograd::set_grad_destination(w, slot);
  std::vector<bool> offered;
  backward(ag::sum(doubled(w, offered)));
  EXPECT_EQ(offered, (std::vector<bool>{true}));  // written in place: nothing copied
  EXPECT_TRUE(grad(w).is_same(slot));
  EXPECT_EQ(values(slot), (std::vector<float>{2, 2, 2, 2}));
  // Used once: the next backward accumulates into .grad (= slot) as usual.
  backward(ag::sum(doubled(w, offered)));
  EXPECT_EQ(offered, (std::vector<bool>{true, false}));
  EXPECT_TRUE(grad(w).is_same(slot));
  EXPECT_EQ(values(slot), (std::vector<float>{4, 4, 4, 4}));
}

TEST(Engine, ADestinationIsHandedToOneRuleOnlyAndTheSumIsCopiedIn) {
  // A weight used twice: the first rule to run writes into the slot, the second
  // gets none, the engine adds both, and AccumulateGrad copies the sum in.
  Tensor w = param({1, 2}, {2});
  Tensor slot = Tensor::from_vector<float>({0, 0}, {2});
  autograd::set_grad_destination(w, slot);
  std::vector<bool> offered;
  backward(ag::sum(ag::add(doubled(w, offered), ag::mul(doubled(w, offered), 3.0))));
  EXPECT_EQ(offered, (std::vector<bool>{true, false}));
  EXPECT_TRUE(grad(w).is_same(slot));
  EXPECT_EQ(values(slot), (std::vector<float>{8, 8}));  // 2 + 3 * 2
}

TEST(Engine, RulesWithoutInPlaceSupportAndHookedLeavesStillFillTheDestination) {
  Tensor w = param({1, 2, 3}, {3});
  Tensor slot = Tensor::from_vector<float>({9, 9, 9}, {3});
  autograd::set_grad_destination(w, slot);
  backward(ag::sum(ag::mul(w, 5.0)));  // mul's rule allocates; AccumulateGrad copies
  EXPECT_TRUE(grad(w).is_same(slot));
  EXPECT_EQ(values(slot), (std::vector<float>{5, 5, 5}));

  // A grad hook may replace the gradient, so no rule writes in place; the hooked
  // value is what lands in the slot.
  Tensor v = param({1, 2}, {2});
  Tensor vslot = Tensor::from_vector<float>({0, 0}, {2});
  autograd::set_grad_destination(v, vslot);
  autograd::register_hook(v, [](const Tensor& g) { return mul(g, 10.0); });
  std::vector<bool> offered;
  backward(ag::sum(doubled(v, offered)));
  EXPECT_EQ(offered, (std::vector<bool>{false}));
  EXPECT_TRUE(grad(v).is_same(vslot));
  EXPECT_EQ(values(vslot), (std::vector<float>{20, 20}));
}

TEST(Engine, DestinationIsIgnoredWhileGradIsDefinedAndCanBeWithdrawn) {
  Tensor w = param({1, 2}, {2});
  backward(ag::sum(ag::mul(w, 1.0)));
  Tensor existing = grad(w);
  Tensor slot = Tensor::from_vector<float>({0, 0}, {2});
  autograd::set_grad_destination(w, slot);
  std::vector<bool> offered;
  backward(ag::sum(doubled(w, offered)));
  EXPECT_EQ(offered, (std::vector<bool>{false}));
  EXPECT_TRUE(grad(w).is_same(existing));
  EXPECT_EQ(values(existing), (std::vector<float>{3, 3}));
  EXPECT_EQ(values(slot), (std::vector<float>{0, 0}));

  autograd::set_grad(w, Tensor());
  autograd::set_grad_destination(w, Tensor());  // withdrawn: backward allocates again
  backward(ag::sum(doubled(w, offered)));
  EXPECT_FALSE(grad(w).is_same(slot));
  EXPECT_EQ(values(slot), (std::vector<float>{0, 0}));
}

TEST(Engine, LinearWritesItsWeightGradientIntoTheDestination) {
  Generator gen(3);
  Tensor x = randn({5, 4}, gen);
  Tensor w = randn({3, 4}, gen), b = randn({3}, gen);
  autograd::set_requires_grad(w);
  autograd::set_requires_grad(b);
  backward(ag::sum(ag::tanh(ag::linear(x, w, b))));
  std::vector<float> expected_w = values(grad(w)), expected_b = values(grad(b));
  autograd::set_grad(w, Tensor());
  autograd::set_grad(b, Tensor());
  Tensor flat = full({15}, -1.0);  // one buffer holding both, like a DDP bucket
  Tensor w_slot = flat.narrow(0, 0, 12).view({3, 4}), b_slot = flat.narrow(0, 12, 3);
  autograd::set_grad_destination(w, w_slot);
  autograd::set_grad_destination(b, b_slot);
  backward(ag::sum(ag::tanh(ag::linear(x, w, b))));
  EXPECT_TRUE(grad(w).is_same(w_slot));
  EXPECT_TRUE(grad(b).is_same(b_slot));
  EXPECT_EQ(values(w_slot), expected_w);  // the same GEMM, bit for bit
  EXPECT_EQ(values(b_slot), expected_b);
}

TEST(Engine, BadDestinationsAreNamed) {
  Tensor w = param({1, 2, 3, 4}, {2, 2});
  expect_error([&] { autograd::set_grad_destination(w, Tensor::from_vector<float>({0, 0, 0}, {3})); },
               {"set_grad_destination", "[3]", "[2, 2]"});
  expect_error([&] { autograd::set_grad_destination(w, full({2, 2}, 0.0, DType::kFloat64)); },
               {"set_grad_destination", "float64"});
  expect_error([&] { autograd::set_grad_destination(w, full({2, 2}, 0.0).t()); },
               {"set_grad_destination", "contiguous"});
  Tensor y = ag::mul(w, 2.0);
  expect_error([&] { autograd::set_grad_destination(y, full({2, 2}, 0.0)); }, {"not a leaf"});
}

TEST(Engine, SetGradChecksDtypeDeviceLayoutAndAliasing) {
  Tensor x = param({1, 2, 3}, {3});
  expect_error([&] { autograd::set_grad(x, full({3}, 1.0, DType::kFloat64)); },
               {"set_grad", "float64", "dtype", "float32"});
  expect_error([&] { autograd::set_grad(x, full({4}, 1.0)); }, {"set_grad", "shape", "[4]"});
  expect_error([&] { autograd::set_grad(x, ones({1}).expand({3})); }, {"set_grad", "expanded", "clone()"});
  expect_error([&] { autograd::set_grad(x, x); }, {"set_grad", "shares memory", "clone()"});
  expect_error([&] { autograd::set_grad(x, autograd::detach(x)); }, {"set_grad", "shares memory"});
  EXPECT_FALSE(grad(x).defined());
  // The leaf's values survive a backward (set_grad(x, x) used to make backward overwrite them).
  backward(ag::sum(ag::mul(x, 2.0)));
  EXPECT_EQ(values(x), (std::vector<float>{1, 2, 3}));
  // A strided but non-overlapping gradient is fine.
  Tensor y = param({1, 2, 3, 4}, {2, 2});
  autograd::set_grad(y, full({2, 2}, 0.0).t());
  backward(ag::sum(y));
  EXPECT_EQ(values(grad(y).contiguous()), (std::vector<float>{1, 1, 1, 1}));
}

TEST(Engine, SetGradDestinationRejectsTheLeafsOwnStorage) {
  Tensor w = param({1, 2, 3, 4}, {2, 2});
  expect_error([&] { autograd::set_grad_destination(w, w); }, {"set_grad_destination", "shares memory"});
  expect_error([&] { autograd::set_grad_destination(w, autograd::detach(w)); },
               {"set_grad_destination", "shares memory"});
  backward(ag::sum(ag::mul(w, 3.0)));
  EXPECT_EQ(values(w), (std::vector<float>{1, 2, 3, 4}));
  EXPECT_EQ(values(grad(w)), (std::vector<float>{3, 3, 3, 3}));
}

TEST(Engine, RootGradientIsCheckedUpFront) {
  Tensor x = param({1, 2, 3}, {3});
  Tensor y = ag::mul(x, 2.0);
  expect_error([&] { backward(y, full({3}, 1.0, DType::kFloat64)); },
               {"backward", "float64", "float32[3]", "dtype"});
  expect_error([&] { backward(y, full({2}, 1.0)); }, {"backward", "[2]", "shape"});
  EXPECT_FALSE(grad(x).defined());
  backward(y, full({3}, 1.0));
  EXPECT_EQ(values(grad(x)), (std::vector<float>{2, 2, 2}));
}

TEST(Engine, CastToAnIntegerDtypeIsNotDifferentiable) {
  Tensor x = param({1.5, 2.5}, {2});
  Tensor i = ag::to(x, DType::kInt64);
  EXPECT_FALSE(autograd::requires_grad(i));
  EXPECT_EQ(i.dtype(), DType::kInt64);
  EXPECT_EQ(i.to_vector<int64_t>(), (std::vector<int64_t>{1, 2}));
  // Used as a float again, it is a constant: the gradient reaches x only through the float path.
  Tensor y = ag::sum(ag::add(ag::mul(x, 3.0), ag::to(i, DType::kFloat32)));
  backward(y);
  EXPECT_EQ(values(grad(x)), (std::vector<float>{3, 3}));
  // Casts between floating dtypes stay differentiable.
  Tensor d = ag::to(x, DType::kFloat64);
  EXPECT_TRUE(autograd::requires_grad(d));
  // The rule is record()'s, so any op with an integer result obeys it, not only to().
  Tensor r = autograd::record("round_to_int", {x}, x.to(DType::kInt32), {},
                              [](const Tensor& g, autograd::BackwardContext&) { return std::vector<Tensor>{g}; });
  EXPECT_FALSE(autograd::requires_grad(r));
  EXPECT_FALSE(autograd::grad_fn(r));
}

// The version counter belongs to the memory: an in-place write through a view, an alias
// or a detached tensor of a saved tensor is caught too (it used to give a silently wrong
// gradient: x.grad 102.7 instead of e, or the weight's value after the update).
TEST(Engine, InPlaceWritesThroughAnotherViewOfASavedTensorAreCaught) {
  Tensor x = param({1}, {1});
  Tensor y = ag::exp(x);  // exp saves its output
  {
    autograd::NoGradGuard guard;
    Tensor view = y.view({1, 1});
    add_(view, ones({1, 1}));
  }
  expect_error([&] { backward(ag::sum(y)); }, {"exp", "modified by an in-place operation", "any view"});

  Tensor w = param({1, 2, 3, 4}, {2, 2});
  Tensor a = param({1, 1}, {1, 2});
  Tensor out = ag::sum(ag::matmul(a, ag::transpose(w, 0, 1)));  // saves a view of w
  {
    autograd::NoGradGuard guard;
    Tensor alias = autograd::detach(w);  // an optimizer's view of the parameter
    mul_(alias, 2.0);
  }
  expect_error([&] { backward(out); }, {"matmul", "modified by an in-place operation"});

  // Writes to unrelated memory still pass.
  Tensor z = param({2}, {1});
  Tensor other = Tensor::from_vector<float>({5}, {1});
  Tensor loss = ag::sum(ag::exp(z));
  add_(other, ones({1}));
  backward(loss);
  EXPECT_NEAR(values(grad(z))[0], std::exp(2.0f), 1e-5);
}

// The indices of embedding and index_select are the caller's tensor. They used to be
// captured by the backward rule without a version check, so writing to them between the
// forward and the backward silently moved the gradient to other rows (all of it to row 3
// here). Now the backward names the op instead.
TEST(Engine, InPlaceWriteToEmbeddingOrIndexSelectIndicesIsCaught) {
  for (bool embedding : {true, false}) {
    SCOPED_TRACE(embedding ? "embedding" : "index_select");
    Tensor w = param({1, 2, 3, 4, 5, 6, 7, 8}, {4, 2});
    Tensor idx = Tensor::from_vector<int64_t>({0, 1}, {2});
    Tensor y = embedding ? ag::embedding(w, idx) : ag::index_select(w, 0, idx);
    fill_(idx, 3.0);
    expect_error([&] { backward(ag::sum(y)); },
                 {embedding ? "embedding" : "index_select", "modified by an in-place operation"});
  }
  // Untouched indices still route the gradient to their rows.
  Tensor w = param({1, 2, 3, 4, 5, 6, 7, 8}, {4, 2});
  Tensor idx = Tensor::from_vector<int64_t>({0, 2, 0}, {3});
  backward(ag::sum(ag::embedding(w, idx.view({3, 1}))));
  EXPECT_EQ(values(grad(w)), (std::vector<float>{2, 2, 0, 0, 1, 1, 0, 0}));
}

// max(a, dim) hands its indices to the caller and routes the gradient by them. They used
// to be captured by the rule, so a write to them before backward silently sent the gradient
// to column 0 here (PyTorch saves them and throws); now the backward names the op.
TEST(Engine, InPlaceWriteToTheIndicesMaxReturnedIsCaught) {
  Tensor x = param({1, 3, 2, 4, 0, 5}, {2, 3});
  auto [v, i] = ag::max(x, 1);
  fill_(i, 0.0);
  expect_error([&] { backward(ag::sum(v)); }, {"max", "modified by an in-place operation"});
  // Untouched indices still route the gradient to the maxima.
  Tensor y = param({1, 3, 2, 4, 0, 5}, {2, 3});
  backward(ag::sum(ag::max(y, 1, /*keepdim=*/true).first));
  EXPECT_EQ(values(grad(y)), (std::vector<float>{0, 1, 0, 0, 0, 1}));
}

// max(a, dim)'s gradient is exactly 0 off the returned index, whatever the incoming gradient:
// it was a one-hot mask times g, so an inf (or NaN) in g made every element of its row NaN
// (0 * inf); PyTorch scatters g to the index and leaves 0 elsewhere.
TEST(Engine, MaxAlongADimKeepsANonFiniteGradientAtItsIndex) {
  Tensor x = param({1, 3, 2, 4, 0, 5}, {2, 3});
  backward(ag::max(x, 1).first, Tensor::from_vector<float>({INFINITY, 2}, {2}));
  const std::vector<float> got = values(grad(x));
  EXPECT_EQ(got, (std::vector<float>{0, INFINITY, 0, 0, 0, 2}));
}

// Without weight and bias, BatchNorm's and LayerNorm's output is the xhat their backward
// reads. An in-place write to that output (y.mul_(2)) used to change the gradient silently;
// xhat is now saved through the version check, so the backward names the op instead.
TEST(Engine, InPlaceWriteToANormOutputWithoutAffineIsCaught) {
  for (bool batch : {true, false}) {
    SCOPED_TRACE(batch ? "batch_norm" : "layer_norm");
    Tensor x = param({1, 2, 4, 3, 0, 7}, {3, 2});
    Tensor y = batch ? ag::batch_norm(x, Tensor(), Tensor(), Tensor(), Tensor(), true, 0.1, 1e-5)
                     : ag::layer_norm(x, {2}, Tensor(), Tensor(), 1e-5);
    mul_(y, 2.0);
    Tensor loss = ag::sum(ag::mul(y, 3.0));  // saves nothing: only the norm can object
    expect_error([&] { backward(loss); },
                 {batch ? "batch_norm" : "layer_norm", "modified by an in-place operation"});
  }
  // With weight and bias the output is a tensor of its own: writing to it is harmless.
  Tensor x = param({1, 2, 4, 3, 0, 7}, {3, 2});
  Tensor w = param({1, 1}, {2}), b = param({0, 0}, {2});
  Tensor y = ag::batch_norm(x, w, b, Tensor(), Tensor(), true, 0.1, 1e-5);
  mul_(y, 2.0);
  backward(ag::sum(ag::mul(y, 3.0)));
  EXPECT_EQ(values(grad(b)), (std::vector<float>{9, 9}));
}

// A hook may register or remove hooks while the engine runs the hooks (a one-shot hook
// removes itself): it used to be a use-after-free (leaf) or a bad_function_call that
// skipped the remaining hooks (non-leaf).
TEST(Engine, HooksMayRegisterAndRemoveHooksWhileTheyRun) {
  Tensor x = param({1}, {1});
  int added_calls = 0;
  autograd::register_hook(x, [&](const Tensor& g) {
    for (int i = 0; i < 8; ++i)
      autograd::register_hook(x, [&](const Tensor& gg) { ++added_calls; return gg; });
    return g;
  });
  backward(ag::sum(ag::mul(x, 2.0)));
  EXPECT_EQ(added_calls, 0);  // registered during this pass: they run from the next one
  backward(ag::sum(ag::mul(x, 2.0)));
  EXPECT_EQ(added_calls, 8);

  Tensor p = param({1}, {1});
  Tensor h = ag::mul(p, 3.0);
  int first = 0, second = 0;
  autograd::HookHandle one_shot;
  one_shot = autograd::register_hook(h, [&](const Tensor& g) {
    ++first;
    one_shot.remove();
    return g;
  });
  autograd::register_hook(h, [&](const Tensor& g) {
    ++second;
    return g;
  });
  backward(ag::sum(h));
  EXPECT_EQ(first, 1);
  EXPECT_EQ(second, 1);
  EXPECT_EQ(values(grad(p)), (std::vector<float>{3}));
}

// retain_grad() keeps the gradient after every hook of the tensor, whenever it was called
// (PyTorch 2): it used to keep the gradient as it was when its turn came.
TEST(Engine, RetainedGradIsTheGradientAfterAllHooks) {
  Tensor x = param({1}, {1});
  Tensor h = ag::mul(x, 3.0);
  autograd::retain_grad(h);
  autograd::register_hook(h, [](const Tensor& g) { return mul(g, 10.0); });
  backward(ag::sum(h));
  EXPECT_EQ(values(grad(h)), (std::vector<float>{10}));
  EXPECT_EQ(values(grad(x)), (std::vector<float>{30}));
}

// A dot product (1-d @ 1-d gives a 0-d result) backpropagates.
TEST(Engine, DotProductOfTwoVectorsBackpropagates) {
  Tensor a = param({1, 2, 3}, {3}), b = param({4, 5, 6}, {3});
  Tensor d = ag::matmul(a, b);
  ASSERT_EQ(d.dim(), 0);
  EXPECT_EQ(d.item(), 32);
  backward(d);
  EXPECT_EQ(values(grad(a)), (std::vector<float>{4, 5, 6}));
  EXPECT_EQ(values(grad(b)), (std::vector<float>{1, 2, 3}));
}

// A batch whose targets are all ignore_index: the loss is 0/0 = NaN (as in PyTorch), but
// the gradient is 0, not NaN in every weight (it would poison the model, and under DDP
// every rank's).
TEST(Engine, CrossEntropyOverOnlyIgnoredTargetsHasZeroGradient) {
  Tensor logits = param({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor loss = ag::cross_entropy(logits, Tensor::from_vector<int64_t>({-100, -100}, {2}));
  EXPECT_TRUE(std::isnan(loss.item()));
  backward(loss);
  EXPECT_EQ(values(grad(logits)), std::vector<float>(6, 0.0f));
  // Bad targets are named (as by the tensor op), and half logits sum in float32.
  expect_error([&] { ag::cross_entropy(logits, Tensor::from_vector<int64_t>({0, 3}, {2})); },
               {"cross_entropy", "targets", "[0, 3]", "[0, 2]"});
  Tensor many = zeros({70000, 2}, DType::kFloat16);
  EXPECT_NEAR(ag::cross_entropy(many, zeros({70000}, DType::kInt64)).to(DType::kFloat32).item(), std::log(2.0),
              1e-3);
}

}  // namespace
}  // namespace ringtrain
