// SPDX-License-Identifier: BSD-3-Clause
#include "analysis/statistics.hpp"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <utility>

namespace gnh {

Estimate mean_se(const std::vector<double>& x) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  Estimate e{nan, nan};
  if (x.empty()) return e;
  double s = 0;
  for (double v : x) s += v;
  e.value = s / double(x.size());
  if (x.size() < 2) return e;  // one sample has no spread to estimate an error from
  double ss = 0;
  for (double v : x) ss += (v - e.value) * (v - e.value);
  e.se = std::sqrt(ss / double(x.size() - 1)) / std::sqrt(double(x.size()));
  return e;
}

namespace {
Estimate scaled(Estimate e, double s) { return {e.value * s, e.se * std::abs(s)}; }

// Bins of a histogram of positive values: logarithmic from the smallest to
// the largest (linear where they are not all positive or all equal).
constexpr int histogram_bins = 32;

void histogram(const std::vector<double>& x, std::vector<double>& edges, std::vector<std::int64_t>& counts) {
  const auto [lo_it, hi_it] = std::minmax_element(x.begin(), x.end());
  const double lo = *lo_it, hi = *hi_it;
  const bool logarithmic = lo > 0 && hi > lo;
  edges.resize(histogram_bins + 1);
  for (int k = 0; k <= histogram_bins; ++k) {
    const double f = double(k) / histogram_bins;
    edges[std::size_t(k)] =
        logarithmic ? std::exp(std::log(lo) + f * (std::log(hi) - std::log(lo))) : lo + f * (hi > lo ? hi - lo : 1.0);
  }
  edges.front() = lo;
  if (hi > lo) edges.back() = hi;
  counts.assign(histogram_bins, 0);
  for (const double v : x) {
    // The bin whose [edge_k, edge_k+1) holds v, the last closed.
    const auto at = std::upper_bound(edges.begin(), edges.end(), v) - edges.begin() - 1;
    ++counts[std::size_t(std::clamp<std::ptrdiff_t>(at, 0, histogram_bins - 1))];
  }
}

// {P(a, x), Q(a, x)}: the one computed directly is the smaller one's side,
// so neither loses digits to cancellation where it is small.
std::pair<double, double> incomplete_gamma(double a, double x) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  if (!(a > 0) || !(x >= 0)) return {nan, nan};
  if (x == 0) return {0.0, 1.0};
  const double log_prefix = a * std::log(x) - x - std::lgamma(a);
  if (x < a + 1) {
    // The series of P(a, x).
    double term = 1.0 / a, sum = term;
    for (int k = 1; k < 100000 && std::abs(term) > 1e-17 * std::abs(sum); ++k) {
      term *= x / (a + k);
      sum += term;
    }
    const double P = sum * std::exp(log_prefix);
    return {P, 1.0 - P};
  }
  // The continued fraction of Q(a, x) (modified Lentz).
  const double tiny = 1e-300;
  double b = x + 1 - a, c = 1 / tiny, d = 1 / b, h = d;
  for (int i = 1; i < 100000; ++i) {
    const double an = -i * (i - a);
    b += 2;
    d = an * d + b;
    if (std::abs(d) < tiny) d = tiny;
    c = b + an / c;
    if (std::abs(c) < tiny) c = tiny;
    d = 1 / d;
    const double delta = d * c;
    h *= delta;
    if (std::abs(delta - 1) < 1e-16) break;
  }
  const double Q = std::exp(log_prefix) * h;
  return {1.0 - Q, Q};
}
}  // namespace

double gamma_p(double a, double x) { return incomplete_gamma(a, x).first; }
double gamma_q(double a, double x) { return incomplete_gamma(a, x).second; }

