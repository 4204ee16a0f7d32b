// SPDX-License-Identifier: BSD-3-Clause
// Residual connection and adjoint accumulation; linear, so plane by plane.
//   forward:  y = a + b (every plane)        reverse: da = db = dy
// accumulate: y += a (every plane), used to sum adjoints of the residual stream.
// Saves nothing.
#pragma once
#include "core/planes.hpp"
#include "kernels/check.hpp"
#include "kernels/instances.hpp"

namespace gnh::kernels {

namespace detail {
template <class T>
void add_plane(const ExecSpace& space, const char* label, T* y, const T* a, const T* b, index_t n) {
  if (n == 0) return;
  Kokkos::parallel_for(label, range(space, n), KOKKOS_LAMBDA(const index_t i) { y[i] = a[i] + b[i]; });
}
template <class A>
index_t plane_size(const A& v) { return static_cast<index_t>(v.size()); }
}  // namespace detail

template <class T>
void residual_forward(const ExecSpace& space, Act2<T> y, Act2<T> a, Act2<T> b) {
  require_extent("gnh::residual::forward", "b size", detail::plane_size(b.v), detail::plane_size(a.v));
  require_extent("gnh::residual::forward", "y size", detail::plane_size(y.v), detail::plane_size(a.v));
  detail::add_plane(space, "gnh::residual::forward", y.v.data(), a.v.data(), b.v.data(), detail::plane_size(a.v));
  detail::add_plane(space, "gnh::residual::forward", y.d.data(), a.d.data(), b.d.data(), detail::plane_size(y.d));
  detail::add_plane(space, "gnh::residual::forward", y.dd.data(), a.dd.data(), b.dd.data(), detail::plane_size(y.dd));
}

// y += a on every plane.
template <class T>
void accumulate(const ExecSpace& space, Act2<T> y, Act2<T> a) {
  detail::add_plane(space, "gnh::residual::accumulate", y.v.data(), y.v.data(), a.v.data(), detail::plane_size(y.v));
  detail::add_plane(space, "gnh::residual::accumulate", y.d.data(), y.d.data(), a.d.data(), detail::plane_size(y.d));
}

// y = a on every plane.
template <class T>
void copy(const ExecSpace& space, Act2<T> y, Act2<T> a) {
  Kokkos::deep_copy(space, y.v, a.v);
  if (y.d.size() > 0) Kokkos::deep_copy(space, y.d, a.d);
}

// Compiled once, in gnh_core (kernels/instances.hpp).
#define GNH_RESIDUAL(EXT, T)                                                    \
  EXT template void residual_forward<T>(const ExecSpace&, Act2<T>, Act2<T>, Act2<T>); \
  EXT template void accumulate<T>(const ExecSpace&, Act2<T>, Act2<T>);                \
  EXT template void copy<T>(const ExecSpace&, Act2<T>, Act2<T>);
GNH_RESIDUAL(extern, float)
GNH_RESIDUAL(extern, double)

}  // namespace gnh::kernels
