// SPDX-License-Identifier: BSD-3-Clause
// fexp and ferf (core/fastmath.hpp) against the double library functions over
// every 64th float of their ranges, with the error bounds the header states.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "core/fastmath.hpp"

namespace {
float from_bits(std::uint32_t b) {
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}
// One unit in the last place of float at |v| (v normal or zero).
double ulp(double v) {
  const double a = std::fabs(v);
  if (a < std::numeric_limits<float>::min()) return std::ldexp(1.0, -149);
  int e;
  std::frexp(a, &e);
  return std::ldexp(1.0, e - 24);
}
}  // namespace

TEST_CASE("fexp is within 4 ulp of exp over its range", "[fastmath]") {
  double worst = 0;
  for (std::uint64_t b = 0; b < (std::uint64_t(1) << 32); b += 64) {
    const float x = from_bits(std::uint32_t(b));
    if (!std::isfinite(x) || x < -87.33654f || x > 88.72283f) continue;
    const double ref = std::exp(double(x));
    const double err = std::fabs(double(gnh::fexp(x)) - ref) / ulp(ref);
    worst = std::max(worst, err);
    if (err > 4) FAIL("fexp(" << x << ") = " << gnh::fexp(x) << ", exp = " << ref << ", " << err << " ulp");
  }
  INFO("worst " << worst << " ulp");
  REQUIRE(worst <= 4);
  CHECK(gnh::fexp(-100.0f) == 0.0f);
  CHECK(gnh::fexp(-std::numeric_limits<float>::infinity()) == 0.0f);
  CHECK(std::isinf(gnh::fexp(100.0f)));
  CHECK(gnh::fexp(0.0f) == 1.0f);
}

TEST_CASE("ferf is within 4 ulp of erf", "[fastmath]") {
  double worst_abs = 0, worst_rel = 0;
  for (std::uint64_t b = 0; b < (std::uint64_t(1) << 32); b += 64) {
    const float x = from_bits(std::uint32_t(b));
    if (!std::isfinite(x)) continue;
    const double ref = std::erf(double(x)), got = gnh::ferf(x);
    const double abs_ulp = std::fabs(got - ref) / std::ldexp(1.0, -24);  // ulp of 1 below 1
    worst_abs = std::max(worst_abs, abs_ulp);
    if (std::fabs(x) < 1) worst_rel = std::max(worst_rel, std::fabs(got - ref) / ulp(ref));
    if (abs_ulp > 4) FAIL("ferf(" << x << ") = " << got << ", erf = " << ref);
  }
  INFO("worst " << worst_abs << " ulp of 1, " << worst_rel << " ulp relative below 1");
  REQUIRE(worst_abs <= 4);
  REQUIRE(worst_rel <= 4);
  CHECK(gnh::ferf(0.0f) == 0.0f);
  CHECK(std::isnan(gnh::ferf(std::nanf(""))));
  CHECK(gnh::ferf(10.0f) == 1.0f);
  CHECK(gnh::ferf(-10.0f) == -1.0f);
}
