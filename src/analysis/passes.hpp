// SPDX-License-Identifier: BSD-3-Clause
// Batch-level passes over a list of batches, of which the caller computes a
// subset (its share when ranks split an epoch). Vector results go into an
// ExactSum, scalar results into a per-batch table; callers combine tables in
// batch order, so every sum is the same bit for bit on any split.
#pragma once
#include <functional>
#include <vector>

#include "analysis/derivatives.hpp"
#include "analysis/exact_sum.hpp"
#include "model/gpt.hpp"

namespace gnh {

using Batch = std::vector<index_t>;  // block indices

struct BatchScalars {
  double loss_sum = 0;
  std::int64_t count = 0;
  std::vector<double> first;   // per direction: d/de of the summed loss
  std::vector<double> second;  // per direction: v^T H_sum v
  bool done = false;
};

// Between batches: return true to stop the pass (a termination signal).
using StopCheck = std::function<bool()>;
// After each batch: batches done by this caller, and its share.
using ProgressFn = std::function<void(index_t done, index_t share)>;

// Gradients of the summed loss of each batch in `mine`, added into acc.
// Returns false if stopped early.
template <class T>
bool gradient_pass(const ExecSpace& space, Gpt<T>& model, Span1<const T> params, const std::int32_t* ids,
                   const std::vector<Batch>& batches, const std::vector<index_t>& mine, ExactSum& acc,
                   std::vector<BatchScalars>& table, const StopCheck& stop = {}, const ProgressFn& progress = {});

// Quadratic forms of each batch in `mine` along dirs (K, P) = the model's directions.
// With forward-over-reverse, hv_sums (K of them) may also collect H_sum v_k.
template <class T>
bool curvature_pass(const ExecSpace& space, Gpt<T>& model, Span1<const T> params, Span2<const T> dirs,
                    const std::int32_t* ids, const std::vector<Batch>& batches, const std::vector<index_t>& mine,
                    CurvatureMethod method, std::vector<BatchScalars>& table, const StopCheck& stop = {},
                    const ProgressFn& progress = {}, std::vector<ExactSum>* hv_sums = nullptr);

// Sums of a complete table in batch order.
BatchScalars sum_in_order(const std::vector<BatchScalars>& table);

}  // namespace gnh
