// SPDX-License-Identifier: BSD-3-Clause
// GELU, exact (erf, nanoGPT's default) or the tanh approximation.
//   erf:   y = x Phi(x) = x/2 (1 + erf(x/sqrt2)),  y' = Phi(x) + x phi(x)
//   tanh:  y = x/2 (1 + tanh u),  u = sqrt(2/pi)(x + 0.044715 x^3),
//          y' = (1 + tanh u)/2 + x/2 (1 - tanh^2 u) u'
//   reverse: dx = dy y'(x); tangent/second order and the tangent of the reverse
//   are the same formulas in Dual / Jet2 arithmetic.
// Saves nothing: the other modes recompute from the pre-activation x.
#pragma once
#include "core/planes.hpp"
#include "kernels/check.hpp"
#include "model/config.hpp"

namespace gnh::kernels {

template <class S>
KOKKOS_INLINE_FUNCTION S gelu_value(const S& x, bool exact) {
  using T = base_t<S>;
  if (exact) return T(0.5) * x * (jerf(x * T(0.70710678118654752440)) + T(1));
  const S u = T(0.79788456080286535588) * (x + T(0.044715) * x * x * x);
  return T(0.5) * x * (jtanh(u) + T(1));
}

template <class S>
KOKKOS_INLINE_FUNCTION S gelu_slope(const S& x, bool exact) {
  using T = base_t<S>;
  if (exact)
    return T(0.5) * (jerf(x * T(0.70710678118654752440)) + T(1)) +
           x * jexp(T(-0.5) * x * x) * T(0.39894228040143267794);  // 1/sqrt(2 pi)
  const S u = T(0.79788456080286535588) * (x + T(0.044715) * x * x * x);
  const S th = jtanh(u);
  const S du = T(0.79788456080286535588) * (T(3 * 0.044715) * x * x + T(1));
  return T(0.5) * (th + T(1)) + T(0.5) * x * (T(1) - th * th) * du;
}

template <class S>
void gelu_forward(const ExecSpace& space, Act2<base_t<S>> y, Act2<base_t<S>> x, Gelu kind) {
  using io = Io<S>;
  const index_t N = x.rows(), C = x.cols(), K = directions_of<S>(x);
  require_extent("gnh::gelu::forward", "y rows", y.rows(), N);
  require_extent("gnh::gelu::forward", "y cols", y.cols(), C);
  const bool exact = kind == Gelu::erf;
  Kokkos::parallel_for(
      "gnh::gelu::forward", range(space, N * C), KOKKOS_LAMBDA(const index_t i) {
        const index_t n = i / C, c = i % C;
        for (int k = 0; k < K; ++k) io::put(y, k, n, c, gelu_value(io::get(x, k, n, c), exact));
      });
}

template <class S>
void gelu_reverse(const ExecSpace& space, Act2<base_t<S>> dx, Act2<base_t<S>> dy,
                  Act2<base_t<S>> x, Gelu kind) {
  using io = Io<S>;
  const index_t N = x.rows(), C = x.cols(), K = directions_of<S>(x);
  require_extent("gnh::gelu::reverse", "dy rows", dy.rows(), N);
  require_extent("gnh::gelu::reverse", "dx rows", dx.rows(), N);
  const bool exact = kind == Gelu::erf;
  Kokkos::parallel_for(
      "gnh::gelu::reverse", range(space, N * C), KOKKOS_LAMBDA(const index_t i) {
        const index_t n = i / C, c = i % C;
        for (int k = 0; k < K; ++k)
          io::put(dx, k, n, c, io::get(dy, k, n, c) * gelu_slope(io::get(x, k, n, c), exact));
      });
}

}  // namespace gnh::kernels
