// SPDX-License-Identifier: BSD-3-Clause
// gnh's own single-precision GEMM for host execution spaces (x86-64 with
// AVX-512F or AVX2+FMA, chosen at run time). Distribution BLAS builds often
// dispatch to generic kernels on CPUs they do not recognise (Debian's OpenBLAS
// 0.3.21 runs its SSE3 "Prescott" sgemm on the development machine: 33 GFLOP/s
// where the core sustains ~4x that), and gnh's GEMMs are small and frequent.
//
// Row-major: C(m,n) = alpha op(A)(m,k) op(B)(k,n) + beta C, with leading
// dimensions. beta == 0 never reads C (BLAS semantics: NaN in C is ignored).
// Each C(i,j) is accumulated in the same order whatever m, n and the position
// of (i,j) are, so a row's result does not depend on the batch around it.
#pragma once
#include <cstdint>
#include <optional>
#include <string>

namespace gnh::kernels::host {

enum class GemmKernel { none, avx2, avx512 };

// gnh's own kernel for this CPU: the best it runs, unless GNH_HOST_GEMM in the
// environment says "vendor" (none), "avx2" or "avx512" (if supported);
// "native" is the best this CPU runs, like the default, but not probed.
GemmKernel native_kernel();
// Whether GNH_HOST_GEMM names a kernel (the choice is then not probed).
bool kernel_forced();
// The kernel of the dense GEMMs (kernels::gemm: linear layers, LM head):
// native_kernel() until select_kernel() sets it (the start-up probe of
// gemm_probe.hpp picks whichever of it and the vendor BLAS is faster).
// Attention's small tiles (gemm_one) follow it: gnh's kernel, or the vendor
// BLAS where that is selected, as GNH_HOST_GEMM=vendor has it.
GemmKernel selected_kernel();
void select_kernel(GemmKernel k);
bool supported(GemmKernel k);
const char* name(GemmKernel k);                                // "vendor", "avx2", "avx512"
std::optional<GemmKernel> kernel_named(const std::string& n);  // the inverse of name()

// With the selected kernel; false (nothing done) when it is none.
bool sgemm(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, float alpha, const float* A,
           std::int64_t lda, const float* B, std::int64_t ldb, float beta, float* C, std::int64_t ldc);

// Threads on one rank: C cut into panels of whole rows (or, when C is wider
// than tall, whole columns), one per thread. Each C(i,j) is accumulated in the
// same order whatever the panel around it, so any panel count gives the same
// bits as one call. A panel is at least kMinPanel rows or columns wide, so
// small products stay on one thread.
constexpr std::int64_t kMinPanel = 48;
struct Panel {
  std::int64_t i0 = 0, m = 0, j0 = 0, n = 0;  // rows i0..i0+m-1, columns j0..j0+n-1 of C
};
// How many panels a product of m x n gets from `threads` threads (at least 1).
std::int64_t panel_count(std::int64_t m, std::int64_t n, std::int64_t threads);
// Panel `index` of `count` (count from panel_count).
Panel panel_of(std::int64_t m, std::int64_t n, std::int64_t count, std::int64_t index);
// The panel's part of C = alpha op(A) op(B) + beta C (the arguments of the
// whole product), with a given kernel, or the vendor BLAS for none; false
// when that kernel cannot run here.
bool sgemm_panel(GemmKernel kernel, const Panel& panel, bool trans_a, bool trans_b, std::int64_t k, float alpha,
                 const float* A, std::int64_t lda, const float* B, std::int64_t ldb, float beta, float* C,
                 std::int64_t ldc);

// The vendor BLAS on threads of gnh's: its Fortran sgemm_ called per panel
// from each thread, with the BLAS's own threads off (openblas_set_num_threads
// where it is OpenBLAS), so two thread pools never share the cores. Available
// when the link holds a host BLAS.
bool vendor_panels_available();
void vendor_single_threaded();  // before each vendor call from gnh; no-op for other BLAS
// Row-major product through the Fortran BLAS; false when there is none (or a
// dimension exceeds its 32-bit integers).
bool sgemm_vendor(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, float alpha,
                  const float* A, std::int64_t lda, const float* B, std::int64_t ldb, float beta, float* C,
                  std::int64_t ldc);

// With a given kernel (tests); false when this CPU does not support it.
bool sgemm_using(GemmKernel kernel, bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k,
                 float alpha, const float* A, std::int64_t lda, const float* B, std::int64_t ldb, float beta, float* C,
                 std::int64_t ldc);

// One product on the calling thread (row-major, lda/ldb/ldc the row strides),
// with the selected kernel: gnh's kernel for this CPU, else the vendor BLAS on
// one thread (Arm; a probe's or GNH_HOST_GEMM's choice), else plain loops;
// for double the vendor's dgemm where the link has one, else the loops. The
// callers (attention's host tiles, the mapped batches) are gnh's threads.
void gemm_one(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, float alpha, const float* A,
              std::int64_t lda, const float* B, std::int64_t ldb, float beta, float* C, std::int64_t ldc);
void gemm_one(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, double alpha, const double* A,
              std::int64_t lda, const double* B, std::int64_t ldb, double beta, double* C, std::int64_t ldc);

}  // namespace gnh::kernels::host
