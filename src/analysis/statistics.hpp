// SPDX-License-Identifier: BSD-3-Clause
// The derived statistics of SPEC §4 from the per-sample measurements of one
// case; definitions and estimators are in doc/statistics.md.
#pragma once
#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "core/index.hpp"

namespace gnh {

struct CaseMeasurements {
  index_t n_blocks = 0;     // blocks of the epoch
  index_t context = 0;      // tokens per block
  index_t noise_batch = 0;  // B, blocks per noise batch
  double G_sqnorm = 0, GHG = 0;
  std::vector<double> gB_sqnorm, xi_sqnorm, G_dot_xi, xiHxi;  // per noise sample
  std::vector<double> vHv;                                    // per direction
  std::vector<double> Hv_sqnorm;  // per direction |H v_k|^2, where the epoch's H v is kept (SPEC §10)
  // SPEC §10's AdamW preconditioner P, where the state has one: G^T P G,
  // (PG)^T H (PG), and per noise sample xi^T P xi and (P xi)^T H (P xi).
  bool preconditioned = false;
  double GPG = 0, PG_H_PG = 0;
  std::vector<double> xiPxi, PxiHPxi;
  // SPEC §10's Gauss-Newton part of H, where curvature.operator asks for it:
  // G^T GGN G, and per noise sample and direction the same forms of GGN; and
  // whether the Hessian's own statistics sit beside them ("both").
  bool gauss_newton = false, hessian_too = false;
  double GHG_ggn = 0;
  std::vector<double> xiHxi_ggn, vGv_ggn;
  // analysis.per_sequence (SPEC section 10): |a_i|^2 of every sequence's own
  // gradient, in epoch order; empty without it.
  std::vector<double> seq_sqnorm;
  // and a_i . G of each, from the curvature pass along G (empty where none ran)
  std::vector<double> seq_dot_G;
  // Variance-reduced traces (SPEC §13, doc/statistics.md): per estimator the
  // exact part tr(Q^T A Q) over an orthonormal Q and the Hutchinson samples
  // of the complement, g^T (I - QQ^T) A (I - QQ^T) g; empty: not computed.
  struct ProjectedTrace {
    double top = 0;
    std::vector<double> rest;
  };
  ProjectedTrace hutchpp, deflated, hutchpp_ggn;
};

struct Estimate {
  double value = 0, se = 0;
};

struct DerivedStatistics {
  double fpc = 1;  // (n-1)/(n-B): finite-population correction of the noise estimators
  Estimate trace_sigma, B_simple, trace_HSigma, B_noise, trace_H;
  Estimate frob_H;            // mean |H v_k|^2, unbiased for tr(H^2) (SPEC §10)
  double effective_rank = 0;  // tr(H)^2 / tr(H^2)
  // Preconditioned (SPEC §10): B_simple^P = tr(P Sigma)/G^T P G, B_noise^P =
  // tr(PHP Sigma)/(PG)^T H (PG), and (PG)^T H (PG)/G^T P G; NaN without state.
  double GPG = 0, PG_H_PG = 0, curvature_preconditioned = 0;
  Estimate B_simple_P, B_noise_P;
  // Gauss-Newton (SPEC §10; NaN where not asked for): G^T GGN G, mean
  // xi^T GGN xi, tr(GGN) (Hutchinson), B_noise^GGN = tr(GGN Sigma)/G^T GGN G,
  // and with "both" the residual share (G^T H G - G^T GGN G)/G^T H G.
  double GHG_ggn = 0, residual_share = 0;
  Estimate xiHxi_ggn, trace_ggn, B_noise_ggn;
  // From every sequence's own gradient (analysis.per_sequence; NaN without
  // it): tr(Sigma) = mean_i |a_i|^2 - |G|^2, exact for the epoch, and
  // B_simple from it; the errors bound those of estimates of the data's
  // covariance from n sequences (doc/statistics.md).
  double n_sequences = 0;
  Estimate trace_sigma_seq, B_simple_seq;
  // A histogram of |a_i|^2: edges (bins + 1), counts (bins).
  std::vector<double> seq_hist_edges;
  std::vector<std::int64_t> seq_hist_counts;
  double GHG_over_G_sqnorm = 0, eps_star = 0;
  // Batch sizes in tokens (the values above are in sequences).
  Estimate B_simple_tokens, B_noise_tokens;
  // tr H by Hutch++ and by deflation with the top Ritz vectors, tr GGN by
  // Hutch++ (the errors: the complement's samples'), and plain Hutchinson's
  // variance over Hutch++'s at equal products; NaN where not computed.
  Estimate trace_H_hutchpp, trace_H_deflated, trace_ggn_hutchpp;
  double trace_variance_ratio = 0;
  // (name, value) pairs in a fixed order, for the output and the CSV table.
  std::vector<std::pair<std::string, double>> named() const;
};

DerivedStatistics derive(const CaseMeasurements& m);

// SPEC §10: the per-block measurements of one partition of the parameters
// (blocks are contiguous ranges of the canonical flat vector, offsets[b] ..
// offsets[b+1]). Per sample or direction, one value per block.
struct BlockMeasurements {
  std::string partition;  // "tensor" | "layer"
  std::vector<std::string> names;
  std::vector<std::int64_t> offsets;                  // n_blocks + 1
  bool has_hv = false;                                // the epoch's H v was kept (forward-over-reverse)
  std::vector<double> G_sqnorm, GHG;                  // |G_b|^2, G_b^T (HG)_b
  std::vector<std::vector<double>> xi_sqnorm, xiHxi;  // per noise sample: |xi_b|^2, xi_b^T (H xi)_b
  std::vector<std::vector<double>> vHv, Hv_sqnorm;    // per direction: v_b^T (Hv)_b, |(Hv)_b|^2
  std::vector<std::vector<double>> vGv;               // per direction: v_b^T (GGN v)_b (operator "both")
  // curvature.trace_estimator: per complement direction g, the block's share
  // of Hutch++'s sample tr(Q^T H Q) + t(g) (doc/statistics.md), summing to it
  std::vector<std::vector<double>> hutchpp;
  // analysis.per_sequence: over the sequences i, sum |a_i,b|^2 and sum |a_i,b|^4
  std::vector<double> seq_sum, seq_sq;
  std::size_t size() const { return names.size(); }
};

// The block table of SPEC §10 for one partition: (name, one value per block)
// in the order of the spec, "<name>_se" beside each estimated quantity. The
// H v columns are absent where H v was not kept.
struct BlockTable {
  std::string partition;
  std::vector<std::string> names;
  std::vector<std::int64_t> offsets;
  std::vector<std::pair<std::string, std::vector<double>>> columns;
  const std::vector<double>* column(const std::string& name) const;
};
BlockTable derive_blocks(const BlockMeasurements& b, const CaseMeasurements& m, const DerivedStatistics& d);

// SPEC §10: along the update Delta = theta_b - theta_a to the next state by
// iter_num, at theta_a on this case.
struct UpdateStatistics {
  bool present = false;
  std::string partner;  // theta_b's hash (set by the driver)
  double delta_sqnorm = 0, G_dot_delta = 0, dHd = 0;
  double predicted_change = 0;  // G^T Delta + dHd / 2
  double measured_change = 0;   // L(theta_b) - L(theta_a)
  double curvature_along = 0;   // dHd / |Delta|^2
};

// SPEC §10's spectrum: Lanczos chains on the full-epoch H (or P^1/2 H P^1/2)
// and what follows from them (analysis/spectrum.hpp, doc/statistics.md).
// Per-chain arrays are (chains, steps) row-major, zero beyond the steps a
// chain took (chain_steps): a zero weight adds nothing to any quadrature.
struct SpectrumStatistics {
  bool present = false;
  std::string op;                 // "H" | "PHP"
  index_t steps = 0, chains = 0;  // m asked, number of chains
  double tolerance = 0;           // curvature.lanczos_tolerance (0: every chain runs m steps)
  std::int64_t chunk = 0;         // elements per partial dot product (the fixed summation order)
  std::vector<std::int64_t> chain_steps;
  std::vector<std::string> chain_stop;                 // "steps" | "converged" | "invariant_subspace"
  std::vector<double> alpha, beta;                     // beta[j]: the norm of the residual after step j + 1
  std::vector<double> ritz_values, ritz_weights;       // ascending; Gauss weights S(0, i)^2
  std::vector<double> start_vHv, start_Hv_sqnorm;      // per chain: v^T H v and |H v|^2 of the unit start vector
  std::vector<double> top_eigenvalues, top_residuals;  // the first chain's largest Ritz values, descending
  // curvature.eigenvectors = k: the first chain's top k Ritz vectors (k x
  // n_params row-major, float, canonical order) and their residual norms;
  // |U^T G|^2/|G|^2, |U^T Delta|^2/|Delta|^2 (the update to the next state)
  // and |U_a^T U_b|_F^2/k against the previous state's (the driver's); NaN
  // where not computed.
  std::vector<float> eigenvectors;
  std::vector<double> eigenvector_residuals;
  double G_in_topk = 0, delta_in_topk = 0, topk_overlap_prev = 0;
  double broadening = 0;  // the density's Gaussian sigma
  std::vector<double> density_grid, density;
};

// An identity of SPEC §4 checked on a case's vectors.
struct IdentityCheck {
  std::string name;
  double deviation = 0;  // largest relative deviation found
  double tolerance = 0;  // for the precision
  bool checked = false;  // false where it does not apply (e.g. no partition)
  bool ok() const { return !checked || deviation <= tolerance; }
};

// A statistical consistency check between two estimators of one quantity: a
// sampling statement, not an identity. It never sets identities_ok or blocks
// a merge; its p-value is judged against a campaign-wide false-alarm rate
// (kConsistencyAlpha over all of a campaign's checks, Holm's procedure).
struct ConsistencyCheck {
  std::string name;
  double deviation = 0;  // the difference in units of its null standard error
  double p_value = 1;    // two-sided, under the null distribution (doc/statistics.md)
  bool checked = false;  // false where one side is missing
};

// The campaign-wide false-alarm rate of the consistency checks.
constexpr double kConsistencyAlpha = 0.01;

// [landscape] (SPEC §13): the epoch loss along one direction, alpha in the
// direction's unit (the displacement `unit_norm` long at alpha = 1), beside
// the quadratic model L + alpha slope + alpha^2 curvature / 2 of the same
// run (slope = D^T G, curvature = D^T H D for the displacement D of alpha = 1).
struct LandscapeLine {
  std::string direction, unit;
  double unit_norm = 0, slope = 0, curvature = 0;
  std::vector<double> alpha, loss, quadratic;
  double argmin_alpha = 0;            // the grid's lowest point, refined by the parabola through it and its neighbours
  double predicted_argmin_alpha = 0;  // -slope / curvature; NaN where the curvature is not positive
};
// Two of the directions as a grid: loss (alpha.size() x beta.size()), alpha's row-major.
// quadratic: L + alpha a_x + beta a_y + (alpha^2 b_x + 2 alpha beta c + beta^2
// b_y) / 2, the lines' slopes a and curvatures b, c = D_x^T H D_y (cross_curvature).
struct LandscapePlane {
  std::string x, y;  // the directions of alpha and beta (empty: no plane)
  std::vector<double> alpha, beta, loss, quadratic;
  double cross_curvature = 0;
};

// Everything one case of one parameter state yields: what the results layer
// writes and reads (io/results.hpp), with no engine or device type in it.
struct CaseStatistics {
  double loss = 0;
  std::int64_t tokens = 0;
  CaseMeasurements m;
  DerivedStatistics derived;
  std::vector<std::vector<index_t>> noise_blocks;
  std::vector<IdentityCheck> identities;
  std::vector<ConsistencyCheck> consistency;
  std::vector<std::pair<std::string, double>> timings;  // stage, seconds
  // Measured per stage (analysis/usage.hpp: StageMeter): batch and direction
  // time spreads, host high-water mark, device memory; attributes of `timings`.
  std::vector<std::pair<std::string, double>> measured;
  std::int64_t peak_memory_bytes = 0;   // planned memory of the engines and vectors (analysis/memory.hpp)
  std::vector<BlockTable> blocks;       // [curvature] blocks: one table per partition
  std::vector<float> hessian_diagonal;  // [curvature] diagonal: mean_k v_k * (H v_k), (P)
  UpdateStatistics update;              // [curvature] update
  SpectrumStatistics spectrum;          // [curvature] lanczos_steps > 0
  SpectrumStatistics spectrum_ggn;      // and operator "ggn" or "both": the Gauss-Newton part's
  // curvature.spectrum_blocks = "layer": each layer block's H_bb (or P^1/2 H P^1/2's), by block name
  std::vector<std::pair<std::string, SpectrumStatistics>> spectrum_blocks;
  std::int64_t spectrum_resumed_at = -1;  // the Lanczos steps a saved state had done (-1: started afresh); not written
  // The edge of stability (SPEC §13; NaN where unknown): the learning rate
  // at the state, eta lambda_max / 2 of H's spectrum, and with the AdamW
  // state and the PHP spectrum eta lambda_max (1 - beta1) / (2 + 2 beta1).
  double learning_rate = std::numeric_limits<double>::quiet_NaN();
  double sharpness_ratio = std::numeric_limits<double>::quiet_NaN();
  double sharpness_ratio_adam = std::numeric_limits<double>::quiet_NaN();
  std::vector<LandscapeLine> landscape;  // [landscape] directions
  LandscapePlane plane;                  // [landscape] plane
};

// Mean and standard error (sample sd with ddof 1, over sqrt(count)). Not
// estimable, hence NaN (and absent from the outputs): the mean of no sample,
// the error of fewer than two.
Estimate mean_se(const std::vector<double>& x);

// tr(Sigma) from n sequences (doc/statistics.md): the sum and the sum of
// squares of |a_i|^2 over them, and |G|^2; the error is an upper bound
// (NaN for fewer than two sequences).
Estimate sequence_trace(double sum, double sum_sq, double n, double G_sqnorm);

// The regularised incomplete gamma functions P(a, x) and Q(a, x) = 1 - P(a, x)
// (a > 0, x >= 0), each to about 1e-14 relative where it is the small one.
double gamma_p(double a, double x);
double gamma_q(double a, double x);

// noise_estimators: the batch estimator of tr(Sigma) (m noise batches of B of
// the epoch's n sequences) against the per-sequence one, which is tr(Sigma)
// of the epoch itself. The batch side's null distribution comes from the
// per-sequence side, known in full: with R = tr_batch/tr_seq, X_j =
// |xi_j|^2/E|xi|^2 has mean 1 and variance at most
//   kappa = cv_d^2/B (n-1)/(n-B) + 2(1 - 1/B),
// cv_d the coefficient of variation of d_i = |a_i - G|^2 (the first term is
// the batch's own sequences, exact; the second its cross terms, with tr(Sigma^2)
// bounded by tr(Sigma)^2, reached when Sigma has rank one), and the sum m R of
// the m samples is taken as Gamma(m/kappa, kappa) (a weighted chi-square's
// two-moment match; exact for rank one). deviation = (R - 1) sqrt(m/kappa); the
// p-value is two-sided. Unchecked without both sides or with B >= n.
ConsistencyCheck noise_estimators_consistency(double trace_batch, double trace_seq, double trace_seq_se,
                                              double n_sequences, double m, double B, double n);

// Holm's step-down procedure at family-wise rate alpha over `family` tests
// (family >= p.size(): tests not in p count as accepted): which of p reject.
std::vector<bool> holm_rejections(const std::vector<double>& p, double alpha, std::size_t family);

}  // namespace gnh
