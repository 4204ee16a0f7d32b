// SPDX-License-Identifier: BSD-3-Clause
// Causal multi-head and grouped-query self-attention core (between the q, k,
// v projections and the output projection).
//   q, k, v: row n of each (one buffer or three) holds its heads' columns
//   where a QkvLayout (attention_host.hpp) puts them; query head h reads
//   key/value head floor(h G / H); y row n = the H heads' outputs side by side.
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
// and one over keys (dk, dv; a key row of key/value head j visits the
// queries of each of its query heads in turn), so no two threads write the
// same element.
// The portable kernels are row kernels (rows.hpp): a row is a query (forward,
// the reverse's first pass) or a key (the second pass), its head channels on
// the lanes: the products q.k and dy.v are lane sums, the row updates of y,
// dq, dk and dv run on the lanes that own their channels. In the teams shape
// (the default on a GPU) they run as flash-style tiles: a team of rows walks
// the other side's rows in tiles copied into team scratch, causal tiles
// skipped, accumulators in scratch (detail::AttentionTiles).
#pragma once
#include "core/bf16.hpp"
#include "core/planes.hpp"
#include "kernels/attention_host.hpp"
#include "kernels/attention_types.hpp"
#include "kernels/host_parallel.hpp"
#include "kernels/check.hpp"
#include "kernels/op.hpp"
#include "kernels/instances.hpp"
#include "kernels/rows.hpp"

#include <algorithm>
#include <cstddef>
#include <stdexcept>
#include <string>
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
// D as its sequence, position, qkv row, the head's column offsets, the
// sequence's first qkv row and its head's first lse/D row.
// A key row i = (b, j, s) over the B*G*Tc key rows has j its key/value head
// and the q, y and lse offsets of its group's first query head (query()
// gives those of the others).
template <class S>
struct AttentionRows {
  using T = base_t<S>;
  index_t Tc, H, G, hs, K;
  T scale;
  bool bf16;
  index_t off[3], stride[3];
  struct Row {
    index_t b, t, n, j, qo, ko, vo, yo, base, lbase;
  };
  KOKKOS_INLINE_FUNCTION Row head_row(const index_t b, const index_t h, const index_t t) const {
    const index_t j = h / (H / G);
    return {b,      t,      b * Tc + t,      j, off[0] + h * stride[0], off[1] + j * stride[1], off[2] + j * stride[2],
            h * hs, b * Tc, (b * H + h) * Tc};
  }
  // Query row i of the B*H*Tc.
  KOKKOS_INLINE_FUNCTION Row row(const index_t i) const { return head_row(i / (Tc * H), (i / Tc) % H, i % Tc); }
  // Key row i of the B*G*Tc.
  KOKKOS_INLINE_FUNCTION Row key_row(const index_t i) const {
    return head_row(i / (Tc * G), ((i / Tc) % G) * (H / G), i % Tc);
  }
  // The same row seen from query head r of its group.
  KOKKOS_INLINE_FUNCTION Row query(const Row& r, const index_t in_group) const {
    return head_row(r.b, r.j * (H / G) + in_group, r.t);
  }
};

// The other side of a row's loop, plane k, in global memory. For a query
// row: the keys and values of its sequence and head (a = k_s, b = v_s).
template <class S>
struct KeysOf {
  using T = base_t<S>;
  using io = Io<S>;
  static constexpr bool scalars = false;
  Act2<T> kb, vb;
  int k;
  index_t base, ko, vo;
  KOKKOS_INLINE_FUNCTION S a(index_t s, index_t d) const { return io::get(kb, k, base + s, ko + d); }
  KOKKOS_INLINE_FUNCTION S b(index_t s, index_t d) const { return io::get(vb, k, base + s, vo + d); }
};
// For a key row: its sequence's queries (a = q_t, b = dy_t, x = lse_t, y = D_t).
template <class S>
struct QueriesOf {
  using T = base_t<S>;
  using io = Io<S>;
  static constexpr bool scalars = true;
  Act2<T> q, dy;
  Act1<T> lse, D;
  int k;
  index_t base, lbase, qo, yo;
  KOKKOS_INLINE_FUNCTION S a(index_t t, index_t d) const { return io::get(q, k, base + t, qo + d); }
  KOKKOS_INLINE_FUNCTION S b(index_t t, index_t d) const { return io::get(dy, k, base + t, yo + d); }
  KOKKOS_INLINE_FUNCTION S x(index_t t) const { return io::get(lse, k, lbase + t); }
  KOKKOS_INLINE_FUNCTION S y(index_t t) const { return io::get(D, k, lbase + t); }
};
// The same rows s0 .. s0 + n - 1, copied into team scratch (the tiles shape).
template <class S>
struct TileOf {
  const S *A, *B, *X, *Y;
  index_t s0, hs;
  KOKKOS_INLINE_FUNCTION S a(index_t s, index_t d) const { return A[(s - s0) * hs + d]; }
  KOKKOS_INLINE_FUNCTION S b(index_t s, index_t d) const { return B[(s - s0) * hs + d]; }
  KOKKOS_INLINE_FUNCTION S x(index_t s) const { return X[s - s0]; }
  KOKKOS_INLINE_FUNCTION S y(index_t s) const { return Y[s - s0]; }
};

