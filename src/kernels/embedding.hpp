// SPDX-License-Identifier: BSD-3-Clause
// Token + position embedding; linear in the parameters, so every mode acts
// plane by plane.
//   forward:  x[b,t,:] = wte[idx[b,t],:] + wpe[t,:]
//   tangent:  x.d[k] = v_k[wte][idx] + v_k[wpe][t];  second: x.dd = 0 (theta'' = 0)
//   reverse:  g[wte][idx[b,t],:] += dx[b,t,:],  g[wpe][t,:] += dx[b,t,:]
// Saves nothing. The reverse is a two-stage scatter without atomics on the
// values: the rows of the batch are grouped by token (a stable counting
// sort of the token ids), then one team per token (and one per position)
// adds its rows in increasing row order, lanes over the channels. Every g
// element receives its terms in the order of the rows, whatever the backend:
// the same bits as a serial loop over the rows. The sort runs on the host
// (the tokens copied there and the groups back), or with a TokenWork on the
// device: integer counts per block of rows and token, their scans, and each
// row's rank among its block's rows of its token, in six kernels on the
// caller's instance, no fence, no allocation (the GPU's path; GPU-shaped
// engines take it on a host too).
#pragma once
#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/planes.hpp"
#include "kernels/check.hpp"
#include "kernels/gemm_ledger.hpp"
#include "kernels/op.hpp"
#include "kernels/instances.hpp"

