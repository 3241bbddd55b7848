// reduce.h: the element-wise reductions the host-side collectives apply.
//
// defines: reduce_into (dst[i] = dst[i] (op) src[i]), reduce_into3 (dst = a op b),
//          scale_for_average (x / n after a sum, for ReduceOp::kAvg),
//          copy_bytes (memcpy for the shared-memory paths; see below),
//          copy_bytes_streaming (the same with non-temporal stores).
//
// Half and BFloat16 are computed in float and rounded once per combine, like
// NCCL's and PyTorch's CPU kernels. kAvg reduces as kSum; the collective divides
// once at the end (scale_for_average), integers with truncating division (16-bit
// floats divide first instead: ProcessGroup::run_host, so partial sums cannot overflow).
// The loops are plain indexed loops over restrict pointers so g++ -O3 vectorizes
// them (they run at memory bandwidth, which is what bounds an allreduce anyway).
// 16-bit floats convert inline (F16C, eight at a time for the f16 sum and product;
// bit arithmetic for bfloat16): on the Zen 5 VM a 1 Mi-element sum went from 0.26 to 14
// Gelem/s (f16) and from 0.28 to 7.4 (bf16), against 8.8 for f32, when each element
// took three calls to tensor/dtype.cc's out-of-line conversions.
#pragma once

#include <cstddef>

#include "comm/types.h"

namespace ringtrain::comm {

void reduce_into(void* dst, const void* src, size_t count, DType dtype, ReduceOp op);
void reduce_into3(void* dst, const void* a, const void* b, size_t count, DType dtype, ReduceOp op);
void scale_for_average(void* data, size_t count, DType dtype, int world_size);

// memcpy(dst, src, n) with a plain vector loop (32-byte AVX loads/stores where the
// build has AVX2). Why not memcpy: glibc 2.36 copies anything above 2 KiB with
// `rep movsb` on CPUs with fast short rep-mov (FSRM), and on this project's AMD EPYC
// VM that instruction runs at 3 GB/s when the source lines were just written by
// another core, which is every copy out of a shared-memory slot. Measured in a
// two-process prototype: a 64 KiB copy of the peer's freshly written data took 22 us
// with memcpy and 2.4 us with this loop (docs/collective-benchmark.md).
void copy_bytes(void* dst, const void* src, size_t n);

// copy_bytes with non-temporal (streaming) stores: the data goes to memory instead of
// this core's cache, and an sfence at the end orders it before whatever the caller
// stores next (the release store that publishes a slot). For a copy into a
// shared-memory slot that another core reads next: that core then reads the lines from
// memory instead of fetching them, dirty, out of this core's cache, and the next
// write into the slot does not have to take the lines back from it. On this project's
// Zen 5 VM a 1 MiB stream through 8 x 128 KiB slots ran at 6.3 GB/s with ordinary stores
// and 31 GB/s with these; the Zen 3 VM of earlier sessions ran both at 12-16 GB/s in its
// normal mode (docs/collective-benchmark.md, "Streaming stores into the slots").
void copy_bytes_streaming(void* dst, const void* src, size_t n);

// The inline 16-bit conversions the reduction loops use (exposed for the test that
// compares them with Half's and BFloat16's own, bit for bit).
namespace inline_conversion {
float sixteen_bit_to_float(uint16_t bits, DType dtype);
uint16_t float_to_sixteen_bit(float value, DType dtype);
}  // namespace inline_conversion

}  // namespace ringtrain::comm
