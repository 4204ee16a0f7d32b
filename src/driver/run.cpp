// SPDX-License-Identifier: BSD-3-Clause
#include "driver/run.hpp"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>

#include "analysis/blocks.hpp"
#include "analysis/memory.hpp"
#include "analysis/sampling.hpp"
#include "analysis/team.hpp"
#include "core/deal.hpp"
#include "driver/campaign.hpp"
#include "driver/run_groups.hpp"
#include "driver/run_memory.hpp"
#include "driver/selfcheck.hpp"
#include "io/files.hpp"
#include "io/results.hpp"
#include "model/layout.hpp"

namespace gnh {
namespace {

// The operators whose spectra a plan computes, as the dry run names them.
std::string spectrum_operators(const CurvatureSettings& cv) {
  const bool php = cv.lanczos_php;
  const std::string h = php ? "P^1/2 H P^1/2" : "H", g = php ? "P^1/2 GGN P^1/2" : "GGN";
  return cv.op == OperatorChoice::hessian ? h : cv.op == OperatorChoice::ggn ? g : h + " and " + g;
}

// The [landscape] forward passes of a case of n blocks (a forward pass costs
// about a third of a gradient pass: its reverse twice the forward).
void print_landscape_plan(const LandscapeSettings& ls, index_t n, index_t microbatch) {
  const index_t fwd = ls.forward_passes(), R = ls.curvature_directions();
  const std::string plane = ls.plane.empty() ? "" : ", a plane of " + std::to_string(ls.plane_points) + "^2";
  const std::string random =
      R > 0 ? ", and curvature passes along " + std::to_string(R) + " direction(s) (the random ones, the plane's sum)"
            : "";
  std::printf(
      "         landscape: %lld line(s) of %lld points%s over +-%g: %lld epoch forward passes of %lld microbatches "
      "(about %.3g gradient passes)%s\n",
      static_cast<long long>(ls.directions.size()), static_cast<long long>(ls.points), plane.c_str(), ls.range,
      static_cast<long long>(fwd), static_cast<long long>((n + microbatch - 1) / microbatch), double(fwd) / 3.0,
      random.c_str());
}

// The dry run's account of a plan's vectors by kind: the analysis's own
// (G, the noise vectors, the exact sums, ...: a member's slice with
// parallel.parameter_shards), those the engines read or write whole, and the
// scatter's round buffers.
std::string vectors_by_kind(const ModelConfig& cfg, const AnalysisSettings& s, const MemoryPlan& m) {
  const int R = int(s.parameter_shards);
  const index_t P = ParamLayout(cfg).size();
  std::string out = gib(m.vectors_sliced) + " the analysis's own";
  if (R > 1)
    out += " as slices of at most " + std::to_string(ShardLayout(P, R).largest()) + " of " + std::to_string(P) +
           " parameters (parameter_shards = " + std::to_string(R) + ")";
  out += ", " + gib(m.vectors_whole) + " whole for the engines";
  if (m.vectors_buffers > 0) out += ", " + gib(m.vectors_buffers) + " scatter buffers";
  return out;
}

void print_plan(const Campaign& c, const std::vector<int>& team_of_group, int teams, int rpc,
                const std::string& output) {
  const AnalysisSettings& s = c.deck.analysis;
  const std::string& fingerprint = c.info.settings_fingerprint;
  std::printf("gnh: plan: %zu group(s) over %d team(s) of %d rank(s); settings fingerprint %s\n", c.groups.size(),
              teams, rpc, fingerprint.c_str());
  for (std::size_t g = 0; g < c.groups.size(); ++g) {
    std::string aliases;
    for (const auto& a : c.groups[g].aliases) aliases += (aliases.empty() ? "" : ", ") + a;
    const std::string path = group_file(output, c.groups[g].hash);
    const bool done = group_file_reusable(path, c.info, c.groups[g].ordered ? &c.groups[g].partner_hash : nullptr);
    // Where a case selects samples: which, per state (with its step where tied to it).
    std::string samples;
    for (const auto& cs : c.cases)
      if (cs.spec.windowed()) {
        const auto [first, end] = case_samples(c.deck, cs, c.groups[g]);
        samples += "; " + cs.name + " samples [" + std::to_string(first) + ", " + std::to_string(end) + ")";
        if (cs.spec.step_tied()) samples += " (step " + std::to_string(*c.groups[g].step) + ")";
      }
    // By the fingerprint; a windowed case's recorded tokens are compared when the run reads them.
    std::printf("  group %s -> team %d%s: %s%s\n", c.groups[g].hash.c_str(), team_of_group[g],
                done ? " (complete, will be skipped)" : "", aliases.c_str(), samples.c_str());
  }
  for (const auto& cs : c.cases) {
    const CasePlan p = plan_case(s, cs.blocks, true, true);
    const index_t n = cs.blocks, m = p.n_noise, D = p.directions();
    const std::vector<index_t>& sizes = p.pass_widths;
    std::string widths;
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      if (i > 0 && sizes[i] == sizes[i - 1]) continue;
      const auto same = std::count(sizes.begin(), sizes.end(), sizes[i]);
      widths += (widths.empty() ? "" : " + ") + std::to_string(same) + "x" + std::to_string(sizes[i]);
    }
    std::printf(
        "  case %-6s %s%lld blocks (%lld tokens): %lld gradient microbatches; %lld noise batches of %lld%s; "
        "%lld curvature directions in %lld epoch pass(es) (%s directions) of %lld HVP batches (%s)\n",
        cs.name.c_str(), cs.spec.step_tied() ? "up to " : "", static_cast<long long>(n),
        static_cast<long long>(n * s.context), static_cast<long long>((n + s.grad_microbatch - 1) / s.grad_microbatch),
        static_cast<long long>(m), static_cast<long long>(s.noise_batch), m < s.noise_samples ? " (capped)" : "",
        static_cast<long long>(D), static_cast<long long>(sizes.size()), widths.c_str(),
        static_cast<long long>((n + s.hvp_batch - 1) / s.hvp_batch), to_string(s.curvature_method));
    const MemoryPlan mem = plan_memory(c.cfg, s, p, rpc);
    const std::string seq = s.per_sequence ? ", per-sequence norms " + gib(mem.sequence) + " (" +
                                                 std::to_string(sequence_group(c.cfg, s, gpu_shaped_build())) +
                                                 " sequences a reverse)"
                                           : "";
    const char* noise = m == 0 ? "" : p.keep_noise ? ", the noise vectors kept" : ", the noise vectors recomputed";
    std::printf(
        "         memory per rank %s (its largest stage, %s: engines %s, vectors %s): gradient engine %s, "
        "curvature engine (K = %lld) %s, checks %s, vectors %s (%lld parameter-sized%s: %s)%s\n",
        gib(mem.total()).c_str(), mem.peak_stage, gib(mem.peak_engines).c_str(), gib(mem.peak_vectors).c_str(),
        gib(mem.gradient).c_str(), static_cast<long long>(sizes.front()), gib(mem.curvature).c_str(),
        gib(mem.checks).c_str(), gib(mem.vectors).c_str(), static_cast<long long>(mem.vector_count), noise,
        vectors_by_kind(c.cfg, s, mem).c_str(), seq.c_str());
    if (p.spectrum)
      std::printf(
          "         spectrum: %lld Lanczos chain(s) of up to %lld steps on %s, %lld epoch pass(es) per step; basis "
          "sharded over the team's %d rank(s): %s per rank (float64)\n",
          static_cast<long long>(s.curvature.lanczos_chains), static_cast<long long>(s.curvature.lanczos_steps),
          spectrum_operators(s.curvature).c_str(),
          static_cast<long long>(balanced_passes(s.curvature.lanczos_chains, s.directions_per_pass).size()), rpc,
          gib(mem.spectrum).c_str());
    if (p.spectrum && s.curvature.layer_spectra)
      std::printf(
          "         per-layer spectra: one chain on each of the %lld layer blocks' H_bb, %lld pass(es) per step\n",
          static_cast<long long>(layer_blocks(c.cfg)),
          static_cast<long long>(balanced_passes(layer_blocks(c.cfg), s.directions_per_pass).size()));
    if (p.spectrum && s.curvature.eigenvectors > 0)
      std::printf("         eigenvectors: the first chain's top %lld Ritz vectors (float32 in the output: %s)\n",
                  static_cast<long long>(s.curvature.eigenvectors),
                  gib(std::size_t(s.curvature.eigenvectors) * 4 * std::size_t(ParamLayout(c.cfg).size())).c_str());
    if (s.landscape.any()) print_landscape_plan(s.landscape, n, s.grad_microbatch);
  }
  std::printf("  output %s (group files in %s)\n", output.c_str(), groups_directory(output).c_str());
  std::fflush(stdout);
}

void print_summary(const std::vector<GroupSummary>& groups, const std::string& output) {
  std::printf("\n%-22s %-16s %-7s %10s %10s %11s %11s %10s %10s %10s\n", "checkpoint", "group", "case", "tokens",
              "loss", "|G|^2", "GHG", "B_simple", "B_noise", "tr(H)");
  for (const auto& g : groups)
    for (const auto& alias : g.aliases)
      for (const auto& named : g.cases) {
        const std::string& name = named.first;
        const std::map<std::string, double>& a = named.second;
        auto v = [&](const char* k) {
          auto it = a.find(k);
          return it == a.end() ? NAN : it->second;
        };
        // Not estimated (no noise samples or no directions): "-".
        auto g4 = [&](const char* k) {
          char buf[32];
          if (std::isfinite(v(k))) std::snprintf(buf, sizeof(buf), "%10.4g", v(k));
          else std::snprintf(buf, sizeof(buf), "%10s", "-");
          return std::string(buf);
        };
        std::printf("%-22s %-16s %-7s %10.0f %10.6f %11.4e %11.4e %s %s %s\n", alias.c_str(), g.hash.c_str(),
                    name.c_str(), v("tokens"), v("loss"), v("G_sqnorm"), v("GHG"), g4("B_simple").c_str(),
                    g4("B_noise").c_str(), g4("trace_H").c_str());
      }
  std::printf("\nresults: %s\n", output.c_str());
  std::fflush(stdout);
}

// --fit-memory: rank 0's budget decides for every rank (one campaign, one set
// of settings), and the prepared campaign takes the choice in place.
void fit_campaign_to_memory(const Comm& comm, Campaign& c, const MemoryBudget& budget) {
  std::vector<long long> kb = {0, 0, 0, 0};  // rank 0's choice, summed with zeros: on every rank
  comm.collective([&] {
    if (comm.rank() != 0) return;
    const MemoryFit fit = fit_memory(c, budget);
    kb = {fit.directions_per_pass, fit.hvp_batch, fit.grad_microbatch, fit.parameter_shards};
  });
  comm.sum(kb);
  if (comm.rank() == 0)
    std::printf(
        "gnh: --fit-memory: analysis.directions_per_pass = %lld, analysis.hvp_batch = %lld, analysis.grad_microbatch "
        "= %lld, parallel.parameter_shards = %lld (90%% of %s)\n",
        kb[0], kb[1], kb[2], kb[3], budget.what.c_str());
  set_pass_sizes(comm, c, {index_t(kb[0]), index_t(kb[1]), index_t(kb[2]), index_t(kb[3])});
}

// parallel.noise_vectors: rank 0's choice for every rank (a team's members
// must agree: recomputing is collective).
void choose_noise_vectors(const Comm& comm, Campaign& c, const MemoryBudget& budget) {
  std::vector<long long> keep = {0};
  comm.collective([&] {
    if (comm.rank() == 0) keep[0] = keep_noise_vectors(c, budget) ? 1 : 0;
  });
  comm.sum(keep);
  c.deck.analysis.keep_noise_vectors = keep[0] != 0;
}

// A shard of a planned campaign (gnh plan): its share of the groups, dealt
// as the planner deals them, into a file of its own.
void take_shard(Campaign& c, int index, int count) {
  std::vector<GroupRecord> share;
  for (const index_t g : dealt_share(index_t(c.groups.size()), count, index)) share.push_back(c.groups[std::size_t(g)]);
  c.all_groups = std::move(c.groups);
  c.groups = share;
  c.output = shard_output(c.output, index, count);
  c.info.shard = std::to_string(index) + "/" + std::to_string(count);
}

// Teams of ranks_per_checkpoint ranks, and the groups dealt round-robin over them.
struct Teams {
  int ranks = 1, count = 1, mine = 0;
  std::vector<int> of_group;
};

Teams teams_of(const Comm& comm, const Campaign& c) {
  Teams t;
  t.ranks = int(c.deck.ranks_per_checkpoint);
  t.count = comm.size() / t.ranks;
  t.mine = comm.rank() / t.ranks;
  t.of_group.resize(c.groups.size());
  for (std::size_t g = 0; g < c.groups.size(); ++g) t.of_group[g] = dealt_to(index_t(g), t.count);
  return t;
}

// Nothing is computed unless its results can be written, and by this run
// alone. The dry run only looks (and returns the other run writing the output,
// if any); a run creates the directories, writes a probe and takes the
// output's lock, held until `lock` goes.
std::string claim_output(const Comm& comm, const Campaign& c, const RunOptions& opt, OutputLock& lock) {
  std::string other_run;
  comm.collective([&] {
    if (comm.rank() != 0) return;
    check_output_writable(c.output, groups_directory(c.output), c.deck.file + ": run.output", !opt.dry_run);
    if (opt.dry_run) other_run = OutputLock::holder(c.output);
    else lock = OutputLock(c.output, "gnh run " + opt.deck + (opt.shard_count > 1 ? " --shard " + c.info.shard : ""));
    // Under the lock no other run writes these: what is there is a killed run's.
    if (!opt.dry_run)
      if (const int n = remove_stale_temporaries(c.output) + remove_stale_temporaries(csv_path(c.output)) +
                        remove_stale_temporaries(groups_directory(c.output) + "/"))
        std::printf("gnh: removed %d temporary file(s) left by an earlier run that did not finish\n", n);
  });
  return other_run;
}

// Rank 0's account of the plan before computing: the plan itself (unless
// quiet), and notes on what will not be computed.
void print_run_plan(const Campaign& c, const Teams& t, const MemoryBudget& budget, const RunOptions& opt,
                    const std::string& other_run) {
  if (opt.dry_run || !opt.quiet) {
    print_plan(c, t.of_group, t.count, t.ranks, c.output);
    if (budget.per_rank >= 0)
      std::printf("  memory: the plan needs %s per rank, within 90%% of %s (%s)\n",
                  gib(planned_per_rank(c, c.deck.analysis, t.ranks)).c_str(), budget.what.c_str(),
                  gib(std::size_t(0.9 * double(budget.per_rank))).c_str());
  }
  const AnalysisSettings& as = c.deck.analysis;
  if ((as.curvature.blocks || as.curvature.diagonal) && !as.keeps_hv())
    std::printf(
        "gnh: note: [curvature] with curvature_method = \"%s\": the epoch's H v is not formed, so only the "
        "per-block G_sqnorm, trace_sigma and B_simple are computed; trace_H, GHG_contrib, xiHxi_contrib, "
        "frob_H, effective_rank and the diagonal need curvature_method = \"forward-over-reverse\"\n",
        to_string(as.curvature_method));
}

// Every rank's outcome, counted once per team (from its leader): every member
// of a team counts the same groups.
struct RunCounts {
  long long failed = 0, interrupted = 0, terminated = 0, done = 0, skipped = 0;
};

RunCounts count_outcomes(const Comm& comm, const Outcome& mine, int ranks_per_team) {
  const bool leader = comm.rank() % ranks_per_team == 0;
  std::vector<long long> n = {leader ? mine.failed : 0, leader ? mine.interrupted : 0, terminated() ? 1 : 0,
                              leader ? mine.done : 0, leader ? mine.skipped : 0};
  comm.sum(n);
  if (comm.rank() == 0) {
    std::printf(
        "gnh: groups: computed %lld, reused %lld (complete from an earlier run with these settings), "
        "failed %lld, interrupted %lld\n",
        n[3], n[4], n[0], n[1]);
    std::fflush(stdout);
  }
  return {n[0], n[1], n[2], n[3], n[4]};
}

// Rank 0, once every group file is on disk (or failed): merges them into the
// output and prints the summary, or says how to resume after SIGTERM. Returns
// the exit status.
int write_results(const Campaign& c, const RunCounts& n) {
  std::vector<std::string> complete, missing;
  std::vector<std::string> expected;  // this run's (or shard's) checkpoint file names
  for (const auto& g : c.groups) {
    expected.insert(expected.end(), g.aliases.begin(), g.aliases.end());
    const std::string path = group_file(c.output, g.hash);
    if (group_file_reusable(path, c.info)) complete.push_back(path);
    else missing.push_back(g.hash + " (" + g.aliases.front() + ")");
  }
  if (n.interrupted > 0 || n.terminated > 0) {
    std::fprintf(stderr,
                 "gnh: interrupted by SIGTERM: %zu of %zu group(s) complete in %s; run the same command "
                 "again to resume\n",
                 complete.size(), c.groups.size(), groups_directory(c.output).c_str());
    return 143;
  }
  merge_results(c.output, c.info, complete, expected);
  std::vector<GroupSummary> summaries;
  for (const auto& p : complete) summaries.push_back(read_group_summary(p));
  print_summary(summaries, c.output);
  if (missing.empty()) return 0;
  std::string list;
  for (const auto& m : missing) list += (list.empty() ? "" : ", ") + m;
  std::fprintf(stderr, "gnh: error: %zu group(s) failed and are not in %s: %s\n", missing.size(), c.output.c_str(),
               list.c_str());
  return 1;
}

// The computation and its results; every rank returns rank 0's status.
int compute_and_write(const Comm& comm, const Campaign& c, const Teams& t, bool quiet) {
  stop_on_sigterm();
  const Outcome mine = compute_groups(comm, comm.split(t.mine), c, t.of_group, t.mine, c.output, quiet);
  const RunCounts counts = count_outcomes(comm, mine, t.ranks);
  std::string write_error;
  int status = 0;
  if (comm.rank() == 0) {
    try {
      status = write_results(c, counts);
    } catch (const Error& e) {
      write_error = e.what();
    }
  }
  comm.collective([&] {
    if (!write_error.empty()) throw Error(write_error);
  });
  comm.broadcast(status, 0);
  return status;
}

// --shard I/N into opt's shard_index and shard_count.
void parse_shard(const std::string& shard, RunOptions& opt) {
  if (shard.empty()) return;
  const auto slash = shard.find('/');
  try {
    if (slash == std::string::npos) throw std::invalid_argument("no slash");
    opt.shard_index = std::stoi(shard.substr(0, slash));
    opt.shard_count = std::stoi(shard.substr(slash + 1));
  } catch (const std::exception&) {
    throw Error("--shard " + shard + ": expected I/N, e.g. --shard 0/4");
  }
  if (opt.shard_count < 1 || opt.shard_index < 0 || opt.shard_index >= opt.shard_count)
    throw Error("--shard " + shard + ": need 0 <= I < N");
}

}  // namespace

