// SPDX-License-Identifier: BSD-3-Clause
// The computing part of `gnh run`: each team of ranks analyses its groups of
// identical checkpoints, case by case, and its leader writes one group file
// per finished group (io/results.hpp). SIGTERM finishes the current batch and
// leaves the rest for the next run.
#pragma once
#include <string>
#include <vector>

#include "driver/campaign.hpp"
#include "parallel/comm.hpp"

namespace gnh {

// What happened to a team's groups.
struct Outcome {
  int done = 0, failed = 0, interrupted = 0, skipped = 0;
};

// From now on SIGTERM (Slurm's warning before the time limit) stops the run
// after the current batch; terminated() says whether it came.
void stop_on_sigterm();
bool terminated();

// The groups of team `my_team` (team_of_group[g] == my_team), computed by the
// ranks of team_comm; a group already complete with these settings is skipped,
// a failed one reported and left out. Every member returns the same counts.
Outcome compute_groups(const Comm& world, const Comm& team_comm, const Campaign& c,
                       const std::vector<int>& team_of_group, int my_team, const std::string& output, bool quiet);

}  // namespace gnh
