// SPDX-License-Identifier: BSD-3-Clause
// The host arithmetic of the statistical consistency checks
// (analysis/statistics.hpp): the incomplete gamma functions against closed
// forms, Holm's procedure on given p-values, and the false-alarm rate of the
// noise_estimators check measured by simulation on populations of
// per-sequence gradients, at noise_samples = 2, 4 and 32.
#include <catch2/catch.hpp>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <numeric>
#include <random>
#include <vector>

#include "analysis/statistics.hpp"

using namespace gnh;

TEST_CASE("the incomplete gamma functions against closed forms", "[statistics]") {
  for (const double x : {1e-6, 0.01, 0.5, 1.0, 2.0, 7.5, 30.0, 200.0}) {
    INFO("x = " << x);
    // a = 1: P = 1 - exp(-x); a = 1/2: P = erf(sqrt x); a = 3: Q = exp(-x)(1 + x + x^2/2).
    // The series and the continued fraction converge to about 1e-16; 1e-12
    // relative leaves room for the exp and lgamma of the prefix.
    CHECK(gamma_p(1, x) == Approx(-std::expm1(-x)).epsilon(1e-12));
    CHECK(gamma_q(1, x) == Approx(std::exp(-x)).epsilon(1e-12));
    CHECK(gamma_p(0.5, x) == Approx(std::erf(std::sqrt(x))).epsilon(1e-12));
    CHECK(gamma_q(0.5, x) == Approx(std::erfc(std::sqrt(x))).epsilon(1e-12));
    CHECK(gamma_q(3, x) == Approx(std::exp(-x) * (1 + x + x * x / 2)).epsilon(1e-12));
  }
  // Each tail where it is tiny, without cancellation: P(1, 1e-12) = 1e-12 - 5e-25.
  CHECK(gamma_p(1, 1e-12) == Approx(1e-12).epsilon(1e-9));
  CHECK(gamma_q(0.5, 400.0) == Approx(std::erfc(20.0)).epsilon(1e-10));
}

TEST_CASE("Holm's procedure on given p-values", "[statistics]") {
  // Family of 4 at alpha 0.05: thresholds 0.0125, 0.0167, 0.025, 0.05 in order.
  CHECK(holm_rejections({0.01, 0.04, 0.03, 0.005}, 0.05, 4) == std::vector<bool>{true, false, false, true});
  CHECK(holm_rejections({0.01, 0.012, 0.02, 0.04}, 0.05, 4) == std::vector<bool>{true, true, true, true});
  // A step that fails stops the procedure: 0.02 > 0.05/3, so 0.024 and 0.049
  // are kept though each is below its own step's threshold.
  CHECK(holm_rejections({0.024, 0.001, 0.049, 0.02}, 0.05, 4) == std::vector<bool>{false, true, false, false});
  // Checks not present count in the family: 2 of a family of 100.
  CHECK(holm_rejections({0.0004, 0.0006}, 0.05, 100) == std::vector<bool>{true, false});
}