// A row's accumulators (one or two vectors of hs): its outputs in global
// memory (host shape), or team scratch copied out at the end (tiles shape).
template <class S>
struct OutRow {
  using T = base_t<S>;
  using io = Io<S>;
  Act2<T> a0, a1;
  int k;
  index_t n, o0, o1;
  KOKKOS_INLINE_FUNCTION S get(int j, index_t d) const {
    return j ? io::get(a1, k, n, o1 + d) : io::get(a0, k, n, o0 + d);
  }
  KOKKOS_INLINE_FUNCTION void put(int j, index_t d, const S& x) const {
    if (j) io::put(a1, k, n, o1 + d, x);
    else io::put(a0, k, n, o0 + d, x);
  }
};
template <class S>
struct OutTile {
  S* p;
  index_t hs;
  KOKKOS_INLINE_FUNCTION S get(int j, index_t d) const { return p[j * hs + d]; }
  KOKKOS_INLINE_FUNCTION void put(int j, index_t d, const S& x) const { p[j * hs + d] = x; }
};

// The row bodies below run as a loop over their rows (row(i)): per plane k,
// begin(row); per pass, visit every row s of the other side (other(row, k,
// pass)) in [first(t), last(t)) in increasing order, then between(pass);
// end(row). What they read of the other side comes
// through a source (KeysOf/QueriesOf, or a TileOf copy of it), what they
// accumulate through an OutRow/OutTile, and what they carry from one visit to
// the next in a State. Both shapes run the same visits in the same order.

// The forward: one query row i = (b, h, t), in S arithmetic, plane by plane.
template <class S>
struct AttentionForwardRow {
  using T = base_t<S>;
  using io = Io<S>;
  using Scalar = S;
  using Row = typename AttentionRows<S>::Row;
  static constexpr int outs = 1;
  struct State {
    T m = T(0);  // running maximum (a value-only shift)
    S l = S(0), lse = S(0);
  };
  AttentionRows<S> g;
  Act2<T> y;
  Act1<T> lse;
  Act2<T> q, kb, vb;
  // bf16-amp takes three passes, so that the P V operand is the normalised
  // p_ts rounded to bfloat16: the maximum, the log-sum-exp, then the output.
  KOKKOS_INLINE_FUNCTION int passes() const { return g.bf16 ? 3 : 1; }
  KOKKOS_INLINE_FUNCTION Row row(index_t i) const { return g.row(i); }
  KOKKOS_INLINE_FUNCTION index_t first(index_t) const { return 0; }
  KOKKOS_INLINE_FUNCTION index_t last(index_t t) const { return t + 1; }
  KOKKOS_INLINE_FUNCTION KeysOf<S> other(const Row& r, int k, int) const { return {kb, vb, k, r.base, r.ko, r.vo}; }
  KOKKOS_INLINE_FUNCTION OutRow<S> out(const Row& r, int k) const { return {y, y, k, r.n, r.yo, r.yo}; }
  template <class Lanes, class Out>
  KOKKOS_INLINE_FUNCTION void begin(const Lanes& lanes, index_t, const Row&, int, State&, const Out& out) const {
    lanes.each(g.hs, [&](index_t d) { out.put(0, d, S(0)); });
  }
  template <class Lanes, class Src, class Out>
  KOKKOS_INLINE_FUNCTION void visit(const Lanes& lanes, const Row& r, int k, State& st, int pass, index_t s,
                                    const Src& src, const Out& out) const {
    const bool bf16 = g.bf16;
    const S score = lanes.template sum<S>(g.hs, [&](index_t d) {
      return operand(io::get(q, k, r.n, r.qo + d), bf16) * operand(src.a(s, d), bf16);
    }) * g.scale;
    if (!bf16) {
      const T sv = primal_value(score);
      if (s == 0 || sv > st.m) {
        // New running maximum: rescale what was accumulated so far.
        const T corr = s == 0 ? T(0) : kmath::exp(st.m - sv);
        st.l *= corr;
        lanes.each(g.hs, [&](index_t d) {
          S acc = out.get(0, d);
          acc *= corr;
          out.put(0, d, acc);
        });
        st.m = sv;
      }
      const S pe = jexp(score - st.m);
      st.l += pe;
      lanes.each(g.hs, [&](index_t d) { out.put(0, d, out.get(0, d) + pe * src.b(s, d)); });
    } else if (pass == 0) {
      const T sv = primal_value(score);
      st.m = s == 0 || sv > st.m ? sv : st.m;
    } else if (pass == 1) {
      st.l += jexp(score - st.m);
    } else {
      const S p = operand(jexp(score - st.lse), bf16);
      lanes.each(g.hs, [&](index_t d) { out.put(0, d, out.get(0, d) + p * operand(src.b(s, d), bf16)); });
    }
  }
  KOKKOS_INLINE_FUNCTION void between(int pass, State& st) const {
    if (g.bf16 && pass == 1) st.lse = jlog(st.l) + st.m;
  }
  template <class Lanes, class Out>
  KOKKOS_INLINE_FUNCTION void end(const Lanes& lanes, index_t i, const Row&, int k, State& st, const Out& out) const {
    if (g.bf16) {
      lanes.single([&] { io::put(lse, k, i, st.lse); });
      return;
    }
    const S inv = T(1) / st.l;
    lanes.each(g.hs, [&](index_t d) { out.put(0, d, out.get(0, d) * inv); });
    lanes.single([&] { io::put(lse, k, i, jlog(st.l) + st.m); });
  }
};

