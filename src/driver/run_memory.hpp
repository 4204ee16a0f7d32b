// SPDX-License-Identifier: BSD-3-Clause
// `gnh run`'s memory check: the plan of every case (analysis/memory.hpp)
// against the memory one rank may use, refused over 90% of it, or, with
// --fit-memory, the largest directions_per_pass and hvp_batch that fit.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

#include "driver/campaign.hpp"
#include "parallel/comm.hpp"

namespace gnh {

// "1.5 GiB": bytes in GiB, three significant digits.
std::string gib(std::size_t bytes);

// The memory one rank may plan for, and what it is: a GPU's memory (one per
// rank) on device builds, else the host's shared by the node's ranks; or
// --memory-budget (`given`, e.g. 64GiB or 500MB) in their place.
struct MemoryBudget {
  std::int64_t per_rank = -1;  // -1: unknown (no check)
  std::string what;
};
// Collective (counts the node's ranks).
MemoryBudget memory_budget(const Comm& comm, const std::string& given);

// The largest plan of any case of the campaign under settings s, per rank.
std::size_t planned_per_rank(const Campaign& c, const AnalysisSettings& s, int rpc, std::string* which = nullptr);

// parallel.noise_vectors: whether the noise vectors are kept ("keep"; "auto"
// where the plan that keeps them fits 90% of the budget, or the budget is
// unknown) or computed again in the curvature passes ("recompute"; "auto"
// otherwise). The same bits either way.
bool keep_noise_vectors(const Campaign& c, const MemoryBudget& b);

// Refuses a plan over 90% of the budget, naming what to lower (only settings
// above their least value).
void check_memory(const Campaign& c, const MemoryBudget& b);

// --fit-memory: the largest directions_per_pass (up to a case's directions),
// then the largest hvp_batch (up to a case's blocks), whose plan fits in 90%
// of the budget.
struct MemoryFit {
  long long directions_per_pass = 0, hvp_batch = 0, grad_microbatch = 0, parameter_shards = 1;
};
MemoryFit fit_memory(const Campaign& c, const MemoryBudget& b);

}  // namespace gnh
