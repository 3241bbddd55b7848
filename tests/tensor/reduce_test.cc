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
