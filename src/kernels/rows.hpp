// SPDX-License-Identifier: BSD-3-Clause
// Row operations (a reduction over the columns of each row, then an update of
// the row) in two shapes with one row body, the way colsum.hpp does columns:
//
//  - host: one task per row; sums by lane_sum (16 interleaved partials, so
//    the loop vectorises), the update as a plain loop over the columns.
//  - teams (GPU-shaped): kTeamRows rows per team, one team thread a row and
//    kRowLanes vector lanes over its columns (reads of a row coalesced). Lane
//    j sums the columns c = j mod kRowLanes in order into team scratch; one
//    lane then adds the kRowLanes partials in order of j and broadcasts the
//    sum. That is lane_sum's order of additions; the shapes still differ in
//    the last bit where a compiler fuses multiply-adds differently in the two
//    loops, so they agree to rounding (CTest checks it on the host backends,
//    with the teams shape's bits repeating run to run).
//
// A row body is a functor with
//   template <class Lanes> KOKKOS_INLINE_FUNCTION void operator()(const Lanes&, index_t row) const
// that takes its sums through lanes.sum / lanes.sum2 and its maxima through
// lanes.max, and runs its per-column work through lanes.each. Column c is
// lane c mod kRowLanes's in every call (each, and the terms of sum and max),
// so a column written in one call is read back by the lane that wrote it. A
// value of the row that the body updates (a running sum) is read through
// lanes.one, which every lane leaves only once the value is read, and written
// through lanes.single (one lane): no lane reads it after another wrote it.
//
// The default is host on host execution spaces and teams elsewhere.
#pragma once
#include <type_traits>

#include "core/fastmath.hpp"
#include "core/isa.hpp"
#include "core/types.hpp"

