// SPDX-License-Identifier: BSD-3-Clause
// Token + position embedding; linear in the parameters, so every mode acts
// plane by plane.
//   forward:  x[b,t,:] = wte[idx[b,t],:] + wpe[t,:]
//   tangent:  x.d[k] = v_k[wte][idx] + v_k[wpe][t];  second: x.dd = 0 (theta'' = 0)
//   reverse:  g[wte][idx[b,t],:] += dx[b,t,:],  g[wpe][t,:] += dx[b,t,:]
// Saves nothing. The reverse runs one thread per channel over all rows in
// order, so repeated tokens accumulate deterministically without atomics.
#pragma once
#include "core/planes.hpp"
#include "kernels/check.hpp"
#include "kernels/op.hpp"

namespace gnh::kernels {

template <class T>
void embedding_forward(const ExecSpace& space, Act2<T> x, Span2<const std::int32_t> tokens,
                       Params<T> p, index_t wte, index_t wpe) {
  const index_t B = tokens.extent(0), Tc = tokens.extent(1), C = x.cols();
  const index_t K = x.d.extent(0);
  require_extent("gnh::embedding::forward", "x rows", x.rows(), B * Tc);
  const bool second = x.dd.extent(0) > 0;
  Kokkos::parallel_for(
      "gnh::embedding::forward", range(space, B * Tc * C), KOKKOS_LAMBDA(const index_t i) {
        const index_t n = i / C, c = i % C, t = n % Tc;
        const index_t iw = wte + index_t(tokens(n / Tc, t)) * C + c, ip = wpe + t * C + c;
        x.v(n, c) = p.v(iw) + p.v(ip);
        for (index_t k = 0; k < K; ++k) {
          x.d(k, n, c) = p.d(k, iw) + p.d(k, ip);
          if (second) x.dd(k, n, c) = 0;
        }
      });
}

template <class T>
void embedding_reverse(const ExecSpace& space, Grads<T> g, Act2<T> dx, Span2<const std::int32_t> tokens,
                       index_t wte, index_t wpe) {
  const index_t B = tokens.extent(0), Tc = tokens.extent(1), C = dx.cols();
  const index_t K = dx.d.extent(0);
  Kokkos::parallel_for(
      "gnh::embedding::reverse", range(space, C), KOKKOS_LAMBDA(const index_t c) {
        for (index_t n = 0; n < B * Tc; ++n) {
          const index_t t = n % Tc;
          const index_t iw = wte + index_t(tokens(n / Tc, t)) * C + c, ip = wpe + t * C + c;
          g.v(iw) += dx.v(n, c);
          g.v(ip) += dx.v(n, c);
          for (index_t k = 0; k < K; ++k) {
            g.d(k, iw) += dx.d(k, n, c);
            g.d(k, ip) += dx.d(k, n, c);
          }
        }
      });
}

// The op contract (kernels/op.hpp): tokens (B, T) -> x (B*T, C), no input
// activation (in = 0); theta = [wte (V, C) | wpe (T, C)]. The tokens repeat
// (i * 3 mod V), so the reverse's accumulation over repeated rows is exercised.
template <class T>
struct EmbeddingOp {
  static constexpr const char* name = "embedding";
  index_t B, Tc, V, C;
  View2<std::int32_t> tokens;
  EmbeddingOp(index_t B_, index_t T_, index_t V_, index_t C_) : B(B_), Tc(T_), V(V_), C(C_), tokens("tokens", B_, T_) {
    auto h = Kokkos::create_mirror_view(tokens);
    for (index_t i = 0; i < B * Tc; ++i) h.data()[i] = std::int32_t((i * 3) % V);
    Kokkos::deep_copy(tokens, h);
  }
  static EmbeddingOp at(const OpDims& d, index_t) { return EmbeddingOp(d.B, d.T, d.V, d.C); }
  OpSizes sizes() const { return {B * Tc, 0, C, (V + Tc) * C}; }
  std::vector<OpExtent> saved() const { return {}; }
  double flops(OpMode, index_t) const { return 0.0; }
  template <class S>
  void forward(const ExecSpace& space, Act2<T> y, Act2<T>, Params<T> p, const OpSaved<T>&) const {
    embedding_forward<T>(space, y, tokens, p, 0, V * C);
  }
  template <class S>
  void reverse(const ExecSpace& space, Act2<T>, Grads<T> g, Act2<T> dy, Act2<T>, Act2<T>, Params<T>,
               const OpSaved<T>&) const {
    embedding_reverse<T>(space, g, dy, tokens, 0, V * C);
  }
};

}  // namespace gnh::kernels
