// module_test.cc: Module's contract: ordered names, state_dict round trips,
// strict-load errors that list every problem and change nothing, train/eval,
// to(dtype) keeping identity, deep clone, PyTorch's initialisation ranges.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "autograd/autograd.h"
#include "autograd/functions.h"
#include "nn/layers.h"
#include "nn/module.h"
#include "nn/optim.h"
#include "tensor/ops.h"
#include "tests/common/expect_error.h"

namespace ringtrain::nn {
namespace {

std::vector<std::string> names(const std::vector<std::pair<std::string, Tensor>>& list) {
  std::vector<std::string> out;
  for (auto& [n, t] : list) out.push_back(n);
  return out;
}

// A user-defined model, written the way module.h asks (slots, Cloneable).
class TwoLayer : public Cloneable<TwoLayer> {
 public:
  explicit TwoLayer(Generator& gen) : Cloneable("TwoLayer") {
    fc1_ = register_module("fc1", make<Linear>(3, 4, true, gen));
    bn_ = register_module("bn", make<BatchNorm1d>(4));
    fc2_ = register_module("fc2", make<Linear>(4, 2, true, gen));
    scale_ = register_parameter("scale", ones({2}));
  }
  Tensor forward(const Tensor& x) override {
    Tensor h = ag::relu(child(bn_).forward(child(fc1_).forward(x)));
    return ag::mul(child(fc2_).forward(h), param(scale_));
  }

