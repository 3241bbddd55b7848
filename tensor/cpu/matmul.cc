// matmul.cc: CPU batched GEMM, out[b] = a[b] @ b[b].
//
// f32 (and f16/bf16, converted to f32) on x86 with AVX2+FMA: our own packed GEMM,
// structured as in BLIS / Goto's algorithm:
//   for each kNC-wide column block of B            (B block: kKC x kNC, lives in L3)
//     for each kKC-deep slice of k                 (pack B slice into kNR-wide panels)
//       for each kMC-tall row block of A           (pack A block into kMR-tall panels, in L2)
//         for each kMR x kNR tile of C: micro-kernel, kc rank-1 updates of the tile held
//         in registers (AVX-512: 8x32 in 16 zmm accumulators, 2 vector loads of B + 8
//         broadcasts of A feed 16 FMAs per k step; AVX2: 6x16 in 12 ymm, 12 FMAs per
//         step); the B micro-panel (kKC x kNR floats, 48 or 16 KiB) stays in L1/L2.
// Packing reads the operands through their strides, so transposed, sliced and
// broadcast (stride-0) views need no copy; edge tiles are computed into a
// scratch tile and added partially. The first k slice stores the tile, later
// slices accumulate into C. Cost: 2 m n k flops; packing is O(mk + kn) per pass.
// The build's -march=native picks the tile: AVX-512 where the compiler targets it,
// else AVX2 (RINGTRAIN_CPU_GEMM=avx2 forces the narrower one, to compare or test it).
// Eigen's GEMM (which packs the same way with a 24x4 kernel) measured only ~0.7x
// OpenBLAS single-thread here; the AVX2 tile is at ~0.85-1.0x (docs/tensor-benchmark.md).
//
// f64, and f32 on machines without AVX2/FMA: Eigen. Each operand of each batch is
// wrapped in an Eigen::Map without copying when one of its two matrix strides is
// 1 (row stride 1 -> column-major map, column stride 1 -> row-major map); other
// operands are first copied to a contiguous buffer.
//
// Single-threaded on purpose: data-parallel training runs one rank per core. Eigen
// parallelises its GEMM only under OpenMP, and this file refuses to build with it
// (below). No Eigen::setNbThreads(1) per call: it writes one global that the replica
// threads of DataParallel would write at once (a data race ThreadSanitizer reported).
// f16/bf16: both operands converted to f32, multiplied with f32 accumulation (as
// cuBLAS does) and rounded once on store. Integer dtypes are rejected.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <Eigen/Core>

#ifdef EIGEN_HAS_OPENMP
#error "tensor/cpu/matmul.cc assumes Eigen without OpenMP (one thread per rank); build without -fopenmp"
#endif

#include "tensor/checks.h"
#include "tensor/cpu/loops.h"
#include "tensor/kernels.h"

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define RINGTRAIN_PACKED_SGEMM 1
#if defined(__AVX512F__)
#define RINGTRAIN_PACKED_SGEMM_AVX512 1
#endif
#endif

