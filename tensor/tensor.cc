// tensor.cc: Tensor metadata, views and copies. No arithmetic lives here: views
// only rewrite (shape, strides, offset), and every data movement goes through
// the copy kernel of the destination's device (tensor/kernels.h).
#include "tensor/tensor.h"

#include <algorithm>
#include <cstring>
#include <iomanip>
#include <limits>
#include <numeric>
#include <optional>
#include <sstream>
#include <type_traits>

#include "tensor/kernels.h"
#include "tensor/memory_overlap.h"

namespace ringtrain {

std::string shape_str(const Shape& shape) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < shape.size(); ++i) os << (i ? ", " : "") << shape[i];
  os << "]";
  return os.str();
}

int64_t shape_numel(const Shape& shape) {
  int64_t n = 1;
  for (int64_t s : shape)
    RT_CHECK(!__builtin_mul_overflow(n, s, &n), "shape ", shape_str(shape),
             " has more elements than an int64 can count");
  return n;
}

std::optional<uint64_t> checked_byte_count(const Shape& shape, size_t element_size) {
  uint64_t bytes = element_size;
  for (int64_t s : shape) {
    if (s < 0 || __builtin_mul_overflow(bytes, static_cast<uint64_t>(s), &bytes) ||
        bytes > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
      return std::nullopt;
  }
  return bytes;
}

Shape contiguous_strides(const Shape& shape) {
  Shape strides(shape.size());
  int64_t stride = 1;
  for (int64_t i = static_cast<int64_t>(shape.size()) - 1; i >= 0; --i) {
    strides[i] = stride;
    // Overflow is only possible for a 0-element shape such as [0, 2^62, 4] (a shape with
    // elements has an int64 numel, which bounds every partial product). No element is ever
    // addressed through such strides, so they saturate instead of wrapping (signed overflow).
    if (__builtin_mul_overflow(stride, std::max<int64_t>(shape[i], 1), &stride))
      stride = std::numeric_limits<int64_t>::max();
  }
  return strides;
}

int64_t wrap_dim(int64_t dim, int64_t ndim, const char* op) {
  int64_t wrapped = dim < 0 ? dim + ndim : dim;
  RT_CHECK(wrapped >= 0 && wrapped < ndim, op, ": dim ", dim, " is out of range for a tensor with ",
           ndim, " dims (valid: ", -ndim, " to ", ndim - 1, ")");
  return wrapped;
}

namespace {
// For a 0-d tensor, the views that PyTorch lets name dim 0 or -1 (squeeze, transpose): checks
// that `dim` is one of those, naming `op` otherwise.
void check_scalar_dim(int64_t dim, const char* op) {
  RT_CHECK(dim == 0 || dim == -1, op, ": dim ", dim, " is out of range for a 0-d tensor (it takes dim 0 or -1)");
}
}  // namespace

// ------------------------------------------------------------------ construction

Tensor Tensor::empty(const Shape& shape, DType dtype, Device device) {
  for (int64_t s : shape)
    RT_CHECK(s >= 0, "Tensor::empty: negative size in shape ", shape_str(shape));
  std::optional<uint64_t> bytes = checked_byte_count(shape, dtype_size(dtype));
  RT_CHECK(bytes.has_value(), "Tensor::empty: shape ", shape_str(shape), " of ", dtype_name(dtype),
           " needs more than 2^63 bytes");
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = std::make_shared<Storage>(static_cast<size_t>(*bytes), device);
  impl->shape = shape;
  impl->strides = contiguous_strides(shape);
  impl->dtype = dtype;
  return Tensor(std::move(impl));
}

Tensor Tensor::from_storage(std::shared_ptr<Storage> storage, const Shape& shape, const Shape& strides,
                            int64_t offset, DType dtype) {
  RT_CHECK(shape.size() == strides.size(), "Tensor::from_storage: shape ", shape_str(shape),
           " and strides ", shape_str(strides), " differ in rank");
  RT_CHECK(storage != nullptr, "Tensor::from_storage: null storage");
  for (int64_t size : shape)
    RT_CHECK(size >= 0, "Tensor::from_storage: negative size in shape ", shape_str(shape));
  // Every element the view can reach must lie inside the storage: the last one is at
  // offset + sum((size - 1) * stride), in elements.
  RT_CHECK(offset >= 0, "Tensor::from_storage: negative offset ", offset);
  if (shape_numel(shape) > 0) {
    uint64_t last = static_cast<uint64_t>(offset);
    bool overflow = false;
    for (size_t d = 0; d < shape.size(); ++d) {
      RT_CHECK(strides[d] >= 0, "Tensor::from_storage: negative stride in ", shape_str(strides));
      uint64_t reach = 0;
      overflow |= __builtin_mul_overflow(static_cast<uint64_t>(shape[d] - 1),
                                         static_cast<uint64_t>(strides[d]), &reach);
      overflow |= __builtin_add_overflow(last, reach, &last);
    }
    const uint64_t elements = storage->nbytes() / dtype_size(dtype);
    RT_CHECK(!overflow && last < elements, "Tensor::from_storage: shape ", shape_str(shape), " strides ",
             shape_str(strides), " offset ", offset, " reach past the storage's ", elements, " ",
             dtype_name(dtype), " elements");
  }
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = std::move(storage);
  impl->shape = shape;
  impl->strides = strides;
  impl->offset = offset;
  impl->dtype = dtype;
  return Tensor(std::move(impl));
}

TensorImpl& Tensor::impl() const {
  RT_CHECK(impl_ != nullptr, "operation on an undefined Tensor (default-constructed, never assigned)");
  return *impl_;
}

int64_t Tensor::size(int64_t d) const { return impl().shape[wrap_dim(d, dim(), "Tensor::size")]; }
int64_t Tensor::stride(int64_t d) const {
  return impl().strides[wrap_dim(d, dim(), "Tensor::stride")];
}

bool Tensor::is_contiguous() const {
  int64_t expected = 1;
  for (int64_t i = dim() - 1; i >= 0; --i) {
    if (shape()[i] == 1) continue;  // size-1 dims may have any stride
    if (strides()[i] != expected) return false;
    if (__builtin_mul_overflow(expected, shape()[i], &expected))  // only 0-element shapes
      expected = std::numeric_limits<int64_t>::max();
  }
  return true;
}

void* Tensor::data_ptr() const {
  char* base = static_cast<char*>(impl().storage->data());
  if (base == nullptr) return nullptr;
  return base + offset() * static_cast<int64_t>(dtype_size(dtype()));
}

std::string Tensor::describe() const {
  if (!defined()) return "undefined tensor";
  return std::string(dtype_name(dtype())) + shape_str(shape()) + " on " + device().str();
}

// ------------------------------------------------------------------ views

Tensor Tensor::make_view(Shape shape, Shape strides, int64_t offset) const {
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = this->impl().storage;
  impl->shape = std::move(shape);
  impl->strides = std::move(strides);
  impl->offset = offset;
  impl->dtype = dtype();
  return Tensor(std::move(impl));
}

namespace {
// Resolves one -1 in `shape` so that it holds `numel` elements.
Shape infer_shape(const Shape& requested, int64_t numel, const char* op, const Tensor& t) {
  Shape shape = requested;
  int64_t known = 1;
  int infer_at = -1;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == -1) {
      RT_CHECK(infer_at < 0, op, ": more than one -1 in shape ", shape_str(requested));
      infer_at = static_cast<int>(i);
    } else {
      RT_CHECK(shape[i] >= 0, op, ": invalid size ", shape[i], " in shape ", shape_str(requested));
      RT_CHECK(!__builtin_mul_overflow(known, shape[i], &known), op, ": shape ", shape_str(requested),
               " has more elements than an int64 can count");
    }
  }
  if (infer_at >= 0) {
    RT_CHECK(known != 0 && numel % known == 0, op, ": shape ", shape_str(requested),
             " is invalid for ", t.describe());
    shape[infer_at] = numel / known;
  }
  RT_CHECK(shape_numel(shape) == numel, op, ": shape ", shape_str(requested), " is invalid for ",
           t.describe(), " (", numel, " elements)");
  return shape;
}

