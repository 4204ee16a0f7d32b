// SPDX-License-Identifier: BSD-3-Clause
// Token + position embedding.
//   forward:  x[b,t,:] = wte[idx[b,t],:] + wpe[t,:]
// Saves nothing (the token ids are the only input the other modes need).
#pragma once
#include "core/types.hpp"
#include "kernels/check.hpp"

namespace gnh::kernels {

template <class T>
void embedding_forward(const ExecSpace& space,
                       Span2<T> x,                        // (B*T, C)
                       Span2<const std::int32_t> tokens,  // (B, T)
                       Span2<const T> wte,                // (V, C)
                       Span2<const T> wpe) {              // (block_size, C)
  const index_t B = tokens.extent(0), Tc = tokens.extent(1), C = wte.extent(1);
  require_extent("gnh::embedding::forward", "x rows", x.extent(0), B * Tc);
  require_extent("gnh::embedding::forward", "x cols", x.extent(1), C);
  require_extent("gnh::embedding::forward", "wpe cols", wpe.extent(1), C);
  if (Tc > static_cast<index_t>(wpe.extent(0)))
    throw std::logic_error(cat("gnh::embedding::forward: context ", Tc, " exceeds block_size ",
                               wpe.extent(0)));
  Kokkos::parallel_for(
      "gnh::embedding::forward", range(space, B * Tc * C), KOKKOS_LAMBDA(const index_t i) {
        const index_t n = i / C, c = i % C, t = n % Tc;
        x(n, c) = wte(tokens(n / Tc, t), c) + wpe(t, c);
      });
}

}  // namespace gnh::kernels
