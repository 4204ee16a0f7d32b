// SPDX-License-Identifier: BSD-3-Clause
// Column sums of per-row terms: for each plane k < K and column c < cols,
//   (a, b)[k][c] = sum over rows n < N of term(k, n, c)
// handed to sink(k, c, a, b) once. They are the reverse's bias and
// LayerNorm-parameter gradients (two sums per column: dw and db). No atomics,
// and a fixed order of additions, so the bits are the same run to run. Two
// shapes, one contract:
//
//  - host: one task per block of kHostColumns adjacent columns; rows outer
//    and the block's columns inner, so reads are contiguous and the inner loop
//    vectorises. Each column is summed in row order.
//  - teams (GPU-shaped): one team per block of kTeamColumns adjacent columns
//    and block of rows, vector lanes over the columns (coalesced reads of a
//    row). In a team, thread r of kTeamPartials sums its block's rows r, r +
//    R, r + 2R, ... into team scratch, and the R partials of a column are
//    added in order of r. With one row block (column_row_blocks) that is the
//    column's sum, handed to the sink; with several, each block's sum goes to
//    a partials buffer and a second kernel adds a column's blocks in order.
//    The row blocks are as many as it takes for the teams to fill a GPU's
//    multiprocessors (a LayerNorm's C / 32 column blocks alone are 10 teams
//    at C = 320 in the gradient), each at least kMinBlockRows rows.
//    The order depends on R and the sizes alone, not on the hardware, so the
//    shape gives the same bits on a host backend (on Serial one thread
//    walking the R partials, on OpenMP the team's threads sharing them) as on
//    a GPU; CTest checks it there.
//
// The default is host on host execution spaces and teams elsewhere.
#pragma once
#include <algorithm>
#include <type_traits>

#include "core/types.hpp"
#include "kernels/rows.hpp"

namespace gnh::kernels {

enum class ColumnShape { host, teams };

constexpr index_t kHostColumns = 16;
constexpr int kTeamColumns = 32;
constexpr int kTeamPartials = 8;
constexpr index_t kFillTeams = 4 * 132;  // four teams a multiprocessor of an H200
constexpr index_t kMinBlockRows = 256;

// Row blocks of the teams shape for K planes of `cols` columns over N rows:
// enough for kFillTeams teams, no block under kMinBlockRows rows (at least 1).
inline index_t column_row_blocks(index_t K, index_t N, index_t cols) {
  const index_t teams = K * ((cols + kTeamColumns - 1) / kTeamColumns);
  const index_t want = (kFillTeams + teams - 1) / std::max<index_t>(1, teams);
  return std::max<index_t>(1, std::min(want, N / kMinBlockRows));
}
// Rows per block (the last one shorter).
inline index_t column_block_rows(index_t N, index_t row_blocks) { return (N + row_blocks - 1) / row_blocks; }

constexpr ColumnShape default_column_shape() {
  return std::is_same<ExecSpace, Kokkos::DefaultHostExecutionSpace>::value ? ColumnShape::host : ColumnShape::teams;
}

namespace detail {

// Functors, not lambdas: nvcc cannot name an extended lambda's enclosing
// function template when its template arguments are closure types.
template <class S, class Term, class Sink>
struct HostColumnSums {
  Term term;
  Sink sink;
  index_t N, cols, blocks;
  KOKKOS_INLINE_FUNCTION void operator()(const index_t i) const {
    constexpr index_t CB = kHostColumns;
    const index_t k = i / blocks, c0 = (i % blocks) * CB, nc = cols - c0 < CB ? cols - c0 : CB;
    S a[CB], b[CB];
    for (index_t j = 0; j < CB; ++j) a[j] = b[j] = S(0);
    for (index_t n = 0; n < N; ++n)
      for (index_t j = 0; j < nc; ++j) term(k, n, c0 + j, a[j], b[j]);
    for (index_t j = 0; j < nc; ++j) sink(k, c0 + j, a[j], b[j]);
  }
};

template <class S, class Term, class Sink>
struct TeamColumnSums {
  using Policy = TeamRange;
  using Member = typename Policy::member_type;
  using Scratch = TeamScratch<S>;
  Term term;
  Sink sink;
  index_t N, cols, blocks;
  index_t row_blocks, block_rows;  // row_blocks > 1: the block sums go to partial (K, row_blocks, 2, cols)
  S* partial;
  KOKKOS_INLINE_FUNCTION void operator()(const Member& team) const {
    // Locals: the ranges take their bounds by reference, and nvcc has no
    // device definition of a static member.
    const int L = kTeamColumns, R = kTeamPartials;
    const index_t rb = team.league_rank() % row_blocks, cb = team.league_rank() / row_blocks;
    const index_t k = cb / blocks, c0 = (cb % blocks) * L;
    const index_t nc = cols - c0 < L ? cols - c0 : L;
    const index_t n0 = rb * block_rows, n1 = n0 + block_rows < N ? n0 + block_rows : N;
    Scratch part(team.team_scratch(0), 2 * R * L);
    // Partial r of each column, the block's rows n0 + r, n0 + r + R, ... in order.
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, R), [&](const int r) {
      Kokkos::parallel_for(Kokkos::ThreadVectorRange(team, L), [&](const int j) {
        S a = S(0), b = S(0);
        if (j < nc)
          for (index_t n = n0 + r; n < n1; n += R) term(k, n, c0 + j, a, b);
        part(r * L + j) = a;
        part((R + r) * L + j) = b;
      });
    });
    team.team_barrier();
    // The partials of a column in order of r: the column's sum, or its block's.
    Kokkos::parallel_for(Kokkos::TeamVectorRange(team, L), [&](const int j) {
      if (j >= nc) return;
      S a = part(j), b = part(R * L + j);
      for (int r = 1; r < R; ++r) {
        a += part(r * L + j);
        b += part((R + r) * L + j);
      }
      if (row_blocks == 1) {
        sink(k, c0 + j, a, b);
        return;
      }
      S* const p = partial + ((k * row_blocks + rb) * 2) * cols + c0 + j;
      p[0] = a;
      p[cols] = b;
    });
  }
};

