// SPDX-License-Identifier: BSD-3-Clause
// Blocked, packed sgemm (the loop order of Goto's algorithm): B is packed in
// KC x NR slivers per NC-column block (kept in L2/L3), A in MR x KC slivers per
// MC-row block (kept in L2), and a register-tile micro-kernel accumulates an
// MR x NR tile of C over KC. The micro-kernels are compiled for their
// instruction sets with target attributes, so the library itself needs no
// -march flag and runs on any x86-64.
#include "kernels/host_gemm.hpp"
#include "core/isa.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <new>
#include <optional>
#include <stdexcept>
#include <string>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define GNH_HOST_GEMM_X86 1
#include <cpuid.h>
#include <immintrin.h>
#endif

// The Fortran BLAS entry point and OpenBLAS's thread control, declared weak:
// present when the link has a host BLAS (Kokkos Kernels' BLAS TPL), null
// otherwise (a CUDA build with cuBLAS only).
extern "C" {
void sgemm_(const char* transa, const char* transb, const int* m, const int* n, const int* k, const float* alpha,
            const float* a, const int* lda, const float* b, const int* ldb, const float* beta, float* c, const int* ldc)
    __attribute__((weak));
void dgemm_(const char* transa, const char* transb, const int* m, const int* n, const int* k, const double* alpha,
            const double* a, const int* lda, const double* b, const int* ldb, const double* beta, double* c,
            const int* ldc) __attribute__((weak));
void openblas_set_num_threads(int threads) __attribute__((weak));
int openblas_get_num_threads(void) __attribute__((weak));
}

