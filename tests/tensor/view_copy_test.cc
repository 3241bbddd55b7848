// view_copy_test.cc: views (reshape/view/flatten/narrow/slice/select/transpose/
// permute/unsqueeze/squeeze/expand/chunk/split/cat/stack) checked element by
// element against the reference through the naive strided accessor; copies and
// dtype conversions between every pair of dtypes, into non-contiguous and from
// broadcast views; fill, factories, memcpy_bytes, printing.
#include <cmath>
#include <cstdint>
#include <string>

#include "tests/tensor/reference.h"

namespace ringtrain {
namespace {

using namespace ref;

// ---------------------------------------------------------------- views

TEST(Views, ShareStorageAndMatchReference) {
  Tensor a = random_tensor({4, 6, 5}, DType::kFloat32, 1);
  RefTensor ra = to_ref(a);
  EXPECT_TRUE(expect_equal(a.transpose(0, 2), ref_transpose(ra, 0, 2)));
  EXPECT_TRUE(expect_equal(a.permute({2, 0, 1}), ref_permute(ra, {2, 0, 1})));
  EXPECT_TRUE(expect_equal(a.narrow(1, 2, 3), ref_slice(ra, 1, 2, 5, 1)));
  EXPECT_TRUE(expect_equal(a.slice(1, 1, 6, 2), ref_slice(ra, 1, 1, 6, 2)));
  EXPECT_TRUE(expect_equal(a.slice(2, -3, 5), ref_slice(ra, 2, 2, 5, 1)));
  EXPECT_TRUE(a.transpose(0, 2).storage() == a.storage());
  EXPECT_FALSE(a.transpose(0, 2).is_contiguous());
  EXPECT_TRUE(a.narrow(0, 1, 2).is_contiguous());

  RefTensor sel = ref_slice(ra, 1, 3, 4, 1);
  sel.shape = {4, 5};
  EXPECT_TRUE(expect_equal(a.select(1, 3), sel));

  RefTensor reshaped = ra;
  reshaped.shape = {24, 5};
  EXPECT_TRUE(expect_equal(a.reshape({24, 5}), reshaped));
  EXPECT_TRUE(expect_equal(a.view({-1, 5}), reshaped));
  reshaped.shape = {120};
  EXPECT_TRUE(expect_equal(a.flatten(), reshaped));
  reshaped.shape = {4, 30};
  EXPECT_TRUE(expect_equal(a.flatten(1), reshaped));
  // reshape of a non-contiguous view copies; the values follow the view's row-major order.
  RefTensor rt = ref_transpose(ra, 0, 1);
  rt.shape = {6, 20};
  EXPECT_TRUE(expect_equal(a.transpose(0, 1).reshape({6, 20}), rt));

  Tensor u = a.unsqueeze(1);
  EXPECT_EQ(u.shape(), (Shape{4, 1, 6, 5}));
  EXPECT_EQ(u.squeeze(1).shape(), a.shape());
  EXPECT_EQ(a.unsqueeze(-1).shape(), (Shape{4, 6, 5, 1}));

  // Writes through a view reach the base.
  Tensor v = a.transpose(0, 1).select(0, 2);  // a[:, 2, :]
  fill_(v, 42.0);
  EXPECT_EQ(get_element(a, {3, 2, 4}), 42.0);
  EXPECT_EQ(get_element(a, {3, 1, 4}), ra.at({3, 1, 4}));
}

TEST(Views, ExpandHasZeroStrides) {
  Tensor a = random_tensor({3, 1}, DType::kFloat64, 2);
  Tensor e = a.expand({2, 3, 4});
  EXPECT_EQ(e.shape(), (Shape{2, 3, 4}));
  EXPECT_EQ(e.stride(0), 0);
  EXPECT_EQ(e.stride(2), 0);
  EXPECT_TRUE(expect_equal(e, ref_expand(to_ref(a), {2, 3, 4})));
  EXPECT_TRUE(expect_equal(e.contiguous(), ref_expand(to_ref(a), {2, 3, 4})));
  EXPECT_TRUE(throws_with([&] { a.expand({3, 5, 2}); }, {"expand", "[3, 1]", "[3, 5, 2]"}));
}

TEST(Views, ChunkSplitCatStack) {
  for (DType dtype : kAllDTypes) {
    SCOPED_TRACE(dtype_name(dtype));
    Tensor a = random_view({7, 4}, dtype, 3, Layout::kTransposed, -9, 9);
    RefTensor ra = to_ref(a);
    std::vector<Tensor> chunks = a.chunk(3, 0);
    ASSERT_EQ(chunks.size(), 3u);
    EXPECT_EQ(chunks[0].size(0), 3);
    EXPECT_EQ(chunks[2].size(0), 1);
    EXPECT_TRUE(expect_equal(chunks[1], ref_slice(ra, 0, 3, 6, 1)));
    std::vector<Tensor> parts = a.split(3, 1);
    ASSERT_EQ(parts.size(), 2u);
    EXPECT_TRUE(expect_equal(parts[1], ref_slice(ra, 1, 3, 4, 1)));
    std::vector<Tensor> sized = a.split_with_sizes({2, 0, 5}, 0);
    ASSERT_EQ(sized.size(), 3u);
    EXPECT_EQ(sized[1].numel(), 0);
    EXPECT_TRUE(expect_equal(sized[2], ref_slice(ra, 0, 2, 7, 1)));
    // cat of the chunks (views, one empty) gives the tensor back; along dim 1 too.
    EXPECT_TRUE(expect_equal(cat(chunks, 0), ra));
    EXPECT_TRUE(expect_equal(cat(sized, 0), ra));
    EXPECT_TRUE(expect_equal(cat(parts, -1), ra));
    std::vector<RefTensor> rchunks = {to_ref(chunks[0]), to_ref(chunks[0]), to_ref(chunks[0])};
    EXPECT_TRUE(expect_equal(stack({chunks[0], chunks[0], chunks[0]}, 1), ref_stack(rchunks, 1)));
    EXPECT_TRUE(expect_equal(stack({chunks[0], chunks[0], chunks[0]}, -1), ref_stack(rchunks, 2)));
  }
  Tensor a = zeros({2, 3});
  Tensor b = zeros({2, 4});
  EXPECT_TRUE(throws_with([&] { cat({a, b}, 0); }, {"cat", "[2, 4]", "[2, 3]"}));
  EXPECT_TRUE(throws_with([&] { cat({a, zeros({2, 3}, DType::kInt32)}, 0); }, {"cat", "int32"}));
  EXPECT_TRUE(throws_with([&] { stack({a, b}); }, {"stack", "[2, 4]"}));
}

// ---------------------------------------------------------------- copies, conversions

TEST(Copy, EveryDtypePairConvertsLikeAStaticCast) {
  uint64_t seed = 10;
  for (DType from : kAllDTypes) {
    for (DType to : kAllDTypes) {
      for (Layout layout : {Layout::kContiguous, Layout::kTransposed}) {
        SCOPED_TRACE(std::string(dtype_name(from)) + " -> " + dtype_name(to) + " " + layout_name(layout));
        Tensor a = random_view({13, 21}, from, ++seed, layout, -100, 100);
        RefTensor expected = to_ref(a);
        for (auto& v : expected.data) v = round_to_dtype(v, to);
        Tensor b = a.to(to);
        EXPECT_EQ(b.dtype(), to);
        if (from != to) {
          EXPECT_TRUE(b.is_contiguous());
        } else {
          EXPECT_TRUE(b.is_same(a));  // to(same dtype) returns the tensor itself
        }
        EXPECT_TRUE(expect_equal(b, expected));
      }
    }
  }
}

TEST(Copy, IntoNonContiguousDestinationLeavesTheRestAlone) {
  for (DType dtype : {DType::kFloat32, DType::kFloat16, DType::kInt64}) {
    SCOPED_TRACE(dtype_name(dtype));
    Tensor base = random_tensor({6, 10}, dtype, 20, -9, 9);
    RefTensor before = to_ref(base);
    Tensor dst = base.slice(1, 0, 10, 3).t();  // [4, 6] every third column, transposed
    Tensor src = random_view({4, 6}, DType::kFloat64, 21, Layout::kPermuted, -9, 9);
    dst.copy_(src);
    RefTensor expected = to_ref(src);
    for (auto& v : expected.data) v = round_to_dtype(v, dtype);
    EXPECT_TRUE(expect_equal(dst, expected));
    RefTensor after = to_ref(base);
    for (int64_t i = 0; i < 6; ++i)
      for (int64_t j = 0; j < 10; ++j)
        if (j % 3 != 0) {
          EXPECT_EQ(after.at({i, j}), before.at({i, j})) << i << "," << j;
        }
    // A broadcast source (stride 0) fills every row.
    Tensor row = random_tensor({6}, dtype, 22, -9, 9);
    dst.copy_(row);
    EXPECT_TRUE(expect_equal(dst, ref_expand(to_ref(row), {4, 6})));
  }
}

TEST(Copy, ContiguousCloneAndLargeRuns) {
  Tensor a = random_view({3, 1000}, DType::kFloat16, 30, Layout::kTransposed);
  Tensor c = a.contiguous();
  EXPECT_TRUE(c.is_contiguous());
  EXPECT_TRUE(expect_equal(c, to_ref(a)));
  Tensor d = c.contiguous();
  EXPECT_TRUE(d.is_same(c));
  Tensor e = c.clone();
  EXPECT_FALSE(e.storage() == c.storage());
  EXPECT_TRUE(expect_equal(e, to_ref(c)));
  // f16 <-> f32 over long contiguous runs (the 8-wide F16C path and its tail).
  Tensor f = random_tensor({10007}, DType::kFloat32, 31, -60000, 60000);
  RefTensor expected = to_ref(f);
  for (auto& v : expected.data) v = round_to_dtype(v, DType::kFloat16);
  EXPECT_TRUE(expect_equal(f.to(DType::kFloat16), expected));
  EXPECT_TRUE(expect_equal(f.to(DType::kFloat16).to(DType::kFloat32), expected));
  for (auto& v : expected.data) v = round_to_dtype(v, DType::kBFloat16);
  EXPECT_TRUE(expect_equal(f.to(DType::kBFloat16), to_ref(f.to(DType::kBFloat16))));
}

TEST(Copy, HalfRoundingIsToNearestEven) {
  // 1 + 2^-11 lies halfway between two f16 values: it rounds to 1 (even).
  Tensor a = Tensor::from_vector<float>({1.0f + 1.0f / 2048, 1.0f + 3.0f / 2048, 70000.0f}, {3});
  std::vector<float> h = a.to(DType::kFloat16).to_vector<float>();
  EXPECT_EQ(h[0], 1.0f);
  EXPECT_EQ(h[1], 1.0f + 4.0f / 2048);
  EXPECT_TRUE(std::isinf(h[2]));
  // bf16: 1 + 2^-8 halfway -> 1; 1 + 3*2^-8 -> 1 + 2^-6.
  Tensor b = Tensor::from_vector<float>({1.0f + 1.0f / 256, 1.0f + 3.0f / 256}, {2});
  std::vector<float> bf = b.to(DType::kBFloat16).to_vector<float>();
  EXPECT_EQ(bf[0], 1.0f);
  EXPECT_EQ(bf[1], 1.0f + 4.0f / 256);
}

TEST(Fill, FactoriesAndViews) {
  for (DType dtype : kAllDTypes) {
    SCOPED_TRACE(dtype_name(dtype));
    EXPECT_TRUE(expect_equal(zeros({2, 3}, dtype), RefTensor({2, 3}, 0.0)));
    EXPECT_TRUE(expect_equal(ones({4}, dtype), RefTensor({4}, 1.0)));
    EXPECT_TRUE(expect_equal(full({3, 1, 2}, 5.0, dtype), RefTensor({3, 1, 2}, 5.0)));
    EXPECT_TRUE(expect_equal(full({}, -2.0, dtype), RefTensor({}, -2.0)));
    EXPECT_EQ(zeros({0, 5}, dtype).numel(), 0);
    Tensor base = zeros({4, 6}, dtype);
    Tensor v = base.slice(1, 1, 6, 2);
    fill_(v, 3.0);
    RefTensor expected({4, 6}, 0.0);
    for (int64_t i = 0; i < 4; ++i)
      for (int64_t j = 1; j < 6; j += 2) expected.at({i, j}) = 3.0;
    EXPECT_TRUE(expect_equal(base, expected));
  }
  EXPECT_TRUE(expect_equal(arange(0, 5), RefTensor({5}, std::vector<double>{0, 1, 2, 3, 4})));
  EXPECT_TRUE(expect_equal(arange(1, 2, 0.25, DType::kFloat32),
                           RefTensor({4}, std::vector<double>{1, 1.25, 1.5, 1.75})));
  EXPECT_TRUE(expect_equal(full({3}, 2.7, DType::kInt32), RefTensor({3}, 2.0)));
}

TEST(Copy, MemcpyBytesHostOnly) {
  std::vector<uint8_t> src(1000), dst(1000, 0);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(i * 7);
  kernels::cpu::memcpy_bytes(dst.data(), Device::cpu(), src.data(), Device::cpu(), src.size());
  EXPECT_EQ(dst, src);
  EXPECT_TRUE(throws_with([&] {
    kernels::cpu::memcpy_bytes(dst.data(), Device::cuda(0), src.data(), Device::cpu(), 8);
  }, {"memcpy_bytes", "cuda:0"}));
}

TEST(Printing, NamesDtypeShapeAndValues) {
  Tensor a = Tensor::from_vector<float>({1.5f, -2.0f, 3.25f, 4.0f}, {2, 2});
  std::string s = a.str();
  EXPECT_NE(s.find("float32"), std::string::npos) << s;
  EXPECT_NE(s.find("3.25"), std::string::npos) << s;
  EXPECT_EQ(a.describe(), "float32[2, 2] on cpu");
  EXPECT_EQ(scalar_tensor(7.0, DType::kInt64).item(), 7.0);
  EXPECT_EQ(a.t().to_vector<double>(), (std::vector<double>{1.5, 3.25, -2.0, 4.0}));
}

// Integer tensors print their exact values. They used to go through double: 2^53 + 1 printed
// as 2^53, and a 0-d int64 such as 123456789 as 1.23457e+08.
TEST(Printing, IntegersPrintExactly) {
  Tensor ids = Tensor::from_vector<int64_t>({9007199254740993LL, INT64_MIN, INT64_MAX}, {3});
  std::string s = ids.str();
  EXPECT_NE(s.find("[9007199254740993, -9223372036854775808, 9223372036854775807]"), std::string::npos) << s;
  s = scalar_tensor(123456789.0, DType::kInt64).str();
  EXPECT_NE(s.find("Tensor(123456789,"), std::string::npos) << s;
  s = Tensor::from_vector<int32_t>({-2147483647 - 1, 7}, {2, 1}).str();
  EXPECT_NE(s.find("[[-2147483648],"), std::string::npos) << s;
  EXPECT_NE(s.find("[7]]"), std::string::npos) << s;
  // Floats keep 4 significant digits in a tensor and 6 in a scalar, as before.
  EXPECT_NE(Tensor::from_vector<float>({1.0f / 3}, {1}).str().find("[0.3333]"), std::string::npos);
  EXPECT_NE(scalar_tensor(1.0 / 3).str().find("Tensor(0.333333,"), std::string::npos);
}

// As PyTorch, cat skips a 1-d empty tensor whatever the other tensors' rank (cat({empty [0],
// [2, 3]}) threw "different rank"), keeps checking its dtype and device, and refuses 0-d tensors
// with a message that names stack().
TEST(Views, CatSkipsOneDimEmptyTensorsAndRefusesZeroDimOnes) {
  Tensor none = zeros({0});
  Tensor a = arange(0, 6, 1, DType::kFloat32).reshape({2, 3});
  Tensor b = full({2, 1}, 7);
  Tensor r = cat({none, a, none, b, none}, 1);
  EXPECT_EQ(r.shape(), (Shape{2, 4}));
  EXPECT_EQ(r.to_vector<float>(), (std::vector<float>{0, 1, 2, 7, 3, 4, 5, 7}));
  EXPECT_EQ(cat({none, a}, -2).shape(), (Shape{2, 3}));
  EXPECT_EQ(cat({none, none}).shape(), (Shape{0}));
  EXPECT_EQ(cat({none, arange(0, 2, 1, DType::kFloat32)}).to_vector<float>(), (std::vector<float>{0, 1}));
  EXPECT_THROW(cat({zeros({0}, DType::kFloat64), a}), Error);  // its dtype still counts
  EXPECT_THROW(cat({zeros({0, 3}), zeros({2})}), Error);      // a 2-d empty tensor is not skipped
  try {
    cat({scalar_tensor(1), scalar_tensor(2)});
    ADD_FAILURE() << "cat of 0-d tensors was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("is 0-d and cannot be concatenated; stack()"), std::string::npos)
        << e.what();
  }
}

// As PyTorch, squeeze and transpose of a 0-d tensor take dim 0 or -1 and give the tensor as
// is (they threw "dim 0 is out of range"); any other dim is named in the error.
TEST(Views, ZeroDimTensorSqueezesAndTransposesAlongDimZeroOrMinusOne) {
  Tensor s = scalar_tensor(5);
  for (int64_t d : {0, -1}) {
    EXPECT_EQ(s.squeeze(d).dim(), 0);
    EXPECT_EQ(s.squeeze(d).item(), 5.0);
    for (int64_t e : {0, -1}) {
      EXPECT_EQ(s.transpose(d, e).dim(), 0);
      EXPECT_EQ(s.transpose(d, e).item(), 5.0);
    }
  }
  for (int64_t bad : {1, -2}) {
    try {
      s.squeeze(bad);
      ADD_FAILURE() << "squeeze(" << bad << ") of a 0-d tensor was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("Tensor::squeeze: dim " + std::to_string(bad)), std::string::npos)
          << e.what();
    }
    EXPECT_THROW(s.transpose(0, bad), Error);
    EXPECT_THROW(s.transpose(bad, -1), Error);
  }
}

// item<T>() reads the one element exactly in T: an int64 above 2^53 has no double, so item()
// rounds 2^53 + 1 to 2^53 (and INT64_MAX to 2^63), while item<int64_t>() keeps it, as PyTorch's
// .item() does. item() itself still gives a double for every dtype.
TEST(Item, TypedItemIsExactForInt64AboveTwoToThe53) {
  const int64_t big = 9007199254740993LL;  // 2^53 + 1
  Tensor t = Tensor::from_vector<int64_t>({big}, {});
  EXPECT_EQ(t.item<int64_t>(), big);
  EXPECT_EQ(t.item(), 9007199254740992.0);  // the nearest double
  EXPECT_EQ(Tensor::from_vector<int64_t>({INT64_MAX}, {1, 1}).item<int64_t>(), INT64_MAX);
  EXPECT_EQ(Tensor::from_vector<int64_t>({INT64_MIN}, {1}).item<int64_t>(), INT64_MIN);
  // A view: the element of a transposed, offset tensor.
  Tensor m = Tensor::from_vector<int64_t>({1, 2, big, 4}, {2, 2}).t();
  EXPECT_EQ(m.select(0, 0).select(0, 1).item<int64_t>(), big);
  // Other types convert as to_vector<T> does.
  EXPECT_EQ(scalar_tensor(2.75).item<float>(), 2.75f);
  EXPECT_EQ(scalar_tensor(-2.75).item<int32_t>(), -2);
  EXPECT_EQ(scalar_tensor(7, DType::kInt32).item<int64_t>(), 7);
  EXPECT_EQ(scalar_tensor(7, DType::kInt32).item(), 7.0);
  EXPECT_THROW(zeros({2}).item<int64_t>(), Error);
  EXPECT_THROW(zeros({0}).item<double>(), Error);
}

}  // namespace
}  // namespace ringtrain
