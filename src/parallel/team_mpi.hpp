// SPDX-License-Identifier: BSD-3-Clause
// Team (analysis/team.hpp) on an MPI communicator. Buffers are exchanged from
// host-accessible memory (on a GPU build, CUDA-aware MPI is assumed).
// With parameter_shards R > 1, the team's shard groups and replicas are
// sub-communicators of it (MPI_Comm_split): member t in group t / R at
// place t mod R, and among the replicas of slice t mod R at place t / R.
#pragma once
#include <mpi.h>

#include <memory>

#include "analysis/team.hpp"
#include "parallel/comm.hpp"

namespace gnh {

class MpiTeam final : public Team {
 public:
  explicit MpiTeam(const Comm& comm, int parameter_shards = 1);
  ~MpiTeam() override;
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void sum(ExactSum& acc) override;
  void share(std::vector<BatchScalars>& table) override;
  void broadcast(void* data, std::size_t bytes, int root) override;
  void combine(View1<double> v) override;
  bool any(bool flag) override;
  ShardGroup& shards() override { return *shards_; }
  Team& replicas() override { return replicas_ ? *replicas_ : *this; }
  MPI_Comm communicator() const { return comm_; }

 private:
  std::unique_ptr<ShardGroup> shards_;
  std::unique_ptr<MpiTeam> replicas_;  // null: R = 1, the team itself
  Comm owner_;                         // keeps a split communicator alive
  MPI_Comm comm_;
  int rank_ = 0, size_ = 1;
  MPI_Datatype fixed_type_;
  MPI_Op fixed_sum_;
};

}  // namespace gnh
