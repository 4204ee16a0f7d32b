// SPDX-License-Identifier: BSD-3-Clause
#include "parallel/comm.hpp"

#include <algorithm>

namespace gnh {

Comm::Comm(MPI_Comm c) : comm_(c) {
  MPI_Comm_rank(comm_, &rank_);
  MPI_Comm_size(comm_, &size_);
}

void Comm::barrier() const { MPI_Barrier(comm_); }

std::vector<std::string> Comm::allgather(const std::string& mine) const {
  const int n = static_cast<int>(mine.size());
  std::vector<int> counts(static_cast<std::size_t>(size_)), displs(static_cast<std::size_t>(size_));
  MPI_Allgather(&n, 1, MPI_INT, counts.data(), 1, MPI_INT, comm_);
  int total = 0;
  for (int r = 0; r < size_; ++r) {
    displs[static_cast<std::size_t>(r)] = total;
    total += counts[static_cast<std::size_t>(r)];
  }
  std::string all(static_cast<std::size_t>(total), '\0');
  MPI_Allgatherv(mine.data(), n, MPI_CHAR, all.data(), counts.data(), displs.data(), MPI_CHAR, comm_);
  std::vector<std::string> out;
  for (int r = 0; r < size_; ++r)
    out.push_back(all.substr(static_cast<std::size_t>(displs[static_cast<std::size_t>(r)]),
                             static_cast<std::size_t>(counts[static_cast<std::size_t>(r)])));
  return out;
}

void Comm::settle(const std::string& message) const {
  int failed = message.empty() ? 0 : 1, any = 0;
  MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_MAX, comm_);
  if (!any) return;
  const std::vector<std::string> all = allgather(message);
  if (rank_ != 0) throw ErrorElsewhere(0);
  std::vector<std::string> distinct;
  for (const auto& m : all)
    if (!m.empty() && std::find(distinct.begin(), distinct.end(), m) == distinct.end())
      distinct.push_back(m);
  std::string joined;
  for (const auto& m : distinct) joined += (joined.empty() ? "" : "\n") + m;
  throw Error(joined);
}

}  // namespace gnh
