// SPDX-License-Identifier: BSD-3-Clause
// Attention as batched GEMMs and row kernels; see attention_batched.hpp.
#include "kernels/attention_batched.hpp"

#include "kernels/gemm_ledger.hpp"
#include "kernels/narrow.hpp"

#include <cstdlib>
#include <stdexcept>
#include <string>
#include <type_traits>

namespace gnh::kernels {

namespace {

// Threads per row team: one on a host backend (a row per thread), 128 on a
// GPU (a 1,024-key row is eight entries a thread; the sums reduce in the
// team's tree order, the same every run).
constexpr int kScoreTeam = std::is_same<ExecSpace, Kokkos::DefaultHostExecutionSpace>::value ? 1 : 128;

using Team = Kokkos::TeamPolicy<ExecSpace, Kokkos::IndexType<index_t>>;
using Member = Team::member_type;

template <class T>
KOKKOS_INLINE_FUNCTION T team_max(const Member& team, index_t n, const T* x) {
  T m = x[0];
  Kokkos::parallel_reduce(
      Kokkos::TeamThreadRange(team, n), [&](const index_t s, T& a) { a = x[s] > a ? x[s] : a; }, Kokkos::Max<T>(m));
  return m;
}
template <class T, class F>
KOKKOS_INLINE_FUNCTION T team_sum(const Member& team, index_t n, const F& f) {
  T total = T(0);
  Kokkos::parallel_reduce(
      Kokkos::TeamThreadRange(team, n), [&](const index_t s, T& a) { a += f(s); }, total);
  return total;
}

// Planes of an operand (value, tangents, second order), ld apart a row,
// of T or, half, of bfloat16 storage.
template <class T>
struct Stored {
  T* planes[3] = {nullptr, nullptr, nullptr};
  index_t ld = 0;
  bool half = false;
};

// One chunk of sequences [b0, b0 + Bc): where every operand of its products
// sits. Batch index (direction k, sequence, key/value head j, query head r of
// the group), query head h = j rep + r.
template <class T>
struct Chunk {
  QkvLayout L;
  index_t Tc, Tb, K, b0, Bc, N, rep, C, PE;  // Tb: rows of a causal query block
  T* scores;
  // Where the products read q, k, v and dy: the call's buffers (in_b0 = b0,
  // in_N = N), or under bf16-amp the chunk's rounded copies (0, Bc Tc).
  QkvActs<T> xin;
  Act2<T> dyin;
  index_t in_b0, in_N;
  bool bf16;
  // A call with tangents: its score operands (score_operand), per direction,
  // each row's query heads' blocks of wq columns and key/value heads' blocks
  // of wk; the reverse's also [dY' | dY] and [V | V'] (2 hs each); null
  // otherwise. in_off: where each part's columns start in xin's rows (v
  // alone rounded under bf16-amp in the forward: its first column).
  T *qa = nullptr, *ka = nullptr, *da = nullptr, *va = nullptr;
  index_t wq = 0, wk = 0;
  index_t in_off[3] = {0, 0, 0};
  // half (a forward under bf16-amp, in float): every operand of its products
  // stored as bfloat16: the rounded q, k, v (hx, in place of xin), the score
  // operands, and the probabilities, written by the row kernel over its own
  // scores (probs); the scores the products write stay FP32.
  bool half = false;
  Stored<T> hx[3];
  BatchExtents ext(bool directions, bool group = true) const {
    return {{directions ? K : 1, Bc, L.G, group ? rep : 1}};
  }
  // Part i (0 q, 1 k, 2 v) of buffer a, plane p (0 value, 1 tangents, 2
  // second order); rows from sequence first of n rows a plane.
  Mapped<T> part(const Act2<T>& a, int i, int p, index_t first, index_t n, index_t off) const {
    return part(Stored<T>{{a.v.data(), a.d.data(), a.dd.data()}, a.cols(), false}, i, p, first, n, off);
  }
  Mapped<T> part(const Stored<T>& a, int i, int p, index_t first, index_t n, index_t off) const {
    Mapped<T> m;
    const index_t ld = a.ld;
    m.base = mapped_at(a.planes[p], first * Tc * ld + off, a.half);
    m.half = a.half;
    m.ld = ld;
    m.stride[0] = p ? n * ld : 0;
    m.stride[1] = Tc * ld;
    m.stride[2] = i == 0 ? rep * L.stride[0] : L.stride[i];
    m.stride[3] = i == 0 ? L.stride[0] : 0;
    return m;
  }
  // An output part (dx), and an input part (q, k, v: the operands).
  Mapped<T> out(const Act2<T>& a, int i, int p) const { return part(a, i, p, b0, N, L.off[i]); }
  Mapped<T> in(int i, int p) const {
    if (half) return part(hx[i], i, p, in_b0, in_N, in_off[i]);
    return part(i == 0 ? xin.q : i == 1 ? xin.k : xin.v, i, p, in_b0, in_N, in_off[i]);
  }
  // The score operands from column col of each head's block: part 0 the
  // queries' and 2 dY's (a query head's), 1 the keys' and 3 V's (its
  // key/value head's); per direction, the chunk's sequences.
  Mapped<T> score_operand(int part, index_t col) const {
    Mapped<T> m;
    const bool query = part % 2 == 0;
    const index_t w = part == 0 ? wq : part == 1 ? wk : 2 * L.hs;
    m.ld = (query ? L.H : L.G) * w;
    m.base = mapped_at(part == 0 ? qa : part == 1 ? ka : part == 2 ? da : va, col, half);
    m.half = half;
    m.stride[0] = Bc * Tc * m.ld;
    m.stride[1] = Tc * m.ld;
    m.stride[2] = query ? rep * w : w;
    m.stride[3] = query ? w : 0;
    return m;
  }
  // Rows of the H heads side by side, plane p: y (an output) and dy (an operand).
  Mapped<T> heads(const Act2<T>& a, int p) const { return heads_of(a, p, b0, N); }
  Mapped<T> dy(int p) const { return heads_of(dyin, p, in_b0, in_N); }
  Mapped<T> heads_of(const Act2<T>& a, int p, index_t first, index_t n) const {
    Mapped<T> m;
    m.base = (p == 0 ? a.v.data() : p == 1 ? a.d.data() : a.dd.data()) + first * Tc * C;
    m.ld = C;
    m.stride[0] = p ? n * C : 0;
    m.stride[1] = Tc * C;
    m.stride[2] = rep * L.hs;
    m.stride[3] = L.hs;
    return m;
  }
  // Score plane `first`; per direction: plane first + k for direction k.
  Mapped<T> plane(index_t first, bool per_direction) const {
    Mapped<T> m;
    m.base = scores + first * PE;
    m.ld = Tc;
    m.stride[0] = per_direction ? PE : 0;
    m.stride[1] = L.H * Tc * Tc;
    m.stride[2] = rep * Tc * Tc;
    m.stride[3] = Tc * Tc;
    return m;
  }
  // The probabilities the row kernel left in plane `first` (per direction
  // as plane()): half, bfloat16 over the first half of each row's bytes.
  Mapped<T> probs(index_t first, bool per_direction) const {
    Mapped<T> m = plane(first, per_direction);
    if (!half) return m;
    constexpr index_t r = index_t(sizeof(T) / sizeof(std::uint16_t));
    m.half = true;
    m.ld *= r;
    for (index_t& st : m.stride) st *= r;
    return m;
  }
};

template <class T>
Mapped<const T> in(const Mapped<T>& m) {
  Mapped<const T> r;
  r.base = m.base;
  r.half = m.half;
  r.ld = m.ld;
  for (int j = 0; j < 4; ++j) r.stride[j] = m.stride[j];
  return r;
}
// The same map at query head r of each group (a batch over (k, b, j) only).
template <class T>
Mapped<T> at_r(Mapped<T> m, index_t r) {
  m.base = mapped_at(m.base, r * m.stride[3], m.half);
  return m;
}

// The mapped products of one call, queued (gemm_mapped.hpp): on a GPU one
// small kernel writes the pointers of up to MappedQueue::kMax of them.
template <class T>
struct Products {
  MappedQueue<T>& q;
  // C = alpha op(A) op(B) + beta C over e; m x n, inner k.
  void operator()(bool ta, bool tb, index_t m, index_t n, index_t k, T alpha, const Mapped<T>& A, const Mapped<T>& B,
                  T beta, const Mapped<T>& C, const BatchExtents& e) const {
    const MappedProduct<T> p(ta, tb, m, n, k, alpha, in(A), in(B), beta, C, e);
    q.add(p);
  }
  const ExecSpace& space() const { return q.space(); }
};

// A chunk's products by causal query blocks of Tb rows (attention_block_rows),
// block [r, e) at a time, each block one mapped batch: the scores C = A B^T
// of the block's queries against the keys up to e; the outputs C = A B of
// the block's rows from the planes' first e columns; the key side C = A^T B
// of the block's keys from the rows r to Tc of the planes' columns [r, e)
// (the queries that see those keys) and of B. hs: the head width (the
// scores' inner dimension, the others' columns).
template <class T>
struct Causal {
  const Products<T>& mm;
  index_t Tc, Tb, hs;
  enum Kind { scores, outputs, keys };
  void operator()(Kind kind, T alpha, const Mapped<T>& A, const Mapped<T>& B, T beta, const Mapped<T>& C,
                  const BatchExtents& e) const {
    for (index_t r = 0; r < Tc; r += Tb) {
      const index_t end = std::min(r + Tb, Tc), m = end - r;
      Mapped<T> a = A, b = B, c = C;
      a.base = mapped_at(a.base, r * A.ld + (kind == keys ? r : 0), a.half);
      b.base = mapped_at(b.base, kind == keys ? r * B.ld : 0, b.half);
      c.base = mapped_at(c.base, r * C.ld, c.half);
      if (kind == scores) mm(false, true, m, end, hs, alpha, a, b, beta, c, e);
      else if (kind == outputs) mm(false, false, m, hs, end, alpha, a, b, beta, c, e);
      else mm(true, false, m, hs, Tc - r, alpha, a, b, beta, c, e);
    }
  }
};

// The forward's rows: from the scores of every plane, p (and p', p''), lse
// (and lse', lse''), in place: plane 0 holds S then P; plane 1 + k holds S'_k
// then P'_k; plane 1 + K + k holds S''_k then P''_k.
template <class T>
struct ForwardRows {
  T* sc;
  index_t PE, Tc, Tb, K, g0;
  bool tangents, second, bf16;  // bf16: p, p', p'' rounded (they are GEMM operands)
  Act1<T> lse;
  bool half = false;  // and stored as bfloat16 over their rows (Chunk::probs)
  KOKKOS_INLINE_FUNCTION void operator()(const Member& team) const {
    const index_t i = team.league_rank(), n = i % Tc + 1, gi = g0 + i;
    const index_t end = ((n - 1) / Tb + 1) * Tb, w = end < Tc ? end : Tc;  // the row's block's end
    T* s0 = sc + i * Tc;
    const T m = team_max(team, n, s0);
    const T L = jlog(team_sum<T>(team, n, [&](index_t s) { return jexp(s0[s] - m); })) + m;
    Kokkos::single(Kokkos::PerTeam(team), [&] { lse.v(gi) = L; });
    for (index_t k = 0; tangents && k < K; ++k) {
      T* s1 = sc + (1 + k) * PE + i * Tc;
      T* s2 = second ? sc + (1 + K + k) * PE + i * Tc : nullptr;
      const T l1 = team_sum<T>(team, n, [&](index_t s) { return jexp(s0[s] - L) * s1[s]; });
      const T l2 =
          second ? team_sum<T>(team, n, [&](index_t s) { return jexp(s0[s] - L) * (s2[s] + s1[s] * s1[s]); }) - l1 * l1
                 : T(0);
      Kokkos::single(Kokkos::PerTeam(team), [&] {
        lse.d(k, gi) = l1;
        if (second) lse.dd(k, gi) = l2;
      });
      if (half) {
        // P'' from S'' and S' (both still FP32), then P' over S'.
        if (second)
          narrow_in_place(team, w, s2, [&](index_t s) {
            const T e = s1[s] - l1;
            return s < n ? jexp(s0[s] - L) * (e * e + s2[s] - l2) : T(0);
          });
        narrow_in_place(team, w, s1, [&](index_t s) { return s < n ? jexp(s0[s] - L) * (s1[s] - l1) : T(0); });
        continue;
      }
      Kokkos::parallel_for(Kokkos::TeamThreadRange(team, w), [&](const index_t s) {
        const T p = s < n ? jexp(s0[s] - L) : T(0), e = s1[s] - l1;
        if (second) s2[s] = s < n ? operand(p * (e * e + s2[s] - l2), bf16) : T(0);
        s1[s] = operand(p * e, bf16);
      });
    }
    team.team_barrier();
    if (half) {
      narrow_in_place(team, w, s0, [&](index_t s) { return s < n ? jexp(s0[s] - L) : T(0); });
      return;
    }
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, w),
                         [&](const index_t s) { s0[s] = s < n ? operand(jexp(s0[s] - L), bf16) : T(0); });
  }
};

