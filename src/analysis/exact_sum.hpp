// SPDX-License-Identifier: BSD-3-Clause
// Order-independent vector sums. Each addend is rounded down to a multiple of
// 2^-80 and added as a 128-bit integer, so the sum is the same bit for bit in
// any order and on any split over ranks (integer addition is associative).
// Range: |sum| < 2^47 (1.4e14); resolution 2^-80 (8e-25), far below the
// rounding of any float or double addend that matters here.
#pragma once
#include <cstdint>
#include <cstring>

#include "core/compat.hpp"
#include "core/types.hpp"

namespace gnh {

using fixed128 = __int128;

// floor(x 2^80) as a 128-bit integer.
KOKKOS_INLINE_FUNCTION fixed128 to_fixed(double x) {
  const double s = x * 0x1p80;  // exact: a power of two
  // |s| < 2^63: floor(s) is exact and fits int64. (The split below would put
  // a small negative s at hi = -1 and lo = 2^64 + s, which rounds to 2^64
  // for |s| < 2^11 and does not convert: an addend in (-2^-69, 0) counted as
  // -2^-16. Fixed 2026-12-01; see tests/unit/test_fastmath.cpp.)
  if (s > -0x1p63 && s < 0x1p63) return static_cast<fixed128>(static_cast<std::int64_t>(kmath::floor(s)));
  // |s| >= 2^63: s is an integer; hi = floor(s 2^-64), lo = s - hi 2^64 in
  // [0, 2^64), a multiple of s's ulp, so exact.
  const double hi = kmath::floor(s * 0x1p-64);  // |hi| < 2^63 within range
  const double lo = s - hi * 0x1p64;
  return (static_cast<fixed128>(static_cast<std::int64_t>(hi)) << 64) +
         static_cast<fixed128>(static_cast<std::uint64_t>(lo));
}

// The same value as to_fixed(double(x)) for a finite float, by integer
// arithmetic on its bits: x = +-m 2^(E-150), so x 2^80 = +-m 2^(E-70), an
// exact shift left, or a right shift that floors (toward -infinity, as
// floor does for a negative x). About 4x cheaper than the double path, where
// the conversion to uint64 has no AVX2 instruction: it is what the curvature
// passes pay per parameter and direction when they keep H v.
KOKKOS_INLINE_FUNCTION fixed128 to_fixed(float x) {
  std::uint32_t u;
  std::memcpy(&u, &x, sizeof(u));
  const int E = int((u >> 23) & 0xFFu);
  const std::int64_t m = E == 0 ? std::int64_t(u & 0x7FFFFFu) : std::int64_t((u & 0x7FFFFFu) | 0x800000u);
  const bool negative = (u >> 31) != 0;
  const int shift = (E == 0 ? 1 : E) - 70;
  if (m == 0) return 0;
  if (shift >= 0) {
    const fixed128 v = static_cast<fixed128>(m) << shift;
    return negative ? -v : v;
  }
  const int r = -shift;
  if (r >= 40) return negative ? fixed128(-1) : fixed128(0);                         // 0 < m 2^-r < 1
  const std::int64_t q = negative ? (m + (std::int64_t(1) << r) - 1) >> r : m >> r;  // ceil for -, floor for +
  return negative ? -fixed128(q) : fixed128(q);
}

KOKKOS_INLINE_FUNCTION double from_fixed(fixed128 v) {
  // Within int64 one conversion rounds once. (Split as below, a small
  // negative v had lo = 2^64 + v round to 2^64 and came out as 0.)
  const fixed128 lim = fixed128(1) << 62;
  if (v > -lim && v < lim) return double(static_cast<std::int64_t>(v)) * 0x1p-80;
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
    Kokkos::parallel_for(
        "gnh::exact_sum::add", range(space, size()), KOKKOS_LAMBDA(const index_t i) { a(i) += to_fixed(x[i]); });
  }
  // Elements offset .. offset + n - 1 += x[0 .. n - 1].
  template <class T>
  void add_at(const ExecSpace& space, const T* x, index_t offset, index_t n) {
    auto a = acc_;
    Kokkos::parallel_for(
        "gnh::exact_sum::add", range(space, n), KOKKOS_LAMBDA(const index_t i) { a(offset + i) += to_fixed(x[i]); });
  }
  // out = sum * scale
  void to_double(const ExecSpace& space, double* out, double scale) const {
    auto a = acc_;
    Kokkos::parallel_for(
        "gnh::exact_sum::to_double", range(space, size()),
        KOKKOS_LAMBDA(const index_t i) { out[i] = from_fixed(a(i)) * scale; });
  }

 private:
  View1<fixed128> acc_;
};

}  // namespace gnh
