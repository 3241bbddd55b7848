// cuda_ipc_allreduce.cc: CudaIpcAllreduce, allreduce of CUDA buffers between the
// processes of one host through device memory they share by CUDA IPC.
//
// What it does. The same two phases as direct_allreduce.cc, which does this on
// host symmetric memory, moved onto the GPU. At setup every rank cudaMallocs a
// buffer and creates two interprocess events, exports them (cudaIpcGetMemHandle,
// cudaIpcGetEventHandle), publishes the handles in the store and opens every
// peer's, so each rank can address all p buffers and wait on all p events. Then,
// for each piece of at most kBufferBytes of the caller's buffer, this rank queues
// on its own stream:
//   1. a copy of the piece into its buffer, then records its event `copied`;
//   barrier A (host): every rank has queued that record;
//   2. a wait for every peer's `copied`, then one kernel: rank r loads chunk r from
//      all p buffers, reduces it and stores the result into chunk r of all p
//      buffers (reduce-scatter and allgather at once); then records `reduced`;
//   barrier B (host): every rank has queued that record;
//   3. a wait for every peer's `reduced`, then a copy of the piece back.
// The stream first waits, on the device, for the event the caller's stream
// recorded when the allreduce was issued. The host never waits for the GPU inside
// the loop: the barriers only order the records before the waits (a wait sees the
// last record queued before it), and the GPU orders the rest. One synchronization
// at the end (polled against the deadline) completes the collective. This matters
// most when several processes share one GPU: each host-side wait then costs a time
// slice (272 us on an H100 with two processes, 10 us alone; scripts/gpu/
// latency_probe.cu). The GPU still switches between the processes' work, so an
// 8-byte allreduce took 611 us there, against 263 us through host staging; from
// 4 MiB up this path was the faster one (docs/gpu-validation.md).
// Why it is safe to reuse the buffers and events: no two ranks touch the same
// chunk between the waits; a rank overwrites its buffer (step 1 of the next piece)
// only after its step-3 wait for every peer's `reduced`, i.e. after every peer's
// kernel stopped reading and writing it; and a rank records an event again only
// after the next barrier, which its peers enter after queuing their waits on it.
// Each chunk is reduced once, by one rank, so every rank ends with the same bits.
// The barriers are the ring's dissemination barrier over the host mesh, which
// turns a dead peer or a deadline into an error.
//
// Cost per piece of S bytes on p ranks: 2 host barriers (microseconds) + device
// traffic of 2S (copy in) + S loads and S stores in the kernel + 2S (copy out), at
// the GPU's memory bandwidth (terabytes per second on one GPU; the link's when the
// buffers are on other GPUs); plus one stream synchronization per allreduce. Host
// staging instead moves 2S over PCIe and runs the ring on the host at its memory
// bandwidth, a few GB/s (docs/gpu-validation.md has both measured).
//
// Where it sits. ProcessGroup::run_staged -> RingProcessGroup::try_run_on_device
// (allreduce, CUDA buffer, every rank on this host, RINGTRAIN_CUDA_IPC not 0) ->
// here. Other collectives of CUDA buffers, and allreduce across hosts, are staged
// through pinned host memory (cuda_staging.cc).
//
// Known limits (found in review, not yet mended; they need a GPU to test): a failed
// or timed-out allreduce leaves its queued copies and kernel on the stream, so the
// caller's buffer and the peers' may still be written after the error; and teardown
// frees this rank's exported buffer and events without waiting for the peers to close
// their handles (CUDA calls that undefined). Both matter only after a failure or at
// exit; a peer that dies mid-allreduce is reported by name (the final wait polls the
// mesh), not after the deadline.
#include "comm/cuda_ipc_allreduce.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <thread>

#include "comm/cuda_staging.h"
#include "tensor/checks.h"

namespace ringtrain::comm {

namespace {

// The CUDA error of a call that may fail for reasons of the machine (no P2P, out of
// memory): the message, with the sticky error state cleared.
std::string cuda_failure(const std::string& what, cudaError_t status) {
  (void)cudaGetLastError();
  return detail::concat(what, ": ", cudaGetErrorString(status));
}

std::string handle_key(const std::string& key, int rank) { return detail::concat(key, "/handle/", rank); }
std::string verdict_key(const std::string& key, int rank) { return detail::concat(key, "/verdict/", rank); }

// What a rank publishes: its buffer and its two events.
struct Handles {
  cudaIpcMemHandle_t buffer;
  cudaIpcEventHandle_t copied;
  cudaIpcEventHandle_t reduced;
};

}  // namespace

// Every rank's buffer and events as this rank addresses them (its own at rank()):
// its own were created here, the peers' opened from their handles. The destructor
// releases both kinds.
struct CudaIpcAllreduce::Shared {
  int device = 0;
  int rank = 0;
  std::vector<void*> buffers;         // device pointers
  std::vector<cudaEvent_t> copied;    // recorded after the copy in
  std::vector<cudaEvent_t> reduced;   // recorded after the kernel

