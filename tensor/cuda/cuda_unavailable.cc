// cuda_unavailable.cc: the CUDA half of the tensor library for builds without CUDA.
//
// defines: everything declared in tensor/cuda/runtime.h and every
//          kernels::cuda:: function of tensor/kernels.h, for a build configured
//          with -DRINGTRAIN_CUDA=OFF (or AUTO on a machine without nvcc).
//          CMake compiles this file instead of runtime.cc, caching_allocator.cc
//          and the .cu files (CPU_ONLY_SOURCES in tensor/CMakeLists.txt).
//
// The rule: asking is fine, using is an error. is_available() is false,
// device_count() is 0, unavailable_reason() says why and how to fix it, and
// allocator_stats()/empty_cache() report an empty allocator, so code that
// only asks "is there a GPU?" (tests that skip, a Trainer choosing its device)
// runs unchanged. Anything that would need a GPU (a stream, an event record,
// a cuda:N allocation, a kernel) throws ringtrain::Error naming the operation
// and carrying the reason, never a crash and never a silent CPU fallback.
// Types keep the same copy/move rules as in the CUDA build; their handles stay
// null, so destructors have nothing to release.
#include <utility>

#include "tensor/checks.h"
#include "tensor/cuda/runtime.h"
#include "tensor/kernels.h"

namespace ringtrain::cuda {

namespace {
constexpr const char* kReason =
    "this build has no CUDA support (configure with -DRINGTRAIN_CUDA=ON on a machine with the "
    "CUDA toolkit)";

[[noreturn]] void no_cuda(const char* op) {
  throw Error(::ringtrain::detail::concat(op, ": cannot use CUDA: ", kReason));
}
}  // namespace

bool is_available() { return false; }
int device_count() { return 0; }
const char* unavailable_reason() { return kReason; }
void set_device(int) { no_cuda("cuda::set_device"); }
void synchronize_device(int) { no_cuda("cuda::synchronize_device"); }
bool has_primary_context(int) { return false; }

// ---------------------------------------------------------------- Stream

Stream Stream::default_stream(int) { no_cuda("Stream::default_stream"); }
Stream Stream::create(int, int) { no_cuda("Stream::create"); }
Stream Stream::borrowed(void* handle, int device) {
  Stream s;
  s.handle_ = handle;
  s.device_ = device;
  return s;
}
Stream::~Stream() = default;  // never owns a handle in this build
Stream::Stream(Stream&& other) noexcept
    : handle_(std::exchange(other.handle_, nullptr)),
      device_(other.device_),
      owned_(std::exchange(other.owned_, false)) {}
Stream& Stream::operator=(Stream&& other) noexcept {
  handle_ = std::exchange(other.handle_, nullptr);
  device_ = other.device_;
  owned_ = std::exchange(other.owned_, false);
  return *this;
}
Stream Stream::borrow() const { return borrowed(handle_, device_); }
void Stream::synchronize() const { no_cuda("Stream::synchronize"); }
bool Stream::query() const { no_cuda("Stream::query"); }
void Stream::wait(const Event&) const { no_cuda("Stream::wait"); }

// ---------------------------------------------------------------- Event

Event Event::create(int, bool) { no_cuda("Event::create"); }
Event::~Event() = default;
Event::Event(Event&& other) noexcept
    : handle_(std::exchange(other.handle_, nullptr)), device_(other.device_) {}
Event& Event::operator=(Event&& other) noexcept {
  handle_ = std::exchange(other.handle_, nullptr);
  device_ = other.device_;
  return *this;
}
void Event::record(const Stream&) { no_cuda("Event::record"); }
void Event::synchronize() const {}     // never recorded: complete, as in the CUDA build
bool Event::query() const { return true; }
float Event::elapsed_ms(const Event&) const { no_cuda("Event::elapsed_ms"); }

// ---------------------------------------------------------------- current stream

Stream current_stream(int) { no_cuda("cuda::current_stream"); }
void set_current_stream(const Stream&) { no_cuda("cuda::set_current_stream"); }
DeviceGuard::DeviceGuard(int) { no_cuda("cuda::DeviceGuard"); }
DeviceGuard::~DeviceGuard() = default;
QuietDeviceGuard::QuietDeviceGuard(int) noexcept {}  // ok() stays false
QuietDeviceGuard::~QuietDeviceGuard() = default;
StreamGuard::StreamGuard(const Stream&) { no_cuda("StreamGuard"); }
StreamGuard::~StreamGuard() = default;

// ---------------------------------------------------------------- allocator

DataPtr caching_allocate(size_t, int device) {
  throw Error(::ringtrain::detail::concat("cuda::caching_allocate: cannot allocate on cuda:", device,
                                          ": ", kReason));
}
void record_stream(void*, const Stream&) { no_cuda("cuda::record_stream"); }
DataPtr pinned_host_allocate(size_t) { no_cuda("cuda::pinned_host_allocate"); }
bool record_host_stream(const void*, const Stream&) { return false; }  // no pinned blocks exist
AllocatorStats allocator_stats(int) { return {}; }
void empty_cache() {}

}  // namespace ringtrain::cuda

