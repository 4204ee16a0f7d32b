// SPDX-License-Identifier: BSD-3-Clause
// Batch-level passes over a list of batches, of which the caller computes a
// subset (its share when ranks split an epoch). Vector results go into an
// ExactSum, scalar results into a per-batch table; callers combine tables in
// batch order, so every sum is the same bit for bit on any split.
#pragma once
#include <vector>

#include "analysis/batch_scalars.hpp"
#include "analysis/derivatives.hpp"
#include "analysis/exact_sum.hpp"
#include "model/gpt.hpp"

namespace gnh {

// Stages batches of blocks on the device, the one way every pass does it:
// fill_batch (analysis/epoch.hpp) on the host, then a copy. Sized once for the
// largest batch; a batch of B rows uses the first B rows (contiguous).
class BatchStager {
 public:
  BatchStager(index_t max_batch, index_t context);
  // Rows 0..B-1 hold the listed blocks (at most B), padding after them.
  void stage(const std::int32_t* ids, const Batch& blocks, index_t B);
  Span2<const std::int32_t> tokens() const { return Span2<const std::int32_t>(tokens_.data(), rows_, context_); }
  Span2<const std::int32_t> targets() const { return Span2<const std::int32_t>(targets_.data(), rows_, context_); }

 private:
  index_t context_, rows_ = 0;
  View2<std::int32_t> tokens_, targets_;
  typename View2<std::int32_t>::HostMirror h_tokens_, h_targets_;
};

// Gradients of the summed loss of each batch in `mine`, added into acc.
// Returns false if stopped early.
template <class T>
bool gradient_pass(const ExecSpace& space, Gpt<T>& model, BatchStager& stager, Span1<const T> params,
                   const std::int32_t* ids, const std::vector<Batch>& batches, const std::vector<index_t>& mine,
                   ExactSum& acc, std::vector<BatchScalars>& table, const StopCheck& stop = {},
                   const ProgressFn& progress = {});

// Quadratic forms of each batch in `mine` along dirs (K, P) = the model's directions.
// With forward-over-reverse, hv_sums (K of them) may also collect H_sum v_k.
template <class T>
bool curvature_pass(const ExecSpace& space, Gpt<T>& model, BatchStager& stager, Span1<const T> params,
                    Span2<const T> dirs, const std::int32_t* ids, const std::vector<Batch>& batches,
                    const std::vector<index_t>& mine, CurvatureMethod method, std::vector<BatchScalars>& table,
                    const StopCheck& stop = {}, const ProgressFn& progress = {},
                    std::vector<ExactSum>* hv_sums = nullptr, CurvatureOperator op = CurvatureOperator::hessian);

}  // namespace gnh