namespace gnh::kernels::host {

namespace {

constexpr std::int64_t KC = 256;   // depth of a packed block: an A sliver is 12 x 256 x 4 B = 12 KiB
constexpr std::int64_t MC = 120;   // rows per packed A block (multiple of both MRs): 120 KiB, L2
constexpr std::int64_t NC = 2048;  // columns per packed B block (multiple of both NRs): 2 MiB

struct FreeDeleter {
  void operator()(float* p) const { std::free(p); }
};

// Packing buffers, one pair per thread, grown on demand.
struct Buffers {
  std::unique_ptr<float, FreeDeleter> a, b;
  std::int64_t a_size = 0, b_size = 0;
  float* get(std::unique_ptr<float, FreeDeleter>& p, std::int64_t& size, std::int64_t need) {
    if (size < need) {
      const std::size_t bytes = ((std::size_t(need) * sizeof(float) + 63) / 64) * 64;
      p.reset(static_cast<float*>(std::aligned_alloc(64, bytes)));
      if (!p) throw std::bad_alloc();
      size = need;
    }
    return p.get();
  }
};
thread_local Buffers buffers;

// Rows [p0, p0+kc) of a row-major X (rows ld apart), columns [c0, c0+cn),
// into W-wide slivers: columns c0 + s .. c0 + s + W - 1 as dst[s kc + p W + j],
// columns past cn zero. It packs a transposed A's block (W = MR, X = A stored
// (k, m)) and a row-major B's (W = NR, X = B stored (k, n)). Row of X by row
// of X: each row is read once and in order (one stream the prefetcher
// follows), feeding every sliver.
template <int W>
void pack_rows(const float* X, std::int64_t ld, std::int64_t p0, std::int64_t kc, std::int64_t c0, std::int64_t cn,
               float* dst) {
  const std::int64_t full = cn / W * W, tail = cn - full;
  for (std::int64_t p = 0; p < kc; ++p) {
    const float* s = X + (p0 + p) * ld + c0;
    float* d = dst + p * W;
    for (std::int64_t j = 0; j < full; j += W) std::memcpy(d + j * kc, s + j, sizeof(float) * W);
    if (tail > 0) {
      float* dt = d + full * kc;
      std::int64_t j = 0;
      for (; j < tail; ++j) dt[j] = s[full + j];
      for (; j < W; ++j) dt[j] = 0.0f;
    }
  }
}

// Rows [r0, r0+rn) of a row-major X (rows ld apart), each read along its
// columns [p0, p0+kc) as one stream, into one W-wide sliver dst[p][W], rows
// past rn zero: a partial sliver of a row-major A (W = MR, X = A stored
// (m, k); full ones are read in place) or of a transposed B (W = NR, X = B
// stored (n, k); full ones go to the vector transposes, pack_b_t_t8).
template <int W>
void pack_streams(const float* X, std::int64_t ld, std::int64_t r0, std::int64_t rn, std::int64_t p0, std::int64_t kc,
                  float* dst) {
  const float* rows[W];
  for (std::int64_t i = 0; i < W; ++i) rows[i] = X + (r0 + (i < rn ? i : 0)) * ld + p0;
  for (std::int64_t p = 0; p < kc; ++p)
    for (int i = 0; i < W; ++i) dst[p * W + i] = i < rn ? rows[i][p] : 0.0f;
}

// The update of a partial tile from the accumulators in t (row stride NR):
// the same operations, in the same order, as the vector update of a full tile.
template <int NR>
void update_partial(const float* t, float* C, std::int64_t ldc, float alpha, float beta, int mr, int nr) {
  for (int i = 0; i < mr; ++i)
    for (int j = 0; j < nr; ++j) {
      float& c = C[i * ldc + j];
      c = beta == 0.0f ? alpha * t[i * NR + j] : std::fma(alpha, t[i * NR + j], beta * c);
    }
}

#ifdef GNH_HOST_GEMM_X86

// Where a micro-kernel reads A(i, p) of its sliver: from the packed copy (p
// by p, MR values each) or, Direct, from a full sliver of a row-major A where
// it lies (rows lda apart). The blocked loop reads every full sliver of a
// row-major A in place: packing them streamed the whole of A through memory
// once more, and the stacked directions' A (8192 x 512 floats at preset
// small) is in neither L1 nor L2; a sliver in place is MR rows of kc floats,
// in L1 or L2 while the kernel reuses it along the block's columns. Measured
// on the Zen 5, AVX2 kernel, minimum of 5 samples over 6 interleaved runs,
// preset small: second-order forward at K = 16 25.27-26.36 -> 24.46-25.23 ms
// per direction, gradient 22.36-22.39 -> 21.52-21.72 ms; AVX-512 kernel
// (4 runs) 15.22 -> 14.82 ms and 13.05 -> 12.35 ms; linear second order
// (bench_kernels) AVX2 44.5-45.4 -> 43.5-44.4 ms, AVX-512 28.0-29.7 ->
// 24.3-25.1 ms.
template <bool Direct, int MR>
inline const float* a_at(const float* A, std::int64_t lda, int i, std::int64_t p) {
  return Direct ? A + i * lda + p : A + p * MR + i;
}

constexpr int MR512 = 12, NR512 = 32;

template <bool Direct>
__attribute__((target("avx512f"))) void micro_avx512(std::int64_t kc, const float* __restrict A, std::int64_t lda,
                                                     const float* __restrict Bp, float* C, std::int64_t ldc,
                                                     float alpha, float beta, int mr, int nr) {
  // The C tile's 24 cache lines are fetched while the k loop runs (as in
  // micro_avx2): bench_kernels --directions 16 pinned to avx512 on Zen 5,
  // linear second order 28.4-29.2 -> 25.6-26.9 ms, LM head 52-53 -> 50-52.
  for (int i = 0; i < MR512; ++i) {
    _mm_prefetch(reinterpret_cast<const char*>(C + i * ldc), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(C + i * ldc + NR512 - 1), _MM_HINT_T0);
  }
  __m512 c0[MR512], c1[MR512];
#pragma GCC unroll 12
  for (int i = 0; i < MR512; ++i) c0[i] = c1[i] = _mm512_setzero_ps();
  for (std::int64_t p = 0; p < kc; ++p) {
    const __m512 b0 = _mm512_load_ps(Bp + p * NR512), b1 = _mm512_load_ps(Bp + p * NR512 + 16);
#pragma GCC unroll 12
    for (int i = 0; i < MR512; ++i) {
      const __m512 ai = _mm512_set1_ps(*a_at<Direct, MR512>(A, lda, i, p));
      c0[i] = _mm512_fmadd_ps(ai, b0, c0[i]);
      c1[i] = _mm512_fmadd_ps(ai, b1, c1[i]);
    }
  }
  if (mr == MR512 && nr == NR512) {
    const __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta);
#pragma GCC unroll 12
    for (int i = 0; i < MR512; ++i) {
      float* c = C + i * ldc;
      if (beta == 0.0f) {
        _mm512_storeu_ps(c, _mm512_mul_ps(va, c0[i]));
        _mm512_storeu_ps(c + 16, _mm512_mul_ps(va, c1[i]));
      } else {
        _mm512_storeu_ps(c, _mm512_fmadd_ps(va, c0[i], _mm512_mul_ps(vb, _mm512_loadu_ps(c))));
        _mm512_storeu_ps(c + 16, _mm512_fmadd_ps(va, c1[i], _mm512_mul_ps(vb, _mm512_loadu_ps(c + 16))));
      }
    }
    return;
  }
  alignas(64) float t[MR512 * NR512];
  for (int i = 0; i < MR512; ++i) {
    _mm512_store_ps(t + i * NR512, c0[i]);
    _mm512_store_ps(t + i * NR512 + 16, c1[i]);
  }
  update_partial<NR512>(t, C, ldc, alpha, beta, mr, nr);
}

constexpr int MR256 = 6, NR256 = 16;

// The 12 accumulators are named variables, not an array: with an array GCC
// keeps a copy on the stack and stores all 12 to it every iteration of the k
// loop (the partial-tile path takes its address), which halved the rate on
// Zen 3. 12 accumulators + 2 B vectors + 1 broadcast fill the 16 ymm registers.
template <bool Direct>
__attribute__((target("avx2,fma"))) void micro_avx2(std::int64_t kc, const float* __restrict A, std::int64_t lda,
                                                    const float* __restrict Bp, float* C, std::int64_t ldc, float alpha,
                                                    float beta, int mr, int nr) {
  static_assert(MR256 == 6 && NR256 == 16, "micro_avx2 is written out for a 6 x 16 tile");
  // The C tile's 12 cache lines are fetched while the k loop runs: a tall
  // product's C (stacked directions: 8192 x 512 floats) is in neither L1 nor
  // L2, and the loads of the update would otherwise stall on each tile.
  for (int i = 0; i < MR256; ++i) {
    _mm_prefetch(reinterpret_cast<const char*>(C + i * ldc), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(C + i * ldc + NR256 - 1), _MM_HINT_T0);
  }
  __m256 c00 = _mm256_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00;
  __m256 c30 = c00, c31 = c00, c40 = c00, c41 = c00, c50 = c00, c51 = c00;
  for (std::int64_t p = 0; p < kc; ++p) {
    const __m256 b0 = _mm256_load_ps(Bp + p * NR256), b1 = _mm256_load_ps(Bp + p * NR256 + 8);
    __m256 ai = _mm256_broadcast_ss(a_at<Direct, MR256>(A, lda, 0, p));
    c00 = _mm256_fmadd_ps(ai, b0, c00);
    c01 = _mm256_fmadd_ps(ai, b1, c01);
    ai = _mm256_broadcast_ss(a_at<Direct, MR256>(A, lda, 1, p));
    c10 = _mm256_fmadd_ps(ai, b0, c10);
    c11 = _mm256_fmadd_ps(ai, b1, c11);
    ai = _mm256_broadcast_ss(a_at<Direct, MR256>(A, lda, 2, p));
    c20 = _mm256_fmadd_ps(ai, b0, c20);
    c21 = _mm256_fmadd_ps(ai, b1, c21);
    ai = _mm256_broadcast_ss(a_at<Direct, MR256>(A, lda, 3, p));
    c30 = _mm256_fmadd_ps(ai, b0, c30);
    c31 = _mm256_fmadd_ps(ai, b1, c31);
    ai = _mm256_broadcast_ss(a_at<Direct, MR256>(A, lda, 4, p));
    c40 = _mm256_fmadd_ps(ai, b0, c40);
    c41 = _mm256_fmadd_ps(ai, b1, c41);
    ai = _mm256_broadcast_ss(a_at<Direct, MR256>(A, lda, 5, p));
    c50 = _mm256_fmadd_ps(ai, b0, c50);
    c51 = _mm256_fmadd_ps(ai, b1, c51);
  }
  const __m256 acc[MR256][2] = {{c00, c01}, {c10, c11}, {c20, c21}, {c30, c31}, {c40, c41}, {c50, c51}};
  if (mr == MR256 && nr == NR256) {
    const __m256 va = _mm256_set1_ps(alpha), vb = _mm256_set1_ps(beta);
    for (int i = 0; i < MR256; ++i) {
      float* c = C + i * ldc;
      if (beta == 0.0f) {
        _mm256_storeu_ps(c, _mm256_mul_ps(va, acc[i][0]));
        _mm256_storeu_ps(c + 8, _mm256_mul_ps(va, acc[i][1]));
      } else {
        _mm256_storeu_ps(c, _mm256_fmadd_ps(va, acc[i][0], _mm256_mul_ps(vb, _mm256_loadu_ps(c))));
        _mm256_storeu_ps(c + 8, _mm256_fmadd_ps(va, acc[i][1], _mm256_mul_ps(vb, _mm256_loadu_ps(c + 8))));
      }
    }
    return;
  }
  alignas(64) float t[MR256 * NR256];
  for (int i = 0; i < MR256; ++i) {
    _mm256_store_ps(t + i * NR256, acc[i][0]);
    _mm256_store_ps(t + i * NR256 + 8, acc[i][1]);
  }
  update_partial<NR256>(t, C, ldc, alpha, beta, mr, nr);
}

// Packing by 8 x 8 transposes in registers: a full sliver of a transposed B
// (NR columns stored as rows of B), 8 values of k at a time. The scalar
// packer reads one float a step from NR strided streams; on the model's
// k = 128 products that cost 5-10% of the product (Zen 3). (A row-major A's
// slivers were packed the same way, by 6 or 12 rows, until the micro-kernels
// read them in place: a_at. On the AVX-512 path the transposes had replaced
// gathers: attention's second order at K = 16 30-31 -> 22 ms on the Zen 5.)
__attribute__((target("avx2,fma"))) inline void transpose8(__m256 r[8]) {
  const __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
  const __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
  const __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
  const __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
  const __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xEE);
  const __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xEE);
  const __m256 u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xEE);
  const __m256 u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xEE);
  r[0] = _mm256_permute2f128_ps(u0, u4, 0x20);
  r[1] = _mm256_permute2f128_ps(u1, u5, 0x20);
  r[2] = _mm256_permute2f128_ps(u2, u6, 0x20);
  r[3] = _mm256_permute2f128_ps(u3, u7, 0x20);
  r[4] = _mm256_permute2f128_ps(u0, u4, 0x31);
  r[5] = _mm256_permute2f128_ps(u1, u5, 0x31);
  r[6] = _mm256_permute2f128_ps(u2, u6, 0x31);
  r[7] = _mm256_permute2f128_ps(u3, u7, 0x31);
}