// The reverse's first pass: one query row i = (b, h, t), its dq and D_t.
template <class S>
struct AttentionQueryRow {
  using T = base_t<S>;
  using io = Io<S>;
  using Scalar = S;
  using Row = typename AttentionRows<S>::Row;
  static constexpr int outs = 1;
  struct State {
    S Dt = S(0), L = S(0);
  };
  AttentionRows<S> g;
  Act2<T> dq;
  Act1<T> D;
  Act2<T> dy, q, kb, vb, y;
  Act1<T> lse;
  KOKKOS_INLINE_FUNCTION int passes() const { return 1; }
  KOKKOS_INLINE_FUNCTION Row row(index_t i) const { return g.row(i); }
  KOKKOS_INLINE_FUNCTION index_t first(index_t) const { return 0; }
  KOKKOS_INLINE_FUNCTION index_t last(index_t t) const { return t + 1; }
  KOKKOS_INLINE_FUNCTION KeysOf<S> other(const Row& r, int k, int) const { return {kb, vb, k, r.base, r.ko, r.vo}; }
  KOKKOS_INLINE_FUNCTION OutRow<S> out(const Row& r, int k) const { return {dq, dq, k, r.n, r.qo, r.qo}; }
  template <class Lanes, class Out>
  KOKKOS_INLINE_FUNCTION void begin(const Lanes& lanes, index_t i, const Row& r, int k, State& st,
                                    const Out& out) const {
    st.Dt = lanes.template sum<S>(
        g.hs, [&](index_t d) { return io::get(dy, k, r.n, r.yo + d) * io::get(y, k, r.n, r.yo + d); });
    const S Dt = st.Dt;
    lanes.single([&] { io::put(D, k, i, Dt); });
    st.L = io::get(lse, k, i);
    lanes.each(g.hs, [&](index_t d) { out.put(0, d, S(0)); });
  }
  template <class Lanes, class Src, class Out>
  KOKKOS_INLINE_FUNCTION void visit(const Lanes& lanes, const Row& r, int k, State& st, int, index_t s, const Src& src,
                                    const Out& out) const {
    const bool bf16 = g.bf16;
    S score, dp;
    lanes.template sum2<S>(
        g.hs,
        [&](index_t d, S& sc, S& dd) {
          sc += operand(io::get(q, k, r.n, r.qo + d), bf16) * operand(src.a(s, d), bf16);
          dd += operand(io::get(dy, k, r.n, r.yo + d), bf16) * operand(src.b(s, d), bf16);
        },
        score, dp);
    const S ds = operand(jexp(score * g.scale - st.L) * (dp - st.Dt) * g.scale, bf16);
    lanes.each(g.hs, [&](index_t d) { out.put(0, d, out.get(0, d) + ds * operand(src.a(s, d), bf16)); });
  }
  KOKKOS_INLINE_FUNCTION void between(int, State&) const {}
  template <class Lanes, class Out>
  KOKKOS_INLINE_FUNCTION void end(const Lanes&, index_t, const Row&, int, State&, const Out&) const {}
};

