// reference.h: a naive float64 reference toolkit for the tensor tests.
//
// defines: RefTensor (a row-major float64 array with a shape), random_tensor and
//          friends (seeded test inputs, contiguous or as non-contiguous views),
//          get_element/set_element (naive strided access that uses nothing of the
//          library but data_ptr/strides), to_ref/from_ref, the reference
//          implementations ref_* of every op in tensor/ops.h, and expect_close /
//          throws_with for GoogleTest assertions.
//
// Everything here is written to be obviously right rather than fast: plain
// loops over multi-indices, float64 arithmetic, no use of the library's kernels
// (to_ref reads the storage itself; only tensors on a non-CPU device are first
// moved with Tensor::to). Tests compare the library's result against the
// reference computed from the *stored* input values, so rounding of f16/bf16
// inputs does not count as error; only the op's own rounding does.
//
// Shared by the CPU tests (tests/tensor/*_test.cc) and the CUDA tests
// (tests/tensor/cuda_*_test.cc), which link reference.cc too.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "tensor/kernels.h"
#include "tensor/ops.h"
#include "tensor/tensor.h"

namespace ringtrain::ref {

using Index = std::vector<int64_t>;

// A dense row-major float64 array. data.size() == shape_numel(shape).
struct RefTensor {
  Shape shape;
  std::vector<double> data;

  RefTensor() = default;
  RefTensor(Shape s, double value = 0.0);
  RefTensor(Shape s, std::vector<double> values);