// Strides for viewing (shape, strides) as `target` without copying, or nullopt when
// impossible. Walk the old dims from the innermost outward, cutting them into
// "chunks" of dims that are contiguous with each other (each stride equals the
// next one times its size); each chunk must be covered exactly by a run of target
// dims, whose strides are then laid out inside the chunk from its base stride.
std::optional<Shape> view_strides(const Shape& shape, const Shape& strides, const Shape& target) {
  if (shape.empty() || shape_numel(shape) == 0) return contiguous_strides(target);
  Shape result(target.size(), 1);
  int64_t view_d = static_cast<int64_t>(target.size()) - 1;
  int64_t chunk_base_stride = strides.back();
  int64_t chunk_numel = 1;  // elements in the old dims of the current chunk
  int64_t view_numel = 1;   // elements in the target dims assigned to it so far
  for (int64_t d = static_cast<int64_t>(shape.size()) - 1; d >= 0; --d) {
    chunk_numel *= shape[d];
    bool chunk_ends = d == 0 || (shape[d - 1] != 1 && strides[d - 1] != chunk_numel * chunk_base_stride);
    if (!chunk_ends) continue;
    while (view_d >= 0 && (view_numel < chunk_numel || target[view_d] == 1)) {
      result[view_d] = view_numel * chunk_base_stride;
      view_numel *= target[view_d];
      --view_d;
    }
    if (view_numel != chunk_numel) return std::nullopt;
    if (d > 0) {
      chunk_base_stride = strides[d - 1];
      chunk_numel = 1;
      view_numel = 1;
    }
  }
  if (view_d != -1) return std::nullopt;
  return result;
}
}  // namespace

