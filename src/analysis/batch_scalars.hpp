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
