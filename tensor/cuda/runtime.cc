// runtime.cc: CUDA devices, streams, events and the per-thread current stream.
//
// defines: everything in tensor/cuda/runtime.h except the caching allocator
//          (tensor/cuda/caching_allocator.cc), for builds with CUDA.
//
// Availability. The first question every caller asks is "is there a GPU?". On
// a machine with the toolkit but no driver (CI, the developers' machines),
// cudaGetDeviceCount fails with "CUDA driver version is insufficient"; on a
// machine with a driver and no device it returns cudaErrorNoDevice. Both read as
// "not available", the runtime's message is kept for skip messages, and the
// sticky error state is cleared so later calls are not poisoned. The probe runs
// once per process (std::call_once): the answer cannot change while we run.
//
// Streams. A Stream either owns its cudaStream_t (Stream::create, destroyed by
// the destructor) or borrows one (default_stream, borrow, borrowed, and every
// Stream returned by current_stream). Owned streams are non-blocking
// (cudaStreamNonBlocking), so they never serialise against the legacy default
// stream; ordering between streams is always explicit, with events.
//
// Current stream. Each host thread has, for each device, the stream that ops
// launch on. It is a thread_local table of raw handles (nullptr = the legacy
// default stream), so setting it costs nothing and threads never race on it.
// The table does not own the streams: whoever called set_current_stream keeps
// the owning Stream alive (StreamGuard makes that a scope).
//
// Devices. DeviceGuard sets a device for a scope and restores the previous one
// only if that device already has a context (see runtime.h). Whether it has one
// is a driver question (cuDevicePrimaryCtxGetState); the runtime API has no
// equivalent, and linking libcuda directly would stop our binaries from even
// loading on machines without a driver, so the two driver functions are looked
// up at run time through cudaGetDriverEntryPointByVersion.
//
// Events. An Event is created lazily on its first record() when it was
// default-constructed, like PyTorch's: that lets code hold an Event member
// without knowing the device up front. An event never recorded counts as
// complete (query() true, synchronize() returns at once).
#include <cuda_runtime.h>

#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "tensor/checks.h"
#include "tensor/cuda/internal.cuh"
#include "tensor/cuda/runtime.h"
#include "tensor/kernels.h"

