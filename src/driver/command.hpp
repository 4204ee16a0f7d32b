// SPDX-License-Identifier: BSD-3-Clause
// gnh's subcommands. Each one's CLI11 options live beside its driver
// (add_<name>_command in driver/<name>.cpp): it adds its subcommand to the
// gnh app, binds the options to state of its own and returns what to run once
// the command line is parsed. run_gnh (driver/command.cpp) holds the list.
#pragma once
#include <functional>

#include "parallel/comm.hpp"

namespace CLI {
class App;
}

namespace gnh {

// A registered subcommand: its parser, and what it does on every rank once
// parsed (the process exit status).
struct Subcommand {
  CLI::App* app = nullptr;
  std::function<int(const Comm&)> run;
};

// Parses the command line (without Kokkos' --kokkos-* arguments), answers
// --help, --version and usage errors (printed by rank 0), and runs the one
// subcommand given on every rank. User errors leave as gnh::Error.
int run_gnh(int argc, char** argv, const Comm& comm);

}  // namespace gnh