// The reverse's second pass: one key row i = (b, j, s) of key/value head j,
// its dk and dv, over the queries of the group's query heads (one a pass).
template <class S>
struct AttentionKeyRow {
  using T = base_t<S>;
  using io = Io<S>;
  using Scalar = S;
  using Row = typename AttentionRows<S>::Row;
  static constexpr int outs = 2;
  struct State {};
  AttentionRows<S> g;
  Act2<T> dk, dv;
  Act1<T> D;
  Act2<T> dy, q, kb, vb;
  Act1<T> lse;
  KOKKOS_INLINE_FUNCTION int passes() const { return int(g.H / g.G); }
  KOKKOS_INLINE_FUNCTION Row row(index_t i) const { return g.key_row(i); }
  KOKKOS_INLINE_FUNCTION index_t first(index_t s) const { return s; }
  KOKKOS_INLINE_FUNCTION index_t last(index_t) const { return g.Tc; }
  KOKKOS_INLINE_FUNCTION QueriesOf<S> other(const Row& r, int k, int pass) const {
    const Row h = g.query(r, pass);
    return {q, dy, lse, D, k, h.base, h.lbase, h.qo, h.yo};
  }
  KOKKOS_INLINE_FUNCTION OutRow<S> out(const Row& r, int k) const { return {dk, dv, k, r.n, r.ko, r.vo}; }
  template <class Lanes, class Out>
  KOKKOS_INLINE_FUNCTION void begin(const Lanes& lanes, index_t, const Row&, int, State&, const Out& out) const {
    lanes.each(g.hs, [&](index_t d) {
      out.put(0, d, S(0));
      out.put(1, d, S(0));
    });
  }
  // Query t of the key's sequence (r.t is the key's position s).
  template <class Lanes, class Src, class Out>
  KOKKOS_INLINE_FUNCTION void visit(const Lanes& lanes, const Row& r, int k, State&, int, index_t t, const Src& src,
                                    const Out& out) const {
    const bool bf16 = g.bf16;
    S score, dp;
    lanes.template sum2<S>(
        g.hs,
        [&](index_t d, S& sc, S& dd) {
          sc += operand(src.a(t, d), bf16) * operand(io::get(kb, k, r.n, r.ko + d), bf16);
          dd += operand(src.b(t, d), bf16) * operand(io::get(vb, k, r.n, r.vo + d), bf16);
        },
        score, dp);
    const S p = jexp(score * g.scale - src.x(t));
    const S ds = operand(p * (dp - src.y(t)) * g.scale, bf16);
    const S pm = operand(p, bf16);
    lanes.each(g.hs, [&](index_t d) {
      out.put(0, d, out.get(0, d) + ds * operand(src.a(t, d), bf16));
      out.put(1, d, out.get(1, d) + pm * operand(src.b(t, d), bf16));
    });
  }
  KOKKOS_INLINE_FUNCTION void between(int, State&) const {}
  template <class Lanes, class Out>
  KOKKOS_INLINE_FUNCTION void end(const Lanes&, index_t, const Row&, int, State&, const Out&) const {}
};

// The host shape (rows.hpp's for_rows): one row, the other side read in place.
template <class Body>
struct AttentionRowLoop {
  Body body;
  template <class Lanes>
  KOKKOS_INLINE_FUNCTION void operator()(const Lanes& lanes, const index_t i) const {
    const auto r = body.row(i);
    for (int k = 0; k < body.g.K; ++k) {
      typename Body::State st;
      const auto out = body.out(r, k);
      body.begin(lanes, i, r, k, st, out);
      for (int p = 0; p < body.passes(); ++p) {
        const auto src = body.other(r, k, p);
        for (index_t s = body.first(r.t); s < body.last(r.t); ++s) body.visit(lanes, r, k, st, p, s, src, out);
        body.between(p, st);
      }
      body.end(lanes, i, r, k, st, out);
    }
  }
};

// The tiles shape, in the manner of flash attention: a team takes kTeamRows
// consecutive rows of one (sequence, head) (a thread each, kRowLanes lanes
// over the head's channels) and walks the other side in tiles of up to
// kAttentionTile rows, copied once into team scratch by the whole team
// (coalesced along the channels) and read from there by every row; tiles
// outside every row's causal range are never loaded. Accumulators and the
// carried state live in scratch until the row's end, when they are written
// out once. Never a T x T matrix anywhere; each row visits the same rows in
// the same order as the host shape, so the two agree to rounding.
constexpr int kAttentionTile = 16;
constexpr std::size_t kAttentionScratch = 48 * 1024;  // a GPU block's shared memory without opt-in

template <class Body>
struct AttentionTiles {
  using S = typename Body::Scalar;
  using State = typename Body::State;
  using Policy = TeamRange;
  using Member = typename Policy::member_type;
  Body body;
  index_t seq_teams;  // teams per (sequence, head)
  int R, TK;          // rows per team, other-side rows per tile

  // Scratch: lane partials, accumulators, the tile (A, B, X, Y), the states;
  // bytes() is what a team asks for: that and room to align its start.
  static constexpr std::size_t kAlign = 64;
  KOKKOS_INLINE_FUNCTION static std::size_t payload(int R, int TK, index_t hs) {
    return sizeof(S) * std::size_t(2 * R * kRowLanes + R * Body::outs * hs + 2 * TK * hs + 2 * TK) +
           sizeof(State) * std::size_t(R);
  }
  static std::size_t bytes(int R, int TK, index_t hs) { return payload(R, TK, hs) + kAlign; }
  // The widest tile that fits the budget with R rows (0: none does).
  static int tile_rows(int R, index_t hs) {
    const std::size_t fixed = bytes(R, 0, hs), per = sizeof(S) * std::size_t(2 * hs + 2);
    if (fixed >= kAttentionScratch) return 0;
    return int(std::min<std::size_t>(kAttentionTile, (kAttentionScratch - fixed) / per));
  }