  Shared(int device_index, int p, int r)
      : device(device_index), rank(r), buffers(p, nullptr), copied(p, nullptr), reduced(p, nullptr) {}
  ~Shared() {
    (void)cudaSetDevice(device);
    for (size_t q = 0; q < buffers.size(); ++q) {
      if (copied[q]) (void)cudaEventDestroy(copied[q]);
      if (reduced[q]) (void)cudaEventDestroy(reduced[q]);
      if (!buffers[q]) continue;
      // Peers may still hold our buffer mapped; none touches it any more.
      if (static_cast<int>(q) == rank) (void)cudaFree(buffers[q]);
      else (void)cudaIpcCloseMemHandle(buffers[q]);
    }
  }
};

std::unique_ptr<CudaIpcAllreduce> CudaIpcAllreduce::create(RingArgs& args, Store& store, const std::string& key,
                                                           int device, std::string* why) {
  const int p = args.size(), r = args.rank();
  const auto timeout =
      std::max(std::chrono::milliseconds(1),
               std::chrono::duration_cast<std::chrono::milliseconds>(args.deadline - Clock::now()));
  auto shared = std::make_unique<Shared>(device, p, r);
  std::string problem;  // empty: fine so far
  // Makes the CUDA call only while nothing has failed yet; a failure becomes `problem`.
  auto attempt = [&problem](const std::string& what, auto&& call) {
    if (!problem.empty()) return;
    if (cudaError_t status = call(); status != cudaSuccess) problem = cuda_failure(what, status);
  };
  Handles mine{};
  if (p > kMaxRanks) problem = detail::concat(p, " ranks on one host; CUDA IPC serves at most ", kMaxRanks);
  const unsigned flags = cudaEventInterprocess | cudaEventDisableTiming;
  attempt("cudaSetDevice", [&] { return cudaSetDevice(device); });
  attempt("cudaMalloc", [&] { return cudaMalloc(&shared->buffers[r], kBufferBytes); });
  attempt("cudaIpcGetMemHandle", [&] { return cudaIpcGetMemHandle(&mine.buffer, shared->buffers[r]); });
  attempt("cudaEventCreateWithFlags", [&] { return cudaEventCreateWithFlags(&shared->copied[r], flags); });
  attempt("cudaEventCreateWithFlags", [&] { return cudaEventCreateWithFlags(&shared->reduced[r], flags); });
  attempt("cudaIpcGetEventHandle", [&] { return cudaIpcGetEventHandle(&mine.copied, shared->copied[r]); });
  attempt("cudaIpcGetEventHandle", [&] { return cudaIpcGetEventHandle(&mine.reduced, shared->reduced[r]); });
  // 1. Publish this rank's handles, or why it has none.
  store.set(handle_key(key, r), problem.empty() ? "H" + std::string(reinterpret_cast<const char*>(&mine), sizeof(mine))
                                                : "E" + problem);
  // 2. Open every peer's buffer and events.
  for (int q = 0; q < p; ++q) {
    if (q == r) continue;
    std::string value = store.get(handle_key(key, q), timeout);
    if (!problem.empty()) continue;  // keep reading: every rank consumes every key
    if (value.size() != 1 + sizeof(Handles) || value[0] != 'H') {
      problem = detail::concat("rank ", q, " has nothing to share (", value.substr(1), ")");
      continue;
    }
    Handles peer{};
    std::memcpy(&peer, value.data() + 1, sizeof(peer));
    const std::string whose = detail::concat(" of rank ", q);
    attempt("cudaIpcOpenMemHandle" + whose, [&] {
      return cudaIpcOpenMemHandle(&shared->buffers[q], peer.buffer, cudaIpcMemLazyEnablePeerAccess);
    });
    attempt("cudaIpcOpenEventHandle" + whose, [&] { return cudaIpcOpenEventHandle(&shared->copied[q], peer.copied); });
    attempt("cudaIpcOpenEventHandle" + whose, [&] { return cudaIpcOpenEventHandle(&shared->reduced[q], peer.reduced); });
  }
  // 3. Every rank's verdict: CUDA IPC is used only if all of them opened everything.
  store.set(verdict_key(key, r), problem.empty() ? "ok" : problem);
  std::string first_failure;
  for (int q = 0; q < p; ++q) {
    std::string verdict = q == r ? (problem.empty() ? "ok" : problem) : store.get(verdict_key(key, q), timeout);
    if (verdict != "ok" && first_failure.empty()) first_failure = detail::concat("rank ", q, ": ", verdict);
  }
  if (!first_failure.empty()) {
    if (why) *why = first_failure;
    return nullptr;  // ~Shared releases what this rank made and opened
  }
  return std::unique_ptr<CudaIpcAllreduce>(new CudaIpcAllreduce(std::move(shared)));
}

CudaIpcAllreduce::CudaIpcAllreduce(std::unique_ptr<Shared> shared)
    : shared_(std::move(shared)), stream_(cuda::Stream::create(shared_->device)) {}

CudaIpcAllreduce::~CudaIpcAllreduce() = default;

int CudaIpcAllreduce::device() const { return shared_->device; }

void CudaIpcAllreduce::allreduce(RingArgs& args, void* data, size_t count, const std::shared_ptr<void>& ready_event) {
  const int p = args.size(), r = args.rank();
  const size_t element = args.element_bytes();
  const size_t piece_capacity = kBufferBytes / element;
  Shared& s = *shared_;
  cuda::DeviceGuard on_device(s.device);
  auto stream = static_cast<cudaStream_t>(stream_.handle());
  auto wait_for_peers = [&](const std::vector<cudaEvent_t>& events) {
    for (int q = 0; q < p; ++q) {
      if (q != r) CUDA_CHECK(cudaStreamWaitEvent(stream, events[q], 0));
    }
  };
  // The caller's stream produced `data`: this stream waits for it on the device.
  stream_wait_event(stream, ready_event);
  for (size_t done = 0; done < count;) {
    const size_t n = std::min(piece_capacity, count - done);
    char* piece = static_cast<char*>(data) + done * element;
    // 1. This rank's piece into its shared buffer; `copied` says it is there.
    CUDA_CHECK(cudaMemcpyAsync(s.buffers[r], piece, n * element, cudaMemcpyDeviceToDevice, stream));
    CUDA_CHECK(cudaEventRecord(s.copied[r], stream));
    // Barrier A: every rank has queued its `copied` record, so the waits below see it.
    dissemination_barrier(args);
    // 2. Once every piece is in, rank r reduces chunk r over all buffers and stores
    //    it into all of them; `reduced` says this rank's kernel is done.
    wait_for_peers(s.copied);
    const ChunkLayout layout(n, p, element);
    launch_reduce_into_all(s.buffers.data(), p, layout.offset(r) / element, layout.elements(r), args.dtype,
                           args.op, stream);
    CUDA_CHECK(cudaEventRecord(s.reduced[r], stream));
    // Barrier B: every rank has queued its `reduced` record.
    dissemination_barrier(args);
    // 3. Once every kernel is done, the result back into the caller's buffer.
    wait_for_peers(s.reduced);
    CUDA_CHECK(cudaMemcpyAsync(piece, s.buffers[r], n * element, cudaMemcpyDeviceToDevice, stream));
    done += n;
  }
  // The one host-side wait, polled so that a peer whose GPU work never finishes
  // becomes a timeout instead of a hang, and a peer that died (its process gone, so
  // its events will never be recorded) an error naming it at once.
  auto next_peer_check = Clock::now() + std::chrono::milliseconds(5);
  while (!stream_.query()) {
    const bool check_peers = Clock::now() >= next_peer_check;  // a syscall per peer: not every spin
    if (check_peers) next_peer_check = Clock::now() + std::chrono::milliseconds(5);
    for (int q = 0; check_peers && q < p; ++q) {
      // A peer that finished its part and left (only rank 0 waits at shutdown) is fine;
      // one whose recorded work will never complete (its process died) is not.
      const auto done = [](cudaEvent_t event) {
        const cudaError_t state = cudaEventQuery(event);
        if (state != cudaSuccess) (void)cudaGetLastError();  // not sticky: clear it
        return state == cudaSuccess;
      };
      if (q != r && args.mesh.peer_closed(q) && (!done(s.copied[q]) || !done(s.reduced[q]))) {
        throw PeerLostError(args.mesh.world_rank(q),
                            detail::concat("CUDA IPC allreduce of ", count, " elements on rank ", r, ": rank ",
                                           args.mesh.world_rank(q), " closed its connection before its queued GPU "
                                           "work, which this rank waits for, completed"));
      }
    }
    if (Clock::now() >= args.deadline) {
      throw CommTimeoutError(detail::concat("CUDA IPC allreduce of ", count, " elements on rank ", r,
                                            ": the GPU work did not finish before the deadline"));
    }
    std::this_thread::yield();
  }
}

}  // namespace ringtrain::comm
