// SPDX-License-Identifier: BSD-3-Clause
// RMSNorm over the channels of each row (the Llama family's norm, SPEC §11).
//   forward:  s = mean(x^2), r = (s + eps)^(-1/2), xh = x r, y = xh w [+ b]
//   reverse:  g = dy w,  dx = r (g - xh mean(g xh)),  dw += sum_n dy xh,  [db += sum_n dy]
//   tangent / second order: the row statistic once, each direction by the chain rule (layernorm.hpp)
//   tangent of reverse:     the reverse evaluated in Dual arithmetic
// LayerNorm (layernorm.hpp) without the centring (mu = 0, s the variance
// about zero): the same row kernels and column sums, taken with their
// centring off. Saves r per row (with its tangents in tangent mode); the
// caller keeps x.
#pragma once
#include "kernels/layernorm.hpp"

namespace gnh::kernels {

// rows: the shape of the row kernels (rows.hpp), as LayerNorm's.
template <class S>
void rmsnorm_forward(const ExecSpace& space, Act2<base_t<S>> y, Act1<base_t<S>> rstd, Act2<base_t<S>> x,
                     Params<base_t<S>> p, index_t w, index_t b, double eps, RowShape rows = default_row_shape()) {
  keep_planes<S>(y, rstd, x, p);
  static const char* const label[2] = {"gnh::rmsnorm::forward", "gnh::rmsnorm::forward::directions"};
  detail::norm_forward<S, false>(space, label, y, Act1<base_t<S>>(), rstd, x, p, w, b, eps, rows);
}

// The second-order forward with an adjoint cut at the output (as
// layernorm_forward_cut).
template <class T, class D = T>
void rmsnorm_forward_cut(const ExecSpace& space, Act2<T> y, Act1<T> rstd, Act2<T> x, Params<T> p, index_t w, index_t b,
                         double eps, Act2<T> adj, View2<double> acc, D* rounded = nullptr,
                         RoomLayout room = RoomLayout()) {
  keep_planes<Jet2<T>>(y, rstd, x, p);
  static const char* const label[2] = {"gnh::rmsnorm::forward", "gnh::rmsnorm::forward::cut"};
  detail::norm_forward<Jet2<T>, false, D>(space, label, y, Act1<T>(), rstd, x, p, w, b, eps, default_row_shape(), adj,
                                          acc, rounded, room);
}

// The primal forward with y written only as the next layer's rounded input
// (as layernorm_forward_rounded).
template <class T, class D>
void rmsnorm_forward_rounded(const ExecSpace& space, Act2<T> y, Act1<T> rstd, Act2<T> x, Params<T> p, index_t w,
                             index_t b, double eps, D* rounded) {
  keep_planes<T>(y, rstd, x, p);
  static const char* const label[2] = {"gnh::rmsnorm::forward", "gnh::rmsnorm::forward::directions"};
  detail::norm_forward<T, false, D>(space, label, y, Act1<T>(), rstd, x, p, w, b, eps, default_row_shape(), Act2<T>(),
                                    View2<double>(), rounded);
}

template <class S>
void rmsnorm_reverse(const ExecSpace& space, Act2<base_t<S>> dx, Grads<base_t<S>> g, Act2<base_t<S>> dy,
                     Act2<base_t<S>> x, Act1<base_t<S>> rstd, Params<base_t<S>> p, index_t w, index_t b,
                     ColumnShape shape = default_column_shape(), RowShape rows = default_row_shape()) {
  keep_planes<S>(dx, g, dy, x, rstd, p);
  static const char* const label[2] = {"gnh::rmsnorm::reverse::input", "gnh::rmsnorm::reverse::params"};
  detail::norm_reverse<S, false>(space, label, dx, g, dy, x, Act1<base_t<S>>(), rstd, p, w, b, shape, rows);
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
