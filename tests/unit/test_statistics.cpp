// SPDX-License-Identifier: BSD-3-Clause
// The host arithmetic behind the noise_estimators identity's bar
// (analysis/statistics.hpp): Student's t tail and quantile against their
// closed forms at 1 and 2 degrees of freedom and the normal limit, and
// Welch-Satterthwaite's degrees of freedom.
#include <catch2/catch.hpp>
#include <cmath>
#include <limits>

#include "analysis/statistics.hpp"

using namespace gnh;

namespace {
const double pi = std::acos(-1.0);
// The two-sided three-sigma tail of the normal: 0.27%.
const double three_sigma = std::erfc(3 / std::sqrt(2.0));
}  // namespace

TEST_CASE("Student's t quantiles against closed forms", "[statistics]") {
  for (const double alpha : {0.5, 0.05, three_sigma, 1e-4}) {
    // nu = 1 (Cauchy): P(|T| > t) = 1 - 2 atan(t) / pi, so t = cot(pi alpha / 2).
    const double t1 = 1 / std::tan(pi * alpha / 2);
    // nu = 2: P(|T| > t) = 1 - t / sqrt(2 + t^2), so t^2 = 2 q^2 / (1 - q^2) with q = 1 - alpha.
    const double q = 1 - alpha;
    const double t2 = std::sqrt(2 * q * q / (1 - q * q));
    // The continued fraction converges to double rounding and the bisection
    // stops at a relative 1e-12; 1e-9 leaves room for the tail's slope.
    CHECK(student_t_quantile(alpha, 1) == Approx(t1).epsilon(1e-9));
    CHECK(student_t_quantile(alpha, 2) == Approx(t2).epsilon(1e-9));
    CHECK(student_t_tail(t1, 1) == Approx(alpha).epsilon(1e-9));
    CHECK(student_t_tail(t2, 2) == Approx(alpha).epsilon(1e-9));
  }
  // The normal limit: 3 at the three-sigma tail, from the erfc path and from
  // the beta function at a large nu (the difference there is O(1/nu)).
  CHECK(student_t_quantile(three_sigma, std::numeric_limits<double>::infinity()) == Approx(3.0).epsilon(1e-9));
  CHECK(student_t_quantile(three_sigma, 1e9) == Approx(3.0).epsilon(1e-6));
  // Heavier tails with fewer degrees of freedom, fractional ones between.
  double last = std::numeric_limits<double>::infinity();
  for (const double nu : {1.0, 2.0, 3.0, 3.5, 4.0, 10.0, 100.0}) {
    const double t = student_t_quantile(three_sigma, nu);
    CHECK(t < last);
    CHECK(t > 3.0);
    last = t;
  }
  // nu = 3 (the bar with four noise samples): P(|T| > t) = 1 - (2 / pi)
  // (t / (sqrt(3) (1 + t^2 / 3)) + atan(t / sqrt(3))), here about 9.22.
  const double t3 = student_t_quantile(three_sigma, 3);
  const double r3 = std::sqrt(3.0);
  CHECK(1 - 2 / pi * (t3 / (r3 * (1 + t3 * t3 / 3)) + std::atan(t3 / r3)) == Approx(three_sigma).epsilon(1e-9));
  CHECK(t3 == Approx(9.2189).epsilon(1e-4));
}

TEST_CASE("Welch's degrees of freedom", "[statistics]") {
  // Equal errors from equal samples: the pooled 2 (n - 1).
  CHECK(welch_dof(0.3, 5, 0.3, 5) == Approx(8.0).epsilon(1e-12));
  // One side without error: the other side's n - 1.
  CHECK(welch_dof(0.3, 4, 0.0, 1000) == Approx(3.0).epsilon(1e-12));
  // A side on many samples and of comparable error leaves the other's few
  // degrees of freedom nearly whole: between 3 and 3 times 4 (the formula's bound).
  const double nu = welch_dof(1.0, 4, 1.0, 1e6);
  CHECK(nu > 3.0);
  CHECK(nu < 12.0);
  CHECK(std::isinf(welch_dof(0.0, 4, 0.0, 4)));
}
