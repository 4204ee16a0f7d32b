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
};

class SoloTeam final : public Team {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  void sum(ExactSum&) override {}
  void share(std::vector<BatchScalars>&) override {}
  void broadcast(void*, std::size_t, int) override {}
  void combine(View1<double>) override {}
  bool any(bool flag) override { return flag; }
};

}  // namespace gnh
