// reduce_test.cc: sum/mean/amax/amin over dim sets (keepdim or not), max/argmax
// along a dim, sum_to, against the float64 reference on every layout and dtype.
#include <cmath>
#include <limits>
#include <string>

#include "tests/tensor/reference.h"

namespace ringtrain {
namespace {

using kernels::ReduceOp;
using namespace ref;

const DType kFloatTypes[] = {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16};

struct ReduceShapeCase {
  Shape shape;
  std::vector<std::vector<int64_t>> dim_sets;
};

const ReduceShapeCase kCases[] = {
    {{2, 3, 4}, {{}, {0}, {1}, {2}, {-1}, {0, 2}, {1, 2}, {0, 1, 2}}},
    {{5, 7, 1}, {{}, {0}, {2}, {0, 1}}},
    {{1}, {{}, {0}}},
    {{}, {{}}},
    {{0, 3}, {{1}}},  // reduces the non-empty dim: output [0]
    {{3, 0}, {{1}}},  // sum over an empty dim
    {{4, 65, 3}, {{1}, {0, 2}, {}}},
    {{2, 3, 4, 5}, {{0, 3}, {1, 2}, {3}}},
};

std::string dims_str(const std::vector<int64_t>& dims) {
  std::string s = "dims {";
  for (int64_t d : dims) s += std::to_string(d) + ",";
  return s + "}";
}

int64_t reduced_count(const Shape& shape, const std::vector<int64_t>& dims) {
  if (dims.empty()) return shape_numel(shape);
  int64_t n = 1;
  for (int64_t d : dims) n *= shape[static_cast<size_t>(d < 0 ? d + static_cast<int64_t>(shape.size()) : d)];
  return n;
}

RefTensor rounded(RefTensor r, DType dtype) {
  for (auto& v : r.data) v = round_to_dtype(v, dtype);
  return r;
}

TEST(Reduce, SumMaxMinOverDimSetsEveryDtypeAndLayout) {
  uint64_t seed = 1;
  for (const auto& c : kCases) {
    for (const auto& dims : c.dim_sets) {
      for (DType dtype : kAllDTypes) {
        for (Layout layout : kAllLayouts) {
          for (bool keepdim : {false, true}) {
            SCOPED_TRACE(std::string(dtype_name(dtype)) + shape_str(c.shape) + " " + layout_name(layout) +
                         " " + dims_str(dims) + (keepdim ? " keepdim" : ""));
            const bool integer = !is_floating_point(dtype);
            Tensor a = random_view(c.shape, dtype, ++seed, layout, integer ? -100 : -1, integer ? 100 : 1);
            RefTensor ra = to_ref(a);
            const int64_t count = reduced_count(c.shape, dims);
            Tensor s = sum(a, dims, keepdim);
            EXPECT_EQ(s.dtype(), dtype);
            RefTensor rs = ref_reduce(ReduceOp::kSum, ra, dims, keepdim);
            if (integer) {
              EXPECT_TRUE(expect_equal(s, rs));
            } else {
              EXPECT_TRUE(expect_close(s, rs, accumulate_tolerance_for(dtype, count)));
              Tensor m = mean(a, dims, keepdim);
              if (count > 0) EXPECT_TRUE(expect_close(m, ref_mean(ra, dims, keepdim), accumulate_tolerance_for(dtype, count)));
            }
            if (count > 0 || a.numel() == 0) {
              if (count > 0) {
                // max/min pick a stored value: exact.
                EXPECT_TRUE(expect_equal(amax(a, dims, keepdim), ref_reduce(ReduceOp::kMax, ra, dims, keepdim)));
                EXPECT_TRUE(expect_equal(amin(a, dims, keepdim), ref_reduce(ReduceOp::kMin, ra, dims, keepdim)));
              }
            }
          }
        }
      }
    }
  }
}

TEST(Reduce, MaxOverAnEmptyDimThrows) {
  Tensor a = zeros({3, 0});
  EXPECT_TRUE(throws_with([&] { amax(a, {1}); }, {"amax", "[3, 0]"}));
  EXPECT_TRUE(throws_with([&] { max(a, 1); }, {"max", "[3, 0]"}));
  // Summing over it is fine: zeros.
  EXPECT_TRUE(expect_equal(sum(a, {1}), RefTensor({3}, 0.0)));
}

TEST(Reduce, LargeFloat32SumAccumulatesPrecisely) {
  // 2^21 values in [0, 1): a naive float32 running sum would be off by ~1e-3 relative;
  // float64 accumulation (or blocked sums) keeps it near float32 output rounding.
  Tensor a = random_tensor({1 << 21}, DType::kFloat32, 5, 0.0, 1.0);
  RefTensor expected = ref_reduce(ReduceOp::kSum, to_ref(a), {}, false);
  EXPECT_TRUE(expect_close(sum(a), expected, Tolerance{1e-6, 0}));
  Tensor b = a.view({1024, 2048});
  EXPECT_TRUE(expect_close(sum(b, {0}), ref_reduce(ReduceOp::kSum, to_ref(b), {0}, false), Tolerance{1e-6, 1e-6}));
  EXPECT_TRUE(expect_close(sum(b, {1}), ref_reduce(ReduceOp::kSum, to_ref(b), {1}, false), Tolerance{1e-6, 1e-6}));
  EXPECT_TRUE(expect_close(sum(b.t(), {0}), ref_reduce(ReduceOp::kSum, to_ref(b), {1}, false), Tolerance{1e-6, 1e-6}));
}

TEST(Reduce, MaxMinPropagateNaN) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (DType dtype : kFloatTypes) {
    SCOPED_TRACE(dtype_name(dtype));
    RefTensor r({2, 3}, std::vector<double>{1, nan, 3, 4, 5, 6});
    Tensor a = from_ref(r, dtype);
    EXPECT_TRUE(expect_equal(amax(a, {1}), RefTensor({2}, std::vector<double>{nan, 6})));
    EXPECT_TRUE(expect_equal(amin(a, {1}), RefTensor({2}, std::vector<double>{nan, 4})));
    EXPECT_TRUE(std::isnan(amax(a).item()));
  }
}

// Long runs go through four packet accumulators and a separate NaN test: a NaN anywhere (a
// packet's first or last lane, the tail) and the extreme anywhere must still be found.
TEST(Reduce, MaxMinOfLongRunsFindNaNAndTheExtremeAtEveryPosition) {
  const int64_t n = 4 * 16 * 3 + 7;
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (DType dtype : {DType::kFloat32, DType::kFloat64}) {
    SCOPED_TRACE(dtype_name(dtype));
    for (int64_t at : {int64_t{0}, int64_t{15}, int64_t{16}, int64_t{63}, int64_t{64}, n - 8, n - 7, n - 1}) {
      SCOPED_TRACE(at);
      std::vector<double> xs(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) xs[static_cast<size_t>(i)] = std::cos(0.7 * static_cast<double>(i));
      std::vector<double> high = xs, low = xs, with_nan = xs;
      high[static_cast<size_t>(at)] = 5.0;
      low[static_cast<size_t>(at)] = -5.0;
      with_nan[static_cast<size_t>(at)] = nan;
      EXPECT_EQ(amax(Tensor::from_vector(high, {n}).to(dtype)).item(), 5.0);
      EXPECT_EQ(amin(Tensor::from_vector(low, {n}).to(dtype)).item(), -5.0);
      EXPECT_TRUE(std::isnan(amax(Tensor::from_vector(with_nan, {n}).to(dtype)).item()));
      EXPECT_TRUE(std::isnan(amin(Tensor::from_vector(with_nan, {n}).to(dtype)).item()));
    }
  }
}

// Reducing the leading dims of a contiguous tensor takes four rows per pass; every column
// still adds its rows in order, so the result equals, bit for bit, the general strided walk
// (taken by the same values in a non-contiguous view: columns of a wider tensor), for row
// counts that leave 0-3 rows over and for max/min with a NaN in some column.
TEST(Reduce, LeadingDimsFourRowsAtATimeEqualTheStridedWalk) {
  for (DType dtype : {DType::kFloat32, DType::kFloat64, DType::kBFloat16}) {
    for (int64_t rows : {2, 5, 6, 7, 8, 37}) {
      SCOPED_TRACE(std::string(dtype_name(dtype)) + " rows " + std::to_string(rows));
      const int64_t cols = 33;
      std::vector<double> xs(static_cast<size_t>(rows * cols));
      for (size_t i = 0; i < xs.size(); ++i) xs[i] = std::sin(1.3 * static_cast<double>(i)) * std::pow(10.0, static_cast<double>(i % 7) - 3);
      xs[static_cast<size_t>(cols + 3)] = std::numeric_limits<double>::quiet_NaN();
      Tensor a = Tensor::from_vector(xs, {rows, cols}).to(dtype);
      Tensor wide = zeros({rows, cols + 5}, dtype);
      wide.slice(1, 0, cols).copy_(a);
      Tensor a_view = wide.slice(1, 0, cols);
      ASSERT_FALSE(a_view.is_contiguous());
      const std::vector<double> sum_fast = sum(a, {0}).to(DType::kFloat64).to_vector<double>();
      const std::vector<double> sum_walk = sum(a_view, {0}).to(DType::kFloat64).to_vector<double>();
      const std::vector<double> max_fast = amax(a.view({rows, 1, cols}), {0, 1}).to(DType::kFloat64).to_vector<double>();
      const std::vector<double> min_fast = amin(a, {0}).to(DType::kFloat64).to_vector<double>();
      for (int64_t c = 0; c < cols; ++c) {
        const size_t k = static_cast<size_t>(c);
        if (c == 3) {
          EXPECT_TRUE(std::isnan(sum_fast[k]) && std::isnan(max_fast[k]) && std::isnan(min_fast[k]));
          continue;
        }
        EXPECT_EQ(sum_fast[k], sum_walk[k]) << "column " << c;
        double hi = -1e300, lo = 1e300;
        for (int64_t r = 0; r < rows; ++r) {
          const double v = a.to(DType::kFloat64).to_vector<double>()[static_cast<size_t>(r * cols + c)];
          hi = std::max(hi, v);
          lo = std::min(lo, v);
        }
        EXPECT_EQ(max_fast[k], hi) << "column " << c;
        EXPECT_EQ(min_fast[k], lo) << "column " << c;
      }
    }
  }
}

TEST(MaxAlong, ValuesAndFirstIndicesEveryDim) {
  uint64_t seed = 300;
  const Shape shapes[] = {{7}, {3, 5}, {2, 3, 4}, {4, 1, 6}, {1, 1}, {0, 5}};
  for (const Shape& shape : shapes) {
    for (DType dtype : kAllDTypes) {
      for (Layout layout : {Layout::kContiguous, Layout::kTransposed, Layout::kSliced}) {
        for (int64_t dim = 0; dim < static_cast<int64_t>(shape.size()); ++dim) {
          if (shape[static_cast<size_t>(dim)] == 0) continue;
          for (bool keepdim : {false, true}) {
            SCOPED_TRACE(std::string(dtype_name(dtype)) + shape_str(shape) + " " + layout_name(layout) +
                         " dim " + std::to_string(dim) + (keepdim ? " keepdim" : ""));
            // Small integer values: ties are frequent, so "first maximum" is exercised.
            Tensor a = random_view(shape, dtype, ++seed, layout, -3, 3);
            if (is_floating_point(dtype) && a.numel() > 0) {
              for_each_index(shape, [&](const Index& i) { set_element(a, i, std::round(get_element(a, i))); });
            }
            auto [values, indices] = max(a, dim, keepdim);
            auto [rv, ri] = ref_max_along(to_ref(a), dim, keepdim);
            EXPECT_EQ(indices.dtype(), DType::kInt64);
            EXPECT_TRUE(expect_equal(values, rv));
            EXPECT_TRUE(expect_equal(indices, ri));
            EXPECT_TRUE(expect_equal(argmax(a, dim, keepdim), ri));
          }
        }
      }
    }
  }
}

TEST(MaxAlong, NegativeDimAndFlattenedArgmax) {
  Tensor a = random_view({4, 6}, DType::kFloat32, 17, Layout::kTransposed);
  auto [rv, ri] = ref_max_along(to_ref(a), 1, false);
  EXPECT_TRUE(expect_equal(max(a, -1).first, rv));
  RefTensor flat = to_ref(a);
  flat.shape = {24};
  auto [fv, fi] = ref_max_along(flat, 0, false);
  Tensor am = argmax(a);
  EXPECT_EQ(am.dim(), 0);
  EXPECT_EQ(am.item(), fi.data[0]);
}

// As PyTorch, a 0-d tensor takes dim 0 or -1 in every reduction: the result is 0-d (keepdim
// too), the value its one element, the index 0. Any other dim, or 0 and -1 together, throws.
TEST(Reduce, ZeroDimTensorTakesDimZeroOrMinusOne) {
  Tensor x = scalar_tensor(-2.5);
  for (int64_t dim : {0, -1}) {
    for (bool keepdim : {false, true}) {
      SCOPED_TRACE("dim " + std::to_string(dim) + (keepdim ? " keepdim" : ""));
      for (const Tensor& r : {sum(x, {dim}, keepdim), mean(x, {dim}, keepdim), amax(x, {dim}, keepdim),
                              amin(x, {dim}, keepdim), max(x, dim, keepdim).first}) {
        EXPECT_EQ(r.dim(), 0);
        EXPECT_EQ(r.dtype(), DType::kFloat32);
        EXPECT_EQ(r.item(), -2.5);
      }
      auto [v, i] = max(x, dim, keepdim);
      EXPECT_EQ(i.dim(), 0);
      EXPECT_EQ(i.dtype(), DType::kInt64);
      EXPECT_EQ(i.item<int64_t>(), 0);
      Tensor am = argmax(x, dim, keepdim);
      EXPECT_EQ(am.dim(), 0);
      EXPECT_EQ(am.item<int64_t>(), 0);
    }
  }
  Tensor big = Tensor::from_vector<int64_t>({INT64_MAX}, {});
  EXPECT_EQ(sum(big, {0}).item<int64_t>(), INT64_MAX);
  EXPECT_EQ(amin(big, {-1}, true).item<int64_t>(), INT64_MAX);
  for (int64_t bad : {1, -2}) {
    try {
      sum(x, {bad});
      ADD_FAILURE() << "dim " << bad << " of a 0-d tensor was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("takes dim 0 or -1"), std::string::npos) << e.what();
    }
    EXPECT_THROW(max(x, bad), Error);
    EXPECT_THROW(mean(x, {bad}), Error);
  }
  EXPECT_THROW(sum(x, {0, -1}), Error);  // the same dim twice
}

TEST(MaxAlong, NaNIsTheMaximum) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  Tensor a = from_ref(RefTensor({2, 4}, std::vector<double>{1, nan, 7, nan, 2, 9, 9, 3}), DType::kFloat32);
  auto [v, i] = max(a, 1);
  EXPECT_TRUE(expect_equal(v, RefTensor({2}, std::vector<double>{nan, 9})));
  EXPECT_TRUE(expect_equal(i, RefTensor({2}, std::vector<double>{1, 1})));
}