 private:
  ChildSlot<Linear> fc1_, fc2_;
  ChildSlot<BatchNorm1d> bn_;
  ParamSlot scale_;
};

TEST(Module, NamesInPyTorchOrder) {
  Generator gen(1);
  TwoLayer m(gen);
  EXPECT_EQ(names(m.named_parameters()),
            (std::vector<std::string>{"scale", "fc1.weight", "fc1.bias", "bn.weight", "bn.bias",
                                      "fc2.weight", "fc2.bias"}));
  EXPECT_EQ(names(m.named_buffers()),
            (std::vector<std::string>{"bn.running_mean", "bn.running_var", "bn.num_batches_tracked"}));
  EXPECT_EQ(names(m.state_dict()),
            (std::vector<std::string>{"scale", "fc1.weight", "fc1.bias", "bn.weight", "bn.bias",
                                      "bn.running_mean", "bn.running_var", "bn.num_batches_tracked",
                                      "fc2.weight", "fc2.bias"}));
  EXPECT_EQ(m.parameters().size(), 7u);
  EXPECT_EQ(m.num_parameters(), 2u + 12 + 4 + 4 + 4 + 8 + 2);
  EXPECT_TRUE(m.param("fc1.weight").is_same(m.parameters()[1]));
  Sequential seq({make<Linear>(2, 3), make<ReLU>(), make<Linear>(3, 1)});
  EXPECT_EQ(names(seq.named_parameters()),
            (std::vector<std::string>{"0.weight", "0.bias", "2.weight", "2.bias"}));
  EXPECT_NE(seq.str().find("(0): Linear(in_features=2, out_features=3, bias=true)"), std::string::npos)
      << seq.str();
}

// Checkpoints need every random stream a layer owns (a seeded Dropout), by a name that
// is the same in every run of the same model.
TEST(Module, NamedGeneratorsListsOwnedStreamsOnce) {
  auto shared = nn::make<nn::Dropout>(0.1, 3);
  auto inner = nn::make<nn::Sequential>(std::vector<std::shared_ptr<nn::Module>>{nn::make<nn::Dropout>(0.2, 9), shared});
  nn::Sequential net(std::vector<std::shared_ptr<nn::Module>>{
      nn::make<nn::Linear>(4, 4), nn::make<nn::Dropout>(0.5, 7), nn::make<nn::Dropout>(0.5), inner, shared});
  auto gens = net.named_generators();
  ASSERT_EQ(gens.size(), 3u);
  EXPECT_EQ(gens[0].first, "1.generator");
  EXPECT_EQ(gens[1].first, "3.0.generator");
  EXPECT_EQ(gens[2].first, "3.1.generator");  // the shared one, once, under its first name
  EXPECT_EQ(gens[0].second, &static_cast<nn::Dropout&>(*net.named_children()[1].second).generator());
  EXPECT_EQ(gens[2].second, &shared->generator());
  // The unseeded Dropout draws from default_generator(), which is not its own.
  EXPECT_TRUE(net.named_children()[2].second->own_generators().empty());
  EXPECT_TRUE(nn::Linear(2, 2).named_generators().empty());
}

TEST(Module, DuplicateAndBadNamesThrow) {
  struct Bad : Cloneable<Bad> {
    Bad() : Cloneable("Bad") {
      register_parameter("w", ones({1}));
      EXPECT_THROW(register_buffer("w", ones({1})), Error);
      EXPECT_THROW(register_parameter("a.b", ones({1})), Error);
    }
  };
  Bad b;
  EXPECT_THROW(b.param("nope"), Error);
}

TEST(Module, StateDictRoundTrip) {
  Generator g1(1), g2(2);
  TwoLayer a(g1), b(g2);
  EXPECT_GT(max_abs_diff(a.param("fc1.weight"), b.param("fc1.weight")), 0.0);
  Tensor b_weight = b.param("fc1.weight");
  auto result = b.load_state_dict(a.state_dict());
  EXPECT_TRUE(result.missing_keys.empty() && result.unexpected_keys.empty());
  auto sa = a.state_dict(), sb = b.state_dict();
  ASSERT_EQ(sa.size(), sb.size());
  for (size_t i = 0; i < sa.size(); ++i) {
    EXPECT_EQ(sa[i].first, sb[i].first);
    EXPECT_EQ(max_abs_diff(sa[i].second, sb[i].second), 0.0) << sa[i].first;
  }
  EXPECT_TRUE(b.param("fc1.weight").is_same(b_weight));  // identity kept
  // state_dict tensors share storage but carry no history
  EXPECT_FALSE(autograd::requires_grad(a.state_dict()[1].second));
}

TEST(Module, StrictLoadListsEveryProblemAndChangesNothing) {
  Generator g1(1), g2(2);
  TwoLayer a(g1), b(g2);
  StateDict dict = a.state_dict();
  dict.erase(dict.begin() + 1);                           // missing fc1.weight
  dict.emplace_back("extra.thing", ones({1}));            // unexpected
  dict[0].second = ones({5});                             // scale: wrong shape
  Tensor before = b.param("fc2.weight").clone();
  try {
    b.load_state_dict(dict);
    FAIL() << "strict load should throw";
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("missing keys (1): fc1.weight"), std::string::npos) << msg;
    EXPECT_NE(msg.find("unexpected keys (1): extra.thing"), std::string::npos) << msg;
    EXPECT_NE(msg.find("scale: checkpoint [5] vs model [2]"), std::string::npos) << msg;
    EXPECT_NE(msg.find("nothing was changed"), std::string::npos) << msg;
  }
  EXPECT_EQ(max_abs_diff(before, b.param("fc2.weight")), 0.0);
  // Non-strict: still refuses shape mismatches, reports the rest.
  dict[0].second = ones({2});
  auto r = b.load_state_dict(dict, /*strict=*/false);
  EXPECT_EQ(r.missing_keys, (std::vector<std::string>{"fc1.weight"}));
  EXPECT_EQ(r.unexpected_keys, (std::vector<std::string>{"extra.thing"}));
  EXPECT_EQ(max_abs_diff(a.param("fc2.weight"), b.param("fc2.weight")), 0.0);
}

TEST(Module, TrainEvalAndBatchNormBuffers) {
  Generator gen(3);
  TwoLayer m(gen);
  EXPECT_TRUE(m.is_training());
  Tensor x = randn({8, 3}, gen);
  m.forward(x);
  EXPECT_EQ(m.buffer("bn.num_batches_tracked").item(), 1.0);
  Tensor rm = m.buffer("bn.running_mean").clone();
  EXPECT_GT(max_abs_diff(rm, zeros({4})), 0.0);
  m.eval();
  for (auto& [name, child] : m.named_modules()) EXPECT_FALSE(child->is_training()) << name;
  m.forward(x);
  EXPECT_EQ(max_abs_diff(rm, m.buffer("bn.running_mean")), 0.0);  // eval does not update
  EXPECT_EQ(m.buffer("bn.num_batches_tracked").item(), 1.0);
}

TEST(Module, ToDtypeKeepsIdentity) {
  Generator gen(4);
  TwoLayer m(gen);
  Tensor w = m.param("fc1.weight");
  std::vector<double> before = w.to_vector<double>();
  m.to(DType::kFloat64);
  EXPECT_TRUE(m.param("fc1.weight").is_same(w));
  EXPECT_EQ(w.dtype(), DType::kFloat64);
  EXPECT_EQ(w.to_vector<double>(), before);
  EXPECT_EQ(m.buffer("bn.num_batches_tracked").dtype(), DType::kInt64);
  EXPECT_EQ(m.buffer("bn.running_var").dtype(), DType::kFloat64);
  EXPECT_TRUE(autograd::requires_grad(w));
  Tensor y = m.forward(randn({4, 3}, gen, DType::kFloat64));
  EXPECT_EQ(y.dtype(), DType::kFloat64);
}

// As PyTorch's nn.Module.to: an integer dtype is refused (it used to truncate every
// weight to an integer and leave int64 "parameters" that requires_grad), and nothing moves.
TEST(Module, ToAnIntegerDtypeIsRefusedAndChangesNothing) {
  Generator gen(4);
  TwoLayer m(gen);
  Tensor w = m.param("fc1.weight");
  std::vector<double> before = w.to_vector<double>();
  for (DType bad : {DType::kInt64, DType::kInt32}) {
    testing::expect_error([&] { m.to(bad); }, {"TwoLayer::to", dtype_name(bad), "not a floating-point dtype"});
    testing::expect_error([&] { m.to(Device::cpu(), bad); }, {"TwoLayer::to", dtype_name(bad)});
  }
  EXPECT_EQ(w.dtype(), DType::kFloat32);
  EXPECT_EQ(m.buffer("bn.running_var").dtype(), DType::kFloat32);
  EXPECT_EQ(w.to_vector<double>(), before);
  m.to(DType::kFloat64);  // floating point is fine
  EXPECT_EQ(w.dtype(), DType::kFloat64);
}

// str() shows every setting that is not at its default, as PyTorch's repr: a dilated
// convolution printed like an undilated one.
TEST(Module, Conv2dStrShowsDilationAndGroups) {
  Generator gen(6);
  EXPECT_EQ(Conv2d(2, 4, 3, 1, 2, true, gen, /*dilation=*/2, /*groups=*/2).str(),
            "Conv2d(2, 4, kernel_size=3, stride=1, padding=2, dilation=2, groups=2)");
  EXPECT_EQ(Conv2d(1, 2, 3, 2, 0, false, gen).str(), "Conv2d(1, 2, kernel_size=3, stride=2, padding=0, bias=false)");
}

// A module registered inside itself, directly or through a descendant, is refused:
// it made every walk (parameters(), state_dict(), str(), forward) recurse until the
// stack overflowed. Sharing one submodule in two places is still fine.
TEST(Module, RegisteringAModuleInsideItselfIsRefused) {
  auto outer = make<Sequential>();
  testing::expect_error([&] { outer->push_back(outer); }, {"submodule '0'", "itself", "cycle"});
  auto inner = make<Sequential>();
  outer->push_back(inner);
  testing::expect_error([&] { inner->push_back(outer); }, {"submodule '0'", "contains this module", "cycle"});
  auto deep = make<Sequential>();
  inner->push_back(deep);
  testing::expect_error([&] { deep->push_back(outer); }, {"contains this module"});
  auto shared = make<Linear>(2, 2);
  outer->push_back(shared).push_back(shared);  // a DAG, not a cycle
  EXPECT_EQ(outer->size(), 3u);
  EXPECT_EQ(inner->size(), 1u);
  EXPECT_EQ(deep->size(), 0u);
  EXPECT_EQ(outer->parameters().size(), 2u);
}

// Dropout's p prints as written (it was std::to_string's fixed "0.100000", and a p of
// 1e-7 printed as "0.000000", a dropout that looked switched off).
TEST(Module, DropoutStrShowsPAsWritten) {
  EXPECT_EQ(Dropout(0.1).str(), "Dropout(p=0.1)");
  EXPECT_EQ(Dropout(1e-7).str(), "Dropout(p=1e-07)");
  EXPECT_EQ(Dropout(0.5, 3).str(), "Dropout(p=0.5)");
}

TEST(Module, CloneIsDeep) {
  Generator gen(5);
  auto m = std::make_shared<TwoLayer>(gen);
  Tensor x = randn({6, 3}, gen);
  Tensor y0 = m->forward(x);
  std::shared_ptr<Module> copy = m->clone();
  EXPECT_EQ(copy->type_name(), "TwoLayer");
  auto p = m->named_parameters(), q = copy->named_parameters();
  ASSERT_EQ(names(p), names(q));
  for (size_t i = 0; i < p.size(); ++i) {
    EXPECT_NE(p[i].second.storage().get(), q[i].second.storage().get()) << p[i].first;
    EXPECT_EQ(max_abs_diff(p[i].second, q[i].second), 0.0);
    EXPECT_TRUE(autograd::requires_grad(q[i].second));
  }
  // The copy computes with its own tensors: changing the original does not affect it.
  Tensor y1 = copy->forward(x);
  {
    autograd::NoGradGuard g;
    fill_(m->param("fc2.weight"), 0.0);
  }
  EXPECT_LT(max_abs_diff(copy->forward(x), y1), 1e-6);
  EXPECT_GT(max_abs_diff(m->forward(x), y1), 1e-3);
  // Gradients flow to the copy's parameters only.
  autograd::backward(ag::sum(copy->forward(x)));
  EXPECT_TRUE(autograd::grad(q[1].second).defined());
  EXPECT_FALSE(autograd::grad(p[1].second).defined());
  (void)y0;
  // Children keep their concrete types in the copy.
  auto children = copy->named_children();
  EXPECT_NE(std::dynamic_pointer_cast<BatchNorm1d>(children[1].second), nullptr);
  EXPECT_NE(std::dynamic_pointer_cast<Linear>(children[0].second), nullptr);
}

TEST(Module, NotCloneableSaysHowToFix) {
  struct Plain : Module {
    Plain() : Module("Plain") {}
  };
  Plain p;
  try {
    p.clone();
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("Cloneable<"), std::string::npos);
  }
}