namespace ringtrain::cuda {

namespace {

struct Probe {
  int count = 0;
  std::string reason;  // empty when at least one device is usable
};

const Probe& probe() {
  static Probe result;
  static std::once_flag once;
  std::call_once(once, [] {
    int count = 0;
    cudaError_t status = cudaGetDeviceCount(&count);
    if (status != cudaSuccess) {
      result.reason = std::string("the CUDA runtime reports: ") + cudaGetErrorString(status) +
                      " (no usable GPU/driver on this machine)";
      (void)cudaGetLastError();  // clear the error so later calls are not poisoned
      result.count = 0;
    } else if (count == 0) {
      result.reason = "the CUDA runtime found no CUDA devices";
    } else {
      result.count = count;
    }
  });
  return result;
}

// This thread's current stream per device; index = device ordinal.
std::vector<void*>& current_streams() {
  thread_local std::vector<void*> streams;
  return streams;
}

void check_device(int device, const char* op) { detail::require_cuda(op, device); }

// The driver's cuDeviceGet and cuDevicePrimaryCtxGetState (CUdevice is an int and
// CUresult an enum whose success is 0), looked up once.
struct DriverContextQuery {
  using DeviceGetFn = int (*)(int* device, int ordinal);
  using PrimaryCtxGetStateFn = int (*)(int device, unsigned int* flags, int* active);
  DeviceGetFn device_get = nullptr;
  PrimaryCtxGetStateFn primary_ctx_get_state = nullptr;
};

const DriverContextQuery& driver_context_query() {
  static DriverContextQuery query;
  static std::once_flag once;
  std::call_once(once, [] {
    void* device_get = nullptr;
    void* get_state = nullptr;
    auto lookup = [](const char* symbol, void** fn) {
      cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
#if CUDART_VERSION >= 12050
      const cudaError_t status =
          cudaGetDriverEntryPointByVersion(symbol, fn, 12000, cudaEnableDefault, &found);
#else  // the by-version lookup came with CUDA 12.5
      const cudaError_t status = cudaGetDriverEntryPoint(symbol, fn, cudaEnableDefault, &found);
#endif
      return status == cudaSuccess && found == cudaDriverEntryPointSuccess;
    };
    if (!lookup("cuDeviceGet", &device_get) || !lookup("cuDevicePrimaryCtxGetState", &get_state)) {
      (void)cudaGetLastError();
      return;  // unknown: has_primary_context answers true, the old safe behaviour
    }
    query.device_get = reinterpret_cast<DriverContextQuery::DeviceGetFn>(device_get);
    query.primary_ctx_get_state =
        reinterpret_cast<DriverContextQuery::PrimaryCtxGetStateFn>(get_state);
  });
  return query;
}

}  // namespace

bool is_available() { return probe().count > 0; }
int device_count() { return probe().count; }
const char* unavailable_reason() {
  const Probe& p = probe();
  return p.count > 0 ? "" : p.reason.c_str();
}

void set_device(int index) {
  check_device(index, "cuda::set_device");
  CUDA_CHECK(cudaSetDevice(index));
}

bool has_primary_context(int device) {
  if (!is_available() || device < 0 || device >= device_count()) return false;
  const DriverContextQuery& driver = driver_context_query();
  // Without the driver functions we cannot tell; "yes" keeps restoring the device.
  if (driver.primary_ctx_get_state == nullptr) return true;
  int handle = 0;
  unsigned int flags = 0;
  int active = 0;
  if (driver.device_get(&handle, device) != 0) return true;
  if (driver.primary_ctx_get_state(handle, &flags, &active) != 0) return true;
  return active != 0;
}

void synchronize_device(int index) {
  check_device(index, "cuda::synchronize_device");
  detail::DeviceGuard guard(index);
  CUDA_CHECK(cudaDeviceSynchronize());
}

// ---------------------------------------------------------------- Stream

Stream Stream::default_stream(int device) {
  check_device(device, "Stream::default_stream");
  return borrowed(nullptr, device);
}

Stream Stream::borrowed(void* handle, int device) {
  Stream s;
  s.handle_ = handle;
  s.device_ = device;
  s.owned_ = false;
  return s;
}

Stream Stream::create(int device, int priority) {
  check_device(device, "Stream::create");
  detail::DeviceGuard guard(device);
  cudaStream_t raw = nullptr;
  CUDA_CHECK(cudaStreamCreateWithPriority(&raw, cudaStreamNonBlocking, priority));
  Stream s;
  s.handle_ = raw;
  s.device_ = device;
  s.owned_ = true;
  return s;
}

Stream::~Stream() {
  // Destroying a stream with queued work is fine: CUDA releases it once the work drains.
  if (owned_ && handle_ != nullptr) (void)cudaStreamDestroy(static_cast<cudaStream_t>(handle_));
}

Stream::Stream(Stream&& other) noexcept
    : handle_(std::exchange(other.handle_, nullptr)),
      device_(other.device_),
      owned_(std::exchange(other.owned_, false)) {}

Stream& Stream::operator=(Stream&& other) noexcept {
  if (this != &other) {
    if (owned_ && handle_ != nullptr) (void)cudaStreamDestroy(static_cast<cudaStream_t>(handle_));
    handle_ = std::exchange(other.handle_, nullptr);
    device_ = other.device_;
    owned_ = std::exchange(other.owned_, false);
  }
  return *this;
}

Stream Stream::borrow() const { return borrowed(handle_, device_); }

void Stream::synchronize() const {
  detail::DeviceGuard guard(device_);
  CUDA_CHECK(cudaStreamSynchronize(static_cast<cudaStream_t>(handle_)));
}

bool Stream::query() const {
  detail::DeviceGuard guard(device_);
  cudaError_t status = cudaStreamQuery(static_cast<cudaStream_t>(handle_));
  if (status == cudaErrorNotReady) {
    (void)cudaGetLastError();  // "not ready" is an answer, not an error
    return false;
  }
  CUDA_CHECK(status);
  return true;
}

void Stream::wait(const Event& event) const {
  if (event.handle() == nullptr) return;  // never recorded: nothing to wait for
  detail::DeviceGuard guard(device_);
  CUDA_CHECK(cudaStreamWaitEvent(static_cast<cudaStream_t>(handle_),
                                 static_cast<cudaEvent_t>(event.handle()), 0));
}

// ---------------------------------------------------------------- Event

Event Event::create(int device, bool enable_timing) {
  check_device(device, "Event::create");
  detail::DeviceGuard guard(device);
  cudaEvent_t raw = nullptr;
  CUDA_CHECK(cudaEventCreateWithFlags(&raw, enable_timing ? cudaEventDefault
                                                          : cudaEventDisableTiming));
  Event e;
  e.handle_ = raw;
  e.device_ = device;
  return e;
}

Event::~Event() {
  if (handle_ != nullptr) (void)cudaEventDestroy(static_cast<cudaEvent_t>(handle_));
}

Event::Event(Event&& other) noexcept
    : handle_(std::exchange(other.handle_, nullptr)), device_(other.device_) {}

Event& Event::operator=(Event&& other) noexcept {
  if (this != &other) {
    if (handle_ != nullptr) (void)cudaEventDestroy(static_cast<cudaEvent_t>(handle_));
    handle_ = std::exchange(other.handle_, nullptr);
    device_ = other.device_;
  }
  return *this;
}

void Event::record(const Stream& stream) {
  if (handle_ == nullptr) *this = Event::create(stream.device(), /*enable_timing=*/false);
  RT_CHECK(device_ == stream.device(), "Event::record: the event belongs to cuda:", device_,
           " but the stream to cuda:", stream.device(), "; create the event on the stream's device");
  detail::DeviceGuard guard(device_);
  CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(handle_),
                             static_cast<cudaStream_t>(stream.handle())));
}

