// SPDX-License-Identifier: BSD-3-Clause
#include "parallel/comm.hpp"

#include <algorithm>

namespace gnh {

Comm::Comm(MPI_Comm c) : comm_(c) {
  MPI_Comm_rank(comm_, &rank_);
  MPI_Comm_size(comm_, &size_);
}

int Comm::ranks_on_node() const {
  MPI_Comm node;
  MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node);
  int n = 1;
  MPI_Comm_size(node, &n);
  MPI_Comm_free(&node);
  return n;
}

Comm Comm::split(int color) const {
  MPI_Comm sub;
  MPI_Comm_split(comm_, color, rank_, &sub);
  Comm c(sub);
  c.owned_ = std::shared_ptr<MPI_Comm>(new MPI_Comm(sub), [](MPI_Comm* p) {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Comm_free(p);
    delete p;
  });
  return c;
}

void Comm::sum(std::vector<long long>& values) const {
  MPI_Allreduce(MPI_IN_PLACE, values.data(), int(values.size()), MPI_LONG_LONG, MPI_SUM, comm_);
}

void Comm::broadcast(int& value, int root) const { MPI_Bcast(&value, 1, MPI_INT, root, comm_); }

GatherLayout gather_layout(MPI_Comm comm, int n) {
  int size = 1;
  MPI_Comm_size(comm, &size);
  GatherLayout g;
  g.counts.resize(static_cast<std::size_t>(size));
  g.displs.resize(static_cast<std::size_t>(size));
  MPI_Allgather(&n, 1, MPI_INT, g.counts.data(), 1, MPI_INT, comm);
  for (std::size_t r = 0; r < g.counts.size(); ++r) {
    g.displs[r] = g.total;
    g.total += g.counts[r];
  }
  return g;
}

std::vector<std::string> Comm::allgather(const std::string& mine) const {
  const int n = static_cast<int>(mine.size());
  const GatherLayout g = gather_layout(comm_, n);
  std::string all(static_cast<std::size_t>(g.total), '\0');
  MPI_Allgatherv(mine.data(), n, MPI_CHAR, all.data(), g.counts.data(), g.displs.data(), MPI_CHAR, comm_);
  std::vector<std::string> out;
  for (std::size_t r = 0; r < g.counts.size(); ++r)
    out.push_back(all.substr(static_cast<std::size_t>(g.displs[r]), static_cast<std::size_t>(g.counts[r])));
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
    if (!m.empty() && std::find(distinct.begin(), distinct.end(), m) == distinct.end()) distinct.push_back(m);
  std::string joined;
  for (const auto& m : distinct) joined += (joined.empty() ? "" : "\n") + m;
  throw Error(joined);
}

}  // namespace gnh