// A full sliver of a transposed B (NR columns stored as rows of B), NR / 8
// blocks of 8 columns, each 8 values of k at a time by one transpose: the
// AVX2 tile's (NR256) and the AVX-512 tile's (NR512).
template <int NR>
__attribute__((target("avx2,fma"))) void pack_b_t_t8(const float* B, std::int64_t ldb, std::int64_t p0, std::int64_t kc,
                                                     std::int64_t j0, float* dst) {
  static_assert(NR % 8 == 0, "whole blocks of 8 columns");
  std::int64_t p = 0;
  for (; p + 8 <= kc; p += 8)
    for (int blk = 0; blk < NR / 8; ++blk) {
      __m256 r[8];
      for (int j = 0; j < 8; ++j) r[j] = _mm256_loadu_ps(B + (j0 + 8 * blk + j) * ldb + p0 + p);
      transpose8(r);
      for (int q = 0; q < 8; ++q) _mm256_storeu_ps(dst + (p + q) * NR + 8 * blk, r[q]);
    }
  for (; p < kc; ++p)
    for (int j = 0; j < NR; ++j) dst[p * NR + j] = B[(j0 + j) * ldb + p0 + p];
}

#endif

// kc, A (packed, or in place with rows lda apart), packed B, C, ldc, alpha,
// beta, mr, nr.
using Micro = void (*)(std::int64_t, const float*, std::int64_t, const float*, float*, std::int64_t, float, float, int,
                       int);
