// copy_fill.cc: CPU copy (any strides, any dtype pair), fill, memcpy_bytes.
//
// copy: the 6 x 6 (dst, src) dtype pairs are dispatched once; the work is a
// StridedLoop over both operands (dims ordered by the destination's strides, so
// the write side is sequential, then coalesced). Innermost runs take
//   * memcpy when both sides are contiguous and the dtypes match (the whole
//     copy becomes one memcpy for two contiguous tensors),
//   * a tight converting loop when both strides are unit (vectorised; f16 uses
//     F16C 8-wide conversions),
//   * a scalar strided loop otherwise (transposes, broadcasts from stride 0).
// Cost: memory bound; 1 read + 1 write per element.
//
// fill: one value converted once to the dtype, then std::fill_n on contiguous
// runs. memcpy_bytes: host-to-host only; every other pair belongs to the CUDA side.
#include <cstring>

#include "tensor/checks.h"
#include "tensor/cpu/loops.h"
#include "tensor/kernels.h"

namespace ringtrain::kernels::cpu {

using detail::byte_ptr;
using detail::StridedLoop;

namespace {

template <typename D, typename S>
void copy_typed(const Tensor& dst, const Tensor& src) {
  StridedLoop<2> loop(dst.shape(), {&dst.strides(), &src.strides()},
                      {static_cast<int64_t>(sizeof(D)), static_cast<int64_t>(sizeof(S))},
                      /*sort_by=*/0);
  loop.run({byte_ptr(dst), byte_ptr(src)}, [](std::array<char*, 2> p,
                                              const std::array<int64_t, 2>& s, int64_t n) {
    D* d = reinterpret_cast<D*>(p[0]);
    const S* x = reinterpret_cast<const S*>(p[1]);
    const int64_t ds = s[0] / static_cast<int64_t>(sizeof(D));
    const int64_t xs = s[1] / static_cast<int64_t>(sizeof(S));
    if constexpr (std::is_same_v<D, S>) {
      if (ds == 1 && xs == 1) {
        std::memcpy(d, x, static_cast<size_t>(n) * sizeof(D));
        return;
      }
      if (ds == 1 && xs == 0) {
        std::fill_n(d, n, *x);
        return;
      }
    } else if constexpr (detail::kIsReduced<S> && std::is_same_v<D, float>) {
      if (ds == 1) {
        detail::load_run(x, xs, d, n);
        return;
      }
    } else if constexpr (detail::kIsReduced<D> && std::is_same_v<S, float>) {
      if (xs == 1) {
        detail::store_run(x, d, ds, n);
        return;
      }
    }
    if (ds == 1 && xs == 1) {
      for (int64_t i = 0; i < n; ++i) d[i] = detail::convert<D>(x[i]);
    } else {
      for (int64_t i = 0; i < n; ++i) d[i * ds] = detail::convert<D>(x[i * xs]);
    }
  });
}

}  // namespace

void copy(const Tensor& dst, const Tensor& src) {
  RT_CHECK(dst.shape() == src.shape(), "copy (cpu kernel): dst ", dst.describe(), " and src ",
           src.describe(), " differ in shape");
  RT_CHECK(dst.device().is_cpu() && src.device().is_cpu(), "copy (cpu kernel): dst ",
           dst.describe(), ", src ", src.describe(), ": both must be on the cpu");
  if (dst.numel() == 0) return;
  if (dst.dtype() == src.dtype() && dst.is_contiguous() && src.is_contiguous()) {
    if (dst.data_ptr() != src.data_ptr()) std::memcpy(dst.data_ptr(), src.data_ptr(), dst.nbytes());
    return;
  }
  dispatch_dtype(dst.dtype(), [&](auto dtag) {
    using D = decltype(dtag);
    dispatch_dtype(src.dtype(), [&](auto stag) {
      using S = decltype(stag);
      copy_typed<D, S>(dst, src);
    });
  });
}

void fill(const Tensor& dst, double value) {
  RT_CHECK(dst.device().is_cpu(), "fill (cpu kernel): ", dst.describe(), " is not on the cpu");
  if (dst.numel() == 0) return;
  dispatch_dtype(dst.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T v = detail::store<T>(value);
    StridedLoop<1> loop(dst.shape(), {&dst.strides()}, {static_cast<int64_t>(sizeof(T))}, 0);
    loop.run({byte_ptr(dst)}, [v](std::array<char*, 1> p, const std::array<int64_t, 1>& s,
                                  int64_t n) {
      T* d = reinterpret_cast<T*>(p[0]);
      const int64_t ds = s[0] / static_cast<int64_t>(sizeof(T));
      if (ds == 1) {
        std::fill_n(d, n, v);
      } else {
        for (int64_t i = 0; i < n; ++i) d[i * ds] = v;
      }
    });
  });
}

void memcpy_bytes(void* dst, Device dst_device, const void* src, Device src_device, size_t n) {
  RT_CHECK(dst_device.is_cpu() && src_device.is_cpu(), "memcpy_bytes (cpu kernel): copy of ", n,
           " bytes from ", src_device.str(), " to ", dst_device.str(),
           " needs the CUDA kernels; the cpu kernel copies host to host only");
  if (n == 0) return;
  std::memcpy(dst, src, n);
}

}  // namespace ringtrain::kernels::cpu
