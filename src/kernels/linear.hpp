// SPDX-License-Identifier: BSD-3-Clause
// Linear layer, PyTorch convention (W is (out, in), row-major). Bilinear in
// (x, W), so every mode is a handful of GEMMs on planes; with W(eps) = W + eps V:
//   forward:  y = x W^T + b
//   tangent:  y.d[k]  = x.d[k] W^T + x V_k^T + b_k          (x.d stacked: one GEMM)
//   second:   y.dd[k] = x.dd[k] W^T + 2 x.d[k] V_k^T          (W'' = 0)
//   reverse:  dx = dy W,  dW += dy^T x,  db += sum_n dy
//   tangent of reverse:
//             dx.d[k] = dy.d[k] W + dy V_k
//             dW.d[k] += dy.d[k]^T x + dy^T x.d[k],  db.d[k] += sum_n dy.d[k]
// Saves nothing; the caller keeps x (and its tangents). Under the bf16-amp
// policy every GEMM operand is rounded to bfloat16 (GemmPolicy).
#pragma once
#include "core/planes.hpp"
#include "kernels/blas.hpp"
#include "kernels/colsum.hpp"
#include "kernels/op.hpp"
#include "kernels/instances.hpp"

namespace gnh::kernels {

namespace detail {
// y_k (N, out) += broadcast bias b_k (out) for the planes k < K, y_k = y +
// k N out and b_k = b + k b_stride (flat parameter/direction storage): one
// launch for every plane. Indexed by (plane, row, column) rather than
// i % out: an integer division per element kept the flat loop scalar and cost
// as much as the GEMM before it (0.9 ms on a (512, 512) plane, bench_kernels
// linear forward, Zen 3).
template <class T>
void add_bias(const ExecSpace& space, T* y, const T* b, index_t N, index_t out, index_t K = 1, index_t b_stride = 0) {
  using Policy = Kokkos::MDRangePolicy<ExecSpace, Kokkos::Rank<3, Kokkos::Iterate::Right, Kokkos::Iterate::Right>,
                                       Kokkos::IndexType<index_t>>;
  Traffic("gnh::linear::bias").add(double(2 * K * N * out), sizeof(T), 2).add(double(K * out), sizeof(T), 1);
  Kokkos::parallel_for(
      "gnh::linear::bias", Policy(space, {0, 0, 0}, {K, N, out}),
      KOKKOS_LAMBDA(const index_t k, const index_t n, const index_t o) {
        y[(k * N + n) * out + o] += b[k * b_stride + o];
      });
}
// g_k (out) += column sums of dy_k (N, out) for the planes k < K, g_k = g + k
// g_stride and dy_k = dy + k N out: deterministic (colsum.hpp), one launch
// for every plane, each column's rows in the order of one plane alone.
template <class T>
void add_colsum(const ExecSpace& space, T* g, const T* dy, index_t N, index_t out, index_t K = 1, index_t g_stride = 0,
                ColumnShape shape = default_column_shape()) {
  Traffic("gnh::linear::reverse::bias").add(double(K * N * out), sizeof(T), 2).add(double(2 * K * out), sizeof(T), 1);
  column_sums<T>(
      space, "gnh::linear::reverse::bias", K, N, out,
      KOKKOS_LAMBDA(const index_t k, const index_t n, const index_t o, T& s, T&) { s += dy[(k * N + n) * out + o]; },
      KOKKOS_LAMBDA(const index_t k, const index_t o, const T& s, const T&) { g[k * g_stride + o] += s; }, shape);
}
// Under bf16-amp with directions, where the owner gave them room
// (GemmPolicy::layer_input), a layer's input planes rounded once for all its
// products instead of by each: x, read by the value's product and the
// directions' (x V_k^T), and with second order x', read by x' W^T and
// 2 x' V_k^T. The policy returned finds them (ahead slots 2 and 3); the same
// bfloat16 values, so no bit changes.
// Planes its producer rounded there already (rounded_input_room) are read
// as they are.
template <class T>
GemmPolicy<T> with_rounded_input(const ExecSpace& space, const GemmPolicy<T>& pol, const Act2<T>& x, index_t K,
                                 bool second) {
  if (!pol.bf16 || K == 0 || pol.layer_input.extent(0) == 0) return pol;
  if (pol.ahead[2].src == x.v.data() && (!second || pol.ahead[3].src == x.d.data())) return pol;
  using D = Bf16Storage<T>;
  const index_t N = x.rows(), in = x.cols(), planes = second ? 1 + K : 1;
  if (std::size_t(planes * N * in) * sizeof(D) > pol.layer_input.extent(0) * sizeof(T))
    throw std::logic_error("gnh::linear::forward: the rounded input's room holds fewer than " + std::to_string(planes) +
                           " planes of " + std::to_string(N) + " x " + std::to_string(in));
  GemmPolicy<T> lp = pol;
  D* const dst = reinterpret_cast<D*>(pol.layer_input.data());
  round_into(space, lp, 2, x.v.data(), N, in, dst);
  if (second) round_into(space, lp, 3, x.d.data(), K * N, in, dst + N * in);
  return lp;
}

// A layer's input (x and its K tangent planes) rounded by the kernel that
// produces it (an elementwise cut, kernels/cut.hpp) into the room
// with_rounded_input would round it into: where the policy has that room,
// dst and the policy whose products read the planes there (linear_forward
// then rounds nothing of x); else dst null and the policy as given.
// pairs: in pair blocks (RoomLayout) for the pair products of the linear
// layers that read x (linear_forward; the policy's input_pairs), where the
// room holds them.
template <class T>
RoundedInput<T> rounded_input_room(const GemmPolicy<T>& pol, const Act2<T>& x, index_t K, bool pairs = false) {
  using D = Bf16Storage<T>;
  RoundedInput<T> r{pol, nullptr, {}};
  const index_t N = x.rows(), in = x.cols(), blocks = pairs ? (K + 1) / 2 : 0;
  const index_t values = pairs ? 3 * blocks * N * in : (1 + K) * N * in;
  if (!pol.bf16 || K == 0 || std::size_t(values) * sizeof(D) > pol.layer_input.extent(0) * sizeof(T)) return r;
  r.dst = reinterpret_cast<D*>(pol.layer_input.data());
  r.layout = RoomLayout{N, in, blocks};
  if (pairs) {
    r.pol.input_pairs = r.dst;
    return r;
  }
  read_rounded(r.pol, 2, x.v.data(), N * in, r.dst);
  read_rounded(r.pol, 3, x.d.data(), K * N * in, r.dst + N * in);
  return r;
}

// A linear layer's second order with an adjoint cut at its input (x'' = 0)
// as pair products (GemmPolicy::input_pairs, weight_pairs), both operands
// rounded in pair blocks, block j holding x'_2j+1 | x | x'_2j and
// V_2j | W | V_2j+1 (rows of 3 in): y = x W^T from a block's middle; y'_k =
// [x | x'_k] [V_k | W]^T (k even) or [x'_k | x] [W | V_k]^T (k odd), one
// product of inner dimension 2 in written once where x'_k W^T and x V_k^T
// would write y'_k and then read and write it again; y''_k = 2 x'_k V_k^T.
// Two batched calls a plane kind, the even directions and the odd.
template <class T>
void pair_forward(const ExecSpace& space, Act2<T> y, const GemmPolicy<T>& pol, index_t N, index_t in, T beta) {
  const index_t out = y.cols(), K = y.d.extent(0), in3 = 3 * in, even = (K + 1) / 2, odd = K / 2;
  const Bf16Storage<T>*const x = pol.input_pairs, *const w = pol.weight_pairs;
  const index_t xs = N * in3, ws = out * in3, ys = 2 * N * out;
  gemm_batched_rounded<T>(space, false, true, N, out, in, T(1), x + in, in3, 0, w + in, in3, 0, beta, y.v.data(), out,
                          0, 1);
  gemm_batched_rounded<T>(space, false, true, N, out, 2 * in, T(1), x + in, in3, xs, w, in3, ws, beta, y.d.data(), out,
                          ys, even);
  gemm_batched_rounded<T>(space, false, true, N, out, 2 * in, T(1), x, in3, xs, w + in, in3, ws, beta,
                          y.d.data() + N * out, out, ys, odd);
  if (y.dd.extent(0) == 0) return;
  gemm_batched_rounded<T>(space, false, true, N, out, in, T(2), x + 2 * in, in3, xs, w, in3, ws, beta, y.dd.data(), out,
                          ys, even);
  gemm_batched_rounded<T>(space, false, true, N, out, in, T(2), x, in3, xs, w + 2 * in, in3, ws, beta,
                          y.dd.data() + N * out, out, ys, odd);
}

// pol with ahead slot `slot` reading x's values where the kernel that formed
// them wrote them rounded, in room; pol as given where room is null.
template <class T>
GemmPolicy<T> reading_rounded(GemmPolicy<T> pol, int slot, const Act2<T>& x, const Bf16Storage<T>* room) {
  if (room) read_rounded(pol, slot, x.v.data(), x.rows() * x.cols(), room);
  return pol;
}

// Under bf16-amp in a reverse, where the owner gave room (layer_input holds
// N (out + in) rounded values), the value planes of the adjoint dy and (with_x)
// of the input x rounded once for every product that reads them: dx = dy W and
// dW += dy^T x, and with directions dy V_k and dy^T x'_k, instead of dy by
// each of them and x again. The same bfloat16 values in the same chunks of
// rows (gemm, bf16_batched), so no bit changes. An x or dy the policy finds
// rounded ahead already (slot 3, slot 2: their producers wrote them so, dy
// where this room holds it) is not rounded again.
template <class T>
GemmPolicy<T> with_rounded_adjoint(const ExecSpace& space, const GemmPolicy<T>& pol, const Act2<T>& dy,
                                   const Act2<T>& x, bool with_x) {
  using D = Bf16Storage<T>;
  if (with_x && pol.ahead[3].src == x.v.data() && pol.ahead[3].size == x.rows() * x.cols()) with_x = false;
  const bool dy_kept = pol.ahead[2].src == dy.v.data() && pol.ahead[2].size == dy.rows() * dy.cols();
  const index_t N = x.rows(), in = with_x ? x.cols() : 0, out = dy.cols();
  if (!pol.bf16 || (dy_kept && !with_x) ||
      std::size_t(N * (in + out)) * sizeof(D) > pol.layer_input.extent(0) * sizeof(T))
    return pol;
  GemmPolicy<T> rp = pol;
  D* const dst = reinterpret_cast<D*>(pol.layer_input.data());
  if (!dy_kept) round_into(space, rp, 2, dy.v.data(), N, out, dst);
  if (with_x) round_into(space, rp, 3, x.v.data(), N, in, dst + N * out);
  return rp;
}
}  // namespace detail

// b < 0: no bias. The mode follows from S (planes_of): the tangent planes
// with Dual<T> and Jet2<T>, the second-order planes with Jet2<T>. x_second
// false (Jet2 only): x'' is taken as zero and not read, so y''_k = 2 x'_k V_k^T
// alone (the adjoint cuts of model/gpt_impl.hpp, where x'' has been contracted
// with the layer input's adjoint instead of multiplied through W).
// accumulate: y += (every plane; the residual stream updated in place, the
// GEMMs' beta = 1) instead of y =.
template <class S>
void linear_forward(const ExecSpace& space, Act2<base_t<S>> y, Act2<base_t<S>> x, Params<base_t<S>> p, index_t w,
                    index_t b, const GemmPolicy<base_t<S>>& policy = GemmPolicy<base_t<S>>(), bool x_second = true,
                    bool accumulate = false) {
  using T = base_t<S>;
  keep_planes<S>(y, x, p);
  const index_t N = x.rows(), in = x.cols(), out = y.cols(), K = y.d.extent(0);
  require_extent("gnh::linear::forward", "y rows", y.rows(), N);
  // y'' is formed where y has its planes: with a cut at x (x_second false)
  // the model may contract it through the weights instead (model/gpt_impl.hpp).
  if (x_second || y.dd.extent(0) > 0) require_planes<S>("gnh::linear::forward", "y", y, K);
  else require_planes<Dual<T>>("gnh::linear::forward", "y", y, K);
  // x'' is read only where x_second (a cut input may have no such planes).
  if (x_second) require_planes<S>("gnh::linear::forward", "x", x, K);
  else require_planes<Dual<T>>("gnh::linear::forward", "x", x, K);
  require_planes<S>("gnh::linear::forward", "theta", p, K);
  const T* W = p.v.data() + w;
  const T beta = accumulate ? T(1) : T(0);
  if (policy.input_pairs) {
    if (!policy.weight_pairs || K == 0 || x_second || !std::is_same<S, Jet2<T>>::value)
      throw std::logic_error(
          "gnh::linear::forward: an input in pair blocks needs the weight's pair blocks and a "
          "second order with a cut at the input");
    detail::pair_forward(space, y, policy, N, in, beta);
    if (b >= 0) detail::add_bias(space, y.v.data(), p.v.data() + b, N, out);
    if (b >= 0) detail::add_bias(space, y.d.data(), p.d.data() + b, N, out, K, p.d.extent(1));
    return;
  }
  const GemmPolicy<T> pol = detail::with_rounded_input(space, policy, x, K, y.dd.extent(0) > 0);
  gemm<T>(space, pol, "N", "T", T(1), x.v, block(W, 0, out, in), beta, y.v);
  if (b >= 0) detail::add_bias(space, y.v.data(), p.v.data() + b, N, out);
  if (K == 0) return;
  // Stacked over directions: (K*N, in) x (in, out).
  gemm<T>(space, pol, "N", "T", T(1), block(x.d.data(), 0, K * N, in), block(W, 0, out, in), beta,
          block(y.d.data(), 0, K * N, out));
  // Per direction, one batch: x V_k^T (x shared by the batch).
  const index_t P = p.d.extent(1);
  gemm_batched<T>(space, pol, "N", "T", T(1), x.v, 0, block(p.d.data(), w, out, in), P, T(1),
                  block(y.d.data(), 0, N, out), N * out, K);
  if (b >= 0) detail::add_bias(space, y.d.data(), p.d.data() + b, N, out, K, P);
  if (y.dd.extent(0) == 0) return;
  if (x_second)
    gemm<T>(space, pol, "N", "T", T(1), block(x.dd.data(), 0, K * N, in), block(W, 0, out, in), beta,
            block(y.dd.data(), 0, K * N, out));
  gemm_batched<T>(space, pol, "N", "T", T(2), block(x.d.data(), 0, N, in), N * in, block(p.d.data(), w, out, in), P,
                  x_second ? T(1) : beta, block(y.dd.data(), 0, N, out), N * out, K);
}

// dx is overwritten (skipped when it has no rows); g accumulates (skipped
// when it has no entries, primal only: the adjoint cuts' gradient pass needs
// the adjoints alone), per sequence where it is so split (primal only).
// S = T or Dual<T> (the tangent of the reverse).
template <class S>
void linear_reverse(const ExecSpace& space, Act2<base_t<S>> dx, Grads<base_t<S>> g, Act2<base_t<S>> dy,
                    Act2<base_t<S>> x, Params<base_t<S>> p, index_t w, index_t b,
                    const GemmPolicy<base_t<S>>& policy = GemmPolicy<base_t<S>>()) {
  using T = base_t<S>;
  keep_planes<S>(dx, g, dy, x, p);
  const index_t N = x.rows(), in = x.cols(), out = dy.cols(), K = dy.d.extent(0);
  require_extent("gnh::linear::reverse", "dy rows", dy.rows(), N);
  require_planes<S>("gnh::linear::reverse", "x", x, K);
  require_planes<S>("gnh::linear::reverse", "theta", p, K);
  require_planes<S>("gnh::linear::reverse", "gradient", g, K);
  if (dx.rows() > 0) require_planes<S>("gnh::linear::reverse", "dx", dx, K);
  const T* W = p.v.data() + w;
  // x is read by the weight products alone (none where g is empty, primal only).
  const GemmPolicy<T> pol = detail::with_rounded_adjoint(space, policy, dy, x, g.v.extent(0) > 0 || K > 0);
  if (dx.rows() > 0) gemm<T>(space, pol, "N", "N", T(1), dy.v, block(W, 0, out, in), T(0), dx.v);
  if (g.per_sequence()) {
    // Each sequence's own dW_s += dy_s^T x_s (= where seq_fresh: the layer's
    // one product writes its weight's rows): one batch of products of its
    // rows, the same products as one of all rows, and its bias the column
    // sums of its rows (a plane each).
    const index_t R = g.seq_rows, n_seq = sequences_of("gnh::linear::reverse", g, N);
    gemm_batched<T>(space, pol, "T", "N", T(1), block(dy.v.data(), 0, R, out), R * out, block(x.v.data(), 0, R, in),
                    R * in, g.seq_fresh ? T(0) : T(1), block(g.v.data(), w, out, in), g.seq_stride, n_seq);
    if (b >= 0) detail::add_colsum(space, g.v.data() + b, dy.v.data(), R, out, n_seq, g.seq_stride);
  } else if (g.v.extent(0) > 0) {  // an empty g (primal only): dx alone
    gemm<T>(space, pol, "T", "N", T(1), dy.v, x.v, T(1), block(g.v.data(), w, out, in));
    if (b >= 0) detail::add_colsum(space, g.v.data() + b, dy.v.data(), N, out);
  }
  if (K == 0) return;
  require_summed("gnh::linear::reverse", g);
  if (dx.rows() > 0)
    gemm<T>(space, pol, "N", "N", T(1), block(dy.d.data(), 0, K * N, out), block(W, 0, out, in), T(0),
            block(dx.d.data(), 0, K * N, in));
  // Per direction, batches over k: dy V_k, dy'_k^T x and dy^T x'_k (the
  // shared operand at stride 0). The two gradient batches add into G_k in
  // this order, as the per-direction loop did.
  const index_t P = g.d.extent(1);
  if (dx.rows() > 0)
    gemm_batched<T>(space, pol, "N", "N", T(1), dy.v, 0, block(p.d.data(), w, out, in), P, T(1),
                    block(dx.d.data(), 0, N, in), N * in, K);
  gemm_batched<T>(space, pol, "T", "N", T(1), block(dy.d.data(), 0, N, out), N * out, x.v, 0, T(1),
                  block(g.d.data(), w, out, in), P, K);
  gemm_batched<T>(space, pol, "T", "N", T(1), dy.v, 0, block(x.d.data(), 0, N, in), N * in, T(1),
                  block(g.d.data(), w, out, in), P, K);
  if (b >= 0) detail::add_colsum(space, g.d.data() + b, dy.d.data(), N, out, K, P);
}

// The op contract (kernels/op.hpp): y (N, out) = x (N, in) W^T [+ b], theta =
// [W | b]; as the model uses it, the MLP's c_fc, (N, C) -> (N, 4C).
template <class T>
struct LinearOp {
  static constexpr const char* name = "linear";
  index_t N, in, out;
  bool bias;
  LinearOp(index_t N_, index_t in_, index_t out_, bool bias_) : N(N_), in(in_), out(out_), bias(bias_) {}
  static LinearOp at(const OpDims& d, index_t) { return LinearOp(d.B * d.T, d.C, 4 * d.C, true); }
  OpSizes sizes() const { return {N, in, out, out * in + (bias ? out : 0)}; }
  std::vector<OpExtent> saved() const { return {}; }
  double flops(OpMode m, index_t K) const {
    const double f1 = 2.0 * double(N) * double(in) * double(out);
    return (m == OpMode::reverse || m == OpMode::tangent_reverse ? 2.0 : 1.0) * f1 * gemm_multiplier(m, K);
  }
  template <class S>
  void forward(const ExecSpace& space, Act2<T> y, Act2<T> x, Params<T> p, const OpSaved<T>&) const {
    linear_forward<S>(space, y, x, p, 0, bias ? out * in : -1);
  }
  template <class S>
  void reverse(const ExecSpace& space, Act2<T> dx, Grads<T> g, Act2<T> dy, Act2<T> x, Act2<T>, Params<T> p,
               const OpSaved<T>&) const {
    linear_reverse<S>(space, dx, g, dy, x, p, 0, bias ? out * in : -1);
  }
};

// Compiled once, in gnh_core (kernels/instances.hpp).
#define GNH_LINEAR_FORWARD(EXT, S)                                                                                    \
  EXT template void linear_forward<S>(const ExecSpace&, Act2<base_t<S>>, Act2<base_t<S>>, Params<base_t<S>>, index_t, \
                                      index_t, const GemmPolicy<base_t<S>>&, bool, bool);
#define GNH_LINEAR_REVERSE(EXT, S)                                                                          \
  EXT template void linear_reverse<S>(const ExecSpace&, Act2<base_t<S>>, Grads<base_t<S>>, Act2<base_t<S>>, \
                                      Act2<base_t<S>>, Params<base_t<S>>, index_t, index_t,                 \
                                      const GemmPolicy<base_t<S>>&);
#define GNH_LINEAR(EXT, T) \
  GNH_FORWARD_SCALARS(GNH_LINEAR_FORWARD, EXT, T) GNH_REVERSE_SCALARS(GNH_LINEAR_REVERSE, EXT, T)
GNH_LINEAR(extern, float)
GNH_LINEAR(extern, double)

}  // namespace gnh::kernels
