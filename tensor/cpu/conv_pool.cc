// conv_pool.cc: CPU conv2d (forward, backward-input, backward-weight) by im2col +
// GEMM, and max/avg 2-D pooling with their backward passes.
//
// conv2d, for each image n and group g:
//   col  [Cg*KH*KW, Ho*Wo]  = im2col(input[n, group g channels])   (zeros where padded)
//   out  [Og, Ho*Wo]        = W_g [Og, Cg*KH*KW] @ col               (Eigen GEMM)  (+ bias)
// backward-input:  col = W_g^T @ grad_out[n, g]; col2im scatters-adds col into grad_input.
// backward-weight: grad_W_g += grad_out[n, g] @ col^T, summed over n.
// A 1x1 kernel with stride 1, no padding and no dilation skips im2col: the input
// plane block *is* the col matrix. Cost: the GEMMs (2 O Cg KH KW Ho Wo flops per
// image) dominate; im2col writes Cg KH KW Ho Wo elements per image and group.
//
// Pooling walks each [H, W] plane directly (windows are small): max pooling keeps
// the first maximum (a NaN wins) and records its index h*W + w in the plane, so
// the backward pass is a scatter-add of grad_out through those indices. Average
// pooling divides by KH*KW, padding counted as zeros (count_include_pad).
//
// Every kernel computes in the compute type (f32 for f16/bf16, f64 for f64):
// 16-bit inputs are converted once into f32 buffers and the result is rounded
// once on store. Inputs of any layout are first made contiguous.
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <vector>

#include <Eigen/Core>

#include "tensor/checks.h"
#include "tensor/cpu/loops.h"
#include "tensor/kernels.h"

namespace ringtrain::kernels::cpu {

namespace {

using detail::Compute;

template <typename C>
using RowMat = Eigen::Matrix<C, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

// A contiguous, compute-typed copy (or alias) of a tensor's values.
template <typename T>
class ComputeBuffer {
 public:
  using C = Compute<T>;
  explicit ComputeBuffer(const Tensor& t) : keep_(t.contiguous()) {
    if constexpr (std::is_same_v<T, C>) {
      data_ = keep_.numel() ? keep_.template data<T>() : nullptr;
    } else {
      owned_.resize(static_cast<size_t>(keep_.numel()));
      if (keep_.numel()) detail::load_run(keep_.template data<T>(), 1, owned_.data(), keep_.numel());
      data_ = owned_.data();
    }
  }
  const C* data() const { return data_; }

 private:
  Tensor keep_;
  std::vector<C> owned_;
  const C* data_ = nullptr;
};

// A compute-typed destination for a contiguous output tensor: writes straight into it when
// the types agree, otherwise into a buffer that finish() rounds into the tensor.
template <typename T>
class ComputeOutput {
 public:
  using C = Compute<T>;
  explicit ComputeOutput(const Tensor& t) : t_(t) {
    RT_CHECK(t.is_contiguous(), "conv/pool (cpu kernel): output ", t.describe(), " must be contiguous");
    if constexpr (std::is_same_v<T, C>) {
      data_ = t.numel() ? t.template data<T>() : nullptr;
    } else {
      owned_.resize(static_cast<size_t>(t.numel()));
      data_ = owned_.data();
    }
  }
  C* data() { return data_; }
  void finish() {
    if constexpr (!std::is_same_v<T, C>) {
      if (t_.numel()) detail::store_run(owned_.data(), t_.template data<T>(), 1, t_.numel());
    }
  }

