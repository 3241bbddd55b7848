// module.h: the Module base class every layer and every user model derives from.
//
// defines: Module (ordered named parameters, buffers and child modules;
//          parameters()/named_parameters()/named_buffers(); state_dict() and
//          load_state_dict(strict); train()/eval(); to(device, dtype); deep clone();
//          zero_grad(); own_generators()/named_generators() for the random
//          streams a layer owns), Cloneable<Derived> (the CRTP helper that gives clone()),
//          ParamSlot/BufferSlot/ChildSlot (handles a layer keeps to reach its own
//          tensors), StateDict, LoadStateDictResult.
//
// Where it sits: a Module owns the leaf tensors (parameters, requires_grad=true)
// that the forward pass feeds to the differentiable ops of autograd/functions.h.
// Optimizers (nn/optim.h) and DDP's Reducer receive the same Tensor handles from
// parameters(); because a Tensor is a handle, they all see one object, and the
// gradient that backward accumulates into a parameter is the one they read.
//
// Ordering: parameters, buffers and children are kept in registration order, and
// every listing walks "own parameters, then children depth-first" exactly like
// PyTorch, so names and order match a PyTorch model written the same way
// ("0.weight", "0.bias", "2.weight", ... for a Sequential). DDP relies on the
// order being identical on every rank.
//
// Rule for subclasses (what keeps clone() correct): a layer reaches its own
// parameters, buffers and children through the slot handles returned by
// register_parameter/register_buffer/register_module (param(slot), buffer(slot),
// child(slot)), never by keeping its own copies of the Tensor or shared_ptr.
// Slots are indices, so they stay valid in a copy; clone() copy-constructs the
// derived object (Cloneable<Derived>) and then replaces every registered tensor
// with a deep copy and every child with the child's clone().
//
// Identity: to(), load_state_dict() and the optimizers change parameter values in
// place (the same TensorImpl), so a handle taken before (an optimizer, a DDP
// hook) stays valid.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <cstdint>
#include <vector>

#include "tensor/device.h"
#include "tensor/dtype.h"
#include "tensor/tensor.h"

namespace ringtrain {
class Generator;  // tensor/ops.h
}  // namespace ringtrain

namespace ringtrain::nn {

// An ordered name -> tensor list (a model's or an optimizer's tensors). Ordered,
// because safetensors files and DDP both want a deterministic order.
using StateDict = std::vector<std::pair<std::string, Tensor>>;

// What load_state_dict(strict=false) found; with strict=true any non-empty list throws.
struct LoadStateDictResult {
  std::vector<std::string> missing_keys;     // in the module, absent from the dict
  std::vector<std::string> unexpected_keys;  // in the dict, absent from the module
};

// Handles a module keeps to its own registered tensors/children (indices into
// its registries, so they survive the copy made by clone()).
struct ParamSlot {
  size_t index = static_cast<size_t>(-1);
};
struct BufferSlot {
  size_t index = static_cast<size_t>(-1);
};
template <typename M>
struct ChildSlot {
  size_t index = static_cast<size_t>(-1);
};

class Module {
 public:
  // `type_name` is what errors and printing call this module ("Linear").
  explicit Module(std::string type_name);
  virtual ~Module() = default;
  Module& operator=(const Module&) = delete;

  // The single-tensor forward most layers have. The default throws, naming the
  // type: modules with other signatures define their own call operator.
  virtual Tensor forward(const Tensor& input);
  Tensor operator()(const Tensor& input) { return forward(input); }

  const std::string& type_name() const { return type_name_; }

  // ---- listing (own entries first, then children depth-first, registration order) ----
  // A tensor reached under several names (a submodule registered twice, tied
  // weights) is listed once, under the first name met, unless remove_duplicate is
  // false: like PyTorch, so an optimizer steps a tied weight once and DDP reduces
  // it once. state_dict() still lists every name (see below).
  std::vector<Tensor> parameters(bool recurse = true) const;
  std::vector<std::pair<std::string, Tensor>> named_parameters(bool recurse = true,
                                                               bool remove_duplicate = true) const;
  std::vector<Tensor> buffers(bool recurse = true) const;
  std::vector<std::pair<std::string, Tensor>> named_buffers(bool recurse = true,
                                                            bool remove_duplicate = true) const;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> named_children() const;
  // Every descendant with its dotted name (not including this module itself).
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> named_modules() const;
  size_t num_parameters() const;  // total elements over all parameters

  // Lookup by (dotted) name; throws listing the names that exist.
  Tensor& param(const std::string& name);
  Tensor& buffer(const std::string& name);

  // ---- state ----
  // Parameters and buffers by dotted name, in listing order, every name even when
  // two name the same tensor (tied weights: both keys, one value, as PyTorch). The tensors share
  // storage with the module (no copy) and carry no autograd history.
  StateDict state_dict() const;
  // Copies values into the existing tensors (identity kept). Everything is
  // validated before anything is written: a key missing from the dict, a key the
  // module does not have (strict only), or a shape mismatch (always) throws one
  // Error listing every problem, and the module is left untouched. Dtype and
  // device are converted.
  LoadStateDictResult load_state_dict(const StateDict& dict, bool strict = true);