Tensor Tensor::view(const Shape& requested) const {
  Shape shape = infer_shape(requested, numel(), "Tensor::view", *this);
  auto strides = view_strides(this->shape(), this->strides(), shape);
  RT_CHECK(strides.has_value(), "Tensor::view: cannot view ", describe(), " with strides ",
           shape_str(this->strides()), " as ", shape_str(shape),
           " without a copy; call reshape() (copies when needed) or contiguous() first");
  return make_view(shape, *strides, offset());
}

Tensor Tensor::reshape(const Shape& requested) const {
  Shape shape = infer_shape(requested, numel(), "Tensor::reshape", *this);
  if (auto strides = view_strides(this->shape(), this->strides(), shape))
    return make_view(shape, *strides, offset());
  return contiguous().view(shape);
}

Tensor Tensor::flatten(int64_t start_dim, int64_t end_dim) const {
  if (dim() == 0) return reshape({1});
  int64_t start = wrap_dim(start_dim, dim(), "Tensor::flatten");
  int64_t end = wrap_dim(end_dim, dim(), "Tensor::flatten");
  RT_CHECK(start <= end, "Tensor::flatten: start_dim ", start_dim, " is after end_dim ", end_dim);
  Shape shape(this->shape().begin(), this->shape().begin() + start);
  int64_t merged = 1;
  for (int64_t i = start; i <= end; ++i) merged *= this->shape()[i];
  shape.push_back(merged);
  shape.insert(shape.end(), this->shape().begin() + end + 1, this->shape().end());
  return reshape(shape);
}

Tensor Tensor::narrow(int64_t d, int64_t start, int64_t length) const {
  d = wrap_dim(d, dim(), "Tensor::narrow");
  int64_t n = shape()[d];
  if (start < 0) start += n;
  // `length <= n - start` rather than `start + length <= n`, which overflows for huge values.
  RT_CHECK(start >= 0 && start <= n && length >= 0 && length <= n - start, "Tensor::narrow: start ",
           start, " and length ", length, " are out of bounds for dim ", d, " of ", describe(),
           " (need 0 <= start <= ", n, " and start + length <= ", n, ")");
  Shape shape = this->shape();
  shape[d] = length;
  return make_view(shape, strides(), offset() + start * strides()[d]);
}

Tensor Tensor::slice(int64_t d, int64_t start, int64_t end, int64_t step) const {
  d = wrap_dim(d, dim(), "Tensor::slice");
  RT_CHECK(step > 0, "Tensor::slice: step must be positive, got ", step);
  int64_t n = shape()[d];
  if (start < 0) start += n;
  if (end < 0) end += n;
  start = std::clamp<int64_t>(start, 0, n);
  end = std::clamp<int64_t>(end, start, n);
  Shape shape = this->shape();
  Shape strides = this->strides();
  const int64_t span = end - start;
  shape[d] = span / step + (span % step != 0);  // ceil without overflowing span + step - 1
  // A dim of size <= 1 never steps, so its stride need not (and may not) be multiplied.
  if (shape[d] > 1)
    RT_CHECK(!__builtin_mul_overflow(strides[d], step, &strides[d]), "Tensor::slice: step ", step,
             " times stride ", this->strides()[d], " overflows int64 for ", describe());
  return make_view(shape, strides, offset() + start * this->strides()[d]);
}