// The reverse's rows: plane 0 holds S then P, plane 1 dP then dS; with
// tangents plane 2 + k holds S'_k then P'_k and plane 2 + K + k dP'_k then
// dS'_k. D (and D') from dy, y (and their tangents).
template <class T>
struct ReverseRows {
  T* sc;
  index_t PE, Tc, Tb, H, hs, K, g0, n0;
  bool tangents, bf16;  // bf16: P, dS, P', dS' rounded (they are GEMM operands)
  T scale;
  Act1<T> lse, D;
  Act2<T> dy, y;
  KOKKOS_INLINE_FUNCTION void operator()(const Member& team) const {
    const index_t i = team.league_rank(), t = i % Tc, n = t + 1, gi = g0 + i, h = (i / Tc) % H;
    const index_t end = (t / Tb + 1) * Tb, w = end < Tc ? end : Tc;  // the row's block's end
    const index_t row = n0 + (i / (Tc * H)) * Tc + t, c0 = h * hs;
    T *s0 = sc + i * Tc, *dp = sc + PE + i * Tc;
    const T L = lse.v(gi);
    const T Dt = team_sum<T>(team, hs, [&](index_t c) { return dy.v(row, c0 + c) * y.v(row, c0 + c); });
    for (index_t k = 0; tangents && k < K; ++k) {
      T* st = sc + (2 + k) * PE + i * Tc;
      T* sa = sc + (2 + K + k) * PE + i * Tc;
      const T Dk = team_sum<T>(team, hs, [&](index_t c) {
        return dy.d(k, row, c0 + c) * y.v(row, c0 + c) + dy.v(row, c0 + c) * y.d(k, row, c0 + c);
      });
      const T l1 = lse.d(k, gi);
      Kokkos::single(Kokkos::PerTeam(team), [&] { D.d(k, gi) = Dk; });
      Kokkos::parallel_for(Kokkos::TeamThreadRange(team, w), [&](const index_t s) {
        const T p = s < n ? jexp(s0[s] - L) : T(0), pd = p * (st[s] - l1);
        sa[s] = operand((pd * (dp[s] - Dt) + p * (sa[s] - Dk)) * scale, bf16);
        st[s] = operand(pd, bf16);
      });
    }
    team.team_barrier();
    Kokkos::single(Kokkos::PerTeam(team), [&] { D.v(gi) = Dt; });
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, w), [&](const index_t s) {
      const T p = s < n ? jexp(s0[s] - L) : T(0);
      dp[s] = operand(p * (dp[s] - Dt) * scale, bf16);
      s0[s] = operand(p, bf16);
    });
  }
};

