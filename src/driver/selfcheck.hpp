// SPDX-License-Identifier: BSD-3-Clause
// The device self-check: the shipped tiny model (share/gnh/jobscripts/
// selfcheck) through this build's engines, on this rank's device, in a
// precision and curvature method, against the float64 PyTorch values stored
// beside it. Seconds; run by every shard job before its analysis.
#pragma once
#include <string>

#include "analysis/settings.hpp"
#include "driver/command.hpp"
#include "parallel/comm.hpp"

namespace gnh {

// Every rank checks its own device; throws gnh::Error on every rank, naming
// the rank, host and each value that is off, when any rank fails. Prints one
// line from rank 0 unless quiet.
void self_check(const Comm& comm, Precision precision, CurvatureMethod method, bool quiet);

// gnh self-check [--precision P] [--curvature-method M]
int self_check_command(const Comm& comm, const std::string& precision, const std::string& method);

// `gnh self-check`'s options.
Subcommand add_self_check_command(CLI::App& gnh);

}  // namespace gnh
