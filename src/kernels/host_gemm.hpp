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

namespace gnh::kernels::host {

enum class GemmKernel { none, avx2, avx512 };

// The best kernel this CPU runs, unless GNH_HOST_GEMM in the environment says
// "vendor" (none: use the vendor BLAS), "avx2" or "avx512" (if supported).
GemmKernel selected_kernel();
bool supported(GemmKernel k);
const char* name(GemmKernel k);  // "vendor", "avx2", "avx512"

// With the selected kernel; false (nothing done) when it is none.
bool sgemm(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, float alpha,
           const float* A, std::int64_t lda, const float* B, std::int64_t ldb, float beta, float* C,
           std::int64_t ldc);

// With a given kernel (tests); false when this CPU does not support it.
bool sgemm_using(GemmKernel kernel, bool trans_a, bool trans_b, std::int64_t m, std::int64_t n,
                 std::int64_t k, float alpha, const float* A, std::int64_t lda, const float* B,
                 std::int64_t ldb, float beta, float* C, std::int64_t ldc);

}  // namespace gnh::kernels::host
