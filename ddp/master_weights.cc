// master_weights.cc: see master_weights.h.
#include "ddp/master_weights.h"

#include "autograd/autograd.h"
#include "tensor/ops.h"

namespace ringtrain::ddp {

MasterWeights::MasterWeights(nn::Module& model) : model_params_(model.parameters()) {
  autograd::NoGradGuard no_grad;
  for (const Tensor& p : model_params_) {
    RT_CHECK(is_floating_point(p.dtype()), "MasterWeights: parameter ", p.describe(), " is not floating point");
    Tensor master = p.to(DType::kFloat32).clone();
    autograd::set_requires_grad(master, true);
    masters_.push_back(master);
  }
  note_versions();
}

namespace {

// Whether `master` rounded to `param`'s dtype (what copy_masters_to_model() would write)
// equals `param` everywhere. Host copies, but only for a parameter written behind the
// masters' back, which is rare. NaN or inf never counts as equal: such a weight is taken again.
bool rounds_to(const Tensor& master, const Tensor& param) {
  Tensor rounded = master.to(param.device(), param.dtype());
  return max_abs_diff(rounded, param) == 0.0;
}

}  // namespace

void MasterWeights::note_versions() {
  model_versions_.clear();
  master_versions_.clear();
  for (size_t i = 0; i < masters_.size(); ++i) {
    model_versions_.push_back(model_params_[i].version());
    master_versions_.push_back(masters_[i].version());
  }
}

std::vector<Tensor> MasterWeights::copy_grads_to_masters() {
  {
    // A model parameter written since the masters last matched it, while its master was
    // not: the master is stale (DDP's broadcast from rank 0 after these masters were
    // taken, a model-only checkpoint load); take it again before the optimizer uses it.
    // Unless the write left the values the master rounds to (a checkpoint load rolled
    // back, DDP's broadcast of weights every rank already holds): the master is still
    // right, and taking it again would drop its bits below half precision.
    autograd::NoGradGuard no_grad;
    for (size_t i = 0; i < masters_.size(); ++i)
      if (model_params_[i].version() != model_versions_[i] && masters_[i].version() == master_versions_[i] &&
          !rounds_to(masters_[i], model_params_[i]))
        masters_[i].copy_(model_params_[i]);
    note_versions();
  }
  std::vector<Tensor> grads;
  for (size_t i = 0; i < masters_.size(); ++i) {
    Tensor g = autograd::grad(model_params_[i]);
    Tensor master_grad = g.defined() ? g.to(DType::kFloat32).contiguous() : Tensor();
    if (master_grad.defined() && master_grad.is_same(g)) master_grad = g.clone();  // never alias the model's grad
    autograd::set_grad(masters_[i], master_grad);
    grads.push_back(master_grad);
    // The gradient moves to the master: the model's is cleared, so the next backward starts
    // from none instead of adding to this step's (opt.zero_grad() clears only the masters).
    autograd::set_grad(model_params_[i], Tensor());
  }
  return grads;
}

void MasterWeights::copy_model_to_masters() {
  autograd::NoGradGuard no_grad;
  for (size_t i = 0; i < masters_.size(); ++i) masters_[i].copy_(model_params_[i]);
  note_versions();
}

void MasterWeights::copy_masters_to_model() {
  autograd::NoGradGuard no_grad;
  for (size_t i = 0; i < masters_.size(); ++i) model_params_[i].copy_(masters_[i]);
  note_versions();
}

std::vector<std::pair<std::string, Tensor>> MasterWeights::checkpoint_tensors() const {
  std::vector<std::pair<std::string, Tensor>> named;
  for (size_t i = 0; i < masters_.size(); ++i) named.emplace_back("master_weights." + std::to_string(i), masters_[i]);
  return named;
}

}  // namespace ringtrain::ddp
