// SPDX-License-Identifier: BSD-3-Clause
// Language-model head fused with the token cross-entropy (summed over rows;
// the epoch driver divides by the true target count).
//   forward:  z = h W^T (V logits per row), lse = log sum_v exp(z_v),
//             loss_n = lse_n - z_n[target_n]   (0 where target_n < 0)
//   reverse:  dz = softmax(z) - onehot(target),  dh = dz W,  dW += dz^T h
//   tangent:  z.d[k] = h.d[k] W^T + h V_k^T;  second: z.dd[k] = h.dd[k] W^T + 2 h.d[k] V_k^T;
//             lse' = sum softmax(z) z', lse'' = sum softmax(z) (z'' + z'^2) - lse'^2
//   tangent of reverse: dz' = softmax(z) (z' - lse'), then the bilinear rules of linear.hpp
// Rows are processed in chunks so that only (chunk, V) logits (per plane) exist
// at a time, never the full (B*T, V) tensor. Saves lse per row (with tangents);
// the reverse recomputes the chunk's logits from h and W. Under bf16-amp the
// GEMM operands are rounded to bfloat16; lse, softmax and the loss stay FP32.
#pragma once
#include <type_traits>

#include "core/fastmath.hpp"
#include "core/planes.hpp"
#include "kernels/blas.hpp"

