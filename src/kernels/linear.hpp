// SPDX-License-Identifier: BSD-3-Clause
// Linear layer, PyTorch convention (weight is (out, in), row-major).
//   forward:  y = x W^T + b
// Saves nothing; reverse and tangent need x, which the caller keeps.
// All GEMM operands are contiguous LayoutRight views so that Kokkos Kernels
// dispatches to the vendor BLAS (a strided operand silently falls back to a
// native kernel ~15x slower).
#pragma once
#include <KokkosBlas3_gemm.hpp>

#include "core/types.hpp"
#include "kernels/check.hpp"

namespace gnh::kernels {

template <class T>
void linear_forward(const ExecSpace& space,
                    Span2<T> y,          // (N, out)
                    Span2<const T> x,    // (N, in)
                    Span2<const T> w,    // (out, in)
                    Span1<const T> b) {  // (out) or empty
  const index_t N = x.extent(0), out = w.extent(0);
  require_extent("gnh::linear::forward", "x cols", x.extent(1), w.extent(1));
  require_extent("gnh::linear::forward", "y rows", y.extent(0), N);
  require_extent("gnh::linear::forward", "y cols", y.extent(1), out);
  T beta = 0;
  if (b.extent(0) > 0) {
    require_extent("gnh::linear::forward", "bias", b.extent(0), out);
    Kokkos::parallel_for(
        "gnh::linear::forward::bias", range(space, N * out),
        KOKKOS_LAMBDA(const index_t i) { y(i / out, i % out) = b(i % out); });
    beta = 1;
  }
  if (N == 0) return;
  space.fence();
  KokkosBlas::gemm("N", "T", T(1), x, w, beta, y);
}

}  // namespace gnh::kernels