// Rows r0 .. r0 + n - 1, columns c0 .. c0 + cols - 1 of `planes` planes of a
// (the value, then tangents, then second-order planes) rounded to bfloat16
// into dst, n rows a plane.
// An operand's value as its products read it: rounded to bfloat16, in T or
// as bfloat16 storage (D = std::uint16_t).
template <class D, class T>
KOKKOS_INLINE_FUNCTION D stored_operand(T x) {
  if constexpr (std::is_same<D, std::uint16_t>::value) return bf16_bits(float(x));
  else return round_bf16(x);
}

// The cursor moved past `values` values of T or, half, of bfloat16 storage
// (rounded up to a whole T).
template <class T>
T* past(T* cursor, index_t values, bool half) {
  return cursor +
         (half ? (values * index_t(sizeof(std::uint16_t)) + index_t(sizeof(T)) - 1) / index_t(sizeof(T)) : values);
}

template <class T, class D>
struct RoundRows {
  Act2<T> a;
  D* dst;
  index_t r0, n, c0, cols, K;
  KOKKOS_INLINE_FUNCTION void operator()(const index_t p, const index_t r, const index_t c) const {
    const index_t row = r0 + r, col = c0 + c;
    const T x = p == 0 ? a.v(row, col) : p <= K ? a.d(p - 1, row, col) : a.dd(p - 1 - K, row, col);
    dst[(p * n + r) * cols + c] = stored_operand<D>(x);
  }
};

