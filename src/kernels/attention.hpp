// SPDX-License-Identifier: BSD-3-Clause
// Causal multi-head self-attention core (between c_attn and c_proj).
//   qkv row n = [q | k | v]; head h owns columns h*hs .. h*hs+hs-1 of each part.
//   forward:  s_ts = q_t.k_s / sqrt(hs) (s <= t),  p_ts = softmax_s(s_t),  y_t = sum_s p_ts v_s
//   reverse:  D_t = dy_t.y_t,  ds_ts = p_ts (dy_t.v_s - D_t)
//             dq_t = sum_s ds_ts k_s / sqrt(hs),  dk_s = sum_t ds_ts q_t / sqrt(hs),
//             dv_s = sum_t p_ts dy_t
//   tangent / second order: the forward in Dual / Jet2 arithmetic; tangent of
//   reverse: the reverse in Dual arithmetic.
// No T x T matrix is ever stored: the forward runs an online softmax per query
// row, accumulating into its own output row (the running maximum is a value-only
// shift, which softmax is invariant to, so it carries no derivative). It saves
// lse_t = log sum_s exp(s_ts) (with tangents), from which the reverse recomputes
// p_ts = exp(s_ts - lse_t). The reverse runs one pass over queries (dq and D)
// and one over keys (dk, dv), so no two threads write the same element.
// The portable kernels are row kernels (rows.hpp): a row is a query (forward,
// the reverse's first pass) or a key (the second pass), its head channels on
// the lanes: the products q.k and dy.v are lane sums, the row updates of y,
// dq, dk and dv run on the lanes that own their channels.
#pragma once
#include "core/bf16.hpp"
#include "core/planes.hpp"
#include "kernels/attention_host.hpp"
#include "kernels/host_parallel.hpp"
#include "kernels/check.hpp"
#include "kernels/op.hpp"
#include "kernels/instances.hpp"
#include "kernels/rows.hpp"

#include <type_traits>

