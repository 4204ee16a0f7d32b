// SPDX-License-Identifier: BSD-3-Clause
// SPEC §10's spectrum of one case: Lanczos chains on the full-epoch H (or on
// P^1/2 H P^1/2, or either of its Gauss-Newton part GGN), all chains' products in shared
// forward-over-reverse epoch passes, full reorthogonalisation in double.
//
// The basis is sharded over the team: the flat parameter vector is cut into
// fixed chunks of kLanczosChunk elements, dealt round-robin to the members,
// and each member keeps its chunks of every basis vector. A dot product is a
// sum of per-chunk partial sums, each computed in one fixed order by its
// owner and combined in chunk order by every member, so every number is the
// same bit for bit at any team size. Each step's new basis rows and the
// chains' scalars go to a LanczosStore, from which a killed run resumes.
//
// With `blocks` (curvature.spectrum_blocks), one chain per block b of the
// partition runs on the diagonal block H_bb: its start vector is v_b
// restricted to the block, and the product's entries outside the block are
// dropped, so its vectors stay in the block; every block's chain shares the
// same epoch passes.
#pragma once
#include "analysis/blocks.hpp"
#include "analysis/case_analysis.hpp"
#include "analysis/lanczos.hpp"
#include "analysis/passes.hpp"

namespace gnh {

struct SpectrumRun {
  SpectrumStatistics stats;
  IdentityCheck quadrature;
  IdentityCheck nonnegative;  // the Gauss-Newton operator's Ritz values (unchecked for H)
  // curvature.eigenvectors: the first chain's top Ritz vectors (k, n_params),
  // descending, and the identity that they are orthonormal.
  View2<double> vectors;
  std::vector<double> values;  // their Ritz values, descending
  IdentityCheck orthonormal;
  // On blocks (lanczos_spectrum's `blocks`): each block's spectrum, by name;
  // `stats` is then empty.
  std::vector<std::pair<std::string, SpectrumStatistics>> blocks;
  double pass_seconds = 0, arithmetic_seconds = 0;
  std::int64_t resumed_at = -1;                          // the steps a saved state had done (-1: none)
  std::vector<double> batch_seconds, direction_seconds;  // each batch of every step's passes (measured)
};

template <class T>
SpectrumRun lanczos_spectrum(const ExecSpace& space, Team& team, Engines<T>& engines, BatchStager& stager,
                             Span1<const T> params, View1<double> precond, const std::int32_t* ids, index_t n_blocks,
                             std::int64_t tokens, const AnalysisSettings& s, const CaseHooks& hooks,
                             CurvatureOperator op = CurvatureOperator::hessian, const Partition* blocks = nullptr);

}  // namespace gnh
