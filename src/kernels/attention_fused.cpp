// SPDX-License-Identifier: BSD-3-Clause
// The fused tensor-core forward of the causal attention; see attention_fused.hpp.
#include "kernels/attention_fused.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>

#include "core/bf16.hpp"
#include "kernels/attention.hpp"
#include "kernels/blas.hpp"
#include "kernels/check.hpp"
#include "kernels/gemm_ledger.hpp"

#if defined(__CUDACC__)
#include <cuda_bf16.h>
#include <mma.h>
#endif

// WMMA's bfloat16 fragments: sm_80 and later. Elsewhere (the host, and a
// device pass for an older architecture) the same 16 x 16 tiles in FP32.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#define GNH_FUSED_WMMA 1
#else
#define GNH_FUSED_WMMA 0
#endif

namespace gnh::kernels {

namespace {

constexpr int kR = int(kFusedQueryRows), kKt = int(kFusedKeyRows), kWarps = kR / 16;
constexpr int kMaxFrags = int(kFusedWidth) / 16;  // 16-column blocks of a head
// Warps a team thread runs: one on a GPU (a team thread is a warp of 32
// vector lanes), every warp of the team on a host (teams of one thread).
#if defined(__CUDA_ARCH__)
constexpr int kPer = 1;
#else
constexpr int kPer = kWarps;
#endif

using Team = TeamRange;
using Member = Team::member_type;
constexpr bool kHost = std::is_same<ExecSpace, Kokkos::DefaultHostExecutionSpace>::value;
// The team's tiles: shared memory on a GPU (level 0); on a host, whose level
// 0 is a nominal 32 KB of the same memory as level 1, level 1.
constexpr int kLevel = kHost ? 1 : 0;

// A 16 x 16 tile: WMMA fragments where they exist; elsewhere an FP32 array
// whose product adds the 16 terms of each entry in order. Operands are
// bfloat16 storage (std::uint16_t) in shared memory.
#if GNH_FUSED_WMMA
namespace wm = nvcuda::wmma;
using FragA = wm::fragment<wm::matrix_a, 16, 16, 16, __nv_bfloat16, wm::row_major>;
using FragBt = wm::fragment<wm::matrix_b, 16, 16, 16, __nv_bfloat16, wm::col_major>;
using FragB = wm::fragment<wm::matrix_b, 16, 16, 16, __nv_bfloat16, wm::row_major>;
using FragC = wm::fragment<wm::accumulator, 16, 16, 16, float>;
KOKKOS_INLINE_FUNCTION const __nv_bfloat16* bf(const std::uint16_t* p) {
  return reinterpret_cast<const __nv_bfloat16*>(p);
}
// A (16 x 16, row-major, ld), B = rows of p transposed (B(r, c) = p[c ld + r]),
// B = rows of p (B(r, c) = p[r ld + c]).
KOKKOS_INLINE_FUNCTION void load_a(FragA& f, const std::uint16_t* p, int ld) { wm::load_matrix_sync(f, bf(p), ld); }
KOKKOS_INLINE_FUNCTION void load_bt(FragBt& f, const std::uint16_t* p, int ld) { wm::load_matrix_sync(f, bf(p), ld); }
KOKKOS_INLINE_FUNCTION void load_b(FragB& f, const std::uint16_t* p, int ld) { wm::load_matrix_sync(f, bf(p), ld); }
KOKKOS_INLINE_FUNCTION void zero(FragC& c) { wm::fill_fragment(c, 0.0f); }
template <class FB>
KOKKOS_INLINE_FUNCTION void mma(FragC& c, const FragA& a, const FB& b) {
  wm::mma_sync(c, a, b, c);
}
KOKKOS_INLINE_FUNCTION void store(float* p, int ld, const FragC& c) {
  wm::store_matrix_sync(p, c, ld, wm::mem_row_major);
}
#else
struct Tile16 {
  float x[16][16];
};
using FragA = Tile16;
using FragBt = Tile16;
using FragB = Tile16;
using FragC = Tile16;
KOKKOS_INLINE_FUNCTION void load_a(Tile16& f, const std::uint16_t* p, int ld) {
  for (int i = 0; i < 16; ++i)
    for (int j = 0; j < 16; ++j) f.x[i][j] = bf16_value(p[i * ld + j]);
}
KOKKOS_INLINE_FUNCTION void load_bt(Tile16& f, const std::uint16_t* p, int ld) {
  for (int r = 0; r < 16; ++r)
    for (int c = 0; c < 16; ++c) f.x[r][c] = bf16_value(p[c * ld + r]);
}
KOKKOS_INLINE_FUNCTION void load_b(Tile16& f, const std::uint16_t* p, int ld) { load_a(f, p, ld); }
KOKKOS_INLINE_FUNCTION void zero(Tile16& c) {
  for (int i = 0; i < 16; ++i)
    for (int j = 0; j < 16; ++j) c.x[i][j] = 0.0f;
}
KOKKOS_INLINE_FUNCTION void mma(Tile16& c, const Tile16& a, const Tile16& b) {
  for (int i = 0; i < 16; ++i)
    for (int j = 0; j < 16; ++j) {
      float s = c.x[i][j];
      for (int r = 0; r < 16; ++r) s += a.x[i][r] * b.x[r][j];
      c.x[i][j] = s;
    }
}
KOKKOS_INLINE_FUNCTION void store(float* p, int ld, const Tile16& c) {
  for (int i = 0; i < 16; ++i)
    for (int j = 0; j < 16; ++j) p[i * ld + j] = c.x[i][j];
}
#endif

// Fragment indices known at compile time (registers, not local memory): the
// loops over a head's 16-column blocks run to kMaxFrags, unrolled, and stop
// at the head's.
#if defined(__CUDA_ARCH__)
#define GNH_UNROLL _Pragma("unroll")
#else
#define GNH_UNROLL
#endif

constexpr std::size_t kAlign = 128;
constexpr std::size_t aligned(std::size_t b) { return (b + kAlign - 1) / kAlign * kAlign; }
inline index_t padded(index_t hs) { return (hs + 15) / 16 * 16; }

// One warp's two score tiles (16 rows x kKt keys, unscaled, 16 kKt apart in
// sc): a0 B0^T and a1 B1^T (B0, B1: kKt rows of hp).
KOKKOS_INLINE_FUNCTION void two_scores(index_t hp, const FragA (&a0)[kMaxFrags], const FragA (&a1)[kMaxFrags],
                                       const std::uint16_t* b0, const std::uint16_t* b1, float* sc) {
  const int nk = int(hp / 16), ld = int(hp);
  for (int nf = 0; nf < kKt / 16; ++nf) {
    FragC c0, c1;
    zero(c0);
    zero(c1);
    GNH_UNROLL for (int kk = 0; kk < kMaxFrags; ++kk) {
      if (kk >= nk) break;
      FragBt b;
      load_bt(b, b0 + nf * 16 * ld + kk * 16, ld);
      mma(c0, a0[kk], b);
      load_bt(b, b1 + nf * 16 * ld + kk * 16, ld);
      mma(c1, a1[kk], b);
    }
    store(sc + nf * 16, kKt, c0);
    store(sc + 16 * kKt + nf * 16, kKt, c1);
  }
}

// Warp wi's 16 rows of fragments into the stage (FP32 rows of hp).
KOKKOS_INLINE_FUNCTION void stage_warp(index_t hp, int wi, const FragC (&acc)[kMaxFrags], float* stage) {
  GNH_UNROLL for (int nf = 0; nf < kMaxFrags; ++nf) {
    if (nf >= int(hp / 16)) break;
    store(stage + wi * 16 * hp + nf * 16, int(hp), acc[nf]);
  }
}

// A team's shared memory, in bytes from its (kAlign-aligned) start.
struct Carve {
  std::size_t scores = 0, probs = 0, stats = 0, total = 0;
};
inline Carve carve_of(index_t hp, bool tan) {
  const std::size_t h = std::size_t(hp);
  const std::size_t key_planes = tan ? 4 : 2, score_planes = tan ? 2 : 1;
  const std::size_t prob_planes = tan ? 2 : 1, q_planes = tan ? 2 : 1;
  // The score tiles' region also stages Q (kR rows of each plane) and, at
  // the end, each warp's output rows (FP32).
  const std::size_t sc = std::max({score_planes * kWarps * 16 * kKt * sizeof(float),
                                   std::size_t(kWarps) * 16 * h * sizeof(float), q_planes * kR * h * 2});
  Carve c;
  c.scores = aligned(key_planes * kKt * h * 2);
  c.probs = c.scores + aligned(sc);
  c.stats = c.probs + aligned(prob_planes * kWarps * 16 * kKt * 2);
  c.total = c.stats + aligned(3 * kR * sizeof(float)) + kAlign;
  return c;
}

// One team: 32 query rows of (sequence b, query head h, direction dir) of
// the primal or the tangents.
template <bool Tan>
struct FusedForward {
  Act2<float> q, k, v, y;
  Act1<float> lse;
  // Not null: y and y' written there instead, rounded as the next product's
  // input (kernels/linear.hpp, rounded_input_room), where room lays them.
  Bf16Storage<float>* out = nullptr;
  RoomLayout room;
  bool keep_y = false;  // with out: y written too
  index_t N = 0;
  index_t Tc = 0, H = 0, G = 0, hs = 0, hp = 0, nq = 0, dirs = 1;
  index_t col[3] = {0, 0, 0}, stride[3] = {0, 0, 0};  // q, k, v: first column, head stride
  float scale = 0;
  Carve carve;
  static constexpr index_t kTile = 16 * kKt;  // one warp's plane of a score tile
  static constexpr index_t kScorePlanes = 1 + (Tan ? 1 : 0);
  static constexpr index_t kProbPlanes = 1 + (Tan ? 1 : 0);
  static constexpr int kKeyPlanes = Tan ? 2 : 1;  // K (and K'), then V (and V')