ConsistencyCheck noise_estimators_consistency(double trace_batch, double trace_seq, double trace_seq_se,
                                              double n_sequences, double m, double B, double n) {
  ConsistencyCheck c{"noise_estimators", 0, 1, false};
  if (!(m >= 1) || !(B >= 1) || !(n > B) || !std::isfinite(trace_batch) || !(trace_seq > 0)) return c;
  // cv_d from the per-sequence error sd(d)/sqrt(n) (an upper bound where the
  // pass had no a_i . G: kappa, and the check, err on the wide side).
  const double cv2 = std::isfinite(trace_seq_se) && n_sequences > 1
                         ? trace_seq_se * trace_seq_se * n_sequences / (trace_seq * trace_seq)
                         : 0.0;
  const double kappa = cv2 / B * (n - 1) / (n - B) + 2 * (1 - 1 / B);
  if (!(kappa > 0)) return c;  // B = 1 and every d_i equal: nothing varies
  const double R = trace_batch / trace_seq;
  c.checked = true;
  c.deviation = (R - 1) * std::sqrt(m / kappa);
  const double shape = m / kappa, x = std::max(0.0, m * R / kappa);
  const auto [lower, upper] = incomplete_gamma(shape, x);
  c.p_value = std::min(1.0, 2 * std::min(lower, upper));
  return c;
}

std::vector<bool> holm_rejections(const std::vector<double>& p, double alpha, std::size_t family) {
  family = std::max(family, p.size());
  std::vector<std::size_t> order(p.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return p[a] < p[b]; });
  std::vector<bool> reject(p.size(), false);
  for (std::size_t k = 0; k < order.size(); ++k) {
    if (!(p[order[k]] <= alpha / double(family - k))) break;
    reject[order[k]] = true;
  }
  return reject;
}

Estimate sequence_trace(double sum, double sum_sq, double n, double G_sqnorm) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  if (n < 1) return {nan, nan};
  const double mean = sum / n, tr = mean - G_sqnorm;
  if (n < 2) return {tr, nan};
  // d_i = |a_i - G|^2 = |a_i|^2 - 2 a_i.G + |G|^2 has sd(d) <= sd(|a|^2) +
  // 2 sd(a.G), and var(a.G) = G^T Sigma G <= |G|^2 tr(Sigma).
  const double var = std::max(0.0, (sum_sq - n * mean * mean) / (n - 1));
  const double sd = std::sqrt(var) + 2 * std::sqrt(G_sqnorm * std::max(tr, 0.0));
  return {tr, sd / std::sqrt(n)};
}

