// SPDX-License-Identifier: BSD-3-Clause
// `gnh report RESULTS.h5 --out DIR`: CSV tables and PNG/PDF figures, drawn by
// the Python report tool (apps/gnh-report, matplotlib) that ships beside gnh.
#pragma once
#include <string>

#include "driver/command.hpp"
#include "parallel/comm.hpp"

namespace gnh {

int report_command(const Comm& comm, const std::string& results, const std::string& out_dir);

// `gnh report`'s options.
Subcommand add_report_command(CLI::App& gnh);

}  // namespace gnh