// The copy as an activation of n rows (its planes where a has them) of the
// columns from c0 (all but c0 where cols is 0), and the cursor moved past
// it; one launch.
template <class T>
Act2<T> rounded_rows(const ExecSpace& space, const Act2<T>& a, index_t r0, index_t n, index_t planes, index_t K,
                     T*& cursor, index_t c0 = 0, index_t cols = 0) {
  if (cols == 0) cols = a.cols() - c0;
  using Policy = Kokkos::MDRangePolicy<ExecSpace, Kokkos::Rank<3>, Kokkos::IndexType<index_t>>;
  Traffic("gnh::attention::batched::round_bf16").add(double(planes * n * cols), 2 * sizeof(T), 2);
  Kokkos::parallel_for("gnh::attention::batched::round_bf16", Policy(space, {0, 0, 0}, {planes, n, cols}),
                       RoundRows<T, T>{a, cursor, r0, n, c0, cols, K});
  Act2<T> r;
  r.v = Span2<T>(cursor, n, cols);
  if (planes > 1) r.d = Span3<T>(cursor + n * cols, K, n, cols);
  if (planes > 1 + K) r.dd = Span3<T>(cursor + (1 + K) * n * cols, K, n, cols);
  cursor += planes * n * cols;
  return r;
}

// rounded_rows as bfloat16 storage (a half chunk's operand).
template <class T>
Stored<T> stored_rows(const ExecSpace& space, const Act2<T>& a, index_t r0, index_t n, index_t planes, index_t K,
                      T*& cursor, index_t c0 = 0, index_t cols = 0) {
  if (cols == 0) cols = a.cols() - c0;
  using Policy = Kokkos::MDRangePolicy<ExecSpace, Kokkos::Rank<3>, Kokkos::IndexType<index_t>>;
  Traffic("gnh::attention::batched::round_bf16").add(double(planes * n * cols), sizeof(T) + sizeof(std::uint16_t), 2);
  Kokkos::parallel_for("gnh::attention::batched::round_bf16", Policy(space, {0, 0, 0}, {planes, n, cols}),
                       RoundRows<T, std::uint16_t>{a, reinterpret_cast<std::uint16_t*>(cursor), r0, n, c0, cols, K});
  Stored<T> r;
  r.half = true;
  r.ld = cols;
  for (index_t p = 0; p < 3; ++p)
    if (p == 0 || (p == 1 && planes > 1) || (p == 2 && planes > 1 + K))
      r.planes[p] = mapped_at(cursor, (p == 0 ? 0 : p == 1 ? 1 : 1 + K) * n * cols, true);
  cursor = past(cursor, planes * n * cols, true);
  return r;
}

// The score operands of a forward with tangents, so that each derivative
// plane of the scores is one product over a concatenated inner dimension,
// written once (no plane read back to accumulate a second product):
//   S'  = scale [Q' | Q] [K | K']^T
//   S'' = scale [Q | Q'' | 2Q'] [K'' | K | K']^T   (x'' = 0: 2 scale Q' K'^T)
// Per direction k and row, each query head's block [Q'_k | Q] (with x'':
// [Q'_k | Q | Q''_k | 2Q'_k], wq = 4 hs), then each key/value head's block
// [K | K'_k] (with x'': [K''_k | K | K'_k], wk = 3 hs); S' reads the first
// 2 hs of a query block against [K | K'], S'' the last 3 hs against the
// whole key block, the primal S = scale Q K^T direction 0's Q and K.
// Rounded to bfloat16 under bf16-amp (2Q' rounds to twice the rounded Q').
template <class T>
struct ScoreOperands {
  Act2<T> q, k;
  T *qa, *ka;
  index_t r0, n, H, G, hs, wq, wk, offq, sq, offk, sk;
  bool xs, bf16;
  bool half;  // bfloat16 storage at qa, ka
  KOKKOS_INLINE_FUNCTION void put(T* to, index_t at, T x) const {
    if (half) reinterpret_cast<std::uint16_t*>(to)[at] = stored_operand<std::uint16_t>(x);
    else to[at] = operand(x, bf16);
  }
  KOKKOS_INLINE_FUNCTION void operator()(const index_t d, const index_t r, const index_t e) const {
    const index_t row = r0 + r, qcols = H * wq;
    if (e < qcols) {
      const index_t block = (e % wq) / hs, col = offq + (e / wq) * sq + e % hs;
      const T x = block == 0   ? q.d(d, row, col)
                  : block == 1 ? q.v(row, col)
                  : block == 2 ? q.dd(d, row, col)
                               : T(2) * q.d(d, row, col);
      put(qa, (d * n + r) * qcols + e, x);
    } else {
      const index_t f = e - qcols, col = offk + (f / wk) * sk + f % hs;
      const index_t block = (f % wk) / hs + (xs ? 0 : 1);  // x'' = 0: no K'' block
      const T x = block == 0 ? k.dd(d, row, col) : block == 1 ? k.v(row, col) : k.d(d, row, col);
      put(ka, (d * n + r) * G * wk + f, x);
    }
  }
};

