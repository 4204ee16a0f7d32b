// SPDX-License-Identifier: BSD-3-Clause
// The per-batch scalars of a pass, and the callbacks a pass takes between
// batches. Plain types: the team (analysis/team.hpp) exchanges these tables.
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

#include "core/index.hpp"

namespace gnh {

using Batch = std::vector<index_t>;  // block indices

struct BatchScalars {
  double loss_sum = 0;
  std::int64_t count = 0;
  std::vector<double> first;   // per direction: d/de of the summed loss
  std::vector<double> second;  // per direction: v^T H_sum v (or v^T GGN_sum v: the Gauss-Newton operator's passes)
  std::vector<double> gauss_newton;  // per direction: v^T GGN_sum v
  // The epoch gradient pass with analysis.per_sequence: per sequence of the
  // batch, |S_b|^2 of the gradient S_b of its summed loss; per block value
  // (the partitions of SPEC section 10 concatenated, where the case has them)
  // the sums over the batch's sequences of |S_b|^2 restricted to the block
  // and of its square.
  std::vector<double> seq_sqnorm, seq_block_sum, seq_block_sq;
  // A curvature pass: per sequence of the batch, d/de of its summed loss
  // along the pass's first direction.
  std::vector<double> seq_first;
  // Every vector member, in one order (the team exchanges them by it).
  std::vector<std::vector<double>*> vectors() {
    return {&first, &second, &gauss_newton, &seq_sqnorm, &seq_block_sum, &seq_block_sq, &seq_first};
  }
  bool done = false;
  // Measured on the member that computed it (not part of any result): the
  // batch's wall time, and on a GPU the device memory in use at its end.
  double seconds = 0;
  double device_bytes = -1;
};

// Between batches: return true to stop the pass (a termination signal).
using StopCheck = std::function<bool()>;
// After each batch: batches done by this caller, and its share.
using ProgressFn = std::function<void(index_t done, index_t share)>;

// Sums of a complete table in batch order.
BatchScalars sum_in_order(const std::vector<BatchScalars>& table);

}  // namespace gnh