  KOKKOS_INLINE_FUNCTION void operator()(const Member& team) const {
    const auto& g = body.g;
    const index_t hs = g.hs, L = kRowLanes;
    const index_t bh = team.league_rank() / seq_teams, t0 = (team.league_rank() % seq_teams) * R;
    const index_t rows = g.Tc - t0 < R ? g.Tc - t0 : R, i0 = bh * g.Tc + t0;
    S* part = static_cast<S*>(team.team_scratch(0).get_shmem_aligned(payload(R, TK, hs), kAlign));
    S* acc = part + 2 * R * L;
    S* A = acc + R * Body::outs * hs;
    S* B = A + TK * hs;
    S* X = B + TK * hs;
    S* Y = X + TK;
    State* state = reinterpret_cast<State*>(Y + TK);
    auto lanes = [&](const index_t t) { return TeamLanes<Member>{team, part + 2 * t * L}; };
    auto out = [&](const index_t t) { return OutTile<S>{acc + t * Body::outs * hs, hs}; };
    const auto r0 = body.row(i0);
    const index_t lo = body.first(t0), hi = body.last(t0 + rows - 1);
    for (int k = 0; k < g.K; ++k) {
      Kokkos::parallel_for(Kokkos::TeamThreadRange(team, rows), [&](const index_t t) {
        State st;
        body.begin(lanes(t), i0 + t, body.row(i0 + t), k, st, out(t));
        Kokkos::single(Kokkos::PerThread(team), [&] { state[t] = st; });
      });
      for (int p = 0; p < body.passes(); ++p) {
        const auto src = body.other(r0, k, p);
        for (index_t s0 = lo; s0 < hi; s0 += TK) {
          const index_t n = hi - s0 < TK ? hi - s0 : TK;
          team.team_barrier();  // every row is done with the previous tile
          Kokkos::parallel_for(Kokkos::TeamThreadRange(team, n), [&](const index_t j) {
            Kokkos::parallel_for(Kokkos::ThreadVectorRange(team, hs), [&](const index_t d) {
              A[j * hs + d] = src.a(s0 + j, d);
              B[j * hs + d] = src.b(s0 + j, d);
            });
            if constexpr (std::decay_t<decltype(src)>::scalars)
              Kokkos::single(Kokkos::PerThread(team), [&] {
                X[j] = src.x(s0 + j);
                Y[j] = src.y(s0 + j);
              });
          });
          team.team_barrier();  // the tile is in
          const TileOf<S> tile{A, B, X, Y, s0, hs};
          Kokkos::parallel_for(Kokkos::TeamThreadRange(team, rows), [&](const index_t t) {
            const auto r = body.row(i0 + t);
            const index_t a = body.first(r.t) > s0 ? body.first(r.t) : s0;
            const index_t b = body.last(r.t) < s0 + n ? body.last(r.t) : s0 + n;
            if (a >= b) return;
            State st = state[t];
            for (index_t s = a; s < b; ++s) body.visit(lanes(t), r, k, st, p, s, tile, out(t));
            Kokkos::single(Kokkos::PerThread(team), [&] { state[t] = st; });
          });
        }
        team.team_barrier();  // the states are stored
        Kokkos::parallel_for(Kokkos::TeamThreadRange(team, rows), [&](const index_t t) {
          State st = state[t];
          body.between(p, st);
          Kokkos::single(Kokkos::PerThread(team), [&] { state[t] = st; });
        });
      }
      team.team_barrier();
      Kokkos::parallel_for(Kokkos::TeamThreadRange(team, rows), [&](const index_t t) {
        const auto r = body.row(i0 + t);
        State st = state[t];
        body.end(lanes(t), i0 + t, r, k, st, out(t));
        const auto o = body.out(r, k);
        const auto a = out(t);
        lanes(t).each(hs, [&](const index_t d) {
          for (int j = 0; j < Body::outs; ++j) o.put(j, d, a.get(j, d));
        });
      });
      team.team_barrier();  // before the next plane reuses the scratch
    }
  }
};

// The row kernels of a body over the B*H*Tc rows, in the given shape; the
// tiles shape where its scratch fits the budget, the teams rows otherwise.
template <class Body>
void attention_rows(const ExecSpace& space, const char* label, index_t N, const Body& body, RowShape shape) {
  using S = typename Body::Scalar;
  if (N <= 0) return;
  if (shape == RowShape::teams) {
    using F = AttentionTiles<Body>;
    // kTeamRows rows a team in both cases (team_policy, rows.hpp: on a host
    // backend fewer threads, each its lanes in turn), through the same tiles.
    const int R = kTeamRows, TK = F::tile_rows(R, body.g.hs);
    if (TK > 0) {
      const index_t seq_teams = (body.g.Tc + R - 1) / R, teams = N / body.g.Tc * seq_teams;
      const F f{body, seq_teams, R, TK};
      const typename F::Policy policy = team_policy<typename F::Policy>(space, teams, f, R, kRowLanes)
                                            .set_scratch_size(0, Kokkos::PerTeam(F::bytes(R, TK, body.g.hs)));
      Kokkos::parallel_for(label, policy, f);
      return;
    }
  }
  for_rows<S>(space, label, N, AttentionRowLoop<Body>{body}, shape);
}
}  // namespace detail

