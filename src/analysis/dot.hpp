// SPDX-License-Identifier: BSD-3-Clause
// The one dot product of the analysis: sum_i a_i b_i (or sum_i |a_i b_i|, or
// sum_i a_i w_i b_i), widened to double, in an order fixed by the elements'
// global indices alone: the same bits whatever the host thread count and
// however the vector is cut into slices at multiples of kDotChunk (a sharded
// vector's dot, each rank summing its slices' chunks, equals the whole
// one's). The operands may differ in type (a direction in the engine's
// precision against an H v in double).
//
// The order: element g (of global index g; a vector's first element has the
// index `origin`) belongs to chunk g / kDotChunk and, within it, to lane
// g % kDotLanes; each lane adds its terms in increasing g, a chunk's lanes
// are added pairwise (lane l += lane l + w for w = 16, 8, 4, 2, 1), and the
// chunks' partial sums, indexed by their chunk numbers, are summed again by
// the same rule until one value is left. On a host a team of one thread
// takes a chunk (its lanes as 32 accumulators, 32 terms at a time); on a GPU
// a warp does, a thread per lane, reading consecutive elements: the same
// additions in the same order, so the same bits on both.
//
// Functors, not lambdas: nvcc cannot name an extended lambda's enclosing
// function template when two of its parameters are template types.
#pragma once
#include <type_traits>

#include "core/types.hpp"

namespace gnh {

constexpr index_t kDotLanes = 32;
constexpr index_t kDotChunk = 4096;  // a multiple of kDotLanes

template <class A, class B>
struct DotTerm {
  const A* a;
  const B* b;
  bool absolute;
  KOKKOS_INLINE_FUNCTION double operator()(const index_t i) const {
    const double p = double(a[i]) * double(b[i]);
    return absolute && p < 0 ? -p : p;
  }
};

// a_i w_i b_i (a P-weighted inner product).
template <class A, class B>
struct WeightedDotTerm {
  const A* a;
  const double* w;
  const B* b;
  KOKKOS_INLINE_FUNCTION double operator()(const index_t i) const { return double(a[i]) * w[i] * double(b[i]); }
};

// The chunks' partial sums of the level below.
struct PartialTerm {
  const double* p;
  KOKKOS_INLINE_FUNCTION double operator()(const index_t i) const { return p[i]; }
};

// One team per chunk of the global indices [origin, origin + n): out(c) is
// the partial sum of chunk origin / kDotChunk + c.
template <class Term>
struct ChunkSums {
  Term term;
  index_t n, origin;
  View1<double> out;

  KOKKOS_INLINE_FUNCTION void operator()(const TeamRange::member_type& m) const {
    const index_t c = origin / kDotChunk + m.league_rank();
    const index_t g0 = c * kDotChunk > origin ? c * kDotChunk : origin;
    const index_t g1 = (c + 1) * kDotChunk < origin + n ? (c + 1) * kDotChunk : origin + n;
    TeamScratch<double> lanes(m.team_scratch(0), kDotLanes);
    if (m.team_size() == 1) {
      double acc[kDotLanes];
      for (index_t l = 0; l < kDotLanes; ++l) acc[l] = 0;
      index_t g = g0;
      for (; g < g1 && g % kDotLanes != 0; ++g) acc[g % kDotLanes] += term(g - origin);
      for (; g + kDotLanes <= g1; g += kDotLanes)
        for (index_t l = 0; l < kDotLanes; ++l) acc[l] += term(g + l - origin);
      for (; g < g1; ++g) acc[g % kDotLanes] += term(g - origin);
      for (index_t l = 0; l < kDotLanes; ++l) lanes(l) = acc[l];
    } else {
      for (index_t l = m.team_rank(); l < kDotLanes; l += m.team_size()) {
        double s = 0;
        for (index_t g = g0 + ((l - g0 % kDotLanes) + kDotLanes) % kDotLanes; g < g1; g += kDotLanes)
          s += term(g - origin);
        lanes(l) = s;
      }
      m.team_barrier();
    }
    const index_t at = m.league_rank();
    View1<double> o = out;
    Kokkos::single(Kokkos::PerTeam(m), [=]() {
      for (index_t w = kDotLanes / 2; w >= 1; w /= 2)
        for (index_t l = 0; l < w; ++l) lanes(l) += lanes(l + w);
      o(at) = lanes(0);
    });
  }
};

// How many chunks the global indices [origin, origin + n) touch.
inline index_t dot_chunks(index_t n, index_t origin) {
  return n == 0 ? 0 : (origin + n - 1) / kDotChunk - origin / kDotChunk + 1;
}

// The chunks' partial sums of sum_i term(i) over [origin, origin + n), one
// per chunk touched (dot_chunks): what a rank holding a slice contributes.
template <class Term>
View1<double> chunk_sums(const ExecSpace& space, const Term& term, index_t n, index_t origin) {
  const index_t chunks = dot_chunks(n, origin);
  View1<double> out(Kokkos::view_alloc(space, Kokkos::WithoutInitializing, "gnh::analysis::dot_chunks"), chunks);
  if (chunks == 0) return out;
  const int team = std::is_same<ExecSpace::memory_space, Kokkos::HostSpace>::value ? 1 : int(kDotLanes);
  TeamRange policy(space, chunks, team);
  policy.set_scratch_size(0, Kokkos::PerTeam(TeamScratch<double>::shmem_size(kDotLanes)));
  Kokkos::parallel_for("gnh::analysis::dot", policy, ChunkSums<Term>{term, n, origin, out});
  return out;
}

// The sum of the partial sums of chunks first .. first + count - 1 (all of
// a range's, gathered from its slices), by the same rule, level by level.
inline double sum_chunks(const ExecSpace& space, View1<double> partial, index_t first) {
  index_t n = partial.extent(0), origin = first;
  if (n == 0) return 0;
  while (n > 1) {
    partial = chunk_sums(space, PartialTerm{partial.data()}, n, origin);
    n = partial.extent(0);
    origin /= kDotChunk;
  }
  space.fence();
  double s = 0;
  Kokkos::deep_copy(s, Kokkos::subview(partial, 0));
  return s;
}

// sum_i a_i b_i (|a_i b_i| with absolute) over n elements whose first has the
// global index origin.
template <class A, class B>
double dot(const ExecSpace& space, const A* a, const B* b, index_t n, bool absolute = false, index_t origin = 0) {
  return sum_chunks(space, chunk_sums(space, DotTerm<A, B>{a, b, absolute}, n, origin), origin / kDotChunk);
}

// sum_i a_i w_i b_i in double (a P-weighted inner product).
template <class A, class B>
double weighted_dot(const ExecSpace& space, const A* a, const double* w, const B* b, index_t n, index_t origin = 0) {
  return sum_chunks(space, chunk_sums(space, WeightedDotTerm<A, B>{a, w, b}, n, origin), origin / kDotChunk);
}

}  // namespace gnh