namespace gnh::kernels {

//  - wide (GPU-shaped, for few long rows: the head's tiles of whole
//    vocabulary rows): a team a row, kWideThreads threads of kRowLanes lanes
//    over its columns, column c on lane c mod kWideLanes; the kWideLanes
//    partials added in order by one lane. A tile of 479 rows (the reference
//    head at K = 16) is then 479 teams of 128 threads where the teams shape
//    made 60. Another order of additions than lane_sum's: it agrees with the
//    other shapes to rounding, and repeats its own bits.
enum class RowShape { host, teams, wide };

constexpr int kRowLanes = 16;    // lane_sum's partials: the same order of additions
constexpr int kTeamRows = 8;     // rows (team threads) per team on a GPU: 8 x 16 = 128 threads a block
constexpr int kWideThreads = 8;  // threads a row in the wide shape
constexpr int kWideLanes = kWideThreads * kRowLanes;  // the row's lanes: 128
constexpr int kWideSums = 8;                          // WideLanes::sums at once (its scratch: 8 KiB in double)

constexpr RowShape default_row_shape() {
  return std::is_same<ExecSpace, Kokkos::DefaultHostExecutionSpace>::value ? RowShape::host : RowShape::teams;
}

namespace detail {

struct HostLanes {
  static constexpr bool kOnline = false;  // no max_exp_sum or sums: one pass a sum
  template <class T, class F>
  KOKKOS_INLINE_FUNCTION T sum(index_t n, const F& f) const {
    return lane_sum<T>(n, f);
  }
  template <class T, class F>
  KOKKOS_INLINE_FUNCTION void sum2(index_t n, const F& f, T& a, T& b) const {
    lane_sum2<T>(n, f, a, b);
  }
  template <class T>
  KOKKOS_INLINE_FUNCTION T max(index_t n, const T* x) const {
    return lane_max(n, x);
  }
  template <class F>
  KOKKOS_INLINE_FUNCTION void each(index_t n, const F& f) const {
    for (index_t c = 0; c < n; ++c) f(c);
  }
  template <class T, class F>
  KOKKOS_INLINE_FUNCTION T one(const F& f) const {
    return f();
  }
  template <class F>
  KOKKOS_INLINE_FUNCTION void single(const F& f) const {
    f();
  }
};

// One team thread's lanes; part points at its 2 * kRowLanes scratch values
// (as bytes: a row body sums in its own scalar type).
template <class Member>
struct TeamLanes {
  static constexpr bool kOnline = false;  // no max_exp_sum or sums: one pass a sum
  const Member& team;
  void* part;
  // The partials p[0..kRowLanes) added in order by one lane, the sum
  // broadcast to every lane of the thread.
  template <class T>
  KOKKOS_INLINE_FUNCTION T in_order(const T* p) const {
    T total = T(0);
    Kokkos::single(
        Kokkos::PerThread(team),
        [&](T& v) {
          v = T(0);
          for (int j = 0; j < kRowLanes; ++j) v += p[j];
        },
        total);
    return total;
  }
  template <class T, class F>
  KOKKOS_INLINE_FUNCTION T sum(index_t n, const F& f) const {
    T* p = static_cast<T*>(part);
    const index_t L = kRowLanes;
    Kokkos::parallel_for(Kokkos::ThreadVectorRange(team, L), [&](const index_t j) {
      T s = T(0);
      for (index_t c = j; c < n; c += L) s += f(c);
      p[j] = s;
    });
    return in_order(p);
  }
  template <class T, class F>
  KOKKOS_INLINE_FUNCTION void sum2(index_t n, const F& f, T& a, T& b) const {
    T* p = static_cast<T*>(part);
    const index_t L = kRowLanes;
    Kokkos::parallel_for(Kokkos::ThreadVectorRange(team, L), [&](const index_t j) {
      T sa = T(0), sb = T(0);
      for (index_t c = j; c < n; c += L) f(c, sa, sb);
      p[j] = sa;
      p[L + j] = sb;
    });
    a = in_order(p);
    b = in_order(p + L);
  }
  // The maximum of x[0, n), n >= 1 (exact in any order: the bits of lane_max).
  template <class T>
  KOKKOS_INLINE_FUNCTION T max(index_t n, const T* x) const {
    T* p = static_cast<T*>(part);
    const index_t L = kRowLanes;
    Kokkos::parallel_for(Kokkos::ThreadVectorRange(team, L), [&](const index_t j) {
      T m = x[0];
      for (index_t c = j; c < n; c += L) m = x[c] > m ? x[c] : m;
      p[j] = m;
    });
    T total = T(0);
    Kokkos::single(
        Kokkos::PerThread(team),
        [&](T& v) {
          v = p[0];
          for (int j = 1; j < kRowLanes; ++j) v = p[j] > v ? p[j] : v;
        },
        total);
    return total;
  }
  // Column c on lane c mod kRowLanes, as in sum.
  template <class F>
  KOKKOS_INLINE_FUNCTION void each(index_t n, const F& f) const {
    const index_t L = kRowLanes;
    Kokkos::parallel_for(Kokkos::ThreadVectorRange(team, L), [&](const index_t j) {
      for (index_t c = j; c < n; c += L) f(c);
    });
  }
  // f() on one lane, its value broadcast to all (each waits for it).
  template <class T, class F>
  KOKKOS_INLINE_FUNCTION T one(const F& f) const {
    T value = T(0);
    Kokkos::single(
        Kokkos::PerThread(team), [&](T& v) { v = f(); }, value);
    return value;
  }
  template <class F>
  KOKKOS_INLINE_FUNCTION void single(const F& f) const {
    Kokkos::single(Kokkos::PerThread(team), f);
  }
};

// A whole team's lanes over one row (the wide shape): thread t's lane j is
// the row's lane t kRowLanes + j; part points at kWideSums kWideLanes + 1
// scratch values of the widest type a body sums in, the last one a value
// broadcast through the team's scratch (a scalar with planes has no volatile
// assignment for Kokkos's broadcast).
// The body runs on every thread and lane; what one lane computes (one,
// single, the sums' totals) is seen by all before any goes on.
template <class Member, int Sums = kWideSums>
struct WideLanes {
  // max_exp_sum in one read of the row: each lane keeps a running maximum and
  // its sum relative to it (a whole vocabulary row does not stay cached
  // between two passes with many rows in flight). Another order of operations
  // than the two-pass shapes': it agrees with them to rounding.
  // Also: sums, several sums in one read of the row.
  static constexpr bool kOnline = true;
  const Member& team;
  void* part;
  template <class F>
  KOKKOS_INLINE_FUNCTION void lanes(const F& f) const {
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, kWideThreads), [&](const int t) {
      Kokkos::parallel_for(Kokkos::ThreadVectorRange(team, kRowLanes),
                           [&](const int j) { f(index_t(t) * kRowLanes + j); });
    });
  }
  // f() on one lane once every lane has arrived, its value seen by all.
  template <class T, class F>
  KOKKOS_INLINE_FUNCTION T broadcast(const F& f) const {
    T* slot = static_cast<T*>(part) + Sums * kWideLanes;
    team.team_barrier();
    Kokkos::single(Kokkos::PerTeam(team), [&]() { *slot = f(); });
    team.team_barrier();
    return *slot;
  }
  template <class T>
  KOKKOS_INLINE_FUNCTION T in_order(const T* p) const {
    return broadcast<T>([&] {
      T v = T(0);
      for (int g = 0; g < kWideLanes; ++g) v += p[g];
      return v;
    });
  }
  // N <= Sums sums in one pass over the row: f(c, acc) adds column c's
  // terms into acc[0, N); out[i] is the i-th sum, each in sum's order (lane
  // g its columns in order, then the lanes in order), so its bits are those
  // of sum or sum2 taking the same terms.
  // Only the first `used` of them are taken (f adds into no others).
  template <class T, int N, class F>
  KOKKOS_INLINE_FUNCTION void sums(index_t n, const F& f, T (&out)[N], int used = N) const {
    static_assert(N <= Sums, "WideLanes::sums: more sums than the scratch holds");
    T* p = static_cast<T*>(part);
    lanes([&](const index_t g) {
      T acc[N];
      for (int i = 0; i < N; ++i) acc[i] = T(0);
      for (index_t c = g; c < n; c += kWideLanes) f(c, acc);
      for (int i = 0; i < used; ++i) p[i * kWideLanes + g] = acc[i];
    });
    for (int i = 0; i < used; ++i) out[i] = in_order(p + i * kWideLanes);
  }
  template <class T, class F>
  KOKKOS_INLINE_FUNCTION T sum(index_t n, const F& f) const {
    T* p = static_cast<T*>(part);
    lanes([&](const index_t g) {
      T s = T(0);
      for (index_t c = g; c < n; c += kWideLanes) s += f(c);
      p[g] = s;
    });
    return in_order(p);
  }
  template <class T, class F>
  KOKKOS_INLINE_FUNCTION void sum2(index_t n, const F& f, T& a, T& b) const {
    T* p = static_cast<T*>(part);
    lanes([&](const index_t g) {
      T sa = T(0), sb = T(0);
      for (index_t c = g; c < n; c += kWideLanes) f(c, sa, sb);
      p[g] = sa;
      p[kWideLanes + g] = sb;
    });
    a = in_order(p);
    b = in_order(p + kWideLanes);
  }
  template <class T>
  KOKKOS_INLINE_FUNCTION T max(index_t n, const T* x) const {
    T* p = static_cast<T*>(part);
    lanes([&](const index_t g) {
      T m = x[0];
      for (index_t c = g; c < n; c += kWideLanes) m = x[c] > m ? x[c] : m;
      p[g] = m;
    });
    return broadcast<T>([&] {
      T v = p[0];
      for (int g = 1; g < kWideLanes; ++g) v = p[g] > v ? p[g] : v;
      return v;
    });
  }
  // m = max x[0, n) and s = sum ex(x - m) in one read: lane g's running
  // maximum mg over its columns and its sum sg relative to it (rescaled by
  // ex(mg - x) where a column raises it; a lane without columns holds x[0]
  // and 0), then m the lanes' maximum and s = sum_g sg ex(mg - m) in lane
  // order. n >= 1.
  template <class T, class Ex>
  KOKKOS_INLINE_FUNCTION void max_exp_sum(index_t n, const T* x, const Ex& ex, T& m, T& s) const {
    T* p = static_cast<T*>(part);
    lanes([&](const index_t g) {
      T mg = x[0], sg = T(0);
      for (index_t c = g; c < n; c += kWideLanes) {
        const T z = x[c];
        if (z > mg) {
          sg = sg * ex(mg - z) + T(1);
          mg = z;
        } else {
          sg += ex(z - mg);
        }
      }
      p[g] = mg;
      p[kWideLanes + g] = sg;
    });
    m = broadcast<T>([&] {
      T v = p[0];
      for (int g = 1; g < kWideLanes; ++g) v = p[g] > v ? p[g] : v;
      return v;
    });
    const T mm = m;
    s = broadcast<T>([&] {
      T v = T(0);
      for (int g = 0; g < kWideLanes; ++g) v += p[kWideLanes + g] * ex(p[g] - mm);
      return v;
    });
  }
  template <class F>
  KOKKOS_INLINE_FUNCTION void each(index_t n, const F& f) const {
    lanes([&](const index_t g) {
      for (index_t c = g; c < n; c += kWideLanes) f(c);
    });
  }
  template <class T, class F>
  KOKKOS_INLINE_FUNCTION T one(const F& f) const {
    return broadcast<T>(f);
  }
  template <class F>
  KOKKOS_INLINE_FUNCTION void single(const F& f) const {
    team.team_barrier();
    Kokkos::single(Kokkos::PerTeam(team), f);
    team.team_barrier();
  }
};