// The packer of a full sliver of a transposed B.
using PackBt = void (*)(const float*, std::int64_t, std::int64_t, std::int64_t, std::int64_t, float*);

// micro reads packed A slivers, micro_direct full slivers of a row-major A in
// place (a_at); a transposed A and partial slivers are packed.
template <int MR, int NR>
void blocked(Micro micro, Micro micro_direct, PackBt pack_bt, bool ta, bool tb, std::int64_t m, std::int64_t n,
             std::int64_t k, float alpha, const float* A, std::int64_t lda, const float* B, std::int64_t ldb,
             float beta, float* C, std::int64_t ldc) {
  static_assert(MC % MR == 0 && NC % NR == 0, "block sizes must be multiples of the register tile");
  float* Bp = buffers.get(buffers.b, buffers.b_size, KC * std::min<std::int64_t>(NC, (n + NR - 1) / NR * NR));
  float* Ap = buffers.get(buffers.a, buffers.a_size, KC * MC);
  for (std::int64_t jc = 0; jc < n; jc += NC) {
    const std::int64_t nc = std::min(NC, n - jc);
    for (std::int64_t pc = 0; pc < k; pc += KC) {
      const std::int64_t kc = std::min(KC, k - pc);
      const float b = pc == 0 ? beta : 1.0f;
      if (!tb) pack_rows<NR>(B, ldb, pc, kc, jc, nc, Bp);
      else
        for (std::int64_t jr = 0; jr < nc; jr += NR) {
          const std::int64_t nr = std::min<std::int64_t>(NR, nc - jr);
          if (nr == NR) pack_bt(B, ldb, pc, kc, jc + jr, Bp + jr * kc);
          else pack_streams<NR>(B, ldb, jc + jr, nr, pc, kc, Bp + jr * kc);
        }
      for (std::int64_t ic = 0; ic < m; ic += MC) {
        const std::int64_t mc = std::min(MC, m - ic);
        if (ta) pack_rows<MR>(A, lda, pc, kc, ic, mc, Ap);
        else
          for (std::int64_t ir = 0; ir < mc; ir += MR) {
            const std::int64_t mr = std::min<std::int64_t>(MR, mc - ir);
            if (mr < MR) pack_streams<MR>(A, lda, ic + ir, mr, pc, kc, Ap + ir * kc);
          }
        for (std::int64_t jr = 0; jr < nc; jr += NR)
          for (std::int64_t ir = 0; ir < mc; ir += MR) {
            const int mr = int(std::min<std::int64_t>(MR, mc - ir)), nr = int(std::min<std::int64_t>(NR, nc - jr));
            float* Ct = C + (ic + ir) * ldc + jc + jr;
            if (!ta && mr == MR)
              micro_direct(kc, A + (ic + ir) * lda + pc, lda, Bp + jr * kc, Ct, ldc, alpha, b, mr, nr);
            else micro(kc, Ap + ir * kc, 0, Bp + jr * kc, Ct, ldc, alpha, b, mr, nr);
          }
      }
    }
  }
}