  struct Where {
    index_t b, h, j, dir, r0, nr, end;
  };
  // The league's order: a (sequence, head, direction)'s query tiles next to
  // each other, the longest (last) first; a head's directions next.
  KOKKOS_INLINE_FUNCTION Where where(const Member& team) const {
    const index_t lr = team.league_rank();
    Where w;
    const index_t qt = nq - 1 - lr % nq;
    index_t rest = lr / nq;
    w.dir = rest % dirs;
    rest /= dirs;
    w.h = rest % H;
    w.b = rest / H;
    w.j = w.h / (H / G);
    w.r0 = qt * kR;
    w.nr = Tc - w.r0 < kR ? Tc - w.r0 : kR;
    w.end = w.r0 + w.nr;
    return w;
  }
  KOKKOS_INLINE_FUNCTION static float at(const Act2<float>& a, int plane, index_t dir, index_t n, index_t c) {
    return plane == 0 ? a.v(n, c) : a.d(dir, n, c);
  }
  // The team's query rows of each plane (Q, Q'), rounded, kR x hp each.
  KOKKOS_INLINE_FUNCTION void stage_q(const Member& team, const Where& w, std::uint16_t* qs) const {
    const index_t n0 = w.b * Tc + w.r0, c0 = col[0] + w.h * stride[0];
    Kokkos::parallel_for(Kokkos::TeamVectorRange(team, kKeyPlanes * kR * hp), [&](const index_t i) {
      const index_t p = i / (kR * hp), r = (i / hp) % kR, c = i % hp;
      qs[i] = bf16_bits(r < w.nr && c < hs ? at(q, int(p), w.dir, n0 + r, c0 + c) : 0.0f);
    });
  }
  // Keys kt0 .. kt0 + kKt - 1 of K (and K'), and with values of V (and V'),
  // rounded, kKt x hp each; rows past the team's last query are zero.
  KOKKOS_INLINE_FUNCTION void stage_keys(const Member& team, const Where& w, index_t kt0, bool values,
                                         std::uint16_t* ks) const {
    const index_t n0 = w.b * Tc + kt0, planes = values ? 2 * kKeyPlanes : kKeyPlanes;
    Kokkos::parallel_for(Kokkos::TeamVectorRange(team, planes * kKt * hp), [&](const index_t i) {
      const index_t p = i / (kKt * hp), r = (i / hp) % kKt, c = i % hp;
      const bool val = p >= kKeyPlanes;
      const index_t c0 = val ? col[2] + w.j * stride[2] : col[1] + w.j * stride[1];
      const float x = kt0 + r < w.end && c < hs ? at(val ? v : k, int(p % kKeyPlanes), w.dir, n0 + r, c0 + c) : 0.0f;
      ks[i] = bf16_bits(x);
    });
  }
  // One warp's score tiles (16 rows x kKt keys, unscaled) from its query
  // fragments: S = Q K^T, S' = Q' K^T + Q K'^T, and with Sec S'' = Q' K'^T.
  template <bool Sec = false>
  KOKKOS_INLINE_FUNCTION void scores(const FragA (&qf)[2][kMaxFrags], const std::uint16_t* ks, float* sc) const {
    const int nk = int(hp / 16), ld = int(hp);
    for (int nf = 0; nf < kKt / 16; ++nf) {
      FragC c0, c1, c2;
      zero(c0);
      if (Tan) zero(c1);
      if (Sec) zero(c2);
      GNH_UNROLL for (int kk = 0; kk < kMaxFrags; ++kk) {
        if (kk >= nk) break;
        FragBt b;
        load_bt(b, ks + nf * 16 * ld + kk * 16, ld);
        mma(c0, qf[0][kk], b);
        if (!Tan) continue;
        mma(c1, qf[1][kk], b);
        load_bt(b, ks + kKt * ld + nf * 16 * ld + kk * 16, ld);
        mma(c1, qf[0][kk], b);
        if (Sec) mma(c2, qf[1][kk], b);
      }
      store(sc + nf * 16, kKt, c0);
      if (Tan) store(sc + kTile + nf * 16, kKt, c1);
      if (Sec) store(sc + 2 * kTile + nf * 16, kKt, c2);
    }
  }
  // One warp's rows: the running maximum and sums over the tile's keys.
  KOKKOS_INLINE_FUNCTION void statistics(const Member& team, const Where& w, int wi, index_t kt0, const float* sc,
                                         float* st) const {
    for (int i = 0; i < 16; ++i) {
      const index_t r = wi * 16 + i, t = w.r0 + r;
      if (r >= w.nr || kt0 > t) continue;
      const index_t n = t - kt0 + 1 < kKt ? t - kt0 + 1 : kKt;
      const float *s0 = sc + i * kKt, *s1 = s0 + kTile;
      float mt = 0;
      Kokkos::parallel_reduce(
          Kokkos::ThreadVectorRange(team, n),
          [&](const index_t s, float& a) { a = scale * s0[s] > a ? scale * s0[s] : a; }, Kokkos::Max<float>(mt));
      const float m = st[r] > mt ? st[r] : mt, alpha = jexp(st[r] - m);
      float se = 0, s1e = 0;
      Kokkos::parallel_reduce(
          Kokkos::ThreadVectorRange(team, n), [&](const index_t s, float& a) { a += jexp(scale * s0[s] - m); }, se);
      if (Tan)
        Kokkos::parallel_reduce(
            Kokkos::ThreadVectorRange(team, n),
            [&](const index_t s, float& a) { a += jexp(scale * s0[s] - m) * (scale * s1[s]); }, s1e);
      Kokkos::single(Kokkos::PerThread(team), [&] {
        st[r] = m;
        st[kR + r] = alpha * st[kR + r] + se;
        st[2 * kR + r] = alpha * st[2 * kR + r] + s1e;
      });
    }
  }
  // lse, lse' of the team's rows, in st (over m, a1) and out.
  KOKKOS_INLINE_FUNCTION void finish(const Member& team, const Where& w, float* st) const {
    Kokkos::parallel_for(Kokkos::TeamVectorRange(team, w.nr), [&](const index_t r) {
      const float l = st[kR + r], L = st[r] + jlog(l);
      const float l1 = Tan ? st[2 * kR + r] / l : 0.0f;
      st[r] = L;
      st[2 * kR + r] = l1;
      const index_t gi = (w.b * H + w.h) * Tc + w.r0 + r;
      if (w.dir == 0) lse.v(gi) = L;
      if (Tan) lse.d(w.dir, gi) = l1;
    });
  }
  // One warp's P and P' (bfloat16) from its score tiles.
  KOKKOS_INLINE_FUNCTION void probabilities(const Member& team, const Where& w, int wi, index_t kt0, const float* sc,
                                            const float* st, std::uint16_t* pr) const {
    Kokkos::parallel_for(Kokkos::ThreadVectorRange(team, kTile), [&](const index_t e) {
      const index_t i = e / kKt, s = e % kKt, r = wi * 16 + i;
      const bool ok = r < w.nr && kt0 + s <= w.r0 + r;
      const float p = ok ? jexp(scale * sc[e] - st[r]) : 0.0f;
      pr[e] = bf16_bits(p);
      if (!Tan) return;
      const float e1 = ok ? scale * sc[kTile + e] - st[2 * kR + r] : 0.0f;
      pr[kTile + e] = bf16_bits(p * e1);
    });
  }
  // One warp's outputs accumulated over the tile: y += P V (primal),
  // y' += P' V + P V'.
  KOKKOS_INLINE_FUNCTION void outputs(FragC (&acc)[2][kMaxFrags], bool primal, const std::uint16_t* ks,
                                      const std::uint16_t* pr) const {
    const int ld = int(hp);
    const std::uint16_t *V0 = ks + kKeyPlanes * kKt * ld, *V1 = V0 + kKt * ld;
    for (int kk = 0; kk < kKt / 16; ++kk) {
      FragA p0, p1;
      load_a(p0, pr + kk * 16, kKt);
      if (Tan) load_a(p1, pr + kTile + kk * 16, kKt);
      GNH_UNROLL for (int nf = 0; nf < kMaxFrags; ++nf) {
        if (nf >= ld / 16) break;
        FragB b;
        load_b(b, V0 + kk * 16 * ld + nf * 16, ld);
        if (primal) mma(acc[0][nf], p0, b);
        if (!Tan) continue;
        mma(acc[1][nf], p1, b);
        load_b(b, V1 + kk * 16 * ld + nf * 16, ld);
        mma(acc[1][nf], p0, b);
      }
    }
  }
  // Output o (0 y, 1 y') of every warp through shared memory.
  template <int o>
  KOKKOS_INLINE_FUNCTION void write(const Member& team, const Where& w, const FragC (&acc)[kPer][2][kMaxFrags],
                                    float* stage) const {
    for (int lw = 0; lw < kPer; ++lw) stage_warp(hp, team.team_rank() * kPer + lw, acc[lw][o], stage);
    team.team_barrier();
    const index_t n0 = w.b * Tc + w.r0, c0 = w.h * hs;
    Kokkos::parallel_for(Kokkos::TeamVectorRange(team, w.nr * hs), [&](const index_t i) {
      const index_t r = i / hs, c = i % hs;
      const float x = stage[r * hp + c];
      if (out && o == 0)
        for (index_t j = 0; j < room.copies(); ++j) out[room.value(n0 + r, c0 + c, j)] = bf16_as<Bf16Storage<float>>(x);
      if (out && o == 1) out[room.direction(w.dir, n0 + r, c0 + c)] = bf16_as<Bf16Storage<float>>(x);
      if (out && !(o == 0 && keep_y)) return;
      if (o == 0) y.v(n0 + r, c0 + c) = x;
      else y.d(w.dir, n0 + r, c0 + c) = x;
    });
    team.team_barrier();
  }
  // A key tile staged (with values: V and V' too) and every warp's score
  // tiles from it, each step complete across the team.
  KOKKOS_INLINE_FUNCTION void tile_scores(const Member& team, const Where& w, index_t kt0, bool values,
                                          const FragA (&qf)[kPer][2][kMaxFrags], std::uint16_t* ks, float* sc) const {
    stage_keys(team, w, kt0, values, ks);
    team.team_barrier();
    for (int lw = 0; lw < kPer; ++lw) scores(qf[lw], ks, sc + (team.team_rank() * kPer + lw) * kScorePlanes * kTile);
    team.team_barrier();
  }
  // The team's shared memory as carve lays it: the key tile, the score
  // tiles, the bfloat16 tiles, the rows' values.
  struct Parts {
    std::uint16_t* ks;
    float* sc;
    std::uint16_t* pr;
    float* st;
  };
  KOKKOS_INLINE_FUNCTION Parts parts(const Member& team) const {
    char* base = static_cast<char*>(team.team_scratch(int(kLevel)).get_shmem_aligned(carve.total - kAlign, kAlign));
    return {reinterpret_cast<std::uint16_t*>(base), reinterpret_cast<float*>(base + carve.scores),
            reinterpret_cast<std::uint16_t*>(base + carve.probs), reinterpret_cast<float*>(base + carve.stats)};
  }
  KOKKOS_INLINE_FUNCTION void operator()(const Member& team) const;
};

template <bool Tan>
KOKKOS_INLINE_FUNCTION void FusedForward<Tan>::operator()(const Member& team) const {
  const Where w = where(team);
  const Parts m = parts(team);
  std::uint16_t *const ks = m.ks, *const pr = m.pr;
  float *const sc = m.sc, *const st = m.st;
  const int rank = team.team_rank();
  const auto* qs = reinterpret_cast<const std::uint16_t*>(sc);  // Q staged over the score tiles
  stage_q(team, w, reinterpret_cast<std::uint16_t*>(sc));
  team.team_barrier();
  FragA qf[kPer][2][kMaxFrags];
  for (int lw = 0; lw < kPer; ++lw) {
    const int wi = rank * kPer + lw;
    GNH_UNROLL for (int kk = 0; kk < kMaxFrags; ++kk) {
      if (kk >= int(hp / 16)) break;
      load_a(qf[lw][0][kk], qs + wi * 16 * hp + kk * 16, int(hp));
      if (Tan) load_a(qf[lw][1][kk], qs + kR * hp + wi * 16 * hp + kk * 16, int(hp));
    }
  }
  Kokkos::parallel_for(Kokkos::TeamVectorRange(team, index_t(kR)), [&](const index_t r) {
    st[r] = -3.0e38f;
    st[kR + r] = st[2 * kR + r] = 0.0f;
  });
  team.team_barrier();
  for (index_t kt0 = 0; kt0 < w.end; kt0 += kKt) {  // the statistics
    tile_scores(team, w, kt0, false, qf, ks, sc);
    for (int lw = 0, wi = rank * kPer; lw < kPer; ++lw, ++wi)
      statistics(team, w, wi, kt0, sc + wi * kScorePlanes * kTile, st);
    team.team_barrier();
  }
  finish(team, w, st);
  team.team_barrier();
  FragC acc[kPer][2][kMaxFrags];
  for (int lw = 0; lw < kPer; ++lw)
    for (int o = 0; o < 2; ++o)
      for (int nf = 0; nf < kMaxFrags; ++nf) zero(acc[lw][o][nf]);
  for (index_t kt0 = 0; kt0 < w.end; kt0 += kKt) {  // the outputs
    tile_scores(team, w, kt0, true, qf, ks, sc);
    for (int lw = 0, wi = rank * kPer; lw < kPer; ++lw, ++wi)
      probabilities(team, w, wi, kt0, sc + wi * kScorePlanes * kTile, st, pr + wi * kProbPlanes * kTile);
    team.team_barrier();
    for (int lw = 0, wi = rank * kPer; lw < kPer; ++lw, ++wi)
      outputs(acc[lw], w.dir == 0, ks, pr + wi * kProbPlanes * kTile);
    team.team_barrier();
  }
  if (w.dir == 0) write<0>(team, w, acc, sc);
  if (Tan) write<1>(team, w, acc, sc);
}

// The share of the positions' square (T x T at the full shape) that the
// query tiles cover: keys up to a tile's last row, in whole key tiles.
double causal_share(index_t T) {
  double pairs = 0;
  for (index_t r0 = 0; r0 < T; r0 += kR) pairs += double(kR) * double((std::min(r0 + kR, T) + kKt - 1) / kKt * kKt);
  return pairs / (double(T) * double(T));
}

// The work of a call for the cost model (gemm_ledger.hpp): per (sequence,
// head, direction) the score products twice (the statistics, the outputs:
// 1 or 3 of hs each) and the outputs' (2 with tangents, and direction 0's
// y), each over the causal part of the positions' square that the query
// tiles cover at the full shape (keys up to a tile's last row, in whole key
// tiles); as FLOPs of the fused unit. Bytes: q, k, v read and y, lse
// written once in every plane (a sequence's keys are read again by each of
// its query tiles, from L2: the league keeps them next to each other), y
// rounded into each of copies.
void record_fused(index_t B, index_t Tc, const QkvLayout& L, index_t K, bool tan, bool rounded, bool keep_y,
                  index_t copies) {
  GemmWork& gw = gemm_work();
  if (!gw.on) return;
  const double causal = causal_share(Tc * std::max(1, gw.scale));
  const double dirs = double(std::max<index_t>(K, 1)), heads = double(B * L.H);
  const double scores = 2.0 * double(1 + (tan ? 2 : 0)), outs = tan ? 2.0 : 0.0;
  record_fused_products("gnh::attention::fused::forward", Tc, Tc, L.hs, causal * heads * (dirs * (scores + outs) + 1));
  const double planes = double(1 + (tan ? K : 0));
  Traffic("gnh::attention::fused::forward")
      .add(planes * double(B * Tc * (L.H + 2 * L.G) * L.hs), sizeof(float), 2)
      .add((rounded ? (keep_y ? 1 : 0) : planes) * double(B * Tc * L.H * L.hs), sizeof(float), 2)
      .add((rounded ? planes - 1 + double(copies) : 0) * double(B * Tc * L.H * L.hs), 2, 2)
      .add(planes * double(B * Tc * L.H), sizeof(float), 1);
}

// ---------------------------------------------------------------------------
// The second order with a cut at the output (attention_fused.hpp): the
// primal's kernel first (y, lse), then a team per 32 query rows of
// (sequence, query head, direction) walking the keys once.

// A second-order team's shared memory, in bytes from its start: the key
// tile's four planes (K, K', V, V'), the warps' five FP32 score tiles (S,
// S', S'', G = A V^T, H = A V'^T; first Q, Q' and A staged, last the output
// stage), their three bfloat16 tiles (P and P s' in two parts), and per row
// lse and lse', with each lane's running sums.
constexpr int kSecondScores = 5, kSecondProbs = 3, kSecondSums = 8, kLanes = 32;
inline Carve second_carve_of(index_t hp) {
  const std::size_t h = std::size_t(hp), tile = std::size_t(16) * kKt;
  const std::size_t sc = std::max({std::size_t(kSecondScores) * kWarps * tile * sizeof(float),
                                   std::size_t(kWarps) * 16 * h * sizeof(float), std::size_t(3) * kR * h * 2});
  Carve c;
  c.scores = aligned(4 * kKt * h * 2);
  c.probs = c.scores + aligned(sc);
  c.stats = c.probs + aligned(std::size_t(kSecondProbs) * kWarps * tile * 2);
  c.total = c.stats + aligned((2 * kR + std::size_t(kWarps) * kLanes * kSecondSums) * sizeof(float)) + kAlign;
  return c;
}

// One team of the second order: FusedForward<true>'s staging and score
// products (with S''), one walk.
struct FusedSecond : FusedForward<true> {
  Act2<float> adj;           // the cut's adjoint at y (N, H hs)
  float* partial = nullptr;  // <adj, y''> per (direction, head, row)
  // One warp's entries of a key tile: P, and P s' as two bfloat16 parts
  // (high, and the rest), into pr; each lane (a row, half of the keys, in
  // an order rotated by the row so that the lanes read distinct banks) adds
  // its row's eight sums over them into its slot.
  KOKKOS_INLINE_FUNCTION void entries(const Member& team, const Where& w, int wi, index_t kt0, const float* sc,
                                      std::uint16_t* pr, float* st) const {
    Kokkos::parallel_for(Kokkos::ThreadVectorRange(team, index_t(kLanes)), [&](const index_t lane) {
      const index_t i = lane % 16, half = lane / 16, r = wi * 16 + i, t = w.r0 + r;
      float* slot = st + 2 * kR + (wi * kLanes + lane) * kSecondSums;
      float a[kSecondSums];
      for (int j = 0; j < kSecondSums; ++j) a[j] = slot[j];
      const float L = st[r];
      for (index_t u = 0; u < 16; ++u) {
        const index_t s = half * 16 + (u + i) % 16, e = i * kKt + s;
        const bool ok = r < w.nr && kt0 + s <= t;
        const std::uint16_t pb = bf16_bits(ok ? jexp(scale * sc[e] - L) : 0.0f);
        const float p = bf16_value(pb), d = ok ? scale * sc[kTile + e] : 0.0f, ps = p * d;
        const std::uint16_t hi = bf16_bits(ps);
        pr[e] = pb;
        pr[kTile + e] = hi;
        pr[2 * kTile + e] = bf16_bits(ps - bf16_value(hi));
        const float e2 = ok ? d * d + 2 * scale * sc[2 * kTile + e] : 0.0f, g = sc[3 * kTile + e],
                    h = sc[4 * kTile + e];
        a[0] += p, a[1] += ps, a[2] += p * e2;
        a[3] += p * g, a[4] += ps * g, a[5] += p * e2 * g;
        a[6] += p * h, a[7] += ps * h;
      }
      for (int j = 0; j < kSecondSums; ++j) slot[j] = a[j];
    });
  }
  // One warp's y' accumulated over the tile: (P s') V in its two parts, and P V'.
  KOKKOS_INLINE_FUNCTION void tangent(FragC (&acc)[kMaxFrags], const std::uint16_t* ks, const std::uint16_t* pr) const {
    const int ld = int(hp);
    const std::uint16_t *V0 = ks + 2 * kKt * ld, *V1 = V0 + kKt * ld;
    for (int kk = 0; kk < kKt / 16; ++kk) {
      FragA p0, ph, pl;
      load_a(p0, pr + kk * 16, kKt);
      load_a(ph, pr + kTile + kk * 16, kKt);
      load_a(pl, pr + 2 * kTile + kk * 16, kKt);
      GNH_UNROLL for (int nf = 0; nf < kMaxFrags; ++nf) {
        if (nf >= ld / 16) break;
        FragB b;
        load_b(b, V0 + kk * 16 * ld + nf * 16, ld);
        mma(acc[nf], ph, b);
        mma(acc[nf], pl, b);
        load_b(b, V1 + kk * 16 * ld + nf * 16, ld);
        mma(acc[nf], p0, b);
      }
    }
  }
  // Each row's two lanes' sums: lse' = mu, lse'' = nu and the cut's
  // <a, y''> = sum p [(s' - mu)^2 + s'' - nu] g + 2 p (s' - mu) h, from the
  // moments (in double: the moments about zero cancel as far as mu is from
  // the p-weighted spread of s').
  KOKKOS_INLINE_FUNCTION void finish(const Member& team, const Where& w, float* st) const {
    Kokkos::parallel_for(Kokkos::TeamVectorRange(team, w.nr), [&](const index_t r) {
      const float* s0 = st + 2 * kR + ((r / 16) * kLanes + r % 16) * kSecondSums;
      double m[kSecondSums];
      for (int j = 0; j < kSecondSums; ++j) m[j] = double(s0[j]) + double(s0[16 * kSecondSums + j]);
      const double mu = m[1] / m[0], nu = m[2] / m[0] - mu * mu;
      const double c = m[5] - 2 * mu * m[4] + (mu * mu - nu) * m[3] + 2 * (m[7] - mu * m[6]);
      const index_t gi = (w.b * H + w.h) * Tc + w.r0 + r;
      lse.d(w.dir, gi) = float(mu);
      lse.dd(w.dir, gi) = float(nu);
      partial[(w.dir * H + w.h) * N + w.b * Tc + w.r0 + r] = float(c);
      st[kR + r] = float(mu);
    });
  }
  // y' = (P s') V + P V' - lse' y of every warp through shared memory, y the
  // primal's (FP32).
  KOKKOS_INLINE_FUNCTION void write_tangent(const Member& team, const Where& w, const FragC (&acc)[kPer][kMaxFrags],
                                            float* stage, const float* st) const {
    for (int lw = 0; lw < kPer; ++lw) stage_warp(hp, team.team_rank() * kPer + lw, acc[lw], stage);
    team.team_barrier();
    const index_t n0 = w.b * Tc + w.r0, c0 = w.h * hs;
    Kokkos::parallel_for(Kokkos::TeamVectorRange(team, w.nr * hs), [&](const index_t i) {
      const index_t r = i / hs, c = i % hs;
      const float x = stage[r * hp + c] - st[kR + r] * y.v(n0 + r, c0 + c);
      if (out) out[room.direction(w.dir, n0 + r, c0 + c)] = bf16_as<Bf16Storage<float>>(x);
      else y.d(w.dir, n0 + r, c0 + c) = x;
    });
  }
  KOKKOS_INLINE_FUNCTION void operator()(const Member& team) const;
};

KOKKOS_INLINE_FUNCTION void FusedSecond::operator()(const Member& team) const {
  const Where w = where(team);
  const Parts m = parts(team);
  std::uint16_t *const ks = m.ks, *const pr = m.pr;
  float *const sc = m.sc, *const st = m.st;
  const int rank = team.team_rank();
  auto* qs = reinterpret_cast<std::uint16_t*>(sc);  // Q, Q' and A staged over the score tiles
  stage_q(team, w, qs);
  const index_t n0 = w.b * Tc + w.r0, a0 = w.h * hs;
  Kokkos::parallel_for(Kokkos::TeamVectorRange(team, kR * hp), [&](const index_t i) {
    const index_t r = i / hp, c = i % hp;
    qs[2 * kR * hp + i] = bf16_bits(r < w.nr && c < hs ? adj.v(n0 + r, a0 + c) : 0.0f);
  });
  Kokkos::parallel_for(Kokkos::TeamVectorRange(team, index_t(kR)),
                       [&](const index_t r) { st[r] = r < w.nr ? lse.v((w.b * H + w.h) * Tc + w.r0 + r) : 0.0f; });
  Kokkos::parallel_for(Kokkos::TeamVectorRange(team, index_t(kWarps * kLanes * kSecondSums)),
                       [&](const index_t i) { st[2 * kR + i] = 0.0f; });
  team.team_barrier();
  FragA qf[kPer][2][kMaxFrags], af[kPer][kMaxFrags];
  for (int lw = 0; lw < kPer; ++lw) {
    const int wi = rank * kPer + lw;
    GNH_UNROLL for (int kk = 0; kk < kMaxFrags; ++kk) {
      if (kk >= int(hp / 16)) break;
      load_a(qf[lw][0][kk], qs + wi * 16 * hp + kk * 16, int(hp));
      load_a(qf[lw][1][kk], qs + kR * hp + wi * 16 * hp + kk * 16, int(hp));
      load_a(af[lw][kk], qs + 2 * kR * hp + wi * 16 * hp + kk * 16, int(hp));
    }
  }
  FragC acc[kPer][kMaxFrags];
  for (int lw = 0; lw < kPer; ++lw)
    for (int nf = 0; nf < kMaxFrags; ++nf) zero(acc[lw][nf]);
  constexpr index_t kPlanesWarp = kSecondScores * kTile, kProbsWarp = kSecondProbs * kTile;
  for (index_t kt0 = 0; kt0 < w.end; kt0 += kKt) {
    stage_keys(team, w, kt0, true, ks);
    team.team_barrier();
    for (int lw = 0, wi = rank * kPer; lw < kPer; ++lw, ++wi) {
      scores<true>(qf[lw], ks, sc + wi * kPlanesWarp);
      // G = A V^T and H = A V'^T.
      two_scores(hp, af[lw], af[lw], ks + 2 * kKt * hp, ks + 3 * kKt * hp, sc + wi * kPlanesWarp + 3 * kTile);
    }
    team.team_barrier();
    for (int lw = 0, wi = rank * kPer; lw < kPer; ++lw, ++wi)
      entries(team, w, wi, kt0, sc + wi * kPlanesWarp, pr + wi * kProbsWarp, st);
    team.team_barrier();
    for (int lw = 0, wi = rank * kPer; lw < kPer; ++lw, ++wi) tangent(acc[lw], ks, pr + wi * kProbsWarp);
    team.team_barrier();
  }
  finish(team, w, st);
  team.team_barrier();
  write_tangent(team, w, acc, sc, st);
}

// acc(k, n) += the heads' <adj, y''> of row n in order: a thread per (k, n).
struct FusedCutSum {
  const float* partial;
  View2<double> acc;
  index_t H, N;
  KOKKOS_INLINE_FUNCTION void operator()(const index_t i) const {
    const index_t k = i / N, n = i - k * N;
    double s = 0;
    for (index_t h = 0; h < H; ++h) s += double(partial[(k * H + h) * N + n]);
    acc(k, n) += s;
  }
};

// The second order's work for the cost model: per (sequence, head,
// direction) one walk of 9 products of hs (S, S' in two, S'', A V^T, A V'^T,
// (P s') V in two parts, P V') over the causal tiles. Bytes: q, k, v and
// their directions read, the adjoint, y and lse read once (each direction's
// teams of a head next to each other, from L2), y' (rounded or FP32), lse',
// lse'' and the partial contractions written; the sum over the heads.
void record_second(index_t B, index_t Tc, const QkvLayout& L, index_t K, bool rounded) {
  GemmWork& gw = gemm_work();
  if (!gw.on) return;
  const double causal = causal_share(Tc * std::max(1, gw.scale));
  record_fused_products("gnh::attention::fused::second_order", Tc, Tc, L.hs,
                        causal * double(B * L.H) * double(K) * 9.0);
  const double N = double(B * Tc), A = double(L.H * L.hs), rows = double(B * L.H * Tc);
  Traffic("gnh::attention::fused::second_order")
      .add(double(1 + K) * N * double((L.H + 2 * L.G) * L.hs) + 2.0 * N * A, sizeof(float), 2)
      .add(double(K) * N * A, rounded ? 2 : sizeof(float), 2)
      .add(rows * double(1 + 3 * K), sizeof(float), 1);
  Traffic("gnh::attention::fused::cut")
      .add(rows * double(K), sizeof(float), 1)
      .add(2.0 * double(K) * N, sizeof(double), 0);
}

// ---------------------------------------------------------------------------
// The reverse of the primal: two kernels, each output written by one team.
// The query side (dq, and D = dy . y per row) first; the key side (dk, dv)
// then reads D. Both form S = scale Q K^T and dP = dy V^T from the rounded
// operands again, and from them P = exp(S - lse) and dS = P (dP - D) scale,
// rounded as the batched path's row kernel rounds them.

static_assert(kR == kKt, "the reverse's tiles are square");

// A team's shared memory: two regions of two 32-row planes of bfloat16
// operands (the team's own rows; the rows it walks), the warps' score tiles
// (FP32; also the output stage), their rounded probability tiles, and two
// values per row.
struct RevCarve {
  std::size_t walk = 0, scores = 0, probs = 0, stats = 0, total = 0;
};
inline RevCarve rev_carve_of(index_t hp) {
  const std::size_t h = std::size_t(hp), tile = std::size_t(kWarps) * 16 * kKt;
  RevCarve c;
  c.walk = aligned(2 * kR * h * 2);
  c.scores = c.walk + aligned(2 * kKt * h * 2);
  c.probs = c.scores + aligned(std::max(2 * tile * sizeof(float), std::size_t(kR) * h * sizeof(float)));
  c.stats = c.probs + aligned(2 * tile * 2);
  c.total = c.stats + aligned(2 * kR * sizeof(float)) + kAlign;
  return c;
}

struct FusedReverseBase {
  Act2<float> q, k, v, dq, dk, dv, dy, y;
  Act1<float> lse, D;
  // Not null: dq, dk, dv (one buffer of rcols columns) also written there,
  // rounded as the input projection's products read them; fp32 false: there
  // alone.
  Bf16Storage<float>* rounded = nullptr;
  index_t rcols = 0;
  bool fp32 = true;
  index_t Tc = 0, H = 0, G = 0, hs = 0, hp = 0, nt = 0;
  index_t col[3] = {0, 0, 0}, stride[3] = {0, 0, 0};
  float scale = 0;
  RevCarve carve;
  static constexpr index_t kTile = 16 * kKt;