namespace detail {
// Plane `plane` (0 value, 1 first tangent, 2 first second-order) of q, k and
// v for the host tiles, F = const T (inputs) or T (outputs).
template <class F, class T>
Qkv3<F> host_planes(const QkvActs<T>& x, int plane) {
  Qkv3<F> r;
  const Act2<T>* a[3] = {&x.q, &x.k, &x.v};
  for (int i = 0; i < 3; ++i) {
    r.ld[i] = a[i]->cols();
    r.p[i] = plane == 0 ? a[i]->v.data() : plane == 1 ? a[i]->d.data() : a[i]->dd.data();
  }
  return r;
}
// Each part's rows hold its heads' columns.
template <class T>
void check_qkv(const char* who, const QkvActs<T>& x, const QkvLayout& L, index_t N) {
  if (!L.valid())
    throw std::invalid_argument(std::string(who) + ": " + std::to_string(L.H) + " query heads in groups over " +
                                std::to_string(L.G) + " key/value heads of " + std::to_string(L.hs));
  const Act2<T>* a[3] = {&x.q, &x.k, &x.v};
  static const char* const name[3] = {"q", "k", "v"};
  for (int i = 0; i < 3; ++i) {
    require_extent(who, name[i], a[i]->rows(), N);
    const index_t heads = i == 0 ? L.H : L.G;
    if (L.off[i] + (heads - 1) * L.stride[i] + L.hs > a[i]->cols())
      throw std::invalid_argument(std::string(who) + ": " + name[i] + " rows of " + std::to_string(a[i]->cols()) +
                                  " columns do not hold its heads");
  }
}
// The row kernels' sizes and the layout's offsets.
template <class S>
AttentionRows<S> attention_rows_of(const QkvLayout& L, index_t Tc, index_t K, bool bf16) {
  using T = base_t<S>;
  return {Tc,
          L.H,
          L.G,
          L.hs,
          K,
          T(1) / kmath::sqrt(T(L.hs)),
          bf16,
          {L.off[0], L.off[1], L.off[2]},
          {L.stride[0], L.stride[1], L.stride[2]}};
}
// Each distinct buffer among q, k, v once.
template <class T, class F>
void each_buffer(const QkvActs<T>& x, F&& f) {
  f(x.q);
  if (x.k.v.data() != x.q.v.data()) f(x.k);
  if (x.v.v.data() != x.q.v.data() && x.v.v.data() != x.k.v.data()) f(x.v);
}
}  // namespace detail

// shape: the portable kernels' row shape (rows.hpp); the default suits the
// execution space.
// x_second false (Jet2): x'' is taken as zero (the adjoint cuts of
// model/gpt_impl.hpp); the host tiles do not read it and skip its products,
// the portable rows overwrite x's second-order planes with zeros first.
template <class S>
void attention_forward(const ExecSpace& space, Act2<base_t<S>> y, Act1<base_t<S>> lse, QkvActs<base_t<S>> x,
                       const QkvLayout& L, index_t B, index_t Tc, bool bf16 = false,
                       RowShape shape = default_row_shape(), bool x_second = true, base_t<S>* keep_p = nullptr) {
  keep_planes<S>(y, lse, x.q, x.k, x.v);
  using T = base_t<S>;
  const index_t H = L.H, hs = L.hs, K = directions_of<S>(x.q);
  detail::check_qkv("gnh::attention::forward", x, L, B * Tc);
  require_extent("gnh::attention::forward", "y rows", y.rows(), B * Tc);
  require_extent("gnh::attention::forward", "y cols", y.cols(), H * hs);
  require_extent("gnh::attention::forward", "lse", lse.v.extent(0), B * H * Tc);
  if constexpr (std::is_same_v<T, float> && std::is_same_v<ExecSpace, Kokkos::DefaultHostExecutionSpace>) {
    if (use_host_attention<S>(space, bf16)) {
      space.fence();
      using detail::host_planes;
      host::for_ranges(space, "gnh::attention::forward::host", B * H, [=](std::int64_t bh0, std::int64_t bh1) {
        const Qkv3<const T> x0 = host_planes<const T>(x, 0);
        if constexpr (std::is_same_v<S, T>)
          host::attention_forward(y.v.data(), lse.v.data(), x0, L, B, Tc, bh0, bh1, keep_p);
        else if constexpr (std::is_same_v<S, Dual<T>>)
          host::attention_forward_dual(y.v.data(), y.d.data(), lse.v.data(), lse.d.data(), x0,
                                       host_planes<const T>(x, 1), K, L, B, Tc, bh0, bh1);
        else
          host::attention_forward_jet2(y.v.data(), y.d.data(), y.dd.data(), lse.v.data(), lse.d.data(), lse.dd.data(),
                                       x0, host_planes<const T>(x, 1),
                                       x_second ? host_planes<const T>(x, 2) : Qkv3<const T>(), K, L, B, Tc, bh0, bh1);
      });
      return;
    }
  }
  if (keep_p) throw std::logic_error("gnh::attention::forward: probabilities are kept by the host tiles only");
  if constexpr (has_second_v<S>)
    if (!x_second) detail::each_buffer(x, [&](const Act2<T>& a) { Kokkos::deep_copy(space, a.dd, T(0)); });
  // The matrix-multiply operands (q, k for the scores; p, v for the output)
  // are rounded to bfloat16 under bf16-amp; scores and softmax stay FP32.
  const detail::AttentionRows<S> rows = detail::attention_rows_of<S>(L, Tc, K, bf16);
  detail::attention_rows(space, "gnh::attention::forward", B * H * Tc,
                         detail::AttentionForwardRow<S>{rows, y, lse, x.q, x.k, x.v}, shape);
}

