// cuda_runtime_test.cc: the CUDA runtime pieces: availability, copies between
// host and device, streams and events, and the caching allocator.
//
// What is checked:
//  * host <-> device round trips for every dtype pair (conversion on the GPU),
//    non-contiguous views on both sides, copy_ into strided GPU views;
//  * streams: StreamGuard sets and restores the current stream; work on one
//    stream ordered after another with Event::record + Stream::wait (no host
//    sync) sees the first stream's results; timing events measure something;
//  * the caching allocator: a freed block is reused on its stream, blocks are
//    not shared across streams, record_stream defers reuse of a block another
//    stream read until that stream is done, and a training-like loop (forward, backward-ish
//    matmuls, reductions, a loss read back to the host) performs no cudaMalloc
//    after its warm-up iterations; pinned host buffers are cached too, and one
//    freed while an async copy on another stream may still read it is not
//    handed out again before that copy ran;
//  * contexts: has_primary_context tells whether a GPU was used, and neither
//    DeviceGuard nor a pinned allocation on a fresh thread leaves a context on
//    a GPU the process never used (two GPUs);
//  * clear errors: a nonexistent device index, mixing devices.
// Without a usable GPU the GPU tests skip with the runtime's reason, and one
// test checks instead that GPU requests fail with that reason.
//
// Label: cuda.
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#if RINGTRAIN_TEST_HAS_CUDA
#include <cuda_runtime.h>
#endif

#include "tensor/storage.h"
#include "tests/tensor/cuda_test_util.h"

namespace ringtrain {
namespace {

using namespace ref;
using cuda_test::CudaTest;
using cuda_test::expect_matches_cpu;
using cuda_test::kCuda;
using cuda_test::kFloatTypes;

const DType kAllTypes[] = {DType::kFloat32, DType::kFloat64, DType::kFloat16,
                           DType::kBFloat16, DType::kInt32, DType::kInt64};

#if RINGTRAIN_TEST_HAS_CUDA
// Holds a stream at a host callback until release(): work queued behind it waits
// for as long as the test needs, deterministically (a long kernel only probably would).
class StreamBlocker {
 public:
  explicit StreamBlocker(const cuda::Stream& stream) {
    EXPECT_EQ(cudaLaunchHostFunc(static_cast<cudaStream_t>(stream.handle()), &StreamBlocker::hold, this),
              cudaSuccess);
  }
  // Releases the stream and waits (at most 30 s) until the callback has returned, so
  // the callback never touches a destroyed blocker (an ASSERT may end the test early).
  ~StreamBlocker() {
    release();
    std::unique_lock<std::mutex> lock(mutex_);
    changed_.wait_for(lock, std::chrono::seconds(30), [&] { return finished_; });
  }
  StreamBlocker(const StreamBlocker&) = delete;
  StreamBlocker& operator=(const StreamBlocker&) = delete;
  void release() {
    std::lock_guard<std::mutex> lock(mutex_);
    released_ = true;
    changed_.notify_all();
  }