TEST(Module, PyTorchInitRanges) {
  Generator gen(6);
  Linear fc(256, 64, true, gen);
  double bound = 1.0 / std::sqrt(256.0);
  for (const Tensor& t : {fc.weight(), fc.bias()}) {
    auto v = t.to_vector<double>();
    double lo = *std::min_element(v.begin(), v.end()), hi = *std::max_element(v.begin(), v.end());
    EXPECT_GE(lo, -bound);
    EXPECT_LE(hi, bound);
    EXPECT_LT(lo, -0.9 * bound);  // actually spans the range
    EXPECT_GT(hi, 0.9 * bound);
  }
  Conv2d conv(3, 8, 3, 1, 1, true, gen);
  auto cw = conv.weight().to_vector<double>();
  double cb = 1.0 / std::sqrt(27.0);
  EXPECT_LE(*std::max_element(cw.begin(), cw.end()), cb);
  EXPECT_GT(*std::max_element(cw.begin(), cw.end()), 0.8 * cb);
  // Same seed, same model.
  Generator a(9), b(9);
  EXPECT_EQ(max_abs_diff(Linear(5, 5, true, a).weight(), Linear(5, 5, true, b).weight()), 0.0);
}

TEST(Module, ZeroGrad) {
  Generator gen(7);
  Linear fc(3, 2, true, gen);
  autograd::backward(ag::sum(fc.forward(ones({1, 3}))));
  EXPECT_TRUE(autograd::grad(fc.weight()).defined());
  fc.zero_grad(/*set_to_none=*/false);
  EXPECT_EQ(sum(abs(autograd::grad(fc.weight()))).item(), 0.0);
  fc.zero_grad();
  EXPECT_FALSE(autograd::grad(fc.weight()).defined());
}

