// SPDX-License-Identifier: BSD-3-Clause
#include "driver/report.hpp"

#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <filesystem>
#include <memory>
#include <vector>

#include "driver/install.hpp"

extern char** environ;

namespace gnh {
namespace {

// Beside the executable (bin/ of a build or an installed tree), else in the
// source tree of a build.
std::string report_tool() {
  namespace fs = std::filesystem;
  const fs::path beside = executable_directory() / "gnh-report";
  if (fs::exists(beside)) return beside.string();
  if (fs::exists(GNH_REPORT_TOOL)) return GNH_REPORT_TOOL;
  fail("cannot find the report tool gnh-report beside ", executable_directory().string(), " or at ", GNH_REPORT_TOOL);
}

}  // namespace

int report_command(const Comm& comm, const std::string& results, const std::string& out_dir) {
  int status = 0;
  comm.collective([&] {
    if (comm.rank() != 0) return;
    const std::string tool = report_tool();
    std::vector<std::string> args = {GNH_PYTHON, tool, results, "--out", out_dir};
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    pid_t pid = 0;
    if (posix_spawn(&pid, argv[0], nullptr, nullptr, argv.data(), environ) != 0)
      fail("cannot start ", GNH_PYTHON, " for the report (Debian's python3 with h5py and matplotlib)");
    int ws = 0;
    waitpid(pid, &ws, 0);
    status = WIFEXITED(ws) ? WEXITSTATUS(ws) : 1;
    // The tool printed its own one-line error.
    if (status != 0) throw ErrorElsewhere(0);
  });
  return status;
}

Subcommand add_report_command(CLI::App& gnh) {
  struct Paths {
    std::string results, out_dir;
  };
  auto opt = std::make_shared<Paths>();
  CLI::App* cmd =
      gnh.add_subcommand("report",
                         "CSV tables and PNG/PDF figures of every statistic against checkpoint, seen vs unseen, with a "
                         "one-page summary");
  cmd->add_option("results", opt->results, "Results file (gnh run or gnh merge)")->required();
  cmd->add_option("--out", opt->out_dir, "Directory for the tables and figures")->required();
  return {cmd, [opt](const Comm& comm) { return report_command(comm, opt->results, opt->out_dir); }};
}

}  // namespace gnh
