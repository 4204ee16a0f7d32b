// SPDX-License-Identifier: BSD-3-Clause
// `gnh compare DECK --policies A,B`: the deck's analysis under two precision
// policies with matched batches and directions, and how far B is from A.
#pragma once
#include <string>
#include <vector>

#include "driver/command.hpp"
#include "parallel/comm.hpp"

namespace gnh {

struct CompareOptions {
  std::string deck;
  std::vector<std::string> overrides;
  std::vector<std::string> policies = {"fp32", "bf16-amp"};  // reference, candidate
  double tolerance = 0.05;
  bool quiet = false;
};

int compare_command(const Comm& comm, const CompareOptions& opt);

// `gnh compare`'s options; its action splits --policies A,B and runs compare_command.
Subcommand add_compare_command(CLI::App& gnh);

}  // namespace gnh
