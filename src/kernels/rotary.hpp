// SPDX-License-Identifier: BSD-3-Clause
// Rotary position embedding (SPEC §11, Hugging Face's rotate-half
// convention) of the q or k rows of attention: each row n is a token at
// position t = n mod T of its block, holding H heads of D dims; the first r
// dims of each head (r even: D for llama, floor(D rotary_pct) for gpt-neox)
// rotate in pairs (j, j + r/2), j < r/2, by the angle a = t base^(-2j/r):
//   forward:  y_j = x_j cos a - x_{j+r/2} sin a,  y_{j+r/2} = x_{j+r/2} cos a + x_j sin a,
//             dims r .. D - 1 unchanged
//   tangent / second order: the same rotation of every plane (linear in x,
//             no parameters)
//   reverse:  dx = R^T dy, the rotation by -a, of every plane of dy alike
//             (the tangent of the reverse included: R does not depend on x)
// Saves nothing. The angle is taken in the engine's precision (as the
// reference implementation does in the model's): cos and sin of t inv_j,
// inv_j = exp(-(2j/r) log base), tabulated once (rotary_table).
#pragma once
#include <cmath>
#include <stdexcept>
#include <string>

#include "core/compat.hpp"
#include "core/planes.hpp"
#include "kernels/check.hpp"
#include "kernels/gemm_ledger.hpp"
#include "kernels/cloned.hpp"
#include "kernels/op.hpp"
#include "kernels/instances.hpp"

