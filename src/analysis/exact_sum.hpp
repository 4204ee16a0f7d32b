// SPDX-License-Identifier: BSD-3-Clause
// Order-independent vector sums. Each addend is rounded down to a multiple of
// 2^-80 and added as a 128-bit integer, so the sum is the same bit for bit in
// any order and on any split over ranks (integer addition is associative).
// Range: |sum| < 2^47 (1.4e14); resolution 2^-80 (8e-25), far below the
// rounding of any float or double addend that matters here.
#pragma once
#include "core/compat.hpp"
#include "core/types.hpp"

namespace gnh {

using fixed128 = __int128;

KOKKOS_INLINE_FUNCTION fixed128 to_fixed(double x) {
  const double s = x * 0x1p80;                       // exact: a power of two
  const double hi = kmath::floor(s * 0x1p-64);  // |hi| < 2^63 within range
  const double lo = s - hi * 0x1p64;                 // in [0, 2^64), exact
  return (static_cast<fixed128>(static_cast<std::int64_t>(hi)) << 64) +
         static_cast<fixed128>(static_cast<std::uint64_t>(lo));
}

KOKKOS_INLINE_FUNCTION double from_fixed(fixed128 v) {
  const std::int64_t hi = static_cast<std::int64_t>(v >> 64);
  const std::uint64_t lo = static_cast<std::uint64_t>(v);
  return (double(hi) * 0x1p64 + double(lo)) * 0x1p-80;
}

class ExactSum {
 public:
  ExactSum() = default;
  explicit ExactSum(index_t n) : acc_("gnh::exact_sum", n) {}
  index_t size() const { return acc_.extent(0); }
  View1<fixed128> raw() const { return acc_; }
  void clear(const ExecSpace& space) { Kokkos::deep_copy(space, acc_, fixed128(0)); }

  template <class T>
  void add(const ExecSpace& space, const T* x) {
    auto a = acc_;
    Kokkos::parallel_for("gnh::exact_sum::add", range(space, size()),
                         KOKKOS_LAMBDA(const index_t i) { a(i) += to_fixed(double(x[i])); });
  }
  // out = sum * scale
  void to_double(const ExecSpace& space, double* out, double scale) const {
    auto a = acc_;
    Kokkos::parallel_for("gnh::exact_sum::to_double", range(space, size()),
                         KOKKOS_LAMBDA(const index_t i) { out[i] = from_fixed(a(i)) * scale; });
  }

 private:
  View1<fixed128> acc_;
};

}  // namespace gnh
