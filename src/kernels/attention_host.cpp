// SPDX-License-Identifier: BSD-3-Clause
// Tiled attention on the host sgemm; see attention_host.hpp. With s = scale q.k,
// p = softmax(s), y = sum p v, and a direction's first and second derivatives
// written with one and two dots:
//   lse' = sum p s',  lse'' = sum p (s'' + s'^2) - lse'^2
//   p'   = p (s' - lse'),  p'' = p ((s' - lse')^2 + s'' - lse'')
//   y'   = P' V + P V',  y'' = P'' V + 2 P' V' + P V''
// (the products of a direction concatenated along their inner dimension:
// forward_derivatives below)
// Masked entries (key after query) have p = 0, and so p' = p'' = 0.
#include "kernels/attention_host.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <utility>
#include <vector>

#include "core/fastmath.hpp"
#include "kernels/host_gemm.hpp"
#include "core/isa.hpp"

namespace gnh::kernels::host {

namespace {

// Query rows per tile (scratch is TQ x T per buffer): a multiple of both
// micro-tiles' rows (6 for AVX2, 12 for AVX-512), so a tile's products have
// no partial slivers. Against 64, on the Zen 5 (bench_kernels --op attention,
// minimum of 5 samples): preset small at K = 16, second order AVX-512 20.8 ->
// 18.3 ms, AVX2 29.7-30.3 -> 29.7-29.8 ms; reverse 0.69-0.75 -> 0.64-0.65 ms
// (AVX-512), 0.98 -> 0.88-0.93 ms (AVX2); the reference shape (T = 1024) at
// K = 4, AVX-512: second order 1130 -> 1119 ms, reverse 118 -> 105 ms.
constexpr std::int64_t TQ = 48;

// The sizes, and offsets into one plane of each part. Every plane of a part
// (its value, its tangents, its adjoint) has the part's row stride.
struct Geometry {
  std::int64_t B, T, H, G, rep, hs, C, N;
  std::int64_t ldq, ldk, ldv, off[3], stride[3];
  float scale;
  template <class F>
  Geometry(const QkvLayout& L, const Qkv3<F>& x, std::int64_t B_, std::int64_t T_)
      : B(B_),
        T(T_),
        H(L.H),
        G(L.G),
        rep(L.group()),
        hs(L.hs),
        C(L.H * L.hs),
        N(B_ * T_),
        ldq(x.ld[0]),
        ldk(x.ld[1]),
        ldv(x.ld[2]),
        off{L.off[0], L.off[1], L.off[2]},
        stride{L.stride[0], L.stride[1], L.stride[2]},
        scale(1.0f / std::sqrt(float(L.hs))) {}
  // Offsets of the tile's queries in a q plane, and of its sequence's keys
  // and values (query head h's key/value head) in k and v planes.
  std::int64_t q(std::int64_t b, std::int64_t h, std::int64_t t0) const {
    return (b * T + t0) * ldq + off[0] + h * stride[0];
  }
  std::int64_t k(std::int64_t b, std::int64_t h) const { return b * T * ldk + off[1] + (h / rep) * stride[1]; }
  std::int64_t v(std::int64_t b, std::int64_t h) const { return b * T * ldv + off[2] + (h / rep) * stride[2]; }
  std::int64_t y(std::int64_t b, std::int64_t h, std::int64_t t0) const { return (b * T + t0) * C + h * hs; }
  std::int64_t row(std::int64_t b, std::int64_t h, std::int64_t t) const { return (b * H + h) * T + t; }
  // Plane k (from plane 0) of each part.
  template <class F>
  Qkv3<F> plane(const Qkv3<F>& x, std::int64_t k) const {
    Qkv3<F> r = x;
    for (int i = 0; i < 3; ++i) r.p[i] = x.p[i] ? x.p[i] + k * N * x.ld[i] : nullptr;
    return r;
  }
};

// Scores of a tile into S (tq x t1, rows ld apart), then p = exp(s - lse) in
// place with the masked entries zeroed. With lse == nullptr, the row's lse is
// computed and returned in lse_out; otherwise it is read from lse.
GNH_HOST_CLONES void softmax_rows(float* S, std::int64_t tq, std::int64_t t0, std::int64_t t1, const float* lse_in,
                                  float* lse_out, std::int64_t ld) {
  for (std::int64_t r = 0; r < tq; ++r) {
    float* row = S + r * ld;
    const std::int64_t n = t0 + r + 1;  // keys 0..t
    if (lse_in) {
      const float L = lse_in[r];
      for (std::int64_t s = 0; s < n; ++s) row[s] = fexp_bounded(row[s] - L);
    } else {
      // The exponentials once: kept in place while summed, then scaled by
      // 1 / l (p = exp(s - m) / l = exp(s - lse)). A product below the
      // least normal float becomes 0, as fexp(s - lse) returns 0 there:
      // subnormal p reached the derivative GEMMs and slowed attention's
      // second order by 17% (Zen 5).
      const float m = lane_max(n, row);
      const float l = lane_sum<float>(n, [&](std::int64_t s) {
        const float e = fexp_bounded(row[s] - m);
        row[s] = e;
        return e;
      });
      lse_out[r] = std::log(l) + m;
      const float inv = 1.0f / l;
      for (std::int64_t s = 0; s < n; ++s) {
        const float p = row[s] * inv;
        row[s] = p < std::numeric_limits<float>::min() ? 0.0f : p;
      }
    }
    for (std::int64_t s = n; s < t1; ++s) row[s] = 0.0f;
  }
}

// The primal forward of one tile (rows t0..t1-1 of head h in sequence b): p
// into P (tq x t1 with rows ldp apart, masked entries 0), lse of its rows, y = P V.
GNH_HOST_CLONES void forward_tile(const Geometry& g, const Qkv3<const float>& x, float* y, float* lse, std::int64_t b,
                                  std::int64_t h, std::int64_t t0, std::int64_t t1, float* P, std::int64_t ldp) {
  const std::int64_t tq = t1 - t0;
  gemm_one(false, true, tq, t1, g.hs, g.scale, x.p[0] + g.q(b, h, t0), g.ldq, x.p[1] + g.k(b, h), g.ldk, 0.0f, P, ldp);
  softmax_rows(P, tq, t0, t1, nullptr, lse + g.row(b, h, t0), ldp);
  gemm_one(false, false, tq, g.hs, t1, 1.0f, P, ldp, x.p[2] + g.v(b, h), g.ldv, 0.0f, y + g.y(b, h, t0), g.C);
}

// Copies n rows of the column blocks (each w wide, rows ld_src apart, scaled
// by f) side by side into dst (rows ld_dst apart): [f0 X0 | f1 X1 | ...].
void side_by_side(float* dst, std::int64_t ld_dst, std::int64_t n, std::int64_t w,
                  std::initializer_list<std::pair<const float*, float>> blocks, std::int64_t ld_src) {
  for (std::int64_t r = 0; r < n; ++r) {
    float* out = dst + r * ld_dst;
    for (const auto& [x, f] : blocks) {
      const float* in = x + r * ld_src;
      for (std::int64_t c = 0; c < w; ++c) out[c] = f * in[c];
      out += w;
    }
  }
}

// Stacks n rows of each block (w wide, rows ld_src apart, scaled by f) one
// block under the other into dst (w wide, contiguous): [f0 X0; f1 X1; ...].
void stacked(float* dst, std::int64_t n, std::int64_t w, std::initializer_list<std::pair<const float*, float>> blocks,
             std::int64_t ld_src) {
  for (const auto& [x, f] : blocks)
    for (std::int64_t r = 0; r < n; ++r, dst += w) {
      const float* in = x + r * ld_src;
      for (std::int64_t c = 0; c < w; ++c) dst[c] = f * in[c];
    }
}

// Zeroes the k and v columns of query head h's key/value head, sequence b,
// in one plane of dx (the reverse accumulates into them tile by tile, over
// the unit's query heads).
void zero_kv(const Geometry& g, const Qkv3<float>& dx, std::int64_t b, std::int64_t h) {
  const std::int64_t ok = g.k(b, h), ov = g.v(b, h);
  for (std::int64_t t = 0; t < g.T; ++t)
    for (std::int64_t c = 0; c < g.hs; ++c) {
      dx.p[1][ok + t * g.ldk + c] = 0.0f;
      dx.p[2][ov + t * g.ldv + c] = 0.0f;
    }
}

// The primal reverse of one tile: P = softmax (from the saved lse), A = dp - D
// with dp = dy V^T and D_t = dy_t.y_t (written to D), dS = P A scale; then
// dq of the tile, and dk, dv of its keys accumulated.
// P_ready: P already holds the tile's probabilities (kept by the forward).
GNH_HOST_CLONES void reverse_tile(const Geometry& g, const Qkv3<float>& dx, float* D, const float* dy,
                                  const Qkv3<const float>& x, const float* y, const float* lse, std::int64_t b,
                                  std::int64_t h, std::int64_t t0, std::int64_t t1, const float* P_ready, float* Pbuf,
                                  float* A, float* dS) {
  const std::int64_t tq = t1 - t0, hs = g.hs;
  const std::int64_t oq = g.q(b, h, t0), ok = g.k(b, h), ov = g.v(b, h), oy = g.y(b, h, t0), orow = g.row(b, h, t0);
  const float* P = P_ready;
  if (!P) {
    gemm_one(false, true, tq, t1, hs, g.scale, x.p[0] + oq, g.ldq, x.p[1] + ok, g.ldk, 0.0f, Pbuf, t1);
    softmax_rows(Pbuf, tq, t0, t1, lse + orow, nullptr, t1);
    P = Pbuf;
  }
  gemm_one(false, true, tq, t1, hs, 1.0f, dy + oy, g.C, x.p[2] + ov, g.ldv, 0.0f, A, t1);
  for (std::int64_t r = 0; r < tq; ++r) {
    const float* dyr = dy + oy + r * g.C;
    const float* yr = y + oy + r * g.C;
    float Dt = 0.0f;
    for (std::int64_t c = 0; c < hs; ++c) Dt += dyr[c] * yr[c];
    D[orow + r] = Dt;
    const float* p = P + r * t1;
    float* a = A + r * t1;
    float* ds = dS + r * t1;
    for (std::int64_t j = 0; j < t1; ++j) {
      a[j] -= Dt;
      ds[j] = p[j] * a[j] * g.scale;
    }
  }
  gemm_one(false, false, tq, hs, t1, 1.0f, dS, t1, x.p[1] + ok, g.ldk, 0.0f, dx.p[0] + oq, g.ldq);
  gemm_one(true, false, t1, hs, tq, 1.0f, dS, t1, x.p[0] + oq, g.ldq, 1.0f, dx.p[1] + ok, g.ldk);
  gemm_one(true, false, t1, hs, tq, 1.0f, P, t1, dy + oy, g.C, 1.0f, dx.p[2] + ov, g.ldv);
}

}  // namespace

bool attention_available() { return native_kernel() != GemmKernel::none || vendor_panels_available(); }

std::int64_t attention_kept_elements(std::int64_t T) {
  std::int64_t n = 0;
  for (std::int64_t t0 = 0; t0 < T; t0 += TQ) n += (std::min(t0 + TQ, T) - t0) * std::min(t0 + TQ, T);
  return n;
}

void attention_forward(float* y, float* lse, Qkv3<const float> x, const QkvLayout& L, std::int64_t B, std::int64_t T,
                       std::int64_t bh0, std::int64_t bh1, float* keep_p) {
  const Geometry g(L, x, B, T);
  const std::int64_t H = g.H;
  const std::int64_t E = attention_kept_elements(T);
  std::vector<float> S(keep_p ? 0 : std::size_t(std::min(TQ, T) * T));
  for (std::int64_t bh = bh0; bh < bh1; ++bh) {
    const std::int64_t b = bh / H, h = bh % H;
    float* P = keep_p ? keep_p + bh * E : S.data();
    for (std::int64_t t0 = 0; t0 < T; t0 += TQ) {
      const std::int64_t t1 = std::min(t0 + TQ, T);
      forward_tile(g, x, y, lse, b, h, t0, t1, P, t1);
      if (keep_p) P += (t1 - t0) * t1;
    }
  }
}

namespace {

// Tangent (second == false: ydd, lsedd, xdd unused) or second-order forward.
// A direction's products are concatenated along their inner dimension, so
// that a tile costs two GEMMs of k = 2 hs and 3 hs for the scores and two of
// k = 2 t1 and 3 t1 for the outputs instead of ten of k = hs or t1:
//   s'  = scale [Q' | Q] [K | K']^T,   s'' = scale [Q'' | Q' | Q] [K | 2K' | K'']^T,
//   y'  = [P | P'] [V'; V],             y'' = [P | P' | P''] [V''; 2V'; V].
// P, P', P'' of a tile sit side by side in one buffer (rows w t1 apart).
//
// Per (sequence, head): the primal tiles first, each keeping its P; then
// direction by direction, the direction's Q', K', V' (and Q'', K'', V'') of
// every row copied once out of their planes into the operands, and its
// tiles. The score operands hold all T rows ([Q'' | Q' | Q] and the keys'
// blocks: a tile takes its rows); the value operands [V'; V] and
// [V''; 2V'; V] depend on the tile's t1 and are assembled from compact
// copies. Tile by tile with the directions inside, each direction's rows were
// read out of the planes (128 B every 3C floats) again for every tile,
// 2.1 times on average at T = 128: the copies were a fifth of attention's
// second order (Zen 4, AVX2 build, perf over `bench_kernels --op attention
// --mode second-order --directions 16`; perf/NOTES.md). The same products on
// the same operands: the same bits.
// The working memory of forward_derivatives for one (sequence, head) at a
// time: each tile's [P | P' | P''] (tq x w t1), one after the other, and the
// operands.
struct DerivativeScratch {
  DerivativeScratch(std::int64_t T, std::int64_t hs, bool second) : w(second ? 3 : 2) {
    std::int64_t ptotal = 0;
    for (std::int64_t t0 = 0; t0 < T; t0 += TQ) {
      const std::int64_t t1 = std::min(t0 + TQ, T);
      tile_at.push_back(ptotal);
      ptotal += (t1 - t0) * w * t1;
    }
    buf.resize(std::size_t(ptotal + T * 3 * hs + T * 2 * hs + T * 3 * hs + 4 * T * hs + 2 * T * hs + 3 * T * hs));
    Pall = buf.data();
    Aq = Pall + ptotal;
    Bk1 = Aq + T * 3 * hs;
    Bk2 = Bk1 + T * 2 * hs;
    V0 = Bk2 + T * 3 * hs;
    Vd = V0 + T * hs;
    Vdd = Vd + T * hs;
    V2d = Vdd + T * hs;
    Bv1 = V2d + T * hs;
    Bv2 = Bv1 + 2 * T * hs;
  }
  std::int64_t w;                     // planes of P side by side: P, P' (and P'')
  std::vector<std::int64_t> tile_at;  // where each tile's P starts in Pall
  std::vector<float> buf;
  float* Pall;
  float* Aq;                   // T x 3hs: [Q'' | Q' | Q]
  float* Bk1;                  // T x 2hs: [K | K']
  float* Bk2;                  // T x 3hs: [K | 2K' | K'']
  float *V0, *Vd, *Vdd, *V2d;  // T x hs each: V, V', V'', 2V'
  float* Bv1;                  // 2t1 x hs: [V'; V]
  float* Bv2;                  // 3t1 x hs: [V''; 2V'; V]
};

// Direction k's Q', K', V' (and Q'', K'', V'') of every row of (b, h), copied
// once out of their planes into the operands; dd's pointers null: x'' is zero.
void load_direction(DerivativeScratch& m, const Geometry& g, const Qkv3<const float>& d, const Qkv3<const float>& dd,
                    std::int64_t oq, std::int64_t ok, std::int64_t ov, std::int64_t T, std::int64_t hs, bool second) {
  const bool has_dd = second && dd.p[0];
  side_by_side(m.Aq + hs, 3 * hs, T, hs, {{d.p[0] + oq, 1.0f}}, g.ldq);
  side_by_side(m.Bk1 + hs, 2 * hs, T, hs, {{d.p[1] + ok, 1.0f}}, g.ldk);
  stacked(m.Vd, T, hs, {{d.p[2] + ov, 1.0f}}, g.ldv);
  if (has_dd) {
    side_by_side(m.Aq, 3 * hs, T, hs, {{dd.p[0] + oq, 1.0f}}, g.ldq);
    side_by_side(m.Bk2 + hs, 3 * hs, T, hs, {{d.p[1] + ok, 2.0f}, {dd.p[1] + ok, 1.0f}}, g.ldk);
    stacked(m.Vdd, T, hs, {{dd.p[2] + ov, 1.0f}}, g.ldv);
  } else if (second) {
    side_by_side(m.Bk2 + hs, 3 * hs, T, hs, {{d.p[1] + ok, 2.0f}}, g.ldk);
  }
  if (second) stacked(m.V2d, T, hs, {{d.p[2] + ov, 2.0f}}, g.ldv);
}

// The softmax's tangent (and second order) of a tile's tq rows, in place over
// the scores s' (and s''), and the rows' log-sum-exp derivatives into lsed
// (and lsedd), from the tile's first row.
GNH_HOST_CLONES void softmax_derivatives(const float* P, float* Pd, float* Pdd, std::int64_t tq, std::int64_t t1,
                                         std::int64_t ldp, float* lsed, float* lsedd, bool second) {
  for (std::int64_t r = 0; r < tq; ++r) {
    const float* p = P + r * ldp;
    float* sd = Pd + r * ldp;
    if (!second) {
      const float l1 = lane_sum<float>(t1, [&](std::int64_t s) { return p[s] * sd[s]; });
      for (std::int64_t s = 0; s < t1; ++s) sd[s] = p[s] * (sd[s] - l1);
      lsed[r] = l1;
      continue;
    }
    float* sdd = Pdd + r * ldp;
    float l1, l2;
    lane_sum2<float>(
        t1,
        [&](std::int64_t s, float& a, float& bb) {
          a += p[s] * sd[s];
          bb += p[s] * (sdd[s] + sd[s] * sd[s]);
        },
        l1, l2);
    l2 -= l1 * l1;
    for (std::int64_t s = 0; s < t1; ++s) {
      const float e = sd[s] - l1;
      sdd[s] = p[s] * (e * e + sdd[s] - l2);
      sd[s] = p[s] * e;
    }
    lsed[r] = l1;
    lsedd[r] = l2;
  }
}

// One tile (rows t0..t1 of (b, h)) of direction k: its scores' derivatives,
// the softmax's, then y' (and y'') into their planes (ydk, yddk: direction
// k's planes). dd: whether x'' is non-zero.
GNH_HOST_CLONES void derivative_tile(DerivativeScratch& m, const Geometry& g, float* ydk, float* yddk, float* lsedk,
                                     float* lseddk, std::int64_t b, std::int64_t h, std::int64_t t0, std::int64_t i,
                                     std::int64_t T, std::int64_t hs, bool second, bool dd) {
  const std::int64_t t1 = std::min(t0 + TQ, T), tq = t1 - t0, ldp = m.w * t1;
  const std::int64_t oy = g.y(b, h, t0), orow = g.row(b, h, t0);
  float* P = m.Pall + m.tile_at[std::size_t(i)];
  float *Pd = P + t1, *Pdd = P + 2 * t1;
  // s' (and s''): the tile's rows of Aq, [Q' | Q] from column hs.
  gemm_one(false, true, tq, t1, 2 * hs, g.scale, m.Aq + t0 * 3 * hs + hs, 3 * hs, m.Bk1, 2 * hs, 0.0f, Pd, ldp);
  // s'' = Q'' K^T + 2 Q' K'^T + Q K''^T; only the middle term where x'' is zero.
  if (second && dd)
    gemm_one(false, true, tq, t1, 3 * hs, g.scale, m.Aq + t0 * 3 * hs, 3 * hs, m.Bk2, 3 * hs, 0.0f, Pdd, ldp);
  else if (second)
    gemm_one(false, true, tq, t1, hs, g.scale, m.Aq + t0 * 3 * hs + hs, 3 * hs, m.Bk2 + hs, 3 * hs, 0.0f, Pdd, ldp);
  softmax_derivatives(P, Pd, Pdd, tq, t1, ldp, lsedk + orow, second ? lseddk + orow : nullptr, second);
  const std::size_t block = std::size_t(t1) * std::size_t(hs) * sizeof(float);
  std::memcpy(m.Bv1, m.Vd, block);
  std::memcpy(m.Bv1 + t1 * hs, m.V0, block);
  gemm_one(false, false, tq, hs, 2 * t1, 1.0f, P, ldp, m.Bv1, hs, 0.0f, ydk + oy, g.C);
  if (!second) return;
  // y'' = [P | P' | P''] [V''; 2V'; V], or [P' | P''] [2V'; V] where V'' is zero.
  if (dd) std::memcpy(m.Bv2, m.Vdd, block);
  std::memcpy(m.Bv2 + t1 * hs, m.V2d, block);
  std::memcpy(m.Bv2 + 2 * t1 * hs, m.V0, block);
  if (dd) gemm_one(false, false, tq, hs, 3 * t1, 1.0f, P, ldp, m.Bv2, hs, 0.0f, yddk + oy, g.C);
  else gemm_one(false, false, tq, hs, 2 * t1, 1.0f, Pd, ldp, m.Bv2 + t1 * hs, hs, 0.0f, yddk + oy, g.C);
}

void forward_derivatives(float* y, float* yd, float* ydd, float* lse, float* lsed, float* lsedd,
                         const Qkv3<const float>& x, const Qkv3<const float>& xd, const Qkv3<const float>& xdd,
                         std::int64_t K, const QkvLayout& L, std::int64_t B, std::int64_t T, std::int64_t bh0,
                         std::int64_t bh1, bool second) {
  const Geometry g(L, x, B, T);
  const std::int64_t H = g.H, hs = g.hs, N = B * T, R = B * H * T;
  DerivativeScratch m(T, hs, second);
  for (std::int64_t bh = bh0; bh < bh1; ++bh) {
    const std::int64_t b = bh / H, h = bh % H;
    const std::int64_t oq = g.q(b, h, 0), ok = g.k(b, h), ov = g.v(b, h);
    for (std::int64_t t0 = 0, i = 0; t0 < T; t0 += TQ, ++i) {
      const std::int64_t t1 = std::min(t0 + TQ, T);
      forward_tile(g, x, y, lse, b, h, t0, t1, m.Pall + m.tile_at[std::size_t(i)], m.w * t1);
    }
    // The primal blocks, once (Q, K and V are the same for every direction).
    side_by_side(m.Aq + 2 * hs, 3 * hs, T, hs, {{x.p[0] + oq, 1.0f}}, g.ldq);
    side_by_side(m.Bk1, 2 * hs, T, hs, {{x.p[1] + ok, 1.0f}}, g.ldk);
    stacked(m.V0, T, hs, {{x.p[2] + ov, 1.0f}}, g.ldv);
    if (second) side_by_side(m.Bk2, 3 * hs, T, hs, {{x.p[1] + ok, 1.0f}}, g.ldk);
    for (std::int64_t k = 0; k < K; ++k) {
      // x''s pointers null: x'' is zero.
      const Qkv3<const float> d = g.plane(xd, k), dd = second ? g.plane(xdd, k) : Qkv3<const float>();
      load_direction(m, g, d, dd, oq, ok, ov, T, hs, second);
      for (std::int64_t t0 = 0, i = 0; t0 < T; t0 += TQ, ++i)
        derivative_tile(m, g, yd + k * N * g.C, second ? ydd + k * N * g.C : nullptr, lsed + k * R,
                        second ? lsedd + k * R : nullptr, b, h, t0, i, T, hs, second, dd.p[0] != nullptr);
    }
  }
}

}  // namespace

void attention_forward_jet2(float* y, float* yd, float* ydd, float* lse, float* lsed, float* lsedd, Qkv3<const float> x,
                            Qkv3<const float> xd, Qkv3<const float> xdd, std::int64_t K, const QkvLayout& L,
                            std::int64_t B, std::int64_t T, std::int64_t bh0, std::int64_t bh1) {
  forward_derivatives(y, yd, ydd, lse, lsed, lsedd, x, xd, xdd, K, L, B, T, bh0, bh1, true);
}

void attention_forward_dual(float* y, float* yd, float* lse, float* lsed, Qkv3<const float> x, Qkv3<const float> xd,
                            std::int64_t K, const QkvLayout& L, std::int64_t B, std::int64_t T, std::int64_t bh0,
                            std::int64_t bh1) {
  forward_derivatives(y, yd, nullptr, lse, lsed, nullptr, x, xd, Qkv3<const float>(), K, L, B, T, bh0, bh1, false);
}

void attention_reverse(Qkv3<float> dx, float* D, const float* dy, Qkv3<const float> x, const float* y, const float* lse,
                       const QkvLayout& L, std::int64_t B, std::int64_t T, std::int64_t u0, std::int64_t u1,
                       const float* kept_p) {
  const Geometry g(L, x, B, T);
  const std::int64_t tile = std::min(TQ, T) * T, E = attention_kept_elements(T);
  std::vector<float> buf(std::size_t(3 * tile));
  float *P = buf.data(), *A = P + tile, *dS = A + tile;
  for (std::int64_t u = u0; u < u1; ++u) {
    const std::int64_t b = u / g.G, h0 = (u % g.G) * g.rep;
    zero_kv(g, dx, b, h0);
    for (std::int64_t h = h0; h < h0 + g.rep; ++h) {
      const float* kept = kept_p ? kept_p + (b * g.H + h) * E : nullptr;
      for (std::int64_t t0 = 0; t0 < T; t0 += TQ) {
        const std::int64_t t1 = std::min(t0 + TQ, T);
        reverse_tile(g, dx, D, dy, x, y, lse, b, h, t0, t1, kept, P, A, dS);
        if (kept) kept += (t1 - t0) * t1;
      }
    }
  }
}

namespace {
// The rows of one tile's tangent: D'_t = dy'_t.y_t + dy_t.y'_t (into Dd),
// p' = p (s' - lse') over s' in Pd, and ds' = (p' a + p a') scale over dp'
// in dSd, with a = dp - D in A and a' = dp' - D'.
GNH_HOST_CLONES void tangent_rows(const Geometry& g, const float* P, const float* A, float* Pd, float* dSd,
                                  const float* dy, const float* dyk, const float* y, const float* yk, const float* lsed,
                                  float* Dd, std::int64_t tq, std::int64_t t1) {
  for (std::int64_t r = 0; r < tq; ++r) {
    const float* dyr = dy + r * g.C;
    const float* dykr = dyk + r * g.C;
    const float* yr = y + r * g.C;
    const float* ykr = yk + r * g.C;
    float s = 0.0f;
    for (std::int64_t c = 0; c < g.hs; ++c) s += dykr[c] * yr[c] + dyr[c] * ykr[c];
    Dd[r] = s;
    const float L1 = lsed[r];
    const float* p = P + r * t1;
    const float* a = A + r * t1;
    float* pd = Pd + r * t1;
    float* dsd = dSd + r * t1;
    for (std::int64_t j = 0; j < t1; ++j) {
      pd[j] = p[j] * (pd[j] - L1);
      dsd[j] = (pd[j] * a[j] + p[j] * (dsd[j] - s)) * g.scale;
    }
  }
}
}  // namespace

// With a = dp - D (per element) and its tangent a' = dp' - D':
//   ds = p a scale,  ds' = (p' a + p a') scale.
void attention_reverse_dual(Qkv3<float> dx, Qkv3<float> dxd, float* D, float* Dd, const float* dy, const float* dyd,
                            Qkv3<const float> x, Qkv3<const float> xd, const float* y, const float* yd,
                            const float* lse, const float* lsed, std::int64_t K, const QkvLayout& L, std::int64_t B,
                            std::int64_t T, std::int64_t u0, std::int64_t u1) {
  const Geometry g(L, x, B, T);
  const std::int64_t N = B * T, R = B * g.H * T, tile = std::min(TQ, T) * T, hs = g.hs;
  std::vector<float> buf(std::size_t(5 * tile));
  float *P = buf.data(), *A = P + tile, *Pd = A + tile, *dS = Pd + tile, *dSd = dS + tile;
  for (std::int64_t u = u0; u < u1; ++u) {
    const std::int64_t b = u / g.G, h0 = (u % g.G) * g.rep;
    zero_kv(g, dx, b, h0);
    for (std::int64_t k = 0; k < K; ++k) zero_kv(g, g.plane(dxd, k), b, h0);
    for (std::int64_t h = h0; h < h0 + g.rep; ++h) {
      const std::int64_t ok = g.k(b, h), ov = g.v(b, h);
      for (std::int64_t t0 = 0; t0 < T; t0 += TQ) {
        const std::int64_t t1 = std::min(t0 + TQ, T), tq = t1 - t0;
        const std::int64_t oq = g.q(b, h, t0), oy = g.y(b, h, t0), orow = g.row(b, h, t0);
        // The primal reverse of the tile; A keeps dp - D for the tangents.
        reverse_tile(g, dx, D, dy, x, y, lse, b, h, t0, t1, nullptr, P, A, dS);
        for (std::int64_t k = 0; k < K; ++k) {
          const Qkv3<const float> d = g.plane(xd, k);
          const Qkv3<float> out = g.plane(dxd, k);
          const float* dyk = dyd + k * N * g.C;
          const float* yk = yd + k * N * g.C;
          // p' = p (s' - lse'), with s' = scale (q' k + q k').
          gemm_one(false, true, tq, t1, hs, g.scale, d.p[0] + oq, g.ldq, x.p[1] + ok, g.ldk, 0.0f, Pd, t1);
          gemm_one(false, true, tq, t1, hs, g.scale, x.p[0] + oq, g.ldq, d.p[1] + ok, g.ldk, 1.0f, Pd, t1);
          // dp' = dy' v + dy v'.
          gemm_one(false, true, tq, t1, hs, 1.0f, dyk + oy, g.C, x.p[2] + ov, g.ldv, 0.0f, dSd, t1);
          gemm_one(false, true, tq, t1, hs, 1.0f, dy + oy, g.C, d.p[2] + ov, g.ldv, 1.0f, dSd, t1);
          tangent_rows(g, P, A, Pd, dSd, dy + oy, dyk + oy, y + oy, yk + oy, lsed + k * R + orow, Dd + k * R + orow, tq,
                       t1);
          gemm_one(false, false, tq, hs, t1, 1.0f, dSd, t1, x.p[1] + ok, g.ldk, 0.0f, out.p[0] + oq, g.ldq);
          gemm_one(false, false, tq, hs, t1, 1.0f, dS, t1, d.p[1] + ok, g.ldk, 1.0f, out.p[0] + oq, g.ldq);
          gemm_one(true, false, t1, hs, tq, 1.0f, dSd, t1, x.p[0] + oq, g.ldq, 1.0f, out.p[1] + ok, g.ldk);
          gemm_one(true, false, t1, hs, tq, 1.0f, dS, t1, d.p[0] + oq, g.ldq, 1.0f, out.p[1] + ok, g.ldk);
          gemm_one(true, false, t1, hs, tq, 1.0f, Pd, t1, dy + oy, g.C, 1.0f, out.p[2] + ov, g.ldv);
          gemm_one(true, false, t1, hs, tq, 1.0f, P, t1, dyk + oy, g.C, 1.0f, out.p[2] + ov, g.ldv);
        }
      }
    }
  }
}

}  // namespace gnh::kernels::host