namespace ringtrain::kernels::cuda {

namespace {
[[noreturn]] void no_cuda(const char* op) {
  throw Error(::ringtrain::detail::concat(op, ": cannot run on a CUDA device: ",
                                          ringtrain::cuda::unavailable_reason()));
}
}  // namespace

bool is_available() { return false; }
int device_count() { return 0; }

void copy(const Tensor&, const Tensor&) { no_cuda("cuda::copy"); }
void fill(const Tensor&, double) { no_cuda("cuda::fill"); }
void unary(UnaryOp op, const Tensor&, const Tensor&) {
  throw Error(::ringtrain::detail::concat("cuda::unary(", unary_op_name(op),
                                          "): cannot run on a CUDA device: ",
                                          ringtrain::cuda::unavailable_reason()));
}
void binary(BinaryOp op, const Tensor&, const Tensor&, const Tensor&) {
  throw Error(::ringtrain::detail::concat("cuda::binary(", binary_op_name(op),
                                          "): cannot run on a CUDA device: ",
                                          ringtrain::cuda::unavailable_reason()));
}
void binary_scalar(BinaryOp op, const Tensor&, double, const Tensor&) {
  throw Error(::ringtrain::detail::concat("cuda::binary_scalar(", binary_op_name(op),
                                          "): cannot run on a CUDA device: ",
                                          ringtrain::cuda::unavailable_reason()));
}
void axpy(double, const Tensor&, const Tensor&) {
  throw Error(::ringtrain::detail::concat("cuda::axpy: cannot run on a CUDA device: ",
                                          ringtrain::cuda::unavailable_reason()));
}
void where(const Tensor&, const Tensor&, const Tensor&, const Tensor&) { no_cuda("cuda::where"); }
void reduce(ReduceOp, const Tensor&, const std::vector<bool>&, const Tensor&) {
  no_cuda("cuda::reduce");
}
void max_along(const Tensor&, int64_t, const Tensor&, const Tensor&) { no_cuda("cuda::max_along"); }
void batched_matmul(const Tensor&, const Tensor&, const Tensor&) {
  no_cuda("cuda::batched_matmul");
}
void conv2d(const Tensor&, const Tensor&, const Tensor&, const Conv2dParams&, const Tensor&) {
  no_cuda("cuda::conv2d");
}
void conv2d_backward_input(const Tensor&, const Tensor&, const Conv2dParams&, const Tensor&) {
  no_cuda("cuda::conv2d_backward_input");
}
void conv2d_backward_weight(const Tensor&, const Tensor&, const Conv2dParams&, const Tensor&) {
  no_cuda("cuda::conv2d_backward_weight");
}
void max_pool2d(const Tensor&, const Pool2dParams&, const Tensor&, const Tensor&) {
  no_cuda("cuda::max_pool2d");
}
void max_pool2d_backward(const Tensor&, const Tensor&, const Tensor&) {
  no_cuda("cuda::max_pool2d_backward");
}
void avg_pool2d(const Tensor&, const Pool2dParams&, const Tensor&) { no_cuda("cuda::avg_pool2d"); }
void avg_pool2d_backward(const Tensor&, const Pool2dParams&, const Tensor&) {
  no_cuda("cuda::avg_pool2d_backward");
}
void softmax(const Tensor&, int64_t, bool, const Tensor&) { no_cuda("cuda::softmax"); }
void softmax_backward(const Tensor&, const Tensor&, int64_t, bool, const Tensor&) {
  no_cuda("cuda::softmax_backward");
}
void gather(const Tensor&, int64_t, const Tensor&, const Tensor&) { no_cuda("cuda::gather"); }
void index_select(const Tensor&, int64_t, const Tensor&, const Tensor&) {
  no_cuda("cuda::index_select");
}
void index_add(const Tensor&, int64_t, const Tensor&, const Tensor&) { no_cuda("cuda::index_add"); }
bool all_finite(const Tensor&) { no_cuda("cuda::all_finite"); }
void memcpy_bytes(void*, Device dst_device, const void*, Device src_device, size_t n) {
  throw Error(::ringtrain::detail::concat("cuda::memcpy_bytes: cannot copy ", n, " bytes from ",
                                          src_device.str(), " to ", dst_device.str(), ": ",
                                          ringtrain::cuda::unavailable_reason()));
}

}  // namespace ringtrain::kernels::cuda
