// SPDX-License-Identifier: BSD-3-Clause
// GELU, exact (erf, nanoGPT's default) or the tanh approximation.
//   erf:   y = x/2 (1 + erf(x/sqrt2))
//   tanh:  y = x/2 (1 + tanh(u)),  u = sqrt(2/pi) (x + 0.044715 x^3)
// Saves nothing: reverse and tangent recompute from the pre-activation x.
#pragma once
#include "core/compat.hpp"
#include "core/types.hpp"
#include "kernels/check.hpp"
#include "model/config.hpp"

namespace gnh::kernels {

template <class T>
KOKKOS_INLINE_FUNCTION T gelu_value(T x, bool exact) {
  if (exact) return T(0.5) * x * (T(1) + kmath::erf(x * T(0.70710678118654752440)));
  const T u = T(0.79788456080286535588) * (x + T(0.044715) * x * x * x);
  return T(0.5) * x * (T(1) + kmath::tanh(u));
}

template <class T>
void gelu_forward(const ExecSpace& space, Span2<T> y, Span2<const T> x, Gelu kind) {
  const index_t N = x.extent(0), C = x.extent(1);
  require_extent("gnh::gelu::forward", "y rows", y.extent(0), N);
  require_extent("gnh::gelu::forward", "y cols", y.extent(1), C);
  const bool exact = kind == Gelu::erf;
  Kokkos::parallel_for(
      "gnh::gelu::forward", range(space, N * C), KOKKOS_LAMBDA(const index_t i) {
        y(i / C, i % C) = gelu_value(x(i / C, i % C), exact);
      });
}

}  // namespace gnh::kernels
