// SPDX-License-Identifier: BSD-3-Clause
// The host arithmetic of the spectrum (analysis/lanczos.hpp): the Ritz pairs
// of a tridiagonal against its own moments, the stopping rule, the density.
#include <catch2/catch.hpp>
#include <cmath>
#include <random>

#include "analysis/lanczos.hpp"

using namespace gnh;

namespace {

// e_a^T T^k e_b for the tridiagonal (alpha, beta), by repeated products.
double moment(const std::vector<double>& alpha, const std::vector<double>& beta, int k, std::size_t a, std::size_t b) {
  const std::size_t n = alpha.size();
  std::vector<double> x(n, 0.0);
  x[b] = 1;
  for (int p = 0; p < k; ++p) {
    std::vector<double> y(n, 0.0);
    for (std::size_t i = 0; i < n; ++i) {
      y[i] = alpha[i] * x[i];
      if (i > 0) y[i] += beta[i - 1] * x[i - 1];
      if (i + 1 < n) y[i] += beta[i] * x[i + 1];
    }
    x = y;
  }
  return x[a];
}

}  // namespace

TEST_CASE("Ritz pairs reproduce the tridiagonal's moments from both ends", "[lanczos]") {
  std::mt19937_64 rng(7);
  std::normal_distribution<double> normal;
  for (std::size_t n : {1u, 2u, 3u, 17u, 80u}) {
    std::vector<double> alpha(n), beta(n);
    for (auto& a : alpha) a = normal(rng);
    for (auto& b : beta) b = std::abs(normal(rng)) + 0.1;
    if (n == 80) alpha[40] = 1e3;  // a well-separated outlier, as Hessians have
    const RitzPairs r = ritz_pairs(alpha, beta);
    REQUIRE(r.values.size() == n);
    for (std::size_t i = 1; i < n; ++i) REQUIRE(r.values[i - 1] <= r.values[i]);
    double norm = 0;
    for (double v : r.values) norm = std::max(norm, std::abs(v));
    // Gauss quadrature: sum_i S(0,i)^2 theta_i^k = (T^k)_00 for every k, and
    // the same from the last row (whose sizes the residuals use). Double
    // arithmetic on an n x n matrix: 1e-12 n |T|^k is orders above n eps.
    for (int k = 0; k <= 6; ++k) {
      double first = 0, last = 0;
      for (std::size_t i = 0; i < n; ++i) {
        first += r.weights[i] * std::pow(r.values[i], k);
        last += r.last[i] * r.last[i] * std::pow(r.values[i], k);
      }
      const double scale = std::pow(norm, k) * 1e-12 * double(n);
      REQUIRE(std::abs(first - moment(alpha, beta, k, 0, 0)) <= scale);
      REQUIRE(std::abs(last - moment(alpha, beta, k, n - 1, n - 1)) <= scale);
    }
  }
}

TEST_CASE("with vectors, S is orthogonal and diagonalises the tridiagonal", "[lanczos]") {
  // T S = S diag(theta) and S^T S = I (double arithmetic on n x n: 1e-12 n
  // of |T|), the rows 0 and n - 1 those of the values-only call, and the
  // values unchanged bit for bit (the same rotations).
  std::mt19937_64 rng(11);
  std::normal_distribution<double> normal;
  for (std::size_t n : {1u, 2u, 5u, 40u}) {
    std::vector<double> alpha(n), beta(n);
    for (auto& a : alpha) a = normal(rng);
    for (auto& b : beta) b = std::abs(normal(rng)) + 0.1;
    const RitzPairs plain = ritz_pairs(alpha, beta);
    const RitzPairs r = ritz_pairs(alpha, beta, true);
    REQUIRE(r.values == plain.values);
    REQUIRE(r.vectors.size() == n * n);
    double norm = 0;
    for (double v : r.values) norm = std::max(norm, std::abs(v));
    const double tol = 1e-12 * double(n) * std::max(norm, 1.0);
    auto S = [&](std::size_t row, std::size_t col) { return r.vectors[row * n + col]; };
    for (std::size_t i = 0; i < n; ++i) {
      REQUIRE(std::abs(S(0, i) * S(0, i) - plain.weights[i]) <= tol);
      REQUIRE(std::abs(std::abs(S(n - 1, i)) - std::abs(plain.last[i])) <= tol);
      for (std::size_t row = 0; row < n; ++row) {
        double ts = alpha[row] * S(row, i);
        if (row > 0) ts += beta[row - 1] * S(row - 1, i);
        if (row + 1 < n) ts += beta[row] * S(row + 1, i);
        REQUIRE(std::abs(ts - r.values[i] * S(row, i)) <= tol);
      }
      for (std::size_t j = 0; j < n; ++j) {
        double d = 0;
        for (std::size_t row = 0; row < n; ++row) d += S(row, i) * S(row, j);
        REQUIRE(std::abs(d - (i == j ? 1.0 : 0.0)) <= tol);
      }
    }
  }
}