// The kernel GNH_HOST_GEMM names, if it names one this CPU runs.
GemmKernel best_supported() {
  if (supported(GemmKernel::avx512)) return GemmKernel::avx512;
  return supported(GemmKernel::avx2) ? GemmKernel::avx2 : GemmKernel::none;
}

// The kernel GNH_HOST_GEMM names, if it names one this CPU runs ("native":
// gnh's best kernel for this CPU, not probed).
std::optional<GemmKernel> forced() {
  const char* env = std::getenv("GNH_HOST_GEMM");
  if (!env) return std::nullopt;
  const std::string v(env);
  if (v == "native") return best_supported();
  const auto k = kernel_named(v);
  if (k && (*k == GemmKernel::none || supported(*k))) return k;
  return std::nullopt;
}

GemmKernel detect() { return forced().value_or(best_supported()); }

std::atomic<int>& selection() {
  static std::atomic<int> s{int(detect())};
  return s;
}

}  // namespace

bool supported(GemmKernel k) {
#ifdef GNH_HOST_GEMM_X86
  if (k == GemmKernel::avx512) return __builtin_cpu_supports("avx512f");
  if (k == GemmKernel::avx2) return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
  (void)k;
#endif
  return false;
}

const char* name(GemmKernel k) {
  switch (k) {
    case GemmKernel::avx512:
      return "avx512";
    case GemmKernel::avx2:
      return "avx2";
    default:
      return "vendor";
  }
}