int run_command(const Comm& comm, const RunOptions& opt) {
  const bool root = comm.rank() == 0;
  Campaign c = prepare_campaign(comm, opt.deck, opt.overrides, opt.quiet, opt.dry_run);
  MemoryBudget budget;
  comm.collective([&] { budget = memory_budget(comm, opt.memory_budget); });
  choose_noise_vectors(comm, c, budget);
  if (opt.fit_memory) fit_campaign_to_memory(comm, c, budget);
  comm.collective([&] { check_memory(c, budget); });
  if (opt.self_check && !opt.dry_run)
    self_check(comm, c.deck.analysis.precision, c.deck.analysis.curvature_method, opt.quiet);
  const std::string campaign_output = c.output;  // the campaign's, whichever shard this is
  if (opt.shard_count > 1) take_shard(c, opt.shard_index, opt.shard_count);
  const Teams teams = teams_of(comm, c);
  OutputLock lock;
  const std::string other_run = claim_output(comm, c, opt, lock);
  if (!opt.dry_run) choose_host_gemm(comm, c, campaign_output, opt.quiet, !c.deck.analysis.fp64());
  if (opt.dry_run || !opt.quiet) print_engine_settings(comm, c);
  if (root) print_run_plan(c, teams, budget, opt, other_run);
  if (!other_run.empty())
    std::printf("gnh: note: another gnh run is writing %s now (%s); this run would stop at once\n", c.output.c_str(),
                other_run.c_str());
  if (opt.dry_run) {
    if (root)
      std::printf("gnh: dry run: deck, %zu checkpoint(s) and %zu data file(s) are valid; nothing computed\n",
                  c.files.size(), c.cases.size());
    return 0;
  }
  return compute_and_write(comm, c, teams, opt.quiet);
}

