// SPDX-License-Identifier: BSD-3-Clause
#include "driver/command.hpp"

#include <CLI/CLI.hpp>
#include <string>
#include <vector>

#include "core/build_info.hpp"
#include "driver/compare.hpp"
#include "driver/merge.hpp"
#include "driver/plan.hpp"
#include "driver/report.hpp"
#include "driver/run.hpp"
#include "driver/selfcheck.hpp"
#include "driver/watch.hpp"

namespace gnh {

int run_gnh(int argc, char** argv, const Comm& comm) {
  CLI::App app{"gnh: gradient noise and Hessian statistics of language-model checkpoints", "gnh"};
  app.set_version_flag("--version", std::string("gnh ") + version() + " (" + git_commit() + ")");
  app.require_subcommand(1);
  // In the order of gnh --help.
  const std::vector<Subcommand> commands = {
      add_run_command(app),    add_compare_command(app),    add_merge_command(app), add_plan_command(app),
      add_report_command(app), add_self_check_command(app), add_watch_command(app)};
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // Help and version go to stdout from rank 0 only; usage errors are user errors.
    if (comm.rank() == 0) return app.exit(e);
    return e.get_exit_code();
  }
  for (const auto& c : commands)
    if (c.app->parsed()) return c.run(comm);
  return 2;  // not reached: require_subcommand(1)
}

}  // namespace gnh