  struct Parts {
    std::uint16_t *own, *walk, *pr;
    float *sc, *st;
  };
  KOKKOS_INLINE_FUNCTION Parts parts(const Member& team) const {
    char* base = static_cast<char*>(team.team_scratch(int(kLevel)).get_shmem_aligned(carve.total - kAlign, kAlign));
    return {reinterpret_cast<std::uint16_t*>(base), reinterpret_cast<std::uint16_t*>(base + carve.walk),
            reinterpret_cast<std::uint16_t*>(base + carve.probs), reinterpret_cast<float*>(base + carve.scores),
            reinterpret_cast<float*>(base + carve.stats)};
  }
  // Rows n0 .. n0 + nv - 1 (of 32), columns c0 .. c0 + hs - 1 of a, rounded
  // into dst (32 x hp); the rest zero.
  KOKKOS_INLINE_FUNCTION void stage(const Member& team, const Act2<float>& a, index_t n0, index_t nv, index_t c0,
                                    std::uint16_t* dst) const {
    Kokkos::parallel_for(Kokkos::TeamVectorRange(team, kR * hp), [&](const index_t i) {
      const index_t r = i / hp, c = i % hp;
      dst[i] = bf16_bits(r < nv && c < hs ? a.v(n0 + r, c0 + c) : 0.0f);
    });
  }
  // Each warp's fragments of its 16 rows of the two planes of own (32 x hp
  // each).
  KOKKOS_INLINE_FUNCTION void own_fragments(const Member& team, const std::uint16_t* own, FragA (&a0)[kPer][kMaxFrags],
                                            FragA (&a1)[kPer][kMaxFrags]) const {
    for (int lw = 0; lw < kPer; ++lw) {
      const int wi = team.team_rank() * kPer + lw;
      GNH_UNROLL for (int kk = 0; kk < kMaxFrags; ++kk) {
        if (kk >= int(hp / 16)) break;
        load_a(a0[lw][kk], own + wi * 16 * hp + kk * 16, int(hp));
        load_a(a1[lw][kk], own + kR * hp + wi * 16 * hp + kk * 16, int(hp));
      }
    }
  }
  // Every warp's two score tiles from its fragments against the walked rows
  // (two planes of 32), then f(wi, e, sc, pr) for each entry e of its tiles
  // (sc its FP32 tiles, pr its two bfloat16 tiles), each step complete across
  // the team.
  template <class F>
  KOKKOS_INLINE_FUNCTION void score_tiles(const Member& team, const FragA (&a0)[kPer][kMaxFrags],
                                          const FragA (&a1)[kPer][kMaxFrags], const Parts& m, const F& f) const {
    for (int lw = 0; lw < kPer; ++lw) {
      const int wi = team.team_rank() * kPer + lw;
      two_scores(hp, a0[lw], a1[lw], m.walk, m.walk + kR * hp, m.sc + wi * 2 * kTile);
    }
    team.team_barrier();
    for (int lw = 0; lw < kPer; ++lw) {
      const int wi = team.team_rank() * kPer + lw;
      const float* sc = m.sc + wi * 2 * kTile;
      std::uint16_t* pr = m.pr + wi * 2 * kTile;
      Kokkos::parallel_for(Kokkos::ThreadVectorRange(team, kTile), [&](const index_t e) { f(wi, e, sc, pr); });
    }
    team.team_barrier();
  }
  // acc += a (16 x 32, bfloat16, rows 32 apart) times b (32 rows of hp).
  KOKKOS_INLINE_FUNCTION void accumulate(FragC (&acc)[kMaxFrags], const std::uint16_t* a,
                                         const std::uint16_t* b) const {
    const int ld = int(hp);
    for (int kk = 0; kk < kKt / 16; ++kk) {
      FragA fa;
      load_a(fa, a + kk * 16, kKt);
      GNH_UNROLL for (int nf = 0; nf < kMaxFrags; ++nf) {
        if (nf >= ld / 16) break;
        FragB fb;
        load_b(fb, b + kk * 16 * ld + nf * 16, ld);
        mma(acc[nf], fa, fb);
      }
    }
  }
  // dS of one entry from its score s and dP, the row's lse and D, and (p not
  // null) P; both zero off the causal part (whose rows' statistics are not
  // read).
  KOKKOS_INLINE_FUNCTION std::uint16_t entry(bool ok, float s, float dp, float L, float Dr, std::uint16_t* p) const {
    const float e = ok ? jexp(scale * s - L) : 0.0f;
    if (p) *p = bf16_bits(e);
    return bf16_bits(ok ? e * (dp - Dr) * scale : 0.0f);
  }
  // Every warp's rows (acc) through the stage into rows n0 .. n0 + nv - 1,
  // columns c0 .. c0 + hs - 1 of out.
  KOKKOS_INLINE_FUNCTION void write(const Member& team, const FragC (&acc)[kPer][kMaxFrags], float* stage,
                                    const Act2<float>& out, index_t n0, index_t nv, index_t c0) const {
    for (int lw = 0; lw < kPer; ++lw) stage_warp(hp, team.team_rank() * kPer + lw, acc[lw], stage);
    team.team_barrier();
    Kokkos::parallel_for(Kokkos::TeamVectorRange(team, nv * hs), [&](const index_t i) {
      const index_t r = i / hs, c = i % hs;
      const float x = stage[r * hp + c];
      if (rounded) rounded[(n0 + r) * rcols + c0 + c] = bf16_as<Bf16Storage<float>>(x);
      if (fp32) out.v(n0 + r, c0 + c) = x;
    });
    team.team_barrier();
  }
};

// A team: 32 query rows of (sequence, query head): dq, and D of its rows.
struct FusedReverseQueries : FusedReverseBase {
  KOKKOS_INLINE_FUNCTION void operator()(const Member& team) const {
    const index_t lr = team.league_rank(), qt = nt - 1 - lr % nt, h = (lr / nt) % H, b = lr / (nt * H);
    const index_t j = h / (H / G), r0 = qt * kR, nr = Tc - r0 < kR ? Tc - r0 : kR, end = r0 + nr;
    const index_t n0 = b * Tc + r0, g0 = (b * H + h) * Tc + r0;
    const Parts m = parts(team);
    stage(team, q, n0, nr, col[0] + h * stride[0], m.own);
    stage(team, dy, n0, nr, h * hs, m.own + kR * hp);
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, nr), [&](const index_t r) {
      float d = 0;
      Kokkos::parallel_reduce(
          Kokkos::ThreadVectorRange(team, hs),
          [&](const index_t c, float& a) { a += dy.v(n0 + r, h * hs + c) * y.v(n0 + r, h * hs + c); }, d);
      Kokkos::single(Kokkos::PerThread(team), [&] {
        m.st[r] = lse.v(g0 + r);
        m.st[kR + r] = d;
        D.v(g0 + r) = d;
      });
    });
    team.team_barrier();
    FragA qf[kPer][kMaxFrags], yf[kPer][kMaxFrags];
    FragC acc[kPer][kMaxFrags];
    own_fragments(team, m.own, qf, yf);
    for (int lw = 0; lw < kPer; ++lw)
      for (int kk = 0; kk < kMaxFrags; ++kk) zero(acc[lw][kk]);
    for (index_t kt0 = 0; kt0 < end; kt0 += kKt) {
      const index_t nv = end - kt0 < kKt ? end - kt0 : kKt;
      stage(team, k, b * Tc + kt0, nv, col[1] + j * stride[1], m.walk);
      stage(team, v, b * Tc + kt0, nv, col[2] + j * stride[2], m.walk + kKt * hp);
      team.team_barrier();
      score_tiles(team, qf, yf, m, [&](int wi, index_t e, const float* sc, std::uint16_t* ds) {
        const index_t r = wi * 16 + e / kKt, s = kt0 + e % kKt;
        ds[e] = entry(r < nr && s <= r0 + r, sc[e], sc[kTile + e], m.st[r], m.st[kR + r], nullptr);
      });
      for (int lw = 0; lw < kPer; ++lw) {
        const int wi = team.team_rank() * kPer + lw;
        accumulate(acc[lw], m.pr + wi * 2 * kTile, m.walk);
      }
      team.team_barrier();
    }
    write(team, acc, m.sc, dq, n0, nr, col[0] + h * stride[0]);
  }
};

