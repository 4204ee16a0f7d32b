// SPDX-License-Identifier: BSD-3-Clause
// Mapped batches of products; see gemm_mapped.hpp.
#include "kernels/gemm_mapped.hpp"

#include <algorithm>
#include <stdexcept>
#include <type_traits>

#include "kernels/blas.hpp"
#include "kernels/host_gemm.hpp"

// The Fortran BLAS's dgemm, declared weak like sgemm_ in host_gemm.cpp:
// present when the link has a host BLAS.
extern "C" {
void dgemm_(const char* transa, const char* transb, const int* m, const int* n, const int* k, const double* alpha,
            const double* a, const int* lda, const double* b, const int* ldb, const double* beta, double* c,
            const int* ldc) __attribute__((weak));
}

namespace gnh::kernels {

namespace host {
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
  if (native_kernel() != GemmKernel::none &&
      sgemm_using(native_kernel(), ta, tb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc))
    return;
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
}  // namespace host

#ifdef GNH_CUBLAS_MATH_MODE
namespace {
// Writes the group's pointer arrays: A's at 0, B's at cap, C's at 2 cap.
template <class T>
struct MappedPointers {
  Mapped<const T> A, B;
  Mapped<T> C;
  BatchExtents e;
  index_t first, cap;
  View1<std::uintptr_t> p;
  KOKKOS_INLINE_FUNCTION void operator()(const index_t i) const {
    p(i) = reinterpret_cast<std::uintptr_t>(A.at(e, first + i));
    p(cap + i) = reinterpret_cast<std::uintptr_t>(B.at(e, first + i));
    p(2 * cap + i) = reinterpret_cast<std::uintptr_t>(C.at(e, first + i));
  }
};
}  // namespace
#endif

template <class T>
void gemm_mapped(const ExecSpace& space, bool tf32, bool ta, bool tb, index_t m, index_t n, index_t k, T alpha,
                 const Mapped<const T>& A, const Mapped<const T>& B, T beta, const Mapped<T>& C, const BatchExtents& e,
                 const MappedScratch& scratch) {
  const index_t count = e.count();
  if (count <= 0 || m <= 0 || n <= 0) return;
  const detail::GemmRegion region("gnh::gemm_mapped");
#ifdef GNH_CUBLAS_MATH_MODE
  const index_t cap = scratch.capacity();
  if (cap < 1) throw std::logic_error("gnh::gemm_mapped: no pointer scratch");
  const cublasHandle_t handle = detail::cublas_on(space, false, "gnh::gemm_mapped");
  // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T.
  const cublasOperation_t oa = tb ? CUBLAS_OP_T : CUBLAS_OP_N, ob = ta ? CUBLAS_OP_T : CUBLAS_OP_N;
  constexpr bool is_float = std::is_same_v<T, float>;
  const cudaDataType_t type = is_float ? CUDA_R_32F : CUDA_R_64F;
  const cublasComputeType_t compute =
      is_float ? (tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F) : CUBLAS_COMPUTE_64F;
  for (index_t first = 0; first < count; first += cap) {
    const index_t g = std::min(cap, count - first);
    Kokkos::parallel_for("gnh::gemm_mapped::pointers", range(space, g),
                         MappedPointers<T>{A, B, C, e, first, cap, scratch.pointers});
    const void* const* p = reinterpret_cast<const void* const*>(scratch.pointers.data());
    detail::cublas_check(cublasGemmBatchedEx(handle, oa, ob, int(n), int(m), int(k), &alpha, p + cap, type, int(B.ld),
                                             p, type, int(A.ld), &beta, const_cast<void* const*>(p + 2 * cap), type,
                                             int(C.ld), int(g), compute, CUBLAS_GEMM_DEFAULT),
                         "gnh::gemm_mapped", "mapped products", g, m, n, k);
  }
#else
  (void)tf32, (void)scratch;
  static_assert(Kokkos::SpaceAccessibility<Kokkos::HostSpace, MemSpace>::accessible,
                "gnh::gemm_mapped runs on cuBLAS or on a host backend");
  const auto body = [=](const index_t i) {
    host::gemm_one(ta, tb, m, n, k, alpha, A.at(e, i), A.ld, B.at(e, i), B.ld, beta, C.at(e, i), C.ld);
  };
  if (space.concurrency() <= 1 || count == 1) {
    space.fence();
    for (index_t i = 0; i < count; ++i) body(i);
  } else {
    Kokkos::parallel_for("gnh::gemm_mapped::host",
                         Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<index_t> >(space, 0, count), body);
  }
#endif
}

template void gemm_mapped<float>(const ExecSpace&, bool, bool, bool, index_t, index_t, index_t, float,
                                 const Mapped<const float>&, const Mapped<const float>&, float, const Mapped<float>&,
                                 const BatchExtents&, const MappedScratch&);
template void gemm_mapped<double>(const ExecSpace&, bool, bool, bool, index_t, index_t, index_t, double,
                                  const Mapped<const double>&, const Mapped<const double>&, double,
                                  const Mapped<double>&, const BatchExtents&, const MappedScratch&);

}  // namespace gnh::kernels
