// SPDX-License-Identifier: BSD-3-Clause
// Team (analysis/team.hpp) on an MPI communicator. Buffers are exchanged from
// host-accessible memory (on a GPU build, CUDA-aware MPI is assumed).
#pragma once
#include <mpi.h>

#include "analysis/team.hpp"
#include "parallel/comm.hpp"

namespace gnh {

class MpiTeam final : public Team {
 public:
  explicit MpiTeam(const Comm& comm);
  ~MpiTeam() override;
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void sum(ExactSum& acc) override;
  void share(std::vector<BatchScalars>& table) override;
  void broadcast(void* data, std::size_t bytes, int root) override;
  void combine(View1<double> v) override;
  bool any(bool flag) override;

 private:
  Comm owner_;  // keeps a split communicator alive
  MPI_Comm comm_;
  int rank_ = 0, size_ = 1;
  MPI_Datatype fixed_type_;
  MPI_Op fixed_sum_;
};

}  // namespace gnh