namespace ringtrain::kernels::cpu {

namespace {

template <typename C>
using RowMat = Eigen::Matrix<C, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <typename C>
using ColMat = Eigen::Matrix<C, Eigen::Dynamic, Eigen::Dynamic, Eigen::ColMajor>;
using OuterStride = Eigen::OuterStride<Eigen::Dynamic>;

// One matrix operand: pointer, rows x cols, element strides of a row step and a column step.
template <typename C>
struct MatRef {
  const C* data;
  int64_t rows, cols, row_stride, col_stride;
};

// y (m x n, row-major, contiguous) = a @ b, picking the Map layouts from the strides.
template <typename C>
void gemm(const MatRef<C>& a, const MatRef<C>& b, C* y) {
  Eigen::Map<RowMat<C>> Y(y, a.rows, b.cols);
  auto with_b = [&](const auto& A) {
    if (b.col_stride == 1) {
      Eigen::Map<const RowMat<C>, 0, OuterStride> B(b.data, b.rows, b.cols, OuterStride(b.row_stride));
      Y.noalias() = A * B;
    } else {
      Eigen::Map<const ColMat<C>, 0, OuterStride> B(b.data, b.rows, b.cols, OuterStride(b.col_stride));
      Y.noalias() = A * B;
    }
  };
  if (a.col_stride == 1) {
    with_b(Eigen::Map<const RowMat<C>, 0, OuterStride>(a.data, a.rows, a.cols, OuterStride(a.row_stride)));
  } else {
    with_b(Eigen::Map<const ColMat<C>, 0, OuterStride>(a.data, a.rows, a.cols, OuterStride(a.col_stride)));
  }
}

// The f32 GEMM this process uses: the widest tile this build targets, unless
// RINGTRAIN_CPU_GEMM names a narrower one (for comparing kernels, and so the AVX2 tile stays
// tested on AVX-512 machines). Read once; a value this build cannot honour is an error in
// every build, Eigen-only ones included, rather than silently ignored.
enum class SgemmTile { kEigen, kAvx2, kAvx512 };

SgemmTile chosen_tile() {
  static const SgemmTile tile = [] {
#if defined(RINGTRAIN_PACKED_SGEMM_AVX512)
    const SgemmTile widest = SgemmTile::kAvx512;
    const char* allowed = "avx2 or avx512";
#elif defined(RINGTRAIN_PACKED_SGEMM)
    const SgemmTile widest = SgemmTile::kAvx2;
    const char* allowed = "avx2 (this build does not target AVX-512)";
#else
    const SgemmTile widest = SgemmTile::kEigen;
    const char* allowed = nullptr;
#endif
    const char* env = std::getenv("RINGTRAIN_CPU_GEMM");
    if (env == nullptr || *env == '\0') return widest;
    const std::string v(env);
    RT_CHECK(allowed != nullptr, "RINGTRAIN_CPU_GEMM=", v,
             ": this build's f32 GEMM is Eigen's (the compiler targets no AVX2+FMA: build with "
             "RINGTRAIN_NATIVE=ON on such a CPU); unset it");
    if (v == "avx2") return SgemmTile::kAvx2;
    RT_CHECK(v == "avx512" && widest == SgemmTile::kAvx512, "RINGTRAIN_CPU_GEMM=", v,
             " is not a GEMM kernel of this build: use ", allowed, ", or unset it for the widest");
    return SgemmTile::kAvx512;
  }();
  return tile;
}

#ifdef RINGTRAIN_PACKED_SGEMM
// ---------------------------------------------------------------- packed SGEMM (AVX2 + FMA, AVX-512)
//
// Two micro-kernels share the loop nest below, both a RegisterTile (one code, instantiated
// for 256- and 512-bit registers); the tile shape is the only difference.
//   Avx2Tile   6 x 16: 12 ymm accumulators; per k step 2 loads of B, 6 broadcasts of A, 12 FMAs.
//   Avx512Tile 8 x 32: 16 zmm accumulators; per k step 2 loads of B, 8 broadcasts of A, 16 FMAs,
//              each FMA twice as wide. 8 rows divide the batch of 64 that DDP and the
//              benchmarks use (6 left a 4-row edge tile), 16 independent accumulators cover
//              the FMA latency x throughput product (4 cycles x 2 pipes) with room to spare.
// The B micro-panel (kKC x kNR floats) is what stays close across the A panels: 16 KiB for
// the AVX2 tile, 48 KiB for the AVX-512 one. Its depth was measured, not derived: on the MLP
// step (docs/mlp-benchmark.md, a Zen 5 core with a 48 KiB L1) kKC 384 beat 128, 192, 256 and
// 512 by 3-15%; deeper slices also mean fewer passes that reload and add into C.

constexpr int64_t kMC = 144;   // rows of A packed per block: 144 x kKC x 4 B = 216 or 144 KiB (L2)
constexpr int64_t kNC = 4096;  // columns of B packed per block: kKC x 4096 x 4 B = 6 or 4 MiB (L3)

// The vector operations a tile needs, for 256-bit (AVX2) and 512-bit (AVX-512) registers.
struct Ymm {
  using V = __m256;
  static constexpr int64_t kWidth = 8;
  static V zero() { return _mm256_setzero_ps(); }
  static V load(const float* p) { return _mm256_load_ps(p); }  // aligned: the packed B panel
  static V loadu(const float* p) { return _mm256_loadu_ps(p); }
  static V broadcast(const float* p) { return _mm256_broadcast_ss(p); }
  static V fmadd(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
  static V add(V a, V b) { return _mm256_add_ps(a, b); }
  static void storeu(float* p, V v) { _mm256_storeu_ps(p, v); }
};
#ifdef RINGTRAIN_PACKED_SGEMM_AVX512
struct Zmm {
  using V = __m512;
  static constexpr int64_t kWidth = 16;
  static V zero() { return _mm512_setzero_ps(); }
  static V load(const float* p) { return _mm512_load_ps(p); }
  static V loadu(const float* p) { return _mm512_loadu_ps(p); }
  static V broadcast(const float* p) { return _mm512_set1_ps(*p); }  // a vbroadcastss from memory
  static V fmadd(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
  static V add(V a, V b) { return _mm512_add_ps(a, b); }
  static void storeu(float* p, V v) { _mm512_storeu_ps(p, v); }
};
#endif

// A kMR x (2 vectors) tile of C held in 2 kMR accumulator registers.
template <typename Vec, int64_t MR, int64_t KC>
struct RegisterTile {
  using V = typename Vec::V;
  static constexpr int64_t kMR = MR;                  // rows: kMR broadcasts of A per k step
  static constexpr int64_t kNR = 2 * Vec::kWidth;     // columns: 2 vector loads of B per k step
  static constexpr int64_t kKC = KC;                  // depth of one packed slice