namespace {

// A population of n per-sequence gradients a_i (dimension p) of one shape,
// and the check's two sides computed from it as the analysis does.
struct Population {
  int n = 0, p = 0;
  std::vector<double> a;  // (n, p)
  std::vector<double> G;  // (p)
  double trace = 0, trace_se = 0;
};

enum class Shape { rank_one, isotropic, heavy_tailed, heavy_rank_one };

Population make_population(Shape shape, int n, int p, std::mt19937_64& rng) {
  std::normal_distribution<double> normal;
  Population pop{n, p, std::vector<double>(std::size_t(n) * p), std::vector<double>(p, 0.0)};
  for (int i = 0; i < n; ++i) {
    // heavy_tailed: a lognormal scale per sequence over a decaying spectrum
    // (a few sequences dominate; |a_i - G|^2 has a long tail); heavy_rank_one:
    // the same scales along one direction.
    const bool heavy = shape == Shape::heavy_tailed || shape == Shape::heavy_rank_one;
    const double scale = heavy ? std::exp(normal(rng)) : 1.0;
    const double z = normal(rng);
    for (int k = 0; k < p; ++k) {
      const double u = shape == Shape::rank_one         ? (k == 0 ? z : 0.0)
                       : shape == Shape::heavy_rank_one ? (k == 0 ? scale * z : 0.0)
                       : shape == Shape::isotropic      ? normal(rng)
                                                        : scale * normal(rng) / (1.0 + k);
      pop.a[std::size_t(i) * p + k] = 0.3 + u;  // a common mean: G is not zero
    }
  }
  for (int i = 0; i < n; ++i)
    for (int k = 0; k < p; ++k) pop.G[k] += pop.a[std::size_t(i) * p + k] / n;
  std::vector<double> d(n, 0.0);
  for (int i = 0; i < n; ++i)
    for (int k = 0; k < p; ++k) d[i] += std::pow(pop.a[std::size_t(i) * p + k] - pop.G[k], 2);
  const Estimate e = mean_se(d);
  pop.trace = e.value;
  pop.trace_se = e.se;
  return pop;
}

// One check: m disjoint batches of B drawn without replacement, tr Sigma from
// them with the finite-population factor, against the population's.
double one_check_p(const Population& pop, int m, int B, std::mt19937_64& rng, std::vector<int>& order) {
  std::iota(order.begin(), order.end(), 0);
  for (int i = pop.n - 1; i > 0; --i) std::swap(order[i], order[std::uniform_int_distribution<int>(0, i)(rng)]);
  double sum = 0;
  std::vector<double> xi(pop.p);
  for (int j = 0; j < m; ++j) {
    std::fill(xi.begin(), xi.end(), 0.0);
    for (int b = 0; b < B; ++b)
      for (int k = 0; k < pop.p; ++k) xi[k] += pop.a[std::size_t(order[j * B + b]) * pop.p + k] / B;
    for (int k = 0; k < pop.p; ++k) sum += std::pow(xi[k] - pop.G[k], 2);
  }
  const double fpc = double(pop.n - 1) / double(pop.n - B);
  const double batch = B * fpc * sum / m;
  return noise_estimators_consistency(batch, pop.trace, pop.trace_se, pop.n, m, B, pop.n).p_value;
}

struct Rates {
  double p05 = 0, p01 = 0;  // per check: the share with p <= 0.05, <= 0.01
  double campaigns = 0;     // the share of campaigns with an alarm (Holm at kConsistencyAlpha)
};

// `campaigns` campaigns of `checks` checks each (a population per campaign,
// as a campaign's states each have their own), every check correct.
Rates simulate(Shape shape, int m, int campaigns, int checks, std::uint64_t seed) {
  const int n = 256, p = 24, B = 8;
  std::mt19937_64 rng(seed);
  std::vector<int> order(n);
  Rates r;
  long long total = 0, below05 = 0, below01 = 0, alarmed = 0;
  for (int c = 0; c < campaigns; ++c) {
    const Population pop = make_population(shape, n, p, rng);
    std::vector<double> ps(checks);
    for (int i = 0; i < checks; ++i) {
      ps[i] = one_check_p(pop, m, B, rng, order);
      below05 += ps[i] <= 0.05;
      below01 += ps[i] <= 0.01;
    }
    total += checks;
    const auto reject = holm_rejections(ps, kConsistencyAlpha, std::size_t(checks));
    alarmed += std::count(reject.begin(), reject.end(), true) > 0;
  }
  r.p05 = double(below05) / double(total);
  r.p01 = double(below01) / double(total);
  r.campaigns = double(alarmed) / double(campaigns);
  return r;
}

}  // namespace