namespace gnh::kernels {

// The mode follows from S (planes_of). wpe < 0: no position embedding (SPEC §11).
template <class S>
void embedding_forward(const ExecSpace& space, Act2<base_t<S>> x, Span2<const std::int32_t> tokens, Params<base_t<S>> p,
                       index_t wte, index_t wpe) {
  keep_planes<S>(x, p);
  const index_t B = tokens.extent(0), Tc = tokens.extent(1), C = x.cols();
  const index_t K = x.d.extent(0);
  require_extent("gnh::embedding::forward", "x rows", x.rows(), B * Tc);
  // Plane q = 0 is the value, q = 1 + k the tangent k; each plane's rows are
  // written along the channels (contiguous on the host, coalesced on a GPU).
  // One element at a time over all planes wrote K + 1 rows N x C apart per
  // element: 5% of the second-order forward at K = 16 (Zen 5, preset small).
  using Policy = Kokkos::MDRangePolicy<ExecSpace, Kokkos::Rank<3, Kokkos::Iterate::Right, Kokkos::Iterate::Right>,
                                       Kokkos::IndexType<index_t>>;
  // Each plane's rows written and their wte and wpe rows read; the tokens.
  Traffic("gnh::embedding::forward")
      .add(double((K + 1) * B * Tc * C), (wpe >= 0 ? 3 : 2) * sizeof(base_t<S>), 2)
      .add(double(B * Tc), sizeof(std::int32_t), 1);
  if (x.dd.extent(0) > 0) record_fill(double(x.dd.size()), sizeof(base_t<S>), 2);
  Kokkos::parallel_for(
      "gnh::embedding::forward", Policy(space, {0, 0, 0}, {K + 1, B * Tc, C}),
      KOKKOS_LAMBDA(const index_t q, const index_t n, const index_t c) {
        const index_t t = n % Tc;
        const index_t iw = wte + index_t(tokens(n / Tc, t)) * C + c, ip = wpe + t * C + c;
        if (q == 0) x.v(n, c) = wpe >= 0 ? p.v(iw) + p.v(ip) : p.v(iw);
        else x.d(q - 1, n, c) = wpe >= 0 ? p.d(q - 1, iw) + p.d(q - 1, ip) : p.d(q - 1, iw);
      });
  if (x.dd.extent(0) > 0) Kokkos::deep_copy(space, x.dd, base_t<S>(0));
}

namespace detail {
// The rows of a batch grouped by token id: group u holds token(u) and the rows
// rows(start(u)) .. rows(start(u + 1) - 1), in increasing order.
struct TokenGroups {
  View1<index_t> start, rows, token;
  index_t count = 0;
};
// Everything on the given instance: the tokens come to the host after the
// kernels queued before (a fence of that instance only), and the groups go
// back on it.
inline TokenGroups group_rows_by_token(const ExecSpace& space, Span2<const std::int32_t> tokens) {
  const index_t N = tokens.extent(0) * tokens.extent(1);
  const Kokkos::View<std::int32_t**, Kokkos::LayoutRight, Kokkos::HostSpace> h(
      Kokkos::view_alloc(Kokkos::WithoutInitializing, "gnh::embedding::tokens"), tokens.extent(0), tokens.extent(1));
  Kokkos::deep_copy(space, h, tokens);
  space.fence();
  const std::int32_t* tok = h.data();
  index_t V = 0;
  for (index_t n = 0; n < N; ++n) {
    if (tok[n] < 0)
      throw std::invalid_argument("gnh::embedding::reverse: negative token id at row " + std::to_string(n));
    V = std::max<index_t>(V, index_t(tok[n]) + 1);
  }
  std::vector<index_t> first(std::size_t(V) + 1, 0);
  for (index_t n = 0; n < N; ++n) ++first[std::size_t(tok[n]) + 1];
  for (index_t v = 0; v < V; ++v) first[std::size_t(v) + 1] += first[std::size_t(v)];
  TokenGroups g;
  for (index_t v = 0; v < V; ++v) g.count += first[std::size_t(v) + 1] > first[std::size_t(v)] ? 1 : 0;
  using Kokkos::view_alloc;
  g.start = View1<index_t>(view_alloc(space, Kokkos::WithoutInitializing, "gnh::embedding::group_start"), g.count + 1);
  g.rows = View1<index_t>(view_alloc(space, Kokkos::WithoutInitializing, "gnh::embedding::group_rows"), N);
  g.token = View1<index_t>(view_alloc(space, Kokkos::WithoutInitializing, "gnh::embedding::group_token"), g.count);
  auto hs = Kokkos::create_mirror_view(g.start);
  auto hr = Kokkos::create_mirror_view(g.rows);
  auto ht = Kokkos::create_mirror_view(g.token);
  std::vector<index_t> next(first.begin(), first.end() - 1);
  for (index_t n = 0; n < N; ++n) hr(next[std::size_t(tok[n])]++) = n;  // stable: rows ascend within a token
  index_t u = 0;
  for (index_t v = 0; v < V; ++v)
    if (first[std::size_t(v) + 1] > first[std::size_t(v)]) {
      hs(u) = first[std::size_t(v)];
      ht(u) = v;
      ++u;
    }
  hs(g.count) = N;
  Kokkos::deep_copy(space, g.start, hs);
  Kokkos::deep_copy(space, g.rows, hr);
  Kokkos::deep_copy(space, g.token, ht);
  // The host copies go out of scope here: the copies must have read them.
  space.fence();
  return g;
}

// The device grouping's working memory for N rows over a vocabulary of V:
// rows in blocks of kGroupRows, per block and token a count (then its
// offset), per token its rows (then its first place), per row its rank in
// its block among the rows of its token, and the grouped rows.
struct TokenWork {
  static constexpr index_t kGroupRows = 512;
  index_t N = 0, V = 0;
  View1<std::int32_t> counts, start, rank, rows;
  static index_t blocks(index_t N) { return (N + kGroupRows - 1) / kGroupRows; }
  static std::size_t bytes(index_t N, index_t V) {
    return sizeof(std::int32_t) * std::size_t(blocks(N) * V + (V + 1) + 2 * N);
  }
  TokenWork() = default;
  TokenWork(index_t N_, index_t V_)
      : N(N_),
        V(V_),
        counts(Kokkos::view_alloc(Kokkos::WithoutInitializing, "gnh::embedding::counts"), blocks(N_) * V_),
        start(Kokkos::view_alloc(Kokkos::WithoutInitializing, "gnh::embedding::start"), V_ + 1),
        rank(Kokkos::view_alloc(Kokkos::WithoutInitializing, "gnh::embedding::rank"), N_),
        rows(Kokkos::view_alloc(Kokkos::WithoutInitializing, "gnh::embedding::rows"), N_) {}
};

// Ids outside [0, V) (the token files are checked when read) take no part.
struct CountTokens {
  Span1<const std::int32_t> tok;
  TokenWork w;
  template <class Member>
  KOKKOS_INLINE_FUNCTION void operator()(const Member& team) const {
    const index_t b = team.league_rank(), n0 = b * TokenWork::kGroupRows;
    const index_t n1 = n0 + TokenWork::kGroupRows < w.N ? n0 + TokenWork::kGroupRows : w.N;
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, n0, n1), [&](const index_t n) {
      const std::int32_t v = tok(n);
      if (v < 0 || index_t(v) >= w.V) return;
      std::int32_t r = 0;
      for (index_t m = n0; m < n; ++m) r += tok(m) == v ? 1 : 0;
      w.rank(n) = r;
      Kokkos::atomic_add(&w.counts(b * w.V + v), std::int32_t(1));  // integers: any order, the same count
    });
  }
};
// Per token: its blocks' counts into their offsets, and its total.
struct TokenOffsets {
  TokenWork w;
  index_t blocks;
  KOKKOS_INLINE_FUNCTION void operator()(const index_t v) const {
    std::int32_t run = 0;
    for (index_t b = 0; b < blocks; ++b) {
      const std::int32_t c = w.counts(b * w.V + v);
      w.counts(b * w.V + v) = run;
      run += c;
    }
    w.start(v) = run;
  }
};
// The totals into each token's first place (an exclusive scan; start(V) = rows).
struct TokenStarts {
  using value_type = std::int32_t;
  TokenWork w;
  KOKKOS_INLINE_FUNCTION void operator()(const index_t v, std::int32_t& sum, const bool final) const {
    const std::int32_t c = v < w.V ? w.start(v) : 0;
    if (final) w.start(v) = sum;
    sum += c;
  }
};
struct PlaceRows {
  Span1<const std::int32_t> tok;
  TokenWork w;
  KOKKOS_INLINE_FUNCTION void operator()(const index_t n) const {
    const std::int32_t v = tok(n);
    if (v < 0 || index_t(v) >= w.V) return;
    w.rows(w.start(v) + w.counts((n / TokenWork::kGroupRows) * w.V + v) + w.rank(n)) = std::int32_t(n);
  }
};