DerivedStatistics derive(const CaseMeasurements& m) {
  DerivedStatistics d;
  const double n = double(m.n_blocks), B = double(m.noise_batch);
  // E|xi|^2 = tr(Sigma)/B * (n-B)/(n-1) for B of n blocks drawn without replacement.
  d.fpc = n > B ? (n - 1) / (n - B) : std::numeric_limits<double>::quiet_NaN();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  if (m.xi_sqnorm.empty()) {
    d.trace_sigma = d.trace_HSigma = d.B_simple = d.B_noise = {nan, nan};
  } else {
    d.trace_sigma = scaled(mean_se(m.xi_sqnorm), B * d.fpc);
    d.trace_HSigma = scaled(mean_se(m.xiHxi), B * d.fpc);
    d.B_simple = scaled(d.trace_sigma, 1.0 / m.G_sqnorm);
    d.B_noise = scaled(d.trace_HSigma, 1.0 / m.GHG);
  }
  d.trace_H = mean_se(m.vHv);
  auto projected = [nan](const CaseMeasurements::ProjectedTrace& t) {
    if (t.rest.empty()) return Estimate{nan, nan};
    const Estimate e = mean_se(t.rest);
    return Estimate{t.top + e.value, e.se};
  };
  d.trace_H_hutchpp = projected(m.hutchpp);
  d.trace_H_deflated = projected(m.deflated);
  d.trace_ggn_hutchpp = projected(m.hutchpp_ggn);
  d.trace_variance_ratio = (d.trace_H.se * d.trace_H.se) / (d.trace_H_hutchpp.se * d.trace_H_hutchpp.se);
  d.frob_H = mean_se(m.Hv_sqnorm);
  d.effective_rank = d.trace_H.value * d.trace_H.value / d.frob_H.value;
  if (m.preconditioned) {
    d.GPG = m.GPG;
    d.PG_H_PG = m.PG_H_PG;
    d.curvature_preconditioned = m.PG_H_PG / m.GPG;
    if (m.xiPxi.empty()) {
      d.B_simple_P = d.B_noise_P = {nan, nan};
    } else {
      d.B_simple_P = scaled(mean_se(m.xiPxi), B * d.fpc / m.GPG);
      d.B_noise_P = scaled(mean_se(m.PxiHPxi), B * d.fpc / m.PG_H_PG);
    }
  } else {
    d.GPG = d.PG_H_PG = d.curvature_preconditioned = nan;
    d.B_simple_P = d.B_noise_P = {nan, nan};
  }
  d.n_sequences = nan;
  d.trace_sigma_seq = d.B_simple_seq = {nan, nan};
  if (!m.seq_sqnorm.empty()) {
    double sum = 0, sum_sq = 0;
    for (const double x : m.seq_sqnorm) {
      sum += x;
      sum_sq += x * x;
    }
    d.n_sequences = double(m.seq_sqnorm.size());
    d.trace_sigma_seq = sequence_trace(sum, sum_sq, d.n_sequences, m.G_sqnorm);
    if (m.seq_dot_G.size() == m.seq_sqnorm.size()) {
      // With every a_i . G: the error of the mean of d_i = |a_i - G|^2 itself.
      std::vector<double> dev(m.seq_sqnorm.size());
      for (std::size_t i = 0; i < dev.size(); ++i) dev[i] = m.seq_sqnorm[i] - 2 * m.seq_dot_G[i] + m.G_sqnorm;
      d.trace_sigma_seq.se = mean_se(dev).se;
    }
    d.B_simple_seq = scaled(d.trace_sigma_seq, 1.0 / m.G_sqnorm);
    histogram(m.seq_sqnorm, d.seq_hist_edges, d.seq_hist_counts);
  }
  d.GHG_ggn = d.residual_share = nan;
  d.xiHxi_ggn = d.trace_ggn = d.B_noise_ggn = {nan, nan};
  if (m.gauss_newton) {
    d.GHG_ggn = m.GHG_ggn;
    d.trace_ggn = mean_se(m.vGv_ggn);
    if (!m.xiHxi_ggn.empty()) {
      d.xiHxi_ggn = mean_se(m.xiHxi_ggn);
      d.B_noise_ggn = scaled(d.xiHxi_ggn, B * d.fpc / m.GHG_ggn);
    }
    if (m.hessian_too) d.residual_share = (m.GHG - m.GHG_ggn) / m.GHG;
  }
  d.GHG_over_G_sqnorm = m.GHG / m.G_sqnorm;
  d.eps_star = m.G_sqnorm / m.GHG;
  d.B_simple_tokens = scaled(d.B_simple, double(m.context));
  d.B_noise_tokens = scaled(d.B_noise, double(m.context));
  return d;
}

std::vector<std::pair<std::string, double>> DerivedStatistics::named() const {
  return {{"fpc", fpc},
          {"trace_sigma", trace_sigma.value},
          {"trace_sigma_se", trace_sigma.se},
          {"B_simple", B_simple.value},
          {"B_simple_se", B_simple.se},
          {"B_simple_tokens", B_simple_tokens.value},
          {"B_simple_tokens_se", B_simple_tokens.se},
          {"trace_HSigma", trace_HSigma.value},
          {"trace_HSigma_se", trace_HSigma.se},
          {"B_noise", B_noise.value},
          {"B_noise_se", B_noise.se},
          {"B_noise_tokens", B_noise_tokens.value},
          {"B_noise_tokens_se", B_noise_tokens.se},
          {"trace_H", trace_H.value},
          {"trace_H_se", trace_H.se},
          {"frob_H", frob_H.value},
          {"frob_H_se", frob_H.se},
          {"effective_rank", effective_rank},
          {"GPG", GPG},
          {"PG_H_PG", PG_H_PG},
          {"curvature_preconditioned", curvature_preconditioned},
          {"B_simple_P", B_simple_P.value},
          {"B_simple_P_se", B_simple_P.se},
          {"B_noise_P", B_noise_P.value},
          {"B_noise_P_se", B_noise_P.se},
          {"GHG_ggn", GHG_ggn},
          {"xiHxi_ggn", xiHxi_ggn.value},
          {"xiHxi_ggn_se", xiHxi_ggn.se},
          {"trace_ggn", trace_ggn.value},
          {"trace_ggn_se", trace_ggn.se},
          {"B_noise_ggn", B_noise_ggn.value},
          {"B_noise_ggn_se", B_noise_ggn.se},
          {"residual_share", residual_share},
          {"n_sequences", n_sequences},
          {"trace_sigma_seq", trace_sigma_seq.value},
          {"trace_sigma_seq_se", trace_sigma_seq.se},
          {"B_simple_seq", B_simple_seq.value},
          {"B_simple_seq_se", B_simple_seq.se},
          {"GHG_over_G_sqnorm", GHG_over_G_sqnorm},
          {"eps_star", eps_star},
          {"trace_H_hutchpp", trace_H_hutchpp.value},
          {"trace_H_hutchpp_se", trace_H_hutchpp.se},
          {"trace_H_deflated", trace_H_deflated.value},
          {"trace_H_deflated_se", trace_H_deflated.se},
          {"trace_ggn_hutchpp", trace_ggn_hutchpp.value},
          {"trace_ggn_hutchpp_se", trace_ggn_hutchpp.se},
          {"trace_variance_ratio", trace_variance_ratio}};
}

