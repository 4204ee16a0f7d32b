// SPDX-License-Identifier: BSD-3-Clause
// `gnh run DECK`: the analysis driver. Every rank calls it; user errors found
// before the computation stop every rank (see Comm::collective).
#pragma once
#include <string>
#include <vector>

#include "parallel/comm.hpp"

namespace gnh {

struct RunOptions {
  std::string deck;
  std::vector<std::string> overrides;  // --set key=value
  bool quiet = false;                  // no deck echo and no per-group progress
};

// Returns the process exit status (0: every group of every case succeeded).
int run_command(const Comm& comm, const RunOptions& opt);

}  // namespace gnh
