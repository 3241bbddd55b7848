// module.cc: Module's registries, listings, state_dict/load_state_dict, mode,
// device/dtype moves and deep clone. See module.h for the rules.
#include "nn/module.h"

#include <algorithm>
#include <map>
#include <sstream>
#include <unordered_map>
#include <unordered_set>

#include "autograd/autograd.h"
#include "tensor/checks.h"
#include "tensor/ops.h"

namespace ringtrain::nn {

namespace {
// Replaces the contents of `dst`'s impl with `src`'s (storage, shape, strides,
// offset, dtype) keeping dst's identity and autograd meta. A tensor saved for backward
// that is swapped this way is refused by autograd (it compares the storage).
void assign_in_place(const Tensor& dst, const Tensor& src) {
  TensorImpl* d = dst.unsafe_impl();
  const TensorImpl* s = src.unsafe_impl();
  d->storage = s->storage;
  d->shape = s->shape;
  d->strides = s->strides;
  d->offset = s->offset;
  d->dtype = s->dtype;
}
}  // namespace

Module::Module(std::string type_name) : type_name_(std::move(type_name)) {}

Tensor Module::forward(const Tensor& input) {
  throw Error(type_name_ + " has no single-tensor forward(); call its own forward method");
}

// ---------------------------------------------------------------- registration

void Module::check_new_name(const std::string& name, const char* what) const {
  RT_CHECK(!name.empty() && name.find('.') == std::string::npos, type_name_, ": ", what, " name '",
           name, "' must be non-empty and contain no '.'");
  auto taken = [&](const auto& list) {
    return std::any_of(list.begin(), list.end(), [&](const auto& e) { return e.first == name; });
  };
  RT_CHECK(!taken(params_) && !taken(buffers_) && !taken(children_), type_name_, ": cannot register ",
           what, " '", name, "': the name is already used");
}

ParamSlot Module::register_parameter(const std::string& name, Tensor value, bool requires_grad) {
  check_new_name(name, "parameter");
  RT_CHECK(value.defined(), type_name_, ": parameter '", name, "' is undefined");
  RT_CHECK(autograd::is_leaf(value), type_name_, ": parameter '", name,
           "' must be a leaf tensor (detach() it first)");
  autograd::set_requires_grad(value, requires_grad);
  params_.emplace_back(name, std::move(value));
  return ParamSlot{params_.size() - 1};
}

BufferSlot Module::register_buffer(const std::string& name, Tensor value) {
  check_new_name(name, "buffer");
  RT_CHECK(value.defined(), type_name_, ": buffer '", name, "' is undefined");
  buffers_.emplace_back(name, std::move(value));
  return BufferSlot{buffers_.size() - 1};
}

size_t Module::register_child(const std::string& name, std::shared_ptr<Module> module) {
  check_new_name(name, "module");
  RT_CHECK(module != nullptr, type_name_, ": submodule '", name, "' is null");
  // A module inside itself (s->push_back(s), or an ancestor registered under its own
  // descendant) would make every recursive walk (parameters(), state_dict(), str(),
  // forward) recurse until the stack overflows, and the shared_ptrs would never be freed.
  // Sharing a submodule in two places is fine; only a path back to `this` is refused.
  std::vector<const Module*> to_visit = {module.get()};
  std::unordered_set<const Module*> seen;
  while (!to_visit.empty()) {
    const Module* m = to_visit.back();
    to_visit.pop_back();
    RT_CHECK(m != this, type_name_, ": cannot register submodule '", name, "' (", module->type_name(), "): ",
             module.get() == this ? "it is this module itself" : "it contains this module",
             ", so the module tree would be a cycle; register a different module (or a clone())");
    if (!seen.insert(m).second) continue;
    for (const auto& [child_name, child] : m->children_) to_visit.push_back(child.get());
  }
  // The child keeps its train/eval flags (PyTorch's add_module leaves them alone too):
  // wrapping a model must not unfreeze a BatchNorm the user put in eval mode.
  children_.emplace_back(name, std::move(module));
  return children_.size() - 1;
}

// ---------------------------------------------------------------- listing

void Module::collect(const std::string& prefix, bool recurse, bool want_params,
                     std::vector<std::pair<std::string, Tensor>>& out) const {
  for (const auto& [name, t] : want_params ? params_ : buffers_) out.emplace_back(prefix + name, t);
  if (!recurse) return;
  for (const auto& [name, child] : children_) child->collect(prefix + name + ".", true, want_params, out);
}

std::vector<std::pair<std::string, Tensor>> Module::listing(bool recurse, bool want_params,
                                                            bool remove_duplicate) const {
  std::vector<std::pair<std::string, Tensor>> all;
  collect("", recurse, want_params, all);
  if (!remove_duplicate) return all;
  // A tensor reached twice (the same Linear registered twice, tied weights) keeps
  // its first name only, as PyTorch's named_parameters(remove_duplicate=True):
  // an optimizer must step it once and DDP must reduce it once. Identity is the
  // TensorImpl, the same test Tensor::is_same makes.
  std::vector<std::pair<std::string, Tensor>> out;
  std::unordered_set<const TensorImpl*> seen;
  for (auto& entry : all)
    if (seen.insert(entry.second.unsafe_impl()).second) out.push_back(std::move(entry));
  return out;
}

std::vector<std::pair<std::string, Tensor>> Module::named_parameters(bool recurse,
                                                                    bool remove_duplicate) const {
  return listing(recurse, /*want_params=*/true, remove_duplicate);
}

std::vector<Tensor> Module::parameters(bool recurse) const {
  std::vector<Tensor> out;
  for (auto& [name, t] : named_parameters(recurse)) out.push_back(t);
  return out;
}

std::vector<std::pair<std::string, Tensor>> Module::named_buffers(bool recurse, bool remove_duplicate) const {
  return listing(recurse, /*want_params=*/false, remove_duplicate);
}

std::vector<Tensor> Module::buffers(bool recurse) const {
  std::vector<Tensor> out;
  for (auto& [name, t] : named_buffers(recurse)) out.push_back(t);
  return out;
}

std::vector<std::pair<std::string, std::shared_ptr<Module>>> Module::named_children() const {
  return children_;
}

std::vector<std::pair<std::string, std::shared_ptr<Module>>> Module::named_modules() const {
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> out;
  for (const auto& [name, child] : children_) {
    out.emplace_back(name, child);
    for (auto& [sub, m] : child->named_modules()) out.emplace_back(name + "." + sub, m);
  }
  return out;
}

size_t Module::num_parameters() const {
  size_t n = 0;
  for (const Tensor& p : parameters()) n += static_cast<size_t>(p.numel());
  return n;
}

Tensor& Module::param(const std::string& name) {
  auto dot = name.find('.');
  if (dot != std::string::npos) {
    std::string head = name.substr(0, dot);
    for (auto& [n, child] : children_)
      if (n == head) return child->param(name.substr(dot + 1));
  } else {
    for (auto& [n, t] : params_)
      if (n == name) return t;
  }
  std::ostringstream os;
  os << type_name_ << " has no parameter '" << name << "'; parameters:";
  for (auto& [n, t] : named_parameters(true, /*remove_duplicate=*/false)) os << " " << n;
  throw Error(os.str());
}

Tensor& Module::buffer(const std::string& name) {
  auto dot = name.find('.');
  if (dot != std::string::npos) {
    std::string head = name.substr(0, dot);
    for (auto& [n, child] : children_)
      if (n == head) return child->buffer(name.substr(dot + 1));
  } else {
    for (auto& [n, t] : buffers_)
      if (n == name) return t;
  }
  std::ostringstream os;
  os << type_name_ << " has no buffer '" << name << "'; buffers:";
  for (auto& [n, t] : named_buffers(true, /*remove_duplicate=*/false)) os << " " << n;
  throw Error(os.str());
}

// ---------------------------------------------------------------- state

StateDict Module::state_dict() const {
  // PyTorch's order: per module its parameters then its buffers, then children.
  StateDict out;
  std::function<void(const Module&, const std::string&)> walk = [&](const Module& m,
                                                                    const std::string& prefix) {
    for (const auto& [name, t] : m.params_) out.emplace_back(prefix + name, autograd::detach(t));
    for (const auto& [name, t] : m.buffers_) out.emplace_back(prefix + name, autograd::detach(t));
    for (const auto& [name, child] : m.children_) walk(*child, prefix + name + ".");
  };
  walk(*this, "");
  return out;
}

LoadStateDictResult Module::load_state_dict(const StateDict& dict, bool strict) {
  std::vector<std::pair<std::string, Tensor>> own;
  std::function<void(const Module&, const std::string&)> walk = [&](const Module& m,
                                                                    const std::string& prefix) {
    for (const auto& [name, t] : m.params_) own.emplace_back(prefix + name, t);
    for (const auto& [name, t] : m.buffers_) own.emplace_back(prefix + name, t);
    for (const auto& [name, child] : m.children_) walk(*child, prefix + name + ".");
  };
  walk(*this, "");

  std::map<std::string, const Tensor*> given;
  std::vector<std::string> duplicates;
  for (const auto& [name, t] : dict)
    if (!given.emplace(name, &t).second) duplicates.push_back(name);

  LoadStateDictResult result;
  std::vector<std::string> mismatched;
  std::map<std::string, bool> known;
  for (const auto& [name, t] : own) {
    known[name] = true;
    auto it = given.find(name);
    if (it == given.end()) {
      result.missing_keys.push_back(name);
    } else if (!it->second->defined() || it->second->shape() != t.shape()) {
      mismatched.push_back(name + ": checkpoint " +
                           (it->second->defined() ? shape_str(it->second->shape()) : "undefined") +
                           " vs model " + shape_str(t.shape()));
    }
  }
  for (const auto& [name, t] : dict)
    if (!known.count(name)) result.unexpected_keys.push_back(name);

  bool fail = !mismatched.empty() || !duplicates.empty() ||
              (strict && (!result.missing_keys.empty() || !result.unexpected_keys.empty()));
  if (fail) {
    std::ostringstream os;
    os << "load_state_dict: cannot load into " << type_name_ << " (nothing was changed):";
    auto list = [&](const char* what, const std::vector<std::string>& keys) {
      if (keys.empty()) return;
      os << "\n  " << what << " (" << keys.size() << "):";
      for (const auto& k : keys) os << " " << k << ";";
    };
    if (strict) {
      list("missing keys", result.missing_keys);
      list("unexpected keys", result.unexpected_keys);
    }
    list("shape mismatches", mismatched);
    list("duplicate keys", duplicates);
    throw Error(os.str());
  }
  autograd::NoGradGuard no_grad;
  for (auto& [name, t] : own) {
    auto it = given.find(name);
    if (it == given.end()) continue;
    Tensor dst = t;
    dst.copy_(*it->second);
  }
  return result;
}

// ---------------------------------------------------------------- mode, device, grads

void Module::train(bool on) {
  training_ = on;
  for (auto& [name, child] : children_) child->train(on);
}

namespace {
// As PyTorch's nn.Module.to: parameters stay floating point. An integer "model" would
// hold truncated weights that autograd cannot differentiate, and its integer buffers
// (num_batches_tracked) keep their dtype anyway. Checked before anything moves.
void check_module_dtype(const std::string& type_name, DType dtype) {
  RT_CHECK(is_floating_point(dtype), type_name, "::to: ", dtype_name(dtype), " is not a floating-point dtype; "
           "a module's parameters and floating-point buffers can only be moved to float32, float64, float16 or "
           "bfloat16 (convert integer inputs such as token ids, not the module)");
}
}  // namespace

void Module::to(Device device, DType dtype) {
  check_module_dtype(type_name_, dtype);
  auto convert = [&](const Tensor& t, bool keep_dtype) {
    DType target = keep_dtype ? t.dtype() : dtype;
    if (t.device() == device && t.dtype() == target) return;
    assign_in_place(t, t.to(device, target));
    Tensor g = autograd::grad(t);
    if (g.defined()) autograd::set_grad(t, g.to(device, target));
  };
  for (auto& [name, t] : params_) convert(t, false);
  for (auto& [name, t] : buffers_) convert(t, !is_floating_point(t.dtype()));
  for (auto& [name, child] : children_) child->to(device, dtype);
}

void Module::to(Device device) {
  for (auto& [name, t] : params_)
    if (t.device() != device) assign_in_place(t, t.to(device));
  for (auto& [name, t] : params_) {
    Tensor g = autograd::grad(t);
    if (g.defined() && g.device() != device) autograd::set_grad(t, g.to(device));
  }
  for (auto& [name, t] : buffers_)
    if (t.device() != device) assign_in_place(t, t.to(device));
  for (auto& [name, child] : children_) child->to(device);
}

void Module::to(DType dtype) {
  check_module_dtype(type_name_, dtype);
  for (auto& [name, t] : params_) {
    if (t.dtype() == dtype) continue;
    assign_in_place(t, t.to(dtype));
    Tensor g = autograd::grad(t);
    if (g.defined()) autograd::set_grad(t, g.to(dtype));
  }
  for (auto& [name, t] : buffers_)
    if (is_floating_point(t.dtype()) && t.dtype() != dtype) assign_in_place(t, t.to(dtype));
  for (auto& [name, child] : children_) child->to(dtype);
}

void Module::zero_grad(bool set_to_none) {
  for (const Tensor& p : parameters()) {
    Tensor g = autograd::grad(p);
    if (!g.defined()) continue;
    if (set_to_none) {
      autograd::set_grad(p, Tensor());
    } else {
      zero_(g);
    }
  }
}

// ---------------------------------------------------------------- clone

std::shared_ptr<Module> Module::clone_shallow() const {
  throw Error(type_name_ + "::clone(): the class does not derive from Cloneable<" + type_name_ +
              ">, so it cannot be copied; derive from nn::Cloneable<YourModule> instead of nn::Module");
}

struct Module::CloneMemo {
  std::unordered_map<const Module*, std::shared_ptr<Module>> modules;
  std::unordered_map<const TensorImpl*, Tensor> tensors;
};

std::shared_ptr<Module> Module::clone() const {
  CloneMemo memo;
  autograd::NoGradGuard no_grad;
  return clone_into(memo);
}

std::shared_ptr<Module> Module::clone_into(CloneMemo& memo) const {
  if (auto it = memo.modules.find(this); it != memo.modules.end()) return it->second;  // shared child
  std::shared_ptr<Module> copy = clone_shallow();
  memo.modules.emplace(this, copy);
  // A tensor held by several modules (tied weights) is copied once.
  auto copy_of = [&](const Tensor& t, bool parameter) {
    if (!t.defined()) return t;
    auto [it, fresh] = memo.tensors.try_emplace(t.unsafe_impl());
    if (fresh) {
      if (parameter) {
        it->second = autograd::detach(t).clone();
        autograd::set_requires_grad(it->second, autograd::requires_grad(t));
      } else {
        it->second = t.clone();
      }
    }
    return it->second;
  };
  for (auto& [name, t] : copy->params_) t = copy_of(t, /*parameter=*/true);
  for (auto& [name, t] : copy->buffers_) t = copy_of(t, /*parameter=*/false);
  for (auto& [name, child] : copy->children_) child = child->clone_into(memo);
  return copy;
}

// ---------------------------------------------------------------- printing

void Module::str_into(std::string& out, int indent) const {
  out += type_name_ + "(" + extra_repr();
  if (!children_.empty()) {
    out += "\n";
    for (const auto& [name, child] : children_) {
      out += std::string(indent + 2, ' ') + "(" + name + "): ";
      child->str_into(out, indent + 2);
      out += "\n";
    }
    out += std::string(indent, ' ');
  }
  out += ")";
}

std::string Module::str() const {
  std::string out;
  str_into(out, 0);
  return out;
}

std::vector<std::pair<std::string, Generator*>> Module::named_generators() {
  std::vector<std::pair<std::string, Generator*>> out;
  auto add = [&out](const std::string& prefix, Module& m) {
    for (auto& [name, gen] : m.own_generators()) {
      RT_CHECK(gen != nullptr, m.type_name(), "::own_generators returned a null generator '", name, "'");
      bool seen = false;
      for (const auto& entry : out) seen = seen || entry.second == gen;
      if (!seen) out.emplace_back(prefix + name, gen);
    }
  };
  add("", *this);
  for (auto& [name, child] : named_modules()) add(name + ".", *child);
  return out;
}

uint64_t weights_fingerprint(const Module& model) {
  uint64_t h = 1469598103934665603ull;
  for (const Tensor& p : model.parameters()) {
    std::vector<float> v = p.to_vector<float>();
    const auto* bytes = reinterpret_cast<const unsigned char*>(v.data());
    for (size_t i = 0; i < v.size() * sizeof(float); ++i) h = (h ^ bytes[i]) * 1099511628211ull;
  }
  return h;
}

}  // namespace ringtrain::nn
