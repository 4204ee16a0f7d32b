// SPDX-License-Identifier: BSD-3-Clause
// Commands the drivers run in a shell (Slurm's sbatch, squeue, sacct, scancel).
#pragma once
#include <string>

namespace gnh {

// s quoted for a POSIX shell.
std::string shell_quote(const std::string& s);
// Runs cmd with popen; its standard output, trailing newlines and spaces
// removed, and its exit status in `status`.
std::string run_capture(const std::string& cmd, int& status);

}  // namespace gnh
