// softmax_index_test.cc: softmax / log_softmax forward and backward along every
// dim (incl. inner sizes above the kernel's column block), numerical stability
// with huge logits, cross_entropy (ignore_index, label smoothing), gather,
// index_select (embedding lookup), index_add_, one_hot: all against the float64
// reference, plus out-of-range indices that must throw.
#include <cmath>
#include <string>

#include "tests/tensor/reference.h"

namespace ringtrain {
namespace {

using namespace ref;

const DType kFloatTypes[] = {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16};

const Shape kSoftmaxShapes[] = {{5}, {3, 7}, {2, 3, 4}, {2, 300, 3}, {3, 4, 300}, {1, 1}, {4, 1, 2}, {0, 3}};

TEST(Softmax, ForwardBackwardEveryDim) {
  uint64_t seed = 1;
  for (const Shape& shape : kSoftmaxShapes) {
    for (DType dtype : kFloatTypes) {
      for (Layout layout : {Layout::kContiguous, Layout::kTransposed, Layout::kSliced}) {
        for (int64_t dim = -static_cast<int64_t>(shape.size()); dim < static_cast<int64_t>(shape.size()); ++dim) {
          SCOPED_TRACE(std::string(dtype_name(dtype)) + shape_str(shape) + " " + layout_name(layout) +
                       " dim " + std::to_string(dim));
          Tensor a = random_view(shape, dtype, ++seed, layout, -4, 4);
          RefTensor ra = to_ref(a);
          Tolerance tol = tolerance_for(dtype);
          Tensor y = softmax(a, dim);
          Tensor ly = log_softmax(a, dim);
          EXPECT_TRUE(expect_close(y, ref_softmax(ra, dim, false), tol));
          EXPECT_TRUE(expect_close(ly, ref_softmax(ra, dim, true), tol));
          Tensor g = random_view(shape, dtype, ++seed, layout);
          RefTensor rg = to_ref(g);
          const int64_t n = shape.empty() ? 1 : shape[static_cast<size_t>(dim < 0 ? dim + static_cast<int64_t>(shape.size()) : dim)];
          Tolerance btol = accumulate_tolerance_for(dtype, n);
          btol.atol *= 2;  // the saved output is itself rounded to dtype
          EXPECT_TRUE(expect_close(softmax_backward(g, y, dim), ref_softmax_backward(rg, to_ref(y), dim, false), btol));
          EXPECT_TRUE(expect_close(log_softmax_backward(g, ly, dim),
                                   ref_softmax_backward(rg, to_ref(ly), dim, true), btol));
        }
      }
    }
  }
}

TEST(Softmax, StableForHugeLogits) {
  for (DType dtype : {DType::kFloat32, DType::kFloat64}) {
    SCOPED_TRACE(dtype_name(dtype));
    Tensor a = mul(random_tensor({4, 10}, dtype, 5), 5000.0);  // exp would overflow unshifted
    RefTensor ra = to_ref(a);
    Tensor y = softmax(a, 1);
    EXPECT_TRUE(all_finite(y));
    EXPECT_TRUE(expect_close(y, ref_softmax(ra, 1, false), tolerance_for(dtype)));
    EXPECT_TRUE(expect_close(log_softmax(a, 1), ref_softmax(ra, 1, true), tolerance_for(dtype)));
    // Rows sum to one.
    EXPECT_TRUE(expect_close(sum(y, {1}), RefTensor({4}, 1.0), tolerance_for(dtype)));
  }
}

TEST(Softmax, BitwiseIndependentOfRowPositionAndHeap) {
  Tensor row = random_tensor({1, 37}, DType::kFloat32, 9, -4, 4);
  const std::vector<float> expected = softmax(row, 1).to_vector<float>();
  const std::vector<float> expected_log = log_softmax(row, 1).to_vector<float>();
  for (int64_t rows = 2; rows < 9; ++rows) {
    Tensor batch = random_tensor({rows, 37}, DType::kFloat32, 10 + rows, -4, 4);
    batch.narrow(0, rows - 1, 1).copy_(row);
    std::vector<char> heap_noise(static_cast<size_t>(rows * 24));  // shifts later allocations
    EXPECT_EQ(softmax(batch, 1).narrow(0, rows - 1, 1).to_vector<float>(), expected) << rows;
    EXPECT_EQ(log_softmax(batch, 1).narrow(0, rows - 1, 1).to_vector<float>(), expected_log) << rows;
  }
}

TEST(CrossEntropy, MatchesReferenceWithIgnoreAndSmoothing) {
  uint64_t seed = 50;
  for (DType dtype : {DType::kFloat32, DType::kFloat64, DType::kBFloat16}) {
    for (double smoothing : {0.0, 0.1}) {
      for (int64_t ignore : {-100, 2}) {
        SCOPED_TRACE(std::string(dtype_name(dtype)) + " smoothing " + std::to_string(smoothing) +
                     " ignore " + std::to_string(ignore));
        Tensor logits = random_view({9, 5}, dtype, ++seed, Layout::kTransposed, -3, 3);
        Tensor targets = random_index({9}, 5, ++seed);
        set_element(targets, {0}, 2.0);  // at least one ignored when ignore == 2
        set_element(targets, {1}, 4.0);  // and at least one kept
        Tensor loss = cross_entropy(logits, targets, ignore, smoothing);
        EXPECT_EQ(loss.dim(), 0);
        Tolerance tol = accumulate_tolerance_for(dtype, 45);
        EXPECT_TRUE(expect_close(loss, ref_cross_entropy(to_ref(logits), to_ref(targets), ignore, smoothing), tol));
      }
    }
  }
}

// A 0-d tensor takes dim 0 or -1, as PyTorch: softmax is 1 (log_softmax 0) and its backward
// follows, gather and index_select read the one element (they threw "dim 0 is out of range").
// Any other dim is an error (softmax took any dim of a 0-d tensor without a look).
TEST(ZeroDim, SoftmaxAndGatherTakeDimZeroOrMinusOne) {
  Tensor s = scalar_tensor(3.5);
  Tensor zero_index = Tensor::from_vector<int64_t>({0}, {});
  for (int64_t d : {0, -1}) {
    EXPECT_EQ(softmax(s, d).item(), 1.0);
    EXPECT_EQ(log_softmax(s, d).item(), 0.0);
    EXPECT_EQ(softmax_backward(scalar_tensor(2), softmax(s, d), d).item(), 0.0);
    EXPECT_EQ(log_softmax_backward(scalar_tensor(2), log_softmax(s, d), d).item(), 0.0);
    Tensor g = gather(s, d, zero_index);
    EXPECT_EQ(g.dim(), 0);
    EXPECT_EQ(g.item(), 3.5);
    for (const Tensor& index : {zero_index, Tensor::from_vector<int64_t>({0}, {1})}) {
      Tensor picked = index_select(s, d, index);
      EXPECT_EQ(picked.dim(), 0);
      EXPECT_EQ(picked.item(), 3.5);
    }
  }
  EXPECT_THROW(index_select(s, 0, Tensor::from_vector<int64_t>({0, 0}, {2})), Error);  // one index only
  EXPECT_THROW(index_select(s, 0, Tensor::from_vector<int64_t>({1}, {1})), Error);     // out of range
  EXPECT_THROW(gather(s, 0, Tensor::from_vector<int64_t>({1}, {})), Error);  // index out of range
  for (int64_t bad : {1, -2}) {
    try {
      softmax(s, bad);
      ADD_FAILURE() << "softmax over dim " << bad << " of a 0-d tensor was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("takes dim 0 or -1"), std::string::npos) << e.what();
    }
    EXPECT_THROW(log_softmax(s, bad), Error);
    EXPECT_THROW(softmax_backward(s, s, bad), Error);
    EXPECT_THROW(log_softmax_backward(s, s, bad), Error);
    EXPECT_THROW(gather(s, bad, zero_index), Error);
    EXPECT_THROW(index_select(s, bad, zero_index), Error);
  }
}

TEST(Gather, AlongEveryDimWithSmallerIndex) {
  uint64_t seed = 80;
  for (DType dtype : kAllDTypes) {
    for (Layout layout : {Layout::kContiguous, Layout::kTransposed, Layout::kSliced}) {
      const Shape shape = {4, 5, 6};
      for (int64_t dim = 0; dim < 3; ++dim) {
        SCOPED_TRACE(std::string(dtype_name(dtype)) + " " + layout_name(layout) + " dim " + std::to_string(dim));
        Tensor a = random_view(shape, dtype, ++seed, layout, -50, 50);
        Shape ishape = {3, 5, 2};
        ishape[static_cast<size_t>(dim)] = 7;  // may exceed a's size along dim (it is an index count)
        Tensor index = random_index(ishape, shape[static_cast<size_t>(dim)], ++seed);
        Tensor out = gather(a, dim, index);
        EXPECT_TRUE(expect_equal(out, ref_gather(to_ref(a), dim, to_ref(index))));
      }
    }
  }
  Tensor a = random_tensor({3, 4}, DType::kFloat32, 1);
  Tensor bad = Tensor::from_vector<int64_t>({0, 4, 1}, {3, 1});
  EXPECT_TRUE(throws_with([&] { gather(a, 1, bad); }, {"gather", "index 4", "size 4"}));
  Tensor neg = Tensor::from_vector<int64_t>({0, -1, 1}, {3, 1});
  EXPECT_TRUE(throws_with([&] { gather(a, 1, neg); }, {"gather", "-1"}));
}

TEST(IndexSelect, EmbeddingLookupAndOtherDims) {
  uint64_t seed = 120;
  for (DType dtype : kAllDTypes) {
    for (Layout layout : {Layout::kContiguous, Layout::kTransposed, Layout::kOffset}) {
      for (const Shape& ishape : {Shape{5}, Shape{2, 3}, Shape{}, Shape{0}}) {
        for (int64_t dim : {0, 1, -1}) {
          SCOPED_TRACE(std::string(dtype_name(dtype)) + " " + layout_name(layout) + " index " +
                       shape_str(ishape) + " dim " + std::to_string(dim));
          Tensor table = random_view({6, 4}, dtype, ++seed, layout, -50, 50);
          const int64_t size = table.size(dim);
          Tensor index = random_index(ishape, size, ++seed);
          Tensor out = index_select(table, dim, index);
          EXPECT_TRUE(expect_equal(out, ref_index_select(to_ref(table), dim, to_ref(index))));
        }
      }
    }
  }
  Tensor table = random_tensor({6, 4}, DType::kFloat32, 1);
  EXPECT_TRUE(throws_with([&] { index_select(table, 0, Tensor::from_vector<int64_t>({1, 6}, {2})); },
                          {"index_select", "index 6", "size 6"}));
  EXPECT_TRUE(throws_with([&] { index_select(table, 0, Tensor::from_vector<int32_t>({1}, {1})); },
                          {"index_select", "int64", "int32"}));
}

TEST(IndexAdd, AccumulatesDuplicates) {
  uint64_t seed = 160;
  for (DType dtype : kAllDTypes) {
    for (int64_t dim : {0, 1}) {
      for (const Shape& ishape : {Shape{7}, Shape{2, 3}}) {
        SCOPED_TRACE(std::string(dtype_name(dtype)) + " dim " + std::to_string(dim) + " index " + shape_str(ishape));
        Tensor a = random_tensor({4, 5}, dtype, ++seed, -20, 20);
        Tensor index = random_index(ishape, a.size(dim), ++seed);  // duplicates are likely
        Shape sshape = dim == 0 ? Shape{} : Shape{4};
        sshape.insert(sshape.end(), ishape.begin(), ishape.end());
        if (dim == 0) sshape.push_back(5);
        Tensor src = random_view(sshape, dtype, ++seed, Layout::kTransposed, -20, 20);
        RefTensor expected = ref_index_add(to_ref(a), dim, to_ref(index), to_ref(src));
        index_add_(a, dim, index, src);
        if (is_floating_point(dtype)) {
          // Each add into a f16/bf16 destination rounds (as in PyTorch): allow a few roundings
          // of partial sums up to ~|20| * (duplicates + 1).
          Tolerance tol = accumulate_tolerance_for(dtype, 8);
          if (dtype == DType::kFloat16) tol.atol += 4 * 9.8e-4 * 80;
          if (dtype == DType::kBFloat16) tol.atol += 4 * 7.9e-3 * 80;
          EXPECT_TRUE(expect_close(a, expected, tol));
        } else {
          EXPECT_TRUE(expect_equal(a, expected));
        }
      }
    }
  }
  Tensor a = zeros({3, 2});
  EXPECT_TRUE(throws_with([&] { index_add_(a, 0, Tensor::from_vector<int64_t>({3}, {1}), ones({1, 2})); },
                          {"index_add", "index 3", "size 3"}));
  // A bad index after good ones: the destination is left as it was (the kernel used to add
  // the rows before the bad one, then throw, leaving a half-updated tensor behind).
  EXPECT_TRUE(throws_with([&] { index_add_(a, 0, Tensor::from_vector<int64_t>({0, 1, 7}, {3}), ones({3, 2})); },
                          {"index_add", "index 7", "size 3"}));
  EXPECT_TRUE(throws_with([&] { index_add_(a, 1, Tensor::from_vector<int64_t>({1, -1}, {2}), ones({3, 2})); },
                          {"index_add", "index -1", "size 2"}));
  EXPECT_EQ(a.to_vector<float>(), std::vector<float>(6, 0.0f));
}

TEST(OneHot, MatchesReference) {
  Tensor index = random_index({2, 5}, 7, 3);
  Tensor y = one_hot(index, 7);
  EXPECT_EQ(y.shape(), (Shape{2, 5, 7}));
  EXPECT_TRUE(expect_equal(y, ref_one_hot(to_ref(index), 7)));
}

}  // namespace
}  // namespace ringtrain
