// SPDX-License-Identifier: BSD-3-Clause
// LayerNorm over the channels of each row.
//   forward:  mu = mean(x), r = (var(x) + eps)^(-1/2), xh = (x - mu) r, y = xh w + b
//   reverse:  g = dy w,  dx = r (g - mean(g) - xh mean(g xh)),  dw += sum_n dy xh,  db += sum_n dy
//   tangent / second order: the row statistics once, each direction by the chain rule (below)
//   tangent of reverse:     the reverse evaluated in Dual arithmetic
// Saves mu and r per row (with their tangents in tangent mode); the caller keeps x.
// The row kernels take the centring as a flag: without it (mu = 0, nothing
// saved for it) they are RMSNorm's (kernels/rmsnorm.hpp).
#pragma once
#include <type_traits>

#include "core/bf16.hpp"
#include "core/fastmath.hpp"
#include "core/planes.hpp"
#include "kernels/check.hpp"
#include "kernels/room.hpp"
#include "kernels/colsum.hpp"
#include "kernels/gemm_ledger.hpp"
#include "kernels/op.hpp"
#include "kernels/rows.hpp"
#include "kernels/instances.hpp"

namespace gnh::kernels {

namespace detail {

// One row of the forward's values (rows.hpp): the row statistics (two
// passes, mean then centred squares, for accuracy in float), saved for the
// directions' rows below, and y. Not Centred: mu = 0 (RMSNorm).
// out (not null): y written there instead, rounded as the next layer's
// products round their input, laid out as room says (RoomLayout: y in each
// of its copies).
template <class T, bool Centred = true, class D = T>
struct LayerNormValueRow {
  Act2<T> y;
  Act1<T> mean, rstd;
  Act2<T> x;
  Params<T> p;
  index_t w, b, C;
  T eps;
  D* out = nullptr;
  RoomLayout room{};
  template <class Lanes>
  KOKKOS_INLINE_FUNCTION void operator()(const Lanes& lanes, const index_t n) const {
    const T* xr = &x.v(n, 0);
    const T* pv = p.v.data();
    const T mu = Centred ? lanes.template sum<T>(C, [&](index_t c) { return xr[c]; }) / T(C) : T(0);
    const T var = lanes.template sum<T>(C, [&](index_t c) { return (xr[c] - mu) * (xr[c] - mu); });
    const T r = T(1) / kmath::sqrt(var / T(C) + eps);
    lanes.single([&] {
      if (Centred) mean.v(n) = mu;
      rstd.v(n) = r;
    });
    const auto value = [&](index_t c) { return (xr[c] - mu) * r * pv[w + c] + (b >= 0 ? pv[b + c] : T(0)); };
    if (out)
      lanes.each(C, [&](index_t c) {
        const D v = bf16_as<D>(value(c));
        for (index_t j = 0; j < room.copies(); ++j) out[room.value(n, c, j)] = v;
      });
    else lanes.each(C, [&](index_t c) { y.v(n, c) = value(c); });
  }
};

// One row of one direction (row i = k N + n: direction k, row n), by the
// chain rule in T from the row's saved statistics, with delta = x - mu,
// v = mean(delta^2), r = (v + eps)^-1/2:
//   mu' = mean(x'), v' = 2 mean(delta delta'), r' = -r^3 v' / 2,
//   xh' = delta' r + delta r',  y' = xh' w + xh w' + b'
//   mu'' = mean(x''), v'' = 2 mean(delta'^2 + delta delta''),
//   r'' = 3 r^5 v'^2 / 4 - r^3 v'' / 2,
//   xh'' = delta'' r + 2 delta' r' + delta r'',  y'' = xh'' w + 2 xh' w'
// A direction's rows are consecutive, so its planes stream through memory in
// order; rows taken direction by direction within a row jumped a whole plane
// (N C values) at every step, and the row-major walk stalled on each first
// touch: on the Zen 4, AVX2 build, bench_kernels --op layernorm at K = 16,
// second order 2.8-3.7 -> 1.2-2.1 ms, tangent 0.6-1.9 -> 0.6-0.9 ms.
template <class S, bool Centred = true, class D = base_t<S>>
struct LayerNormDirectionRow {
  using T = base_t<S>;
  Act2<T> y;
  Act1<T> mean, rstd;
  Act2<T> x;
  Params<T> p;
  index_t w, b, C, N, P;
  // With an adjoint cut at the norm's output (second order, acc not empty):
  // y'' is not written but contracted with the cut's adjoint into acc(k, n),
  // its terms in the order of the cut's own row kernel (model/gpt_impl.hpp).
  Act2<T> cut;
  View2<double> acc;
  D* out = nullptr;  // y' rounded there (LayerNormValueRow's out and room)
  RoomLayout room{};
  template <class Lanes>
  KOKKOS_INLINE_FUNCTION void operator()(const Lanes& lanes, const index_t i) const {
    const index_t k = i / N, n = i - k * N;
    const T* xr = &x.v(n, 0);
    const T* pv = p.v.data();
    const T mu = Centred ? mean.v(n) : T(0), r = rstd.v(n);
    const T* xd = &x.d(k, n, 0);
    const T* pd = p.d.data() + k * P;
    const T mu1 = Centred ? lanes.template sum<T>(C, [&](index_t c) { return xd[c]; }) / T(C) : T(0);
    const T v1 = lanes.template sum<T>(C, [&](index_t c) { return (xr[c] - mu) * (xd[c] - mu1); }) * (T(2) / T(C));
    const T r3 = r * r * r, r1 = T(-0.5) * r3 * v1;
    lanes.single([&] {
      if (Centred) mean.d(k, n) = mu1;
      rstd.d(k, n) = r1;
    });
    const auto tangent = [&](index_t c) {
      const T xh = (xr[c] - mu) * r, xh1 = (xd[c] - mu1) * r + (xr[c] - mu) * r1;
      return xh1 * pv[w + c] + xh * pd[w + c] + (b >= 0 ? pd[b + c] : T(0));
    };
    if (out) lanes.each(C, [&](index_t c) { out[room.direction(k, n, c)] = bf16_as<D>(tangent(c)); });
    else lanes.each(C, [&](index_t c) { y.d(k, n, c) = tangent(c); });
    if constexpr (has_second_v<S>) {
      const T* xdd = &x.dd(k, n, 0);
      const T mu2 = Centred ? lanes.template sum<T>(C, [&](index_t c) { return xdd[c]; }) / T(C) : T(0);
      const T v2 = lanes.template sum<T>(C, [&](index_t c) {
        const T d1 = xd[c] - mu1;
        return d1 * d1 + (xr[c] - mu) * (xdd[c] - mu2);
      }) * (T(2) / T(C));
      const T r2 = T(0.75) * r3 * r * r * v1 * v1 - T(0.5) * r3 * v2;
      lanes.single([&] {
        if (Centred) mean.dd(k, n) = mu2;
        rstd.dd(k, n) = r2;
      });
      const auto second = [&](index_t c) {
        const T d0 = xr[c] - mu, d1 = xd[c] - mu1;
        const T xh1 = d1 * r + d0 * r1, xh2 = (xdd[c] - mu2) * r + T(2) * d1 * r1 + d0 * r2;
        return xh2 * pv[w + c] + T(2) * xh1 * pd[w + c];
      };
      if (acc.extent(0) > 0) {
        const T* a = &cut.v(n, 0);
        const T s = lanes.template sum<T>(C, [&](index_t c) { return a[c] * second(c); });
        lanes.single([&] { acc(k, n) += double(s); });
      } else {
        lanes.each(C, [&](index_t c) { y.dd(k, n, c) = second(c); });
      }
    }
  }
};

// One row of the reverse's input adjoint, in S arithmetic (Dual: the tangent
// of the reverse), plane by plane.
template <class S, bool Centred = true>
struct LayerNormReverseRow {
  using T = base_t<S>;
  using io = Io<S>;
  Act2<T> dx, dy, x;
  Act1<T> mean, rstd;
  Params<T> p;
  index_t w, C, K;
  template <class Lanes>
  KOKKOS_INLINE_FUNCTION void operator()(const Lanes& lanes, const index_t n) const {
    for (int k = 0; k < K; ++k) {
      const S mu = Centred ? io::get(mean, k, n) : S(T(0)), r = io::get(rstd, k, n);
      S mg, mgx;
      lanes.template sum2<S>(
          C,
          [&](index_t c, S& a, S& bx) {
            const S gc = io::get(dy, k, n, c) * io::param(p, k, w + c);
            if (Centred) a += gc;
            bx += gc * ((io::get(x, k, n, c) - mu) * r);
          },
          mg, mgx);
      mg = Centred ? mg / T(C) : S(T(0));
      mgx = mgx / T(C);
      lanes.each(C, [&](index_t c) {
        const S xh = (io::get(x, k, n, c) - mu) * r;
        const S gc = io::get(dy, k, n, c) * io::param(p, k, w + c);
        io::put(dx, k, n, c, r * (gc - mg - xh * mgx));
      });
    }
  }
};

// The forward and reverse of either norm; label: the two kernels' labels.
// out (not null; with directions only with a cut): y and y' rounded there,
// laid out as room says (LayerNormValueRow; pairs 0 where room is empty).
template <class S, bool Centred, class D = base_t<S>>
void norm_forward(const ExecSpace& space, const char* const (&label)[2], Act2<base_t<S>> y, Act1<base_t<S>> mean,
                  Act1<base_t<S>> rstd, Act2<base_t<S>> x, Params<base_t<S>> p, index_t w, index_t b, double eps,
                  RowShape rows, Act2<base_t<S>> cut = Act2<base_t<S>>(), View2<double> acc = View2<double>(),
                  D* out = nullptr, RoomLayout room = RoomLayout()) {
  using T = base_t<S>;
  const index_t N = x.rows(), C = x.cols(), K = has_tangents_v<S> ? x.d.extent(0) : 0, P = p.v.extent(0);
  require_extent(label[0], "y rows", y.rows(), N);
  require_extent(label[0], "y cols", y.cols(), C);
  require_extent(label[0], "rstd", rstd.v.extent(0), N);
  const bool cutting = acc.extent(0) > 0;
  if (cutting) require_cut(label[1], cut, acc, N, C, K);
  if (out && !cutting && K > 0) throw std::logic_error(std::string(label[0]) + ": rounded directions without a cut");
  // x read, y written (a GPU's bfloat16 where rounded); the row statistics
  // written, and read by the planes of the directions with x again (a
  // second-order plane beside each; with a cut, the adjoint read instead of
  // the y'' planes written, and a double a row and direction).
  if (room.N == 0) room = RoomLayout{N, C, 0};
  const std::size_t ys = out ? 2 : sizeof(T);
  Traffic(label[0])
      .add(double(N * C), sizeof(T), 2)
      .add(double((out ? room.copies() : 1) * N * C), ys, 2)
      .add(double(2 * N), sizeof(T), 1);
  if (K > 0)
    Traffic(label[1])
        .add(double((1 + 2 * K * (std::is_same<S, Jet2<T>>::value ? 2 : 1) + (cutting ? 1 - 2 * K : -K)) * N * C),
             sizeof(T), 2)
        .add(double(K * N * C), ys, 2)
        .add(double(2 * N), sizeof(T), 1)
        .add(double(cutting ? 2 * K * N : 0), sizeof(double), 1);
  for_rows<T>(space, label[0], N,
              LayerNormValueRow<T, Centred, D>{y, mean, rstd, x, p, w, b, C, static_cast<T>(eps), out, room}, rows);
  if constexpr (has_tangents_v<S>)
    for_rows<T>(space, label[1], K * N,
                LayerNormDirectionRow<S, Centred, D>{y, mean, rstd, x, p, w, b, C, N, P, cut, acc, out, room}, rows);
}

// The weight and bias of each sequence's own gradient (Grads per sequence,
// the primal): the column sums of its rows, a plane per sequence, each in the
// order of a reverse of that sequence alone.
template <class T, bool Centred>
void norm_params_per_sequence(const ExecSpace& space, const char* label, const Grads<T>& g, const Act2<T>& dy,
                              const Act2<T>& x, const Act1<T>& mean, const Act1<T>& rstd, index_t w, index_t b,
                              ColumnShape shape) {
  const index_t R = g.seq_rows, n_seq = sequences_of(label, g, x.rows()), stride = g.seq_stride, C = x.cols();
  const Span2<T> dyv = dy.v, xv = x.v;
  const Span1<T> mv = mean.v, rv = rstd.v, gv = g.v;
  column_sums<T>(
      space, label, n_seq, R, C,
      KOKKOS_LAMBDA(const index_t s, const index_t n, const index_t c, T& dw, T& db) {
        const index_t row = s * R + n;
        const T d = dyv(row, c);
        dw += d * ((xv(row, c) - (Centred ? mv(row) : T(0))) * rv(row));
        db += d;
      },
      KOKKOS_LAMBDA(const index_t s, const index_t c, const T& dw, const T& db) {
        gv(s * stride + w + c) += dw;
        if (b >= 0) gv(s * stride + b + c) += db;
      },
      shape);
}

template <class S, bool Centred>
void norm_reverse(const ExecSpace& space, const char* const (&label)[2], Act2<base_t<S>> dx, Grads<base_t<S>> g,
                  Act2<base_t<S>> dy, Act2<base_t<S>> x, Act1<base_t<S>> mean, Act1<base_t<S>> rstd,
                  Params<base_t<S>> p, index_t w, index_t b, ColumnShape shape, RowShape rows) {
  using io = Io<S>;
  using T = base_t<S>;
  const index_t N = x.rows(), C = x.cols(), K = directions_of<S>(x);
  require_extent(label[0], "dy rows", dy.rows(), N);
  require_extent(label[0], "dx rows", dx.rows(), N);
  // dy and x read, dx written, in each plane (the value plane alone in the
  // primal, where K counts it); the statistics read.
  const index_t planes = has_tangents_v<S> ? 1 + K : 1;
  Traffic(label[0]).add(double(3 * planes * N * C), sizeof(T), 2).add(double(2 * N), sizeof(T), 1);
  // The gradient's weight and bias read and written, once per sequence where
  // it is per sequence.
  const index_t copies = g.per_sequence() ? sequences_of(label[1], g, N) : 1;
  if (g.v.extent(0) > 0)
    Traffic(label[1]).add(double(2 * planes * N * C), sizeof(T), 2).add(double(2 * planes * copies * C), sizeof(T), 1);
  for_rows<S>(space, label[0], N, LayerNormReverseRow<S, Centred>{dx, dy, x, mean, rstd, p, w, C, K}, rows);
  // Weight and bias: column sums over the rows, deterministic (colsum.hpp);
  // none for an empty g (primal only: the adjoints alone).
  if (g.v.extent(0) == 0) return;
  if (g.per_sequence()) {
    if (!std::is_same<S, T>::value) require_summed(label[1], g);
    norm_params_per_sequence<T, Centred>(space, label[1], g, dy, x, mean, rstd, w, b, shape);
    return;
  }
  column_sums<S>(
      space, label[1], K, N, C,
      KOKKOS_LAMBDA(const index_t k, const index_t n, const index_t c, S& dw, S& db) {
        const S d = io::get(dy, k, n, c);
        const S mu = Centred ? io::get(mean, k, n) : S(T(0));
        dw += d * ((io::get(x, k, n, c) - mu) * io::get(rstd, k, n));
        db += d;
      },
      KOKKOS_LAMBDA(const index_t k, const index_t c, const S& dw, const S& db) {
        io::accumulate(g, k, w + c, dw);
        if (b >= 0) io::accumulate(g, k, b + c, db);
      },
      shape);
}

}  // namespace detail

// rows: the shape of the row kernels (rows.hpp); the default suits the
// execution space, and both give the same bits.
template <class S>
void layernorm_forward(const ExecSpace& space, Act2<base_t<S>> y, Act1<base_t<S>> mean, Act1<base_t<S>> rstd,
                       Act2<base_t<S>> x, Params<base_t<S>> p, index_t w, index_t b, double eps,
                       RowShape rows = default_row_shape()) {
  keep_planes<S>(y, mean, rstd, x, p);
  require_extent("gnh::layernorm::forward", "mean", mean.v.extent(0), x.rows());
  static const char* const label[2] = {"gnh::layernorm::forward", "gnh::layernorm::forward::directions"};
  detail::norm_forward<S, true>(space, label, y, mean, rstd, x, p, w, b, eps, rows);
}

// The second-order forward with an adjoint cut at the output: y, y' and the
// statistics as layernorm_forward<Jet2<T>> writes them; y'' not written (y
// needs no second-order planes) but contracted as it is formed with the
// cut's adjoint adj (N, C) into acc (K, N) (model/gpt_impl.hpp, adjoint cuts).
// rounded (not null): y and y' written there as the next layer's rounded
// input instead, laid out as room says (kernels/linear.hpp,
// rounded_input_room).
template <class T, class D = T>
void layernorm_forward_cut(const ExecSpace& space, Act2<T> y, Act1<T> mean, Act1<T> rstd, Act2<T> x, Params<T> p,
                           index_t w, index_t b, double eps, Act2<T> adj, View2<double> acc, D* rounded = nullptr,
                           RoomLayout room = RoomLayout()) {
  keep_planes<Jet2<T>>(y, mean, rstd, x, p);
  require_extent("gnh::layernorm::forward", "mean", mean.v.extent(0), x.rows());
  static const char* const label[2] = {"gnh::layernorm::forward", "gnh::layernorm::forward::cut"};
  detail::norm_forward<Jet2<T>, true, D>(space, label, y, mean, rstd, x, p, w, b, eps, default_row_shape(), adj, acc,
                                         rounded, room);
}

// The primal forward with y written only as the next layer's rounded input
// (rounded: N x C values in the GEMMs' bfloat16 storage), the values a
// product rounding y would read (the gradient engine under bf16-amp keeps
// them for its reverse, model/gpt_impl.hpp); y itself is not written.
template <class T, class D>
void layernorm_forward_rounded(const ExecSpace& space, Act2<T> y, Act1<T> mean, Act1<T> rstd, Act2<T> x, Params<T> p,
                               index_t w, index_t b, double eps, D* rounded) {
  keep_planes<T>(y, mean, rstd, x, p);
  require_extent("gnh::layernorm::forward", "mean", mean.v.extent(0), x.rows());
  static const char* const label[2] = {"gnh::layernorm::forward", "gnh::layernorm::forward::directions"};
  detail::norm_forward<T, true, D>(space, label, y, mean, rstd, x, p, w, b, eps, default_row_shape(), Act2<T>(),
                                   View2<double>(), rounded);
}

template <class S>
void layernorm_reverse(const ExecSpace& space, Act2<base_t<S>> dx, Grads<base_t<S>> g, Act2<base_t<S>> dy,
                       Act2<base_t<S>> x, Act1<base_t<S>> mean, Act1<base_t<S>> rstd, Params<base_t<S>> p, index_t w,
                       index_t b, ColumnShape shape = default_column_shape(), RowShape rows = default_row_shape()) {
  keep_planes<S>(dx, g, dy, x, mean, rstd, p);
  static const char* const label[2] = {"gnh::layernorm::reverse::input", "gnh::layernorm::reverse::params"};
  detail::norm_reverse<S, true>(space, label, dx, g, dy, x, mean, rstd, p, w, b, shape, rows);
}

// The op contract (kernels/op.hpp): theta = [w | b] (C each); saves the row
// mean and reciprocal deviation, (N, 1) each.
template <class T>
struct LayerNormOp {
  static constexpr const char* name = "layernorm";
  index_t N, C;
  bool bias;
  RowShape rows;
  LayerNormOp(index_t N_, index_t C_, bool bias_, RowShape rows_ = default_row_shape())
      : N(N_), C(C_), bias(bias_), rows(rows_) {}
  static LayerNormOp at(const OpDims& d, index_t) { return LayerNormOp(d.B * d.T, d.C, true); }
  OpSizes sizes() const { return {N, C, C, C * (bias ? 2 : 1)}; }
  std::vector<OpExtent> saved() const { return {{N, 1}, {N, 1}}; }
  double flops(OpMode, index_t) const { return 0.0; }
  template <class S>
  void forward(const ExecSpace& space, Act2<T> y, Act2<T> x, Params<T> p, const OpSaved<T>& s) const {
    layernorm_forward<S>(space, y, s.flat(0), s.flat(1), x, p, 0, bias ? C : -1, 1e-5, rows);
  }
  template <class S>
  void reverse(const ExecSpace& space, Act2<T> dx, Grads<T> g, Act2<T> dy, Act2<T> x, Act2<T>, Params<T> p,
               const OpSaved<T>& s) const {
    // The row shape picks the column sums' shape too: teams rows, teams
    // column sums (the GPU's shape as a whole, whatever the backend).
    layernorm_reverse<S>(space, dx, g, dy, x, s.flat(0), s.flat(1), p, 0, bias ? C : -1,
                         rows == RowShape::teams ? ColumnShape::teams : ColumnShape::host, rows);
  }
};

// Compiled once, in gnh_core (kernels/instances.hpp).
#define GNH_LAYERNORM_FORWARD(EXT, S)                                                                         \
  EXT template void layernorm_forward<S>(const ExecSpace&, Act2<base_t<S>>, Act1<base_t<S>>, Act1<base_t<S>>, \
                                         Act2<base_t<S>>, Params<base_t<S>>, index_t, index_t, double, RowShape);
#define GNH_LAYERNORM_REVERSE(EXT, S)                                                                          \
  EXT template void layernorm_reverse<S>(const ExecSpace&, Act2<base_t<S>>, Grads<base_t<S>>, Act2<base_t<S>>, \
                                         Act2<base_t<S>>, Act1<base_t<S>>, Act1<base_t<S>>, Params<base_t<S>>, \
                                         index_t, index_t, ColumnShape, RowShape);
#define GNH_LAYERNORM(EXT, T) \
  GNH_FORWARD_SCALARS(GNH_LAYERNORM_FORWARD, EXT, T) GNH_REVERSE_SCALARS(GNH_LAYERNORM_REVERSE, EXT, T)
GNH_LAYERNORM(extern, float)
GNH_LAYERNORM(extern, double)

}  // namespace gnh::kernels
