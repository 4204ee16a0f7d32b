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
//  - teams (GPU-shaped): one team per block of kTeamColumns adjacent columns,
//    vector lanes over the columns (coalesced reads of a row). Stage one: team
//    thread r of kTeamPartials sums rows r, r + R, r + 2R, ... into team
//    scratch. Stage two: the R partials of a column are added in order of r.
//    The order depends on R alone, not on the hardware, so the shape gives the
//    same bits on a host backend (on Serial one thread walking the R
//    partials, on OpenMP the team's threads sharing them) as on a GPU; CTest
//    checks it there.
//
// The default is host on host execution spaces and teams elsewhere.
#pragma once
#include <type_traits>

#include "core/types.hpp"
#include "kernels/rows.hpp"

namespace gnh::kernels {

enum class ColumnShape { host, teams };

constexpr index_t kHostColumns = 16;
constexpr int kTeamColumns = 32;
constexpr int kTeamPartials = 8;

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
  KOKKOS_INLINE_FUNCTION void operator()(const Member& team) const {
    // Locals: the ranges take their bounds by reference, and nvcc has no
    // device definition of a static member.
    const int L = kTeamColumns, R = kTeamPartials;
    const index_t k = team.league_rank() / blocks, c0 = (team.league_rank() % blocks) * L;
    const index_t nc = cols - c0 < L ? cols - c0 : L;
    Scratch part(team.team_scratch(0), 2 * R * L);
    // Stage one: partial r of each column, rows r, r + R, ... in order.
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, R), [&](const int r) {
      Kokkos::parallel_for(Kokkos::ThreadVectorRange(team, L), [&](const int j) {
        S a = S(0), b = S(0);
        if (j < nc)
          for (index_t n = r; n < N; n += R) term(k, n, c0 + j, a, b);
        part(r * L + j) = a;
        part((R + r) * L + j) = b;
      });
    });
    team.team_barrier();
    // Stage two: the partials of a column in order of r.
    Kokkos::parallel_for(Kokkos::TeamVectorRange(team, L), [&](const int j) {
      if (j >= nc) return;
      S a = part(j), b = part(R * L + j);
      for (int r = 1; r < R; ++r) {
        a += part(r * L + j);
        b += part((R + r) * L + j);
      }
      sink(k, c0 + j, a, b);
    });
  }
};

}  // namespace detail

// term(k, n, c, a, b) adds row n's terms of column c (plane k) to a and b;
// sink(k, c, a, b) receives the sums.
template <class S, class Term, class Sink>
void column_sums(const ExecSpace& space, const char* label, index_t K, index_t N, index_t cols, const Term& term,
                 const Sink& sink, ColumnShape shape = default_column_shape()) {
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
  // A team of R threads with L vector lanes on a GPU (team_policy, rows.hpp),
  // walking the R partials between them.
  const F f{term, sink, N, cols, blocks};
  const typename F::Policy policy = detail::team_policy<typename F::Policy>(space, K * blocks, f, R, L)
                                        .set_scratch_size(0, Kokkos::PerTeam(F::Scratch::shmem_size(2 * R * L)));
  Kokkos::parallel_for(label, policy, f);
}

}  // namespace gnh::kernels
