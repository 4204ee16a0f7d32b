// SPDX-License-Identifier: BSD-3-Clause
// `gnh merge OUT.h5 SHARD.h5...`: validates shard outputs of one planned
// campaign and combines them; reports precisely what is missing or mismatched
// instead of writing a partial result.
#pragma once
#include <string>
#include <vector>

#include "driver/command.hpp"
#include "parallel/comm.hpp"

namespace gnh {

struct MergeOptions {
  std::string output;
  std::vector<std::string> shards;
  // A shard whose recorded identity checks failed is refused unless this is
  // set; the identities accepted so are then listed in the output.
  bool accept_failed_identities = false;
};

int merge_command(const Comm& comm, const MergeOptions& opt);

// `gnh merge`'s options.
Subcommand add_merge_command(CLI::App& gnh);

}  // namespace gnh
