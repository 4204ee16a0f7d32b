// SPDX-License-Identifier: BSD-3-Clause
// The ranks that share one checkpoint's epoch (parallel.ranks_per_checkpoint).
// The analysis only needs these collectives; parallel/ implements them on an
// MPI sub-communicator, and SoloTeam is the one-rank case (no MPI).
#pragma once
#include <cstddef>
#include <type_traits>
#include <vector>

#include "analysis/batch_scalars.hpp"
#include "analysis/exact_sum.hpp"
#include "core/deal.hpp"

namespace gnh {

// parallel.parameter_shards = R: how the flat parameter order [0, P) is cut
// into R contiguous slices, slice r held by member r of a shard group. The
// cuts fall on multiples of the dot product's chunk (analysis/dot.hpp,
// 4096 elements), balanced in chunks, so that a slice's chunk sums are whole
// chunks of the whole vector's and a sharded dot is the whole one's bits.
struct ShardLayout {
  static constexpr index_t kChunk = 4096;  // analysis/dot.hpp's kDotChunk
  ShardLayout() = default;
  ShardLayout(index_t n, int shards) : P(n), R(shards), bounds(std::size_t(shards) + 1, 0) {
    const index_t chunks = (n + kChunk - 1) / kChunk;
    for (int r = 1; r <= shards; ++r) {
      const index_t at = chunks * r / shards * kChunk;
      bounds[std::size_t(r)] = at < n ? at : n;
    }
  }
  index_t P = 0;
  int R = 1;
  std::vector<index_t> bounds;  // R + 1: slice r is [bounds[r], bounds[r + 1])
  index_t begin(int r) const { return bounds[std::size_t(r)]; }
  index_t end(int r) const { return bounds[std::size_t(r) + 1]; }
  index_t size(int r) const { return end(r) - begin(r); }
  index_t largest() const {
    index_t m = 0;
    for (int r = 0; r < R; ++r) m = size(r) > m ? size(r) : m;
    return m;
  }
  // A scatter (ShardGroup::scatter_add) moves slices in rounds of at most
  // this many elements a member: a slice over R, and never more than 2^22,
  // so that its buffers (R pieces sent, R received) are about two slices and
  // every MPI count fits an int.
  static constexpr index_t kRoundMost = index_t(1) << 22;
  index_t round() const {
    const index_t piece = (largest() + R - 1) / R;
    return piece < 1 ? 1 : piece < kRoundMost ? piece : kRoundMost;
  }
};

class ShardGroup;

class Team {
 public:
  virtual ~Team() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Element-wise sum of every member's accumulator, left in every member's.
  virtual void sum(ExactSum& acc) = 0;
  // Each batch's row is filled by the member that computed it (row b by member
  // owner(b)); afterwards every member holds every row.
  virtual void share(std::vector<BatchScalars>& table) = 0;
  virtual void broadcast(void* data, std::size_t bytes, int root) = 0;
  // Every member fills its own elements of v and leaves the others zero;
  // afterwards every member holds all of them. Exact (each element is one
  // value plus zeros), so the result does not depend on the team's size.
  virtual void combine(View1<double> v) = 0;
  // True on every member if `flag` is true on any.
  virtual bool any(bool flag) = 0;

  // A trivially copyable value (a struct of results) from member root to all.
  template <class V>
  void broadcast_value(V& v, int root) {
    static_assert(std::is_trivially_copyable<V>::value, "broadcast_value: plain data only");
    broadcast(&v, sizeof(V), root);
  }

  // The batches member `rank()` computes, dealt round-robin (core/deal.hpp).
  std::vector<index_t> share_of(index_t n_batches) const { return dealt_share(n_batches, size(), rank()); }
  int owner(index_t b) const { return dealt_to(b, size()); }

  // parallel.parameter_shards = R: the team is cut into shard groups of R
  // consecutive members (member t is member t mod R of group t / R); each
  // member holds slice t mod R of every parameter-sized vector of the
  // analysis. replicas(): the members holding the same slice, one per
  // group, ordered by group (the team itself when R = 1).
  virtual ShardGroup& shards() = 0;
  virtual Team& replicas() = 0;
};

// The R members of a shard group: a team of its own (its batches split among
// them) that also moves slices.
class ShardGroup : public Team {
 public:
  ShardGroup& shards() override { return *this; }
  Team& replicas() override { return *this; }
  // Adds into `slice` (this member's slice of an exact sum of P elements)
  // the elements of this member's slice of every member's x, a whole vector
  // of P elements, or null where a member has none this time. Collective.
  // Exact, so the same bits as one member adding every x whole.
  virtual void scatter_add(const ExecSpace& space, const ShardLayout& layout, const float* x, ExactSum& slice) = 0;
  virtual void scatter_add(const ExecSpace& space, const ShardLayout& layout, const double* x, ExactSum& slice) = 0;
  // whole (P elements, each member's slice filled) complete on every member.
  virtual void gather(const ShardLayout& layout, float* whole) = 0;
  virtual void gather(const ShardLayout& layout, double* whole) = 0;
  // Every member's values, concatenated in member order.
  virtual std::vector<double> gather_values(const std::vector<double>& mine) = 0;
  // The largest of the members' values.
  virtual index_t max(index_t v) = 0;
};

// The one-rank case (no MPI): a team of one, which is also its own shard
// group of one (every vector whole) and its own replicas.
class SoloTeam final : public ShardGroup {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  void sum(ExactSum&) override {}
  void share(std::vector<BatchScalars>&) override {}
  void broadcast(void*, std::size_t, int) override {}
  void combine(View1<double>) override {}
  bool any(bool flag) override { return flag; }
  void scatter_add(const ExecSpace& space, const ShardLayout&, const float* x, ExactSum& slice) override {
    if (x) slice.add(space, x);
  }
  void scatter_add(const ExecSpace& space, const ShardLayout&, const double* x, ExactSum& slice) override {
    if (x) slice.add(space, x);
  }
  void gather(const ShardLayout&, float*) override {}
  void gather(const ShardLayout&, double*) override {}
  std::vector<double> gather_values(const std::vector<double>& mine) override { return mine; }
  index_t max(index_t v) override { return v; }
};

// A member's slice [begin, begin + n) of the whole order, and its group.
struct Slice {
  ShardGroup* group = nullptr;
  ShardLayout layout;
  index_t begin = 0, n = 0;
  Slice() = default;
  Slice(ShardGroup& g, index_t P);
  bool whole() const { return layout.R == 1; }
  // Adds into `slice` this member's part of every member's whole x (ShardGroup::scatter_add).
  template <class T>
  void add(const ExecSpace& space, const T* x, ExactSum& slice) const;
};

inline Slice::Slice(ShardGroup& g, index_t P)
    : group(&g), layout(P, g.size()), begin(layout.begin(g.rank())), n(layout.size(g.rank())) {}
template <class T>
void Slice::add(const ExecSpace& space, const T* x, ExactSum& slice) const {
  group->scatter_add(space, layout, x, slice);
}

}  // namespace gnh
