// SPDX-License-Identifier: BSD-3-Clause
// LayerNorm over the channel dimension.
//   forward:  mu = mean(x), rstd = 1/sqrt(var(x) + eps), y = (x - mu) * rstd * w + b
// Saves mu and rstd per row for the other modes (the input x is kept by the caller).
#pragma once
#include "core/compat.hpp"
#include "core/types.hpp"
#include "kernels/check.hpp"

namespace gnh::kernels {

template <class T>
void layernorm_forward(const ExecSpace& space,
                       Span2<T> y,          // (N, C)
                       Span1<T> mean,       // (N)
                       Span1<T> rstd,       // (N)
                       Span2<const T> x,    // (N, C)
                       Span1<const T> w,    // (C)
                       Span1<const T> b,    // (C) or empty: no bias
                       double eps) {
  const index_t N = x.extent(0), C = x.extent(1);
  require_extent("gnh::layernorm::forward", "y rows", y.extent(0), N);
  require_extent("gnh::layernorm::forward", "y cols", y.extent(1), C);
  require_extent("gnh::layernorm::forward", "mean", mean.extent(0), N);
  require_extent("gnh::layernorm::forward", "rstd", rstd.extent(0), N);
  require_extent("gnh::layernorm::forward", "weight", w.extent(0), C);
  const bool has_bias = b.extent(0) > 0;
  if (has_bias) require_extent("gnh::layernorm::forward", "bias", b.extent(0), C);
  const T teps = static_cast<T>(eps);
  Kokkos::parallel_for(
      "gnh::layernorm::forward", range(space, N), KOKKOS_LAMBDA(const index_t n) {
        // Two passes (mean, then centred squares) for accuracy in float.
        T s = 0;
        for (index_t c = 0; c < C; ++c) s += x(n, c);
        const T mu = s / T(C);
        T v = 0;
        for (index_t c = 0; c < C; ++c) {
          const T d = x(n, c) - mu;
          v += d * d;
        }
        const T r = T(1) / kmath::sqrt(v / T(C) + teps);
        mean(n) = mu;
        rstd(n) = r;
        for (index_t c = 0; c < C; ++c) {
          const T yn = (x(n, c) - mu) * r * w(c);
          y(n, c) = has_bias ? yn + b(c) : yn;
        }
      });
}

}  // namespace gnh::kernels