namespace {
// Column b of per-sample rows.
std::vector<double> column_of(const std::vector<std::vector<double>>& rows, std::size_t b) {
  std::vector<double> c;
  c.reserve(rows.size());
  for (const auto& r : rows) c.push_back(r[b]);
  return c;
}
}  // namespace

const std::vector<double>* BlockTable::column(const std::string& name) const {
  for (const auto& c : columns)
    if (c.first == name) return &c.second;
  return nullptr;
}

BlockTable derive_blocks(const BlockMeasurements& b, const CaseMeasurements& m, const DerivedStatistics& d) {
  BlockTable t;
  t.partition = b.partition;
  t.names = b.names;
  t.offsets = b.offsets;
  const std::size_t n = b.size();
  const double B = double(m.noise_batch);
  // Estimated quantities: (name, per-block estimate).
  auto estimated = [&](const std::string& name, const std::function<Estimate(std::size_t)>& f) {
    std::vector<double> v(n), se(n);
    for (std::size_t i = 0; i < n; ++i) {
      const Estimate e = f(i);
      v[i] = e.value;
      se[i] = e.se;
    }
    t.columns.emplace_back(name, std::move(v));
    t.columns.emplace_back(name + "_se", std::move(se));
  };
  t.columns.emplace_back("G_sqnorm", b.G_sqnorm);
  estimated("trace_sigma", [&](std::size_t i) { return scaled(mean_se(column_of(b.xi_sqnorm, i)), B * d.fpc); });
  estimated("B_simple", [&](std::size_t i) {
    return scaled(scaled(mean_se(column_of(b.xi_sqnorm, i)), B * d.fpc), 1.0 / b.G_sqnorm[i]);
  });
  if (!b.seq_sum.empty()) {
    const double n_seq = double(m.seq_sqnorm.size());
    estimated("trace_sigma_seq",
              [&](std::size_t i) { return sequence_trace(b.seq_sum[i], b.seq_sq[i], n_seq, b.G_sqnorm[i]); });
    estimated("B_simple_seq", [&](std::size_t i) {
      return scaled(sequence_trace(b.seq_sum[i], b.seq_sq[i], n_seq, b.G_sqnorm[i]), 1.0 / b.G_sqnorm[i]);
    });
  }
  if (!b.has_hv) return t;
  estimated("trace_H", [&](std::size_t i) { return mean_se(column_of(b.vHv, i)); });
  t.columns.emplace_back("GHG_contrib", b.GHG);
  estimated("xiHxi_contrib", [&](std::size_t i) { return mean_se(column_of(b.xiHxi, i)); });
  estimated("frob_H", [&](std::size_t i) { return mean_se(column_of(b.Hv_sqnorm, i)); });
  if (!b.vGv.empty()) estimated("trace_ggn", [&](std::size_t i) { return mean_se(column_of(b.vGv, i)); });
  if (!b.hutchpp.empty()) estimated("trace_H_hutchpp", [&](std::size_t i) { return mean_se(column_of(b.hutchpp, i)); });
  return t;
}

}  // namespace gnh
