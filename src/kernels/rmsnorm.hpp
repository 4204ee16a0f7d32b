// SPDX-License-Identifier: BSD-3-Clause
// RMSNorm over the channels of each row (the Llama family's norm, SPEC §11).
//   forward:  s = mean(x^2), r = (s + eps)^(-1/2), xh = x r, y = xh w [+ b]
//   reverse:  g = dy w,  dx = r (g - xh mean(g xh)),  dw += sum_n dy xh,  [db += sum_n dy]
//   tangent / second order: the row statistic once, each direction by the chain rule (below)
//   tangent of reverse:     the reverse evaluated in Dual arithmetic
// LayerNorm (layernorm.hpp) without the centring: the same row kernels and
// column sums. Saves r per row (with its tangents in tangent mode); the
// caller keeps x.
#pragma once
#include <type_traits>

#include "core/fastmath.hpp"
#include "core/planes.hpp"
#include "kernels/check.hpp"
#include "kernels/colsum.hpp"
#include "kernels/op.hpp"
#include "kernels/rows.hpp"
#include "kernels/instances.hpp"

namespace gnh::kernels {

namespace detail {

// One row of the forward's values (rows.hpp): r, saved for the directions'
// rows below, and y.
template <class T>
struct RmsNormValueRow {
  Act2<T> y;
  Act1<T> rstd;
  Act2<T> x;
  Params<T> p;
  index_t w, b, C;
  T eps;
  template <class Lanes>
  KOKKOS_INLINE_FUNCTION void operator()(const Lanes& lanes, const index_t n) const {
    const T* xr = &x.v(n, 0);
    const T* pv = p.v.data();
    const T s = lanes.template sum<T>(C, [&](index_t c) { return xr[c] * xr[c]; });
    const T r = T(1) / kmath::sqrt(s / T(C) + eps);
    lanes.single([&] { rstd.v(n) = r; });
    lanes.each(C, [&](index_t c) { y.v(n, c) = xr[c] * r * pv[w + c] + (b >= 0 ? pv[b + c] : T(0)); });
  }
};

// One row of one direction (row i = k N + n: direction k, row n), by the
// chain rule in T from the row's saved r, with s = mean(x^2):
//   s' = 2 mean(x x'), r' = -r^3 s' / 2, xh' = x' r + x r',  y' = xh' w + xh w' + b'
//   s'' = 2 mean(x'^2 + x x''), r'' = 3 r^5 s'^2 / 4 - r^3 s'' / 2,
//   xh'' = x'' r + 2 x' r' + x r'',  y'' = xh'' w + 2 xh' w'
template <class S>
struct RmsNormDirectionRow {
  using T = base_t<S>;
  Act2<T> y;
  Act1<T> rstd;
  Act2<T> x;
  Params<T> p;
  index_t w, b, C, N, P;
  template <class Lanes>
  KOKKOS_INLINE_FUNCTION void operator()(const Lanes& lanes, const index_t i) const {
    const index_t k = i / N, n = i - k * N;
    const T* xr = &x.v(n, 0);
    const T* pv = p.v.data();
    const T r = rstd.v(n);
    const T* xd = &x.d(k, n, 0);
    const T* pd = p.d.data() + k * P;
    const T s1 = lanes.template sum<T>(C, [&](index_t c) { return xr[c] * xd[c]; }) * (T(2) / T(C));
    const T r3 = r * r * r, r1 = T(-0.5) * r3 * s1;
    lanes.single([&] { rstd.d(k, n) = r1; });
    lanes.each(C, [&](index_t c) {
      const T xh = xr[c] * r, xh1 = xd[c] * r + xr[c] * r1;
      y.d(k, n, c) = xh1 * pv[w + c] + xh * pd[w + c] + (b >= 0 ? pd[b + c] : T(0));
    });
    if constexpr (has_second_v<S>) {
      const T* xdd = &x.dd(k, n, 0);
      const T s2 = lanes.template sum<T>(C, [&](index_t c) { return xd[c] * xd[c] + xr[c] * xdd[c]; }) * (T(2) / T(C));
      const T r2 = T(0.75) * r3 * r * r * s1 * s1 - T(0.5) * r3 * s2;
      lanes.single([&] { rstd.dd(k, n) = r2; });
      lanes.each(C, [&](index_t c) {
        const T xh1 = xd[c] * r + xr[c] * r1, xh2 = xdd[c] * r + T(2) * xd[c] * r1 + xr[c] * r2;
        y.dd(k, n, c) = xh2 * pv[w + c] + T(2) * xh1 * pd[w + c];
      });
    }
  }
};

// One row of the reverse's input adjoint, in S arithmetic (Dual: the tangent
// of the reverse), plane by plane.
template <class S>
struct RmsNormReverseRow {
  using T = base_t<S>;
  using io = Io<S>;
  Act2<T> dx, dy, x;
  Act1<T> rstd;
  Params<T> p;
  index_t w, C, K;
  template <class Lanes>
  KOKKOS_INLINE_FUNCTION void operator()(const Lanes& lanes, const index_t n) const {
    for (int k = 0; k < K; ++k) {
      const S r = io::get(rstd, k, n);
      S mgx = lanes.template sum<S>(
          C, [&](index_t c) { return io::get(dy, k, n, c) * io::param(p, k, w + c) * (io::get(x, k, n, c) * r); });
      mgx = mgx / T(C);
      lanes.each(C, [&](index_t c) {
        const S xh = io::get(x, k, n, c) * r;
        const S gc = io::get(dy, k, n, c) * io::param(p, k, w + c);
        io::put(dx, k, n, c, r * (gc - xh * mgx));
      });
    }
  }
};

}  // namespace detail

// rows: the shape of the row kernels (rows.hpp); the default suits the
// execution space, and both give the same bits.
template <class S>
void rmsnorm_forward(const ExecSpace& space, Act2<base_t<S>> y, Act1<base_t<S>> rstd, Act2<base_t<S>> x,
                     Params<base_t<S>> p, index_t w, index_t b, double eps, RowShape rows = default_row_shape()) {
  keep_planes<S>(y, rstd, x, p);
  using T = base_t<S>;
  const index_t N = x.rows(), C = x.cols(), K = has_tangents_v<S> ? x.d.extent(0) : 0, P = p.v.extent(0);
  require_extent("gnh::rmsnorm::forward", "y rows", y.rows(), N);
  require_extent("gnh::rmsnorm::forward", "y cols", y.cols(), C);
  require_extent("gnh::rmsnorm::forward", "rstd", rstd.v.extent(0), N);
  for_rows<T>(space, "gnh::rmsnorm::forward", N,
              detail::RmsNormValueRow<T>{y, rstd, x, p, w, b, C, static_cast<T>(eps)}, rows);
  if constexpr (has_tangents_v<S>)
    for_rows<T>(space, "gnh::rmsnorm::forward::directions", K * N,
                detail::RmsNormDirectionRow<S>{y, rstd, x, p, w, b, C, N, P}, rows);
}

template <class S>
void rmsnorm_reverse(const ExecSpace& space, Act2<base_t<S>> dx, Grads<base_t<S>> g, Act2<base_t<S>> dy,
                     Act2<base_t<S>> x, Act1<base_t<S>> rstd, Params<base_t<S>> p, index_t w, index_t b,
                     ColumnShape shape = default_column_shape(), RowShape rows = default_row_shape()) {
  keep_planes<S>(dx, g, dy, x, rstd, p);
  using io = Io<S>;
  const index_t N = x.rows(), C = x.cols(), K = directions_of<S>(x);
  require_extent("gnh::rmsnorm::reverse", "dy rows", dy.rows(), N);
  require_extent("gnh::rmsnorm::reverse", "dx rows", dx.rows(), N);
  for_rows<S>(space, "gnh::rmsnorm::reverse::input", N, detail::RmsNormReverseRow<S>{dx, dy, x, rstd, p, w, C, K},
              rows);
  // Weight and bias: column sums over the rows, deterministic (colsum.hpp);
  // none for an empty g (primal only: the adjoints alone).
  if (g.v.extent(0) == 0) return;
  column_sums<S>(
      space, "gnh::rmsnorm::reverse::params", K, N, C,
      KOKKOS_LAMBDA(const index_t k, const index_t n, const index_t c, S& dw, S& db) {
        const S d = io::get(dy, k, n, c);
        dw += d * (io::get(x, k, n, c) * io::get(rstd, k, n));
        db += d;
      },
      KOKKOS_LAMBDA(const index_t k, const index_t c, const S& dw, const S& db) {
        io::accumulate(g, k, w + c, dw);
        if (b >= 0) io::accumulate(g, k, b + c, db);
      },
      shape);
}

// The op contract (kernels/op.hpp): theta = [w | b] (C each, b optional);
// saves the reciprocal root mean square, (N, 1). As the Llama family uses it:
// weight only, eps 1e-6.
template <class T>
struct RmsNormOp {
  static constexpr const char* name = "rmsnorm";
  index_t N, C;
  bool bias;
  RowShape rows;
  RmsNormOp(index_t N_, index_t C_, bool bias_, RowShape rows_ = default_row_shape())
      : N(N_), C(C_), bias(bias_), rows(rows_) {}
  static RmsNormOp at(const OpDims& d, index_t) { return RmsNormOp(d.B * d.T, d.C, false); }
  OpSizes sizes() const { return {N, C, C, C * (bias ? 2 : 1)}; }
  std::vector<OpExtent> saved() const { return {{N, 1}}; }
  double flops(OpMode, index_t) const { return 0.0; }
  template <class S>
  void forward(const ExecSpace& space, Act2<T> y, Act2<T> x, Params<T> p, const OpSaved<T>& s) const {
    rmsnorm_forward<S>(space, y, s.flat(0), x, p, 0, bias ? C : -1, 1e-6, rows);
  }
  template <class S>
  void reverse(const ExecSpace& space, Act2<T> dx, Grads<T> g, Act2<T> dy, Act2<T> x, Act2<T>, Params<T> p,
               const OpSaved<T>& s) const {
    rmsnorm_reverse<S>(space, dx, g, dy, x, s.flat(0), p, 0, bias ? C : -1,
                       rows == RowShape::teams ? ColumnShape::teams : ColumnShape::host, rows);
  }
};

// Compiled once, in gnh_core (kernels/instances.hpp).
#define GNH_RMSNORM_FORWARD(EXT, S)                                                                         \
  EXT template void rmsnorm_forward<S>(const ExecSpace&, Act2<base_t<S>>, Act1<base_t<S>>, Act2<base_t<S>>, \
                                       Params<base_t<S>>, index_t, index_t, double, RowShape);
#define GNH_RMSNORM_REVERSE(EXT, S)                                                                           \
  EXT template void rmsnorm_reverse<S>(const ExecSpace&, Act2<base_t<S>>, Grads<base_t<S>>, Act2<base_t<S>>,  \
                                       Act2<base_t<S>>, Act1<base_t<S>>, Params<base_t<S>>, index_t, index_t, \
                                       ColumnShape, RowShape);
#define GNH_RMSNORM(EXT, T) \
  GNH_FORWARD_SCALARS(GNH_RMSNORM_FORWARD, EXT, T) GNH_REVERSE_SCALARS(GNH_RMSNORM_REVERSE, EXT, T)
GNH_RMSNORM(extern, float)
GNH_RMSNORM(extern, double)

}  // namespace gnh::kernels