// dx is overwritten (q, k and v with x's layout: the same buffer where x's
// parts share one); D is a (B*H*T) scratch of the same mode.
template <class S>
void attention_reverse(const ExecSpace& space, QkvActs<base_t<S>> dx, Act1<base_t<S>> D, Act2<base_t<S>> dy,
                       QkvActs<base_t<S>> x, Act2<base_t<S>> y, Act1<base_t<S>> lse, const QkvLayout& L, index_t B,
                       index_t Tc, bool bf16 = false, RowShape shape = default_row_shape(),
                       const base_t<S>* kept_p = nullptr) {
  keep_planes<S>(dx.q, dx.k, dx.v, D, dy, x.q, x.k, x.v, y, lse);
  using T = base_t<S>;
  const index_t H = L.H, K = directions_of<S>(x.q);
  detail::check_qkv("gnh::attention::reverse", x, L, B * Tc);
  detail::check_qkv("gnh::attention::reverse", dx, L, B * Tc);
  require_extent("gnh::attention::reverse", "dy rows", dy.rows(), B * Tc);
  require_extent("gnh::attention::reverse", "D", D.v.extent(0), B * H * Tc);
  if constexpr (std::is_same_v<T, float> && std::is_same_v<ExecSpace, Kokkos::DefaultHostExecutionSpace>) {
    if (use_host_attention<S>(space, bf16)) {
      space.fence();
      using detail::host_planes;
      host::for_ranges(space, "gnh::attention::reverse::host", B * L.G, [=](std::int64_t u0, std::int64_t u1) {
        const Qkv3<const T> x0 = host_planes<const T>(x, 0);
        if constexpr (std::is_same_v<S, T>)
          host::attention_reverse(host_planes<T>(dx, 0), D.v.data(), dy.v.data(), x0, y.v.data(), lse.v.data(), L, B,
                                  Tc, u0, u1, kept_p);
        else
          host::attention_reverse_dual(host_planes<T>(dx, 0), host_planes<T>(dx, 1), D.v.data(), D.d.data(),
                                       dy.v.data(), dy.d.data(), x0, host_planes<const T>(x, 1), y.v.data(), y.d.data(),
                                       lse.v.data(), lse.d.data(), K, L, B, Tc, u0, u1);
      });
      return;
    }
  }
  if (kept_p) throw std::logic_error("gnh::attention::reverse: probabilities are kept by the host tiles only");
  const detail::AttentionRows<S> rows = detail::attention_rows_of<S>(L, Tc, K, bf16);
  detail::attention_rows(space, "gnh::attention::reverse::queries", B * H * Tc,
                         detail::AttentionQueryRow<S>{rows, dx.q, D, dy, x.q, x.k, x.v, y, lse}, shape);
  detail::attention_rows(space, "gnh::attention::reverse::keys", B * L.G * Tc,
                         detail::AttentionKeyRow<S>{rows, dx.k, dx.v, D, dy, x.q, x.k, x.v, lse}, shape);
}

// nanoGPT's c_attn rows [q | k | v] of n_head heads each, in one buffer.
template <class S>
void attention_forward(const ExecSpace& space, Act2<base_t<S>> y, Act1<base_t<S>> lse, Act2<base_t<S>> qkv, index_t B,
                       index_t Tc, int n_head, bool bf16 = false, RowShape shape = default_row_shape(),
                       bool qkv_second = true, base_t<S>* keep_p = nullptr) {
  require_extent("gnh::attention::forward", "qkv cols", qkv.cols(), 3 * y.cols());
  attention_forward<S>(space, y, lse, {qkv, qkv, qkv}, QkvLayout::fused(n_head, n_head, y.cols() / n_head), B, Tc, bf16,
                       shape, qkv_second, keep_p);
}
template <class S>
void attention_reverse(const ExecSpace& space, Act2<base_t<S>> dqkv, Act1<base_t<S>> D, Act2<base_t<S>> dy,
                       Act2<base_t<S>> qkv, Act2<base_t<S>> y, Act1<base_t<S>> lse, index_t B, index_t Tc, int n_head,
                       bool bf16 = false, RowShape shape = default_row_shape(), const base_t<S>* kept_p = nullptr) {
  attention_reverse<S>(space, {dqkv, dqkv, dqkv}, D, dy, {qkv, qkv, qkv}, y, lse,
                       QkvLayout::fused(n_head, n_head, y.cols() / n_head), B, Tc, bf16, shape, kept_p);
}