Tensor Tensor::select(int64_t d, int64_t index) const {
  d = wrap_dim(d, dim(), "Tensor::select");
  int64_t n = shape()[d];
  if (index < 0) index += n;
  RT_CHECK(index >= 0 && index < n, "Tensor::select: index ", index, " is out of range for dim ", d,
           " of ", describe());
  Shape shape = this->shape();
  Shape strides = this->strides();
  int64_t new_offset = offset() + index * strides[d];
  shape.erase(shape.begin() + d);
  strides.erase(strides.begin() + d);
  return make_view(shape, strides, new_offset);
}

Tensor Tensor::transpose(int64_t d0, int64_t d1) const {
  if (dim() == 0) {  // as PyTorch: swapping dim 0 with itself, the tensor as is
    check_scalar_dim(d0, "Tensor::transpose");
    check_scalar_dim(d1, "Tensor::transpose");
    return *this;
  }
  d0 = wrap_dim(d0, dim(), "Tensor::transpose");
  d1 = wrap_dim(d1, dim(), "Tensor::transpose");
  Shape shape = this->shape();
  Shape strides = this->strides();
  std::swap(shape[d0], shape[d1]);
  std::swap(strides[d0], strides[d1]);
  return make_view(shape, strides, offset());
}

Tensor Tensor::permute(const std::vector<int64_t>& dims) const {
  RT_CHECK(static_cast<int64_t>(dims.size()) == dim(), "Tensor::permute: got ", dims.size(),
           " dims for ", describe());
  Shape shape(dims.size()), strides(dims.size());
  std::vector<bool> seen(dims.size(), false);
  for (size_t i = 0; i < dims.size(); ++i) {
    int64_t d = wrap_dim(dims[i], dim(), "Tensor::permute");
    RT_CHECK(!seen[d], "Tensor::permute: dim ", d, " repeated in ", shape_str(dims));
    seen[d] = true;
    shape[i] = this->shape()[d];
    strides[i] = this->strides()[d];
  }
  return make_view(shape, strides, offset());
}

Tensor Tensor::unsqueeze(int64_t d) const {
  d = wrap_dim(d, dim() + 1, "Tensor::unsqueeze");
  Shape shape = this->shape();
  Shape strides = this->strides();
  int64_t stride = d < dim() ? strides[d] * shape[d] : 1;
  shape.insert(shape.begin() + d, 1);
  strides.insert(strides.begin() + d, stride);
  return make_view(shape, strides, offset());
}

Tensor Tensor::squeeze(int64_t d) const {
  if (dim() == 0) {  // as PyTorch: nothing to squeeze, the tensor as is
    check_scalar_dim(d, "Tensor::squeeze");
    return *this;
  }
  d = wrap_dim(d, dim(), "Tensor::squeeze");
  if (shape()[d] != 1) return *this;
  Shape shape = this->shape();
  Shape strides = this->strides();
  shape.erase(shape.begin() + d);
  strides.erase(strides.begin() + d);
  return make_view(shape, strides, offset());
}

Tensor Tensor::expand(const Shape& requested) const {
  RT_CHECK(static_cast<int64_t>(requested.size()) >= dim(), "Tensor::expand: cannot expand ",
           describe(), " to fewer dims ", shape_str(requested));
  size_t lead = requested.size() - shape().size();
  // As PyTorch: -1 keeps an existing dim's size; new leading dims need an explicit size >= 0.
  Shape target = requested;
  for (size_t i = 0; i < target.size(); ++i) {
    if (target[i] == -1 && i >= lead) target[i] = shape()[i - lead];
    RT_CHECK(target[i] >= 0, "Tensor::expand: invalid size ", requested[i], " at dim ", i, " of ",
             shape_str(requested), " for ", describe(),
             i < lead ? " (a new leading dim needs a size >= 0; -1 only keeps an existing dim)"
                      : " (sizes must be >= 0, or -1 to keep the dim)");
  }
  shape_numel(target);  // throws when the element count does not fit in int64
  Shape strides(target.size(), 0);
  for (size_t i = 0; i < target.size(); ++i) {
    if (i < lead) continue;  // new leading dims broadcast with stride 0
    int64_t have = shape()[i - lead];
    if (have == target[i]) {
      strides[i] = this->strides()[i - lead];
    } else {
      RT_CHECK(have == 1, "Tensor::expand: cannot broadcast ", describe(), " to ", shape_str(target),
               " (dim ", i, " has size ", have, ", expected 1 or ", target[i], ")");
    }
  }
  return make_view(target, strides, offset());
}