TEST_CASE("a chain stops on converged residuals, on an invariant subspace, or at its budget", "[lanczos]") {
  // diag(5, 1) reached exactly: the next beta is 0.
  const RitzPairs d = ritz_pairs({5.0, 1.0}, {0.0});
  REQUIRE(d.values == std::vector<double>{1.0, 5.0});
  REQUIRE(chain_stop(d, 0.0, 1, 0.0, 2, 10) == ChainStop::invariant_subspace);
  // A 2x2 with coupling 0.5: residual of the top pair = beta_next |S(1, top)|.
  const RitzPairs r = ritz_pairs({2.0, 1.0}, {0.5});
  const TopRitz top = top_ritz(r, 1e-3, 1);
  REQUIRE(top.values.size() == 1);
  REQUIRE(top.values[0] == Approx(1.5 + std::sqrt(0.5)).epsilon(1e-14));
  REQUIRE(top.residuals[0] == Approx(1e-3 * std::abs(r.last[1])).epsilon(1e-14));
  REQUIRE(chain_stop(r, 1e-3, 1, 1e-3, 2, 10) == ChainStop::converged);  // residual < 1e-3 |T|
  REQUIRE(chain_stop(r, 1e-3, 1, 1e-6, 2, 10) == ChainStop::running);
  REQUIRE(chain_stop(r, 1e-3, 1, 0.0, 10, 10) == ChainStop::steps);
  REQUIRE(chain_stop(r, 1e-3, 3, 1.0, 2, 10) == ChainStop::running);  // fewer Ritz pairs than asked
}

TEST_CASE("the SLQ density has mass one and the chains' first two moments", "[lanczos]") {
  std::vector<RitzPairs> chains = {ritz_pairs({3.0, -1.0, 0.5}, {1.0, 0.25}), ritz_pairs({0.0, 2.0}, {0.7})};
  const SpectralDensity s = slq_density(chains, 1024, 0.01);
  REQUIRE(s.grid.size() == 1024);
  REQUIRE(s.broadening > 0);
  double mass = 0, m1 = 0, m2 = 0;
  for (std::size_t p = 0; p + 1 < s.grid.size(); ++p) {  // trapezoid
    const double h = s.grid[p + 1] - s.grid[p];
    auto f = [&](std::size_t i, int k) { return s.density[i] * std::pow(s.grid[i], k); };
    mass += 0.5 * h * (f(p, 0) + f(p + 1, 0));
    m1 += 0.5 * h * (f(p, 1) + f(p + 1, 1));
    m2 += 0.5 * h * (f(p, 2) + f(p + 1, 2));
  }
  double want1 = 0, want2 = 0;
  for (const RitzPairs& c : chains)
    for (std::size_t i = 0; i < c.values.size(); ++i) {
      want1 += c.weights[i] * c.values[i] / 2;
      want2 += c.weights[i] * c.values[i] * c.values[i] / 2;
    }
  // Gaussians sampled at sigma / 9 and cut at 8 sigma: the trapezoid rule is
  // exact to far below 1e-9.
  REQUIRE(std::abs(mass - 1) < 1e-9);
  REQUIRE(std::abs(m1 - want1) < 1e-9);
  REQUIRE(std::abs(m2 - s.broadening * s.broadening - want2) < 1e-9);
  // A perturbed weight moves the first moment: the check can fail.
  chains[0].weights[0] *= 1.001;
  const SpectralDensity t = slq_density(chains, 1024, 0.01);
  double m1t = 0;
  for (std::size_t p = 0; p + 1 < t.grid.size(); ++p)
    m1t += 0.5 * (t.grid[p + 1] - t.grid[p]) * (t.density[p] * t.grid[p] + t.density[p + 1] * t.grid[p + 1]);
  REQUIRE(std::abs(m1t - want1) > 1e-6);
}
