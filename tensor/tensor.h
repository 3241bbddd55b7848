// tensor.h: the Tensor handle, a strided view over reference-counted Storage.
//
// defines: Shape, Tensor (shape/strides/offset metadata, views, copies, device
//          and dtype conversion, element access for tests, printing).
//
// A Tensor is a cheap handle (one shared_ptr) to a TensorImpl; copying a Tensor
// shares the impl, as in PyTorch. Views (reshape of a contiguous tensor, narrow,
// transpose, permute, expand, select, chunk/split) create a new impl over the
// same Storage with other shape/strides/offset: no data moves. Operations that
// compute live in tensor/ops.h; this header is only the data structure.
//
// Strides and offsets are counted in elements, not bytes. An expanded
// (broadcast) dim has stride 0. A tensor with a 0-sized dim has numel() == 0 and
// may have a null data pointer.
//
// The impl has one opaque slot, autograd_meta, that the autograd library fills
// (requires_grad, grad, grad_fn). The tensor library never looks inside it; that
// keeps the dependency arrow pointing one way: tensor <- autograd.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "tensor/checks.h"
#include "tensor/device.h"
#include "tensor/dtype.h"
#include "tensor/storage.h"

namespace ringtrain {

using Shape = std::vector<int64_t>;

std::string shape_str(const Shape& shape);  // "[2, 3]"
int64_t shape_numel(const Shape& shape);
// Bytes of a contiguous `shape` of `element_size`-byte elements, or nullopt when a dim is
// negative or the count does not fit in int64. For shapes read from files, whose product
// could otherwise wrap around (to 0, say) and pass a size check.
std::optional<uint64_t> checked_byte_count(const Shape& shape, size_t element_size);
Shape contiguous_strides(const Shape& shape);

namespace autograd {
struct AutogradMeta;  // defined by the autograd library
}

struct TensorImpl {
  std::shared_ptr<Storage> storage;
  Shape shape;
  Shape strides;
  int64_t offset = 0;
  DType dtype = DType::kFloat32;
  std::shared_ptr<autograd::AutogradMeta> autograd_meta;  // owned by autograd/, opaque here
};

class Tensor {
 public:
  Tensor() = default;  // undefined tensor: defined() == false
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

  // Uninitialised contiguous tensor.
  static Tensor empty(const Shape& shape, DType dtype = DType::kFloat32, Device device = Device::cpu());
  // Copies host values into a new tensor of dtype dtype_of<T>() on `device`.
  template <typename T>
  static Tensor from_vector(const std::vector<T>& values, const Shape& shape,
                            Device device = Device::cpu());
  // A view over existing storage.
  static Tensor from_storage(std::shared_ptr<Storage> storage, const Shape& shape,
                             const Shape& strides, int64_t offset, DType dtype);

  bool defined() const { return impl_ != nullptr; }
  const Shape& shape() const { return impl().shape; }
  const Shape& strides() const { return impl().strides; }
  int64_t offset() const { return impl().offset; }
  int64_t dim() const { return static_cast<int64_t>(impl().shape.size()); }
  int64_t size(int64_t d) const;  // negative d counts from the end
  int64_t stride(int64_t d) const;
  int64_t numel() const { return shape_numel(impl().shape); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype()); }
  DType dtype() const { return impl().dtype; }
  Device device() const { return impl().storage->device(); }
  bool is_contiguous() const;
  const std::shared_ptr<Storage>& storage() const { return impl().storage; }

  // Pointer to element 0 of this view (storage base + offset).
  void* data_ptr() const;
  // Typed pointer; throws if T does not match dtype().
  template <typename T>
  T* data() const;