// The second kernel: column c of plane k, its row blocks' sums in order.
template <class S, class Sink>
struct BlockColumnSums {
  Sink sink;
  index_t cols, row_blocks;
  const S* partial;
  KOKKOS_INLINE_FUNCTION void operator()(const index_t i) const {
    const index_t k = i / cols, c = i % cols;
    const S* p = partial + (k * row_blocks * 2) * cols + c;
    S a = p[0], b = p[cols];
    for (index_t rb = 1; rb < row_blocks; ++rb) {
      a += p[rb * 2 * cols];
      b += p[(rb * 2 + 1) * cols];
    }
    sink(k, c, a, b);
  }
};

// The partials buffer of the teams shape's row blocks: one per process, grown
// to the largest call and kept (a few hundred KB: K 2 cols values a block),
// so a call allocates nothing after the first of its size; released when
// Kokkos finalizes. Calls run on one instance at a time (the engine's).
inline View1<char>& column_partials() {
  static View1<char> v;
  return v;
}
inline void* column_partials(std::size_t bytes) {
  View1<char>& v = column_partials();
  if (v.extent(0) < bytes) {
    if (v.extent(0) == 0) Kokkos::push_finalize_hook([] { column_partials() = View1<char>(); });
    v = View1<char>();
    v = View1<char>(Kokkos::view_alloc(Kokkos::WithoutInitializing, "gnh::column_sums::partials"), bytes);
  }
  return v.data();
}

}  // namespace detail

// term(k, n, c, a, b) adds row n's terms of column c (plane k) to a and b;
// sink(k, c, a, b) receives the sums.
// row_blocks (teams shape): 0 for column_row_blocks, else that many (tests).
template <class S, class Term, class Sink>
void column_sums(const ExecSpace& space, const char* label, index_t K, index_t N, index_t cols, const Term& term,
                 const Sink& sink, ColumnShape shape = default_column_shape(), index_t row_blocks = 0) {
  if (K <= 0 || cols <= 0) return;
  if (shape == ColumnShape::host) {
    const index_t blocks = (cols + kHostColumns - 1) / kHostColumns;
    Kokkos::parallel_for(label, range(space, K * blocks),
                         detail::HostColumnSums<S, Term, Sink>{term, sink, N, cols, blocks});
    return;
  }
  using F = detail::TeamColumnSums<S, Term, Sink>;
  constexpr int L = kTeamColumns, R = kTeamPartials;
  const index_t blocks = (cols + L - 1) / L;
  const index_t nb = row_blocks > 0 ? row_blocks : column_row_blocks(K, N, cols);
  S* const partial =
      nb > 1 ? static_cast<S*>(detail::column_partials(sizeof(S) * std::size_t(K * nb * 2 * cols))) : nullptr;
  // A team of R threads with L vector lanes on a GPU (team_policy, rows.hpp),
  // walking the R partials between them.
  const F f{term, sink, N, cols, blocks, nb, column_block_rows(N, nb), partial};
  const typename F::Policy policy = detail::team_policy<typename F::Policy>(space, K * blocks * nb, f, R, L)
                                        .set_scratch_size(0, Kokkos::PerTeam(F::Scratch::shmem_size(2 * R * L)));
  Kokkos::parallel_for(label, policy, f);
  if (nb > 1)
    Kokkos::parallel_for(label, range(space, K * cols), detail::BlockColumnSums<S, Sink>{sink, cols, nb, partial});
}

}  // namespace gnh::kernels
