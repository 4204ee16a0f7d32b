// SPDX-License-Identifier: BSD-3-Clause
// `gnh run DECK`: the analysis driver. Every rank calls it; user errors found
// before the computation stop every rank (see Comm::collective).
#pragma once
#include <string>
#include <vector>

#include "driver/command.hpp"
#include "parallel/comm.hpp"

namespace gnh {

struct RunOptions {
  std::string deck;
  std::vector<std::string> overrides;    // --set key=value
  bool quiet = false;                    // no deck echo and no per-group progress
  bool dry_run = false;                  // validate everything, print the plan, compute nothing
  int shard_index = 0, shard_count = 1;  // --shard I/N: groups g with g % N == I, own output file
  // Memory: a plan needing more than 90% of the budget per rank is refused
  // (a device's memory on GPU builds, else the host's shared by the node's
  // ranks); --memory-budget replaces the detected memory (per node on hosts,
  // per device on GPUs); --fit-memory picks the largest directions_per_pass
  // and hvp_batch that fit instead of refusing.
  std::string memory_budget;
  bool fit_memory = false;
  bool self_check = false;  // the device self-check (driver/selfcheck.hpp) on every rank before computing
};

// Returns the process exit status: 0 when every group succeeded, 1 when some
// failed (the others are written), 143 when SIGTERM interrupted the run.
int run_command(const Comm& comm, const RunOptions& opt);

// `gnh run`'s options; its action parses --shard I/N, then runs run_command.
Subcommand add_run_command(CLI::App& gnh);

}  // namespace gnh