 private:
  Tensor t_;
  std::vector<C> owned_;
  C* data_ = nullptr;
};

struct ConvGeometry {
  int64_t N, C, H, W;   // input
  int64_t O, Cg, KH, KW;  // weight [O, Cg, KH, KW]
  int64_t G, Og;        // groups, output channels per group
  int64_t Ho, Wo;       // output plane
  int64_t K() const { return Cg * KH * KW; }     // rows of col
  int64_t P() const { return Ho * Wo; }          // columns of col
  bool is_pointwise(const Conv2dParams& p) const {
    return KH == 1 && KW == 1 && p.stride_h == 1 && p.stride_w == 1 && p.pad_h == 0 && p.pad_w == 0;
  }
};

ConvGeometry geometry(const Shape& input, const Shape& weight, const Shape& out,
                      const Conv2dParams& p, const char* op) {
  RT_CHECK(input.size() == 4 && weight.size() == 4 && out.size() == 4 && p.groups > 0,
           op, " (cpu kernel): input ", shape_str(input), ", weight ", shape_str(weight),
           ", output ", shape_str(out), " must all be 4-D");
  ConvGeometry g{input[0], input[1], input[2], input[3], weight[0], weight[1], weight[2], weight[3],
                 p.groups, weight[0] / p.groups, out[2], out[3]};
  RT_CHECK(g.C == g.Cg * g.G && g.O % g.G == 0 && out[0] == g.N && out[1] == g.O, op,
           " (cpu kernel): input ", shape_str(input), ", weight ", shape_str(weight), ", output ",
           shape_str(out), " do not fit groups=", p.groups);
  return g;
}

// col[(c*KH + i)*KW + j][y*Wo + x] = in[c][y*sh - ph + i*dh][x*sw - pw + j*dw] (0 outside).
template <typename C>
void im2col(const C* in, const ConvGeometry& g, const Conv2dParams& p, C* col) {
  for (int64_t c = 0; c < g.Cg; ++c)
    for (int64_t i = 0; i < g.KH; ++i)
      for (int64_t j = 0; j < g.KW; ++j) {
        C* row = col + ((c * g.KH + i) * g.KW + j) * g.P();
        const C* plane = in + c * g.H * g.W;
        for (int64_t y = 0; y < g.Ho; ++y) {
          const int64_t h = y * p.stride_h - p.pad_h + i * p.dilation_h;
          C* dst = row + y * g.Wo;
          if (h < 0 || h >= g.H) {
            std::fill_n(dst, g.Wo, C(0));
            continue;
          }
          const C* src = plane + h * g.W;
          for (int64_t x = 0; x < g.Wo; ++x) {
            const int64_t w = x * p.stride_w - p.pad_w + j * p.dilation_w;
            dst[x] = (w >= 0 && w < g.W) ? src[w] : C(0);
          }
        }
      }
}

// The adjoint of im2col: in[c][h][w] += col[...] for every (c, i, j, y, x) that read it.
template <typename C>
void col2im_add(const C* col, const ConvGeometry& g, const Conv2dParams& p, C* in) {
  for (int64_t c = 0; c < g.Cg; ++c)
    for (int64_t i = 0; i < g.KH; ++i)
      for (int64_t j = 0; j < g.KW; ++j) {
        const C* row = col + ((c * g.KH + i) * g.KW + j) * g.P();
        C* plane = in + c * g.H * g.W;
        for (int64_t y = 0; y < g.Ho; ++y) {
          const int64_t h = y * p.stride_h - p.pad_h + i * p.dilation_h;
          if (h < 0 || h >= g.H) continue;
          const C* src = row + y * g.Wo;
          C* dst = plane + h * g.W;
          for (int64_t x = 0; x < g.Wo; ++x) {
            const int64_t w = x * p.stride_w - p.pad_w + j * p.dilation_w;
            if (w >= 0 && w < g.W) dst[w] += src[x];
          }
        }
      }
}

template <typename T>
void conv2d_typed(const Tensor& input, const Tensor& weight, const Tensor& bias,
                  const Conv2dParams& p, const Tensor& out) {
  using C = Compute<T>;
  const ConvGeometry g = geometry(input.shape(), weight.shape(), out.shape(), p, "conv2d");
  ComputeBuffer<T> in(input), w(weight);
  std::optional<ComputeBuffer<T>> b;
  if (bias.defined()) b.emplace(bias);
  ComputeOutput<T> y(out);
  const bool pointwise = g.is_pointwise(p);
  std::vector<C> col(pointwise ? 0 : static_cast<size_t>(g.K() * g.P()));
  for (int64_t n = 0; n < g.N; ++n)
    for (int64_t grp = 0; grp < g.G; ++grp) {
      const C* in_ng = in.data() + (n * g.C + grp * g.Cg) * g.H * g.W;
      const C* colp = in_ng;
      if (!pointwise) {
        im2col(in_ng, g, p, col.data());
        colp = col.data();
      }
      Eigen::Map<const RowMat<C>> Wg(w.data() + grp * g.Og * g.K(), g.Og, g.K());
      Eigen::Map<const RowMat<C>> Col(colp, g.K(), g.P());
      Eigen::Map<RowMat<C>> Y(y.data() + (n * g.O + grp * g.Og) * g.P(), g.Og, g.P());
      if (g.K() == 0) {
        Y.setZero();
      } else {
        Y.noalias() = Wg * Col;
      }
      if (b) {
        for (int64_t o = 0; o < g.Og; ++o) Y.row(o).array() += b->data()[grp * g.Og + o];
      }
    }
  y.finish();
}

template <typename T>
void conv2d_backward_input_typed(const Tensor& grad_out, const Tensor& weight,
                                 const Conv2dParams& p, const Tensor& grad_input) {
  using C = Compute<T>;
  const ConvGeometry g =
      geometry(grad_input.shape(), weight.shape(), grad_out.shape(), p, "conv2d_backward_input");
  ComputeBuffer<T> go(grad_out), w(weight);
  ComputeOutput<T> gi(grad_input);
  std::fill_n(gi.data(), grad_input.numel(), C(0));
  const bool pointwise = g.is_pointwise(p);
  std::vector<C> col(static_cast<size_t>(g.K() * g.P()));
  for (int64_t n = 0; n < g.N; ++n)
    for (int64_t grp = 0; grp < g.G; ++grp) {
      Eigen::Map<const RowMat<C>> Wg(w.data() + grp * g.Og * g.K(), g.Og, g.K());
      Eigen::Map<const RowMat<C>> GO(go.data() + (n * g.O + grp * g.Og) * g.P(), g.Og, g.P());
      C* gi_ng = gi.data() + (n * g.C + grp * g.Cg) * g.H * g.W;
      if (pointwise) {  // col2im of a 1x1 kernel is the identity: write straight into grad_input
        Eigen::Map<RowMat<C>> GI(gi_ng, g.K(), g.P());
        GI.noalias() = Wg.transpose() * GO;
      } else {
        Eigen::Map<RowMat<C>> Col(col.data(), g.K(), g.P());
        Col.noalias() = Wg.transpose() * GO;
        col2im_add(col.data(), g, p, gi_ng);
      }
    }
  gi.finish();
}

template <typename T>
void conv2d_backward_weight_typed(const Tensor& grad_out, const Tensor& input,
                                  const Conv2dParams& p, const Tensor& grad_weight) {
  using C = Compute<T>;
  const ConvGeometry g =
      geometry(input.shape(), grad_weight.shape(), grad_out.shape(), p, "conv2d_backward_weight");
  ComputeBuffer<T> go(grad_out), in(input);
  ComputeOutput<T> gw(grad_weight);
  std::fill_n(gw.data(), grad_weight.numel(), C(0));
  const bool pointwise = g.is_pointwise(p);
  std::vector<C> col(pointwise ? 0 : static_cast<size_t>(g.K() * g.P()));
  for (int64_t n = 0; n < g.N; ++n)
    for (int64_t grp = 0; grp < g.G; ++grp) {
      const C* in_ng = in.data() + (n * g.C + grp * g.Cg) * g.H * g.W;
      const C* colp = in_ng;
      if (!pointwise) {
        im2col(in_ng, g, p, col.data());
        colp = col.data();
      }
      Eigen::Map<const RowMat<C>> GO(go.data() + (n * g.O + grp * g.Og) * g.P(), g.Og, g.P());
      Eigen::Map<const RowMat<C>> Col(colp, g.K(), g.P());
      Eigen::Map<RowMat<C>> GW(gw.data() + grp * g.Og * g.K(), g.Og, g.K());
      if (g.P() > 0) GW.noalias() += GO * Col.transpose();
    }
  gw.finish();
}

template <typename Fn>
void dispatch_float(const Tensor& t, const char* op, Fn&& fn) {
  RT_CHECK(is_floating_point(t.dtype()), op, ": floating-point dtypes only, got ", t.describe());
  dispatch_dtype(t.dtype(), [&](auto tag) {
    using T = decltype(tag);
    if constexpr (detail::kIsFloat<T>) fn(tag);
  });
}

void check_pool(const Tensor& input, const Tensor& out, const Pool2dParams& p, const char* op) {
  RT_CHECK(input.dim() == 4 && out.dim() == 4 && input.size(0) == out.size(0) &&
               input.size(1) == out.size(1) && p.kernel_h > 0 && p.kernel_w > 0 &&
               p.stride_h > 0 && p.stride_w > 0,
           op, " (cpu kernel): input ", input.describe(), " and output ", out.describe(),
           " do not fit kernel ", p.kernel_h, "x", p.kernel_w, " stride ", p.stride_h, "x",
           p.stride_w);
}

}  // namespace

void conv2d(const Tensor& input, const Tensor& weight, const Tensor& bias, const Conv2dParams& p,
            const Tensor& out) {
  if (out.numel() == 0) return;
  dispatch_float(input, "conv2d", [&](auto tag) { conv2d_typed<decltype(tag)>(input, weight, bias, p, out); });
}

void conv2d_backward_input(const Tensor& grad_out, const Tensor& weight, const Conv2dParams& p,
                           const Tensor& grad_input) {
  if (grad_input.numel() == 0) return;
  dispatch_float(grad_out, "conv2d_backward_input", [&](auto tag) {
    conv2d_backward_input_typed<decltype(tag)>(grad_out, weight, p, grad_input);
  });
}

void conv2d_backward_weight(const Tensor& grad_out, const Tensor& input, const Conv2dParams& p,
                            const Tensor& grad_weight) {
  if (grad_weight.numel() == 0) return;
  dispatch_float(grad_out, "conv2d_backward_weight", [&](auto tag) {
    conv2d_backward_weight_typed<decltype(tag)>(grad_out, input, p, grad_weight);
  });
}

void max_pool2d(const Tensor& input_arg, const Pool2dParams& p, const Tensor& out,
                const Tensor& indices) {
  check_pool(input_arg, out, p, "max_pool2d");
  RT_CHECK(indices.shape() == out.shape() && indices.dtype() == DType::kInt64 &&
               indices.is_contiguous() && out.is_contiguous(),
           "max_pool2d (cpu kernel): indices ", indices.describe(), " must be int64 shaped like ",
           out.describe());
  if (out.numel() == 0) return;
  const Tensor input = input_arg.contiguous();
  const int64_t planes = input.size(0) * input.size(1), H = input.size(2), W = input.size(3);
  const int64_t Ho = out.size(2), Wo = out.size(3);
  dispatch_dtype(input.dtype(), [&](auto tag) {
    using T = decltype(tag);
    using C = Compute<T>;
    const T* x = input.data<T>();
    T* y = out.data<T>();
    int64_t* idx = indices.data<int64_t>();
    for (int64_t pl = 0; pl < planes; ++pl) {
      const T* plane = x + pl * H * W;
      for (int64_t oy = 0; oy < Ho; ++oy)
        for (int64_t ox = 0; ox < Wo; ++ox) {
          C best = C(0);
          int64_t bi = -1;
          const int64_t h0 = oy * p.stride_h - p.pad_h, w0 = ox * p.stride_w - p.pad_w;
          for (int64_t h = std::max<int64_t>(h0, 0); h < std::min(h0 + p.kernel_h, H); ++h)
            for (int64_t w = std::max<int64_t>(w0, 0); w < std::min(w0 + p.kernel_w, W); ++w) {
              const C v = detail::load(plane[h * W + w]);
              if (bi < 0 || (!(best != best) && (v > best || v != v))) {
                best = v;
                bi = h * W + w;
              }
            }
          if (bi < 0) {  // a window entirely in the padding (only with pad > kernel / 2)
            if constexpr (std::is_floating_point_v<C>) best = -std::numeric_limits<C>::infinity();
            else best = std::numeric_limits<C>::lowest();
          }
          const int64_t o = (pl * Ho + oy) * Wo + ox;
          y[o] = detail::store<T>(best);
          idx[o] = bi;
        }
    }
  });
}

void max_pool2d_backward(const Tensor& grad_out_arg, const Tensor& indices_arg,
                         const Tensor& grad_input) {
  RT_CHECK(grad_out_arg.dim() == 4 && grad_input.dim() == 4 &&
               indices_arg.shape() == grad_out_arg.shape() && grad_input.is_contiguous() &&
               grad_out_arg.size(0) == grad_input.size(0) && grad_out_arg.size(1) == grad_input.size(1),
           "max_pool2d_backward (cpu kernel): grad_out ", grad_out_arg.describe(), ", indices ",
           indices_arg.describe(), ", grad_input ", grad_input.describe(), " do not fit");
  if (grad_input.numel() == 0) return;
  const Tensor grad_out = grad_out_arg.contiguous();
  const Tensor indices = indices_arg.contiguous();
  const int64_t planes = grad_input.size(0) * grad_input.size(1);
  const int64_t HW = grad_input.size(2) * grad_input.size(3);
  const int64_t P = grad_out.size(2) * grad_out.size(3);
  dispatch_dtype(grad_input.dtype(), [&](auto tag) {
    using T = decltype(tag);
    using C = Compute<T>;
    const T* go = grad_out.data<T>();
    const int64_t* idx = indices.data<int64_t>();
    T* gi = grad_input.data<T>();
    std::vector<C> acc(static_cast<size_t>(HW));
    for (int64_t pl = 0; pl < planes; ++pl) {
      std::fill(acc.begin(), acc.end(), C(0));
      for (int64_t o = 0; o < P; ++o) {
        const int64_t k = idx[pl * P + o];
        if (k < 0) continue;
        RT_CHECK(k < HW, "max_pool2d_backward: index ", k, " out of range for a plane of ", HW,
                 " elements");
        acc[static_cast<size_t>(k)] += detail::load(go[pl * P + o]);
      }
      detail::store_run(acc.data(), gi + pl * HW, 1, HW);
    }
  });
}

void avg_pool2d(const Tensor& input_arg, const Pool2dParams& p, const Tensor& out) {
  check_pool(input_arg, out, p, "avg_pool2d");
  if (out.numel() == 0) return;
  const Tensor input = input_arg.contiguous();
  const int64_t planes = input.size(0) * input.size(1), H = input.size(2), W = input.size(3);
  const int64_t Ho = out.size(2), Wo = out.size(3);
  const double inv_count = 1.0 / static_cast<double>(p.kernel_h * p.kernel_w);
  dispatch_dtype(input.dtype(), [&](auto tag) {
    using T = decltype(tag);
    using A = std::conditional_t<std::is_same_v<T, double>, double, float>;
    const T* x = input.data<T>();
    T* y = out.data<T>();
    for (int64_t pl = 0; pl < planes; ++pl) {
      const T* plane = x + pl * H * W;
      for (int64_t oy = 0; oy < Ho; ++oy)
        for (int64_t ox = 0; ox < Wo; ++ox) {
          A s = 0;
          const int64_t h0 = oy * p.stride_h - p.pad_h, w0 = ox * p.stride_w - p.pad_w;
          for (int64_t h = std::max<int64_t>(h0, 0); h < std::min(h0 + p.kernel_h, H); ++h)
            for (int64_t w = std::max<int64_t>(w0, 0); w < std::min(w0 + p.kernel_w, W); ++w)
              s += static_cast<A>(detail::load(plane[h * W + w]));
          y[(pl * Ho + oy) * Wo + ox] = detail::store<T>(s * static_cast<A>(inv_count));
        }
    }
  });
}

void avg_pool2d_backward(const Tensor& grad_out_arg, const Pool2dParams& p, const Tensor& grad_input) {
  check_pool(grad_input, grad_out_arg, p, "avg_pool2d_backward");
  RT_CHECK(grad_input.is_contiguous(), "avg_pool2d_backward (cpu kernel): grad_input ",
           grad_input.describe(), " must be contiguous");
  if (grad_input.numel() == 0) return;
  const Tensor grad_out = grad_out_arg.contiguous();
  const int64_t planes = grad_input.size(0) * grad_input.size(1);
  const int64_t H = grad_input.size(2), W = grad_input.size(3);
  const int64_t Ho = grad_out.size(2), Wo = grad_out.size(3);
  const double inv_count = 1.0 / static_cast<double>(p.kernel_h * p.kernel_w);
  dispatch_dtype(grad_input.dtype(), [&](auto tag) {
    using T = decltype(tag);
    using A = std::conditional_t<std::is_same_v<T, double>, double, float>;
    const T* go = grad_out.data<T>();
    T* gi = grad_input.data<T>();
    std::vector<A> acc(static_cast<size_t>(H * W));
    for (int64_t pl = 0; pl < planes; ++pl) {
      std::fill(acc.begin(), acc.end(), A(0));
      for (int64_t oy = 0; oy < Ho; ++oy)
        for (int64_t ox = 0; ox < Wo; ++ox) {
          const A g = static_cast<A>(detail::load(go[(pl * Ho + oy) * Wo + ox])) * static_cast<A>(inv_count);
          const int64_t h0 = oy * p.stride_h - p.pad_h, w0 = ox * p.stride_w - p.pad_w;
          for (int64_t h = std::max<int64_t>(h0, 0); h < std::min(h0 + p.kernel_h, H); ++h)
            for (int64_t w = std::max<int64_t>(w0, 0); w < std::min(w0 + p.kernel_w, W); ++w)
              acc[static_cast<size_t>(h * W + w)] += g;
        }
      for (int64_t i = 0; i < H * W; ++i) gi[pl * H * W + i] = detail::store<T>(acc[static_cast<size_t>(i)]);
    }
  });
}

}  // namespace ringtrain::kernels::cpu