  // c[0..kMR)[0..kNR) (+)= sum_p a[p][0..kMR) * b[p][0..kNR); a, b packed; acc: add into c.
  static void run(int64_t kc, const float* __restrict a, const float* __restrict b, float* c,
                  int64_t ldc, bool acc) {
    V lo[kMR], hi[kMR];  // row i of the tile: its first vector of columns in lo[i], the second in hi[i]
#pragma GCC unroll 8
    for (int i = 0; i < kMR; ++i) lo[i] = hi[i] = Vec::zero();
#pragma GCC unroll 4
    for (int64_t p = 0; p < kc; ++p) {
      // One rank-1 update: row p of the B panel (2 vectors) times column p of the A panel.
      const V b0 = Vec::load(b), b1 = Vec::load(b + Vec::kWidth);
#pragma GCC unroll 8
      for (int i = 0; i < kMR; ++i) {
        const V av = Vec::broadcast(a + i);
        lo[i] = Vec::fmadd(av, b0, lo[i]);
        hi[i] = Vec::fmadd(av, b1, hi[i]);
      }
      a += kMR;
      b += kNR;
    }
#pragma GCC unroll 8
    for (int i = 0; i < kMR; ++i) {
      float* row = c + i * ldc;
      if (acc) {
        lo[i] = Vec::add(lo[i], Vec::loadu(row));
        hi[i] = Vec::add(hi[i], Vec::loadu(row + Vec::kWidth));
      }
      Vec::storeu(row, lo[i]);
      Vec::storeu(row + Vec::kWidth, hi[i]);
    }
  }
};

struct Avx2Tile : RegisterTile<Ymm, 6, 256> {  // B micro-panel 256 x 16 x 4 B = 16 KiB
  static constexpr const char* kName = "avx2 6x16";
};
#ifdef RINGTRAIN_PACKED_SGEMM_AVX512
struct Avx512Tile : RegisterTile<Zmm, 8, 384> {  // B micro-panel 384 x 32 x 4 B = 48 KiB
  static constexpr const char* kName = "avx512 8x32";
};
#endif

// In-register transpose of eight 8-float rows: afterwards r[q] holds element q of every row.
inline void transpose_8x8(__m256 r[8]) {
  __m256 t[8], u[8];
  for (int i = 0; i < 4; ++i) {
    t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 2; ++i) {
    u[4 * i + 0] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], _MM_SHUFFLE(1, 0, 1, 0));
    u[4 * i + 1] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], _MM_SHUFFLE(3, 2, 3, 2));
    u[4 * i + 2] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], _MM_SHUFFLE(1, 0, 1, 0));
    u[4 * i + 3] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], _MM_SHUFFLE(3, 2, 3, 2));
  }
  for (int i = 0; i < 4; ++i) {
    r[i] = _mm256_permute2f128_ps(u[i], u[4 + i], 0x20);
    r[4 + i] = _mm256_permute2f128_ps(u[i], u[4 + i], 0x31);
  }
}

