// SPDX-License-Identifier: BSD-3-Clause
// `gnh plan DECK --jobs N`: deals the campaign's groups to N shards, estimates
// each shard's wall time from a measured timing profile of the deck's recipe,
// writes the shard and merge batch scripts and a JSON receipt, and with
// --submit submits them to Slurm (the merge after all shards, afterok).
#pragma once
#include <string>
#include <vector>

#include "driver/command.hpp"
#include "parallel/comm.hpp"

namespace gnh {

struct PlanOptions {
  std::string deck;
  std::vector<std::string> overrides;
  int jobs = 1;
  std::string profile;         // name in jobscripts/profiles or a path; empty: find one matching the recipe
  std::string time;            // explicit wall time (HH:MM:SS), required without a profile
  std::string out_dir;         // default: OUTPUT.plan
  std::string target = "cpu";  // cpu | gh200
  std::string partition, account;
  int term_seconds = 600;  // SIGTERM this long before the time limit
  bool submit = false;
  bool print_recipe = false;  // print the deck's recipe (what a profile is keyed by) as JSON and stop
};

int plan_command(const Comm& comm, const PlanOptions& opt);

// `gnh plan`'s options.
Subcommand add_plan_command(CLI::App& gnh);

}  // namespace gnh