std::vector<Tensor> Tensor::split_with_sizes(const std::vector<int64_t>& sizes, int64_t d) const {
  d = wrap_dim(d, dim(), "Tensor::split");
  int64_t total = 0;
  for (int64_t s : sizes) {
    RT_CHECK(s >= 0, "Tensor::split: negative split size ", s);
    RT_CHECK(!__builtin_add_overflow(total, s, &total), "Tensor::split: sizes ", shape_str(sizes),
             " sum to more than an int64 holds, but dim ", d, " of ", describe(), " has ", shape()[d]);
  }
  RT_CHECK(total == shape()[d], "Tensor::split: sizes ", shape_str(sizes), " sum to ", total,
           " but dim ", d, " of ", describe(), " has ", shape()[d]);
  std::vector<Tensor> parts;
  int64_t start = 0;
  for (int64_t s : sizes) {
    parts.push_back(narrow(d, start, s));
    start += s;
  }
  return parts;
}

std::vector<Tensor> Tensor::split(int64_t split_size, int64_t d) const {
  d = wrap_dim(d, dim(), "Tensor::split");
  RT_CHECK(split_size > 0, "Tensor::split: split_size must be positive, got ", split_size);
  std::vector<int64_t> sizes;
  const int64_t n = shape()[d];
  for (int64_t start = 0; start < n; start += std::min(split_size, n - start))  // never overflows
    sizes.push_back(std::min(split_size, n - start));
  if (sizes.empty()) sizes.push_back(0);
  return split_with_sizes(sizes, d);
}

std::vector<Tensor> Tensor::chunk(int64_t chunks, int64_t d) const {
  RT_CHECK(chunks > 0, "Tensor::chunk: chunks must be positive, got ", chunks);
  d = wrap_dim(d, dim(), "Tensor::chunk");
  int64_t n = shape()[d];
  int64_t size = std::max<int64_t>(n / chunks + (n % chunks != 0), 1);  // ceil, as torch.chunk
  return split(size, d);
}

// ------------------------------------------------------------------ copies

Tensor Tensor::t() const {
  RT_CHECK(dim() <= 2, "Tensor::t: expects a tensor with at most 2 dims, got ", describe(),
           "; use transpose(dim0, dim1) to swap two dims of a larger tensor");
  return dim() < 2 ? *this : transpose(0, 1);
}

Tensor& Tensor::copy_(const Tensor& src) {
  RT_CHECK(defined() && src.defined(), "Tensor::copy_: undefined tensor");
  Tensor source = src;
  if (src.shape() != shape()) {
    // Named here: expand()'s own error would name expand, which the caller never called.
    bool broadcasts = src.dim() <= dim();
    for (int64_t i = 1; broadcasts && i <= src.dim(); ++i)
      broadcasts = src.size(-i) == 1 || src.size(-i) == size(-i);
    RT_CHECK(broadcasts, "Tensor::copy_: cannot copy ", src.describe(), " into ", describe(),
             ": the source must have the destination's shape or broadcast to it; reshape() the source "
             "first");
    source = src.expand(shape());
  }
  if (numel() == 0) return *this;
  if (memory_overlap(*this, source) == MemoryOverlap::kSame) return *this;  // copying a view onto itself
  check_in_place(*this, source, "Tensor::copy_");
  bump_version();
  if (device() == source.device()) {
    (device().is_cuda() ? kernels::cuda::copy : kernels::cpu::copy)(*this, source);
    return *this;
  }
  // Across devices: make the source contiguous where it lives, move the bytes, then
  // convert/scatter on the destination device.
  Tensor packed = source.contiguous();
  Tensor staged = Tensor::empty(shape(), packed.dtype(), device());
  kernels::cuda::memcpy_bytes(staged.data_ptr(), device(), packed.data_ptr(), packed.device(),
                              packed.nbytes());
  (device().is_cuda() ? kernels::cuda::copy : kernels::cpu::copy)(*this, staged);
  return *this;
}

