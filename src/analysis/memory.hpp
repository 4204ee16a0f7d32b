// SPDX-License-Identifier: BSD-3-Clause
// The plan of a case as pure functions of the settings, the model and the
// epoch: the noise samples, the curvature passes, the engines' shapes and the
// memory they and the case's vectors take. The analysis runs by this plan and
// the dry run prints it, so the two cannot disagree. No Kokkos here.
#pragma once
#include <algorithm>
#include <cstddef>
#include <vector>

#include "analysis/settings.hpp"
#include "model/config.hpp"
#include "model/plan.hpp"

namespace gnh {

struct CasePlan {
  index_t n_blocks = 0;
  index_t n_noise = 0;               // noise samples: min(noise_samples, n_blocks / noise_batch)
  bool partition = false;            // the noise batches cover the epoch exactly
  std::vector<index_t> pass_widths;  // directions of each curvature pass, balanced, widest first
  // G, the xi_j, the v_k, then with the AdamW preconditioner P: PG, the P xi_j.
  // With an update target (SPEC §10), Delta last.
  index_t directions() const {
    return 1 + n_noise + directions_asked + (preconditioned ? 1 + n_noise : 0) + (update ? 1 : 0);
  }
  index_t directions_asked = 0;
  bool preconditioned = false;
  bool update = false;
  bool spectrum = false;   // [curvature] lanczos_steps > 0 (and, for PHP, AdamW state)
  bool keep_noise = true;  // the xi_j kept as rows (AnalysisSettings::keep_noise_vectors)
};
// preconditioned / update: the state has AdamW state / a next state and
// [curvature] asks for it (the plan of a campaign assumes every state has
// both, an upper bound).
CasePlan plan_case(const AnalysisSettings& s, index_t n_blocks, bool preconditioned, bool update);

// The engines of a case: the gradient (reverse, grad_microbatch), the
// curvature (hvp_batch, K directions, by the chosen method) and the two
// one-block engines of the identity checks (forward-over-reverse along one
// direction at a time, the second-order forward along two).
Shape gradient_shape(const AnalysisSettings& s);
Shape curvature_shape(const AnalysisSettings& s, index_t K);
Shape check_shape(const AnalysisSettings& s, bool second_order);
// analysis.per_sequence: how many sequences' gradients one reverse takes
// apart, G. Host engines: 1, an engine of one sequence per sequence (its cost
// measured 0-2% over the gradient pass, perf/NOTES.md). GPU-shaped engines
// (gpu_shaped): the weight products batched per sequence
// (Gpt::gradient_per_sequence), G the largest divisor of grad_microbatch whose
// G gradients (and, below the microbatch, an engine of G sequences) take no
// more memory than the gradient engine itself, an engine of one sequence and
// its gradient, or kSequenceGroupFloor (nothing on a GPU), so that an engine
// of one sequence's thousand launches a sequence are not paid.
constexpr std::size_t kSequenceGroupFloor = std::size_t(1) << 30;
index_t sequence_group(const ModelConfig& cfg, const AnalysisSettings& s, bool gpu_shaped);
// The engine of a group of G sequences' gradients (reverse); G equal to
// grad_microbatch: the gradient engine itself serves.
Shape sequence_shape(const AnalysisSettings& s, index_t G);
// What a group of G costs beside the gradient engine: its G gradients and,
// unless it is the whole microbatch, an engine of G sequences.
std::size_t sequence_group_bytes(const ModelConfig& cfg, const AnalysisSettings& s, index_t G);

// Hutch++'s sketch (curvature.trace_estimator): k = floor(directions / 3)
// directions, at most directions_per_pass, so that the vectors a rank holds
// stay bounded by the pass width whatever the number of directions.
inline index_t hutchpp_sketch(const AnalysisSettings& s) { return std::min(s.directions / 3, s.directions_per_pass); }

struct MemoryPlan {
  std::size_t gradient = 0, curvature = 0, checks = 0;  // engines (model/plan.hpp)
  std::size_t sequence = 0;  // analysis.per_sequence: its engine (unless the gradient's) and G sequences' gradients
  std::size_t vectors = 0;   // the parameter-sized vectors of the stage that needs the most (memory.cpp);
                             // G and g_j in double, exact sums, directions, batch vectors
  std::size_t spectrum = 0;  // the Lanczos chains' share of one team member (analysis/spectrum.hpp)
  // How many parameter-sized vectors `vectors` holds (of double, of 128-bit
  // exact sums and of the engine's scalar): fixed by the pass width, the
  // checks and the [curvature] options, not by noise_samples or directions
  // unless the noise vectors are kept.
  index_t vector_count = 0;
  // `vectors` by kind: the vectors held as a member's slice (parallel.
  // parameter_shards; whole at one shard), those the engines read or write
  // whole (parameters, directions, a batch's gradient and products), and the
  // scatter's round buffers.
  std::size_t vectors_sliced = 0, vectors_whole = 0, vectors_buffers = 0;
  // The most a rank holds at once: the stage (gradient, noise, curvature,
  // spectrum, checks) whose engines and vectors take the most bytes.
  std::size_t peak = 0;
  std::size_t total() const { return peak; }
  // That stage, by name, and what it holds: engines and vectors (with the
  // Lanczos chains' share at the spectrum).
  const char* peak_stage = "";
  std::size_t peak_engines = 0, peak_vectors = 0;
};
// members: the team's size (the Lanczos basis is sharded over it).
// gpu_shaped: the engines run the GPU's path (gpu_shaped_build()).
MemoryPlan plan_memory(const ModelConfig& cfg, const AnalysisSettings& s, const CasePlan& c, int members = 1,
                       bool gpu_shaped = gpu_shaped_build());

// The adjoint cuts (model/plan.hpp, adjoint_cuts_of) of the second-order
// forward engines these settings plan: the identity checks' (K = 2, one
// block) always, and with curvature_method = second-order-forward the
// curvature engine, which cuts from `curvature_from` directions per pass on
// (the rule grows with K; 0: at no width up to directions_per_pass).
struct PlannedCuts {
  bool checks = false;
  index_t curvature_from = 0;
  bool any() const { return checks || curvature_from > 0; }
  bool curvature(index_t K) const { return curvature_from > 0 && K >= curvature_from; }
};
PlannedCuts planned_adjoint_cuts(const ModelConfig& cfg, const AnalysisSettings& s);

}  // namespace gnh
