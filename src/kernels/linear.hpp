// SPDX-License-Identifier: BSD-3-Clause
// Linear layer, PyTorch convention (W is (out, in), row-major). Bilinear in
// (x, W), so every mode is a handful of GEMMs on planes; with W(eps) = W + eps V:
//   forward:  y = x W^T + b
//   tangent:  y.d[k]  = x.d[k] W^T + x V_k^T + b_k          (x.d stacked: one GEMM)
//   second:   y.dd[k] = x.dd[k] W^T + 2 x.d[k] V_k^T          (W'' = 0)
//   reverse:  dx = dy W,  dW += dy^T x,  db += sum_n dy
//   tangent of reverse:
//             dx.d[k] = dy.d[k] W + dy V_k
//             dW.d[k] += dy.d[k]^T x + dy^T x.d[k],  db.d[k] += sum_n dy.d[k]
// Saves nothing; the caller keeps x (and its tangents). Under the bf16-amp
// policy every GEMM operand is rounded to bfloat16 (GemmPolicy).
#pragma once
#include "core/planes.hpp"
#include "kernels/blas.hpp"

namespace gnh::kernels {

namespace detail {
// y (N, out) += broadcast bias b (out), from flat parameter/direction storage.
template <class T>
void add_bias(const ExecSpace& space, T* y, const T* b, index_t N, index_t out) {
  Kokkos::parallel_for(
      "gnh::linear::bias", range(space, N * out), KOKKOS_LAMBDA(const index_t i) { y[i] += b[i % out]; });
}
// g (out) += column sums of dy (N, out), one thread per column, rows in order.
template <class T>
void add_colsum(const ExecSpace& space, T* g, const T* dy, index_t N, index_t out) {
  Kokkos::parallel_for(
      "gnh::linear::reverse::bias", range(space, out), KOKKOS_LAMBDA(const index_t o) {
        T s = 0;
        for (index_t n = 0; n < N; ++n) s += dy[n * out + o];
        g[o] += s;
      });
}
}  // namespace detail

// b < 0: no bias.
template <class T>
void linear_forward(const ExecSpace& space, Act2<T> y, Act2<T> x, Params<T> p, index_t w, index_t b,
                    const GemmPolicy<T>& pol = GemmPolicy<T>()) {
  const index_t N = x.rows(), in = x.cols(), out = y.cols(), K = y.d.extent(0);
  require_extent("gnh::linear::forward", "y rows", y.rows(), N);
  const T* W = p.v.data() + w;
  gemm<T>(space, pol, "N", "T", T(1), x.v, block(W, 0, out, in), T(0), y.v);
  if (b >= 0) detail::add_bias(space, y.v.data(), p.v.data() + b, N, out);
  if (K == 0) return;
  // Stacked over directions: (K*N, in) x (in, out).
  gemm<T>(space, pol, "N", "T", T(1), block(x.d.data(), 0, K * N, in), block(W, 0, out, in), T(0),
          block(y.d.data(), 0, K * N, out));
  for (index_t k = 0; k < K; ++k) {
    const T* Vk = p.d.data() + k * p.d.extent(1);
    gemm<T>(space, pol, "N", "T", T(1), x.v, block(Vk, w, out, in), T(1), block(y.d.data(), k * N * out, N, out));
    if (b >= 0) detail::add_bias(space, y.d.data() + k * N * out, Vk + b, N, out);
  }
  if (y.dd.extent(0) == 0) return;
  gemm<T>(space, pol, "N", "T", T(1), block(x.dd.data(), 0, K * N, in), block(W, 0, out, in), T(0),
          block(y.dd.data(), 0, K * N, out));
  for (index_t k = 0; k < K; ++k) {
    const T* Vk = p.d.data() + k * p.d.extent(1);
    gemm<T>(space, pol, "N", "T", T(2), block(x.d.data(), k * N * in, N, in), block(Vk, w, out, in), T(1),
            block(y.dd.data(), k * N * out, N, out));
  }
}

// dx is overwritten (skipped when it has no rows); g accumulates.
template <class T>
void linear_reverse(const ExecSpace& space, Act2<T> dx, Grads<T> g, Act2<T> dy, Act2<T> x, Params<T> p,
                    index_t w, index_t b, const GemmPolicy<T>& pol = GemmPolicy<T>()) {
  const index_t N = x.rows(), in = x.cols(), out = dy.cols(), K = dy.d.extent(0);
  require_extent("gnh::linear::reverse", "dy rows", dy.rows(), N);
  const T* W = p.v.data() + w;
  if (dx.rows() > 0) gemm<T>(space, pol, "N", "N", T(1), dy.v, block(W, 0, out, in), T(0), dx.v);
  gemm<T>(space, pol, "T", "N", T(1), dy.v, x.v, T(1), block(g.v.data(), w, out, in));
  if (b >= 0) detail::add_colsum(space, g.v.data() + b, dy.v.data(), N, out);
  if (K == 0) return;
  if (dx.rows() > 0)
    gemm<T>(space, pol, "N", "N", T(1), block(dy.d.data(), 0, K * N, out), block(W, 0, out, in), T(0),
            block(dx.d.data(), 0, K * N, in));
  const index_t P = g.d.extent(1);
  for (index_t k = 0; k < K; ++k) {
    const T* Vk = p.d.data() + k * P;
    T* Gk = g.d.data() + k * P;
    if (dx.rows() > 0)
      gemm<T>(space, pol, "N", "N", T(1), dy.v, block(Vk, w, out, in), T(1), block(dx.d.data(), k * N * in, N, in));
    gemm<T>(space, pol, "T", "N", T(1), block(dy.d.data(), k * N * out, N, out), x.v, T(1), block(Gk, w, out, in));
    gemm<T>(space, pol, "T", "N", T(1), dy.v, block(x.d.data(), k * N * in, N, in), T(1), block(Gk, w, out, in));
    if (b >= 0) detail::add_colsum(space, Gk + b, dy.d.data() + k * N * out, N, out);
  }
}

}  // namespace gnh::kernels