std::optional<GemmKernel> kernel_named(const std::string& n) {
  for (const GemmKernel k : {GemmKernel::none, GemmKernel::avx2, GemmKernel::avx512})
    if (n == name(k)) return k;
  return std::nullopt;
}

GemmKernel native_kernel() {
  static const GemmKernel k = detect();
  return k;
}

bool kernel_forced() { return forced().has_value(); }

GemmKernel selected_kernel() { return GemmKernel(selection().load(std::memory_order_relaxed)); }

void select_kernel(GemmKernel k) {
  if (k != GemmKernel::none && !supported(k)) throw std::invalid_argument("gnh::host::select_kernel: not supported");
  selection().store(int(k), std::memory_order_relaxed);
}

bool sgemm_using(GemmKernel kernel, bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, float alpha,
                 const float* A, std::int64_t lda, const float* B, std::int64_t ldb, float beta, float* C,
                 std::int64_t ldc) {
  if (kernel == GemmKernel::none || !supported(kernel)) return false;
  if (m <= 0 || n <= 0) return true;
  if (k <= 0) {
    for (std::int64_t i = 0; i < m; ++i)
      for (std::int64_t j = 0; j < n; ++j) C[i * ldc + j] = beta == 0.0f ? 0.0f : beta * C[i * ldc + j];
    return true;
  }
#ifdef GNH_HOST_GEMM_X86
  if (kernel == GemmKernel::avx512) {
    blocked<MR512, NR512>(micro_avx512<false>, micro_avx512<true>, pack_b_t_t8<NR512>, ta, tb, m, n, k, alpha, A, lda,
                          B, ldb, beta, C, ldc);
  } else {
    blocked<MR256, NR256>(micro_avx2<false>, micro_avx2<true>, pack_b_t_t8<NR256>, ta, tb, m, n, k, alpha, A, lda, B,
                          ldb, beta, C, ldc);
  }
  return true;
#else
  (void)ta, (void)tb, (void)alpha, (void)A, (void)lda, (void)B, (void)ldb;
  return false;
#endif
}

bool sgemm(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, float alpha, const float* A,
           std::int64_t lda, const float* B, std::int64_t ldb, float beta, float* C, std::int64_t ldc) {
  return sgemm_using(selected_kernel(), ta, tb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc);
}

bool vendor_panels_available() { return sgemm_ != nullptr; }

void vendor_single_threaded() {
  // A read of one variable in OpenBLAS: cheap enough before every product,
  // and it notices a caller that raised the count since.
  if (openblas_set_num_threads && (!openblas_get_num_threads || openblas_get_num_threads() != 1))
    openblas_set_num_threads(1);
}

