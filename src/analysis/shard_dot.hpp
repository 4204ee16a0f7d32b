// SPDX-License-Identifier: BSD-3-Clause
// Dot products of vectors held as slices (parallel.parameter_shards): each
// member takes its slice's chunk sums (analysis/dot.hpp), the group gathers
// them in member order, which is chunk order (slices are cut at chunk
// boundaries, ShardLayout), and every member sums them by dot.hpp's rule:
// the bits of dot() on the whole vectors, whatever the number of slices.
#pragma once
#include <utility>
#include <vector>

#include "analysis/dot.hpp"
#include "analysis/team.hpp"

namespace gnh {

static_assert(ShardLayout::kChunk == kDotChunk, "slices are cut at the dot product's chunks");

namespace shard_detail {
// The partial sums of a device view, on the host.
inline std::vector<double> host_values(View1<double> v) {
  std::vector<double> h(v.extent(0));
  Kokkos::deep_copy(View1<double, HostSpace>(h.data(), h.size()), v);
  return h;
}
// Chunk sums gathered on the host back on the device, summed from chunk `first`.
inline double sum_gathered(const ExecSpace& space, const std::vector<double>& all, index_t first) {
  if (all.empty()) return 0;
  View1<double> d("gnh::analysis::dot_gathered", all.size());
  Kokkos::deep_copy(d, View1<double, HostSpace>(const_cast<double*>(all.data()), all.size()));
  return sum_chunks(space, d, first);
}
}  // namespace shard_detail

// sum_i term(i) over the whole order, each member holding its slice: term
// indexes the slice (0 .. n - 1).
template <class Term>
double sharded_sum(const ExecSpace& space, const Slice& s, const Term& term) {
  View1<double> part = chunk_sums(space, term, s.n, s.begin);
  if (s.whole()) return sum_chunks(space, part, 0);
  space.fence();
  return shard_detail::sum_gathered(space, s.group->gather_values(shard_detail::host_values(part)), 0);
}

// sum_i a_i b_i (|a_i b_i| with absolute) of two slices.
template <class A, class B>
double sharded_dot(const ExecSpace& space, const Slice& s, const A* a, const B* b, bool absolute = false) {
  return sharded_sum(space, s, DotTerm<A, B>{a, b, absolute});
}

// sum_i a_i w_i b_i of three slices.
template <class A, class B>
double sharded_weighted_dot(const ExecSpace& space, const Slice& s, const A* a, const double* w, const B* b) {
  return sharded_sum(space, s, WeightedDotTerm<A, B>{a, w, b});
}

// sum_i a_i b_i over each range [offsets[k], offsets[k + 1]) of the whole
// order (a partition's blocks), a and b this member's slices: each range's
// part in the slice summed by chunks, every range's chunks gathered at once.
template <class A, class B>
std::vector<double> sharded_range_dots(const ExecSpace& space, const Slice& s, const A* a, const B* b,
                                       const std::vector<std::int64_t>& offsets) {
  const std::size_t n_ranges = offsets.size() - 1;
  std::vector<double> out(n_ranges);
  // The part of range k in slice r: [lo, hi).
  auto part_of = [&](std::size_t k, int r) {
    const index_t lo = std::max<index_t>(index_t(offsets[k]), s.layout.begin(r));
    const index_t hi = std::min<index_t>(index_t(offsets[k + 1]), s.layout.end(r));
    return std::pair<index_t, index_t>(lo, hi > lo ? hi : lo);
  };
  if (s.whole()) {
    for (std::size_t k = 0; k < n_ranges; ++k) {
      const index_t lo = index_t(offsets[k]), n = index_t(offsets[k + 1]) - lo;
      out[k] = dot(space, a + lo, b + lo, n, false, lo);
    }
    return out;
  }
  std::vector<double> mine;
  const int me = s.group->rank();
  for (std::size_t k = 0; k < n_ranges; ++k) {
    const auto [lo, hi] = part_of(k, me);
    if (hi == lo) continue;
    const auto part = shard_detail::host_values(
        chunk_sums(space, DotTerm<A, B>{a + (lo - s.begin), b + (lo - s.begin), false}, hi - lo, lo));
    mine.insert(mine.end(), part.begin(), part.end());
  }
  space.fence();
  const std::vector<double> all = s.group->gather_values(mine);
  // Member r's values are its ranges' chunks in range order; range k's
  // chunks are member 0's, then member 1's, ...: chunk order.
  std::vector<std::size_t> at(std::size_t(s.layout.R), 0);
  for (int r = 1; r < s.layout.R; ++r) {
    at[std::size_t(r)] = at[std::size_t(r) - 1];
    for (std::size_t k = 0; k < n_ranges; ++k) {
      const auto [lo, hi] = part_of(k, r - 1);
      at[std::size_t(r)] += std::size_t(dot_chunks(hi - lo, lo));
    }
  }
  for (std::size_t k = 0; k < n_ranges; ++k) {
    std::vector<double> chunks;
    for (int r = 0; r < s.layout.R; ++r) {
      const auto [lo, hi] = part_of(k, r);
      const std::size_t c = std::size_t(dot_chunks(hi - lo, lo));
      chunks.insert(chunks.end(), all.begin() + std::ptrdiff_t(at[std::size_t(r)]),
                    all.begin() + std::ptrdiff_t(at[std::size_t(r)] + c));
      at[std::size_t(r)] += c;
    }
    out[k] = shard_detail::sum_gathered(space, chunks, index_t(offsets[k]) / kDotChunk);
  }
  return out;
}

}  // namespace gnh