  // ---- views (share storage) ----
  Tensor view(const Shape& shape) const;     // contiguous only; one dim may be -1
  Tensor reshape(const Shape& shape) const;  // view when possible, otherwise a copy
  Tensor flatten(int64_t start_dim = 0, int64_t end_dim = -1) const;
  Tensor narrow(int64_t dim, int64_t start, int64_t length) const;
  Tensor slice(int64_t dim, int64_t start, int64_t end, int64_t step = 1) const;
  Tensor select(int64_t dim, int64_t index) const;  // removes `dim`
  Tensor transpose(int64_t dim0, int64_t dim1) const;
  // Transpose of a 2-D tensor; 0-D and 1-D tensors are returned as is (as PyTorch);
  // more dims throw (use transpose(dim0, dim1)).
  Tensor t() const;
  Tensor permute(const std::vector<int64_t>& dims) const;
  Tensor unsqueeze(int64_t dim) const;
  Tensor squeeze(int64_t dim) const;
  // Broadcast view, stride 0 on expanded dims. -1 keeps an existing dim's size (not
  // allowed for new leading dims); any other negative size throws.
  Tensor expand(const Shape& shape) const;
  std::vector<Tensor> chunk(int64_t chunks, int64_t dim = 0) const;
  std::vector<Tensor> split(int64_t split_size, int64_t dim = 0) const;
  std::vector<Tensor> split_with_sizes(const std::vector<int64_t>& sizes, int64_t dim = 0) const;

  // ---- copies ----
  Tensor contiguous() const;  // self if already contiguous
  Tensor clone() const;       // always a fresh contiguous copy
  Tensor to(Device device) const;
  Tensor to(DType dtype) const;
  Tensor to(Device device, DType dtype) const;  // self when nothing changes
  // Copies src into this view: same shape (or src broadcastable to it); any dtypes/devices.
  Tensor& copy_(const Tensor& src);

  // All elements, converted to T, in row-major order of this view (any device).
  template <typename T>
  std::vector<T> to_vector() const;
  // The one element (numel() must be 1) as a double: exact for every float dtype and for
  // integers up to 2^53 in magnitude.
  double item() const;
  // The one element converted to T (exact when T is the tensor's own type): item<int64_t>()
  // of an int64 tensor holding 2^53 + 1 gives 2^53 + 1, which the double above cannot hold.
  template <typename T>
  T item() const;

  std::string str() const;  // dtype, device, shape and (abbreviated) values

  // Same impl (same tensor object, not just the same storage).
  bool is_same(const Tensor& other) const { return impl_ == other.impl_; }
  TensorImpl* unsafe_impl() const { return impl_.get(); }
  const std::shared_ptr<TensorImpl>& impl_ptr() const { return impl_; }
  std::string describe() const;  // "float32[2, 3] on cpu" for error messages
  // In-place writes bump the storage's version counter (shared by every view: storage.h).
  void bump_version() const { impl().storage->bump_version(); }
  uint64_t version() const { return impl().storage->version(); }

 private:
  TensorImpl& impl() const;
  Tensor make_view(Shape shape, Shape strides, int64_t offset) const;
  std::shared_ptr<TensorImpl> impl_;
};

std::ostream& operator<<(std::ostream& os, const Tensor& t);

// Normalises a possibly negative dim against `ndim`; throws naming `op` when out of range.
int64_t wrap_dim(int64_t dim, int64_t ndim, const char* op);

// ---- template definitions ----

template <typename T>
T* Tensor::data() const {
  RT_CHECK(dtype_of<T>() == dtype(), "Tensor::data<", dtype_name(dtype_of<T>()),
           ">() called on a ", describe());
  return static_cast<T*>(data_ptr());
}

// Defined in tensor.cc for every supported T.
void copy_host_values_into(const Tensor& dst, const void* values, DType values_dtype);
void copy_values_to_host(const Tensor& src, void* values, DType values_dtype);

template <typename T>
Tensor Tensor::from_vector(const std::vector<T>& values, const Shape& shape, Device device) {
  RT_CHECK(static_cast<int64_t>(values.size()) == shape_numel(shape), "Tensor::from_vector: ",
           values.size(), " values do not fill shape ", shape_str(shape));
  Tensor t = empty(shape, dtype_of<T>(), device);
  copy_host_values_into(t, values.data(), dtype_of<T>());
  return t;
}

template <typename T>
T Tensor::item() const {
  RT_CHECK(numel() == 1, "Tensor::item: needs exactly one element, got ", describe());
  T value{};
  copy_values_to_host(*this, &value, dtype_of<T>());
  return value;
}

template <typename T>
std::vector<T> Tensor::to_vector() const {
  std::vector<T> out(static_cast<size_t>(numel()));
  copy_values_to_host(*this, out.data(), dtype_of<T>());
  return out;
}

}  // namespace ringtrain
