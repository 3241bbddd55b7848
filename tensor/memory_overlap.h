// memory_overlap.h: does writing through one view clobber what another view reads?
//
// In-place ops (add_, mul_, copy_, index_add_) write their destination while they
// read their source. When the two share storage and are not the very same view,
// the result depends on the order the kernel visits elements: add_(x, x.t())
// would read elements it had already overwritten. As PyTorch does, such calls are
// rejected rather than computed in some order. The test is on address ranges, so
// two interleaved views (x[0::2] and x[1::2]) whose ranges cross count as
// overlapping too: conservative, and the fix the error names (clone the source)
// is always correct.
#pragma once

#include "tensor/tensor.h"

namespace ringtrain {

enum class MemoryOverlap {
  kNone,     // different storage, or disjoint byte ranges
  kSame,     // the same elements in the same order (x += x is fine)
  kPartial,  // anything else that shares bytes
};

MemoryOverlap memory_overlap(const Tensor& a, const Tensor& b);

// Throws when `dst` has several elements at one address (an expanded view) or when
// `src` partially overlaps it; `op` names the caller in the message.
void check_in_place(const Tensor& dst, const Tensor& src, const char* op);

// Throws when `src` shares any memory with `dst`, even as the very same view: for ops that
// are not elementwise (matmul_out, index_add_), where element i of the output depends on
// other elements of the input, so even dst == src reads values already overwritten.
void check_no_overlap(const Tensor& dst, const Tensor& src, const char* op);

}  // namespace ringtrain
