// SPDX-License-Identifier: BSD-3-Clause
// gnh watch RECEIPT: follows a planned campaign (gnh plan's receipt.json)
// through Slurm to its merged result (doc/operations.md).
#pragma once
#include <string>

#include "driver/command.hpp"
#include "parallel/comm.hpp"

namespace gnh {

struct WatchOptions {
  std::string receipt;
  bool resubmit = false;  // resubmit shards that failed, were cancelled or timed out
  int max_attempts = 3;   // submissions per shard, the first included
  bool follow = false;    // keep watching until the campaign is merged or stuck
  double interval = 60;   // seconds between looks with --follow
};

// One look (or, with follow, looks until done): 0 when the campaign is merged
// or progressing, 1 when a shard failed and will not be resubmitted.
int watch_command(const Comm& comm, const WatchOptions& opt);

// `gnh watch`'s options.
Subcommand add_watch_command(CLI::App& gnh);

}  // namespace gnh
