// SPDX-License-Identifier: BSD-3-Clause
// LayerNorm over the channels of each row.
//   forward:  mu = mean(x), r = (var(x) + eps)^(-1/2), xh = (x - mu) r, y = xh w + b
//   reverse:  g = dy w,  dx = r (g - mean(g) - xh mean(g xh)),  dw += sum_n dy xh,  db += sum_n dy
//   tangent / second order: the forward evaluated in Dual / Jet2 arithmetic
//   tangent of reverse:     the reverse evaluated in Dual arithmetic
// Saves mu and r per row (with their tangents in tangent mode); the caller keeps x.
#pragma once
#include "core/planes.hpp"
#include "kernels/check.hpp"

namespace gnh::kernels {

template <class S>
void layernorm_forward(const ExecSpace& space, Act2<base_t<S>> y, Act1<base_t<S>> mean,
                       Act1<base_t<S>> rstd, Act2<base_t<S>> x, Params<base_t<S>> p, index_t w,
                       index_t b, double eps) {
  using T = base_t<S>;
  using io = Io<S>;
  const index_t N = x.rows(), C = x.cols(), K = directions_of<S>(x);
  require_extent("gnh::layernorm::forward", "y rows", y.rows(), N);
  require_extent("gnh::layernorm::forward", "y cols", y.cols(), C);
  require_extent("gnh::layernorm::forward", "mean", mean.v.extent(0), N);
  const T teps = static_cast<T>(eps);
  Kokkos::parallel_for(
      "gnh::layernorm::forward", range(space, N), KOKKOS_LAMBDA(const index_t n) {
        for (int k = 0; k < K; ++k) {
          // Two passes (mean, then centred squares) for accuracy in float.
          S mu(0);
          for (index_t c = 0; c < C; ++c) mu += io::get(x, k, n, c);
          mu = mu / T(C);
          S var(0);
          for (index_t c = 0; c < C; ++c) {
            const S dlt = io::get(x, k, n, c) - mu;
            var += dlt * dlt;
          }
          const S r = T(1) / jsqrt(var / T(C) + teps);
          io::put(mean, k, n, mu);
          io::put(rstd, k, n, r);
          for (index_t c = 0; c < C; ++c) {
            const S yn = (io::get(x, k, n, c) - mu) * r * io::param(p, k, w + c);
            io::put(y, k, n, c, b >= 0 ? yn + io::param(p, k, b + c) : yn);
          }
        }
      });
}

template <class S>
void layernorm_reverse(const ExecSpace& space, Act2<base_t<S>> dx, Grads<base_t<S>> g,
                       Act2<base_t<S>> dy, Act2<base_t<S>> x, Act1<base_t<S>> mean,
                       Act1<base_t<S>> rstd, Params<base_t<S>> p, index_t w, index_t b) {
  using T = base_t<S>;
  using io = Io<S>;
  const index_t N = x.rows(), C = x.cols(), K = directions_of<S>(x);
  require_extent("gnh::layernorm::reverse", "dy rows", dy.rows(), N);
  require_extent("gnh::layernorm::reverse", "dx rows", dx.rows(), N);
  Kokkos::parallel_for(
      "gnh::layernorm::reverse::input", range(space, N), KOKKOS_LAMBDA(const index_t n) {
        for (int k = 0; k < K; ++k) {
          const S mu = io::get(mean, k, n), r = io::get(rstd, k, n);
          S mg(0), mgx(0);
          for (index_t c = 0; c < C; ++c) {
            const S gc = io::get(dy, k, n, c) * io::param(p, k, w + c);
            mg += gc;
            mgx += gc * ((io::get(x, k, n, c) - mu) * r);
          }
          mg = mg / T(C);
          mgx = mgx / T(C);
          for (index_t c = 0; c < C; ++c) {
            const S xh = (io::get(x, k, n, c) - mu) * r;
            const S gc = io::get(dy, k, n, c) * io::param(p, k, w + c);
            io::put(dx, k, n, c, r * (gc - mg - xh * mgx));
          }
        }
      });
  // Weight and bias: one thread per channel, rows summed in order (deterministic).
  Kokkos::parallel_for(
      "gnh::layernorm::reverse::params", range(space, C), KOKKOS_LAMBDA(const index_t c) {
        for (int k = 0; k < K; ++k) {
          S dw(0), db(0);
          for (index_t n = 0; n < N; ++n) {
            const S d = io::get(dy, k, n, c);
            dw += d * ((io::get(x, k, n, c) - io::get(mean, k, n)) * io::get(rstd, k, n));
            db += d;
          }
          io::accumulate(g, k, w + c, dw);
          if (b >= 0) io::accumulate(g, k, b + c, db);
        }
      });
}

}  // namespace gnh::kernels
