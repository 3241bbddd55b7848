#include "comm/reduce.h"

#include <algorithm>

namespace ringtrain::comm {

namespace {

template <typename C>
inline C combine(C a, C b, ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg: return a + b;
    case ReduceOp::kProd: return a * b;
    case ReduceOp::kMax: return std::max(a, b);
    case ReduceOp::kMin: return std::min(a, b);
  }
  return a;
}

// One loop per (type, op) so the compiler sees a fixed operation and vectorizes it.
template <typename T, ReduceOp kOp>
void reduce_loop(T* __restrict dst, const T* __restrict a, const T* __restrict b, size_t count) {
  using C = typename ComputeType<T>::type;
  for (size_t i = 0; i < count; ++i) {
    C value = combine<C>(static_cast<C>(a[i]), static_cast<C>(b[i]), kOp);
    dst[i] = T(value);
  }
}

// 16-bit floats: convert through the bit helpers so the loop stays simple.
template <typename T, ReduceOp kOp>
void reduce_loop_16(T* dst, const T* a, const T* b, size_t count) {
  for (size_t i = 0; i < count; ++i) {
    float value = combine<float>(static_cast<float>(a[i]), static_cast<float>(b[i]), kOp);
    dst[i] = T(value);
  }
}

template <typename T>
void reduce_typed(T* dst, const T* a, const T* b, size_t count, ReduceOp op) {
  constexpr bool k16 = std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>;
  auto run = [&](auto op_tag) {
    constexpr ReduceOp kOp = decltype(op_tag)::value;
    if constexpr (k16) {
      reduce_loop_16<T, kOp>(dst, a, b, count);
    } else {
      reduce_loop<T, kOp>(dst, a, b, count);
    }
  };
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg: run(std::integral_constant<ReduceOp, ReduceOp::kSum>{}); break;
    case ReduceOp::kProd: run(std::integral_constant<ReduceOp, ReduceOp::kProd>{}); break;
    case ReduceOp::kMax: run(std::integral_constant<ReduceOp, ReduceOp::kMax>{}); break;
    case ReduceOp::kMin: run(std::integral_constant<ReduceOp, ReduceOp::kMin>{}); break;
  }
}

}  // namespace

void reduce_into3(void* dst, const void* a, const void* b, size_t count, DType dtype,
                  ReduceOp op) {
  dispatch_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    reduce_typed<T>(static_cast<T*>(dst), static_cast<const T*>(a), static_cast<const T*>(b),
                    count, op);
  });
}

void reduce_into(void* dst, const void* src, size_t count, DType dtype, ReduceOp op) {
  // dst aliases a: element i is read before it is written, so the in-place form is safe
  // even though the loop's pointers are declared restrict only for the 3-operand kernel
  // (here dst == a, which the loops handle since each index is independent).
  dispatch_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    using C = typename ComputeType<T>::type;
    T* d = static_cast<T*>(dst);
    const T* s = static_cast<const T*>(src);
    auto loop = [&](auto fn) {
      for (size_t i = 0; i < count; ++i) d[i] = T(fn(static_cast<C>(d[i]), static_cast<C>(s[i])));
    };
    switch (op) {
      case ReduceOp::kSum:
      case ReduceOp::kAvg: loop([](C x, C y) { return x + y; }); break;
      case ReduceOp::kProd: loop([](C x, C y) { return x * y; }); break;
      case ReduceOp::kMax: loop([](C x, C y) { return std::max(x, y); }); break;
      case ReduceOp::kMin: loop([](C x, C y) { return std::min(x, y); }); break;
    }
  });
}

void scale_for_average(void* data, size_t count, DType dtype, int world_size) {
  dispatch_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    using C = typename ComputeType<T>::type;
    T* d = static_cast<T*>(data);
    C n = static_cast<C>(world_size);
    for (size_t i = 0; i < count; ++i) d[i] = T(static_cast<C>(d[i]) / n);
  });
}

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return "sum";
    case ReduceOp::kAvg: return "avg";
    case ReduceOp::kMax: return "max";
    case ReduceOp::kMin: return "min";
    case ReduceOp::kProd: return "prod";
  }
  return "?";
}

ReduceOp parse_reduce_op(const std::string& name) {
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax, ReduceOp::kMin,
                      ReduceOp::kProd}) {
    if (name == reduce_op_name(op)) return op;
  }
  throw CommError("unknown reduce op '" + name + "' (expected sum, avg, max, min or prod)");
}

const char* collective_op_name(CollectiveOp op) {
  switch (op) {
    case CollectiveOp::kAllreduce: return "allreduce";
    case CollectiveOp::kBroadcast: return "broadcast";
    case CollectiveOp::kReduce: return "reduce";
    case CollectiveOp::kAllgather: return "allgather";
    case CollectiveOp::kReduceScatter: return "reduce_scatter";
    case CollectiveOp::kAllToAll: return "all_to_all";
    case CollectiveOp::kBarrier: return "barrier";
    case CollectiveOp::kSend: return "send";
    case CollectiveOp::kRecv: return "recv";
  }
  return "?";
}

}  // namespace ringtrain::comm