void Event::synchronize() const {
  if (handle_ == nullptr) return;
  CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(handle_)));
}

bool Event::query() const {
  if (handle_ == nullptr) return true;
  cudaError_t status = cudaEventQuery(static_cast<cudaEvent_t>(handle_));
  if (status == cudaErrorNotReady) {
    (void)cudaGetLastError();
    return false;
  }
  CUDA_CHECK(status);
  return true;
}

float Event::elapsed_ms(const Event& end) const {
  RT_CHECK(handle_ != nullptr && end.handle_ != nullptr,
           "Event::elapsed_ms: both events must have been recorded (created with enable_timing)");
  float ms = 0.0f;
  CUDA_CHECK(cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(handle_),
                                  static_cast<cudaEvent_t>(end.handle_)));
  return ms;
}

// ---------------------------------------------------------------- current stream

Stream current_stream(int device) {
  check_device(device, "cuda::current_stream");
  std::vector<void*>& table = current_streams();
  void* handle = static_cast<size_t>(device) < table.size() ? table[device] : nullptr;
  return Stream::borrowed(handle, device);
}

void set_current_stream(const Stream& stream) {
  check_device(stream.device(), "cuda::set_current_stream");
  std::vector<void*>& table = current_streams();
  if (table.size() <= static_cast<size_t>(stream.device())) table.resize(stream.device() + 1, nullptr);
  table[stream.device()] = stream.handle();
}

DeviceGuard::DeviceGuard(int index) {
  CUDA_CHECK(cudaGetDevice(&previous_));
  if (previous_ != index) CUDA_CHECK(cudaSetDevice(index));
  current_ = index;
}

DeviceGuard::~DeviceGuard() {
  // A destructor must not throw; restoring can only fail if the runtime is gone.
  if (previous_ != current_ && has_primary_context(previous_)) (void)cudaSetDevice(previous_);
}

QuietDeviceGuard::QuietDeviceGuard(int index) noexcept {
  if (cudaGetDevice(&previous_) != cudaSuccess) {
    (void)cudaGetLastError();
    return;
  }
  ok_ = previous_ == index || cudaSetDevice(index) == cudaSuccess;
  if (!ok_) (void)cudaGetLastError();
  current_ = ok_ ? index : previous_;
}

QuietDeviceGuard::~QuietDeviceGuard() {
  if (previous_ != current_ && has_primary_context(previous_)) (void)cudaSetDevice(previous_);
}

StreamGuard::StreamGuard(const Stream& stream) : device_(stream.device()) {
  previous_ = current_stream(device_).handle();
  set_current_stream(stream);
}

StreamGuard::~StreamGuard() {
  // The table was sized by the constructor's set_current_stream; restoring cannot fail.
  current_streams()[device_] = previous_;
}

}  // namespace ringtrain::cuda

// The kernel table's view of availability (tensor/kernels.h) is the runtime's.
namespace ringtrain::kernels::cuda {
bool is_available() { return ringtrain::cuda::is_available(); }
int device_count() { return ringtrain::cuda::device_count(); }
}  // namespace ringtrain::kernels::cuda
