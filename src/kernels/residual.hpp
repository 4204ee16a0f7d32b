// SPDX-License-Identifier: BSD-3-Clause
// Residual connection and adjoint accumulation; linear, so plane by plane.
//   forward:  y = a + b (each plane of S)    reverse: da = db = dy
// accumulate: y += a (each plane of S), used to sum adjoints of the residual stream.
// Saves nothing.
#pragma once
#include "core/bf16.hpp"
#include "core/planes.hpp"
#include "kernels/check.hpp"
#include "kernels/gemm_ledger.hpp"
#include "kernels/instances.hpp"

namespace gnh::kernels {

namespace detail {
template <class T>
void add_plane(const ExecSpace& space, const char* label, T* y, const T* a, const T* b, index_t n) {
  if (n == 0) return;
  Traffic(label).add(double(3 * n), sizeof(T), 2);  // a plane of (rows, C)
  Kokkos::parallel_for(
      label, range(space, n), KOKKOS_LAMBDA(const index_t i) { y[i] = a[i] + b[i]; });
}
template <class A>
index_t plane_size(const A& v) {
  return static_cast<index_t>(v.size());
}
}  // namespace detail

// The mode follows from S (planes_of): the planes of S, on each.
template <class S>
void residual_forward(const ExecSpace& space, Act2<base_t<S>> y, Act2<base_t<S>> a, Act2<base_t<S>> b) {
  keep_planes<S>(y, a, b);
  require_extent("gnh::residual::forward", "b size", detail::plane_size(b.v), detail::plane_size(a.v));
  require_extent("gnh::residual::forward", "y size", detail::plane_size(y.v), detail::plane_size(a.v));
  detail::add_plane(space, "gnh::residual::forward", y.v.data(), a.v.data(), b.v.data(), detail::plane_size(a.v));
  detail::add_plane(space, "gnh::residual::forward", y.d.data(), a.d.data(), b.d.data(), detail::plane_size(y.d));
  detail::add_plane(space, "gnh::residual::forward", y.dd.data(), a.dd.data(), b.dd.data(), detail::plane_size(y.dd));
}

// y += a on the value and tangent planes of S (adjoints: T or Dual<T>).
template <class S>
void accumulate(const ExecSpace& space, Act2<base_t<S>> y, Act2<base_t<S>> a) {
  keep_planes<S>(y, a);
  detail::add_plane(space, "gnh::residual::accumulate", y.v.data(), y.v.data(), a.v.data(), detail::plane_size(y.v));
  detail::add_plane(space, "gnh::residual::accumulate", y.d.data(), y.d.data(), a.d.data(), detail::plane_size(y.d));
}

// accumulate of the primal with y's new values also written as the next
// product's rounded adjoint (rounded: values in the GEMMs' bfloat16 storage,
// those a product rounding y would read).
template <class T, class D>
void accumulate_rounded(const ExecSpace& space, Act2<T> y, Act2<T> a, D* rounded) {
  keep_planes<T>(y, a);
  const index_t n = detail::plane_size(y.v);
  require_extent("gnh::residual::accumulate", "a size", detail::plane_size(a.v), n);
  Traffic("gnh::residual::accumulate").add(double(3 * n), sizeof(T), 2).add(double(n), 2, 2);
  T* const yv = y.v.data();
  const T* const av = a.v.data();
  Kokkos::parallel_for(
      "gnh::residual::accumulate", range(space, n), KOKKOS_LAMBDA(const index_t i) {
        const T v = yv[i] + av[i];
        yv[i] = v;
        rounded[i] = bf16_as<D>(v);
      });
}

// Compiled once, in gnh_core (kernels/instances.hpp).
#define GNH_RESIDUAL_FORWARD(EXT, S) \
  EXT template void residual_forward<S>(const ExecSpace&, Act2<base_t<S>>, Act2<base_t<S>>, Act2<base_t<S>>);
#define GNH_RESIDUAL_REVERSE(EXT, S) \
  EXT template void accumulate<S>(const ExecSpace&, Act2<base_t<S>>, Act2<base_t<S>>);
#define GNH_RESIDUAL(EXT, T) \
  GNH_FORWARD_SCALARS(GNH_RESIDUAL_FORWARD, EXT, T) GNH_REVERSE_SCALARS(GNH_RESIDUAL_REVERSE, EXT, T)
GNH_RESIDUAL(extern, float)
GNH_RESIDUAL(extern, double)

}  // namespace gnh::kernels