// dst[q * ld_dst + i] = src[i * ld_src + q] for an 8 x 8 block: both packings use it where
// a panel row is a column of the operand.
inline void copy_transposed_8x8(const float* src, int64_t ld_src, float* dst, int64_t ld_dst) {
  __m256 r[8];
  for (int i = 0; i < 8; ++i) r[i] = _mm256_loadu_ps(src + i * ld_src);
  transpose_8x8(r);
  for (int q = 0; q < 8; ++q) _mm256_storeu_ps(dst + q * ld_dst, r[q]);
}

// A block [mc x kc] (element strides rs, cs) -> kMR-row panels, p-major, zero padded.
template <int64_t kMR>
void pack_a(int64_t mc, int64_t kc, const float* A, int64_t rs, int64_t cs, float* out) {
  for (int64_t i0 = 0; i0 < mc; i0 += kMR) {
    const int64_t mr = std::min(kMR, mc - i0);
    int64_t p_done = 0;
    if (mr == kMR && cs == 1 && kMR % 8 == 0) {
      // Row-major A (the activations in x @ W^T, the output gradient in g @ W): each panel
      // row is a column of A. Read 8 floats from each of 8 rows, transpose in registers.
      for (; p_done + 8 <= kc; p_done += 8) {
        for (int64_t part = 0; part < kMR / 8; ++part)
          copy_transposed_8x8(A + (i0 + part * 8) * rs + p_done, rs, out + p_done * kMR + part * 8, kMR);
      }
    } else if (mr == kMR && rs == 1) {
      // Column-major A (g^T in the weight gradient g^T @ x): panel rows are contiguous.
      for (; p_done < kc; ++p_done) std::memcpy(out + p_done * kMR, A + i0 + p_done * cs, kMR * sizeof(float));
    }
    for (int64_t p = p_done; p < kc; ++p) {
      float* dst = out + p * kMR;
      for (int64_t i = 0; i < mr; ++i) dst[i] = A[(i0 + i) * rs + p * cs];
      for (int64_t i = mr; i < kMR; ++i) dst[i] = 0.0f;
    }
    out += kc * kMR;
  }
}

// B slice [kc x nc] (element strides rs, cs) -> kNR-column panels, p-major, zero padded.
template <int64_t kNR>
void pack_b(int64_t kc, int64_t nc, const float* B, int64_t rs, int64_t cs, float* out) {
  static_assert(kNR % 8 == 0, "B panels are written in 8-column parts");
  for (int64_t j0 = 0; j0 < nc; j0 += kNR) {
    const int64_t nr = std::min(kNR, nc - j0);
    int64_t p_done = 0;
    if (rs == 1 && nr == kNR) {
      // B is a transposed view (x @ W^T in Linear): each panel column is a contiguous
      // row of W. Read 8 floats from each of 8 rows, transpose in registers, write 8
      // panel rows; a scalar gather here cost as much as a third of the GEMM.
      for (; p_done + 8 <= kc; p_done += 8) {
        for (int64_t part = 0; part < kNR / 8; ++part)
          copy_transposed_8x8(B + (j0 + part * 8) * cs + p_done, cs, out + p_done * kNR + part * 8, kNR);
      }
    }
    for (int64_t p = p_done; p < kc; ++p) {
      const float* src = B + p * rs + j0 * cs;
      float* dst = out + p * kNR;
      if (cs == 1 && nr == kNR) {
        std::memcpy(dst, src, kNR * sizeof(float));
        continue;
      }
      for (int64_t j = 0; j < nr; ++j) dst[j] = src[j * cs];
      for (int64_t j = nr; j < kNR; ++j) dst[j] = 0.0f;
    }
    out += kc * kNR;
  }
}

// Packing buffers, 64-byte aligned, reused across calls of this thread.
float* aligned_scratch(std::vector<float>& v, int64_t n) {
  v.resize(static_cast<size_t>(n) + 16);
  auto addr = reinterpret_cast<uintptr_t>(v.data());
  return reinterpret_cast<float*>((addr + 63) & ~static_cast<uintptr_t>(63));
}