  int64_t numel() const { return static_cast<int64_t>(data.size()); }
  int64_t dim() const { return static_cast<int64_t>(shape.size()); }
  int64_t linear(const Index& index) const;  // row-major offset of a multi-index
  double& at(const Index& index) { return data[static_cast<size_t>(linear(index))]; }
  double at(const Index& index) const { return data[static_cast<size_t>(linear(index))]; }
};

// Calls fn(index) for every multi-index of `shape` in row-major order (never for numel 0;
// once with an empty index for a 0-d shape).
void for_each_index(const Shape& shape, const std::function<void(const Index&)>& fn);

// Rounds a value the way storing it in `dtype` does (f16/bf16 round to nearest even,
// integers truncate toward zero as a C++ cast does, f32 rounds to float).
double round_to_dtype(double value, DType dtype);

// ---------------------------------------------------------------- naive element access
// Reads/writes one element of a CPU tensor through data_ptr() and strides(), converting
// to/from double. Throws for non-CPU tensors.
double get_element(const Tensor& t, const Index& index);
void set_element(const Tensor& t, const Index& index, double value);

// All elements of `t` (any device, any strides) as float64. Non-CPU tensors are moved with
// t.to(Device::cpu()) first.
RefTensor to_ref(const Tensor& t);
// A new contiguous tensor holding r's values rounded to dtype, on `device`.
Tensor from_ref(const RefTensor& r, DType dtype, Device device = Device::cpu());

// ---------------------------------------------------------------- seeded inputs
// Contiguous tensor of values uniform in [lo, hi) (integer dtypes: integers in [lo, hi]),
// from std::mt19937_64(seed); independent of the library's own generator.
Tensor random_tensor(const Shape& shape, DType dtype, uint64_t seed, double lo = -1.0,
                     double hi = 1.0, Device device = Device::cpu());

// How a non-contiguous test input is laid out in memory.
enum class Layout {
  kContiguous,
  kTransposed,  // stored with the last two dims swapped, then transpose()d back (rank >= 2)
  kSliced,      // every second element of a twice-as-large buffer along each dim (slice step 2)
  kOffset,      // narrowed out of a larger buffer: non-zero offset, padded row stride
  kPermuted,    // stored with dims reversed, then permute()d back
};
const char* layout_name(Layout layout);
inline constexpr Layout kAllLayouts[] = {Layout::kContiguous, Layout::kTransposed, Layout::kSliced,
                                         Layout::kOffset, Layout::kPermuted};

// A tensor of `shape` with random values laid out as `layout` (for rank < 2, kTransposed and
// kPermuted fall back to kSliced). Values as random_tensor.
Tensor random_view(const Shape& shape, DType dtype, uint64_t seed, Layout layout, double lo = -1.0,
                   double hi = 1.0, Device device = Device::cpu());

// A random tensor of `small` shape expanded (stride 0) to `shape` (numpy broadcast rules).
Tensor random_expanded(const Shape& small, const Shape& shape, DType dtype, uint64_t seed,
                       double lo = -1.0, double hi = 1.0, Device device = Device::cpu());

// Int64 tensor of `shape` with values uniform in [0, bound).
Tensor random_index(const Shape& shape, int64_t bound, uint64_t seed, Device device = Device::cpu());

// ---------------------------------------------------------------- tolerances
struct Tolerance {
  double rtol;
  double atol;
};
// Default tolerance for a result of `dtype` produced by a short computation (elementwise,
// softmax). f64 1e-12, f32 1e-5, f16 ~1e-3, bf16 ~1e-2, integers exact.
Tolerance tolerance_for(DType dtype);
// Tolerance for a result of `dtype` that sums `terms` products (matmul, conv, reductions).
Tolerance accumulate_tolerance_for(DType dtype, int64_t terms);

// ---------------------------------------------------------------- comparisons
// Shapes must be equal; every element must satisfy |a - e| <= atol + rtol * |e| (NaN matches
// NaN, inf matches inf of the same sign). The failure message gives the count of mismatches and
// the first few with their indices.
::testing::AssertionResult expect_close(const Tensor& actual, const RefTensor& expected,
                                        Tolerance tol);
::testing::AssertionResult expect_close(const RefTensor& actual, const RefTensor& expected,
                                        Tolerance tol);
// Exact equality (integer results, indices, views).
::testing::AssertionResult expect_equal(const Tensor& actual, const RefTensor& expected);

// fn() must throw a std::exception whose what() contains every string in `needles`.
::testing::AssertionResult throws_with(const std::function<void()>& fn,
                                       const std::vector<std::string>& needles);

// ---------------------------------------------------------------- reference ops
Shape ref_broadcast_shape(const Shape& a, const Shape& b);
// Broadcasts r to `shape` (numpy rules).
RefTensor ref_expand(const RefTensor& r, const Shape& shape);

double ref_unary_value(kernels::UnaryOp op, double x);
double ref_binary_value(kernels::BinaryOp op, double a, double b);
RefTensor ref_unary(kernels::UnaryOp op, const RefTensor& a);
RefTensor ref_binary(kernels::BinaryOp op, const RefTensor& a, const RefTensor& b);
RefTensor ref_binary_scalar(kernels::BinaryOp op, const RefTensor& a, double scalar);
RefTensor ref_where(const RefTensor& cond, const RefTensor& a, const RefTensor& b);

// dims empty = all dims.
RefTensor ref_reduce(kernels::ReduceOp op, const RefTensor& a, const std::vector<int64_t>& dims,
                     bool keepdim);
RefTensor ref_mean(const RefTensor& a, const std::vector<int64_t>& dims, bool keepdim);
// (values, first-max indices) along dim.
std::pair<RefTensor, RefTensor> ref_max_along(const RefTensor& a, int64_t dim, bool keepdim);

// numpy matmul semantics: 1-D operands, broadcast batch dims.
RefTensor ref_matmul(const RefTensor& a, const RefTensor& b);
RefTensor ref_transpose(const RefTensor& a, int64_t d0, int64_t d1);
RefTensor ref_permute(const RefTensor& a, const std::vector<int64_t>& dims);
// y = x W^T + b (bias may be empty: numel 0 and empty shape means none).
RefTensor ref_linear(const RefTensor& x, const RefTensor& w, const std::optional<RefTensor>& bias);

RefTensor ref_conv2d(const RefTensor& input, const RefTensor& weight,
                     const std::optional<RefTensor>& bias, const Conv2dParams& p);
RefTensor ref_conv2d_backward_input(const RefTensor& grad_out, const RefTensor& weight,
                                    const Shape& input_shape, const Conv2dParams& p);
RefTensor ref_conv2d_backward_weight(const RefTensor& grad_out, const RefTensor& input,
                                     const Shape& weight_shape, const Conv2dParams& p);
int64_t ref_conv_out_size(int64_t in, int64_t kernel, int64_t stride, int64_t pad,
                          int64_t dilation);

std::pair<RefTensor, RefTensor> ref_max_pool2d(const RefTensor& input, const Pool2dParams& p);
RefTensor ref_max_pool2d_backward(const RefTensor& grad_out, const RefTensor& indices,
                                  const Shape& input_shape);
RefTensor ref_avg_pool2d(const RefTensor& input, const Pool2dParams& p);
RefTensor ref_avg_pool2d_backward(const RefTensor& grad_out, const Shape& input_shape,
                                  const Pool2dParams& p);

RefTensor ref_softmax(const RefTensor& a, int64_t dim, bool log);
RefTensor ref_softmax_backward(const RefTensor& grad_out, const RefTensor& output, int64_t dim,
                               bool log);
// Scalar result (shape {}).
RefTensor ref_cross_entropy(const RefTensor& logits, const RefTensor& targets,
                            int64_t ignore_index, double label_smoothing);

RefTensor ref_gather(const RefTensor& a, int64_t dim, const RefTensor& index);
RefTensor ref_index_select(const RefTensor& a, int64_t dim, const RefTensor& index);
RefTensor ref_index_add(const RefTensor& a, int64_t dim, const RefTensor& index,
                        const RefTensor& src);
RefTensor ref_one_hot(const RefTensor& index, int64_t num_classes);
RefTensor ref_cat(const std::vector<RefTensor>& parts, int64_t dim);
RefTensor ref_stack(const std::vector<RefTensor>& parts, int64_t dim);
// numpy-style slice along one dim.
RefTensor ref_slice(const RefTensor& a, int64_t dim, int64_t start, int64_t end, int64_t step);

}  // namespace ringtrain::ref