Subcommand add_run_command(CLI::App& gnh) {
  auto opt = std::make_shared<RunOptions>();
  auto shard = std::make_shared<std::string>();
  CLI::App* cmd = gnh.add_subcommand("run",
                                     "Compute the statistics of every checkpoint in DECK (under mpirun/srun: groups of "
                                     "identical checkpoints are dealt round-robin over ranks)");
  cmd->add_option("deck", opt->deck, "Input deck (TOML); see doc/deck.md")->required();
  cmd->add_option("--set", opt->overrides, "Override a deck key, e.g. --set analysis.directions=8 (repeatable)")
      ->type_name("KEY=VALUE")
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);  // overrides accumulate: --set may be repeated
  cmd->add_flag("--quiet", opt->quiet, "Do not echo the deck or per-group progress");
  cmd->add_option("--shard", *shard,
                  "Run shard I of N of a planned campaign (see gnh plan): groups g with "
                  "g mod N = I, into OUTPUT.shard-I-of-N.h5")
      ->type_name("I/N");
  cmd->add_flag("--dry-run", opt->dry_run,
                "Validate the deck, every checkpoint and data file, print the work plan, compute nothing");
  cmd->add_option("--memory-budget", opt->memory_budget,
                  "Memory the plan may use, e.g. 64GiB or 500MB (default: the GPU's memory, or the host's "
                  "shared by the node's ranks); a plan over 90% of it is refused")
      ->type_name("SIZE");
  cmd->add_flag("--fit-memory", opt->fit_memory,
                "Use the largest analysis.directions_per_pass and analysis.hvp_batch whose plan fits in 90% of "
                "the memory budget (they change the settings fingerprint)");
  cmd->add_flag("--self-check", opt->self_check,
                "Before computing, check every rank's device on a shipped tiny model against stored float64 "
                "values in the deck's precision and method (gnh plan's shard scripts do)");
  return {cmd, [opt, shard](const Comm& comm) {
            comm.collective([&] { parse_shard(*shard, *opt); });
            return run_command(comm, *opt);
          }};
}

}  // namespace gnh