// Score operands of rows r0 .. r0 + n - 1 (ScoreOperands) at the cursor,
// moved past them: of a (H heads of hs columns from offa, sa apart) wa per
// head, then of b (G heads from offb, sb apart) wb per head; one launch.
template <class T>
void score_operands(const ExecSpace& space, const Act2<T>& a, index_t offa, index_t sa, const Act2<T>& b, index_t offb,
                    index_t sb, const QkvLayout& L, index_t r0, index_t n, index_t K, index_t wa, index_t wb, bool xs,
                    bool bf16, bool half, T*& cursor, T*& pa, T*& pb) {
  pa = cursor;
  pb = past(cursor, K * n * L.H * wa, half);
  cursor = past(pb, K * n * L.G * wb, half);
  const index_t cols = L.H * wa + L.G * wb;
  using Policy = Kokkos::MDRangePolicy<ExecSpace, Kokkos::Rank<3>, Kokkos::IndexType<index_t>>;
  Traffic("gnh::attention::batched::score_operands")
      .add(double(K * n * cols), sizeof(T) + (half ? sizeof(std::uint16_t) : sizeof(T)), 2);
  Kokkos::parallel_for(
      "gnh::attention::batched::score_operands", Policy(space, {0, 0, 0}, {K, n, cols}),
      ScoreOperands<T>{a, b, pa, pb, r0, n, L.H, L.G, L.hs, wa, wb, offa, sa, offb, sb, xs, bf16, half});
}

// Each distinct buffer among q, k, v once, and dy (the reverse), the chunk's
// rows n from r0 of the planes the call reads, rounded at the cursor: as
// bfloat16 storage in a half chunk, else as rounded floats.
template <class T>
void round_inputs(const ExecSpace& space, Chunk<T>& c, const QkvActs<T>& x, const Act2<T>& dy, index_t r0, index_t n,
                  index_t planes, T*& cursor) {
  const index_t K = c.K;
  const bool k_own = x.k.v.data() != x.q.v.data(), v_own = x.v.v.data() != x.q.v.data() && x.v.v.data() != x.k.v.data();
  if (c.half) {
    c.hx[0] = stored_rows(space, x.q, r0, n, planes, K, cursor);
    c.hx[1] = k_own ? stored_rows(space, x.k, r0, n, planes, K, cursor) : c.hx[0];
    c.hx[2] = v_own                          ? stored_rows(space, x.v, r0, n, planes, K, cursor)
              : x.v.v.data() == x.k.v.data() ? c.hx[1]
                                             : c.hx[0];
    c.in_b0 = 0;
    c.in_N = n;
    return;
  }
  c.xin.q = rounded_rows(space, x.q, r0, n, planes, K, cursor);
  c.xin.k = k_own ? rounded_rows(space, x.k, r0, n, planes, K, cursor) : c.xin.q;
  c.xin.v = v_own                          ? rounded_rows(space, x.v, r0, n, planes, K, cursor)
            : x.v.v.data() == x.k.v.data() ? c.xin.k
                                           : c.xin.q;
  if (dy.rows() > 0) c.dyin = rounded_rows(space, dy, r0, n, std::min<index_t>(planes, 1 + K), K, cursor);
  c.in_b0 = 0;
  c.in_N = n;
}

template <class T>
Chunk<T> chunk_of(const ExecSpace& space, const QkvLayout& L, index_t B, index_t Tc, index_t K, index_t b0, index_t Bc,
                  const AttentionScratch<T>& scratch, const QkvActs<T>& x, const Act2<T>& dy, bool bf16, index_t planes,
                  bool score_ops = false, bool xs = false) {
  Chunk<T> c{L,
             Tc,
             attention_block_rows(Tc, scratch.query_blocks),
             K,
             b0,
             Bc,
             B * Tc,
             L.group(),
             L.H * L.hs,
             Bc * L.H * Tc * Tc,
             scratch.scores.data(),
             x,
             dy,
             b0,
             B * Tc,
             bf16};
  for (int i = 0; i < 3; ++i) c.in_off[i] = L.off[i];
  if (!bf16 && !score_ops) return c;
  const bool k_own = x.k.v.data() != x.q.v.data(), v_own = x.v.v.data() != x.q.v.data() && x.v.v.data() != x.k.v.data();
  const index_t width = x.q.cols() + (k_own ? x.k.cols() : 0) + (v_own ? x.v.cols() : 0);
  const bool half = bf16 && dy.rows() == 0 && std::is_same<T, float>::value && scratch.bf16_storage;
  const index_t need = Bc * attention_operand_values(L, Tc, width, dy.rows() > 0, planes, score_ops, xs, bf16, K, half);
  if (need > index_t(scratch.operands.extent(0)))
    throw std::logic_error("gnh::attention (batched): the operand scratch of " +
                           std::to_string(scratch.operands.extent(0)) + " values holds no chunk of " +
                           std::to_string(Bc) + " sequences (" + std::to_string(need) + ")");
  const index_t r0 = b0 * Tc, n = Bc * Tc;
  T* cursor = scratch.operands.data();
  const bool reverse = dy.rows() > 0;
  // A forward's operands under bf16-amp in bfloat16 storage (float).
  c.half = half;
  if (score_ops) {
    // The score operands: [Q' | Q ...] and [... K | K']; in the reverse also
    // [dY' | dY] and [V | V'] (the layout of the first pair without x'').
    const index_t hs = L.hs;
    c.wq = (xs ? 4 : 2) * hs;
    c.wk = (xs ? 3 : 2) * hs;
    score_operands(space, x.q, L.off[0], L.stride[0], x.k, L.off[1], L.stride[1], L, r0, n, K, c.wq, c.wk, xs, bf16,
                   c.half, cursor, c.qa, c.ka);
    if (reverse) {
      score_operands(space, dy, 0, hs, x.v, L.off[2], L.stride[2], L, r0, n, K, 2 * hs, 2 * hs, false, bf16, false,
                     cursor, c.da, c.va);
      if (!bf16) return c;
    }
  }
  if (score_ops && !reverse) {
    // Under bf16-amp v alone rounded besides (q and k are read only by the
    // scores' products).
    if (bf16) {
      // v's columns alone, from its first (in_off); q and k are not read
      // through xin (null: a product that did would fail loudly).
      if (c.half) c.hx[2] = stored_rows(space, x.v, r0, n, planes, K, cursor, L.off[2], attention_v_columns(L));
      else c.xin.v = rounded_rows(space, x.v, r0, n, planes, K, cursor, L.off[2], attention_v_columns(L));
      c.xin.q = c.xin.k = Act2<T>();
      c.in_off[2] = 0;
      c.in_b0 = 0;
      c.in_N = n;
    }
    return c;
  }
  round_inputs(space, c, x, dy, r0, n, planes, cursor);
  return c;
}

