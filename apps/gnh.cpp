// SPDX-License-Identifier: BSD-3-Clause
// gnh: initialise MPI and Kokkos, parse the command line, dispatch, report.
// User errors (gnh::Error) end every rank with status 1 and one message, never
// an MPI abort; the only place they are caught is here.
#include <mpi.h>

#include <CLI/CLI.hpp>
#include <Kokkos_Core.hpp>
#include <cstdio>
#include <exception>
#include <sstream>
#include <string>
#include <vector>

#include "core/build_info.hpp"
#include "core/error.hpp"
#include "driver/compare.hpp"
#include "driver/merge.hpp"
#include "driver/plan.hpp"
#include "driver/report.hpp"
#include "driver/selfcheck.hpp"
#include "driver/watch.hpp"
#include "driver/run.hpp"
#include "parallel/comm.hpp"

namespace {

int dispatch(int argc, char** argv, const gnh::Comm& comm) {
  CLI::App app{"gnh: gradient noise and Hessian statistics of language-model checkpoints", "gnh"};
  app.set_version_flag("--version", std::string("gnh ") + gnh::version() + " (" + gnh::git_commit() + ")");
  app.require_subcommand(1);

  gnh::RunOptions run;
  CLI::App* run_cmd = app.add_subcommand(
      "run", "Compute the statistics of every checkpoint in DECK (under mpirun/srun: groups of "
             "identical checkpoints are dealt round-robin over ranks)");
  run_cmd->add_option("deck", run.deck, "Input deck (TOML); see doc/deck.md")->required();
  run_cmd->add_option("--set", run.overrides,
                      "Override a deck key, e.g. --set analysis.directions=8 (repeatable)")
      ->type_name("KEY=VALUE");
  run_cmd->add_flag("--quiet", run.quiet, "Do not echo the deck or per-group progress");
  std::string shard;
  run_cmd->add_option("--shard", shard, "Run shard I of N of a planned campaign (see gnh plan): groups g with "
                                        "g mod N = I, into OUTPUT.shard-I-of-N.h5")
      ->type_name("I/N");
  run_cmd->add_flag("--dry-run", run.dry_run,
                    "Validate the deck, every checkpoint and data file, print the work plan, compute nothing");

  run_cmd->add_option("--memory-budget", run.memory_budget,
                      "Memory the plan may use, e.g. 64GiB or 500MB (default: the GPU's memory, or the host's "
                      "shared by the node's ranks); a plan over 90% of it is refused")
      ->type_name("SIZE");
  run_cmd->add_flag("--fit-memory", run.fit_memory,
                    "Use the largest analysis.directions_per_pass and analysis.hvp_batch whose plan fits in 90% of "
                    "the memory budget (they change the settings fingerprint)");

  run_cmd->add_flag("--self-check", run.self_check,
                    "Before computing, check every rank's device on a shipped tiny model against stored float64 "
                    "values in the deck's precision and method (gnh plan's shard scripts do)");

  // Overrides accumulate: let --set be repeated.
  run_cmd->get_option("--set")->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);

  gnh::CompareOptions cmp;
  std::string policies = "fp32,bf16-amp";
  CLI::App* cmp_cmd = app.add_subcommand(
      "compare", "Run DECK's analysis under two precision policies with matched batches and directions and report "
                 "the candidate's errors against the reference (HDF5 and CSV beside run.output)");
  cmp_cmd->add_option("deck", cmp.deck, "Input deck (TOML)")->required();
  cmp_cmd->add_option("--policies", policies, "REFERENCE,CANDIDATE (fp32, tf32, bf16-amp, fp64)")
      ->capture_default_str();
  cmp_cmd->add_option("--tolerance", cmp.tolerance, "Largest relative error of the requested statistics that passes")
      ->capture_default_str();
  cmp_cmd->add_option("--set", cmp.overrides, "Override a deck key (repeatable)")
      ->type_name("KEY=VALUE")
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  cmp_cmd->add_flag("--quiet", cmp.quiet, "Do not echo the deck or per-case progress");