// A submodule registered twice (tied weights): listed once under its first name,
// like PyTorch's named_parameters(remove_duplicate=True), so an optimizer steps it
// once and DDP reduces it once; state_dict() keeps every name.
TEST(Module, ReusedSubmoduleIsListedOnceUnderItsFirstName) {
  Generator gen(8);
  auto shared = make<Linear>(3, 3, true, gen);
  Sequential seq({shared, make<Tanh>(), shared, make<BatchNorm1d>(3)});
  EXPECT_EQ(names(seq.named_parameters()),
            (std::vector<std::string>{"0.weight", "0.bias", "3.weight", "3.bias"}));
  EXPECT_EQ(seq.parameters().size(), 4u);
  EXPECT_EQ(seq.num_parameters(), 9u + 3 + 3 + 3);
  EXPECT_EQ(names(seq.named_parameters(true, /*remove_duplicate=*/false)),
            (std::vector<std::string>{"0.weight", "0.bias", "2.weight", "2.bias", "3.weight", "3.bias"}));
  EXPECT_TRUE(seq.param("2.weight").is_same(seq.param("0.weight")));
  EXPECT_EQ(names(seq.state_dict()),
            (std::vector<std::string>{"0.weight", "0.bias", "2.weight", "2.bias", "3.weight", "3.bias",
                                      "3.running_mean", "3.running_var", "3.num_batches_tracked"}));
  // Loading writes both names into the one tensor; the tie survives.
  Generator other(9);
  auto shared2 = make<Linear>(3, 3, true, other);
  Sequential seq2({shared2, make<Tanh>(), shared2, make<BatchNorm1d>(3)});
  seq2.load_state_dict(seq.state_dict());
  EXPECT_TRUE(seq2.param("2.weight").is_same(seq2.param("0.weight")));
  EXPECT_EQ(max_abs_diff(seq2.param("0.weight"), seq.param("0.weight")), 0.0);
  // A buffer reached twice is listed once as well.
  auto bn = make<BatchNorm1d>(3);
  Sequential twice({bn, bn});
  EXPECT_EQ(names(twice.named_buffers()),
            (std::vector<std::string>{"0.running_mean", "0.running_var", "0.num_batches_tracked"}));
  EXPECT_EQ(twice.named_buffers(true, /*remove_duplicate=*/false).size(), 6u);
}