  // Training mode (Dropout, BatchNorm look at it); recursive.
  void train(bool on = true);
  void eval() { train(false); }
  bool is_training() const { return training_; }

  // Moves/converts every parameter, gradient and buffer in place (the tensor
  // handles stay the same objects). Buffers of integer dtype (e.g. BatchNorm's
  // num_batches_tracked) keep their dtype when only `dtype` changes. `dtype` must be
  // floating point: an integer one throws, changing nothing (PyTorch refuses it too).
  void to(Device device, DType dtype);
  void to(Device device);
  void to(DType dtype);

  // Sets every parameter's gradient to undefined (set_to_none, the default) or zero.
  void zero_grad(bool set_to_none = true);

  // A deep copy: new parameter/buffer storage with the same values, same
  // requires_grad, no gradients, children cloned recursively. Sharing survives, as in
  // copy.deepcopy: a submodule registered twice, or a tensor two modules hold (tied
  // weights), is copied once and shared the same way in the copy. Needs the concrete
  // class to derive from Cloneable<Derived>.
  std::shared_ptr<Module> clone() const;

  // "Sequential(\n  (0): Linear(in_features=4, out_features=8, bias=true)\n ...)".
  std::string str() const;
  // One line of this module's own settings, shown by str() ("in_features=4, ...").
  virtual std::string extra_repr() const { return ""; }

  // ---- random streams a module owns (for checkpoints) ----
  // Generators this module itself owns (not its children's), by a name unique
  // within the module, e.g. {"generator", &gen} for a Dropout built with a seed.
  // Default: none. Layers that draw from default_generator() own nothing here.
  virtual std::vector<std::pair<std::string, Generator*>> own_generators() { return {}; }
  // Every owned generator of this module and its descendants under a stable
  // dotted name ("2.generator" for the Dropout at index 2 of a Sequential), in
  // listing order; a generator reached twice (a shared submodule) is listed once.
  // A resumable run saves and restores these (CheckpointTargets::extra_generators).
  std::vector<std::pair<std::string, Generator*>> named_generators();

 protected:
  Module(const Module&) = default;  // used by Cloneable<Derived>::clone_shallow()

  // ---- registration (call from constructors) ----
  // Registers a parameter (a leaf; requires_grad set as given). Names must be
  // unique among this module's parameters, buffers and children and contain no '.'.
  // A child may be shared (registered in several places), but one that is, or
  // contains, this module is refused: the tree would be a cycle.
  ParamSlot register_parameter(const std::string& name, Tensor value, bool requires_grad = true);
  BufferSlot register_buffer(const std::string& name, Tensor value);
  template <typename M>
  ChildSlot<M> register_module(const std::string& name, std::shared_ptr<M> module) {
    return ChildSlot<M>{register_child(name, std::move(module))};
  }

  Tensor& param(ParamSlot slot) { return params_.at(slot.index).second; }
  const Tensor& param(ParamSlot slot) const { return params_.at(slot.index).second; }
  Tensor& buffer(BufferSlot slot) { return buffers_.at(slot.index).second; }
  const Tensor& buffer(BufferSlot slot) const { return buffers_.at(slot.index).second; }
  template <typename M>
  M& child(ChildSlot<M> slot) const {
    return static_cast<M&>(*children_.at(slot.index).second);
  }
  size_t num_children() const { return children_.size(); }
  Module& child_at(size_t index) const { return *children_.at(index).second; }

  // The shallow copy clone() starts from (Cloneable implements it).
  virtual std::shared_ptr<Module> clone_shallow() const;

 private:
  size_t register_child(const std::string& name, std::shared_ptr<Module> module);
  void check_new_name(const std::string& name, const char* what) const;
  void collect(const std::string& prefix, bool recurse, bool want_params,
               std::vector<std::pair<std::string, Tensor>>& out) const;
  std::vector<std::pair<std::string, Tensor>> listing(bool recurse, bool want_params,
                                                      bool remove_duplicate) const;
  void str_into(std::string& out, int indent) const;
  // clone() with what was copied so far: the originals' modules and tensors -> their copies.
  struct CloneMemo;
  std::shared_ptr<Module> clone_into(CloneMemo& memo) const;

  std::string type_name_;  // "Linear", "Sequential", ...; used in errors and str()
  bool training_ = true;   // train()/eval() mode; train() sets it here and in every descendant
  std::vector<std::pair<std::string, Tensor>> params_;    // own parameters, registration order
  std::vector<std::pair<std::string, Tensor>> buffers_;   // own buffers (running stats, ...)
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;  // submodules
};

// FNV-1a over the bits of every parameter (as float32, in parameters() order): equal
// fingerprints = bitwise equal weights. Compares replicas across ranks (the Trainer
// does at the end of a DDP fit) and a resumed run with an uninterrupted one.
uint64_t weights_fingerprint(const Module& model);

// Derive concrete modules from Cloneable<YourModule> (instead of Module) to get clone().
template <typename Derived>
class Cloneable : public Module {
 public:
  using Module::Module;

 protected:
  std::shared_ptr<Module> clone_shallow() const override {
    return std::make_shared<Derived>(static_cast<const Derived&>(*this));
  }
};

}  // namespace ringtrain::nn