// Sequences per chunk for `planes` planes, or a clear line where not one fits.
template <class T>
index_t chunk_sequences(const char* who, const AttentionScratch<T>& scratch, index_t planes, const QkvLayout& L,
                        index_t B, index_t Tc) {
  const index_t per = scratch.sequences(planes, L.H, Tc);
  if (per < 1)
    throw std::logic_error(std::string(who) + ": the score scratch of " + std::to_string(scratch.scores.extent(0)) +
                           " values holds no sequence of " + std::to_string(planes) + " planes of " +
                           std::to_string(L.H) + " x " + std::to_string(Tc) + "^2");
  return std::min(per, B);
}

template <class T>
void forward_derivative_outputs(const Causal<T>& mm, const Chunk<T>& c, const Act2<T>& y, const Mapped<T>& P0,
                                const Mapped<T>& P1, const Mapped<T>& P2, const Mapped<T>& V0, bool second, bool xs);

// Score values of the chunk's rows that the blocks compute, per plane.
template <class T>
double block_values(const Chunk<T>& c) {
  return double(c.Bc * c.L.H) * double(attention_block_values(c.Tc, c.Tb));
}

// The forward of one chunk: scores, rows, outputs.
template <class T>
void forward_chunk(const Products<T>& q, const Chunk<T>& c, const Act2<T>& y, const Act1<T>& lse, bool tangents,
                   bool second, bool xs) {
  const index_t Tc = c.Tc, hs = c.L.hs;
  const Causal<T> mm{q, Tc, c.Tb, hs};
  using C = Causal<T>;
  const T scale = T(1) / kmath::sqrt(T(hs));
  const BatchExtents e1 = c.ext(false), eK = c.ext(true);
  const Mapped<T> V0 = c.in(2, 0);
  // The scores (FP32) and, over them, the probabilities (Chunk::probs).
  const Mapped<T> S0 = c.plane(0, false), S1 = c.plane(1, true), S2 = c.plane(1 + c.K, true);
  const Mapped<T> P0 = c.probs(0, false), P1 = c.probs(1, true), P2 = c.probs(1 + c.K, true);
  if (!tangents) {
    mm(C::scores, scale, c.in(0, 0), c.in(1, 0), T(0), S0, e1);
  } else {
    // From the score operands (chunk_of, ScoreOperands): each plane one
    // product, its inner dimension 2 hs or 3 hs.
    const bool x2 = second && xs;
    const Mapped<T> QA = c.score_operand(0, 0), KQ = c.score_operand(1, x2 ? hs : 0);
    mm(C::scores, scale, c.score_operand(0, hs), KQ, T(0), S0, e1);  // Q K^T (direction 0's copies)
    const Causal<T> mm2{q, Tc, c.Tb, 2 * hs};
    mm2(C::scores, scale, QA, KQ, T(0), S1, eK);  // [Q' | Q] [K | K']^T
    if (x2) {
      // [Q | Q'' | 2Q'] [K'' | K | K']^T
      const Causal<T> mm3{q, Tc, c.Tb, 3 * hs};
      mm3(C::scores, scale, c.score_operand(0, hs), c.score_operand(1, 0), T(0), S2, eK);
    } else if (second) {
      mm(C::scores, T(2) * scale, QA, c.score_operand(1, hs), T(0), S2, eK);  // 2 Q' K'^T
    }
  }
  q.q.flush();
  // Each plane's block scores read and its probabilities written; lse per row.
  const index_t planes = attention_score_planes(false, tangents, second, c.K), rows = c.Bc * c.L.H * Tc;
  Traffic("gnh::attention::batched::softmax")
      .add(double(planes) * block_values(c), sizeof(T) + (c.half ? sizeof(std::uint16_t) : sizeof(T)), 2)
      .add(double(rows), sizeof(T), 1);
  Kokkos::parallel_for(
      "gnh::attention::batched::softmax", Team(q.space(), rows, kScoreTeam),
      ForwardRows<T>{c.scores, c.PE, Tc, c.Tb, c.K, c.b0 * c.L.H * Tc, tangents, second, c.bf16, lse, c.half});
  mm(C::outputs, T(1), P0, V0, T(0), c.heads(y, 0), e1);
  if (tangents) forward_derivative_outputs(mm, c, y, P0, P1, P2, V0, second, xs);
  q.q.flush();
}

