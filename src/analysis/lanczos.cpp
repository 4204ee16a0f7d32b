// SPDX-License-Identifier: BSD-3-Clause
#include "analysis/lanczos.hpp"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <numeric>
#include <stdexcept>

#include "core/error.hpp"

namespace gnh {

std::size_t lanczos_bytes(index_t n_params, const CurvatureSettings& c, index_t directions_per_pass, int members) {
  if (c.lanczos_steps <= 0) return 0;
  const auto P = std::size_t(n_params), C = std::size_t(c.lanczos_chains);
  const std::size_t chunks = (P + std::size_t(kLanczosChunk) - 1) / std::size_t(kLanczosChunk);
  const std::size_t local = (chunks + std::size_t(members) - 1) / std::size_t(members) * std::size_t(kLanczosChunk);
  const std::size_t rows = std::size_t(std::min<index_t>(c.lanczos_steps, n_params)) + 1;
  const auto K = std::size_t(std::min<index_t>(c.lanczos_chains, directions_per_pass));
  // The basis shard and the step's local work vectors; the chains' whole
  // current vectors, the assembled vector and H v in double; an exact sum
  // and a direction (at most 8 bytes) per direction of a pass.
  // With eigenvectors = k: their local parts and whole vectors in double,
  // and their float copy for the output.
  const auto k = std::size_t(c.eigenvectors);
  return sizeof(double) * std::min(local, P) * C * (rows + 1) + sizeof(double) * P * (C + 2) +
         (sizeof(__int128) + sizeof(double)) * P * K +
         k * (sizeof(double) * (std::min(local, P) + P) + sizeof(float) * P);
}

namespace {

// The eigenvalues d ascending with their rows of S (first, last, and every
// row where given), as RitzPairs.
RitzPairs sorted_pairs(const std::vector<double>& d, const std::vector<double>& first, const std::vector<double>& last,
                       const std::vector<std::vector<double>>& rows_of_s) {
  const std::size_t n = d.size();
  RitzPairs out;
  std::vector<std::size_t> order(n);
  std::iota(order.begin(), order.end(), std::size_t(0));
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return d[a] < d[b]; });
  for (std::size_t i : order) {
    out.values.push_back(d[i]);
    out.weights.push_back(first[i] * first[i]);
    out.last.push_back(last[i]);
  }
  if (!rows_of_s.empty()) {
    out.vectors.resize(n * n);
    for (std::size_t r = 0; r < n; ++r)
      for (std::size_t c = 0; c < n; ++c) out.vectors[r * n + c] = rows_of_s[r][order[c]];
  }
  return out;
}

}  // namespace

RitzPairs ritz_pairs(const std::vector<double>& alpha, const std::vector<double>& beta, bool vectors) {
  const std::size_t n = alpha.size();
  RitzPairs out;
  if (n == 0) return out;
  for (std::size_t i = 0; i < n; ++i)
    if (!std::isfinite(alpha[i]) || (i + 1 < n && !std::isfinite(beta[i])))
      fail("spectrum: the Lanczos tridiagonal has a non-finite entry at step ", i + 1);
  if (beta.size() + 1 < n) throw std::logic_error("gnh::ritz_pairs: fewer than n - 1 off-diagonal values");
  std::vector<double> d(alpha), e(n, 0.0);
  for (std::size_t i = 0; i + 1 < n; ++i) e[i] = beta[i];
  // Rows 0 and n - 1 of the accumulated rotations (S starts as the identity).
  std::vector<double> first(n, 0.0), last(n, 0.0);
  first[0] = 1;
  last[n - 1] = 1;
  // With vectors, every row of S: rows[r] = S(r, .).
  std::vector<std::vector<double>> rows_of_s;
  if (vectors)
    for (std::size_t r = 0; r < n; ++r) {
      rows_of_s.emplace_back(n, 0.0);
      rows_of_s.back()[r] = 1;
    }
  std::vector<std::vector<double>*> rotated{&first, &last};
  for (auto& r : rows_of_s) rotated.push_back(&r);
  for (std::size_t l = 0; l < n; ++l) {
    for (int iteration = 0;; ++iteration) {
      // The first negligible off-diagonal at or after l splits the matrix.
      std::size_t m = l;
      for (; m + 1 < n; ++m)
        if (std::abs(e[m]) <= DBL_EPSILON * (std::abs(d[m]) + std::abs(d[m + 1]))) break;
      if (m == l) break;
      if (iteration == 100) fail("spectrum: the Ritz values of a ", n, "-step tridiagonal did not converge");
      // Wilkinson shift from the leading 2x2 block, chased up from m to l.
      double g = (d[l + 1] - d[l]) / (2.0 * e[l]);
      double r = std::hypot(g, 1.0);
      g = d[m] - d[l] + e[l] / (g + std::copysign(r, g));
      double s = 1, c = 1, p = 0;
      bool split = false;
      for (std::size_t i = m; i-- > l;) {
        const double f = s * e[i], b = c * e[i];
        r = std::hypot(f, g);
        e[i + 1] = r;
        if (r == 0) {  // underflow: the block splits here; retry from l
          d[i + 1] -= p;
          e[m] = 0;
          split = true;
          break;
        }
        s = f / r;
        c = g / r;
        g = d[i + 1] - p;
        r = (d[i] - g) * s + 2.0 * c * b;
        p = s * r;
        d[i + 1] = g + p;
        g = c * r - b;
        for (std::vector<double>* row : rotated) {
          double& zi = (*row)[i];
          double& zj = (*row)[i + 1];
          const double t = zj;
          zj = s * zi + c * t;
          zi = c * zi - s * t;
        }
      }
      if (split) continue;
      d[l] -= p;
      e[l] = g;
      e[m] = 0;
    }
  }
  return sorted_pairs(d, first, last, rows_of_s);
}