namespace gnh::kernels {

// Which heads of a row rotate: the row is segments of D columns, and
// segment s rotates when s mod period < count (the others pass unchanged).
// A row of q (or k) alone: period 1, count 1. GPT-NeoX's query_key_value
// rows, per head [q | k | v]: period 3, count 2.
struct RotarySegments {
  index_t period = 1, count = 1;
};

namespace detail {

// Every plane of `in` rotated into `out` (sign +1: R, -1: R^T); planes 0
// (value), 1..K (tangents), K+1..2K (second order) as the scalar type has
// them. A pair's two elements are read before either is written, so out may be in.
template <class S>
void rotate_planes(const ExecSpace& space, const char* label, Act2<base_t<S>> out, Act2<base_t<S>> in, index_t D,
                   index_t r, View2<base_t<S>> table, double sign, RotarySegments seg) {
  using U = base_t<S>;
  const index_t N = in.rows(), width = in.cols(), K = has_tangents_v<S> ? in.d.extent(0) : 0;
  const index_t planes = 1 + K + (has_second_v<S> ? K : 0);
  require_extent(label, "rows", out.rows(), N);
  require_extent(label, "cols", out.cols(), width);
  const index_t T = table.extent(0);  // positions: rows are blocks of T tokens
  if (T <= 0 || N % T != 0) throw std::invalid_argument(std::string(label) + ": rows are not whole blocks");
  if (D <= 0 || width % D != 0 || r < 0 || r > D || r % 2 != 0 || seg.period <= 0 || seg.count < 0)
    throw std::invalid_argument(std::string(label) + ": heads of " + std::to_string(D) + " dims, " + std::to_string(r) +
                                " of them rotated, do not tile rows of " + std::to_string(width));
  const index_t half = r / 2, segments = width / D;
  const U s_sign = U(sign);
  const bool same = out.v.data() == in.v.data();
  if (index_t(table.extent(1)) != r)
    throw std::invalid_argument(std::string(label) + ": the rotary table is not (T, r)");
  // A task is one row of one plane, its segments in turn: each one's pairs
  // along the row (contiguous, the table's row alike), then the dims that
  // pass. (A task a segment spent more on finding its row than on its 16
  // pairs at head width 32: on the AMD EPYC Zen 3 at preset small, 1.9% of
  // the Llama gradient.)
  Traffic(label).add(double(2 * planes * N * width), sizeof(U), 2).add(double(T * r), sizeof(U), 2);
  Kokkos::parallel_for(label, range(space, planes * N), cloned(KOKKOS_LAMBDA(const index_t i) {
                         const index_t q = i / N, n = i - q * N;
                         const U* xr = q == 0 ? &in.v(n, 0) : q <= K ? &in.d(q - 1, n, 0) : &in.dd(q - 1 - K, n, 0);
                         U* yr = q == 0 ? &out.v(n, 0) : q <= K ? &out.d(q - 1, n, 0) : &out.dd(q - 1 - K, n, 0);
                         const U* cs = &table(n % T, 0);
                         const U* sn = cs + half;
                         for (index_t s = 0; s < segments; ++s) {
                           const U* x = xr + s * D;
                           U* y = yr + s * D;
                           const bool rotates = s % seg.period < seg.count;
                           const index_t first = rotates ? r : 0;  // the dims from `first` on pass
                           if (rotates) {
                             for (index_t j = 0; j < half; ++j) {
                               const U x1 = x[j], x2 = x[j + half];
                               y[j] = x1 * cs[j] - s_sign * x2 * sn[j];
                               y[j + half] = x2 * cs[j] + s_sign * x1 * sn[j];
                             }
                           }
                           if (!same)
                             for (index_t c = first; c < D; ++c) y[c] = x[c];
                         }
                       }));
}

}  // namespace detail

// cos and sin of every angle of positions 0 .. T-1: (T, r), row t = [cos
// a_t0 .. cos a_t(r/2-1) | sin ...]. Built once by whoever rotates (the
// engine, the op), so that no pass evaluates a transcendental per element.
template <class U>
View2<U> rotary_table(const ExecSpace& space, index_t T, index_t r, double base) {
  View2<U> t(Kokkos::view_alloc(space, "gnh::rotary::table", Kokkos::WithoutInitializing), T, r);
  const index_t half = r / 2;
  const U log_base = U(std::log(base));
  using Policy = Kokkos::MDRangePolicy<ExecSpace, Kokkos::Rank<2>, Kokkos::IndexType<index_t>>;
  if (T > 0 && half > 0)
    Kokkos::parallel_for(
        "gnh::rotary::table", Policy(space, {0, 0}, {T, half}), KOKKOS_LAMBDA(const index_t p, const index_t j) {
          const U a = U(p) * kmath::exp(-(U(2 * j) / U(r)) * log_base);
          t(p, j) = kmath::cos(a);
          t(p, half + j) = kmath::sin(a);
        });
  return t;
}

// x, y: (N, width) rows of T-token blocks (T = the table's rows), segments
// of D dims, those that seg rotates turned by their first r dims (the
// table's columns); y may be x (in place).
template <class S>
void rotary_forward(const ExecSpace& space, Act2<base_t<S>> y, Act2<base_t<S>> x, index_t D, index_t r,
                    View2<base_t<S>> table, RotarySegments seg = {}) {
  keep_planes<S>(y, x);
  detail::rotate_planes<S>(space, "gnh::rotary::forward", y, x, D, r, table, 1.0, seg);
}

// dx = R^T dy, every plane S has (Dual: the tangent of the reverse); dx may be dy.
template <class S>
void rotary_reverse(const ExecSpace& space, Act2<base_t<S>> dx, Act2<base_t<S>> dy, index_t D, index_t r,
                    View2<base_t<S>> table, RotarySegments seg = {}) {
  keep_planes<S>(dx, dy);
  detail::rotate_planes<S>(space, "gnh::rotary::reverse", dx, dy, D, r, table, -1.0, seg);
}

// The op contract (kernels/op.hpp): no parameters, nothing saved. As the
// models use it: the q (or k) rows, every head's dims rotated, base 10000.
template <class U>
struct RotaryOp {
  static constexpr const char* name = "rotary";
  index_t N, T, H, D, r;  // H: segments of D in a row
  double base;
  RotarySegments seg;
  View2<U> table;
  RotaryOp(index_t N_, index_t T_, index_t H_, index_t D_, index_t r_, double base_, RotarySegments seg_ = {})
      : N(N_), T(T_), H(H_), D(D_), r(r_), base(base_), seg(seg_), table(rotary_table<U>(ExecSpace(), T_, r_, base_)) {}
  static RotaryOp at(const OpDims& d, index_t) {
    const index_t D = d.C / d.H;
    return RotaryOp(d.B * d.T, d.T, d.H, D, D - D % 2, 10000.0);
  }
  OpSizes sizes() const { return {N, H * D, H * D, 0}; }
  std::vector<OpExtent> saved() const { return {}; }
  double flops(OpMode, index_t) const { return 0.0; }
  template <class S>
  void forward(const ExecSpace& space, Act2<U> y, Act2<U> x, Params<U>, const OpSaved<U>&) const {
    rotary_forward<S>(space, y, x, D, r, table, seg);
  }
  template <class S>
  void reverse(const ExecSpace& space, Act2<U> dx, Grads<U>, Act2<U> dy, Act2<U>, Act2<U>, Params<U>,
               const OpSaved<U>&) const {
    rotary_reverse<S>(space, dx, dy, D, r, table, seg);
  }
};

// Compiled once, in gnh_core (kernels/instances.hpp).
#define GNH_ROTARY_FORWARD(EXT, S)                                                                          \
  EXT template void rotary_forward<S>(const ExecSpace&, Act2<base_t<S>>, Act2<base_t<S>>, index_t, index_t, \
                                      View2<base_t<S>>, RotarySegments);
#define GNH_ROTARY_REVERSE(EXT, S)                                                                          \
  EXT template void rotary_reverse<S>(const ExecSpace&, Act2<base_t<S>>, Act2<base_t<S>>, index_t, index_t, \
                                      View2<base_t<S>>, RotarySegments);
#define GNH_ROTARY(EXT, T) \
  GNH_FORWARD_SCALARS(GNH_ROTARY_FORWARD, EXT, T) GNH_REVERSE_SCALARS(GNH_ROTARY_REVERSE, EXT, T)
GNH_ROTARY(extern, float)
GNH_ROTARY(extern, double)

}  // namespace gnh::kernels
