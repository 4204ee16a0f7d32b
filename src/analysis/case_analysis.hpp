// SPDX-License-Identifier: BSD-3-Clause
// Every statistic of SPEC §4 for one parameter state and one data case,
// computed by a team of ranks:
//   1. gradient pass over the epoch             -> loss, G
//   2. one gradient per noise batch             -> g_j, xi_j = g_j - G and their norms
//   3. curvature passes over the epoch, the fewest with at most
//      `directions_per_pass` directions each, balanced (no padding), serving
//      [G, xi_1..xi_m, v_1..v_K] -> G^T H G, xi^T H xi, v^T H v
//   4. identity checks (SPEC §4) and derived statistics.
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "analysis/derivatives.hpp"
#include "analysis/statistics.hpp"
#include "analysis/team.hpp"
#include "model/gpt.hpp"

namespace gnh {

struct AnalysisSettings {
  index_t context = 0;
  index_t grad_microbatch = 32, hvp_batch = 64;
  index_t noise_samples = 32, noise_batch = 32, directions = 32, directions_per_pass = 8;
  std::uint64_t seed = 1234;
  CurvatureMethod method = CurvatureMethod::second_order_forward;
  bool bf16 = false;  // the bf16-amp policy (float engines)
  bool tf32 = false;  // the tf32 policy: TF32 tensor-core GEMMs on CUDA, FP32 elsewhere
};

struct IdentityCheck {
  std::string name;
  double deviation = 0;  // largest relative deviation found
  double tolerance = 0;  // for the precision
  bool checked = false;  // false where it does not apply (e.g. no partition)
  bool ok() const { return !checked || deviation <= tolerance; }
};

struct CaseStatistics {
  double loss = 0;
  std::int64_t tokens = 0;
  CaseMeasurements m;
  DerivedStatistics derived;
  std::vector<std::vector<index_t>> noise_blocks;
  std::vector<IdentityCheck> identities;
  std::vector<std::pair<std::string, double>> timings;  // stage, seconds
  std::int64_t peak_memory_bytes = 0;  // planned device memory of the engines and vectors
};

// Raised when a termination signal stopped a pass (every team member raises it).
struct Interrupted {};

// Engines planned once per rank (one configuration per run) and reused. The
// curvature engine is planned for the directions of the pass it runs (at most
// directions_per_pass) and replanned only when a pass needs another count.
template <class T>
struct Engines {
  Engines(const ModelConfig& cfg, const AnalysisSettings& s);
  Gpt<T> gradient;   // reverse, grad_microbatch
  Gpt<T> check_for;  // forward-over-reverse, K = 2, one block: identity checks
  Gpt<T> check_sof;  // second-order forward, K = 2, one block
  // hvp_batch by the chosen method, for K directions.
  Gpt<T>& curvature(index_t K);
  // Planned bytes: the fixed engines and the largest curvature engine so far.
  std::size_t bytes() const;

 private:
  ModelConfig cfg_;
  AnalysisSettings settings_;
  std::unique_ptr<Gpt<T>> curvature_;
  std::size_t curvature_peak_bytes_ = 0;
};

// The vectors of a case, copied to the host on request (precision comparisons).
struct CaseVectors {
  std::vector<double> G;                // (P)
  std::vector<std::vector<double>> xi;  // (m, P)
};

struct CaseHooks {
  CaseVectors* keep = nullptr;                                             // copy G and the xi_j here
  StopCheck stop;                                                          // SIGTERM
  std::function<void(const std::string& stage, index_t done, index_t total)> progress;  // team rank 0
};

template <class T>
CaseStatistics analyse_case(const ExecSpace& space, Team& team, Engines<T>& engines, Span1<const T> params,
                            const std::int32_t* ids, index_t n_blocks, const AnalysisSettings& s,
                            const CaseHooks& hooks);

}  // namespace gnh
