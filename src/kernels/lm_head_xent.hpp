// SPDX-License-Identifier: BSD-3-Clause
// Language-model head fused with the token cross-entropy.
//   forward:  z = h W^T (V logits per row), lse = log sum_v exp(z_v),
//             loss_n = lse_n - z_n[target_n]  (0 where target_n < 0)
// Rows are processed in chunks so that only (chunk, V) logits exist at a time,
// never the full (B*T, V) tensor. Saves lse per row; the other modes recompute
// the chunk's logits from h and W.
#pragma once
#include <KokkosBlas3_gemm.hpp>

#include "core/compat.hpp"
#include "core/types.hpp"
#include "kernels/check.hpp"

namespace gnh::kernels {

// Softmax statistics of one row of logits: its log-sum-exp.
template <class T, class Row>
KOKKOS_INLINE_FUNCTION T row_logsumexp(const Row& z, index_t V) {
  T m = z(0);
  for (index_t v = 1; v < V; ++v) m = z(v) > m ? z(v) : m;
  T s = 0;
  for (index_t v = 0; v < V; ++v) s += kmath::exp(z(v) - m);
  return m + kmath::log(s);
}

template <class T>
void lm_head_xent_forward(const ExecSpace& space,
                          Span1<double> loss,                 // (N) per-row loss
                          Span1<T> lse,                       // (N)
                          Span2<const T> h,                   // (N, C)
                          Span2<const T> w,                   // (V, C)
                          Span1<const std::int32_t> targets,  // (N)
                          Span2<T> logits) {                  // (chunk, V) workspace
  const index_t N = h.extent(0), C = h.extent(1), V = w.extent(0);
  require_extent("gnh::lm_head_xent::forward", "weight cols", w.extent(1), C);
  require_extent("gnh::lm_head_xent::forward", "loss", loss.extent(0), N);
  require_extent("gnh::lm_head_xent::forward", "lse", lse.extent(0), N);
  require_extent("gnh::lm_head_xent::forward", "targets", targets.extent(0), N);
  require_extent("gnh::lm_head_xent::forward", "workspace cols", logits.extent(1), V);
  const index_t chunk = logits.extent(0);
  if (chunk == 0 && N > 0) throw std::logic_error("gnh::lm_head_xent::forward: empty workspace");
  for (index_t r0 = 0; r0 < N; r0 += chunk) {
    const index_t nr = N - r0 < chunk ? N - r0 : chunk;
    Span2<const T> hc(h.data() + r0 * C, nr, C);
    Span2<T> zc(logits.data(), nr, V);
    space.fence();
    KokkosBlas::gemm("N", "T", T(1), hc, w, T(0), zc);
    Kokkos::parallel_for(
        "gnh::lm_head_xent::forward", range(space, nr), KOKKOS_LAMBDA(const index_t r) {
          const auto z = Kokkos::subview(zc, r, Kokkos::ALL);
          const T l = row_logsumexp<T>(z, V);
          const std::int32_t tgt = targets(r0 + r);
          lse(r0 + r) = l;
          loss(r0 + r) = tgt < 0 ? 0.0 : static_cast<double>(l - z(tgt));
        });
  }
}

}  // namespace gnh::kernels
