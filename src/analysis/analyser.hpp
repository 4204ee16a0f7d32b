// SPDX-License-Identifier: BSD-3-Clause
// What the commands use to analyse checkpoints: one object per run that holds
// the engines of the settings' precision and the parameter state in hand, and
// analyses cases of it. This header needs no Kokkos and no model engine, so the
// driver and io layers do not compile them (the stages are in case_analysis.hpp).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "analysis/batch_scalars.hpp"
#include "analysis/settings.hpp"
#include "analysis/statistics.hpp"
#include "model/config.hpp"

namespace gnh {

class Team;
class LanczosStore;

// Raised when a termination signal stopped a pass (every team member raises it).
struct Interrupted {};

// The vectors of a case, copied to the host on request (precision comparisons).
struct CaseVectors {
  std::vector<double> G;                // (P)
  std::vector<std::vector<double>> xi;  // (m, P)
};

struct CaseHooks {
  CaseVectors* keep = nullptr;                                                          // copy G and the xi_j here
  StopCheck stop;                                                                       // SIGTERM
  std::function<void(const std::string& stage, index_t done, index_t total)> progress;  // team rank 0
  LanczosStore* lanczos = nullptr;         // the spectrum's state between steps; none: not resumable
  LanczosStore* lanczos_ggn = nullptr;     // the Gauss-Newton spectrum's
  LanczosStore* lanczos_blocks = nullptr;  // the per-block spectra's (curvature.spectrum_blocks)
  // Tokens from one block's first to the next's in ids: the context (0 says
  // so) for a stream's overlapping blocks, the sample length for
  // [data] layout = "sequences".
  index_t block_stride = 0;
};

class Analyser {
 public:
  Analyser(const ModelConfig& cfg, const AnalysisSettings& s);
  ~Analyser();
  Analyser(const Analyser&) = delete;
  Analyser& operator=(const Analyser&) = delete;

  // The parameter state to analyse next (flat, canonical order, float32 as stored).
  void set_parameters(const std::vector<float>& params);
  // SPEC §10's AdamW preconditioner P (flat, P values) of that state, or an
  // empty vector when it has none; used where [curvature] preconditioned.
  void set_preconditioner(const std::vector<double>& P);
  // SPEC §10's update target theta_b (the next state by iter_num, flat float32
  // as stored), after set_parameters; empty: none (the last state).
  void set_update_target(const std::vector<float>& theta_b);
  // Every statistic of SPEC §4 for one case, computed by the team.
  CaseStatistics analyse(Team& team, const std::int32_t* ids, index_t n_blocks, const CaseHooks& hooks);
  // v^T H v of the epoch's mean loss along each direction (P values each), in
  // passes of at most directions_per_pass; one rank. stride: as
  // CaseHooks::block_stride.
  std::vector<double> curvature_along(const std::vector<std::vector<double>>& dirs, const std::int32_t* ids,
                                      index_t n_blocks, index_t stride = 0);

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace gnh
