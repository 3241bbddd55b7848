// reduce.h: the element-wise reductions the host-side collectives apply.
//
// defines: reduce_into (dst[i] = dst[i] (op) src[i]), reduce_into3 (dst = a op b),
//          scale_for_average (x / n after a sum, for ReduceOp::kAvg).
//
// Half and BFloat16 are computed in float and rounded once per combine, like
// NCCL's and PyTorch's CPU kernels. kAvg reduces as kSum; the collective divides
// once at the end (scale_for_average), integers with truncating division.
// The loops are plain indexed loops over restrict pointers so g++ -O3 vectorizes
// them (they run at memory bandwidth, which is what bounds an allreduce anyway).
#pragma once

#include <cstddef>

#include "comm/types.h"

namespace ringtrain::comm {

void reduce_into(void* dst, const void* src, size_t count, DType dtype, ReduceOp op);
void reduce_into3(void* dst, const void* a, const void* b, size_t count, DType dtype, ReduceOp op);
void scale_for_average(void* data, size_t count, DType dtype, int world_size);

}  // namespace ringtrain::comm