const char* to_string(ChainStop s) {
  switch (s) {
    case ChainStop::running:
      return "running";
    case ChainStop::steps:
      return "steps";
    case ChainStop::converged:
      return "converged";
    case ChainStop::invariant_subspace:
      return "invariant_subspace";
  }
  return "?";
}

TopRitz top_ritz(const RitzPairs& r, double beta_next, index_t k) {
  TopRitz t;
  const index_t n = index_t(r.values.size());
  for (index_t i = n - 1; i >= 0 && n - 1 - i < k; --i) {
    t.values.push_back(r.values[std::size_t(i)]);
    t.residuals.push_back(std::abs(beta_next * r.last[std::size_t(i)]));
  }
  return t;
}

ChainStop chain_stop(const RitzPairs& r, double beta_next, index_t k, double tolerance, index_t steps,
                     index_t max_steps) {
  double norm = 0;
  for (double v : r.values) norm = std::max(norm, std::abs(v));
  // Full reorthogonalisation in double leaves a vanished residual at about
  // eps |T| per step; 1e-12 |T| is well above that and far below any
  // residual of a subspace that is not invariant.
  if (std::abs(beta_next) <= 1e-12 * norm) return ChainStop::invariant_subspace;
  if (tolerance > 0 && index_t(r.values.size()) >= k) {
    const TopRitz t = top_ritz(r, beta_next, k);
    if (std::all_of(t.residuals.begin(), t.residuals.end(), [&](double x) { return x <= tolerance * norm; }))
      return ChainStop::converged;
  }
  return steps >= max_steps ? ChainStop::steps : ChainStop::running;
}

SpectralDensity slq_density(const std::vector<RitzPairs>& chains, index_t points, double relative) {
  SpectralDensity out;
  double lo = INFINITY, hi = -INFINITY, scale = 0;
  for (const RitzPairs& c : chains)
    for (double v : c.values) {
      lo = std::min(lo, v);
      hi = std::max(hi, v);
      scale = std::max(scale, std::abs(v));
    }
  if (chains.empty() || !(lo <= hi) || points < 2) return out;
  const double width = hi > lo ? hi - lo : std::max(scale, DBL_MIN);
  const double sigma = relative * width;
  out.broadening = sigma;
  const double a = lo - 8 * sigma, b = hi + 8 * sigma, h = (b - a) / double(points - 1);
  const double norm = 1.0 / (sigma * std::sqrt(2.0 * M_PI) * double(chains.size()));
  out.grid.resize(std::size_t(points));
  out.density.assign(std::size_t(points), 0.0);
  for (index_t p = 0; p < points; ++p) out.grid[std::size_t(p)] = a + h * double(p);
  for (const RitzPairs& c : chains)
    for (std::size_t i = 0; i < c.values.size(); ++i) {
      if (c.weights[i] == 0) continue;
      for (index_t p = 0; p < points; ++p) {
        const double z = (out.grid[std::size_t(p)] - c.values[i]) / sigma;
        if (std::abs(z) < 40) out.density[std::size_t(p)] += c.weights[i] * norm * std::exp(-0.5 * z * z);
      }
    }
  return out;
}

}  // namespace gnh
