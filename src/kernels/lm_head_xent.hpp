// SPDX-License-Identifier: BSD-3-Clause
// Language-model head fused with the token cross-entropy (summed over rows;
// the epoch driver divides by the true target count).
//   forward:  z = h W^T (V logits per row), lse = log sum_v exp(z_v),
//             loss_n = lse_n - z_n[target_n]   (0 where target_n < 0)
//   reverse:  dz = softmax(z) - onehot(target),  dh = dz W,  dW += dz^T h
//   tangent:  z.d[k] = h.d[k] W^T + h V_k^T;  second: z.dd[k] = h.dd[k] W^T + 2 h.d[k] V_k^T;
//             lse' = sum softmax(z) z', lse'' = sum softmax(z) (z'' + z'^2) - lse'^2
//   The second-order logits are never formed: with q = softmax(z),
//             sum_v q_v z''_v = h.dd[k] . (q W) + 2 h.d[k] . (q V_k),
//   so a tile costs one GEMM q W shared by all directions and one q V_k per
//   direction (rows x C moments), where z'' took two per direction; and the
//   target's z''_y is a dot product of C.
//   tangent of reverse: dz' = softmax(z) (z' - lse'), then the bilinear rules of linear.hpp
// The logits are computed in tiles of (rows, vocabulary) chunks, the shape of
// the workspace z (its planes hold one tile), so that neither the full
// (B*T, V) tensor nor a full (rows, V) block need exist. The forward runs an
// online log-sum-exp over the vocabulary chunks of a row block: with the
// running maximum m and e_v = exp(z_v - m) it keeps s = sum e_v and, per
// direction, A1 = sum e_v z'_v and A2 = sum e_v (z''_v + z'_v^2), all rescaled
// by exp(m_old - m_new) when m grows; then lse = log s + m, lse' = A1 / s,
// lse'' = A2 / s - lse'^2, where A2 = B + h.dd . M_W + 2 h.d . M_k from
// B = sum e_v z'_v^2 and the moments M_W = sum e_v W_v, M_k = sum e_v V_kv
// (rescaled with s). Saves lse per row (with tangents); the reverse
// recomputes each tile's logits from h and W (unless one tile holds the whole
// batch and the forward just computed it). Under bf16-amp the GEMM operands
// are rounded to bfloat16; lse, softmax and the loss stay FP32.
#pragma once
#include <algorithm>
#include <stdexcept>
#include <type_traits>

#include "core/fastmath.hpp"
#include "core/planes.hpp"
#include "kernels/blas.hpp"
#include "kernels/gemm_ledger.hpp"
#include "kernels/op.hpp"
#include "kernels/instances.hpp"
#include "kernels/rows.hpp"

