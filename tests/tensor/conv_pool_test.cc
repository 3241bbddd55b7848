// conv_pool_test.cc: conv2d forward / backward-input / backward-weight over a grid
// of stride, padding, dilation, groups (incl. depthwise and 1x1) and bias, and
// max/avg pooling with their backward passes, against the naive float64 loops of
// the reference, in f32/f64/f16/bf16 and with non-contiguous inputs.
#include <string>

#include "tests/tensor/reference.h"

namespace ringtrain {
namespace {

using namespace ref;

const DType kFloatTypes[] = {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16};

struct ConvCase {
  Shape input;   // N, C, H, W
  Shape weight;  // O, C/groups, KH, KW
  Conv2dParams p;
  bool bias;
};

Conv2dParams params(int64_t sh, int64_t sw, int64_t ph, int64_t pw, int64_t dh, int64_t dw, int64_t g) {
  Conv2dParams p;
  p.stride_h = sh;
  p.stride_w = sw;
  p.pad_h = ph;
  p.pad_w = pw;
  p.dilation_h = dh;
  p.dilation_w = dw;
  p.groups = g;
  return p;
}

const ConvCase kConvCases[] = {
    {{2, 3, 7, 6}, {4, 3, 3, 3}, params(1, 1, 0, 0, 1, 1, 1), true},
    {{1, 4, 8, 8}, {6, 2, 3, 3}, params(2, 2, 1, 1, 1, 1, 2), true},      // groups, stride, pad
    {{2, 5, 5, 4}, {3, 5, 1, 1}, params(1, 1, 0, 0, 1, 1, 1), false},     // 1x1: no im2col
    {{1, 3, 9, 7}, {3, 1, 2, 3}, params(2, 1, 1, 2, 2, 1, 3), true},      // depthwise, dilation, asym
    {{1, 1, 4, 4}, {2, 1, 4, 4}, params(1, 1, 0, 0, 1, 1, 1), true},      // kernel = input
    {{3, 2, 6, 6}, {4, 2, 3, 2}, params(3, 2, 2, 1, 1, 2, 1), false},
    {{1, 2, 5, 5}, {2, 2, 1, 1}, params(2, 2, 0, 0, 1, 1, 1), true},      // 1x1 with stride
    {{0, 3, 5, 5}, {2, 3, 3, 3}, params(1, 1, 1, 1, 1, 1, 1), true},      // empty batch
};

std::string conv_trace(const ConvCase& c, DType dtype) {
  return std::string(dtype_name(dtype)) + " input " + shape_str(c.input) + " weight " +
         shape_str(c.weight) + " stride " + std::to_string(c.p.stride_h) + "x" +
         std::to_string(c.p.stride_w) + " pad " + std::to_string(c.p.pad_h) + "x" +
         std::to_string(c.p.pad_w) + " dil " + std::to_string(c.p.dilation_h) + "x" +
         std::to_string(c.p.dilation_w) + " groups " + std::to_string(c.p.groups);
}

TEST(Conv2d, ForwardAndBackwardMatchReference) {
  uint64_t seed = 1;
  for (const auto& c : kConvCases) {
    for (DType dtype : kFloatTypes) {
      for (Layout layout : {Layout::kContiguous, Layout::kSliced, Layout::kPermuted}) {
        SCOPED_TRACE(conv_trace(c, dtype) + " " + layout_name(layout));
        Tensor input = random_view(c.input, dtype, ++seed, layout);
        Tensor weight = random_view(c.weight, dtype, ++seed, layout == Layout::kContiguous ? layout : Layout::kTransposed);
        Tensor bias = c.bias ? random_tensor({c.weight[0]}, dtype, ++seed) : Tensor();
        RefTensor ri = to_ref(input), rw = to_ref(weight);
        std::optional<RefTensor> rb;
        if (c.bias) rb = to_ref(bias);
        const int64_t terms = c.weight[1] * c.weight[2] * c.weight[3] + 1;

        Tensor out = conv2d(input, weight, bias, c.p);
        RefTensor rout = ref_conv2d(ri, rw, rb, c.p);
        ASSERT_EQ(out.shape(), rout.shape);
        EXPECT_TRUE(expect_close(out, rout, accumulate_tolerance_for(dtype, terms)));

        Tensor grad_out = random_view(rout.shape, dtype, ++seed, layout);
        RefTensor rg = to_ref(grad_out);
        const int64_t O = c.weight[0], G = c.p.groups;
        Tensor gi = conv2d_backward_input(grad_out, weight, c.input, c.p);
        EXPECT_TRUE(expect_close(gi, ref_conv2d_backward_input(rg, rw, c.input, c.p),
                                 accumulate_tolerance_for(dtype, (O / G) * c.weight[2] * c.weight[3])));
        Tensor gw = conv2d_backward_weight(grad_out, input, c.weight, c.p);
        EXPECT_TRUE(expect_close(gw, ref_conv2d_backward_weight(rg, ri, c.weight, c.p),
                                 accumulate_tolerance_for(dtype, rout.shape[0] * rout.shape[2] * rout.shape[3])));
      }
    }
  }
}

TEST(Conv2d, BadArgumentsThrowNamingShapes) {
  Tensor input = random_tensor({1, 3, 5, 5}, DType::kFloat32, 1);
  Tensor weight = random_tensor({2, 4, 3, 3}, DType::kFloat32, 2);
  EXPECT_TRUE(throws_with([&] { conv2d(input, weight, Tensor(), Conv2dParams{}); },
                          {"conv2d", "[1, 3, 5, 5]", "[2, 4, 3, 3]"}));
  Tensor big = random_tensor({2, 3, 7, 7}, DType::kFloat32, 3);
  EXPECT_TRUE(throws_with([&] { conv2d(input, big, Tensor(), Conv2dParams{}); }, {"conv2d"}));
  Tensor w = random_tensor({2, 3, 3, 3}, DType::kFloat32, 4);
  Tensor bad_bias = random_tensor({3}, DType::kFloat32, 5);
  EXPECT_TRUE(throws_with([&] { conv2d(input, w, bad_bias, Conv2dParams{}); }, {"conv2d", "bias", "[3]"}));
  // A kernel one larger than the input: (2 - 3) / 2 + 1 rounds to 1 in C++, but no window fits.
  Conv2dParams stride2;
  stride2.stride_h = stride2.stride_w = 2;
  Tensor small = random_tensor({1, 3, 2, 2}, DType::kFloat32, 6);
  EXPECT_TRUE(throws_with([&] { conv2d(small, w, Tensor(), stride2); }, {"conv2d", "larger", "[1, 3, 2, 2]"}));
}

struct PoolCase {
  Shape input;
  Pool2dParams p;
};

Pool2dParams pool(int64_t kh, int64_t kw, int64_t sh, int64_t sw, int64_t ph, int64_t pw) {
  Pool2dParams p;
  p.kernel_h = kh;
  p.kernel_w = kw;
  p.stride_h = sh;
  p.stride_w = sw;
  p.pad_h = ph;
  p.pad_w = pw;
  return p;
}

const PoolCase kPoolCases[] = {
    {{2, 3, 8, 8}, pool(2, 2, 2, 2, 0, 0)}, {{1, 2, 7, 9}, pool(3, 3, 2, 2, 1, 1)},
    {{2, 1, 5, 5}, pool(3, 3, 1, 1, 1, 1)}, {{1, 3, 6, 7}, pool(2, 3, 1, 2, 1, 1)},
    {{1, 1, 1, 1}, pool(1, 1, 1, 1, 0, 0)}, {{0, 2, 4, 4}, pool(2, 2, 2, 2, 0, 0)},
};

TEST(Pool2d, MaxAndAvgForwardBackward) {
  uint64_t seed = 200;
  for (const auto& c : kPoolCases) {
    for (DType dtype : kFloatTypes) {
      for (Layout layout : {Layout::kContiguous, Layout::kSliced, Layout::kPermuted}) {
        SCOPED_TRACE(std::string(dtype_name(dtype)) + shape_str(c.input) + " " + layout_name(layout) +
                     " kernel " + std::to_string(c.p.kernel_h) + "x" + std::to_string(c.p.kernel_w) +
                     " stride " + std::to_string(c.p.stride_h) + "x" + std::to_string(c.p.stride_w) +
                     " pad " + std::to_string(c.p.pad_h) + "x" + std::to_string(c.p.pad_w));
        Tensor input = random_view(c.input, dtype, ++seed, layout, -5, 5);
        RefTensor ri = to_ref(input);
        auto [out, indices] = max_pool2d(input, c.p);
        auto [rout, ridx] = ref_max_pool2d(ri, c.p);
        EXPECT_TRUE(expect_equal(out, rout));
        EXPECT_TRUE(expect_equal(indices, ridx));
        Tensor grad_out = random_view(rout.shape, dtype, ++seed, layout);
        RefTensor rg = to_ref(grad_out);
        const int64_t window = c.p.kernel_h * c.p.kernel_w;
        EXPECT_TRUE(expect_close(max_pool2d_backward(grad_out, indices, c.input),
                                 ref_max_pool2d_backward(rg, ridx, c.input),
                                 accumulate_tolerance_for(dtype, window)));
        EXPECT_TRUE(expect_close(avg_pool2d(input, c.p), ref_avg_pool2d(ri, c.p),
                                 accumulate_tolerance_for(dtype, window)));
        EXPECT_TRUE(expect_close(avg_pool2d_backward(grad_out, c.input, c.p),
                                 ref_avg_pool2d_backward(rg, c.input, c.p),
                                 accumulate_tolerance_for(dtype, window)));
      }
    }
  }
}

TEST(Pool2d, AvgCountsPaddingAsZeros) {
  // One 2x2 plane of ones, 3x3 window with padding 1: each corner window holds 4 ones of 9.
  Tensor ones4 = ones({1, 1, 2, 2});
  Tensor y = avg_pool2d(ones4, pool(3, 3, 1, 1, 1, 1));
  for (float v : y.to_vector<float>()) EXPECT_NEAR(v, 4.0 / 9.0, 1e-7);
}

TEST(Pool2d, BadWindowsThrow) {
  Tensor input = random_tensor({1, 1, 3, 3}, DType::kFloat32, 1);
  EXPECT_TRUE(throws_with([&] { max_pool2d(input, pool(4, 4, 1, 1, 0, 0)); }, {"max_pool2d", "[1, 1, 3, 3]"}));
  EXPECT_TRUE(throws_with([&] { avg_pool2d(input.select(0, 0), pool(2, 2, 2, 2, 0, 0)); }, {"avg_pool2d", "[1, 3, 3]"}));
  // One larger than the input with stride 2: no window fits (not 1 output, as truncating
  // (2 - 3) / 2 + 1 would give).
  Tensor small = random_tensor({1, 1, 2, 2}, DType::kFloat32, 2);
  EXPECT_TRUE(throws_with([&] { max_pool2d(small, pool(3, 3, 2, 2, 0, 0)); }, {"max_pool2d", "[1, 1, 2, 2]"}));
  EXPECT_TRUE(throws_with([&] { avg_pool2d(small, pool(3, 3, 2, 2, 0, 0)); }, {"avg_pool2d", "[1, 1, 2, 2]"}));
}

}  // namespace
}  // namespace ringtrain