 private:
  // Runs on a CUDA thread: must not call CUDA. It waits for the test thread only,
  // which never waits for this stream while the blocker holds it.
  static void CUDART_CB hold(void* self) {
    auto* blocker = static_cast<StreamBlocker*>(self);
    std::unique_lock<std::mutex> lock(blocker->mutex_);
    blocker->changed_.wait(lock, [&] { return blocker->released_; });
    blocker->finished_ = true;
    blocker->changed_.notify_all();
  }
  std::mutex mutex_;
  std::condition_variable changed_;
  bool released_ = false;
  bool finished_ = false;
};
#endif

// ---------------------------------------------------------------- without a GPU

TEST(CudaUnavailable, GpuRequestsFailWithTheReason) {
  if (cuda::is_available()) GTEST_SKIP() << "a GPU is usable here; this test covers machines without one";
  std::string reason = cuda::unavailable_reason();
  EXPECT_FALSE(reason.empty());
  EXPECT_EQ(cuda::device_count(), 0);
  EXPECT_FALSE(kernels::cuda::is_available());
  EXPECT_TRUE(throws_with([] { Tensor::empty({2}, DType::kFloat32, Device::cuda()); }, {reason}));
  EXPECT_TRUE(throws_with([] { ones({2}).to(Device::cuda()); }, {reason}));
  EXPECT_TRUE(throws_with([] { cuda::Stream::create(0); }, {"Stream::create", reason}));
  EXPECT_THROW({ cuda::DeviceGuard on_gpu(0); }, Error);  // the CPU build names the reason, CUDA's cudaGetDevice
  cuda::QuietDeviceGuard quiet(0);  // must not throw: it runs in destructors and abort paths
  EXPECT_FALSE(quiet.ok());
  // Asking is fine: the allocator reports nothing held.
  EXPECT_EQ(cuda::allocator_stats(0).cuda_malloc_calls, 0u);
  // Pinned host memory falls back to ordinary aligned memory.
  DataPtr host = allocate_pinned_host_bytes(4096);
  ASSERT_NE(host.get(), nullptr);
  std::memset(host.get(), 1, 4096);
}

// ---------------------------------------------------------------- copies

TEST_F(CudaTest, RoundTripsEveryDtypePairThroughTheGpu) {
  uint64_t seed = 1;
  for (DType from : kAllTypes) {
    for (DType to : kAllTypes) {
      SCOPED_TRACE(std::string(dtype_name(from)) + " -> " + dtype_name(to));
      Tensor host = random_tensor({3, 17}, from, ++seed, -40, 40);
      Tensor gpu = host.to(kCuda, to);  // H2D then convert on the device
      ASSERT_TRUE(gpu.device().is_cuda());
      EXPECT_TRUE(expect_matches_cpu(gpu, host.to(to), {0, 0}));
      EXPECT_TRUE(expect_equal(gpu.to(Device::cpu()), to_ref(host.to(to))));
    }
  }
}

TEST_F(CudaTest, NonContiguousViewsCopyBothWays) {
  uint64_t seed = 50;
  for (DType dtype : kAllTypes) {
    for (Layout layout : kAllLayouts) {
      SCOPED_TRACE(cuda_test::trace(dtype, {4, 5, 6}, layout));
      Tensor host = random_view({4, 5, 6}, dtype, ++seed, layout, -9, 9);
      Tensor gpu = host.to(kCuda);
      EXPECT_TRUE(expect_equal(gpu, to_ref(host)));
      Tensor gpu_view = random_view({4, 5, 6}, dtype, ++seed, layout, -9, 9, kCuda);
      EXPECT_TRUE(expect_equal(gpu_view.to(Device::cpu()), to_ref(gpu_view)));
      // copy_ from the host into a strided device view, and device to device into another.
      Tensor target = zeros({6, 5, 4}, dtype, kCuda).permute({2, 1, 0});
      target.copy_(host);
      EXPECT_TRUE(expect_equal(target, to_ref(host)));
      Tensor target2 = zeros({4, 5, 6}, dtype, kCuda).transpose(0, 2).transpose(0, 2);
      target2.copy_(gpu_view);
      EXPECT_TRUE(expect_equal(target2, to_ref(gpu_view)));
      std::vector<double> values = gpu_view.to_vector<double>();
      EXPECT_EQ(values, to_ref(gpu_view).data);
    }
  }
}

TEST_F(CudaTest, MemcpyBytesCoversEveryDirection) {
  std::vector<float> src(1000);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<float>(i) * 0.5f;
  size_t bytes = src.size() * sizeof(float);
  DataPtr d1 = cuda::caching_allocate(bytes, 0);
  DataPtr d2 = cuda::caching_allocate(bytes, 0);
  std::vector<float> back(src.size(), -1.0f);
  kernels::cuda::memcpy_bytes(d1.get(), kCuda, src.data(), Device::cpu(), bytes);
  kernels::cuda::memcpy_bytes(d2.get(), kCuda, d1.get(), kCuda, bytes);
  kernels::cuda::memcpy_bytes(back.data(), Device::cpu(), d2.get(), kCuda, bytes);  // synchronous
  EXPECT_EQ(back, src);
  if (cuda::device_count() >= 2) {
    Tensor a = random_tensor({1000}, DType::kFloat32, 3, -1, 1, kCuda);
    Tensor b = a.to(Device::cuda(1));
    EXPECT_EQ(b.device(), Device::cuda(1));
    EXPECT_TRUE(expect_equal(b, to_ref(a)));
  }
}

TEST_F(CudaTest, QuietDeviceGuardSaysWhetherItCouldSetTheDevice) {
  {
    cuda::QuietDeviceGuard on_gpu(0);
    EXPECT_TRUE(on_gpu.ok());
  }
  // A device that does not exist: no throw (it guards destructors and abort paths),
  // ok() is false, and the thread can still use its GPU afterwards.
  {
    cuda::QuietDeviceGuard missing(cuda::device_count());
    EXPECT_FALSE(missing.ok());
  }
  EXPECT_EQ(ones({3}, DType::kFloat32, kCuda).to_vector<float>(), (std::vector<float>{1, 1, 1}));
}

// ---------------------------------------------------------------- streams and events

TEST_F(CudaTest, StreamGuardSetsAndRestoresTheCurrentStream) {
  void* before = cuda::current_stream(0).handle();
  cuda::Stream s = cuda::Stream::create(0);
  ASSERT_NE(s.handle(), nullptr);
  {
    cuda::StreamGuard guard(s);
    EXPECT_EQ(cuda::current_stream(0).handle(), s.handle());
    cuda::Stream inner = cuda::Stream::create(0);
    {
      cuda::StreamGuard guard2(inner);
      EXPECT_EQ(cuda::current_stream(0).handle(), inner.handle());
    }
    EXPECT_EQ(cuda::current_stream(0).handle(), s.handle());
  }
  EXPECT_EQ(cuda::current_stream(0).handle(), before);
  // Move leaves the source empty; borrow does not own.
  cuda::Stream moved = std::move(s);
  EXPECT_EQ(s.handle(), nullptr);  // NOLINT(bugprone-use-after-move): checking the moved-from state
  cuda::Stream view = moved.borrow();
  EXPECT_EQ(view.handle(), moved.handle());
}

TEST_F(CudaTest, EventOrdersWorkAcrossStreamsWithoutHostSync) {
  cuda::Stream producer = cuda::Stream::create(0);
  cuda::Stream consumer = cuda::Stream::create(0);
  Tensor x;
  cuda::Event ready;
  {
    cuda::StreamGuard guard(producer);
    x = zeros({1 << 22}, DType::kFloat32, kCuda);
    // A few passes over 16 MiB so the producer is still busy when the consumer is queued.
    for (int i = 0; i < 8; ++i) add_(x, ones({1 << 22}, DType::kFloat32, kCuda), 1.0);
    ready.record(producer);
  }
  Tensor y;
  {
    cuda::StreamGuard guard(consumer);
    consumer.wait(ready);
    y = mul(x, 2.0);
    consumer.synchronize();
    // x must stay alive until the producer is done with it; it is: we hold it until here.
  }
  EXPECT_TRUE(ready.query());
  EXPECT_TRUE(expect_close(y, RefTensor({1 << 22}, 16.0), {0, 0}));
  producer.synchronize();
}

TEST_F(CudaTest, TimingEventsMeasureElapsedTime) {
  cuda::Stream s = cuda::Stream::create(0);
  cuda::Event start = cuda::Event::create(0, /*enable_timing=*/true);
  cuda::Event stop = cuda::Event::create(0, /*enable_timing=*/true);
  cuda::StreamGuard guard(s);
  start.record(s);
  Tensor a = ones({512, 512}, DType::kFloat32, kCuda);
  Tensor b = matmul(a, a);
  stop.record(s);
  stop.synchronize();
  EXPECT_TRUE(stop.query());
  EXPECT_GE(start.elapsed_ms(stop), 0.0f);
  EXPECT_TRUE(expect_close(b, RefTensor({512, 512}, 512.0), {0, 0}));
  // A default-constructed event is "complete" and waiting on it is a no-op.
  cuda::Event never;
  EXPECT_TRUE(never.query());
  s.wait(never);
}

// ---------------------------------------------------------------- caching allocator

TEST_F(CudaTest, FreedBlocksAreReusedOnTheirStream) {
  { DataPtr warm = cuda::caching_allocate(1000, 0); }  // make sure a cached block exists
  cuda::AllocatorStats before = cuda::allocator_stats(0);
  void* freed = nullptr;
  {
    DataPtr p = cuda::caching_allocate(1000, 0);  // same size class, same stream: from the cache
    freed = p.get();
  }
  cuda::AllocatorStats after = cuda::allocator_stats(0);
  EXPECT_EQ(after.cuda_malloc_calls, before.cuda_malloc_calls);
  EXPECT_EQ(after.cache_hits, before.cache_hits + 1);
  EXPECT_EQ(after.allocations, before.allocations + 1);
  EXPECT_EQ(after.bytes_in_use, before.bytes_in_use);
  // A block freed on the default stream is never handed to another stream: its
  // kernels may still be queued, and only its own stream is ordered after them.
  cuda::Stream other = cuda::Stream::create(0);
  {
    cuda::StreamGuard guard(other);
    DataPtr there = cuda::caching_allocate(1000, 0);
    EXPECT_NE(there.get(), freed);
  }
  // Split blocks: two small requests come out of one 2 MiB segment.
  DataPtr a = cuda::caching_allocate(4096, 0);
  DataPtr b = cuda::caching_allocate(4096, 0);
  EXPECT_NE(a.get(), b.get());
  cuda::AllocatorStats stats = cuda::allocator_stats(0);
  EXPECT_GE(stats.bytes_reserved, stats.bytes_in_use);
  EXPECT_GE(stats.bytes_in_use, 4096u * 2);
}

TEST_F(CudaTest, RecordStreamDefersReuseUntilTheOtherStreamFinishes) {
  cuda::Stream comm = cuda::Stream::create(0);
  size_t baseline = cuda::allocator_stats(0).bytes_in_use;
  void* ptr = nullptr;
  {
    Tensor grad = ones({1 << 20}, DType::kFloat32, kCuda);  // allocated on the default stream
    ptr = grad.storage()->data();
    Tensor total;
    {
      cuda::StreamGuard guard(comm);
      comm.wait([&] {
        cuda::Event e;
        e.record(cuda::Stream::default_stream(0));
        return e;
      }());
      total = zeros({1 << 20}, DType::kFloat32, kCuda);
      for (int i = 0; i < 16; ++i) add_(total, grad);  // the comm stream reads grad
    }
    cuda::record_stream(ptr, comm);
    cuda::record_stream(ptr, comm);  // idempotent
    // grad is dropped here while the comm stream may still be reading it.
  }
  comm.synchronize();
  cuda::AllocatorStats before = cuda::allocator_stats(0);
  {
    Tensor again = ones({1 << 20}, DType::kFloat32, kCuda);  // the pending block is released first
    EXPECT_EQ(cuda::allocator_stats(0).cuda_malloc_calls, before.cuda_malloc_calls);
  }
  EXPECT_EQ(cuda::allocator_stats(0).bytes_in_use, baseline);
  int bogus = 0;
  EXPECT_TRUE(throws_with([&] { cuda::record_stream(&bogus, comm); }, {"record_stream"}));
}

TEST_F(CudaTest, TrainingLikeLoopMakesNoCudaMallocAfterWarmup) {
  Generator gen(7);
  Tensor w1 = mul(randn({256, 128}, gen, DType::kFloat32, kCuda), 0.05);
  Tensor w2 = mul(randn({10, 256}, gen, DType::kFloat32, kCuda), 0.05);
  Tensor k1 = mul(randn({4, 1, 3, 3}, gen, DType::kFloat32, kCuda), 0.3);
  auto step = [&](int iteration) {
    Generator batch_gen(100 + iteration);
    Tensor x = randn({64, 128}, batch_gen, DType::kFloat32, kCuda);
    Tensor targets = random_index({64}, 10, 200 + iteration, kCuda);
    // forward
    Tensor h = relu(linear(x, w1, Tensor()));
    Tensor logits = linear(h, w2, Tensor());
    Tensor loss = cross_entropy(logits, targets);
    // backward by hand: d logits = softmax - one_hot, then the two weight grads
    Tensor dlogits = div(sub(softmax(logits, 1), one_hot(targets, 10)), 64.0);
    Tensor dw2 = matmul(dlogits.t(), h);
    Tensor dh = mul(matmul(dlogits, w2), gt(h, 0.0));
    Tensor dw1 = matmul(dh.t(), x);
    EXPECT_TRUE(all_finite(dw1));
    add_(w1, dw1, -0.1);
    add_(w2, dw2, -0.1);
    // A small conv layer too: cuDNN workspaces come from the cache as well.
    Conv2dParams same{1, 1, 1, 1};
    Tensor img = randn({8, 1, 12, 12}, batch_gen, DType::kFloat32, kCuda);
    Tensor feat = relu(conv2d(img, k1, Tensor(), same));
    auto [pooled, max_at] = max_pool2d(feat, Pool2dParams{});
    Tensor gfeat = max_pool2d_backward(ones_like(pooled), max_at, feat.shape());
    Tensor gk = conv2d_backward_weight(gfeat, img, k1.shape(), same);
    Tensor gimg = conv2d_backward_input(gfeat, k1, img.shape(), same);
    EXPECT_TRUE(all_finite(gimg));
    add_(k1, gk, -0.001);
    return loss.item();
  };
  for (int i = 0; i < 3; ++i) step(i);  // warm-up: the cache fills
  cuda::AllocatorStats warm = cuda::allocator_stats(0);
  double first_loss = 0, last_loss = 0;
  for (int i = 3; i < 13; ++i) {
    double loss = step(i);
    if (i == 3) first_loss = loss;
    last_loss = loss;
  }
  cuda::AllocatorStats after = cuda::allocator_stats(0);
  EXPECT_EQ(after.cuda_malloc_calls, warm.cuda_malloc_calls)
      << "the allocator called cudaMalloc after warm-up";
  EXPECT_GT(after.cache_hits, warm.cache_hits);
  EXPECT_EQ(after.bytes_in_use, warm.bytes_in_use) << "a step leaked device memory";
  EXPECT_TRUE(std::isfinite(first_loss) && std::isfinite(last_loss));
}

TEST_F(CudaTest, EmptyCacheReturnsFreeSegments) {
  {
    DataPtr big = cuda::caching_allocate(size_t{64} << 20, 0);
    ASSERT_NE(big.get(), nullptr);
  }
  cuda::synchronize_device(0);
  cuda::AllocatorStats cached = cuda::allocator_stats(0);
  cuda::empty_cache();
  cuda::AllocatorStats emptied = cuda::allocator_stats(0);
  EXPECT_LE(emptied.bytes_reserved + (size_t{64} << 20), cached.bytes_reserved);
  EXPECT_EQ(emptied.bytes_in_use, cached.bytes_in_use);
}

TEST_F(CudaTest, PinnedHostBuffersAreCachedAndUsable) {
  void* first = nullptr;
  {
    DataPtr pinned = allocate_pinned_host_bytes(1 << 20);
    ASSERT_NE(pinned.get(), nullptr);
    first = pinned.get();
    auto* f = static_cast<float*>(pinned.get());
    for (int i = 0; i < (1 << 18); ++i) f[i] = static_cast<float>(i);
    DataPtr dev = cuda::caching_allocate(1 << 20, 0);
    kernels::cuda::memcpy_bytes(dev.get(), kCuda, pinned.get(), Device::cpu(), 1 << 20);
    std::vector<float> back(1 << 18);
    kernels::cuda::memcpy_bytes(back.data(), Device::cpu(), dev.get(), kCuda, 1 << 20);
    EXPECT_EQ(back[12345], 12345.0f);
  }
  cuda::synchronize_device(0);  // the freed buffer's event completes
  DataPtr again = allocate_pinned_host_bytes(1 << 20);
  EXPECT_EQ(again.get(), first);
}

// The freed buffer's reuse must wait for the stream the copy was queued on, not for
// whatever stream is current when the buffer is dropped: here the copy waits on a
// side stream while the legacy default stream (current at free time) is idle.
TEST_F(CudaTest, PinnedBufferIsNotReusedWhileACopyOnAnotherStreamMayStillReadIt) {
#if RINGTRAIN_TEST_HAS_CUDA
  constexpr size_t kBytes = 1 << 20;
  cuda::Stream side = cuda::Stream::create(0);
  DataPtr dev = cuda::caching_allocate(kBytes, 0);
  std::vector<float> expected(kBytes / sizeof(float));
  for (size_t i = 0; i < expected.size(); ++i) expected[i] = 0.25f * static_cast<float>(i % 4096);
  void* first = nullptr;
  StreamBlocker blocker(side);
  {
    DataPtr pinned = allocate_pinned_host_bytes(kBytes);
    first = pinned.get();
    std::memcpy(pinned.get(), expected.data(), kBytes);
    cuda::StreamGuard on_side(side);
    kernels::cuda::memcpy_bytes(dev.get(), kCuda, pinned.get(), Device::cpu(), kBytes);
  }  // dropped while the copy that reads it is still queued behind the blocker
  // The legacy default stream, current when the buffer was dropped, is idle (it does
  // not wait for the non-blocking side stream): an event recorded there at free time,
  // as the old allocator did, has completed now, so the old code would reuse the buffer.
  cuda::Stream::default_stream(0).synchronize();
  DataPtr next = allocate_pinned_host_bytes(kBytes);
  EXPECT_NE(next.get(), first) << "the pinned buffer was handed out again before the copy reading it ran";
  std::memset(next.get(), 0xff, kBytes);  // what the next batch would do to it
  blocker.release();
  side.synchronize();
  std::vector<float> back(expected.size());
  kernels::cuda::memcpy_bytes(back.data(), Device::cpu(), dev.get(), kCuda, kBytes);
  EXPECT_EQ(back, expected);
  // Once the copy has run, the buffer is cached again: two requests get both buffers back.
  next.reset();
  DataPtr a = allocate_pinned_host_bytes(kBytes);
  DataPtr b = allocate_pinned_host_bytes(kBytes);
  EXPECT_TRUE(a.get() == first || b.get() == first);
#else
  GTEST_SKIP() << "built without CUDA";
#endif
}

// ---------------------------------------------------------------- contexts
//
// ctest runs every test case in a process of its own (gtest_discover_tests), and
// the fixture only asks whether a GPU exists, which creates no context: so these
// start with no context on any GPU. A run of the whole binary (compute-sanitizer
// in scripts/gpu/validate.sh) has made contexts in earlier cases: there they skip.

// Skips the calling test unless it is the only test this process runs.
#define SKIP_UNLESS_ALONE_IN_PROCESS()                                                 \
  if (::testing::UnitTest::GetInstance()->test_to_run_count() > 1)                    \
  GTEST_SKIP() << "checks which GPUs have a context, so it needs a process of its "  \
                  "own: run it alone (ctest does, or --gtest_filter=CudaTest."        \
               << ::testing::UnitTest::GetInstance()->current_test_info()->name() << ")"

TEST_F(CudaTest, PrimaryContextIsReportedOnceTheGpuIsUsed) {
  SKIP_UNLESS_ALONE_IN_PROCESS();
  EXPECT_FALSE(cuda::has_primary_context(0)) << "something made a context before the test used the GPU";
  Tensor t = ones({4}, DType::kFloat32, kCuda);
  EXPECT_TRUE(cuda::has_primary_context(0));
  EXPECT_FALSE(cuda::has_primary_context(cuda::device_count()));  // no such device
  EXPECT_FALSE(cuda::has_primary_context(-1));
}

// A rank that uses only cuda:1 must not hold a context on GPU 0: its comm thread,
// prefetch thread and deleters run on threads that never chose a device.
TEST_F(CudaTest, FreshThreadsLeaveNoContextOnAGpuTheyNeverUsed) {
  if (cuda::device_count() < 2) GTEST_SKIP() << "needs two GPUs (this machine has " << cuda::device_count() << ")";
  SKIP_UNLESS_ALONE_IN_PROCESS();
  ASSERT_FALSE(cuda::has_primary_context(0)) << "something made a context before the test used the GPU";
  const Device second = Device::cuda(1);
  std::thread([&] { Tensor t = ones({4}, DType::kFloat32, second); }).join();  // DeviceGuard(1), then exit
  EXPECT_TRUE(cuda::has_primary_context(1));
  std::thread([&] {  // a pinned batch made and copied on a fresh thread, as the DataLoader does
    DataPtr pinned = allocate_pinned_host_bytes(4096);
    std::memset(pinned.get(), 0, 4096);
    DataPtr dev = cuda::caching_allocate(4096, 1);
    kernels::cuda::memcpy_bytes(dev.get(), second, pinned.get(), Device::cpu(), 4096);
  }).join();
  std::thread([&] { cuda::synchronize_device(1); cuda::Event e = cuda::Event::create(1); }).join();
  EXPECT_FALSE(cuda::has_primary_context(0)) << "something made a context on GPU 0";
}

// ---------------------------------------------------------------- errors

TEST_F(CudaTest, BadDeviceAndMixedDevicesThrowClearly) {
  int missing = cuda::device_count();
  EXPECT_TRUE(throws_with([&] { Tensor::empty({4}, DType::kFloat32, Device::cuda(missing)); },
                          {"cuda:" + std::to_string(missing), "does not exist"}));
  Tensor g = ones({3}, DType::kFloat32, kCuda);
  Tensor c = ones({3});
  EXPECT_TRUE(throws_with([&] { add(g, c); }, {"cuda:0", "cpu"}));
  EXPECT_TRUE(throws_with([&] { matmul(ones({2, 2}, DType::kInt32, kCuda), ones({2, 2}, DType::kInt32, kCuda)); },
                          {"matmul"}));
}

}  // namespace
}  // namespace ringtrain
