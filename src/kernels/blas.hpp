// SPDX-License-Identifier: BSD-3-Clause
// The one GEMM entry point of the kernels: C = alpha op(A) op(B) + beta C on
// contiguous row-major blocks (the only shape Kokkos Kernels hands to the vendor
// BLAS; a strided operand silently falls back to a native kernel ~15x slower).
#pragma once
#include <KokkosBlas3_gemm.hpp>

#include "core/types.hpp"
#include "kernels/check.hpp"

namespace gnh::kernels {

template <class T>
Span2<const T> block(const T* base, index_t offset, index_t rows, index_t cols) {
  return Span2<const T>(base + offset, rows, cols);
}
template <class T>
Span2<T> block(T* base, index_t offset, index_t rows, index_t cols) {
  return Span2<T>(base + offset, rows, cols);
}

// op(A): "N" or "T". Empty products (a zero extent) only scale C.
template <class T>
void gemm(const ExecSpace& space, const char* ta, const char* tb, T alpha, Span2<const T> A,
          Span2<const T> B, T beta, Span2<T> C) {
  const bool at = ta[0] == 'T', bt = tb[0] == 'T';
  const index_t m = at ? A.extent(1) : A.extent(0), ka = at ? A.extent(0) : A.extent(1);
  const index_t kb = bt ? B.extent(1) : B.extent(0), n = bt ? B.extent(0) : B.extent(1);
  require_extent("gnh::gemm", "inner dimension", kb, ka);
  require_extent("gnh::gemm", "C rows", C.extent(0), m);
  require_extent("gnh::gemm", "C cols", C.extent(1), n);
  if (m == 0 || n == 0) return;
  space.fence();
  if (ka == 0) {
    if (beta != T(1)) {
      Kokkos::parallel_for("gnh::gemm::scale", range(space, m * n),
                           KOKKOS_LAMBDA(const index_t i) { C(i / n, i % n) *= beta; });
    }
    return;
  }
  KokkosBlas::gemm(ta, tb, alpha, A, B, beta, C);
}

}  // namespace gnh::kernels