// A team: 32 key rows of (sequence, key/value head): dk and dv, over every
// query head of the group in order and every query tile from the keys' own.
struct FusedReverseKeys : FusedReverseBase {
  KOKKOS_INLINE_FUNCTION void operator()(const Member& team) const {
    const index_t lr = team.league_rank(), kt = lr % nt, j = (lr / nt) % G, b = lr / (nt * G);
    const index_t kt0 = kt * kKt, nk = Tc - kt0 < kKt ? Tc - kt0 : kKt, rep = H / G;
    const Parts m = parts(team);
    stage(team, k, b * Tc + kt0, nk, col[1] + j * stride[1], m.own);
    stage(team, v, b * Tc + kt0, nk, col[2] + j * stride[2], m.own + kR * hp);
    team.team_barrier();
    FragA kf[kPer][kMaxFrags], vf[kPer][kMaxFrags];
    FragC ak[kPer][kMaxFrags], av[kPer][kMaxFrags];
    own_fragments(team, m.own, kf, vf);
    for (int lw = 0; lw < kPer; ++lw)
      for (int kk = 0; kk < kMaxFrags; ++kk) zero(ak[lw][kk]), zero(av[lw][kk]);
    for (index_t rr = 0; rr < rep; ++rr) {
      const index_t h = j * rep + rr;
      for (index_t r0 = kt0; r0 < Tc; r0 += kR) {
        const index_t nr = Tc - r0 < kR ? Tc - r0 : kR, n0 = b * Tc + r0, g0 = (b * H + h) * Tc + r0;
        stage(team, q, n0, nr, col[0] + h * stride[0], m.walk);
        stage(team, dy, n0, nr, h * hs, m.walk + kR * hp);
        Kokkos::parallel_for(Kokkos::TeamVectorRange(team, nr), [&](const index_t r) {
          m.st[r] = lse.v(g0 + r);
          m.st[kR + r] = D.v(g0 + r);
        });
        team.team_barrier();
        // Transposed tiles: row i a key, column c a query.
        score_tiles(team, kf, vf, m, [&](int wi, index_t e, const float* sc, std::uint16_t* pr) {
          const index_t s = kt0 + wi * 16 + e / kR, c = e % kR;
          pr[kTile + e] = entry(c < nr && s <= r0 + c, sc[e], sc[kTile + e], m.st[c], m.st[kR + c], &pr[e]);
        });
        for (int lw = 0; lw < kPer; ++lw) {
          const int wi = team.team_rank() * kPer + lw;
          accumulate(av[lw], m.pr + wi * 2 * kTile, m.walk + kR * hp);
          accumulate(ak[lw], m.pr + wi * 2 * kTile + kTile, m.walk);
        }
        team.team_barrier();
      }
    }
    write(team, ak, m.sc, dk, b * Tc + kt0, nk, col[1] + j * stride[1]);
    write(team, av, m.sc, dv, b * Tc + kt0, nk, col[2] + j * stride[2]);
  }
};