// The op contract (kernels/op.hpp): x (B*T, width) holding q, k and v as
// the layout says -> y (B*T, H hs), no parameters; saves lse (B*H*T) and
// uses D (B*H*T) as the reverse's scratch. By default nanoGPT's c_attn rows
// (width 3 H hs).
template <class T>
struct AttentionOp {
  static constexpr const char* name = "attention";
  index_t B, Tc;
  QkvLayout L;
  index_t width;
  RowShape shape;
  AttentionOp(index_t B_, index_t T_, index_t H_, index_t hs_, RowShape shape_ = default_row_shape())
      : AttentionOp(B_, T_, QkvLayout::fused(H_, H_, hs_), 3 * H_ * hs_, shape_) {}
  AttentionOp(index_t B_, index_t T_, const QkvLayout& L_, index_t width_, RowShape shape_ = default_row_shape())
      : B(B_), Tc(T_), L(L_), width(width_), shape(shape_) {}
  static AttentionOp at(const OpDims& d, index_t) { return AttentionOp(d.B, d.T, d.H, d.C / d.H); }
  OpSizes sizes() const { return {B * Tc, width, L.H * L.hs, 0}; }
  std::vector<OpExtent> saved() const { return {{B * L.H * Tc, 1}, {B * L.H * Tc, 1}}; }
  // Causal Q K^T and P V: 2 * 2 hs T(T+1)/2 per head and sequence; the
  // second-order planes carry one more product (the cross term q' k'), the
  // reverse recomputes P (its five products are 2.5 forwards).
  double flops(OpMode m, index_t K) const {
    const double f1 = 2.0 * 2.0 * double(L.H * L.hs) * double(Tc) * double(Tc + 1) / 2.0 * double(B);
    switch (m) {
      case OpMode::forward:
        return f1;
      case OpMode::tangent:
        return f1 * (1 + 2 * double(K));
      case OpMode::second_order:
        return f1 * (1 + 5 * double(K));
      case OpMode::reverse:
        return 2.5 * f1;
      case OpMode::tangent_reverse:
        return 2.5 * f1 * (1 + 2 * double(K));
    }
    return 0.0;
  }
  template <class S>
  void forward(const ExecSpace& space, Act2<T> y, Act2<T> x, Params<T>, const OpSaved<T>& s) const {
    attention_forward<S>(space, y, s.flat(0), QkvActs<T>{x, x, x}, L, B, Tc, false, shape);
  }
  template <class S>
  void reverse(const ExecSpace& space, Act2<T> dx, Grads<T>, Act2<T> dy, Act2<T> x, Act2<T> y, Params<T>,
               const OpSaved<T>& s) const {
    attention_reverse<S>(space, QkvActs<T>{dx, dx, dx}, s.flat(1), dy, QkvActs<T>{x, x, x}, y, s.flat(0), L, B, Tc,
                         false, shape);
  }
};

// The same op as the Llama family uses it: grouped-query attention with
// n_head/2 key/value heads (one, for an odd n_head), rows [q | k | v].
template <class T>
struct GqaAttentionOp : AttentionOp<T> {
  static constexpr const char* name = "attention_gqa";
  explicit GqaAttentionOp(const AttentionOp<T>& a) : AttentionOp<T>(a) {}
  static GqaAttentionOp at(const OpDims& d, index_t) {
    const index_t H = d.H, G = H % 2 == 0 ? H / 2 : 1, hs = d.C / H;
    return GqaAttentionOp(AttentionOp<T>(d.B, d.T, QkvLayout::fused(H, G, hs), (H + 2 * G) * hs));
  }
};

// Compiled once, in gnh_core (kernels/instances.hpp).
#define GNH_ATTENTION_FORWARD(EXT, S)                                                                            \
  EXT template void attention_forward<S>(const ExecSpace&, Act2<base_t<S>>, Act1<base_t<S>>, QkvActs<base_t<S>>, \
                                         const QkvLayout&, index_t, index_t, bool, RowShape, bool, base_t<S>*);
#define GNH_ATTENTION_REVERSE(EXT, S)                                                                            \
  EXT template void attention_reverse<S>(const ExecSpace&, QkvActs<base_t<S>>, Act1<base_t<S>>, Act2<base_t<S>>, \
                                         QkvActs<base_t<S>>, Act2<base_t<S>>, Act1<base_t<S>>, const QkvLayout&, \
                                         index_t, index_t, bool, RowShape, const base_t<S>*);
#define GNH_ATTENTION(EXT, T) \
  GNH_FORWARD_SCALARS(GNH_ATTENTION_FORWARD, EXT, T) GNH_REVERSE_SCALARS(GNH_ATTENTION_REVERSE, EXT, T)
GNH_ATTENTION(extern, float)
GNH_ATTENTION(extern, double)

}  // namespace gnh::kernels