TEST(SumTo, InverseOfBroadcast) {
  Tensor a = random_tensor({2, 3, 4}, DType::kFloat64, 8);
  RefTensor ra = to_ref(a);
  Tolerance tol = accumulate_tolerance_for(DType::kFloat64, 24);
  EXPECT_TRUE(expect_close(sum_to(a, {3, 1}),
                           RefTensor({3, 1}, ref_reduce(ReduceOp::kSum, ra, {0, 2}, false).data), tol));
  EXPECT_TRUE(expect_close(sum_to(a, {4}), RefTensor({4}, ref_reduce(ReduceOp::kSum, ra, {0, 1}, false).data), tol));
  EXPECT_TRUE(expect_close(sum_to(a, {}), ref_reduce(ReduceOp::kSum, ra, {}, false), tol));
  EXPECT_TRUE(expect_close(sum_to(a, {2, 3, 4}), ra, tol));
  EXPECT_TRUE(throws_with([&] { sum_to(a, {5}); }, {"sum_to", "[2, 3, 4]"}));
}

TEST(Reduce, IntegerSumsAreExact) {
  Tensor b = full({3, 1000}, 3000000000.0, DType::kInt64);
  EXPECT_TRUE(expect_equal(sum(b, {1}), RefTensor({3}, 3e12)));
  Tensor c = random_view({17, 301}, DType::kInt32, 4, Layout::kTransposed, -100000, 100000);
  EXPECT_TRUE(expect_equal(sum(c), ref_reduce(ReduceOp::kSum, to_ref(c), {}, false)));
}

}  // namespace
}  // namespace ringtrain