// The reverse's work for the cost model: per (sequence, query head) S and
// dP in each kernel, dq, dk and dv: 7 products of hs over the causal tiles.
// Bytes: q, k, v, dy, y read, dq, dk, dv written, lse read and D written
// and read, once (a walk's rows come again from L2).
void record_fused_reverse(index_t B, index_t Tc, const QkvLayout& L, bool rounded, bool fp32) {
  GemmWork& gw = gemm_work();
  if (!gw.on) return;
  const double causal = causal_share(Tc * std::max(1, gw.scale));
  record_fused_products("gnh::attention::fused::reverse", Tc, Tc, L.hs, causal * double(B * L.H) * 7.0);
  // q, k, v read and their adjoints written (in FP32, and rounded), dy and y read.
  const double qkv = double(B * Tc * (L.H + 2 * L.G) * L.hs);
  Traffic("gnh::attention::fused::reverse")
      .add((fp32 ? 2.0 : 1.0) * qkv + 2.0 * double(B * Tc * L.H * L.hs), sizeof(float), 2)
      .add(rounded ? qkv : 0.0, 2, 2)
      .add(3.0 * double(B * Tc * L.H), sizeof(float), 1);
}

}  // namespace

std::size_t attention_fused_reverse_scratch_bytes(index_t hs) { return rev_carve_of(padded(hs)).total; }