// clone() keeps sharing, as copy.deepcopy does: a submodule registered twice and a tensor two
// modules hold are copied once (before, the copy had two independent weights, so training a
// clone, e.g. a DataParallel replica or a DDP reference model, was not training the model).
TEST(Module, CloneKeepsSharedSubmodulesAndTiedTensorsShared) {
  Generator gen(12);
  auto shared = make<Linear>(3, 3, true, gen);
  auto head = make<Linear>(3, 3, false, gen);
  head->param("weight") = shared->param("weight");  // tied across two modules
  Sequential seq({shared, make<Tanh>(), shared, head});
  auto copy = std::static_pointer_cast<Sequential>(seq.clone());
  EXPECT_TRUE(copy->param("2.bias").is_same(copy->param("0.bias")));      // one Linear, reached twice
  EXPECT_TRUE(copy->param("3.weight").is_same(copy->param("0.weight")));  // the tie survived
  EXPECT_FALSE(copy->param("0.weight").is_same(seq.param("0.weight")));   // and it is a copy
  EXPECT_EQ(max_abs_diff(copy->param("0.weight"), seq.param("0.weight")), 0.0);
  EXPECT_EQ(copy->parameters().size(), seq.parameters().size());
  EXPECT_TRUE(autograd::requires_grad(copy->param("0.weight")));
}

// The optimizer gets the tied weight once (it rejects a list naming a tensor twice)
// and steps it once: w -= lr * (sum of both uses' gradients).
TEST(Module, OptimizerStepsATiedWeightOnce) {
  Generator gen(10);
  auto shared = make<Linear>(2, 2, false, gen);
  Sequential seq({shared, make<Tanh>(), shared});
  Tensor w = seq.param("0.weight");
  Tensor before = w.clone();
  SGD sgd(seq.parameters(), SGDOptions{.lr = 0.5});
  autograd::backward(ag::sum(seq.forward(randn({3, 2}, gen))));
  Tensor g = autograd::grad(w).clone();
  sgd.step();
  Tensor expected = sub(before, mul(g, 0.5));
  EXPECT_LT(max_abs_diff(w, expected), 1e-6);
}

