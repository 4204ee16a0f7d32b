// SPDX-License-Identifier: BSD-3-Clause
// A Kokkos functor over an index whose body a portable x86-64 build compiles
// once per x86-64 level, with everything it calls inlined, the processor's
// level chosen at load time (core/isa.hpp): for the host's elementwise loops
// over chunks, whose vector width the baseline would otherwise fix at SSE4.2.
// Elsewhere it is the body itself.
#pragma once
#include "core/isa.hpp"
#include "core/types.hpp"

namespace gnh::kernels {
namespace detail {
template <class F>
GNH_HOST_CLONES_FLAT KOKKOS_INLINE_FUNCTION void run_cloned(const F& f, const index_t i) {
  f(i);
}
}  // namespace detail

template <class F>
struct Cloned {
  F f;
  KOKKOS_INLINE_FUNCTION void operator()(const index_t i) const { detail::run_cloned(f, i); }
};

// parallel_for(label, policy, cloned(KOKKOS_LAMBDA(const index_t i) { ... })).
template <class F>
Cloned<F> cloned(const F& f) {
  return Cloned<F>{f};
}
}  // namespace gnh::kernels
