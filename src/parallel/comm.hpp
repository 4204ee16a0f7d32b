// SPDX-License-Identifier: BSD-3-Clause
// MPI for gnh: a communicator wrapper with collective error handling, so that a
// user error found on any rank stops every rank cleanly (no MPI_Abort, no hang).
#pragma once
#include <mpi.h>

#include <memory>
#include <string>
#include <vector>

#include "core/error.hpp"

namespace gnh {

// The receive layout of an MPI_Allgatherv in which this rank sends n
// elements: every rank's count and displacement, and the total. Collective.
struct GatherLayout {
  std::vector<int> counts, displs;
  int total = 0;
};
GatherLayout gather_layout(MPI_Comm comm, int n);

class Comm {
 public:
  explicit Comm(MPI_Comm c = MPI_COMM_WORLD);
  int rank() const { return rank_; }
  int size() const { return size_; }
  MPI_Comm get() const { return comm_; }

  // The ranks of equal `color`, ordered as here; freed with the last copy. Collective.
  Comm split(int color) const;
  // How many ranks of this communicator share this rank's node (memory). Collective.
  int ranks_on_node() const;
  // Element-wise sum of every rank's values, left in every rank's. Collective.
  void sum(std::vector<long long>& values) const;
  // Root's value on every rank. Collective.
  void broadcast(int& value, int root) const;

  // Every rank contributes a string; every rank receives all, in rank order.
  std::vector<std::string> allgather(const std::string& mine) const;

  // Runs f on every rank. If it throws gnh::Error on any rank, every rank
  // throws: rank 0 a gnh::Error whose message lists each distinct problem once
  // (prefixed by the rank that saw it when ranks disagree), the others
  // ErrorElsewhere. Must be called by all ranks.
  template <class F>
  void collective(F&& f) const {
    std::string message;
    try {
      f();
    } catch (const Error& e) {
      message = e.what();
      if (message.empty()) message = "unspecified error";
    }
    settle(message);
  }

 private:
  void settle(const std::string& message) const;
  MPI_Comm comm_;
  std::shared_ptr<MPI_Comm> owned_;  // a communicator this Comm made (split), freed with the last copy
  int rank_ = 0, size_ = 1;
};

}  // namespace gnh