Tensor Tensor::contiguous() const {
  if (is_contiguous()) return *this;
  return clone();
}

Tensor Tensor::clone() const {
  Tensor out = Tensor::empty(shape(), dtype(), device());
  out.copy_(*this);
  return out;
}

Tensor Tensor::to(Device device) const { return to(device, dtype()); }
Tensor Tensor::to(DType dtype) const { return to(device(), dtype); }
Tensor Tensor::to(Device device, DType dtype) const {
  if (device == this->device() && dtype == this->dtype()) return *this;
  Tensor out = Tensor::empty(shape(), dtype, device);
  out.copy_(*this);
  return out;
}

namespace {
// A CPU tensor over caller-owned memory (not freed by the tensor).
Tensor wrap_host(const void* values, const Shape& shape, DType dtype) {
  auto storage = std::make_shared<Storage>(DataPtr(const_cast<void*>(values), [](void*) {}),
                                           static_cast<size_t>(shape_numel(shape)) * dtype_size(dtype),
                                           Device::cpu());
  return Tensor::from_storage(std::move(storage), shape, contiguous_strides(shape), 0, dtype);
}
}  // namespace

void copy_host_values_into(const Tensor& dst, const void* values, DType values_dtype) {
  Tensor target = dst;
  target.copy_(wrap_host(values, dst.shape(), values_dtype));
}

void copy_values_to_host(const Tensor& src, void* values, DType values_dtype) {
  Tensor target = wrap_host(values, src.shape(), values_dtype);
  target.copy_(src);
}

double Tensor::item() const { return item<double>(); }

// ------------------------------------------------------------------ printing

namespace {
constexpr int64_t kEdgeItems = 3;  // values shown at each end of a long dim

// One value: floats with 4 significant digits, integers exactly (V is double for the
// floating dtypes, int64_t for the integer ones: an int64 such as 2^53 + 1 has no double).
template <typename V>
void print_value(std::ostream& os, V v) {
  if constexpr (std::is_floating_point_v<V>) os << std::setprecision(4) << v; else os << v;
}

template <typename V>
void print_dim(std::ostream& os, const std::vector<V>& values, const Shape& shape,
               const Shape& strides, size_t d, int64_t base, int indent) {
  int64_t n = shape[d];
  os << "[";
  for (int64_t i = 0; i < n; ++i) {
    if (n > 2 * kEdgeItems && i == kEdgeItems) {
      os << (d + 1 == shape.size() ? "..., " : "...,\n" + std::string(indent + 1, ' '));
      i = n - kEdgeItems;
    }
    if (d + 1 == shape.size()) {
      print_value(os, values[base + i * strides[d]]);
    } else {
      print_dim(os, values, shape, strides, d + 1, base + i * strides[d], indent + 1);
    }
    if (i + 1 < n) os << (d + 1 == shape.size() ? ", " : ",\n" + std::string(indent + 1, ' '));
  }
  os << "]";
}

template <typename V>
void print_values(std::ostream& os, const Tensor& t) {
  std::vector<V> values = t.to_vector<V>();
  if (t.dim() == 0) {
    os << values[0];  // a scalar: floats at the stream's default precision (6 digits)
  } else if (t.numel() == 0) {
    os << "[]";
  } else {
    print_dim(os, values, t.shape(), contiguous_strides(t.shape()), 0, 0, 7);
  }
}
}  // namespace

std::string Tensor::str() const {
  if (!defined()) return "Tensor(undefined)";
  std::ostringstream os;
  os << "Tensor(";
  if (is_floating_point(dtype())) print_values<double>(os, *this); else print_values<int64_t>(os, *this);
  os << ", dtype=" << dtype_name(dtype()) << ", shape=" << shape_str(shape()) << ", device="
     << device() << ")";
  return os.str();
}

std::ostream& operator<<(std::ostream& os, const Tensor& t) { return os << t.str(); }

}  // namespace ringtrain