// The policy of `league` teams of R threads with L vector lanes running
// functor f: so on a GPU; on a host backend as many threads as its teams can
// have, at most R (one on Serial; on OpenMP the team's threads, barriers and
// per-thread scratch run in parallel, as on a GPU, and the tests see them),
// one lane each. Threads short of R take its work in turn.
template <class Policy, class F>
Policy team_policy(const ExecSpace& space, index_t league, const F& f, int R, int L) {
  if constexpr (std::is_same<ExecSpace, Kokkos::DefaultHostExecutionSpace>::value) {
    const int most = Policy(space, 1, 1).team_size_max(f, Kokkos::ParallelForTag());
    (void)L;
    return Policy(space, league, most < 1 ? 1 : most < R ? most : R, 1);
  } else {
    (void)f;
    return Policy(space, league, R, L);
  }
}

// One row on the host, the body compiled for each x86-64 level of a portable
// build and the processor's chosen at load time (core/isa.hpp): the row
// bodies' sums, maxima and exponentials vectorise as wide as it allows.
template <class Body>
GNH_HOST_CLONES_FLAT KOKKOS_INLINE_FUNCTION void host_row(const Body& body, const index_t n) {
  body(HostLanes{}, n);
}

template <class Body>
struct HostRows {
  Body body;
  KOKKOS_INLINE_FUNCTION void operator()(const index_t n) const { host_row(body, n); }
};