// The rows of the batch grouped by token on the device, into w.start and w.rows.
inline void group_rows_on_device(const ExecSpace& space, Span2<const std::int32_t> tokens, const TokenWork& w) {
  const index_t N = tokens.extent(0) * tokens.extent(1), blocks = TokenWork::blocks(N);
  if (N != w.N)
    throw std::logic_error("gnh::embedding::reverse: token work for " + std::to_string(w.N) + " rows, batch of " +
                           std::to_string(N));
  const Span1<const std::int32_t> tok(tokens.data(), N);
  // Counts per block of 512 rows and token: they span the rows and the vocabulary.
  record_fill(double(w.counts.size()), sizeof(std::int32_t), 2);
  Traffic("gnh::embedding::count_tokens").add(double(N), sizeof(std::int32_t), 1);
  Traffic("gnh::embedding::token_offsets").add(double(w.counts.size()), 2 * sizeof(std::int32_t), 2);
  Traffic("gnh::embedding::token_starts").add(double(2 * w.V), sizeof(std::int32_t), 1).add(2, sizeof(std::int32_t), 0);
  Traffic("gnh::embedding::place_rows").add(double(3 * N), sizeof(std::int32_t), 1);
  Kokkos::deep_copy(space, w.counts, std::int32_t(0));
  Kokkos::parallel_for("gnh::embedding::count_tokens", TeamRange(space, blocks, Kokkos::AUTO), CountTokens{tok, w});
  Kokkos::parallel_for("gnh::embedding::token_offsets", range(space, w.V), TokenOffsets{w, blocks});
  Kokkos::parallel_scan("gnh::embedding::token_starts", range(space, w.V + 1), TokenStarts{w});
  Kokkos::parallel_for("gnh::embedding::place_rows", range(space, N), PlaceRows{tok, w});
}

