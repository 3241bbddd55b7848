// memory_overlap.cc: see memory_overlap.h.
#include "tensor/memory_overlap.h"

#include "tensor/checks.h"

namespace ringtrain {

namespace {

struct ByteRange {
  uintptr_t first;  // first byte
  uintptr_t end;    // one past the last byte
};

// The bytes a (non-empty) view can touch: from its first element to its last, whatever
// lies between.
ByteRange byte_range(const Tensor& t) {
  int64_t last = 0;
  for (int64_t d = 0; d < t.dim(); ++d) last += (t.size(d) - 1) * t.stride(d);
  const auto base = reinterpret_cast<uintptr_t>(t.data_ptr());
  const size_t elem = dtype_size(t.dtype());
  return {base, base + static_cast<uintptr_t>(last) * elem + elem};
}

// Whether a and b (same shape) put every element at the same offset: the strides agree on
// every dim of more than one element. A size-1 dim never steps, so its stride is arbitrary:
// x.view({1, 3}) and x broadcast to [1, 3] (stride 0 there) are the same elements.
bool same_element_offsets(const Tensor& a, const Tensor& b) {
  for (int64_t d = 0; d < a.dim(); ++d)
    if (a.size(d) > 1 && a.stride(d) != b.stride(d)) return false;
  return true;
}

}  // namespace

MemoryOverlap memory_overlap(const Tensor& a, const Tensor& b) {
  if (a.numel() == 0 || b.numel() == 0 || a.storage() != b.storage()) return MemoryOverlap::kNone;
  if (a.data_ptr() == b.data_ptr() && a.shape() == b.shape() && a.dtype() == b.dtype() &&
      same_element_offsets(a, b))
    return MemoryOverlap::kSame;
  const ByteRange ra = byte_range(a), rb = byte_range(b);
  return ra.first < rb.end && rb.first < ra.end ? MemoryOverlap::kPartial : MemoryOverlap::kNone;
}

void check_in_place(const Tensor& dst, const Tensor& src, const char* op) {
  for (int64_t d = 0; d < dst.dim(); ++d)
    RT_CHECK(dst.size(d) <= 1 || dst.stride(d) != 0, op, ": the destination ", dst.describe(),
             " has stride 0 in dim ", d, " (an expanded view), so several of its elements are one ",
             "memory location; write into a contiguous tensor (clone() it first)");
  RT_CHECK(memory_overlap(dst, src) != MemoryOverlap::kPartial, op, ": the source ", src.describe(),
           " and the destination ", dst.describe(), " share memory (partly overlapping views of one ",
           "storage), so the result would depend on the order elements are written; clone() the "
           "source first");
}

void check_no_overlap(const Tensor& dst, const Tensor& src, const char* op) {
  RT_CHECK(memory_overlap(dst, src) == MemoryOverlap::kNone, op, ": the input ", src.describe(),
           " shares memory with the output ", dst.describe(), "; this op reads other elements of its "
           "input than the one it writes, so it would read values it has already overwritten. Pass "
           "a clone() of the input or a separate output tensor");
}

}  // namespace ringtrain
