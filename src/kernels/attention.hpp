// SPDX-License-Identifier: BSD-3-Clause
// Causal multi-head self-attention core (between c_attn and c_proj).
//   qkv row n = [q | k | v], head h owns columns h*hs .. h*hs+hs-1 of each part.
//   forward:  s_ts = q_t.k_s / sqrt(hs) (s <= t),  p_t = softmax_s(s_t),  y_t = sum_s p_ts v_s
// The forward never forms the T x T score matrix: each query row runs an online
// softmax, accumulating into its own output row. It saves the row's
// log-sum-exp lse_t = log sum_s exp(s_ts), from which the other modes recompute
// p_ts = exp(s_ts - lse_t) without a second normalisation pass.
#pragma once
#include "core/compat.hpp"
#include "core/types.hpp"
#include "kernels/check.hpp"

namespace gnh::kernels {

template <class T>
void attention_forward(const ExecSpace& space,
                       Span2<T> y,            // (B*T, C)
                       Span1<T> lse,          // (B*H*T), index (b*H + h)*T + t
                       Span2<const T> qkv,    // (B*T, 3C)
                       index_t B, index_t Tc, int n_head) {
  const index_t C = y.extent(1), H = n_head, hs = C / H;
  require_extent("gnh::attention::forward", "y rows", y.extent(0), B * Tc);
  require_extent("gnh::attention::forward", "qkv rows", qkv.extent(0), B * Tc);
  require_extent("gnh::attention::forward", "qkv cols", qkv.extent(1), 3 * C);
  require_extent("gnh::attention::forward", "lse", lse.extent(0), B * H * Tc);
  require_extent("gnh::attention::forward", "n_head * head_size", H * hs, C);
  const T scale = T(1) / kmath::sqrt(T(hs));
  Kokkos::parallel_for(
      "gnh::attention::forward", range(space, B * H * Tc), KOKKOS_LAMBDA(const index_t i) {
        const index_t t = i % Tc, h = (i / Tc) % H, b = i / (Tc * H);
        const index_t nq = b * Tc + t, qo = h * hs, ko = C + h * hs, vo = 2 * C + h * hs;
        T m = 0, l = 0;
        for (index_t d = 0; d < hs; ++d) y(nq, qo + d) = 0;
        for (index_t s = 0; s <= t; ++s) {
          const index_t ns = b * Tc + s;
          T score = 0;
          for (index_t d = 0; d < hs; ++d) score += qkv(nq, qo + d) * qkv(ns, ko + d);
          score *= scale;
          if (s == 0 || score > m) {
            // New running maximum: rescale what was accumulated so far.
            const T corr = s == 0 ? T(0) : kmath::exp(m - score);
            l *= corr;
            for (index_t d = 0; d < hs; ++d) y(nq, qo + d) *= corr;
            m = score;
          }
          const T p = kmath::exp(score - m);
          l += p;
          for (index_t d = 0; d < hs; ++d) y(nq, qo + d) += p * qkv(ns, vo + d);
        }
        const T inv = T(1) / l;
        for (index_t d = 0; d < hs; ++d) y(nq, qo + d) *= inv;
        lse(i) = m + kmath::log(l);
      });
}

}  // namespace gnh::kernels