// C [m x n] (row stride ldc, contiguous rows) = A [m x k] @ B [k x n], any element strides.
template <typename Tile>
void packed_sgemm(int64_t m, int64_t n, int64_t k, const float* A, int64_t rsa, int64_t csa,
                  const float* B, int64_t rsb, int64_t csb, float* C, int64_t ldc) {
  constexpr int64_t kMR = Tile::kMR, kNR = Tile::kNR, kKC = Tile::kKC;
  static_assert(kMC % kMR == 0, "an A block is whole panels");
  static thread_local std::vector<float> a_buffer, b_buffer;
  float* ap = aligned_scratch(a_buffer, kMC * kKC);
  float* bp = aligned_scratch(b_buffer, kKC * std::min(kNC, (n + kNR - 1) / kNR * kNR));
  alignas(64) float tile[kMR * kNR];
  for (int64_t jc = 0; jc < n; jc += kNC) {
    const int64_t nc = std::min(kNC, n - jc);
    for (int64_t pc = 0; pc < k; pc += kKC) {
      const int64_t kc = std::min(kKC, k - pc);
      const bool acc = pc > 0;
      pack_b<kNR>(kc, nc, B + pc * rsb + jc * csb, rsb, csb, bp);
      for (int64_t ic = 0; ic < m; ic += kMC) {
        const int64_t mc = std::min(kMC, m - ic);
        pack_a<kMR>(mc, kc, A + ic * rsa + pc * csa, rsa, csa, ap);
        for (int64_t jr = 0; jr < nc; jr += kNR) {
          const int64_t nr = std::min(kNR, nc - jr);
          for (int64_t ir = 0; ir < mc; ir += kMR) {
            const int64_t mr = std::min(kMR, mc - ir);
            float* c = C + (ic + ir) * ldc + jc + jr;
            if (mr == kMR && nr == kNR) {
              Tile::run(kc, ap + ir * kc, bp + jr * kc, c, ldc, acc);
            } else {  // edge tile: full tile into scratch, then the valid part
              Tile::run(kc, ap + ir * kc, bp + jr * kc, tile, kNR, false);
              for (int64_t i = 0; i < mr; ++i)
                for (int64_t j = 0; j < nr; ++j) {
                  c[i * ldc + j] = (acc ? c[i * ldc + j] : 0.0f) + tile[i * kNR + j];
                }
            }
          }
        }
      }
    }
  }
}

void packed_sgemm(int64_t m, int64_t n, int64_t k, const float* A, int64_t rsa, int64_t csa,
                  const float* B, int64_t rsb, int64_t csb, float* C, int64_t ldc) {
#ifdef RINGTRAIN_PACKED_SGEMM_AVX512
  if (chosen_tile() == SgemmTile::kAvx512) {
    packed_sgemm<Avx512Tile>(m, n, k, A, rsa, csa, B, rsb, csb, C, ldc);
    return;
  }
#endif
  packed_sgemm<Avx2Tile>(m, n, k, A, rsa, csa, B, rsb, csb, C, ldc);
}
#endif  // RINGTRAIN_PACKED_SGEMM

// Makes a matrix operand Map-able: returns it as is when one stride is 1 (and the other is a
// valid outer stride), otherwise copies it (converting T -> C) into `scratch`.
template <typename T, typename C>
MatRef<C> prepare(const T* p, int64_t rows, int64_t cols, int64_t rs, int64_t cs,
                  std::vector<C>& scratch) {
  if constexpr (std::is_same_v<T, C>) {
    if (cs == 1 && rs >= std::max<int64_t>(cols, 1)) return {p, rows, cols, rs, 1};
    if (rs == 1 && cs >= std::max<int64_t>(rows, 1)) return {p, rows, cols, 1, cs};
  }
  scratch.resize(static_cast<size_t>(rows * cols));
  for (int64_t i = 0; i < rows; ++i) detail::load_run(p + i * rs, cs, scratch.data() + i * cols, cols);
  return {scratch.data(), rows, cols, std::max<int64_t>(cols, 1), 1};
}

