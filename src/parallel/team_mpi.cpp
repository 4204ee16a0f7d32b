// SPDX-License-Identifier: BSD-3-Clause
#include "parallel/team_mpi.hpp"

#include <climits>
#include <cstring>

#include "parallel/comm.hpp"

namespace gnh {
namespace {
void sum_fixed(void* in, void* inout, int* len, MPI_Datatype*) {
  auto* a = static_cast<const fixed128*>(in);
  auto* b = static_cast<fixed128*>(inout);
  for (int i = 0; i < *len; ++i) b[i] += a[i];
}
}  // namespace

MpiTeam::MpiTeam(const Comm& comm) : owner_(comm), comm_(comm.get()) {
  MPI_Comm_rank(comm_, &rank_);
  MPI_Comm_size(comm_, &size_);
  MPI_Type_contiguous(int(sizeof(fixed128)), MPI_BYTE, &fixed_type_);
  MPI_Type_commit(&fixed_type_);
  MPI_Op_create(&sum_fixed, /*commute=*/1, &fixed_sum_);
}

MpiTeam::~MpiTeam() {
  MPI_Op_free(&fixed_sum_);
  MPI_Type_free(&fixed_type_);
}

void MpiTeam::sum(ExactSum& acc) {
  if (size_ == 1) return;
  Kokkos::fence();
  auto h = Kokkos::create_mirror_view_and_copy(HostSpace(), acc.raw());
  const index_t n = acc.size();
  for (index_t off = 0; off < n; off += INT_MAX / 2) {
    const int count = int(std::min<index_t>(INT_MAX / 2, n - off));
    MPI_Allreduce(MPI_IN_PLACE, h.data() + off, count, fixed_type_, fixed_sum_, comm_);
  }
  Kokkos::deep_copy(acc.raw(), h);
}

void MpiTeam::share(std::vector<BatchScalars>& table) {
  if (size_ == 1) return;
  // Rows this member computed: [b, loss_sum, count, seconds, device_bytes,
  // then each vector member (BatchScalars::vectors) as its length and values].
  std::vector<double> mine;
  for (std::size_t b = 0; b < table.size(); ++b) {
    BatchScalars& r = table[b];
    if (!r.done) continue;
    mine.push_back(double(b));
    mine.push_back(r.loss_sum);
    mine.push_back(double(r.count));
    mine.push_back(r.seconds);
    mine.push_back(r.device_bytes);
    for (const std::vector<double>* v : r.vectors()) {
      mine.push_back(double(v->size()));
      mine.insert(mine.end(), v->begin(), v->end());
    }
  }
  const int n = int(mine.size());
  const GatherLayout g = gather_layout(comm_, n);
  std::vector<double> all(static_cast<std::size_t>(g.total));
  MPI_Allgatherv(mine.data(), n, MPI_DOUBLE, all.data(), g.counts.data(), g.displs.data(), MPI_DOUBLE, comm_);
  for (std::size_t i = 0; i < all.size();) {
    BatchScalars& r = table[static_cast<std::size_t>(all[i])];
    r.loss_sum = all[i + 1];
    r.count = std::int64_t(all[i + 2]);
    r.seconds = all[i + 3];
    r.device_bytes = all[i + 4];
    i += 5;
    for (std::vector<double>* v : r.vectors()) {
      const auto k = std::size_t(all[i]);
      v->assign(all.begin() + std::ptrdiff_t(i + 1), all.begin() + std::ptrdiff_t(i + 1 + k));
      i += 1 + k;
    }
    r.done = true;
  }
}

void MpiTeam::broadcast(void* data, std::size_t bytes, int root) {
  if (size_ == 1 || bytes == 0) return;
  Kokkos::fence();
  auto* p = static_cast<char*>(data);
  for (std::size_t off = 0; off < bytes; off += INT_MAX) {
    const int count = int(std::min<std::size_t>(INT_MAX, bytes - off));
    MPI_Bcast(p + off, count, MPI_BYTE, root, comm_);
  }
}

void MpiTeam::combine(View1<double> v) {
  if (size_ == 1) return;
  Kokkos::fence();
  auto h = Kokkos::create_mirror_view_and_copy(HostSpace(), v);
  const index_t n = v.extent(0);
  for (index_t off = 0; off < n; off += INT_MAX / 2) {
    const int count = int(std::min<index_t>(INT_MAX / 2, n - off));
    MPI_Allreduce(MPI_IN_PLACE, h.data() + off, count, MPI_DOUBLE, MPI_SUM, comm_);
  }
  Kokkos::deep_copy(v, h);
}

bool MpiTeam::any(bool flag) {
  int f = flag ? 1 : 0, r = 0;
  MPI_Allreduce(&f, &r, 1, MPI_INT, MPI_LOR, comm_);
  return r != 0;
}

}  // namespace gnh