namespace gnh::kernels {

namespace detail {
// Logit planes of rows r0 .. r0+nr-1 into z (plane k of the chunk at k*nr*V).
template <class T>
void chunk_logits(const ExecSpace& space, Act2<T> z, Act2<T> h, Params<T> p, index_t w, index_t r0,
                  index_t nr, bool tangents, bool second, const GemmPolicy<T>& pol) {
  const index_t N = h.rows(), C = h.cols(), V = z.cols(), K = h.d.extent(0), P = p.v.extent(0);
  const T* W = p.v.data() + w;
  gemm<T>(space, pol, "N", "T", T(1), block(h.v.data(), r0 * C, nr, C), block(W, 0, V, C), T(0),
          block(z.v.data(), 0, nr, V));
  if (!tangents) return;
  for (index_t k = 0; k < K; ++k) {
    const T* Vk = p.d.data() + k * P;
    T* zk = z.d.data() + k * nr * V;
    gemm<T>(space, pol, "N", "T", T(1), block(h.d.data(), (k * N + r0) * C, nr, C), block(W, 0, V, C), T(0),
            block(zk, 0, nr, V));
    gemm<T>(space, pol, "N", "T", T(1), block(h.v.data(), r0 * C, nr, C), block(Vk, w, V, C), T(1), block(zk, 0, nr, V));
    if (!second) continue;
    T* zkk = z.dd.data() + k * nr * V;
    gemm<T>(space, pol, "N", "T", T(1), block(h.dd.data(), (k * N + r0) * C, nr, C), block(W, 0, V, C), T(0),
            block(zkk, 0, nr, V));
    gemm<T>(space, pol, "N", "T", T(2), block(h.d.data(), (k * N + r0) * C, nr, C), block(Vk, w, V, C), T(1),
            block(zkk, 0, nr, V));
  }
}

template <class T>
Act2<T> chunk_view(const Act2<T>& z, index_t K, index_t nr, index_t V) {
  Act2<T> c;
  c.v = Span2<T>(z.v.data(), nr, V);
  if (z.d.extent(0) > 0) c.d = Span3<T>(z.d.data(), K, nr, V);
  if (z.dd.extent(0) > 0) c.dd = Span3<T>(z.dd.data(), K, nr, V);
  return c;
}
}  // namespace detail

template <class S>
void lm_head_xent_forward(const ExecSpace& space, Act1<double> loss, Act1<base_t<S>> lse,
                          Act2<base_t<S>> h, Params<base_t<S>> p, index_t w,
                          Span1<const std::int32_t> targets, Act2<base_t<S>> z,
                          const GemmPolicy<base_t<S>>& pol = GemmPolicy<base_t<S>>()) {
  using T = base_t<S>;
  const index_t N = h.rows(), V = z.cols(), K = directions_of<S>(h), chunk = z.rows();
  require_extent("gnh::lm_head_xent::forward", "loss", loss.v.extent(0), N);
  require_extent("gnh::lm_head_xent::forward", "targets", targets.extent(0), N);
  if (chunk == 0 && N > 0) throw std::logic_error("gnh::lm_head_xent::forward: empty workspace");
  constexpr bool tangents = !std::is_same<S, T>::value, second = std::is_same<S, Jet2<T>>::value;
  for (index_t r0 = 0; r0 < N; r0 += chunk) {
    const index_t nr = N - r0 < chunk ? N - r0 : chunk;
    const Act2<T> zc = detail::chunk_view(z, K, nr, V);
    detail::chunk_logits(space, zc, h, p, w, r0, nr, tangents, second, pol);
    // The log-sum-exp once per row; each direction then needs only
    // lse' = sum_v q_v z'_v and lse'' = sum_v q_v (z''_v + z'_v^2) - lse'^2
    // with q = softmax(z), recomputed per direction from z and lse.
    Kokkos::parallel_for(
        "gnh::lm_head_xent::forward", range(space, nr), KOKKOS_LAMBDA(const index_t r) {
          const index_t n = r0 + r;
          const std::int32_t tgt = targets(n);
          const T* zr = &zc.v(r, 0);
          T m = zr[0];
          for (index_t v = 1; v < V; ++v) m = zr[v] > m ? zr[v] : m;
          T s = 0;
          for (index_t v = 0; v < V; ++v) s += fast_exp(zr[v] - m);
          const T l = kmath::log(s) + m;
          lse.v(n) = l;
          loss.v(n) = tgt < 0 ? 0.0 : double(l - zr[tgt]);
          if constexpr (tangents) {
            for (index_t k = 0; k < K; ++k) {
              const T* dr = &zc.d(k, r, 0);
              T l1 = 0, l2 = 0;
              if constexpr (second) {
                const T* ddr = &zc.dd(k, r, 0);
                for (index_t v = 0; v < V; ++v) {
                  const T q = fast_exp(zr[v] - l);
                  l1 += q * dr[v];
                  l2 += q * (ddr[v] + dr[v] * dr[v]);
                }
                l2 -= l1 * l1;
                lse.dd(k, n) = l2;
                loss.dd(k, n) = tgt < 0 ? 0.0 : double(l2 - ddr[tgt]);
              } else {
                for (index_t v = 0; v < V; ++v) l1 += fast_exp(zr[v] - l) * dr[v];
              }
              lse.d(k, n) = l1;
              loss.d(k, n) = tgt < 0 ? 0.0 : double(l1 - dr[tgt]);
            }
          }
        });
  }
}

// dh is overwritten; g accumulates the gradient of the summed loss.
// logits_current: z still holds the forward's logits of this batch (one chunk).
template <class S>
void lm_head_xent_reverse(const ExecSpace& space, Act2<base_t<S>> dh, Grads<base_t<S>> g,
                          Act1<base_t<S>> lse, Act2<base_t<S>> h, Params<base_t<S>> p, index_t w,
                          Span1<const std::int32_t> targets, Act2<base_t<S>> z,
                          const GemmPolicy<base_t<S>>& pol = GemmPolicy<base_t<S>>(),
                          bool logits_current = false) {
  using T = base_t<S>;
  constexpr bool tangents = !std::is_same<S, T>::value;
  const index_t N = h.rows(), C = h.cols(), V = z.cols(), K = tangents ? h.d.extent(0) : 0;
  const index_t chunk = z.rows(), P = p.v.extent(0);
  const T* W = p.v.data() + w;
  for (index_t r0 = 0; r0 < N; r0 += chunk) {
    const index_t nr = N - r0 < chunk ? N - r0 : chunk;
    const Act2<T> zc = detail::chunk_view(z, K, nr, V);
    // When every row fits one chunk, the forward just left exactly these logits
    // (value and tangent planes) in z: no need to recompute them.
    if (!(logits_current && nr == N)) detail::chunk_logits(space, zc, h, p, w, r0, nr, tangents, false, pol);
    // dz = softmax - onehot, in place; the value plane is written after every
    // tangent plane has read it.
    Kokkos::parallel_for(
        "gnh::lm_head_xent::reverse::softmax", range(space, nr), KOKKOS_LAMBDA(const index_t r) {
          const index_t n = r0 + r;
          const std::int32_t tgt = targets(n);
          T* zr = &zc.v(r, 0);
          if (tgt < 0) {
            for (index_t k = 0; k < K; ++k)
              for (index_t v = 0; v < V; ++v) zc.d(k, r, v) = 0;
            for (index_t v = 0; v < V; ++v) zr[v] = 0;
            return;
          }
          const T L = lse.v(n);
          if constexpr (tangents) {
            // (softmax z)' = q (z' - lse')
            for (index_t k = 0; k < K; ++k) {
              T* dr = &zc.d(k, r, 0);
              const T l1 = lse.d(k, n);
              for (index_t v = 0; v < V; ++v) dr[v] = fast_exp(zr[v] - L) * (dr[v] - l1);
            }
          }
          for (index_t v = 0; v < V; ++v) zr[v] = fast_exp(zr[v] - L);
          zr[tgt] -= T(1);
        });
    gemm<T>(space, pol, "N", "N", T(1), block(zc.v.data(), 0, nr, V), block(W, 0, V, C), T(0),
            block(dh.v.data(), r0 * C, nr, C));
    gemm<T>(space, pol, "T", "N", T(1), block(zc.v.data(), 0, nr, V), block(h.v.data(), r0 * C, nr, C), T(1),
            block(g.v.data(), w, V, C));
    for (index_t k = 0; k < K; ++k) {
      const T* Vk = p.d.data() + k * P;
      T* Gk = g.d.data() + k * P;
      const T* dzk = zc.d.data() + k * nr * V;
      T* dhk = dh.d.data() + (k * N + r0) * C;
      gemm<T>(space, pol, "N", "N", T(1), block(dzk, 0, nr, V), block(W, 0, V, C), T(0), block(dhk, 0, nr, C));
      gemm<T>(space, pol, "N", "N", T(1), block(zc.v.data(), 0, nr, V), block(Vk, w, V, C), T(1), block(dhk, 0, nr, C));
      gemm<T>(space, pol, "T", "N", T(1), block(dzk, 0, nr, V), block(h.v.data(), r0 * C, nr, C), T(1),
              block(Gk, w, V, C));
      gemm<T>(space, pol, "T", "N", T(1), block(zc.v.data(), 0, nr, V), block(h.d.data(), (k * N + r0) * C, nr, C),
              T(1), block(Gk, w, V, C));
    }
  }
}

}  // namespace gnh::kernels