// ---------------------------------------------------------------- layer misuse

using ringtrain::testing::expect_error;

TEST(LayerMisuse, BatchNormChecksEpsAndMomentum) {
  expect_error([] { BatchNorm1d(3, -1e-5); }, {"BatchNorm1d", "eps", ">= 0"});
  expect_error([] { BatchNorm2d(3, std::nan("")); }, {"BatchNorm2d", "eps", "finite"});
  expect_error([] { BatchNorm1d(3, 1e-5, 1.5); }, {"BatchNorm1d", "momentum", "[0, 1]"});
  expect_error([] { BatchNorm2d(3, 1e-5, -0.1); }, {"BatchNorm2d", "momentum", "[0, 1]"});
  expect_error([] { BatchNorm1d(3, 1e-5, std::nan("")); }, {"BatchNorm1d", "momentum"});
  BatchNorm1d ok(3, 0.0, 1.0);  // the ends of the ranges are fine
  EXPECT_EQ(ok.type_name(), "BatchNorm1d");
}

TEST(LayerMisuse, LayerNormChecksItsShapeAndEps) {
  expect_error([] { LayerNorm({-3}); }, {"LayerNorm", "normalized_shape", "[-3]", "positive"});
  expect_error([] { LayerNorm({4, 0}); }, {"LayerNorm", "[4, 0]"});
  expect_error([] { LayerNorm({4}, -1.0); }, {"LayerNorm", "eps"});
  LayerNorm ln({4}, 1e-5, /*elementwise_affine=*/false);
  expect_error([&] { ln.forward(zeros({2, 4}, DType::kInt64)); }, {"LayerNorm", "int64", "floating point"});
}

TEST(LayerMisuse, Conv2dChecksStridePaddingDilationAtConstruction) {
  expect_error([] { Conv2d(1, 1, 3, /*stride=*/0); }, {"Conv2d", "stride=0", "stride >= 1"});
  expect_error([] { Conv2d(1, 1, 3, 1, /*padding=*/-1); }, {"Conv2d", "padding=-1"});
  expect_error([] { Conv2d(1, 1, 3, 1, 0, true, default_generator(), /*dilation=*/0); }, {"Conv2d", "dilation=0"});
  expect_error([] { Conv2d(4, 4, 3, 1, 0, true, default_generator(), 1, /*groups=*/3); }, {"Conv2d", "groups=3"});
}

TEST(LayerMisuse, InputDtypeMismatchNamesTheLayerAndTheFix) {
  Generator gen(1);
  BatchNorm1d bn(3);
  expect_error([&] { bn.forward(randn({4, 3}, gen, DType::kFloat64)); },
               {"BatchNorm1d", "float64", "float32", "module->to(DType::kFloat64)"});
  EXPECT_EQ(bn.buffer("num_batches_tracked").item(), 0.0);  // nothing was updated
  Linear fc(3, 2, true, gen);
  expect_error([&] { fc.forward(randn({4, 3}, gen, DType::kFloat64)); },
               {"Linear", "float64", "float32", "module->to(DType::kFloat64)"});
  expect_error([&] { fc.forward(zeros({4, 3}, DType::kInt64)); }, {"Linear", "int64", "floating point"});
  Conv2d conv(1, 1, 3, 1, 0, true, gen);
  expect_error([&] { conv.forward(randn({1, 1, 4, 4}, gen, DType::kFloat64)); }, {"Conv2d", "float64"});
  // After module->to(dtype) the same input runs.
  fc.to(DType::kFloat64);
  EXPECT_EQ(fc.forward(randn({4, 3}, gen, DType::kFloat64)).dtype(), DType::kFloat64);
  bn.to(DType::kFloat64);
  EXPECT_EQ(bn.forward(randn({4, 3}, gen, DType::kFloat64)).dtype(), DType::kFloat64);
}

}  // namespace
}  // namespace ringtrain::nn