std::size_t attention_fused_scratch_bytes(index_t hs, bool tangents, bool second) {
  if (second) return std::max(carve_of(padded(hs), false).total, second_carve_of(padded(hs)).total);
  return carve_of(padded(hs), tangents).total;
}

std::size_t attention_fused_scratch_limit() {
  // Kokkos's scratch_size_max(0) sets aside the reduction space of a team of
  // 1024 threads ((1024 + 2) doubles and an int64); a launch of a team of
  // kWarps rows needs (kWarps + 2) doubles and the int64 beside its scratch in
  // the block's shared memory (Kokkos 4's ParallelFor of a TeamPolicy on
  // CUDA), so a fused team may use the rest: 49,112 of a 48 KB block.
  if constexpr (kHost) return std::size_t(Team::scratch_size_max(kLevel));
  else return std::size_t(Team::scratch_size_max(kLevel)) + std::size_t(1024 - kWarps) * sizeof(double);
}

bool attention_fused_fits(const QkvLayout& L, bool tangents, bool second) {
  if (!L.valid() || L.hs > kFusedWidth) return false;
  return attention_fused_scratch_bytes(L.hs, tangents, second) <= attention_fused_scratch_limit();
}

template <class S>
void attention_forward_fused(const ExecSpace& space, Act2<float> y, Act1<float> lse, QkvActs<float> x,
                             const QkvLayout& L, index_t B, index_t Tc, void* rounded, bool keep_y, const FusedCut* cut,
                             RoomLayout room) {
  constexpr bool tan = has_tangents_v<S>, sec = has_second_v<S>;
  keep_planes<S>(y, lse, x.q, x.k, x.v);
  const char* who = "gnh::attention::forward (fused)";
  if (!attention_fused_fits(L, tan, sec))
    throw std::invalid_argument(cat(who, ": heads of ", L.hs, " columns (at most ", kFusedWidth, ") in ",
                                    attention_fused_scratch_bytes(L.hs, tan, sec),
                                    " bytes of team scratch do not fit this backend"));
  detail::check_qkv(who, x, L, B * Tc);
  require_extent(who, "y rows", y.rows(), B * Tc);
  require_extent(who, "y cols", y.cols(), L.H * L.hs);
  require_extent(who, "lse", lse.v.extent(0), B * L.H * Tc);
  const index_t K = tan ? directions_of<S>(x.q) : 0;
  // x'' is never read (zero: the second order runs fused only with a cut at
  // the attention's input), so q, k and v need no second-order planes; nor
  // y (its y'' is contracted with the cut's adjoint, never formed).
  using X = std::conditional_t<tan, Dual<float>, float>;
  require_planes<X>(who, "y", y, K);
  require_planes<S>(who, "lse", lse, K);
  require_planes<X>(who, "q", x.q, K);
  require_planes<X>(who, "k", x.k, K);
  require_planes<X>(who, "v", x.v, K);
  const index_t N = B * Tc, nq = (Tc + kR - 1) / kR;
  if (room.N > 0 && (room.N != N || room.C != L.H * L.hs || (room.pairs > 0 && 2 * room.pairs < K)))
    throw std::logic_error(cat(who, ": a room of ", room.pairs, " pair blocks of ", room.N, " x ", room.C, " for ", K,
                               " directions of ", N, " x ", L.H * L.hs));
  if (sec) {
    if (!cut || !cut->partial) throw std::logic_error(cat(who, ": a second order without its cut's adjoint"));
    require_extent(who, "lse's second-order planes", lse.dd.extent(0), K);
    require_extent(who, "the cut's adjoint rows", cut->adj.rows(), N);
    require_extent(who, "the cut's adjoint cols", cut->adj.cols(), L.H * L.hs);
    require_extent(who, "the cut's directions", cut->acc.extent(0), K);
    require_extent(who, "the cut's rows", cut->acc.extent(1), N);
  }
  auto fill = [&](auto& f, index_t dirs) {
    f.q = x.q, f.k = x.k, f.v = x.v, f.y = y, f.lse = lse;
    f.out = static_cast<Bf16Storage<float>*>(rounded), f.keep_y = keep_y, f.N = N;
    f.room = room.N > 0 ? room : RoomLayout{N, L.H * L.hs, 0};
    f.Tc = Tc, f.H = L.H, f.G = L.G, f.hs = L.hs, f.hp = padded(L.hs);
    f.nq = nq, f.dirs = dirs;
    for (int i = 0; i < 3; ++i) f.col[i] = L.off[i], f.stride[i] = L.stride[i];
    f.scale = 1.0f / std::sqrt(float(L.hs));
  };
  const auto policy = [&](index_t league, std::size_t bytes) {
    return Team(space, league, kHost ? 1 : kWarps, kHost ? 1 : 32).set_scratch_size(kLevel, Kokkos::PerTeam(bytes));
  };
  if constexpr (sec) {
    // The primal (y in FP32 too: each direction's y' is centred with it),
    // then the directions in one walk, then the heads' contractions summed.
    FusedForward<false> f0;
    fill(f0, 1);
    f0.keep_y = true;
    f0.carve = carve_of(f0.hp, false);
    record_fused(B, Tc, L, 0, false, rounded != nullptr, true, f0.room.copies());
    Kokkos::parallel_for("gnh::attention::fused::forward", policy(B * L.H * nq, f0.carve.total), f0);
    FusedSecond f;
    fill(f, K);
    f.adj = cut->adj, f.partial = cut->partial;
    f.carve = second_carve_of(f.hp);
    record_second(B, Tc, L, K, rounded != nullptr);
    Kokkos::parallel_for("gnh::attention::fused::second_order", policy(B * L.H * K * nq, f.carve.total), f);
    Kokkos::parallel_for("gnh::attention::fused::cut", Kokkos::RangePolicy<ExecSpace>(space, 0, K * N),
                         FusedCutSum{cut->partial, cut->acc, L.H, N});
  } else {
    FusedForward<tan> f;
    fill(f, std::max<index_t>(K, 1));
    f.carve = carve_of(f.hp, tan);
    record_fused(B, Tc, L, K, tan, rounded != nullptr, keep_y, f.room.copies());
    Kokkos::parallel_for("gnh::attention::fused::forward", policy(B * L.H * f.dirs * nq, f.carve.total), f);
  }
}

