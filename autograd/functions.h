// functions.h: the differentiable tensor ops (namespace ringtrain::ag).
//
// defines: one function per differentiable op of tensor/ops.h (and the views of
//          tensor/tensor.h), same arguments, each recording its backward rule in
//          the graph when an input requires grad; plus the composite layers'
//          functional forms (linear, conv2d, pooling, batch_norm, layer_norm,
//          dropout, embedding) and the losses (cross_entropy, mse_loss).
//
// Where it sits: layers (nn/) and user models call ag::*; each function computes
// the forward with tensor/ops.h and, through autograd/graph.h's record(), stores a
// lambda with the derivative rule right next to it (functions.cc reads like a
// table of derivatives). With grad mode off, or when no input requires grad, an
// ag:: op costs the same as the plain op.
//
// Naming: no operator overloads here (ringtrain::operator+ is the plain,
// non-recording op; defining ag ones would make `a + b` ambiguous).
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "autograd/autograd.h"
#include "tensor/ops.h"
#include "tensor/tensor.h"

namespace ringtrain::ag {

// ---- elementwise (binary ops broadcast; gradients are summed back to each input's shape)
Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);
Tensor pow(const Tensor& a, const Tensor& b);  // a > 0 where b's gradient is needed
// At a tie (a == b) each input gets half the gradient, as in PyTorch.
Tensor maximum(const Tensor& a, const Tensor& b);
Tensor minimum(const Tensor& a, const Tensor& b);
Tensor add(const Tensor& a, double b);
Tensor sub(const Tensor& a, double b);
Tensor mul(const Tensor& a, double b);
Tensor div(const Tensor& a, double b);
Tensor pow(const Tensor& a, double exponent);
Tensor neg(const Tensor& a);
Tensor exp(const Tensor& a);
Tensor log(const Tensor& a);
Tensor sqrt(const Tensor& a);
Tensor abs(const Tensor& a);
Tensor relu(const Tensor& a);
Tensor gelu(const Tensor& a);
Tensor tanh(const Tensor& a);
Tensor sigmoid(const Tensor& a);
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b);
Tensor masked_fill(const Tensor& a, const Tensor& mask, double value);

// ---- reductions
Tensor sum(const Tensor& a, const std::vector<int64_t>& dims = {}, bool keepdim = false);
Tensor mean(const Tensor& a, const std::vector<int64_t>& dims = {}, bool keepdim = false);
// Ties share the gradient equally (PyTorch's amax rule).
Tensor amax(const Tensor& a, const std::vector<int64_t>& dims = {}, bool keepdim = false);
Tensor amin(const Tensor& a, const std::vector<int64_t>& dims = {}, bool keepdim = false);
// (values, indices); the gradient goes to the returned index.
std::pair<Tensor, Tensor> max(const Tensor& a, int64_t dim, bool keepdim = false);

// ---- linear algebra
Tensor matmul(const Tensor& a, const Tensor& b);
// y = x W^T + b; backward is two GEMMs on transposed views plus a column sum.
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias);

// ---- views and joins (outputs share storage where the tensor op does)
Tensor reshape(const Tensor& a, const Shape& shape);
Tensor view(const Tensor& a, const Shape& shape);
Tensor flatten(const Tensor& a, int64_t start_dim = 0, int64_t end_dim = -1);
Tensor transpose(const Tensor& a, int64_t dim0, int64_t dim1);
Tensor permute(const Tensor& a, const std::vector<int64_t>& dims);
Tensor narrow(const Tensor& a, int64_t dim, int64_t start, int64_t length);
Tensor slice(const Tensor& a, int64_t dim, int64_t start, int64_t end, int64_t step = 1);
Tensor select(const Tensor& a, int64_t dim, int64_t index);
Tensor unsqueeze(const Tensor& a, int64_t dim);
Tensor squeeze(const Tensor& a, int64_t dim);
Tensor expand(const Tensor& a, const Shape& shape);
Tensor contiguous(const Tensor& a);
Tensor clone(const Tensor& a);
// A cast to a floating dtype is differentiable (the gradient is cast back); a cast
// to an integer or bool dtype is not: its result does not require grad (as in PyTorch).
Tensor to(const Tensor& a, DType dtype);
Tensor cat(const std::vector<Tensor>& tensors, int64_t dim = 0);
Tensor stack(const std::vector<Tensor>& tensors, int64_t dim = 0);
std::vector<Tensor> chunk(const Tensor& a, int64_t chunks, int64_t dim = 0);
std::vector<Tensor> split(const Tensor& a, int64_t split_size, int64_t dim = 0);

// ---- convolution, pooling
Tensor conv2d(const Tensor& input, const Tensor& weight, const Tensor& bias, const Conv2dParams& p);
Tensor max_pool2d(const Tensor& input, const Pool2dParams& p);
Tensor avg_pool2d(const Tensor& input, const Pool2dParams& p);

// ---- softmax, normalisation, regularisation
Tensor softmax(const Tensor& a, int64_t dim);
Tensor log_softmax(const Tensor& a, int64_t dim);
// x [N, C] or [N, C, *]; statistics over every dim but 1. In training mode the
// batch statistics normalise and running_mean/var (if defined) are updated in
// place: r = (1 - momentum) r + momentum * stat, with the unbiased variance. In
// eval mode the running statistics normalise. weight/bias may be undefined; when
// given they have x's dtype. Float16/bfloat16 input: statistics, output and
// gradients are computed in float32 and rounded back (running statistics may be
// float32 or x's dtype). Without weight and bias, modifying the output in place
// makes the backward throw (it is the normalised input the backward reads).
Tensor batch_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& running_mean,
                  const Tensor& running_var, bool training, double momentum, double eps);
// Normalises over the last normalized_shape.size() dims; weight/bias of that shape and x's
// dtype, or undefined. Computes in float32 for float16/bfloat16 input, as batch_norm.
Tensor layer_norm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight,
                  const Tensor& bias, double eps);
// x * mask / (1 - p) with mask ~ Bernoulli(1 - p) from `gen`; identity when !training or p == 0.
Tensor dropout(const Tensor& x, double p, bool training, Generator& gen);
// Rows of `weight` [num, dim] picked by int64 `indices` (any shape) -> [*indices.shape, dim].
Tensor embedding(const Tensor& weight, const Tensor& indices);
Tensor index_select(const Tensor& a, int64_t dim, const Tensor& index);

// ---- losses (mean reduction)
// logits [N, C], int64 targets [N]; mean over the targets != ignore_index;
// label_smoothing mixes the one-hot target with the uniform distribution.
Tensor cross_entropy(const Tensor& logits, const Tensor& targets, int64_t ignore_index = -100,
                     double label_smoothing = 0.0);
Tensor mse_loss(const Tensor& input, const Tensor& target);

}  // namespace ringtrain::ag
