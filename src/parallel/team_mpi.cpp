// SPDX-License-Identifier: BSD-3-Clause
#include "parallel/team_mpi.hpp"

#include <algorithm>
#include <climits>
#include <cstring>

#include "core/error.hpp"
#include "parallel/comm.hpp"

namespace gnh {
namespace {
void sum_fixed(void* in, void* inout, int* len, MPI_Datatype*) {
  auto* a = static_cast<const fixed128*>(in);
  auto* b = static_cast<fixed128*>(inout);
  for (int i = 0; i < *len; ++i) b[i] += a[i];
}

template <class T>
MPI_Datatype mpi_type();
template <>
MPI_Datatype mpi_type<float>() {
  return MPI_FLOAT;
}
template <>
MPI_Datatype mpi_type<double>() {
  return MPI_DOUBLE;
}

// A shard group on its communicator: the Team part is an MpiTeam of it.
// Slices move in rounds (ShardLayout::round, at most kRound elements a
// member), so that the buffers of a round stay small whatever the model's
// size and every count and displacement fits MPI's int.
class MpiShards final : public ShardGroup {
 public:
  explicit MpiShards(const Comm& comm) : team_(comm) {}
  int rank() const override { return team_.rank(); }
  int size() const override { return team_.size(); }
  void sum(ExactSum& acc) override { team_.sum(acc); }
  void share(std::vector<BatchScalars>& table) override { team_.share(table); }
  void broadcast(void* data, std::size_t bytes, int root) override { team_.broadcast(data, bytes, root); }
  void combine(View1<double> v) override { team_.combine(v); }
  bool any(bool flag) override { return team_.any(flag); }
  void scatter_add(const ExecSpace& space, const ShardLayout& layout, const float* x, ExactSum& slice) override {
    exchange(space, layout, x, slice);
  }
  void scatter_add(const ExecSpace& space, const ShardLayout& layout, const double* x, ExactSum& slice) override {
    exchange(space, layout, x, slice);
  }
  void gather(const ShardLayout& layout, float* whole) override { gather_slices(layout, whole); }
  void gather(const ShardLayout& layout, double* whole) override { gather_slices(layout, whole); }
  std::vector<double> gather_values(const std::vector<double>& mine) override {
    const GatherLayout g = gather_layout(comm(), int(mine.size()));
    std::vector<double> all(static_cast<std::size_t>(g.total));
    MPI_Allgatherv(mine.data(), int(mine.size()), MPI_DOUBLE, all.data(), g.counts.data(), g.displs.data(), MPI_DOUBLE,
                   comm());
    return all;
  }
  index_t max(index_t v) override {
    long long x = v, r = 0;
    MPI_Allreduce(&x, &r, 1, MPI_LONG_LONG, MPI_MAX, comm());
    return index_t(r);
  }

 private:
  static constexpr index_t kRound = ShardLayout::kRoundMost;
  MPI_Comm comm() const { return team_.communicator(); }

  // Member q sends member r the elements of slice r of its x, r adds them
  // into its slice: an all-to-all a round, from every member that has an x
  // (MPI_Allgather of who has one, so that members without send nothing).
  template <class T>
  void exchange(const ExecSpace& space, const ShardLayout& layout, const T* x, ExactSum& slice) {
    const int R = size(), me = rank();
    if (slice.size() != layout.size(me)) throw std::logic_error("ShardGroup::scatter_add: not this member's slice");
    int mine = x != nullptr ? 1 : 0;
    std::vector<int> has(std::size_t(R), 0);
    MPI_Allgather(&mine, 1, MPI_INT, has.data(), 1, MPI_INT, comm());
    if (std::none_of(has.begin(), has.end(), [](int h) { return h != 0; })) return;
    const index_t C = layout.round();
    std::vector<T> send(std::size_t(R * C)), recv(std::size_t(R * C));
    View1<T> staged(Kokkos::view_alloc(Kokkos::WithoutInitializing, "gnh::shards::received"), C);
    const std::size_t members = std::size_t(R);
    std::vector<int> scount(members), sdispl(members), rcount(members), rdispl(members);
    space.fence();
    for (index_t off = 0; off < layout.largest(); off += C) {
      auto part = [&](int r) { return int(std::max<index_t>(0, std::min(C, layout.size(r) - off))); };
      for (int q = 0; q < R; ++q) {
        scount[std::size_t(q)] = mine ? part(q) : 0;
        sdispl[std::size_t(q)] = int(q * C);
        rcount[std::size_t(q)] = has[std::size_t(q)] ? part(me) : 0;
        rdispl[std::size_t(q)] = int(q * C);
        if (scount[std::size_t(q)] > 0)
          Kokkos::deep_copy(View1<T, HostSpace>(send.data() + q * C, std::size_t(scount[std::size_t(q)])),
                            Span1<const T>(x + layout.begin(q) + off, std::size_t(scount[std::size_t(q)])));
      }
      MPI_Alltoallv(send.data(), scount.data(), sdispl.data(), mpi_type<T>(), recv.data(), rcount.data(), rdispl.data(),
                    mpi_type<T>(), comm());
      for (int q = 0; q < R; ++q) {
        const index_t n = rcount[std::size_t(q)];
        if (n == 0) continue;
        Kokkos::deep_copy(space, Kokkos::subview(staged, std::make_pair(index_t(0), n)),
                          View1<T, HostSpace>(recv.data() + q * C, std::size_t(n)));
        slice.add_at(space, staged.data(), off, n);
        space.fence();
      }
    }
  }

  // Each member's slice of whole broadcast from it, in rounds.
  template <class T>
  void gather_slices(const ShardLayout& layout, T* whole) {
    Kokkos::fence();
    for (int q = 0; q < size(); ++q)
      for (index_t off = 0; off < layout.size(q); off += kRound)
        MPI_Bcast(whole + layout.begin(q) + off, int(std::min(kRound, layout.size(q) - off)), mpi_type<T>(), q, comm());
  }

  MpiTeam team_;
};
}  // namespace

MpiTeam::MpiTeam(const Comm& comm, int parameter_shards) : owner_(comm), comm_(comm.get()) {
  MPI_Comm_rank(comm_, &rank_);
  MPI_Comm_size(comm_, &size_);
  const int R = parameter_shards;
  if (R < 1 || size_ % R != 0)
    throw Error("parallel.parameter_shards = " + std::to_string(R) + " does not divide the team's " +
                std::to_string(size_) + " rank(s) (parallel.ranks_per_checkpoint)");
  MPI_Type_contiguous(int(sizeof(fixed128)), MPI_BYTE, &fixed_type_);
  MPI_Type_commit(&fixed_type_);
  MPI_Op_create(&sum_fixed, /*commute=*/1, &fixed_sum_);
  if (R == 1) {
    shards_ = std::make_unique<SoloTeam>();  // a shard group of one
    return;
  }
  shards_ = std::make_unique<MpiShards>(comm.split(rank_ / R));
  replicas_ = std::make_unique<MpiTeam>(comm.split(rank_ % R));
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