template <typename T>
void batched_matmul_typed(const Tensor& a, const Tensor& b, const Tensor& out) {
  using C = detail::Compute<T>;
  const int64_t B = out.size(0), m = out.size(1), n = out.size(2), k = a.size(2);
  const T* ap = a.data<T>();
  const T* bp = b.data<T>();
  T* op = out.data<T>();
  std::vector<C> a_scratch, b_scratch, y_scratch;
  if constexpr (!std::is_same_v<T, C>) y_scratch.resize(static_cast<size_t>(m * n));
  for (int64_t i = 0; i < B; ++i) {
    C* y;
    if constexpr (std::is_same_v<T, C>) {
      y = op + i * m * n;
    } else {
      y = y_scratch.data();
    }
    if (k == 0) {
      std::fill_n(y, m * n, C(0));
    } else {
#ifdef RINGTRAIN_PACKED_SGEMM
      if constexpr (std::is_same_v<C, float>) {
        if constexpr (std::is_same_v<T, float>) {  // packing reads any strides directly
          packed_sgemm(m, n, k, ap + i * a.stride(0), a.stride(1), a.stride(2), bp + i * b.stride(0),
                       b.stride(1), b.stride(2), y, n);
        } else {  // 16-bit floats: convert to contiguous f32 first
          MatRef<C> am = prepare<T, C>(ap + i * a.stride(0), m, k, a.stride(1), a.stride(2), a_scratch);
          MatRef<C> bm = prepare<T, C>(bp + i * b.stride(0), k, n, b.stride(1), b.stride(2), b_scratch);
          packed_sgemm(m, n, k, am.data, am.row_stride, am.col_stride, bm.data, bm.row_stride,
                       bm.col_stride, y, n);
        }
        if constexpr (!std::is_same_v<T, C>) detail::store_run(y, op + i * m * n, 1, m * n);
        continue;
      }
#endif
      MatRef<C> am = prepare<T, C>(ap + i * a.stride(0), m, k, a.stride(1), a.stride(2), a_scratch);
      MatRef<C> bm = prepare<T, C>(bp + i * b.stride(0), k, n, b.stride(1), b.stride(2), b_scratch);
      gemm(am, bm, y);
    }
    if constexpr (!std::is_same_v<T, C>) detail::store_run(y, op + i * m * n, 1, m * n);
  }
}

}  // namespace

const char* sgemm_kernel_name() {
  switch (chosen_tile()) {
#ifdef RINGTRAIN_PACKED_SGEMM_AVX512
    case SgemmTile::kAvx512: return Avx512Tile::kName;
#endif
#ifdef RINGTRAIN_PACKED_SGEMM
    case SgemmTile::kAvx2: return Avx2Tile::kName;
#endif
    default: return "eigen";
  }
}

void batched_matmul(const Tensor& a, const Tensor& b, const Tensor& out) {
  RT_CHECK(a.dim() == 3 && b.dim() == 3 && out.dim() == 3 && a.size(0) == out.size(0) &&
               b.size(0) == out.size(0) && a.size(1) == out.size(1) && b.size(2) == out.size(2) &&
               a.size(2) == b.size(1),
           "matmul (cpu kernel): a ", a.describe(), " @ b ", b.describe(), " -> out ",
           out.describe(), ": expected [B,m,k] @ [B,k,n] -> [B,m,n]");
  RT_CHECK(a.dtype() == b.dtype() && a.dtype() == out.dtype(), "matmul (cpu kernel): dtypes of ",
           a.describe(), ", ", b.describe(), ", ", out.describe(), " differ");
  RT_CHECK(is_floating_point(a.dtype()), "matmul: floating-point dtypes only, got ", a.describe());
  RT_CHECK(out.is_contiguous(), "matmul (cpu kernel): output ", out.describe(), " must be contiguous");
  if (out.numel() == 0) return;
  chosen_tile();  // a bad RINGTRAIN_CPU_GEMM fails here in every build, whatever the dtype
  dispatch_dtype(a.dtype(), [&](auto tag) {
    using T = decltype(tag);
    if constexpr (detail::kIsFloat<T>) batched_matmul_typed<T>(a, b, out);
  });
}

}  // namespace ringtrain::kernels::cpu
