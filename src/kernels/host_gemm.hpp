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
// Attention's small tiles always use native_kernel().
GemmKernel selected_kernel();
void select_kernel(GemmKernel k);
bool supported(GemmKernel k);
const char* name(GemmKernel k);  // "vendor", "avx2", "avx512"
std::optional<GemmKernel> kernel_named(const std::string& n);  // the inverse of name()

// With the selected kernel; false (nothing done) when it is none.
bool sgemm(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, float alpha,
           const float* A, std::int64_t lda, const float* B, std::int64_t ldb, float beta, float* C,
           std::int64_t ldc);

// With a given kernel (tests); false when this CPU does not support it.
bool sgemm_using(GemmKernel kernel, bool trans_a, bool trans_b, std::int64_t m, std::int64_t n,
                 std::int64_t k, float alpha, const float* A, std::int64_t lda, const float* B,
                 std::int64_t ldb, float beta, float* C, std::int64_t ldc);

}  // namespace gnh::kernels::host
