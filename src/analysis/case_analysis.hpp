// SPDX-License-Identifier: BSD-3-Clause
// Every statistic of SPEC §4 for one parameter state and one data case,
// computed by a team of ranks in four named stages over one batch stager:
//   1. loss and gradient: the gradient pass over the epoch   -> loss, G
//   2. noise samples: one gradient per noise batch           -> g_j, xi_j = g_j - G and their norms
//   3. curvature passes over the epoch, the fewest with at most
//      `directions_per_pass` directions each, balanced (no padding), serving
//      [G, xi_1..xi_m, v_1..v_K]                              -> G^T H G, xi^T H xi, v^T H v
//   4. identities (SPEC §4), then the derived statistics.
// The plan (noise samples, pass widths, engine shapes, memory) is
// analysis/memory.hpp's; commands reach this through analysis/analyser.hpp.
#pragma once
#include <memory>

#include "analysis/analyser.hpp"
#include "analysis/memory.hpp"
#include "analysis/team.hpp"
#include "model/gpt.hpp"

namespace gnh {

// Engines planned once per rank (one configuration per run) and reused. The
// curvature engine is planned for the directions of the pass it runs (at most
// directions_per_pass) and replanned only when a pass needs another count.
// The gradient and the curvature engine are never held together: asking for
// one frees the other first (a pass recomputing a noise vector, then its
// curvature pass, each makes its engine anew), so that a stage holds the
// larger of the two, not their sum. The identity checks' two engines exist
// only while the checks run, one at a time, and the gradient and curvature
// engines are released before them, so that the checks' stage holds one
// engine (analysis/memory.hpp, by stage).
template <class T>
struct Engines {
  Engines(const ModelConfig& cfg, const AnalysisSettings& s);
  // Reverse, grad_microbatch; made where there is none (the curvature engine
  // and the checks release it). A reference is good until the next call for
  // another engine.
  Gpt<T>& gradient();
  const ParamLayout& layout() const { return layout_; }
  const ModelConfig& config() const { return cfg_; }
  // The checks' engines, made where there are none, one block each:
  // forward-over-reverse along one direction (K = 1, each in turn) and the
  // second-order forward along both (K = 2). The gradient and curvature
  // engines and the other check engine go first.
  Gpt<T>& check_for() { return check(false); }
  Gpt<T>& check_sof() { return check(true); }
  void release_checks();
  // analysis.per_sequence: the sequences a reverse takes apart (memory.hpp,
  // sequence_group; 0 without it), and their engine where it is not the
  // gradient engine (null otherwise).
  index_t sequence_group = 0;
  std::unique_ptr<Gpt<T>> sequence;
  // hvp_batch by the chosen method, for K directions; frees the gradient
  // engine (a reference to it is good until then).
  Gpt<T>& curvature(index_t K);

 private:
  Gpt<T>& check(bool second_order);
  ModelConfig cfg_;
  AnalysisSettings settings_;
  ParamLayout layout_;
  std::unique_ptr<Gpt<T>> gradient_, curvature_, check_for_, check_sof_;
};

// What a state brings beyond its parameters (SPEC §10); empty views: none.
template <class T>
struct CaseExtras {
  View1<double> precond;  // the AdamW preconditioner P
  View1<T> target;        // theta_b, the next state by iter_num
};

template <class T>
CaseStatistics analyse_case(const ExecSpace& space, Team& team, Engines<T>& engines, Span1<const T> params,
                            const CaseExtras<T>& extras, const std::int32_t* ids, index_t n_blocks,
                            const AnalysisSettings& s, const CaseHooks& hooks);

}  // namespace gnh
