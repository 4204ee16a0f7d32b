// SPDX-License-Identifier: BSD-3-Clause
// Residual connection.  forward: y = a + b   (y may alias a). Saves nothing.
#pragma once
#include "core/types.hpp"
#include "kernels/check.hpp"

namespace gnh::kernels {

template <class T>
void residual_forward(const ExecSpace& space, Span2<T> y, Span2<const T> a, Span2<const T> b) {
  const index_t N = a.extent(0), C = a.extent(1);
  require_extent("gnh::residual::forward", "b rows", b.extent(0), N);
  require_extent("gnh::residual::forward", "b cols", b.extent(1), C);
  require_extent("gnh::residual::forward", "y rows", y.extent(0), N);
  require_extent("gnh::residual::forward", "y cols", y.extent(1), C);
  Kokkos::parallel_for(
      "gnh::residual::forward", range(space, N * C), KOKKOS_LAMBDA(const index_t i) {
        y(i / C, i % C) = a(i / C, i % C) + b(i / C, i % C);
      });
}

}  // namespace gnh::kernels