bool attention_fused_reverse_fits(const QkvLayout& L) {
  if (!L.valid() || L.hs > kFusedWidth) return false;
  return attention_fused_reverse_scratch_bytes(L.hs) <= attention_fused_scratch_limit();
}

void attention_reverse_fused(const ExecSpace& space, QkvActs<float> dx, Act1<float> D, Act2<float> dy, QkvActs<float> x,
                             Act2<float> y, Act1<float> lse, const QkvLayout& L, index_t B, index_t Tc, void* rounded,
                             bool fp32) {
  const char* who = "gnh::attention::reverse (fused)";
  if (!attention_fused_reverse_fits(L))
    throw std::invalid_argument(cat(who, ": heads of ", L.hs, " columns (at most ", kFusedWidth, ") in ",
                                    rev_carve_of(padded(L.hs)).total,
                                    " bytes of team scratch do not fit this backend"));
  detail::check_qkv(who, x, L, B * Tc);
  detail::check_qkv(who, dx, L, B * Tc);
  require_extent(who, "dy rows", dy.rows(), B * Tc);
  require_extent(who, "dy cols", dy.cols(), L.H * L.hs);
  require_extent(who, "y rows", y.rows(), B * Tc);
  require_extent(who, "y cols", y.cols(), L.H * L.hs);
  require_extent(who, "lse", lse.v.extent(0), B * L.H * Tc);
  require_extent(who, "D", D.v.extent(0), B * L.H * Tc);
  if (rounded && (dx.q.v.data() != dx.k.v.data() || dx.q.v.data() != dx.v.v.data()))
    throw std::logic_error(cat(who, ": rounded adjoints of q, k and v in separate buffers"));
  if (!rounded && !fp32) throw std::logic_error(cat(who, ": the adjoints written nowhere"));
  FusedReverseBase f;
  f.rounded = static_cast<Bf16Storage<float>*>(rounded), f.rcols = dx.q.cols(), f.fp32 = fp32;
  f.q = x.q, f.k = x.k, f.v = x.v, f.dq = dx.q, f.dk = dx.k, f.dv = dx.v, f.dy = dy, f.y = y, f.lse = lse, f.D = D;
  f.Tc = Tc, f.H = L.H, f.G = L.G, f.hs = L.hs, f.hp = padded(L.hs), f.nt = (Tc + kR - 1) / kR;
  for (int i = 0; i < 3; ++i) f.col[i] = L.off[i], f.stride[i] = L.stride[i];
  f.scale = 1.0f / std::sqrt(float(L.hs));
  f.carve = rev_carve_of(f.hp);
  record_fused_reverse(B, Tc, L, rounded != nullptr, fp32);
  const auto policy = [&](index_t league) {
    return Team(space, league, kHost ? 1 : kWarps, kHost ? 1 : 32)
        .set_scratch_size(kLevel, Kokkos::PerTeam(f.carve.total));
  };
  Kokkos::parallel_for("gnh::attention::fused::reverse", policy(B * L.H * f.nt), FusedReverseQueries{f});
  Kokkos::parallel_for("gnh::attention::fused::reverse", policy(B * L.G * f.nt), FusedReverseKeys{f});
}

GNH_FORWARD_SCALARS(GNH_ATTENTION_FUSED_FORWARD, , float)

}  // namespace gnh::kernels