bool sgemm_vendor(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, float alpha, const float* A,
                  std::int64_t lda, const float* B, std::int64_t ldb, float beta, float* C, std::int64_t ldc) {
  constexpr std::int64_t big = std::int64_t(1) << 31;
  if (!sgemm_ || m >= big || n >= big || k >= big || lda >= big || ldb >= big || ldc >= big) return false;
  if (m <= 0 || n <= 0) return true;
  // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: the
  // operands swap, each keeping its transposition flag.
  const int mi = int(n), ni = int(m), ki = int(k), la = int(std::max<std::int64_t>(1, ldb)),
            lb = int(std::max<std::int64_t>(1, lda)), lc = int(std::max<std::int64_t>(1, ldc));
  const char oa = tb ? 'T' : 'N', ob = ta ? 'T' : 'N';
  sgemm_(&oa, &ob, &mi, &ni, &ki, &alpha, B, &la, A, &lb, &beta, C, &lc);
  return true;
}

std::int64_t panel_count(std::int64_t m, std::int64_t n, std::int64_t threads) {
  const std::int64_t longest = std::max(m, n);
  return std::max<std::int64_t>(1, std::min(threads, longest / kMinPanel));
}

Panel panel_of(std::int64_t m, std::int64_t n, std::int64_t count, std::int64_t index) {
  // Panels in units of 16 rows or columns (whole AVX2 column tiles; the bits
  // do not depend on where a panel starts), the remainder spread one unit at
  // a time.
  constexpr std::int64_t tile = 16;
  const bool by_rows = m >= n;
  const std::int64_t extent = by_rows ? m : n, tiles = (extent + tile - 1) / tile;
  const std::int64_t base = tiles / count, extra = tiles % count;
  const std::int64_t t0 = index * base + std::min(index, extra), t1 = t0 + base + (index < extra ? 1 : 0);
  const std::int64_t a = std::min(extent, t0 * tile), b = std::min(extent, t1 * tile);
  return by_rows ? Panel{a, b - a, 0, n} : Panel{0, m, a, b - a};
}

bool sgemm_panel(GemmKernel kernel, const Panel& p, bool ta, bool tb, std::int64_t k, float alpha, const float* A,
                 std::int64_t lda, const float* B, std::int64_t ldb, float beta, float* C, std::int64_t ldc) {
  // Rows i0.. of op(A): rows of A, or columns where A is stored transposed;
  // columns j0.. of op(B) likewise.
  const float* Ap = A + (ta ? p.i0 : p.i0 * lda);
  const float* Bp = B + (tb ? p.j0 * ldb : p.j0);
  if (kernel == GemmKernel::none)
    return sgemm_vendor(ta, tb, p.m, p.n, k, alpha, Ap, lda, Bp, ldb, beta, C + p.i0 * ldc + p.j0, ldc);
  if (p.m <= 0 || p.n <= 0) return supported(kernel);
  return sgemm_using(kernel, ta, tb, p.m, p.n, k, alpha, Ap, lda, Bp, ldb, beta, C + p.i0 * ldc + p.j0, ldc);
}

namespace {
// Row-major C = alpha op(A) op(B) + beta C in plain loops (the order of
// additions: p = 0..k-1 for each element).
template <class T>
void gemm_loops(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, T alpha, const T* A, std::int64_t lda,
                const T* B, std::int64_t ldb, T beta, T* C, std::int64_t ldc) {
  for (std::int64_t i = 0; i < m; ++i)
    for (std::int64_t j = 0; j < n; ++j) {
      T s = T(0);
      for (std::int64_t p = 0; p < k; ++p)
        s += (ta ? A[p * lda + i] : A[i * lda + p]) * (tb ? B[j * ldb + p] : B[p * ldb + j]);
      T& c = C[i * ldc + j];
      c = beta == T(0) ? alpha * s : alpha * s + beta * c;
    }
}
}  // namespace

