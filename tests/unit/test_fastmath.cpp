// SPDX-License-Identifier: BSD-3-Clause
// fexp and ferf (core/fastmath.hpp) against the double library functions over
// every 64th float of their ranges (2^26 of them), with the error bounds the
// header states. GNH_FASTMATH_STRIDE samples more sparsely: the Arm check under
// qemu takes every 1024th float (2^22), where every 64th cost 99 of its
// 99-second unit-test run.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <vector>

#include "analysis/dot.hpp"
#include "analysis/exact_sum.hpp"
#include "core/fastmath.hpp"

namespace {
std::uint64_t stride() {
  const char* s = std::getenv("GNH_FASTMATH_STRIDE");
  const long long n = s ? std::atoll(s) : 0;
  return n > 0 ? std::uint64_t(n) : 64;
}
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
  for (std::uint64_t b = 0, step = stride(); b < (std::uint64_t(1) << 32); b += step) {
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

TEST_CASE("fexp_bounded gives fexp's bits wherever x <= 88", "[fastmath]") {
  // Every stride-th float: all negative ones (down to -inf) and the positive
  // ones up to 88, where fexp_bounded drops fexp's two-factor 2^n.
  std::uint64_t checked = 0;
  for (std::uint64_t b = 0, step = stride(); b < (std::uint64_t(1) << 32); b += step) {
    const float x = from_bits(std::uint32_t(b));
    if (std::isnan(x) || x > 88.0f) continue;
    const float a = gnh::fexp(x), e = gnh::fexp_bounded(x);
    if (std::memcmp(&a, &e, sizeof a) != 0) FAIL("x = " << x << ": fexp " << a << ", fexp_bounded " << e);
    ++checked;
  }
  REQUIRE(checked > (std::uint64_t(1) << 31) / stride());
  for (const float x : {88.0f, -87.33654f, -87.3365f, -126.0f * 0.6931472f, 0.0f, -0.0f}) {
    const float a = gnh::fexp(x), e = gnh::fexp_bounded(x);
    CAPTURE(x);
    REQUIRE(std::memcmp(&a, &e, sizeof a) == 0);
  }
  CHECK(std::isnan(gnh::fexp_bounded(std::numeric_limits<float>::quiet_NaN())));
}

TEST_CASE("ferf is within 4 ulp of erf", "[fastmath]") {
  double worst_abs = 0, worst_rel = 0;
  for (std::uint64_t b = 0, step = stride(); b < (std::uint64_t(1) << 32); b += step) {
    const float x = from_bits(std::uint32_t(b));
    if (!std::isfinite(x)) continue;
    const double ref = std::erf(double(x)), got = gnh::ferf(x);
    const double abs_ulp = std::fabs(got - ref) / std::ldexp(1.0, -24);  // ulp of 1 below 1
    worst_abs = std::max(worst_abs, abs_ulp);
    if (std::fabs(x) < 1) worst_rel = std::max(worst_rel, std::fabs(got - ref) / ulp(ref));
    if (abs_ulp > 4) FAIL("ferf(" << x << ") = " << got << ", erf = " << ref);
    // The exponential ferf_exp hands back (GELU's phi) is fexp(-x^2), bit for bit.
    float e = 0.0f;
    const float both = gnh::ferf_exp(x, e);
    if (!(both == float(got) && (e == gnh::fexp(-x * x) || (std::isnan(e) && std::isnan(x)))))
      FAIL("ferf_exp(" << x << ") = " << both << ", e = " << e << "; ferf " << got << ", fexp(-x^2) "
                       << gnh::fexp(-x * x));
  }
  INFO("worst " << worst_abs << " ulp of 1, " << worst_rel << " ulp relative below 1");
  REQUIRE(worst_abs <= 4);
  REQUIRE(worst_rel <= 4);
  CHECK(gnh::ferf(0.0f) == 0.0f);
  CHECK(std::isnan(gnh::ferf(std::nanf(""))));
  CHECK(gnh::ferf(10.0f) == 1.0f);
  CHECK(gnh::ferf(-10.0f) == -1.0f);
}

TEST_CASE("exact sums: a float's fixed-point value by its bits equals the double path", "[exact_sum]") {
  // Every exponent a curvature term can have (|x| < 2^47, the sums' range),
  // both signs, zero, -0, denormals and values below the 2^-80 resolution,
  // which floor to 0 or to -1 unit: the two paths must agree bit for bit,
  // or the sums of H v would change with the kernel that formed them.
  std::uint32_t state = 12345;
  auto next = [&] {
    state = state * 1664525u + 1013904223u;
    return state;
  };
  std::vector<float> xs = {0.0f,
                           -0.0f,
                           1.0f,
                           -1.0f,
                           std::numeric_limits<float>::denorm_min(),
                           -std::numeric_limits<float>::denorm_min(),
                           0x1p-80f,
                           -0x1p-80f,
                           0x1.8p-81f,
                           -0x1.8p-81f,
                           0x1p46f,
                           -0x1p46f,
                           0x1.fffffep46f,
                           -0x1.fffffep46f};
  for (int e = -149; e < 47; ++e)
    for (int k = 0; k < 20; ++k) {
      const float m = 1.0f + float(next() >> 9) * 0x1p-23f;
      xs.push_back(std::ldexp(m, e) * ((next() & 1u) ? -1.0f : 1.0f));
    }
  for (float x : xs) {
    CAPTURE(x);
    REQUIRE(gnh::to_fixed(x) == gnh::to_fixed(double(x)));
  }
  // floor(x 2^80), in units of 2^-80, for small negatives too (the double
  // path once gave -2^64 units for an addend in (-2^-69, 0)).
  REQUIRE(gnh::to_fixed(-0x1p-80) == -1);
  REQUIRE(gnh::to_fixed(-0x1.8p-80) == -2);
  REQUIRE(gnh::to_fixed(-1e-30) == -1);  // -1.2e-6 units
  REQUIRE(gnh::to_fixed(1e-30) == 0);
  REQUIRE(gnh::to_fixed(-0x1p-70) == -1024);
  REQUIRE(gnh::to_fixed(-3.0) == -(gnh::fixed128(3) << 80));
  REQUIRE(gnh::to_fixed(0x1p40 + 0.5) == (gnh::fixed128(1) << 120) + (gnh::fixed128(1) << 79));
  for (double x : {-1e-25, -2.5e-22, -1.0, 3.75, -0x1.23456789abcdp-30, 0x1p46}) {
    CAPTURE(x, double(gnh::from_fixed(gnh::to_fixed(x)) - x));
    REQUIRE(std::abs(gnh::from_fixed(gnh::to_fixed(x)) - x) <=
            0x1p-80 + std::abs(x) * 0x1p-52);  // floor, then double rounding
  }
}

namespace {
// analysis/dot.hpp's order, written out on the host: lane g % 32 of chunk
// g / 4096 adds its terms in increasing g, the lanes pairwise (16, 8, ..., 1),
// and the chunks' sums by the same rule, level by level.
double rule_sum(std::vector<double> x, std::int64_t origin) {
  while (true) {
    const std::int64_t C = gnh::kDotChunk, L = gnh::kDotLanes, n = std::int64_t(x.size());
    std::vector<double> next;
    for (std::int64_t c = origin / C; c <= (origin + n - 1) / C; ++c) {
      double lanes[32] = {};
      for (std::int64_t g = std::max(origin, c * C); g < std::min(origin + n, (c + 1) * C); ++g)
        lanes[g % L] += x[std::size_t(g - origin)];
      for (std::int64_t w = L / 2; w >= 1; w /= 2)
        for (std::int64_t l = 0; l < w; ++l) lanes[l] += lanes[l + w];
      next.push_back(lanes[0]);
    }
    if (next.size() == 1) return next[0];
    x = next;
    origin /= C;
  }
}
// The chunks' sums of two slices, one after the other (as ranks gather them).
gnh::View1<double> joined(gnh::View1<double> a, gnh::View1<double> b) {
  const gnh::index_t na = gnh::index_t(a.extent(0)), n = na + gnh::index_t(b.extent(0));
  gnh::View1<double> out("joined", n);
  Kokkos::deep_copy(Kokkos::subview(out, std::make_pair(gnh::index_t(0), na)), a);
  Kokkos::deep_copy(Kokkos::subview(out, std::make_pair(na, n)), b);
  return out;
}
}  // namespace

TEST_CASE("dot products: one order by global index, the same bits over any chunk-aligned slices", "[dot]") {
  const gnh::ExecSpace space;
  const gnh::index_t n = 5 * gnh::kDotChunk + 1234;
  gnh::View1<float> a("a", n);
  gnh::View1<double> b("b", n);
  auto ha = Kokkos::create_mirror_view(a);
  auto hb = Kokkos::create_mirror_view(b);
  std::uint64_t state = 99;
  auto next = [&state] { return (state = state * 6364136223846793005ull + 1442695040888963407ull) >> 11; };
  std::vector<double> terms(std::size_t(n), 0.0);
  long double exact = 0, magnitude = 0;
  for (gnh::index_t i = 0; i < n; ++i) {
    ha(i) = float(std::ldexp(double(next() % 2000001) - 1e6, -20 - int(next() % 8)));
    hb(i) = std::ldexp(double(next() % 2000001) - 1e6, -10);
    terms[std::size_t(i)] = double(ha(i)) * hb(i);
    exact += (long double)ha(i) * hb(i);
    magnitude += std::fabs((long double)ha(i) * hb(i));
  }
  Kokkos::deep_copy(a, ha);
  Kokkos::deep_copy(b, hb);
  const double whole = gnh::dot(space, a.data(), b.data(), n);
  // The documented order, exactly; and the true sum to double rounding:
  // each term is rounded once (a float times a double) and then passes
  // through at most 128 additions in its lane (4096 / 32 terms), 5 in the
  // lanes' tree and 5 in the chunks' (6 chunks, one level): recursive
  // summation's bound, (1 + 128 + 5 + 5) eps times the sum of |terms|.
  REQUIRE(whole == rule_sum(terms, 0));
  REQUIRE(std::fabs(double(whole - exact)) <= 139 * 0x1p-52 * double(magnitude));
  // A vector in slices cut at chunk multiples (as ranks holding slices of a
  // sharded vector sum their chunks): its chunks' sums gathered, the same bits.
  for (gnh::index_t cut : {gnh::kDotChunk, 3 * gnh::kDotChunk}) {
    auto left = gnh::chunk_sums(space, gnh::DotTerm<float, double>{a.data(), b.data(), false}, cut, 0);
    auto right =
        gnh::chunk_sums(space, gnh::DotTerm<float, double>{a.data() + cut, b.data() + cut, false}, n - cut, cut);
    CAPTURE(cut);
    REQUIRE(gnh::sum_chunks(space, joined(left, right), 0) == whole);
  }
  // A range that starts inside a chunk (a tensor's block of a flat vector)
  // keeps its elements' global indices: cut anywhere at a chunk multiple of
  // those, the same bits again.
  const gnh::index_t lo = 1000, len = n - 2000;
  const double block = gnh::dot(space, a.data() + lo, b.data() + lo, len, false, lo);
  REQUIRE(block == rule_sum(std::vector<double>(terms.begin() + lo, terms.begin() + lo + len), lo));
  auto head = gnh::chunk_sums(space, gnh::DotTerm<float, double>{a.data() + lo, b.data() + lo, false},
                              2 * gnh::kDotChunk - lo, lo);
  auto tail = gnh::chunk_sums(
      space, gnh::DotTerm<float, double>{a.data() + 2 * gnh::kDotChunk, b.data() + 2 * gnh::kDotChunk, false},
      lo + len - 2 * gnh::kDotChunk, 2 * gnh::kDotChunk);
  REQUIRE(gnh::sum_chunks(space, joined(head, tail), lo / gnh::kDotChunk) == block);
  // The chunks' sums of more than one chunk of chunks: two levels.
  std::vector<double> partials(std::size_t(gnh::kDotChunk + 77));
  for (double& p : partials) p = std::ldexp(double(next() % 2000001) - 1e6, -30);
  gnh::View1<double> p("p", gnh::index_t(partials.size()));
  auto hp = Kokkos::create_mirror_view(p);
  for (std::size_t i = 0; i < partials.size(); ++i) hp(gnh::index_t(i)) = partials[i];
  Kokkos::deep_copy(p, hp);
  REQUIRE(gnh::sum_chunks(space, p, 5) == rule_sum(partials, 5));
}
