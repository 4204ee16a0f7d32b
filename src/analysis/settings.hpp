// SPDX-License-Identifier: BSD-3-Clause
// The analysis settings, typed once where the deck is read (SPEC §6), and the
// one table of [analysis] keys from which the deck reader, the settings
// fingerprint and a timing profile's recipe all follow. A new key is one line
// in GNH_ANALYSIS_KEYS plus its use; nothing else lists the keys.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/index.hpp"

namespace gnh {

// [precision] policy: fp32; tf32 (TF32 tensor-core GEMMs on CUDA, the same as
// fp32 on a host); bf16-amp (matrix-multiply operands rounded to bfloat16,
// float accumulation); fp64.
enum class Precision { fp32, tf32, bf16_amp, fp64 };
// [analysis] curvature_method: the path of v^T H v (doc/derivatives.md).
enum class CurvatureMethod { forward_over_reverse, second_order_forward };

const char* to_string(Precision p);
const char* to_string(CurvatureMethod m);
// The deck spelling of every value, for parsing and for messages.
const std::vector<std::string>& precision_names();
const std::vector<std::string>& curvature_method_names();
std::optional<Precision> precision_named(const std::string& s);
std::optional<CurvatureMethod> curvature_method_named(const std::string& s);

// X(key, type, default, lowest, highest, recipe): every [analysis] key (an
// integer, an enumeration or a boolean, whose range is ignored). Every
// key can change a result, so every key is in the settings fingerprint;
// `recipe` marks the keys that change the cost of a pass, which a timing
// profile is measured for (driver/plan.cpp). Enumerations ignore the range.
#define GNH_ANALYSIS_KEYS(X)                                                              \
  X(grad_microbatch, index_t, 32, 1, index_t(1) << 30, true)                              \
  X(hvp_batch, index_t, 64, 1, index_t(1) << 30, true)                                    \
  X(noise_samples, index_t, 32, 0, index_t(1) << 30, false)                               \
  X(noise_batch, index_t, 32, 1, index_t(1) << 30, false)                                 \
  X(directions, index_t, 32, 0, index_t(1) << 30, false)                                  \
  X(directions_per_pass, index_t, 8, 1, 4096, true)                                       \
  X(seed, std::uint64_t, 1234, 0, INT64_MAX, false)                                       \
  X(curvature_method, CurvatureMethod, CurvatureMethod::second_order_forward, 0, 0, true) \
  X(per_sequence, bool, true, 0, 1, false)

// [curvature] operator (SPEC §10): the Hessian's statistics alone, or with
// them those of its Gauss-Newton part GGN = J^T H_z J (doc/statistics.md).
enum class OperatorChoice { hessian, ggn, both };
const char* to_string(OperatorChoice o);

// [curvature] (SPEC §10): what the analysis computes beyond §4. Absent: none.
struct CurvatureSettings {
  bool blocks = false;          // per-block statistics, both partitions (trace_H and the rest need Hv)
  bool diagonal = false;        // the Hutchinson diagonal of H as a dataset (needs Hv)
  bool preconditioned = false;  // the AdamW-preconditioned noise scale, where a checkpoint has AdamW state
  bool update = false;          // curvature along the update to the next checkpoint by iter_num
  // The spectrum: Lanczos chains of lanczos_steps steps (0: none) on H, or on
  // P^1/2 H P^1/2 (lanczos_php) where a state has AdamW state; a chain stops
  // early once its top_eigenvalues residuals are at most lanczos_tolerance
  // times the operator's norm (0: never early).
  index_t lanczos_steps = 0, lanczos_chains = 4, top_eigenvalues = 5;
  bool lanczos_php = false;
  double lanczos_tolerance = 0;
  // The first chain's top `eigenvectors` Ritz vectors (0: none), saved with
  // what they say of G, the update and the previous state (SPEC section 10).
  index_t eigenvectors = 0;
  // spectrum_blocks = "layer": Lanczos on each layer block's H_bb beside the
  // spectrum (one chain per block, sharing its passes).
  bool layer_spectra = false;
  OperatorChoice op = OperatorChoice::hessian;
  // trace_estimator: "hutchinson" (the §4 directions alone), or "hutch++" and
  // "both" (the same: Hutchinson's estimate is always reported) adding tr H
  // by Hutch++ at the same number of products, by deflation with the
  // eigenvectors' Ritz vectors where they are saved, and tr GGN by Hutch++
  // with the Gauss-Newton operator (doc/statistics.md). Needs
  // forward-over-reverse and at least 3 directions; the default where those
  // hold (with a [curvature] section).
  bool hutchpp = false;
  std::string trace_estimator = "hutchinson";
  bool gauss_newton() const { return op != OperatorChoice::hessian; }
  bool any() const {
    return blocks || diagonal || preconditioned || update || lanczos_steps > 0 || op != OperatorChoice::hessian;
  }
};

// [landscape] (SPEC §13): the full-epoch loss at theta + alpha u d along
// chosen directions d, each in its own unit u (doc/statistics.md,
// "Landscapes"): gradient (d = -G/|G|, alpha = 1 at the quadratic model's
// step eps* |G|), update (d = Delta, alpha = 1 at the next state),
// eigenvector:i (the i-th Ritz vector, alpha = 1 at 2/lambda_i) and
// random:j (a filter-normalised Gaussian direction, alpha = 1 at |d| = |theta|).
enum class LandscapeKind { gradient, update, eigenvector, random };
struct LandscapeDirection {
  LandscapeKind kind = LandscapeKind::gradient;
  index_t index = 0;  // i of eigenvector:i, j of random:j (from 1); 0 otherwise
  std::string name() const;
  bool operator==(const LandscapeDirection& o) const { return kind == o.kind && index == o.index; }
};
// "gradient", "update", "eigenvector:i", "random:j" (i, j >= 1); none otherwise.
std::optional<LandscapeDirection> landscape_direction_named(const std::string& s);

struct LandscapeSettings {
  std::vector<LandscapeDirection> directions;  // one line of `points` each
  index_t points = 21;                         // odd: alpha = 0 is a point
  double range = 1.0;                          // alpha from -range to +range
  std::vector<LandscapeDirection> plane;       // none, or the plane's two directions
  index_t plane_points = 11;                   // odd, per side of the plane's grid
  std::uint64_t seed = 1234;                   // of the random:j directions
  bool any() const { return !directions.empty() || !plane.empty(); }
  // Every direction a line or the plane needs, each once, lines first.
  std::vector<LandscapeDirection> used() const;
  // The epoch forward passes (the lines' points and the plane's grid).
  index_t forward_passes() const {
    return index_t(directions.size()) * points + (plane.empty() ? 0 : plane_points * plane_points);
  }
  // The random directions used.
  index_t random_count() const;
  // The width of the landscapes' curvature pass: the random directions, and
  // the plane's D_x + D_y (its cross term).
  index_t curvature_directions() const { return random_count() + (plane.empty() ? 0 : 1); }
  index_t top_eigenvector() const;  // the largest i of eigenvector:i used (0: none)
};

struct AnalysisSettings {
#define GNH_SETTINGS_MEMBER(key, type, dflt, lo, hi, recipe) type key = dflt;
  GNH_ANALYSIS_KEYS(GNH_SETTINGS_MEMBER)
#undef GNH_SETTINGS_MEMBER
  index_t context = 0;                    // [data] context: tokens per block
  Precision precision = Precision::fp32;  // [precision] policy
  CurvatureSettings curvature;            // [curvature]
  LandscapeSettings landscape;            // [landscape]
  // [parallel] noise_vectors as the driver resolved it (driver/run_memory.hpp):
  // keep the m noise vectors xi_j from the noise stage to the curvature passes
  // (m parameter-sized rows), or compute each one's noise-batch gradient again
  // when its pass is filled (no rows, the noise gradients twice). The same
  // bits either way, so it is not in the settings fingerprint.
  bool keep_noise_vectors = true;
  // [parallel] parameter_shards: R, each member of a shard group of R holding
  // one slice of every parameter-sized vector of the analysis (SPEC §12).
  // The same bits at any R, so not in the settings fingerprint.
  index_t parameter_shards = 1;

  bool fp64() const { return precision == Precision::fp64; }
  bool bf16() const { return precision == Precision::bf16_amp; }
  bool tf32() const { return precision == Precision::tf32; }
  // Whether the curvature passes keep the epoch's H v of every direction: the
  // per-block curvature, tr(H^2) and the diagonal need it, and only
  // forward-over-reverse has it (second-order forward gives v^T H v alone).
  bool keeps_hv() const {
    return (curvature.blocks || curvature.diagonal) && curvature_method == CurvatureMethod::forward_over_reverse;
  }
};

// One row of the table, as the visitors below pass it.
struct AnalysisKey {
  const char* name;
  std::int64_t lowest, highest;
  bool recipe;
};

// f(key, member) for every [analysis] key in table order; the member's type
// tells an integer from an enumeration.
template <class Settings, class F>
void for_each_analysis_key(Settings& s, F&& f) {
#define GNH_SETTINGS_VISIT(key, type, dflt, lo, hi, recipe) \
  f(AnalysisKey{#key, std::int64_t(lo), std::int64_t(hi), recipe}, s.key);
  GNH_ANALYSIS_KEYS(GNH_SETTINGS_VISIT)
#undef GNH_SETTINGS_VISIT
}

}  // namespace gnh