TEST_CASE("noise_estimators: the deviation and p-value of a given case", "[statistics]") {
  // m = 4 batches of B = 8 of n = 256 sequences with cv_d = 1 (d_i exponential-like):
  // kappa = 1/8 * 255/248 + 2 * 7/8 = 1.878...
  const double n = 256, B = 8, m = 4, se = 1.0 / std::sqrt(n);  // tr_seq = 1, sd(d) = 1
  const double kappa = 1.0 / B * (n - 1) / (n - B) + 2 * (1 - 1 / B);
  const ConsistencyCheck same = noise_estimators_consistency(1.0, 1.0, se, n, m, B, n);
  REQUIRE(same.checked);
  CHECK(same.deviation == 0.0);
  // At R = 1 the Gamma(m/kappa, kappa) sum m R = m sits near its median: p near 1.
  CHECK(same.p_value > 0.8);
  const ConsistencyCheck twice = noise_estimators_consistency(2.0, 1.0, se, n, m, B, n);
  CHECK(twice.deviation == Approx(std::sqrt(m / kappa)).epsilon(1e-12));
  CHECK(twice.p_value == Approx(2 * gamma_q(m / kappa, 2 * m / kappa)).epsilon(1e-12));
  // Ten times the per-sequence value from four batches is an alarm at any campaign size.
  CHECK(noise_estimators_consistency(10.0, 1.0, se, n, m, B, n).p_value < 1e-6);
  // Unchecked: no batch, no per-sequence side, one batch of the whole epoch.
  CHECK(!noise_estimators_consistency(1.0, 1.0, se, n, 0, B, n).checked);
  CHECK(!noise_estimators_consistency(1.0, std::nan(""), se, n, m, B, n).checked);
  CHECK(!noise_estimators_consistency(1.0, 1.0, se, n, 1, n, n).checked);
}

TEST_CASE("noise_estimators: false alarms of correct results, simulated", "[statistics][simulation]") {
  // 100 campaigns of 308 checks (154 states x 2 cases, a Pythia suite) for
  // each population shape and noise_samples. The seeds are fixed: the
  // measured rates are the same on every run. Bounds: per check, p <= 0.01
  // happens at most 1% of the time up to the binomial noise of 30,800 checks
  // (sd 0.057%: 1.25% is 4 sd above); rank one is the case the variance bound
  // is tight for, the others are conservative. Per campaign, an alarm in at
  // most 3 of 100 campaigns (at a true rate of 1%, P(more than 3) = 1.8%,
  // and the seeds fix which way it fell; perf/NOTES.md has the measurement
  // over 2,000 campaigns).
  for (const Shape shape : {Shape::rank_one, Shape::isotropic, Shape::heavy_tailed, Shape::heavy_rank_one})
    for (const int m : {2, 4, 32}) {
      const Rates r = simulate(shape, m, 100, 308, 1000 + 10 * int(shape) + m);
      INFO("shape " << int(shape) << " noise_samples " << m << ": p<=0.05 " << r.p05 << ", p<=0.01 " << r.p01
                    << ", campaigns alarmed " << r.campaigns);
      CHECK(r.p01 <= 0.0125);
      CHECK(r.p05 <= 0.055);
      CHECK(r.campaigns <= 0.03);
      // Not vacuous: the checks' p-values spread over (0, 1] (a check that
      // never came near a small p-value could not alarm at all).
      if (shape == Shape::rank_one) CHECK(r.p05 >= 0.02);
    }
}

TEST_CASE("noise_estimators: false alarms over many campaigns", "[simulation][bench]") {
  // The measurement quoted in perf/NOTES.md (`test_statistics "[simulation][bench]"`,
  // 23 s: left to `ctest -L bench`): 2,000 campaigns of each configuration,
  // where an alarm rate of 1% would show as 20 +- 4.5 alarmed campaigns.
  for (const Shape shape : {Shape::rank_one, Shape::isotropic, Shape::heavy_tailed, Shape::heavy_rank_one})
    for (const int m : {2, 4, 32}) {
      const Rates r = simulate(shape, m, 2000, 308, 5000 + 10 * int(shape) + m);
      std::printf("shape %d noise_samples %2d: p<=0.05 %.4f p<=0.01 %.4f campaigns alarmed %.4f\n", int(shape), m,
                  r.p05, r.p01, r.campaigns);
      CHECK(r.campaigns < 0.01);
    }
}