  gnh::MergeOptions mrg;
  CLI::App* mrg_cmd = app.add_subcommand(
      "merge", "Validate the shard outputs of a planned campaign (one settings fingerprint and code version, every "
               "checkpoint exactly once, every group complete, identities re-checked) and combine them");
  mrg_cmd->add_option("output", mrg.output, "Combined results file to write")->required();
  mrg_cmd->add_option("shards", mrg.shards, "Shard result files (OUTPUT.shard-I-of-N.h5)")->required();
  mrg_cmd->add_flag("--accept-failed-identities", mrg.accept_failed_identities,
                    "Merge shards whose recorded identity checks failed (refused otherwise); the failed checks are "
                    "listed in the output's accepted_failed_identities attribute");

  gnh::PlanOptions pln;
  CLI::App* pln_cmd = app.add_subcommand(
      "plan", "Deal DECK's groups to N shards, estimate each shard's wall time from a measured timing profile, "
              "write Slurm scripts and a receipt; --submit submits the shards and a merge job (afterok)");
  pln_cmd->add_option("deck", pln.deck, "Input deck (TOML)")->required();
  pln_cmd->add_option("--jobs", pln.jobs, "Number of shards")->required();
  pln_cmd->add_option("--profile", pln.profile,
                      "Timing profile (name in jobscripts/profiles or a path); default: the one measured for this "
                      "deck's recipe");
  pln_cmd->add_option("--time", pln.time, "Wall time per shard (HH:MM:SS); required when no profile matches");
  pln_cmd->add_option("--out", pln.out_dir, "Directory for scripts and receipt (default OUTPUT.plan)");
  pln_cmd->add_option("--target", pln.target, "cpu or gh200")->capture_default_str();
  pln_cmd->add_option("--partition", pln.partition, "Slurm partition");
  pln_cmd->add_option("--account", pln.account, "Slurm account");
  pln_cmd->add_option("--term-seconds", pln.term_seconds, "SIGTERM this many seconds before the time limit")
      ->capture_default_str();
  pln_cmd->add_option("--set", pln.overrides, "Override a deck key (repeatable)")
      ->type_name("KEY=VALUE")
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  pln_cmd->add_flag("--submit", pln.submit, "Submit the shards and the merge job with sbatch");
  pln_cmd->add_flag("--print-recipe", pln.print_recipe,
                    "Print the deck's recipe (the key of timing profiles) as JSON and stop");

  std::string report_in, report_out;
  CLI::App* rep_cmd = app.add_subcommand(
      "report", "CSV tables and PNG/PDF figures of every statistic against checkpoint, seen vs unseen, with a "
                "one-page summary");
  rep_cmd->add_option("results", report_in, "Results file (gnh run or gnh merge)")->required();
  rep_cmd->add_option("--out", report_out, "Directory for the tables and figures")->required();

  std::string sc_precision = "fp32", sc_method = "second-order-forward";
  CLI::App* sc_cmd = app.add_subcommand(
      "self-check", "Check this build and every rank's device on a shipped tiny model against stored float64 "
                    "PyTorch values (seconds); under srun, one rank per device");
  sc_cmd->add_option("--precision", sc_precision, "fp32, tf32, bf16-amp or fp64")->capture_default_str();
  sc_cmd->add_option("--curvature-method", sc_method, "second-order-forward or forward-over-reverse")
      ->capture_default_str();