// Row n of dx (all planes) added to the gradient at base (of its sequence's
// own gradient where g is per sequence), lanes over the channels.
template <class Member, class T>
KOKKOS_INLINE_FUNCTION void add_row(const Member& team, const Grads<T>& g, const Act2<T>& dx, index_t base, index_t n,
                                    index_t C, index_t K) {
  const index_t at = base + g.row_offset(n);
  Kokkos::parallel_for(Kokkos::TeamVectorRange(team, C), [&](const index_t c) {
    g.v(at + c) += dx.v(n, c);
    for (index_t k = 0; k < K; ++k) g.d(k, base + c) += dx.d(k, n, c);
  });
}

// Team v adds the rows of token v (grouped on the device) in increasing order.
template <class T>
struct AddTokenRows {
  Grads<T> g;
  Act2<T> dx;
  View1<std::int32_t> start, rows;
  index_t wte, C, K;
  template <class Member>
  KOKKOS_INLINE_FUNCTION void operator()(const Member& team) const {
    const index_t v = team.league_rank(), base = wte + v * C;
    for (index_t j = start(v); j < start(v + 1); ++j) add_row(team, g, dx, base, index_t(rows(j)), C, K);
  }
};
}  // namespace detail

// work: the device grouping (a TokenWork for this batch's rows and the
// model's vocabulary), else the host's.
template <class S>
void embedding_reverse(const ExecSpace& space, Grads<base_t<S>> g, Act2<base_t<S>> dx, Span2<const std::int32_t> tokens,
                       index_t wte, index_t wpe, const detail::TokenWork* work = nullptr) {
  keep_planes<S>(g, dx);
  const index_t B = tokens.extent(0), Tc = tokens.extent(1), C = dx.cols();
  const index_t K = dx.d.extent(0);
  require_extent("gnh::embedding::reverse", "dx rows", dx.rows(), B * Tc);
  if (K > 0) require_summed("gnh::embedding::reverse", g);
  // Per sequence, each sequence's rows go to its own gradient: the teams below
  // still own a position or a token each, now in every sequence's copy, and
  // take the rows in the same increasing order.
  const index_t copies = g.per_sequence() ? sequences_of("gnh::embedding::reverse", g, B * Tc) : 1;
  using Policy = TeamRange;
  using Member = typename Policy::member_type;
  // Positions: team t adds rows b * Tc + t for b = 0, 1, ...: each plane's
  // rows read, the gradient's rows read and written once a row.
  if (wpe >= 0)
    Traffic("gnh::embedding::reverse::wpe")
        .add(double((K + 1) * B * Tc * C), sizeof(base_t<S>), 2)
        .add(double(2 * (K + 1) * copies * Tc * C), sizeof(base_t<S>), 2);
  Traffic("gnh::embedding::reverse::wte")
      .add(double((K + 1) * B * Tc * C), 3 * sizeof(base_t<S>), 2)
      .add(double(B * Tc), 2 * sizeof(std::int32_t), 1);
  if (wpe >= 0)
    Kokkos::parallel_for(
        "gnh::embedding::reverse::wpe", Policy(space, Tc, Kokkos::AUTO), KOKKOS_LAMBDA(const Member& team) {
          const index_t t = team.league_rank(), base = wpe + t * C;
          for (index_t b = 0; b < B; ++b) detail::add_row(team, g, dx, base, b * Tc + t, C, K);
        });
  if (work) {
    // Tokens: team v adds the rows of token v in increasing order.
    detail::group_rows_on_device(space, tokens, *work);
    Kokkos::parallel_for("gnh::embedding::reverse::wte", Policy(space, work->V, Kokkos::AUTO),
                         detail::AddTokenRows<base_t<S>>{g, dx, work->start, work->rows, wte, C, K});
    return;
  }
  // Tokens: team u adds the rows of its token in increasing order.
  const detail::TokenGroups groups = detail::group_rows_by_token(space, tokens);
  const View1<index_t> start = groups.start, rows = groups.rows, token = groups.token;
  Kokkos::parallel_for(
      "gnh::embedding::reverse::wte", Policy(space, groups.count, Kokkos::AUTO), KOKKOS_LAMBDA(const Member& team) {
        const index_t u = team.league_rank(), base = wte + token(u) * C;
        for (index_t j = start(u); j < start(u + 1); ++j) detail::add_row(team, g, dx, base, rows(j), C, K);
      });
}