namespace gnh::kernels {

// A matrix-multiply operand: rounded to bfloat16 under the bf16-amp policy.
template <class S>
KOKKOS_INLINE_FUNCTION S operand(const S& x, bool bf16) {
  return bf16 ? round_bf16(x) : x;
}

// Whether the tiled host kernels (attention_host.hpp) take this call: FP32 on a
// host space with a host sgemm, outside bf16-amp (whose operand rounding lives
// in the portable kernels). Its threads take disjoint (sequence, head) pairs.
template <class S>
bool use_host_attention(const ExecSpace& space, bool bf16) {
  if constexpr (std::is_same_v<base_t<S>, float> && std::is_same_v<ExecSpace, Kokkos::DefaultHostExecutionSpace> &&
                Kokkos::SpaceAccessibility<Kokkos::HostSpace, MemSpace>::accessible)
    return !bf16 && host::attention_available();
  (void)space, (void)bf16;
  return false;
}

namespace detail {
// What the row kernels share: the sizes, and a row i = (b, h, t) of lse and
// D as its sequence, position, qkv row and the head's column offsets.
template <class S>
struct AttentionRows {
  using T = base_t<S>;
  index_t Tc, H, C, hs, K;
  T scale;
  bool bf16;
  struct Row {
    index_t b, t, n, qo, ko, vo;
  };
  KOKKOS_INLINE_FUNCTION Row row(const index_t i) const {
    const index_t t = i % Tc, h = (i / Tc) % H, b = i / (Tc * H);
    return {b, t, b * Tc + t, h * hs, C + h * hs, 2 * C + h * hs};
  }
  // The reverse's two products for query row nq and key row ns: q.k and dy.v
  // over the head's channels (bf16-rounded operands under bf16-amp).
  template <class Lanes>
  KOKKOS_INLINE_FUNCTION void products(const Lanes& lanes, const Act2<T>& qkv, const Act2<T>& dy, int k,
                                       const Row& r, index_t nq, index_t ns, S& score, S& dp) const {
    using io = Io<S>;
    lanes.template sum2<S>(
        hs,
        [&](index_t d, S& sc, S& dd) {
          sc += operand(io::get(qkv, k, nq, r.qo + d), bf16) * operand(io::get(qkv, k, ns, r.ko + d), bf16);
          dd += operand(io::get(dy, k, nq, r.qo + d), bf16) * operand(io::get(qkv, k, ns, r.vo + d), bf16);
        },
        score, dp);
  }
};

// One query row i = (b, h, t) of the forward, in S arithmetic, plane by plane.
template <class S>
struct AttentionForwardRow {
  using T = base_t<S>;
  using io = Io<S>;
  AttentionRows<S> g;
  Act2<T> y;
  Act1<T> lse;
  Act2<T> qkv;
  template <class Lanes>
  KOKKOS_INLINE_FUNCTION void operator()(const Lanes& lanes, const index_t i) const {
    const auto r = g.row(i);
    const index_t b = r.b, t = r.t, nq = r.n, qo = r.qo, ko = r.ko, vo = r.vo, Tc = g.Tc, hs = g.hs;
    const T scale = g.scale;
    const bool bf16 = g.bf16;
    for (int k = 0; k < g.K; ++k) {
      T m = 0;
      S l(0);
      lanes.each(hs, [&](index_t d) { io::put(y, k, nq, qo + d, S(0)); });
      auto score_of = [&](index_t ns) {
        return lanes.template sum<S>(hs, [&](index_t d) {
          return operand(io::get(qkv, k, nq, qo + d), bf16) * operand(io::get(qkv, k, ns, ko + d), bf16);
        }) * scale;
      };
      if (bf16) {
        // Two passes, so that the P V operand is the normalised p_ts
        // rounded to bfloat16: first the log-sum-exp, then the output.
        for (index_t s = 0; s <= t; ++s) {
          const T sv = primal_value(score_of(b * Tc + s));
          m = s == 0 || sv > m ? sv : m;
        }
        for (index_t s = 0; s <= t; ++s) l += jexp(score_of(b * Tc + s) - m);
        const S lse_t = jlog(l) + m;
        for (index_t s = 0; s <= t; ++s) {
          const index_t ns = b * Tc + s;
          const S p = operand(jexp(score_of(ns) - lse_t), bf16);
          lanes.each(hs, [&](index_t d) {
            io::put(y, k, nq, qo + d, io::get(y, k, nq, qo + d) + p * operand(io::get(qkv, k, ns, vo + d), bf16));
          });
        }
        lanes.single([&] { io::put(lse, k, i, lse_t); });
        continue;
      }
      for (index_t s = 0; s <= t; ++s) {
        const index_t ns = b * Tc + s;
        const S score = score_of(ns);
        const T sv = primal_value(score);
        if (s == 0 || sv > m) {
          // New running maximum: rescale what was accumulated so far.
          const T corr = s == 0 ? T(0) : kmath::exp(m - sv);
          l *= corr;
          lanes.each(hs, [&](index_t d) {
            S acc = io::get(y, k, nq, qo + d);
            acc *= corr;
            io::put(y, k, nq, qo + d, acc);
          });
          m = sv;
        }
        const S pe = jexp(score - m);
        l += pe;
        lanes.each(hs, [&](index_t d) {
          io::put(y, k, nq, qo + d, io::get(y, k, nq, qo + d) + pe * io::get(qkv, k, ns, vo + d));
        });
      }
      const S inv = T(1) / l;
      lanes.each(hs, [&](index_t d) { io::put(y, k, nq, qo + d, io::get(y, k, nq, qo + d) * inv); });
      lanes.single([&] { io::put(lse, k, i, jlog(l) + m); });
    }
  }
};

// The reverse's first pass: one query row i = (b, h, t), its dq and D_t.
template <class S>
struct AttentionQueryRow {
  using T = base_t<S>;
  using io = Io<S>;
  AttentionRows<S> g;
  Act2<T> dqkv;
  Act1<T> D;
  Act2<T> dy, qkv, y;
  Act1<T> lse;
  template <class Lanes>
  KOKKOS_INLINE_FUNCTION void operator()(const Lanes& lanes, const index_t i) const {
    const auto r = g.row(i);
    const index_t b = r.b, t = r.t, nq = r.n, qo = r.qo, ko = r.ko, Tc = g.Tc, hs = g.hs;
    const T scale = g.scale;
    const bool bf16 = g.bf16;
    for (int k = 0; k < g.K; ++k) {
      const S Dt =
          lanes.template sum<S>(hs, [&](index_t d) { return io::get(dy, k, nq, qo + d) * io::get(y, k, nq, qo + d); });
      lanes.single([&] { io::put(D, k, i, Dt); });
      const S L = io::get(lse, k, i);
      lanes.each(hs, [&](index_t d) { io::put(dqkv, k, nq, qo + d, S(0)); });
      for (index_t s = 0; s <= t; ++s) {
        const index_t ns = b * Tc + s;
        S score, dp;
        g.products(lanes, qkv, dy, k, r, nq, ns, score, dp);
        const S ds = operand(jexp(score * scale - L) * (dp - Dt) * scale, bf16);
        lanes.each(hs, [&](index_t d) {
          io::put(dqkv, k, nq, qo + d, io::get(dqkv, k, nq, qo + d) + ds * operand(io::get(qkv, k, ns, ko + d), bf16));
        });
      }
    }
  }
};

// The reverse's second pass: one key row i = (b, h, s), its dk and dv.
template <class S>
struct AttentionKeyRow {
  using T = base_t<S>;
  using io = Io<S>;
  AttentionRows<S> g;
  Act2<T> dqkv;
  Act1<T> D;
  Act2<T> dy, qkv;
  Act1<T> lse;
  template <class Lanes>
  KOKKOS_INLINE_FUNCTION void operator()(const Lanes& lanes, const index_t i) const {
    const auto r = g.row(i);  // its position t is the key's, s
    const index_t b = r.b, s = r.t, ns = r.n, qo = r.qo, ko = r.ko, vo = r.vo, Tc = g.Tc, H = g.H, hs = g.hs;
    const index_t h = (i / Tc) % H;
    const T scale = g.scale;
    const bool bf16 = g.bf16;
    for (int k = 0; k < g.K; ++k) {
      lanes.each(hs, [&](index_t d) {
        io::put(dqkv, k, ns, ko + d, S(0));
        io::put(dqkv, k, ns, vo + d, S(0));
      });
      for (index_t t = s; t < Tc; ++t) {
        const index_t nq = b * Tc + t, iq = (b * H + h) * Tc + t;
        S score, dp;
        g.products(lanes, qkv, dy, k, r, nq, ns, score, dp);
        const S p = jexp(score * scale - io::get(lse, k, iq));
        const S ds = operand(p * (dp - io::get(D, k, iq)) * scale, bf16);
        const S pm = operand(p, bf16);
        lanes.each(hs, [&](index_t d) {
          io::put(dqkv, k, ns, ko + d, io::get(dqkv, k, ns, ko + d) + ds * operand(io::get(qkv, k, nq, qo + d), bf16));
          io::put(dqkv, k, ns, vo + d, io::get(dqkv, k, ns, vo + d) + pm * operand(io::get(dy, k, nq, qo + d), bf16));
        });
      }
    }
  }
};
}  // namespace detail

// shape: the portable kernels' row shape (rows.hpp); the default suits the
// execution space.
template <class S>
void attention_forward(const ExecSpace& space, Act2<base_t<S>> y, Act1<base_t<S>> lse,
                       Act2<base_t<S>> qkv, index_t B, index_t Tc, int n_head, bool bf16 = false,
                       RowShape shape = default_row_shape()) {
  using T = base_t<S>;
  const index_t C = y.cols(), H = n_head, hs = C / H, K = directions_of<S>(qkv);
  require_extent("gnh::attention::forward", "y rows", y.rows(), B * Tc);
  require_extent("gnh::attention::forward", "qkv rows", qkv.rows(), B * Tc);
  require_extent("gnh::attention::forward", "qkv cols", qkv.cols(), 3 * C);
  require_extent("gnh::attention::forward", "lse", lse.v.extent(0), B * H * Tc);
  require_extent("gnh::attention::forward", "n_head * head_size", H * hs, C);
  if constexpr (std::is_same_v<T, float> && std::is_same_v<ExecSpace, Kokkos::DefaultHostExecutionSpace>) {
    if (use_host_attention<S>(space, bf16)) {
      space.fence();
      host::for_ranges(space, "gnh::attention::forward::host", B * H, [=](std::int64_t bh0, std::int64_t bh1) {
        if constexpr (std::is_same_v<S, T>)
          host::attention_forward(y.v.data(), lse.v.data(), qkv.v.data(), B, Tc, H, hs, bh0, bh1);
        else if constexpr (std::is_same_v<S, Dual<T>>)
          host::attention_forward_dual(y.v.data(), y.d.data(), lse.v.data(), lse.d.data(), qkv.v.data(),
                                       qkv.d.data(), K, B, Tc, H, hs, bh0, bh1);
        else
          host::attention_forward_jet2(y.v.data(), y.d.data(), y.dd.data(), lse.v.data(), lse.d.data(),
                                       lse.dd.data(), qkv.v.data(), qkv.d.data(), qkv.dd.data(), K, B, Tc, H, hs,
                                       bh0, bh1);
      });
      return;
    }
  }
  // The matrix-multiply operands (q, k for the scores; p, v for the output)
  // are rounded to bfloat16 under bf16-amp; scores and softmax stay FP32.
  const detail::AttentionRows<S> rows{Tc, H, C, hs, K, T(1) / kmath::sqrt(T(hs)), bf16};
  for_rows<S>(space, "gnh::attention::forward", B * H * Tc,
              detail::AttentionForwardRow<S>{rows, y, lse, qkv}, shape);
}

// dqkv is overwritten; D is a (B*H*T) scratch of the same mode.
template <class S>
void attention_reverse(const ExecSpace& space, Act2<base_t<S>> dqkv, Act1<base_t<S>> D,
                       Act2<base_t<S>> dy, Act2<base_t<S>> qkv, Act2<base_t<S>> y,
                       Act1<base_t<S>> lse, index_t B, index_t Tc, int n_head, bool bf16 = false,
                       RowShape shape = default_row_shape()) {
  using T = base_t<S>;
  const index_t C = y.cols(), H = n_head, hs = C / H, K = directions_of<S>(qkv);
  require_extent("gnh::attention::reverse", "dqkv rows", dqkv.rows(), B * Tc);
  require_extent("gnh::attention::reverse", "dy rows", dy.rows(), B * Tc);
  require_extent("gnh::attention::reverse", "D", D.v.extent(0), B * H * Tc);
  if constexpr (std::is_same_v<T, float> && std::is_same_v<ExecSpace, Kokkos::DefaultHostExecutionSpace>) {
    if (use_host_attention<S>(space, bf16)) {
      space.fence();
      host::for_ranges(space, "gnh::attention::reverse::host", B * H, [=](std::int64_t bh0, std::int64_t bh1) {
        if constexpr (std::is_same_v<S, T>)
          host::attention_reverse(dqkv.v.data(), D.v.data(), dy.v.data(), qkv.v.data(), y.v.data(), lse.v.data(),
                                  B, Tc, H, hs, bh0, bh1);
        else
          host::attention_reverse_dual(dqkv.v.data(), dqkv.d.data(), D.v.data(), D.d.data(), dy.v.data(),
                                       dy.d.data(), qkv.v.data(), qkv.d.data(), y.v.data(), y.d.data(),
                                       lse.v.data(), lse.d.data(), K, B, Tc, H, hs, bh0, bh1);
      });
      return;
    }
  }
  const detail::AttentionRows<S> rows{Tc, H, C, hs, K, T(1) / kmath::sqrt(T(hs)), bf16};
  for_rows<S>(space, "gnh::attention::reverse::queries", B * H * Tc,
              detail::AttentionQueryRow<S>{rows, dqkv, D, dy, qkv, y, lse}, shape);
  for_rows<S>(space, "gnh::attention::reverse::keys", B * H * Tc,
              detail::AttentionKeyRow<S>{rows, dqkv, D, dy, qkv, lse}, shape);
}

// The op contract (kernels/op.hpp): qkv (B*T, 3C) -> y (B*T, C) over H heads,
// no parameters; saves lse (B*H*T) and uses D (B*H*T) as the reverse's scratch.
template <class T>
struct AttentionOp {
  static constexpr const char* name = "attention";
  index_t B, Tc, H, hs;
  RowShape shape;
  AttentionOp(index_t B_, index_t T_, index_t H_, index_t hs_, RowShape shape_ = default_row_shape())
      : B(B_), Tc(T_), H(H_), hs(hs_), shape(shape_) {}
  static AttentionOp at(const OpDims& d, index_t) { return AttentionOp(d.B, d.T, d.H, d.C / d.H); }
  OpSizes sizes() const { return {B * Tc, 3 * H * hs, H * hs, 0}; }
  std::vector<OpExtent> saved() const { return {{B * H * Tc, 1}, {B * H * Tc, 1}}; }
  // Causal Q K^T and P V: 2 * 2 hs T(T+1)/2 per head and sequence; the
  // second-order planes carry one more product (the cross term q' k'), the
  // reverse recomputes P (its five products are 2.5 forwards).
  double flops(OpMode m, index_t K) const {
    const double f1 = 2.0 * 2.0 * double(H * hs) * double(Tc) * double(Tc + 1) / 2.0 * double(B);
    switch (m) {
      case OpMode::forward: return f1;
      case OpMode::tangent: return f1 * (1 + 2 * double(K));
      case OpMode::second_order: return f1 * (1 + 5 * double(K));
      case OpMode::reverse: return 2.5 * f1;
      case OpMode::tangent_reverse: return 2.5 * f1 * (1 + 2 * double(K));
    }
    return 0.0;
  }
  template <class S>
  void forward(const ExecSpace& space, Act2<T> y, Act2<T> x, Params<T>, const OpSaved<T>& s) const {
    attention_forward<S>(space, y, s.flat(0), x, B, Tc, int(H), false, shape);
  }
  template <class S>
  void reverse(const ExecSpace& space, Act2<T> dx, Grads<T>, Act2<T> dy, Act2<T> x, Act2<T> y, Params<T>,
               const OpSaved<T>& s) const {
    attention_reverse<S>(space, dx, s.flat(1), dy, x, y, s.flat(0), B, Tc, int(H), false, shape);
  }
};

// Compiled once, in gnh_core (kernels/instances.hpp).
#define GNH_ATTENTION_FORWARD(EXT, S)                                                                           \
  EXT template void attention_forward<S>(const ExecSpace&, Act2<base_t<S>>, Act1<base_t<S>>, Act2<base_t<S>>, \
                                         index_t, index_t, int, bool, RowShape);
#define GNH_ATTENTION_REVERSE(EXT, S)                                                                           \
  EXT template void attention_reverse<S>(const ExecSpace&, Act2<base_t<S>>, Act1<base_t<S>>, Act2<base_t<S>>, \
                                         Act2<base_t<S>>, Act2<base_t<S>>, Act1<base_t<S>>, index_t, index_t,   \
                                         int, bool, RowShape);
#define GNH_ATTENTION(EXT, T) GNH_FORWARD_SCALARS(GNH_ATTENTION_FORWARD, EXT, T) GNH_REVERSE_SCALARS(GNH_ATTENTION_REVERSE, EXT, T)
GNH_ATTENTION(extern, float)
GNH_ATTENTION(extern, double)

}  // namespace gnh::kernels