// The outputs' tangents (and second order) from P, P' (and P'').
template <class T>
void forward_derivative_outputs(const Causal<T>& mm, const Chunk<T>& c, const Act2<T>& y, const Mapped<T>& P0,
                                const Mapped<T>& P1, const Mapped<T>& P2, const Mapped<T>& V0, bool second, bool xs) {
  using C = Causal<T>;
  const BatchExtents eK = c.ext(true);
  const Mapped<T> V1 = c.in(2, 1), Y1 = c.heads(y, 1);
  mm(C::outputs, T(1), P1, V0, T(0), Y1, eK);
  mm(C::outputs, T(1), P0, V1, T(1), Y1, eK);
  if (!second) return;
  const Mapped<T> Y2 = c.heads(y, 2);
  mm(C::outputs, T(1), P2, V0, T(0), Y2, eK);
  mm(C::outputs, T(2), P1, V1, T(1), Y2, eK);
  if (xs) mm(C::outputs, T(1), P0, c.in(2, 2), T(1), Y2, eK);
}

// The scores of the reverse (and their tangents): S, dP = dy V^T into planes
// 0 and 1; S'_k and dP'_k into planes 2 + k and 2 + K + k.
template <class T>
void reverse_scores(const Causal<T>& mm, const Chunk<T>& c, bool tangents) {
  using C = Causal<T>;
  const T scale = T(1) / kmath::sqrt(T(c.L.hs));
  const BatchExtents e1 = c.ext(false), eK = c.ext(true);
  if (!tangents) {
    mm(C::scores, scale, c.in(0, 0), c.in(1, 0), T(0), c.plane(0, false), e1);
    mm(C::scores, T(1), c.dy(0), c.in(2, 0), T(0), c.plane(1, false), e1);
    return;
  }
  // From the score operands [Q' | Q], [K | K'], [dY' | dY], [V | V']: each
  // plane one product (the primal's from direction 0's copies).
  const index_t hs = c.L.hs;
  mm(C::scores, scale, c.score_operand(0, hs), c.score_operand(1, 0), T(0), c.plane(0, false), e1);
  mm(C::scores, T(1), c.score_operand(2, hs), c.score_operand(3, 0), T(0), c.plane(1, false), e1);
  const Causal<T> mm2{mm.mm, mm.Tc, mm.Tb, 2 * hs};
  mm2(C::scores, scale, c.score_operand(0, 0), c.score_operand(1, 0), T(0), c.plane(2, true), eK);
  mm2(C::scores, T(1), c.score_operand(2, 0), c.score_operand(3, 0), T(0), c.plane(2 + c.K, true), eK);
}

// The reverse's outputs from P, dS (and P', dS'): dq, and dk, dv summed over
// each group's query heads in order.
template <class T>
void reverse_outputs(const Causal<T>& mm, const Chunk<T>& c, const QkvActs<T>& dx, bool tangents) {
  using C = Causal<T>;
  const BatchExtents e1 = c.ext(false), eK = c.ext(true), g1 = c.ext(false, false), gK = c.ext(true, false);
  const Mapped<T> Q0 = c.in(0, 0), K0 = c.in(1, 0), dY0 = c.dy(0);
  const Mapped<T> P = c.plane(0, false), dS = c.plane(1, false), Pt = c.plane(2, true), dSt = c.plane(2 + c.K, true);
  mm(C::outputs, T(1), dS, K0, T(0), c.out(dx.q, 0, 0), e1);
  if (tangents) {
    const Mapped<T> dQ1 = c.out(dx.q, 0, 1);
    mm(C::outputs, T(1), dSt, K0, T(0), dQ1, eK);
    mm(C::outputs, T(1), dS, c.in(1, 1), T(1), dQ1, eK);
  }
  const Mapped<T> dK0 = c.out(dx.k, 1, 0), dV0 = c.out(dx.v, 2, 0), dK1 = c.out(dx.k, 1, 1), dV1 = c.out(dx.v, 2, 1),
                  Q1 = c.in(0, 1), dY1 = c.dy(1);
  for (index_t r = 0; r < c.rep; ++r) {
    const T beta = r ? T(1) : T(0);
    mm(C::keys, T(1), at_r(dS, r), at_r(Q0, r), beta, dK0, g1);
    mm(C::keys, T(1), at_r(P, r), at_r(dY0, r), beta, dV0, g1);
    if (!tangents) continue;
    mm(C::keys, T(1), at_r(dSt, r), at_r(Q0, r), beta, dK1, gK);
    mm(C::keys, T(1), at_r(dS, r), at_r(Q1, r), T(1), dK1, gK);
    mm(C::keys, T(1), at_r(Pt, r), at_r(dY0, r), beta, dV1, gK);
    mm(C::keys, T(1), at_r(P, r), at_r(dY1, r), T(1), dV1, gK);
  }
}

template <class T>
void require_batched(const char* who, const QkvLayout& L, const AttentionScratch<T>& scratch, index_t count) {
#ifdef GNH_CUBLAS_MATH_MODE
  if (scratch.pointers.capacity() < 1)
    throw std::logic_error(std::string(who) + ": no pointer scratch for " + std::to_string(count) + " products");
#else
  (void)scratch, (void)count;
#endif
  if (!L.valid())
    throw std::invalid_argument(std::string(who) + ": " + std::to_string(L.H) + " query heads in groups over " +
                                std::to_string(L.G) + " key/value heads of " + std::to_string(L.hs));
}

}  // namespace