// The op contract (kernels/op.hpp): tokens (B, T) -> x (B*T, C), no input
// activation (in = 0); theta = [wte (V, C) | wpe (T, C)]. The tokens repeat
// (i * 3 mod V), so the reverse's accumulation over repeated rows is exercised.
template <class T>
struct EmbeddingOp {
  static constexpr const char* name = "embedding";
  index_t B, Tc, V, C;
  View2<std::int32_t> tokens;
  EmbeddingOp(index_t B_, index_t T_, index_t V_, index_t C_) : B(B_), Tc(T_), V(V_), C(C_), tokens("tokens", B_, T_) {
    auto h = Kokkos::create_mirror_view(tokens);
    for (index_t i = 0; i < B * Tc; ++i) h.data()[i] = std::int32_t((i * 3) % V);
    Kokkos::deep_copy(tokens, h);
  }
  static EmbeddingOp at(const OpDims& d, index_t) { return EmbeddingOp(d.B, d.T, d.V, d.C); }
  OpSizes sizes() const { return {B * Tc, 0, C, (V + Tc) * C}; }
  std::vector<OpExtent> saved() const { return {}; }
  double flops(OpMode, index_t) const { return 0.0; }
  template <class S>
  void forward(const ExecSpace& space, Act2<T> y, Act2<T>, Params<T> p, const OpSaved<T>&) const {
    embedding_forward<S>(space, y, tokens, p, 0, V * C);
  }
  template <class S>
  void reverse(const ExecSpace& space, Act2<T>, Grads<T> g, Act2<T> dy, Act2<T>, Act2<T>, Params<T>,
               const OpSaved<T>&) const {
    embedding_reverse<S>(space, g, dy, tokens, 0, V * C);
  }
};

// Compiled once, in gnh_core (kernels/instances.hpp).
#define GNH_EMBEDDING_FORWARD(EXT, S)                                                                  \
  EXT template void embedding_forward<S>(const ExecSpace&, Act2<base_t<S>>, Span2<const std::int32_t>, \
                                         Params<base_t<S>>, index_t, index_t);
#define GNH_EMBEDDING_REVERSE(EXT, S)                                                         \
  EXT template void embedding_reverse<S>(const ExecSpace&, Grads<base_t<S>>, Act2<base_t<S>>, \
                                         Span2<const std::int32_t>, index_t, index_t, const detail::TokenWork*);
#define GNH_EMBEDDING(EXT, T) \
  GNH_FORWARD_SCALARS(GNH_EMBEDDING_FORWARD, EXT, T) GNH_REVERSE_SCALARS(GNH_EMBEDDING_REVERSE, EXT, T)
GNH_EMBEDDING(extern, float)
GNH_EMBEDDING(extern, double)

}  // namespace gnh::kernels