namespace gnh::kernels {

namespace detail {
// Rows made of `parts` column blocks of C, each from its own source, rounded:
// block b, row r, columns [p C, (p + 1) C) from sources(b, p) at row r0 + r
// (rows C apart; null: zeros), into dst (blocks of rows x parts C).
template <class T, class Sources>
struct RoundedConcat {
  Sources sources;
  Bf16Storage<T>* dst;
  index_t rows, C, parts, r0;
  KOKKOS_INLINE_FUNCTION void operator()(const index_t b, const index_t r, const index_t c) const {
    const index_t p = c / C;
    const T* src = sources(b, p);
    dst[(b * rows + r) * parts * C + c] = bf16_stored(src ? src[(r0 + r) * C + c - p * C] : T(0));
  }
};

// RoundedConcat over blocks x rows x parts C, one launch of `label`.
template <class T, class Sources>
void rounded_concat(const ExecSpace& space, const char* label, const Sources& sources, Bf16Storage<T>* dst,
                    index_t blocks, index_t rows, index_t C, index_t parts, index_t r0 = 0) {
  using Policy = Kokkos::MDRangePolicy<ExecSpace, Kokkos::Rank<3>, Kokkos::IndexType<index_t>>;
  Traffic(label).add(double(blocks * rows * parts * C), sizeof(T) + 2, 2);
  Kokkos::parallel_for(label, Policy(space, {0, 0, 0}, {blocks, rows, parts * C}),
                       RoundedConcat<T, Sources>{sources, dst, rows, C, parts, r0});
}

// The head's direction blocks in pair blocks with its weights
// (GemmPolicy::head_pairs): vocabulary row v of pair j is [V_2j,v | W_v |
// V_2j+1,v] (zeros past the last direction), rounded; V_k = V + k P.
template <class T>
struct HeadPairSources {
  const T *W, *V;
  index_t K, P;
  KOKKOS_INLINE_FUNCTION const T* operator()(const index_t j, const index_t p) const {
    const index_t k = 2 * j + (p == 2 ? 1 : 0);
    return p == 1 ? W : k < K ? V + k * P : nullptr;
  }
};

// The pair blocks of the head's weights W (vocab x C) and its K direction
// blocks V (V_k = V + k P), rounded into dst: one launch.
template <class T>
void head_pair_blocks(const ExecSpace& space, const T* W, const T* V, index_t K, index_t vocab, index_t C, index_t P,
                      Bf16Storage<T>* dst) {
  rounded_concat<T>(space, "gnh::gpt::weights_bf16", HeadPairSources<T>{W, V, K, P}, dst, (K + 1) / 2, vocab, C, 3);
}

// A tile's operands against the pair blocks: direction k's rows [h | h'_k]
// (k even, against [V_k | W]) or [h'_k | h] (k odd, against [W | V_k]),
// rounded, K blocks of nr x 2C; h'_k = hd + k N C.
template <class T>
struct HeadPairOperands {
  const T *h, *hd;
  index_t N, C;
  KOKKOS_INLINE_FUNCTION const T* operator()(const index_t k, const index_t p) const {
    return (k % 2 == 0) == (p == 1) ? hd + k * N * C : h;
  }
};

// z'_k = h'_k W^T + h V_k^T over the tile as one product a direction from
// the pair blocks, [h | h'_k] [V_k | W]^T or [h'_k | h] [W | V_k]^T (its
// inner dimension 2C, z' written once): two batched calls, the even
// directions and the odd.
template <class T>
void pair_logits(const ExecSpace& space, Act2<T> z, Act2<T> h, index_t r0, index_t nr, index_t v0, index_t vc,
                 const GemmPolicy<T>& pol) {
  const index_t N = h.rows(), C = h.cols(), K = h.d.extent(0), C2 = 2 * C, C3 = 3 * C, pair = pol.head_vocab * C3;
  if (index_t(pol.scratch_a.extent(0) * sizeof(T)) < K * nr * C2 * index_t(sizeof(Bf16Storage<T>)))
    throw std::logic_error("gnh::lm_head_xent: bf16 scratch too small for the directions' operands");
  Bf16Storage<T>* const ops = reinterpret_cast<Bf16Storage<T>*>(pol.scratch_a.data());
  rounded_concat<T>(space, "gnh::lm_head_xent::operands", HeadPairOperands<T>{h.v.data(), h.d.data(), N, C}, ops, K, nr,
                    C, 2, r0);
  const Bf16Storage<T>* const B = pol.head_pairs + v0 * C3;
  gemm_batched_rounded<T>(space, false, true, nr, vc, C2, T(1), ops, C2, 2 * nr * C2, B, C3, pair, T(0), z.d.data(), vc,
                          2 * nr * vc, (K + 1) / 2);
  gemm_batched_rounded<T>(space, false, true, nr, vc, C2, T(1), ops + nr * C2, C2, 2 * nr * C2, B + C, C3, pair, T(0),
                          z.d.data() + nr * vc, vc, 2 * nr * vc, K / 2);
}

// Logit planes of rows r0 .. r0+nr-1 and vocabulary entries v0 .. v0+vc-1
// into z (plane k of the tile at k*nr*vc).
template <class T>
void chunk_logits(const ExecSpace& space, Act2<T> z, Act2<T> h, Params<T> p, index_t w, index_t r0, index_t nr,
                  index_t v0, index_t vc, bool tangents, const GemmPolicy<T>& pol) {
  const index_t N = h.rows(), C = h.cols(), K = h.d.extent(0), P = p.v.extent(0);
  const T* W = p.v.data() + w + v0 * C;
  gemm<T>(space, pol, "N", "T", T(1), block(h.v.data(), r0 * C, nr, C), block(W, 0, vc, C), T(0),
          block(z.v.data(), 0, nr, vc));
  if (!tangents) return;
  if (pol.head_pairs) return pair_logits(space, z, h, r0, nr, v0, vc, pol);
  // Batches over the directions (the shared operand at stride 0): z'_k =
  // h'_k W^T, then z'_k += h V_k^T.
  gemm_batched<T>(space, pol, "N", "T", T(1), block(h.d.data(), r0 * C, nr, C), N * C, block(W, 0, vc, C), 0, T(0),
                  block(z.d.data(), 0, nr, vc), nr * vc, K);
  gemm_batched<T>(space, pol, "N", "T", T(1), block(h.v.data(), r0 * C, nr, C), 0, block(p.d.data(), w + v0 * C, vc, C),
                  P, T(1), block(z.d.data(), 0, nr, vc), nr * vc, K);
}

// The second-order moments of a tile: M_W += q W and M_k += q V_k over the
// chunk's vocabulary, q (nr, vc) the exponentials the forward left in plane 0
// of z.dd (M rescaled by the forward's kernel before, beta 1 after the first chunk).
// With the pairs, q as the forward's row kernel wrote it rounded
// (HeadChunkRow::q_out) at q's place.
template <class T>
void chunk_moments(const ExecSpace& space, Act2<T> m, const T* q, Params<T> p, index_t w, index_t nr, index_t v0,
                   index_t vc, bool first, const GemmPolicy<T>& pol) {
  const index_t C = m.cols(), K = m.d.extent(0), P = p.v.extent(0);
  const T beta = first ? T(0) : T(1);
  if (pol.head_pairs) {
    // M_W from the pairs' W (pair 0's middle columns), the M_k from their
    // V_k, the even directions' and the odd's.
    const Bf16Storage<T>* const qs = reinterpret_cast<const Bf16Storage<T>*>(q);
    const index_t C3 = 3 * C, pair = pol.head_vocab * C3;
    const Bf16Storage<T>* const B = pol.head_pairs + v0 * C3;
    gemm_batched_rounded<T>(space, false, false, nr, C, vc, T(1), qs, vc, 0, B + C, C3, 0, beta, m.v.data(), C, 0, 1);
    gemm_batched_rounded<T>(space, false, false, nr, C, vc, T(1), qs, vc, 0, B, C3, pair, beta, m.d.data(), C,
                            2 * nr * C, (K + 1) / 2);
    gemm_batched_rounded<T>(space, false, false, nr, C, vc, T(1), qs, vc, 0, B + 2 * C, C3, pair, beta,
                            m.d.data() + nr * C, C, 2 * nr * C, K / 2);
    return;
  }
  gemm<T>(space, pol, "N", "N", T(1), block(q, 0, nr, vc), block(p.v.data() + w + v0 * C, 0, vc, C), beta,
          block(m.v.data(), 0, nr, C));
  gemm_batched<T>(space, pol, "N", "N", T(1), block(q, 0, nr, vc), 0, block(p.d.data(), w + v0 * C, vc, C), P, beta,
                  block(m.d.data(), 0, nr, C), nr * C, K);
}

template <class T>
Act2<T> chunk_view(const Act2<T>& z, index_t K, index_t nr, index_t vc) {
  Act2<T> c;
  c.v = Span2<T>(z.v.data(), nr, vc);
  if (z.d.extent(0) > 0) c.d = Span3<T>(z.d.data(), K, nr, vc);
  if (z.dd.extent(0) > 0) c.dd = Span3<T>(z.dd.data(), 1, nr, vc);  // q of the second-order moments
  return c;
}

// The forward's row kernels (rows.hpp): a row's running statistics (loss.v
// holds the running sum s until the row is finished) are read through
// lanes.one and written by one lane.
//
// One row of a vocabulary chunk of the online log-sum-exp.
template <class S>
struct HeadChunkRow {
  using T = base_t<S>;
  Act1<double> loss;
  Act1<T> lse;
  Act2<T> zc, mc;  // the tile (nr, vc); the row block's moments (nr, C)
  Span2<T> stats;
  Span1<const std::int32_t> targets;
  index_t r0, v0, vc, K, C;
  bool first;
  bool keep = false;  // primal, one chunk: e_v = exp(z_v - m) over z (lm_head_xent_forward's keep_exponentials)
  Span2<double> gn;   // (K, N) or empty: the running sum_v e_v z'_v^2 of the Gauss-Newton form
  // Second order, not null: the exponentials q written here rounded (rows vc
  // apart), as the moments' products read them (GemmPolicy::head_pairs), by
  // the directions' pass, which forms them again from z instead of reading
  // them back in FP32 (the same floats: the same sums).
  Bf16Storage<T>* q_out = nullptr;
  template <class Lanes>
  KOKKOS_INLINE_FUNCTION void operator()(const Lanes& lanes, const index_t r) const {
    const index_t n = r0 + r;
    const std::int32_t tgt = targets(n);
    const bool has_tgt = tgt >= v0 && tgt < v0 + vc;
    T* zr = &zc.v(r, 0);
    const T m_old = first ? T(0) : lanes.template one<T>([&] { return stats(n, 0); });
    const double s_old = first ? 0.0 : lanes.template one<double>([&] { return loss.v(n); });
    T m, corr, e;
    if (!one_read(lanes, zr, m_old, m, corr, e)) {
      m = lanes.template max<T>(vc, zr);
      if (!first) m = m_old > m ? m_old : m;
      // Rescale what earlier chunks accumulated to the new maximum.
      corr = first ? T(0) : fast_exp(m_old - m);
      if constexpr (has_second_v<S>) {
        // q kept for the moments' GEMMs (or written rounded later, q_out);
        // the same terms, the same sum.
        T* qr = &zc.dd(0, r, 0);
        e = lanes.template sum<T>(vc, [&](index_t v) {
          const T q = fast_exp_bounded(zr[v] - m);
          if (!q_out) qr[v] = q;
          return q;
        });
      } else if (keep) {
        // The target's logit before the exponentials replace the logits.
        const T zt = has_tgt ? lanes.template one<T>([&] { return zr[tgt - v0]; }) : T(0);
        e = lanes.template sum<T>(vc, [&](index_t v) {
          const T q = fast_exp_bounded(zr[v] - m);
          zr[v] = q;
          return q;
        });
        lanes.single([&] {
          loss.v(n) = double(e);
          stats(n, 0) = m;
          if (has_tgt) stats(n, 1) = zt;
        });
        return;
      } else {
        e = lanes.template sum<T>(vc, [&](index_t v) { return fast_exp_bounded(zr[v] - m); });
      }
    }
    lanes.single([&] {
      loss.v(n) = (first ? 0.0 : s_old * double(corr)) + double(e);
      stats(n, 0) = m;
      if (has_tgt) stats(n, 1) = zr[tgt - v0];
    });
    if constexpr (has_tangents_v<S>) add_tangents(lanes, r, n, zr, m, corr, has_tgt ? index_t(tgt) - v0 : index_t(-1));
  }
  // The primal in one read of the chunk where the lanes keep a running
  // maximum and sum (WideLanes::max_exp_sum; not with kept exponentials,
  // which need the row's maximum first): the chunk's maximum and sum
  // relative to it, rescaled to the row's maximum so far. False where the
  // row takes two passes.
  template <class Lanes>
  KOKKOS_INLINE_FUNCTION bool one_read(const Lanes& lanes, const T* zr, T m_old, T& m, T& corr, T& e) const {
    if constexpr (Lanes::kOnline && !has_tangents_v<S>) {
      if (keep) return false;
      T mc, ec;
      lanes.template max_exp_sum<T>(
          vc, zr, [](T x) { return fast_exp_bounded(x); }, mc, ec);
      m = first || mc > m_old ? mc : m_old;
      corr = first ? T(0) : fast_exp(m_old - m);
      e = ec * fast_exp_bounded(mc - m);
      return true;
    } else {
      (void)lanes, (void)zr, (void)m_old, (void)m, (void)corr, (void)e;
      return false;
    }
  }
  // The directions' running sums of a row (t: the target's column in the
  // chunk, or -1): lse' and, in second order, B and the moments rescaled.
  // Per direction k, over the chunk: a1 = sum_v w_v z'_kv and, in second
  // order or with the Gauss-Newton form, b = sum_v w_v z'_kv^2, where w is
  // the exponentials q (second order: kept in z.dd) or exp(z - m). The wide
  // rows take kDirections directions a pass over the row (16: at K = 16 the
  // shared row once, 20 values read a vocabulary entry of a row where 4 at
  // a time read 23), so the shared row (q or z) is read once for them where
  // the other shapes read it once a direction; each sum takes its terms in
  // the same order either way.
  static constexpr int kDirections = 16;
  static constexpr int kWideSums = 2 * kDirections;  // the wide rows' scratch (rows.hpp, WideSumsOf)
  template <class Lanes>
  KOKKOS_INLINE_FUNCTION void add_tangents(const Lanes& lanes, index_t r, index_t n, const T* zr, T m, T corr,
                                           index_t t) const {
    constexpr bool second = has_second_v<S>;
    const bool squares = second || gn.extent(0) > 0;
    const T* qr = second && !q_out ? &zc.dd(0, r, 0) : nullptr;
    Bf16Storage<T>* const qo = q_out ? q_out + r * vc : nullptr;
    // The weight of column v: q_v kept, or exp(z_v - m) (written rounded to
    // qo by the first direction's pass where q_out).
    const auto weight = [&](index_t v) { return qr ? qr[v] : fast_exp_bounded(zr[v] - m); };
    if constexpr (Lanes::kOnline) {
      for (index_t k0 = 0; k0 < K; k0 += kDirections) {
        const index_t nk = K - k0 < kDirections ? K - k0 : kDirections;
        T s[2 * kDirections];
        lanes.template sums<T, 2 * kDirections>(
            vc,
            [&](index_t v, T* acc) {
              const T w = weight(v);
              if (qo && k0 == 0) qo[v] = bf16_stored(w);
              for (index_t j = 0; j < nk; ++j) {
                const T d = zc.d(k0 + j, r, v), q = w * d;
                acc[2 * j] += q;
                if (squares) acc[2 * j + 1] += q * d;
              }
            },
            s, int(2 * nk));
        for (index_t j = 0; j < nk; ++j) finish_direction(lanes, k0 + j, r, n, s[2 * j], s[2 * j + 1], corr, t);
      }
    } else {
      for (index_t k = 0; k < K; ++k) {
        const T* dr = &zc.d(k, r, 0);
        T a1, b = T(0);
        if (squares)
          lanes.template sum2<T>(
              vc,
              [&](index_t v, T& s1, T& s2) {
                const T w = weight(v);
                if (qo && k == 0) qo[v] = bf16_stored(w);
                const T q = w * dr[v];
                s1 += q;
                s2 += q * dr[v];
              },
              a1, b);
        else a1 = lanes.template sum<T>(vc, [&](index_t v) { return weight(v) * dr[v]; });
        finish_direction(lanes, k, r, n, a1, b, corr, t);
      }
    }
    if constexpr (second) {
      if (!first) lanes.each(C, [&](index_t c) { mc.v(r, c) *= corr; });
    }
  }
  // Direction k's sums of this chunk into the row's running values.
  template <class Lanes>
  KOKKOS_INLINE_FUNCTION void finish_direction(const Lanes& lanes, index_t k, index_t r, index_t n, T a1, T b, T corr,
                                               index_t t) const {
    if constexpr (has_second_v<S>) {
      const T b_old = first ? T(0) : lanes.template one<T>([&] { return lse.dd(k, n); });
      lanes.single([&] { lse.dd(k, n) = first ? b : b_old * corr + b; });
      if (!first) lanes.each(C, [&](index_t c) { mc.d(k, r, c) *= corr; });
    }
    if (has_second_v<S> || gn.extent(0) > 0) add_gauss_newton(lanes, k, n, b, corr);
    const T a_old = first ? T(0) : lanes.template one<T>([&] { return lse.d(k, n); });
    const T* dr = &zc.d(k, r, 0);
    lanes.single([&] {
      lse.d(k, n) = first ? a1 : a_old * corr + a1;
      if (t >= 0) loss.d(k, n) = -double(dr[t]);
    });
  }
  // gn(k, n): this chunk's sum_v e_v z'_v^2 added to the earlier chunks',
  // rescaled to the new maximum.
  template <class Lanes>
  KOKKOS_INLINE_FUNCTION void add_gauss_newton(const Lanes& lanes, index_t k, index_t n, T b, T corr) const {
    if (gn.extent(0) == 0) return;
    const double old = first ? 0.0 : lanes.template one<double>([&] { return gn(k, n); });
    lanes.single([&] { gn(k, n) = first ? double(b) : old * double(corr) + double(b); });
  }
};

// One finished row: lse and the losses.
template <class S>
struct HeadFinishRow {
  using T = base_t<S>;
  Act1<double> loss;
  Act1<T> lse;
  Act2<T> h, mc;
  Params<T> p;
  Span2<T> stats;
  Span1<const std::int32_t> targets;
  index_t r0, K, C, P, w;
  // keep: then stats(n, 1), the target's logit, becomes 1 / s for the reverse,
  // written by the lane that reads it (the maximum in stats(n, 0) is read by
  // every lane).
  bool keep = false;
  // gn (K, N) or empty: sum_v e_v z'_v^2 becomes the row's Gauss-Newton form
  // z'^T H_z z' = sum_v q_v z'_v^2 - (sum_v q_v z'_v)^2 (0 without a target).
  Span2<double> gn;
  template <class Lanes>
  KOKKOS_INLINE_FUNCTION void operator()(const Lanes& lanes, const index_t r) const {
    const index_t n = r0 + r;
    const std::int32_t tgt = targets(n);
    const bool valid = tgt >= 0;
    const double s = lanes.template one<double>([&] { return loss.v(n); });
    const T l = T(kmath::log(s)) + stats(n, 0);
    lanes.single([&] {
      lse.v(n) = l;
      loss.v(n) = valid ? double(l) - double(stats(n, 1)) : 0.0;
      if (keep) stats(n, 1) = T(1.0 / s);
    });
    if constexpr (has_tangents_v<S>) {
      for (index_t k = 0; k < K; ++k) {
        const T l1 = T(double(lanes.template one<T>([&] { return lse.d(k, n); })) / s);
        const double d_old = lanes.template one<double>([&] { return loss.d(k, n); });
        lanes.single([&] {
          lse.d(k, n) = l1;
          loss.d(k, n) = valid ? double(l1) + d_old : 0.0;
        });
        if (gn.extent(0) > 0) {
          const double b = lanes.template one<double>([&] { return gn(k, n); });
          lanes.single([&] { gn(k, n) = valid ? b / s - double(l1) * double(l1) : 0.0; });
        }
        if constexpr (has_second_v<S>) {
          // sum_v e_v z''_v = h'' . M_W + 2 h' . M_k; z''_y likewise from row y.
          const T* hd = &h.d(k, n, 0);
          const T* hdd = &h.dd(k, n, 0);
          const T* mw = &mc.v(r, 0);
          const T* mk = &mc.d(k, r, 0);
          const T a2 = lanes.template one<T>([&] { return lse.dd(k, n); }) +
                       lanes.template sum<T>(C, [&](index_t c) { return hdd[c] * mw[c] + T(2) * hd[c] * mk[c]; });
          const T l2 = T(double(a2) / s) - l1 * l1;
          T zy = T(0);
          if (valid) {
            const T* wy = p.v.data() + w + index_t(tgt) * C;
            const T* vy = p.d.data() + k * P + w + index_t(tgt) * C;
            zy = lanes.template sum<T>(C, [&](index_t c) { return hdd[c] * wy[c] + T(2) * hd[c] * vy[c]; });
          }
          lanes.single([&] {
            lse.dd(k, n) = l2;
            loss.dd(k, n) = valid ? double(l2) - double(zy) : 0.0;
          });
        }
      }
    }
  }
};

// The reverse's dz = softmax(z) - onehot(target) of one row of a tile, in
// place, and its tangents (softmax z)' = q (z' - lse'). Column v stays on one
// lane (rows.hpp), so the value plane, read by every tangent plane, is
// written after them by the lane that read it.
template <class S>
struct HeadSoftmaxRow {
  using T = base_t<S>;
  Act2<T> zc;
  Act1<T> lse;
  Span1<const std::int32_t> targets;
  index_t r0, v0, vc, K;
  Span2<const T> inv_sum;  // kept: z holds e_v = exp(z_v - m), inv_sum(n, 1) is 1 / sum_v e_v
  // The Gauss-Newton product: the value plane's dz is zero, so that the
  // reverse's tangent planes carry J^T H_z (J v) alone (lm_head_xent_reverse).
  bool gauss_newton = false;
  template <class Lanes>
  KOKKOS_INLINE_FUNCTION void operator()(const Lanes& lanes, const index_t r) const {
    const index_t n = r0 + r;
    const std::int32_t tgt = targets(n);
    T* zr = &zc.v(r, 0);
    if (tgt < 0) {
      for (index_t k = 0; k < K; ++k) {
        T* dr = &zc.d(k, r, 0);
        lanes.each(vc, [&](index_t v) { dr[v] = T(0); });
      }
      lanes.each(vc, [&](index_t v) { zr[v] = T(0); });
      return;
    }
    const T L = lse.v(n);
    if constexpr (has_tangents_v<S>) {
      for (index_t k = 0; k < K; ++k) {
        T* dr = &zc.d(k, r, 0);
        const T l1 = lse.d(k, n);
        lanes.each(vc, [&](index_t v) { dr[v] = fast_exp_bounded(zr[v] - L) * (dr[v] - l1); });
      }
    }
    if (gauss_newton) {
      lanes.each(vc, [&](index_t v) { zr[v] = T(0); });
      return;
    }
    const index_t t = tgt >= v0 && tgt < v0 + vc ? index_t(tgt) - v0 : index_t(-1);
    if (inv_sum.extent(0) > 0) {
      const T inv = inv_sum(n, 1);
      lanes.each(vc, [&](index_t v) {
        const T q = zr[v] * inv;
        zr[v] = v == t ? q - T(1) : q;
      });
      return;
    }
    lanes.each(vc, [&](index_t v) {
      const T q = fast_exp_bounded(zr[v] - L);
      zr[v] = v == t ? q - T(1) : q;
    });
  }
};

// HeadSoftmaxRow's dz of the primal, rounded as a bfloat16 operand
// (bf16_stored: the bits rounded_copies gives the value written in place)
// into out, rows vc apart, z left as it is: the gradient's head under
// bf16-amp, whose two products read dz rounded and nothing else.
template <class T>
struct HeadSoftmaxRounded {
  Span2<const T> zc;
  Bf16Storage<T>* out;
  Span1<const T> lse;
  Span1<const std::int32_t> targets;
  index_t r0, vc;
  Span2<const T> inv_sum;  // kept, as HeadSoftmaxRow's
  template <class Lanes>
  KOKKOS_INLINE_FUNCTION void operator()(const Lanes& lanes, const index_t r) const {
    const index_t n = r0 + r;
    const std::int32_t tgt = targets(n);
    const T* zr = &zc(r, 0);
    Bf16Storage<T>* o = out + r * vc;
    if (tgt < 0) {
      lanes.each(vc, [&](index_t v) { o[v] = bf16_stored(T(0)); });
      return;
    }
    const index_t t = tgt < vc ? index_t(tgt) : index_t(-1);
    if (inv_sum.extent(0) > 0) {
      const T inv = inv_sum(n, 1);
      lanes.each(vc, [&](index_t v) {
        const T q = zr[v] * inv;
        o[v] = bf16_stored(v == t ? q - T(1) : q);
      });
      return;
    }
    const T L = lse(n);
    lanes.each(vc, [&](index_t v) {
      const T q = fast_exp_bounded(zr[v] - L);
      o[v] = bf16_stored(v == t ? q - T(1) : q);
    });
  }
};

// Rows r0 .. r0 + nr - 1 of lm_head_xent_forward: the block's vocabulary
// chunks, then its finished rows.
template <class S>
void forward_block(const ExecSpace& space, Act1<double> loss, Act1<base_t<S>> lse, Act2<base_t<S>> h,
                   Params<base_t<S>> p, index_t w, index_t V, Span1<const std::int32_t> targets, Act2<base_t<S>> z,
                   Span2<base_t<S>> stats, Act2<base_t<S>> moments, const GemmPolicy<base_t<S>>& pol, RowShape shape,
                   bool keep, Span2<double> gn, index_t r0, index_t nr) {
  using T = base_t<S>;
  constexpr bool tangents = !std::is_same<S, T>::value, second = std::is_same<S, Jet2<T>>::value;
  const index_t C = h.cols(), K = directions_of<S>(h), vchunk = z.cols(), P = p.v.extent(0);
  // The moments of this row block, planes of nr rows.
  Act2<T> mc;
  if (second) {
    mc.v = Span2<T>(moments.v.data(), nr, C);
    mc.d = Span3<T>(moments.d.data(), K, nr, C);
  }
  for (index_t v0 = 0; v0 < V; v0 += vchunk) {
    const index_t vc = V - v0 < vchunk ? V - v0 : vchunk;
    const Act2<T> zc = chunk_view(z, K, nr, vc);
    chunk_logits(space, zc, h, p, w, r0, nr, v0, vc, tangents, pol);
    const bool first = v0 == 0;
    // The primal: the tile's logits read once by the wide rows (a running
    // maximum and sum, WideLanes::max_exp_sum), else twice (the maximum,
    // then the exponentials' sum: a whole vocabulary row outlives the
    // caches between the two when many rows are in flight) and, kept, the
    // exponentials written in place. With directions: the logits read
    // twice (the maximum, the sum; second order writes the exponentials
    // q), each tangent plane read once, and the weights' row (q, or the
    // logits again) once a direction, or once for HeadChunkRow::kDirections
    // of them in the wide rows. Per row the running statistics.
    const bool wide = shape == RowShape::wide;
    const index_t primal = keep ? 3 : wide ? 1 : 2;
    const index_t D = HeadChunkRow<S>::kDirections, shared = wide ? (K + D - 1) / D : K;
    // With the pairs, q written rounded (half the bytes on a GPU) where the
    // moments' products read it, instead of in FP32 and rounded again.
    Bf16Storage<T>* const q_out = second && pol.head_pairs ? reinterpret_cast<Bf16Storage<T>*>(zc.dd.data()) : nullptr;
    const index_t values = tangents ? 2 + (second && !q_out ? 1 : 0) + shared + K : primal;
    Traffic("gnh::lm_head_xent::forward")
        .add(double(values * nr * vc), sizeof(T), 2)
        .add(double(q_out ? nr * vc : 0), 2, 2)
        .add(double((2 + (tangents ? K : 0)) * nr), 2 * sizeof(T), 1);
    HeadChunkRow<S> row{loss, lse, zc, mc, stats, targets, r0, v0, vc, K, C, first, keep, gn};
    row.q_out = q_out;
    for_rows<T>(space, "gnh::lm_head_xent::forward", nr, row, shape);
    if (second) chunk_moments(space, mc, zc.dd.data(), p, w, nr, v0, vc, first, pol);
  }
  // The rows of this block are complete: lse and the losses (the moments
  // and h read with the second order).
  Traffic("gnh::lm_head_xent::forward::finish")
      .add(double(second ? 2 * (1 + K) * nr * C : 0), sizeof(T), 2)
      .add(double((3 + (tangents ? K : 0)) * nr), 2 * sizeof(T), 1);
  for_rows<T>(space, "gnh::lm_head_xent::forward::finish", nr,
              HeadFinishRow<S>{loss, lse, h, mc, p, stats, targets, r0, K, C, P, w, keep, gn}, shape);
}
}  // namespace detail

// V: rows of the head weight at offset w (V, C). stats: (N, 2) scratch (the
// running maximum and the target's logit per row). Second order (S = Jet2):
// moments (rows, C) with K tangent planes holds M_W and M_k of a row block,
// and z needs one second-order plane (the exponentials q of a tile). shape:
// the row kernels' (rows.hpp); the default suits the execution space.
template <class S>
void lm_head_xent_forward(const ExecSpace& space, Act1<double> loss, Act1<base_t<S>> lse, Act2<base_t<S>> h,
                          Params<base_t<S>> p, index_t w, index_t V, Span1<const std::int32_t> targets,
                          Act2<base_t<S>> z, Span2<base_t<S>> stats, Act2<base_t<S>> moments,
                          const GemmPolicy<base_t<S>>& pol = GemmPolicy<base_t<S>>(),
                          RowShape shape = default_row_shape(), bool keep_exponentials = false,
                          Span2<double> gauss_newton = {}) {
  keep_planes<S>(loss, lse, h, p, z, moments);
  using T = base_t<S>;
  const index_t N = h.rows(), C = h.cols(), K = directions_of<S>(h), rows = z.rows(), vchunk = z.cols();
  const index_t P = p.v.extent(0);
  require_extent("gnh::lm_head_xent::forward", "loss", loss.v.extent(0), N);
  require_extent("gnh::lm_head_xent::forward", "targets", targets.extent(0), N);
  require_extent("gnh::lm_head_xent::forward", "stats rows", stats.extent(0), N);
  if ((rows == 0 || vchunk == 0) && N > 0) throw std::logic_error("gnh::lm_head_xent::forward: empty workspace");
  constexpr bool tangents = !std::is_same<S, T>::value, second = std::is_same<S, Jet2<T>>::value;
  if (second) {
    require_extent("gnh::lm_head_xent::forward", "moments rows", moments.rows(), rows);
    require_extent("gnh::lm_head_xent::forward", "moments cols", moments.cols(), C);
    require_extent("gnh::lm_head_xent::forward", "moments planes", moments.d.extent(0), K);
    if (z.dd.extent(0) < 1) throw std::logic_error("gnh::lm_head_xent::forward: no second-order logits plane");
  }
  // keep_exponentials (the primal forward of an engine whose reverse
  // follows, when one tile holds the batch): z is left holding exp(z - m) of
  // each row and stats(n, 1) 1 / sum_v exp(z_v - m), from which the reverse
  // forms the softmax without evaluating its exponentials again.
  const bool keep = keep_exponentials && !tangents && rows >= N && vchunk >= V;
  // gauss_newton (K, N), with tangents: each row's Gauss-Newton form along
  // each direction, z'^T H_z z' with H_z = diag(q) - q q^T the Hessian of the
  // row's loss in its logits (its z'' terms are the rest of v^T H v).
  const Span2<double> gn = tangents ? gauss_newton : Span2<double>();
  if (gn.extent(0) > 0) {
    require_extent("gnh::lm_head_xent::forward", "gauss_newton planes", gn.extent(0), K);
    require_extent("gnh::lm_head_xent::forward", "gauss_newton rows", gn.extent(1), N);
  }
  for (index_t r0 = 0; r0 < N; r0 += rows)
    detail::forward_block<S>(space, loss, lse, h, p, w, V, targets, z, stats, moments, pol, shape, keep, gn, r0,
                             std::min(rows, N - r0));
}

namespace detail {
// Per sequence (Grads per sequence): a tile's weight product dW += dz^T h
// over rows [r0, r0 + nr), split where sequences begin: a partial sequence
// at either end alone, the whole ones between as one batch, each into its
// own sequence's gradient at offset w. dz is the tile (nr, vc), h (N, C).
// The tiles come in increasing rows for each vocabulary chunk, so a piece
// that begins a sequence holds its first term there: with seq_fresh it
// writes (beta 0), the tail of a sequence begun in an earlier tile adds.
template <class T>
void sequence_weight_products(const ExecSpace& space, const GemmPolicy<T>& pol, const Grads<T>& g, const T* dz,
                              const T* h, index_t r0, index_t nr, index_t w, index_t vc, index_t C) {
  const index_t R = g.seq_rows, end = r0 + nr;
  const auto piece = [&](index_t a, index_t rows, index_t count) {  // count sequences of `rows` from row a
    const T beta = g.seq_fresh && a % R == 0 ? T(0) : T(1);
    gemm_batched<T>(space, pol, "T", "N", T(1), block(dz, (a - r0) * vc, rows, vc), rows * vc, block(h, a * C, rows, C),
                    rows * C, beta, block(g.v.data(), (a / R) * g.seq_stride + w, vc, C), g.seq_stride, count);
  };
  index_t a = r0;
  if (a % R != 0) {  // the tail of a sequence begun in an earlier tile
    const index_t stop = std::min(end, (a / R + 1) * R);
    piece(a, stop - a, 1);
    a = stop;
  }
  if (end - a >= R) {
    const index_t whole = (end - a) / R;
    piece(a, R, whole);
    a += whole * R;
  }
  if (a < end) piece(a, end - a, 1);  // the head of a sequence the next tile goes on with
}

// Rows r0 .. r0 + nr - 1 of lm_head_xent_reverse; current: z holds the
// forward's logits of these rows (a tile of whole vocabulary rows).
template <class S>
void reverse_block(const ExecSpace& space, Act2<base_t<S>> dh, Grads<base_t<S>> g, Act1<base_t<S>> lse,
                   Act2<base_t<S>> h, Params<base_t<S>> p, index_t w, index_t V, Span1<const std::int32_t> targets,
                   Act2<base_t<S>> z, const GemmPolicy<base_t<S>>& pol, bool current, Span2<const base_t<S>> kept,
                   RowShape shape, bool gauss_newton, index_t r0, index_t nr) {
  using T = base_t<S>;
  constexpr bool tangents = !std::is_same<S, T>::value;
  const index_t N = h.rows(), C = h.cols(), K = tangents ? h.d.extent(0) : 0, vchunk = z.cols(), P = p.v.extent(0);
  for (index_t v0 = 0; v0 < V; v0 += vchunk) {
    const index_t vc = V - v0 < vchunk ? V - v0 : vchunk;
    const Act2<T> zc = chunk_view(z, K, nr, vc);
    const T* W = p.v.data() + w + v0 * C;
    // current: the forward just left exactly these logits (value and
    // tangent planes) in z, the whole vocabulary of the block's rows.
    if (!(current && vc == V) && kept.extent(0) == 0) chunk_logits(space, zc, h, p, w, r0, nr, v0, vc, tangents, pol);
    // dz = softmax - onehot, in place, in each plane.
    Traffic("gnh::lm_head_xent::reverse::softmax")
        .add(double((1 + K) * nr * vc), 2 * sizeof(T), 2)
        .add(double(2 * nr), sizeof(T), 1);
    for_rows<T>(space, "gnh::lm_head_xent::reverse::softmax", nr,
                HeadSoftmaxRow<S>{zc, lse, targets, r0, v0, vc, K, kept, gauss_newton && tangents}, shape);
    const T beta = v0 == 0 ? T(0) : T(1);  // dh sums over the vocabulary chunks
    gemm<T>(space, pol, "N", "N", T(1), block(zc.v.data(), 0, nr, vc), block(W, 0, vc, C), beta,
            block(dh.v.data(), r0 * C, nr, C));
    if (g.per_sequence()) sequence_weight_products(space, pol, g, zc.v.data(), h.v.data(), r0, nr, w + v0 * C, vc, C);
    else if (g.v.extent(0) > 0)  // an empty g (primal only): dh alone
      gemm<T>(space, pol, "T", "N", T(1), block(zc.v.data(), 0, nr, vc), block(h.v.data(), r0 * C, nr, C), T(1),
              block(g.v.data(), w + v0 * C, vc, C));
    // Per direction, four batches over k (the shared operand at stride 0),
    // each output taking its terms in the order of the per-direction loop:
    // dh'_k = dz'_k W (+ the chunks before), += dz V_k; G_k += dz'_k^T h, += dz^T h'_k.
    if (K > 0) {
      const Span2<const T> dz0 = block(zc.d.data(), 0, nr, vc), dz = block(zc.v.data(), 0, nr, vc);
      const Span2<const T> h0 = block(h.v.data(), r0 * C, nr, C), hd0 = block(h.d.data(), r0 * C, nr, C);
      const Span2<T> dh0 = block(dh.d.data(), r0 * C, nr, C), G0 = block(g.d.data(), w + v0 * C, vc, C);
      gemm_batched<T>(space, pol, "N", "N", T(1), dz0, nr * vc, block(W, 0, vc, C), 0, beta, dh0, N * C, K);
      gemm_batched<T>(space, pol, "N", "N", T(1), dz, 0, block(p.d.data(), w + v0 * C, vc, C), P, T(1), dh0, N * C, K);
      gemm_batched<T>(space, pol, "T", "N", T(1), dz0, nr * vc, h0, 0, T(1), G0, P, K);
      gemm_batched<T>(space, pol, "T", "N", T(1), dz, 0, hd0, N * C, T(1), G0, P, K);
    }
  }
}

// The gradient's head under bf16-amp: where the owner rounded the head's
// weights ahead (GemmPolicy::ahead) and scratch_b holds a tile of h, each
// tile's h is rounded once, for its logits and its weight product, and dz
// is rounded as the softmax forms it (HeadSoftmaxRounded), a chunk of rows
// at a time into scratch_a, for dh = dz W and dW += dz^T h. These are the
// bfloat16 operands, and the chunks of rows, of the products that round
// their own (gemm's bf16_chunk_rows), so dh and the summed gradient keep
// their bits; dz is never written in FP32 nor read twice more to round it.
template <class T>
bool head_rounded_once(const GemmPolicy<T>& pol, const Act2<T>& h, const Params<T>& p, index_t w, index_t V,
                       index_t rows) {
  const index_t C = h.cols();
  if (!pol.bf16 || rows <= 0 || index_t(pol.scratch_b.extent(0)) < rows * C) return false;
  return rounded_ahead(pol, block(static_cast<const T*>(p.v.data()), w, V, C), 0, 1).data != nullptr;
}

// pol with rows r0 .. r0 + nr - 1 of h rounded into scratch_b (ahead slot 2).
template <class T>
GemmPolicy<T> with_rounded_tile(const ExecSpace& space, const GemmPolicy<T>& pol, const Act2<T>& h, index_t r0,
                                index_t nr) {
  const index_t C = h.cols();
  GemmPolicy<T> tp = pol;
  round_into(space, tp, 2, h.v.data() + r0 * C, nr, C, reinterpret_cast<Bf16Storage<T>*>(pol.scratch_b.data()));
  return tp;
}

// reverse_block of the primal with the operands rounded once (above); pol
// from with_rounded_tile, z holding the tile's logits (or, kept, their
// exponentials), which it leaves as they are.
template <class T>
void reverse_block_rounded(const ExecSpace& space, Act2<T> dh, Grads<T> g, Act1<T> lse, Act2<T> h, Params<T> p,
                           index_t w, index_t V, Span1<const std::int32_t> targets, Act2<T> z, const GemmPolicy<T>& pol,
                           Span2<const T> kept, RowShape shape, index_t r0, index_t nr) {
  const index_t C = h.cols();
  const T* const W = p.v.data() + w;
  T* const zt = z.v.data();
  const index_t chunk =
      bf16_chunk_rows(pol, Span2<const T>(zt, nr, V), block(static_cast<const T*>(h.v.data()), r0 * C, nr, C),
                      "gnh::lm_head_xent::gradient", true);
  Bf16Storage<T>* const dz = reinterpret_cast<Bf16Storage<T>*>(pol.scratch_a.data());
  for (index_t c0 = 0; c0 < nr; c0 += chunk) {
    const index_t nc = std::min(chunk, nr - c0), a = r0 + c0;
    T* const zc = zt + c0 * V;
    // The logits read, dz written as the GPU's bfloat16.
    Traffic("gnh::lm_head_xent::reverse::softmax")
        .add(double(nc * V), sizeof(T) + 2, 2)
        .add(double(2 * nc), sizeof(T), 1);
    for_rows<T>(space, "gnh::lm_head_xent::reverse::softmax", nc,
                HeadSoftmaxRounded<T>{Span2<const T>(zc, nc, V), dz, lse.v, targets, a, V, kept}, shape);
    GemmPolicy<T> cp = pol;
    read_rounded(cp, 3, zc, nc * V, dz);
    gemm<T>(space, cp, "N", "N", T(1), block(zc, 0, nc, V), block(W, 0, V, C), T(0), block(dh.v.data(), a * C, nc, C));
    if (g.per_sequence()) sequence_weight_products(space, cp, g, zc, h.v.data(), a, nc, w, V, C);
    else if (g.v.extent(0) > 0)
      gemm<T>(space, cp, "T", "N", T(1), block(zc, 0, nc, V), block(h.v.data(), a * C, nc, C), T(1),
              block(g.v.data(), w, V, C));
  }
}
}  // namespace detail

// dh is overwritten; g accumulates the gradient of the summed loss.
// logits_current: z still holds the forward's logits of this batch (one tile).
// kept (non-empty): the forward ran with keep_exponentials, and kept is its
// stats; z then holds the exponentials (the primal reverse, one tile).
// gauss_newton (with tangents): the reverse is seeded with dz = 0 and
// dz'_k = H_z z'_k. The reverse is linear in its adjoints jointly (every
// term of its tangent is an adjoint or an adjoint's tangent times primal
// values or tangents), and the terms of the network's own second derivatives
// all carry the value adjoint, so the gradient's tangent planes then receive
// J^T H_z J v_k: the Gauss-Newton product GGN v_k of the summed loss, exact,
// and the value plane nothing.
template <class S>
void lm_head_xent_reverse(const ExecSpace& space, Act2<base_t<S>> dh, Grads<base_t<S>> g, Act1<base_t<S>> lse,
                          Act2<base_t<S>> h, Params<base_t<S>> p, index_t w, index_t V,
                          Span1<const std::int32_t> targets, Act2<base_t<S>> z,
                          const GemmPolicy<base_t<S>>& pol = GemmPolicy<base_t<S>>(), bool logits_current = false,
                          Span2<const base_t<S>> kept = {}, RowShape shape = default_row_shape(),
                          bool gauss_newton = false) {
  keep_planes<S>(dh, g, lse, h, p, z);
  using T = base_t<S>;
  constexpr bool tangents = !std::is_same<S, T>::value;
  const index_t N = h.rows(), C = h.cols(), K = tangents ? h.d.extent(0) : 0;
  const index_t rows = z.rows(), vchunk = z.cols(), P = p.v.extent(0);
  if (tangents) require_summed("gnh::lm_head_xent::reverse", g);
  if (g.per_sequence()) sequences_of("gnh::lm_head_xent::reverse", g, N);
  if (kept.extent(0) > 0 && (tangents || rows < N || vchunk < V))
    throw std::logic_error("gnh::lm_head_xent::reverse: kept exponentials need the primal and one tile");
  for (index_t r0 = 0; r0 < N; r0 += rows)
    detail::reverse_block<S>(space, dh, g, lse, h, p, w, V, targets, z, pol, logits_current && rows >= N, kept, shape,
                             gauss_newton, r0, std::min(rows, N - r0));
}

// The primal head of a gradient pass, its forward and reverse together, a
// tile of whole vocabulary rows at a time (z.cols() >= V): a tile's logits
// are formed once, their losses and lse taken, and dz = softmax - onehot
// written over them in place for dh = dz W and dW += dz^T h. Apart, the
// forward forms every tile's logits and the reverse forms them again (one
// GEMM of the head's three a tile, and its plane written) wherever the tiles
// do not hold the whole batch. The values are lm_head_xent_forward's and
// lm_head_xent_reverse's bit for bit: the same kernels on the same logits in
// the same order. keep_exponentials: as lm_head_xent_forward's (one tile).
template <class T>
void lm_head_xent_gradient(const ExecSpace& space, Act1<double> loss, Act1<T> lse, Act2<T> dh, Grads<T> g, Act2<T> h,
                           Params<T> p, index_t w, index_t V, Span1<const std::int32_t> targets, Act2<T> z,
                           Span2<T> stats, const GemmPolicy<T>& pol, RowShape shape, bool keep_exponentials) {
  keep_planes<T>(loss, lse, dh, g, h, p, z);
  const index_t N = h.rows(), rows = z.rows();
  require_extent("gnh::lm_head_xent::gradient", "loss", loss.v.extent(0), N);
  require_extent("gnh::lm_head_xent::gradient", "targets", targets.extent(0), N);
  require_extent("gnh::lm_head_xent::gradient", "stats rows", stats.extent(0), N);
  if ((rows == 0 || z.cols() < V) && N > 0)
    throw std::logic_error("gnh::lm_head_xent::gradient: the logits tile holds no whole vocabulary row");
  if (g.per_sequence()) sequences_of("gnh::lm_head_xent::gradient", g, N);
  const bool keep = keep_exponentials && rows >= N;
  const Span2<const T> kept = keep ? Span2<const T>(stats) : Span2<const T>();
  const bool once = detail::head_rounded_once(pol, h, p, w, V, std::min(rows, N));
  for (index_t r0 = 0; r0 < N; r0 += rows) {
    const index_t nr = std::min(rows, N - r0);
    const GemmPolicy<T> tp = once ? detail::with_rounded_tile(space, pol, h, r0, nr) : pol;
    detail::forward_block<T>(space, loss, lse, h, p, w, V, targets, z, stats, Act2<T>(), tp, shape, keep, {}, r0, nr);
    if (once) detail::reverse_block_rounded<T>(space, dh, g, lse, h, p, w, V, targets, z, tp, kept, shape, r0, nr);
    else detail::reverse_block<T>(space, dh, g, lse, h, p, w, V, targets, z, pol, true, kept, shape, false, r0, nr);
  }
}

// The op contract (kernels/op.hpp): h (N, C) -> y (N, 1), the per-row loss,
// theta = W (V, C); the reverse seeds every row with 1 (dy is not read). Targets
// (n * 5 + 1 mod V, every fourth ignored) are the op's own. Saves lse (N, 1);
// the logits tile z (rows, vchunk) and the second-order moments (rows, C) are
// scratch (vchunk 0: the whole vocabulary).
template <class T>
struct LmHeadXentOp {
  static constexpr const char* name = "lm_head_xent";
  static constexpr bool is_loss = true;
  index_t N, C, V, rows, vchunk;
  RowShape shape;
  View1<std::int32_t> targets;
  View2<T> stats;
  View1<double> loss;  // (1 + 2K) N: the forward's double loss planes before y
  LmHeadXentOp(index_t N_, index_t C_, index_t V_, index_t rows_, index_t vchunk_ = 0,
               RowShape shape_ = default_row_shape())
      : N(N_),
        C(C_),
        V(V_),
        rows(rows_),
        vchunk(vchunk_ > 0 ? vchunk_ : V_),
        shape(shape_),
        targets("targets", N_),
        stats("stats", N_, 2) {
    auto h = Kokkos::create_mirror_view(targets);
    for (index_t n = 0; n < N; ++n) h(n) = n % 4 == 3 ? -1 : std::int32_t((n * 5 + 1) % V);
    Kokkos::deep_copy(targets, h);
  }
  // The tile as the engine plans it: vocabulary chunks of up to 4096 and rows
  // up to 2^24 elements over the 1 + 2K planes.
  static LmHeadXentOp at(const OpDims& d, index_t K) {
    const index_t N = d.B * d.T, vc = std::min<index_t>(d.V, 4096);
    const index_t r = std::max<index_t>(1, std::min<index_t>(N, (index_t(1) << 24) / (vc * (1 + 2 * K))));
    return LmHeadXentOp(N, d.C, d.V, r, vc);
  }
  OpSizes sizes() const { return {N, C, 1, V * C}; }
  std::vector<OpExtent> saved() const { return {{N, 1}, {rows, vchunk}, {rows, C}}; }
  // The reverse recomputes its tile's logits (a third GEMM); the second order
  // forms no z'' but the moments: 1 + 2K GEMMs for z and z', 1 + K for q W, q V_k.
  double flops(OpMode m, index_t K) const {
    const double f1 = 2.0 * double(N) * double(C) * double(V);
    if (m == OpMode::second_order) return f1 * (2.0 + 3.0 * double(K));
    return (m == OpMode::reverse || m == OpMode::tangent_reverse ? 3.0 : 1.0) * f1 * gemm_multiplier(m, K);
  }
  template <class S>
  void forward(const ExecSpace& space, Act2<T> y, Act2<T> h, Params<T> p, const OpSaved<T>& s) {
    const index_t K = directions_of<S>(h), planes = std::is_same<S, T>::value ? 0 : K;
    if (index_t(loss.extent(0)) < (1 + 2 * planes) * N)
      loss = View1<double>("gnh::lm_head_xent::loss", (1 + 2 * K) * N);
    Act1<double> l;
    l.v = Span1<double>(loss.data(), N);
    if (!std::is_same<S, T>::value) l.d = Span2<double>(loss.data() + N, K, N);
    if (std::is_same<S, Jet2<T>>::value) l.dd = Span2<double>(loss.data() + (1 + K) * N, K, N);
    lm_head_xent_forward<S>(space, l, s.flat(0), h, p, 0, V, targets, s[1], stats, s[2], GemmPolicy<T>(), shape);
    Kokkos::parallel_for(  // the lambda reads locals only, never this
        "gnh::lm_head_xent::op_loss", range(space, N), KOKKOS_LAMBDA(const index_t n) {
          y.v(n, 0) = T(l.v(n));
          for (index_t k = 0; k < planes; ++k) {
            y.d(k, n, 0) = T(l.d(k, n));
            if (l.dd.extent(0) > 0) y.dd(k, n, 0) = T(l.dd(k, n));
          }
        });
  }
  template <class S>
  void reverse(const ExecSpace& space, Act2<T> dx, Grads<T> g, Act2<T>, Act2<T> h, Act2<T>, Params<T> p,
               const OpSaved<T>& s) const {
    lm_head_xent_reverse<S>(space, dx, g, s.flat(0), h, p, 0, V, targets, s[1], GemmPolicy<T>(), false, {}, shape);
  }
};

// Compiled once, in gnh_core (kernels/instances.hpp).
#define GNH_LM_HEAD_FORWARD(EXT, S)                                                                           \
  EXT template void lm_head_xent_forward<S>(const ExecSpace&, Act1<double>, Act1<base_t<S>>, Act2<base_t<S>>, \
                                            Params<base_t<S>>, index_t, index_t, Span1<const std::int32_t>,   \
                                            Act2<base_t<S>>, Span2<base_t<S>>, Act2<base_t<S>>,               \
                                            const GemmPolicy<base_t<S>>&, RowShape, bool, Span2<double>);
#define GNH_LM_HEAD_REVERSE(EXT, S)                                                                                   \
  EXT template void lm_head_xent_reverse<S>(const ExecSpace&, Act2<base_t<S>>, Grads<base_t<S>>, Act1<base_t<S>>,     \
                                            Act2<base_t<S>>, Params<base_t<S>>, index_t, index_t,                     \
                                            Span1<const std::int32_t>, Act2<base_t<S>>, const GemmPolicy<base_t<S>>&, \
                                            bool, Span2<const base_t<S>>, RowShape, bool);
#define GNH_LM_HEAD(EXT, T)                                                                                       \
  GNH_FORWARD_SCALARS(GNH_LM_HEAD_FORWARD, EXT, T)                                                                \
  GNH_REVERSE_SCALARS(GNH_LM_HEAD_REVERSE, EXT, T)                                                                \
  EXT template void lm_head_xent_gradient<T>(const ExecSpace&, Act1<double>, Act1<T>, Act2<T>, Grads<T>, Act2<T>, \
                                             Params<T>, index_t, index_t, Span1<const std::int32_t>, Act2<T>,     \
                                             Span2<T>, const GemmPolicy<T>&, RowShape, bool);
GNH_LM_HEAD(extern, float)
GNH_LM_HEAD(extern, double)

}  // namespace gnh::kernels
