// SPDX-License-Identifier: BSD-3-Clause
// Round-robin dealing, the one rule for every split in gnh: the groups of a
// campaign over its shards (gnh plan, gnh run --shard), the groups of a run
// over its teams, and the batches of an epoch over a team's members. Item i
// goes to part i mod parts.
#pragma once
#include <vector>

#include "core/index.hpp"

namespace gnh {

inline int dealt_to(index_t item, int parts) { return int(item % index_t(parts)); }

// The items of `part`, in order: part, part + parts, ...
inline std::vector<index_t> dealt_share(index_t items, int parts, int part) {
  std::vector<index_t> mine;
  for (index_t i = part; i < items; i += parts) mine.push_back(i);
  return mine;
}

}  // namespace gnh