  gnh::WatchOptions wch;
  CLI::App* wch_cmd = app.add_subcommand(
      "watch", "Follow a planned campaign from its receipt (OUTPUT.plan/receipt.json): every shard's Slurm state, "
               "groups done and attempts; --resubmit resubmits failed, cancelled or timed-out shards; once every "
               "shard is complete, merges and draws the report. One look by default; actions go to watch.log "
               "beside the receipt");
  wch_cmd->add_option("receipt", wch.receipt, "The plan's receipt.json")->required();
  wch_cmd->add_flag("--resubmit", wch.resubmit, "Resubmit shards that failed, were cancelled or timed out");
  wch_cmd->add_option("--max-attempts", wch.max_attempts, "Submissions per shard, the first included")
      ->capture_default_str();
  wch_cmd->add_flag("--follow", wch.follow, "Keep watching until the campaign is merged or a shard is stuck");
  wch_cmd->add_option("--interval", wch.interval, "Seconds between looks with --follow")->capture_default_str();

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // Help and version go to stdout from rank 0 only; usage errors are user errors.
    if (comm.rank() == 0) return app.exit(e);
    return e.get_exit_code();
  }
  if (run_cmd->parsed()) {
    comm.collective([&] {
      if (shard.empty()) return;
      const auto slash = shard.find('/');
      try {
        if (slash == std::string::npos) throw std::invalid_argument("no slash");
        run.shard_index = std::stoi(shard.substr(0, slash));
        run.shard_count = std::stoi(shard.substr(slash + 1));
      } catch (const std::exception&) {
        throw gnh::Error("--shard " + shard + ": expected I/N, e.g. --shard 0/4");
      }
      if (run.shard_count < 1 || run.shard_index < 0 || run.shard_index >= run.shard_count)
        throw gnh::Error("--shard " + shard + ": need 0 <= I < N");
    });
    return gnh::run_command(comm, run);
  }
  if (mrg_cmd->parsed()) return gnh::merge_command(comm, mrg);
  if (rep_cmd->parsed()) return gnh::report_command(comm, report_in, report_out);
  if (pln_cmd->parsed()) return gnh::plan_command(comm, pln);
  if (wch_cmd->parsed()) return gnh::watch_command(comm, wch);
  if (sc_cmd->parsed()) return gnh::self_check_command(comm, sc_precision, sc_method);
  if (cmp_cmd->parsed()) {
    cmp.policies.clear();
    std::stringstream ss(policies);
    for (std::string p; std::getline(ss, p, ',');) cmp.policies.push_back(p);
    return gnh::compare_command(comm, cmp);
  }
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int status = 0;
  {
    gnh::Comm comm(MPI_COMM_WORLD);
    // Kokkos sees only the --kokkos-* arguments: given --help it would print
    // its own banner instead of gnh's. gnh's parser sees the rest;
    // --kokkos-help prints Kokkos' options and nothing else.
    std::vector<char*> kokkos_argv{argv[0]}, gnh_argv{argv[0]};
    bool kokkos_help = false;
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      if (a.rfind("--kokkos-", 0) == 0) {
        kokkos_argv.push_back(argv[i]);
        kokkos_help = kokkos_help || a == "--kokkos-help";
      } else {
        gnh_argv.push_back(argv[i]);
      }
    }
    int kokkos_argc = int(kokkos_argv.size()), gnh_argc = int(gnh_argv.size());
    kokkos_argv.push_back(nullptr);
    gnh_argv.push_back(nullptr);
    Kokkos::initialize(kokkos_argc, kokkos_argv.data());
    try {
      if (!kokkos_help) status = dispatch(gnh_argc, gnh_argv.data(), comm);
    } catch (const gnh::ErrorElsewhere&) {
      status = 1;
    } catch (const gnh::Error& e) {
      std::fprintf(stderr, "gnh: error: %s\n", e.what());
      status = 1;
    } catch (const std::exception& e) {
      // Not a user error: a bug. Other ranks may be waiting in a collective,
      // so abort the job rather than hang it.
      std::fprintf(stderr, "gnh: internal error on rank %d: %s\n", comm.rank(), e.what());
      if (comm.size() > 1) MPI_Abort(MPI_COMM_WORLD, 3);
      status = 3;
    }
    Kokkos::finalize();
  }
  MPI_Finalize();
  return status;
}