template <class Body, class T>
struct TeamRows {
  using Policy = TeamRange;
  using Member = typename Policy::member_type;
  using Scratch = TeamScratch<T>;
  Body body;
  index_t N;
  int R;
  KOKKOS_INLINE_FUNCTION void operator()(const Member& team) const {
    const int L = kRowLanes;
    Scratch part(team.team_scratch(0), 2 * R * L);
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, R), [&](const int t) {
      const index_t n = team.league_rank() * index_t(R) + t;
      if (n < N) body(TeamLanes<Member>{team, part.data() + 2 * t * L}, n);
    });
  }
};

// The sums a body takes at once in the wide shape (WideLanes::sums): its
// kWideSums where it states one, else kWideSums.
template <class Body, class = void>
struct WideSumsOf {
  static constexpr int value = kWideSums;
};
template <class Body>
struct WideSumsOf<Body, std::void_t<decltype(Body::kWideSums)>> {
  static constexpr int value = Body::kWideSums;
};

// A team a row (the wide shape).
// Its scratch holds kSums kWideLanes + 1 values of T or of double, the
// larger (a body may sum or broadcast in double, as the head's losses are).
template <class Body, class T>
struct WideRows {
  using Policy = TeamRange;
  using Member = typename Policy::member_type;
  using Scratch = TeamScratch<double>;
  static constexpr int kSums = WideSumsOf<Body>::value;
  static constexpr std::size_t kWords =
      ((kSums * kWideLanes + 1) * (sizeof(T) > sizeof(double) ? sizeof(T) : sizeof(double)) + sizeof(double) - 1) /
      sizeof(double);
  Body body;
  KOKKOS_INLINE_FUNCTION void operator()(const Member& team) const {
    Scratch part(team.team_scratch(0), kWords);
    body(WideLanes<Member, kSums>{team, part.data()}, team.league_rank());
  }
};

}  // namespace detail

// body(lanes, n) for every row n < N, in the given shape; T is the scalar
// type of the body's sums (it sizes the teams' scratch).
template <class T, class Body>
void for_rows(const ExecSpace& space, const char* label, index_t N, const Body& body,
              RowShape shape = default_row_shape()) {
  if (N <= 0) return;
  if (shape == RowShape::host) {
    Kokkos::parallel_for(label, range(space, N), detail::HostRows<Body>{body});
    return;
  }
  if (shape == RowShape::wide) {
    using F = detail::WideRows<Body, T>;
    const F f{body};
    const typename F::Policy policy = detail::team_policy<typename F::Policy>(space, N, f, kWideThreads, kRowLanes)
                                          .set_scratch_size(0, Kokkos::PerTeam(F::Scratch::shmem_size(F::kWords)));
    Kokkos::parallel_for(label, policy, f);
    return;
  }
  using F = detail::TeamRows<Body, T>;
  // R rows a team (team_policy: R threads of L lanes on a GPU).
  const int R = kTeamRows, L = kRowLanes;
  const F f{body, N, R};
  const typename F::Policy policy = detail::team_policy<typename F::Policy>(space, (N + R - 1) / R, f, R, L)
                                        .set_scratch_size(0, Kokkos::PerTeam(F::Scratch::shmem_size(2 * R * L)));
  Kokkos::parallel_for(label, policy, f);
}

}  // namespace gnh::kernels