template <class S>
void attention_forward_batched(const ExecSpace& space, Act2<base_t<S>> y, Act1<base_t<S>> lse, QkvActs<base_t<S>> x,
                               const QkvLayout& L, index_t B, index_t Tc, bool tf32, bool bf16, bool x_second,
                               const AttentionScratch<base_t<S>>& scratch) {
  using T = base_t<S>;
  keep_planes<S>(y, lse, x.q, x.k, x.v);
  constexpr bool tangents = has_tangents_v<S>, second = has_second_v<S>;
  const index_t K = tangents ? directions_of<S>(x.q) : 0;
  const char* who = "gnh::attention::forward (batched)";
  require_batched(who, L, scratch, K * B * L.H);
  detail::check_qkv(who, x, L, B * Tc);
  require_extent(who, "y rows", y.rows(), B * Tc);
  require_extent(who, "y cols", y.cols(), L.H * L.hs);
  require_extent(who, "lse", lse.v.extent(0), B * L.H * Tc);
  const index_t Bc = chunk_sequences(who, scratch, attention_score_planes(false, tangents, second, K), L, B, Tc);
  // bf16-amp's rounded operands are exact in TF32: tensor cores either way.
  MappedQueue<T> queue(space, tf32 || bf16, scratch.pointers);
  const Products<T> mm{queue};
  for (index_t b0 = 0; b0 < B; b0 += Bc)
    forward_chunk(mm,
                  chunk_of(space, L, B, Tc, K, b0, std::min(Bc, B - b0), scratch, x, Act2<T>(), bf16,
                           second && x_second ? 1 + 2 * K : 1 + K, tangents, second && x_second),
                  y, lse, tangents, second, x_second);
}

template <class S>
void attention_reverse_batched(const ExecSpace& space, QkvActs<base_t<S>> dx, Act1<base_t<S>> D, Act2<base_t<S>> dy,
                               QkvActs<base_t<S>> x, Act2<base_t<S>> y, Act1<base_t<S>> lse, const QkvLayout& L,
                               index_t B, index_t Tc, bool tf32, bool bf16,
                               const AttentionScratch<base_t<S>>& scratch) {
  using T = base_t<S>;
  keep_planes<S>(dx.q, dx.k, dx.v, D, dy, x.q, x.k, x.v, y, lse);
  constexpr bool tangents = has_tangents_v<S>;
  const index_t K = tangents ? directions_of<S>(x.q) : 0;
  const char* who = "gnh::attention::reverse (batched)";
  require_batched(who, L, scratch, K * B * L.H);
  detail::check_qkv(who, x, L, B * Tc);
  detail::check_qkv(who, dx, L, B * Tc);
  require_extent(who, "dy rows", dy.rows(), B * Tc);
  require_extent(who, "D", D.v.extent(0), B * L.H * Tc);
  const index_t Bc = chunk_sequences(who, scratch, attention_score_planes(true, tangents, false, K), L, B, Tc);
  // bf16-amp's rounded operands are exact in TF32: tensor cores either way.
  MappedQueue<T> queue(space, tf32 || bf16, scratch.pointers);
  const Products<T> mm{queue};
  const T scale = T(1) / kmath::sqrt(T(L.hs));
  for (index_t b0 = 0; b0 < B; b0 += Bc) {
    const Chunk<T> c = chunk_of(space, L, B, Tc, K, b0, std::min(Bc, B - b0), scratch, x, dy, bf16, 1 + K, tangents);
    const Causal<T> blocks{mm, Tc, c.Tb, L.hs};
    reverse_scores(blocks, c, tangents);
    queue.flush();
    // The probabilities and their adjoints read, the scores' adjoints
    // written, in each plane; lse and D per row; dy and y of the heads.
    const index_t planes = attention_score_planes(true, tangents, false, K), rows = c.Bc * L.H * Tc;
    Traffic("gnh::attention::batched::softmax_reverse")
        .add(double(planes) * block_values(c), 3 * sizeof(T) / 2, 2)
        .add(double(2 * rows), sizeof(T), 1)
        .add(double(2 * (1 + K) * c.Bc * Tc * L.H * L.hs), sizeof(T), 2);
    Kokkos::parallel_for("gnh::attention::batched::softmax_reverse", Team(space, c.Bc * L.H * Tc, kScoreTeam),
                         ReverseRows<T>{c.scores, c.PE, Tc, c.Tb, L.H, L.hs, K, b0 * L.H * Tc, b0 * Tc, tangents,
                                        c.bf16, scale, lse, D, dy, y});
    reverse_outputs(blocks, c, dx, tangents);
    queue.flush();
  }
}

const char* attention_path_name(AttentionPath p) {
  switch (p) {
    case AttentionPath::tiles:
      return "tiles";
    case AttentionPath::batched:
      return "batched";
    case AttentionPath::rows:
      return "rows";
  }
  return "?";
}

template <class T>
AttentionPath attention_path(bool bf16, bool gpu_shaped) {
  constexpr bool host = std::is_same<ExecSpace, Kokkos::DefaultHostExecutionSpace>::value;
#ifdef GNH_CUBLAS_MATH_MODE
  constexpr bool batched_here = true;
#else
  constexpr bool batched_here = host;
#endif
  const bool batched_ok = batched_here;
  (void)bf16;
  if (attention_batched_requested() && batched_ok) return AttentionPath::batched;
  if ((gpu_shaped || !host) && batched_ok) return AttentionPath::batched;
  return use_host_attention<T>(ExecSpace(), bf16) ? AttentionPath::tiles : AttentionPath::rows;
}

GNH_ATTENTION_BATCHED(, float)
GNH_ATTENTION_BATCHED(, double)

}  // namespace gnh::kernels