void gemm_one(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, float alpha, const float* A,
              std::int64_t lda, const float* B, std::int64_t ldb, float beta, float* C, std::int64_t ldc) {
  if (m <= 0 || n <= 0) return;
  // The selection's kernel: a choice of the vendor BLAS (probed, recorded or
  // pinned) multiplies every product with it, so that one name stands for one
  // set of bits.
  const GemmKernel kernel = selected_kernel();
  if (kernel != GemmKernel::none && sgemm_using(kernel, ta, tb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc)) return;
  vendor_single_threaded();
  if (sgemm_vendor(ta, tb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc)) return;
  gemm_loops(ta, tb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc);
}

void gemm_one(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, double alpha, const double* A,
              std::int64_t lda, const double* B, std::int64_t ldb, double beta, double* C, std::int64_t ldc) {
  if (m <= 0 || n <= 0) return;
  constexpr std::int64_t big = std::int64_t(1) << 31;
  if (dgemm_ && std::max({m, n, k, lda, ldb, ldc}) < big) {
    vendor_single_threaded();
    // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T.
    const int mi = int(n), ni = int(m), ki = int(k), la = int(std::max<std::int64_t>(1, ldb)),
              lb = int(std::max<std::int64_t>(1, lda)), lc = int(std::max<std::int64_t>(1, ldc));
    const char oa = tb ? 'T' : 'N', ob = ta ? 'T' : 'N';
    if (k > 0) {
      dgemm_(&oa, &ob, &mi, &ni, &ki, &alpha, B, &la, A, &lb, &beta, C, &lc);
      return;
    }
  }
  gemm_loops(ta, tb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc);
}
}  // namespace gnh::kernels::host

namespace gnh {
const char* host_isa_level() {
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
  if (__builtin_cpu_supports("x86-64-v4")) return "x86-64-v4";
  if (__builtin_cpu_supports("x86-64-v3")) return "x86-64-v3";
  if (__builtin_cpu_supports("x86-64-v2")) return "x86-64-v2";
  return "x86-64";
#elif defined(__x86_64__)
  return "x86-64";
#elif defined(__aarch64__)
  return "aarch64";
#else
  return "host";
#endif
}

std::string host_cpu_class() {
  std::string model;
#if defined(GNH_HOST_GEMM_X86)
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (__get_cpuid(0x80000000u, &a, &b, &c, &d) && a >= 0x80000004u) {
    char brand[49] = {};
    for (unsigned leaf = 0; leaf < 3; ++leaf) {
      __get_cpuid(0x80000002u + leaf, &a, &b, &c, &d);
      std::memcpy(brand + 16 * leaf, &a, 4);
      std::memcpy(brand + 16 * leaf + 4, &b, 4);
      std::memcpy(brand + 16 * leaf + 8, &c, 4);
      std::memcpy(brand + 16 * leaf + 12, &d, 4);
    }
    model = brand;
  }
  unsigned family = 0, number = 0;
  if (__get_cpuid(1, &a, &b, &c, &d)) {
    family = (a >> 8) & 0xF;
    number = (a >> 4) & 0xF;
    if (family == 0xF) family += (a >> 20) & 0xFF;
    if (family == 0x6 || family >= 0xF) number += ((a >> 16) & 0xF) << 4;
  }
  const std::size_t first = model.find_first_not_of(' '), last = model.find_last_not_of(' ');
  model = first == std::string::npos ? "x86-64" : model.substr(first, last - first + 1);
  return model + " (family " + std::to_string(family) + " model " + std::to_string(number) + ", " + host_isa_level() +
         ")";
#else
  // Arm and others: /proc/cpuinfo's implementer and part numbers name the core.
  std::ifstream info("/proc/cpuinfo");
  std::string line, implementer, part;
  while (std::getline(info, line)) {
    auto value = [&](const char* key) {
      if (line.rfind(key, 0) != 0) return std::string();
      const auto colon = line.find(':');
      return colon == std::string::npos ? std::string() : line.substr(line.find_first_not_of(" \t", colon + 1));
    };
    if (implementer.empty()) implementer = value("CPU implementer");
    if (part.empty()) part = value("CPU part");
  }
  model = implementer.empty() ? host_isa_level()
                              : std::string(host_isa_level()) + " implementer " + implementer + " part " + part;
  return model;
#endif
}
}  // namespace gnh
