// SPDX-License-Identifier: BSD-3-Clause
#include "driver/run.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <map>

#include "analysis/analyser.hpp"
#include "analysis/memory.hpp"
#include "analysis/sampling.hpp"
#include "analysis/usage.hpp"
#include "core/build_info.hpp"
#include "core/deal.hpp"
#include "driver/campaign.hpp"
#include "driver/selfcheck.hpp"
#include "io/checkpoint.hpp"
#include "io/files.hpp"
#include "io/lanczos_store.hpp"
#include "io/results.hpp"
#include "parallel/team_mpi.hpp"

namespace gnh {
namespace {


// SIGTERM (Slurm's warning before the time limit): finish the current batch,
// record progress, exit cleanly.
volatile std::sig_atomic_t g_terminate = 0;
extern "C" void on_sigterm(int) { g_terminate = 1; }

// Progress lines from a team leader: at most every 10 s, and at each stage's end.
class ProgressLog {
 public:
  ProgressLog(int rank, bool quiet) : rank_(rank), quiet_(quiet) {}
  void begin(const std::string& group, const std::string& cas, index_t tokens_per_pass) {
    group_ = group;
    case_ = cas;
    tokens_ = tokens_per_pass;
  }
  void operator()(const std::string& stage, index_t done, index_t total) {
    if (quiet_) return;
    const auto now = std::chrono::steady_clock::now();
    if (stage != stage_) {
      stage_ = stage;
      start_ = now;
      last_ = now;
    }
    const double since = std::chrono::duration<double>(now - last_).count();
    if (done < total && since < 10.0) return;
    last_ = now;
    const double elapsed = std::chrono::duration<double>(now - start_).count();
    const double eta = done > 0 ? elapsed / double(done) * double(total - done) : 0.0;
    const bool epoch = stage == "gradient" || stage.rfind("curvature", 0) == 0 || stage.rfind("spectrum ", 0) == 0;
    if (epoch && total > 0)
      std::printf("gnh: [rank %d] %s %-6s %-14s %lld/%lld batches, %.0f tokens/s, %.1f s, ETA %.1f s\n", rank_,
                  group_.c_str(), case_.c_str(), stage.c_str(), static_cast<long long>(done),
                  static_cast<long long>(total), double(tokens_) * double(done) / double(total) / std::max(elapsed, 1e-9),
                  elapsed, eta);
    else
      std::printf("gnh: [rank %d] %s %-6s %-14s %lld/%lld, %.1f s\n", rank_, group_.c_str(), case_.c_str(),
                  stage.c_str(), static_cast<long long>(done), static_cast<long long>(total), elapsed);
    std::fflush(stdout);
  }

 private:
  int rank_;
  bool quiet_;
  std::string group_, case_, stage_;
  index_t tokens_ = 0;
  std::chrono::steady_clock::time_point start_, last_;
};

// The files of a case's spectrum between Lanczos steps (io/lanczos_store.hpp).
std::string lanczos_prefix(const std::string& output, const std::string& hash, const std::string& cas) {
  return groups_directory(output) + "/" + hash + "." + cas + ".lanczos";
}

struct Outcome {
  int done = 0, failed = 0, interrupted = 0, skipped = 0;
};

// The parameters of group g, read once: the team leader reads the first file
// (its hash computed from the values read and checked against the plan), and
// the team's members read the other files of the group that planning grouped
// by their stored param_sha256 alone, to prove them the same state. Throws
// gnh::Error on every member when any member found a problem.
std::vector<float> group_parameters(MpiTeam& team, const GroupRecord& g, const std::vector<bool>& alias_hashed,
                                    int world_rank, bool quiet) {
  std::vector<float> params;
  std::string error;
  auto read = [&](std::size_t a) {
    const auto t0 = std::chrono::steady_clock::now();
    Checkpoint ck = read_checkpoint(g.alias_paths[a]);
    if (ck.param_sha256 != g.param_sha256)
      fail(ck.path, ": parameters hash to ", ck.param_sha256.substr(0, 16), ", not to the ", g.hash,
           " it was grouped by (changed while the run was starting?)");
    if (!quiet) {
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      std::printf("gnh: [rank %d] read %s: %lld parameters in %.2f s\n", world_rank, g.aliases[a].c_str(),
                  static_cast<long long>(ck.params.size()), s);
      std::fflush(stdout);
    }
    return std::move(ck.params);
  };
  try {
    if (team.rank() == 0) params = read(0);
    for (std::size_t a = 1; a < g.alias_paths.size(); ++a)
      if (!alias_hashed[a] && dealt_to(index_t(a - 1), team.size()) == team.rank()) read(a);
  } catch (const Error& e) {
    error = e.what();
  }
  if (team.any(!error.empty())) throw Error(error);  // empty on the members that found nothing
  params.resize(static_cast<std::size_t>(g.n_params));
  team.broadcast(params.data(), sizeof(float) * params.size(), 0);
  return params;
}

// SPEC §10's AdamW preconditioner of group g: the team leader reads the
// first alias that carries AdamW state (aliases share parameters, not
// necessarily optimizer state: which one was used is recorded), and the team
// shares it. Empty when no alias has state; `note` says which or why not.
std::vector<double> group_preconditioner(MpiTeam& team, const GroupRecord& g, const ModelConfig& cfg,
                                         std::string& note) {
  std::vector<double> P;
  std::string error;
  std::int64_t source = -1;
  if (team.rank() == 0) {
    try {
      for (std::size_t a = 0; a < g.alias_paths.size() && source < 0; ++a)
        if (const auto st = read_adam_state(g.alias_paths[a])) {
          P = adam_preconditioner(*st, cfg, g.alias_paths[a]);
          source = std::int64_t(a);
        }
    } catch (const Error& e) {
      error = e.what();
    }
  }
  if (team.any(!error.empty())) throw Error(error);
  team.broadcast_value(source, 0);
  if (source < 0) {
    std::string names;
    for (const auto& a : g.aliases) names += (names.empty() ? "" : ", ") + a;
    note = "none: no AdamW state (/optimizer) in " + names;
    return {};
  }
  P.resize(static_cast<std::size_t>(g.n_params));
  team.broadcast(P.data(), sizeof(double) * P.size(), 0);
  note = "AdamW state of " + g.aliases[std::size_t(source)];
  return P;
}

Outcome compute_groups(const Comm& world, const Comm& team_comm, const Campaign& c, const std::vector<int>& team_of_group,
                       int my_team, const std::string& output, bool quiet) {
  MpiTeam team(team_comm);
  const bool leader = team.rank() == 0;
  const RunInfo& info = c.info;
  std::unique_ptr<Analyser> analyser;
  ProgressLog log(world.rank(), quiet);
  std::map<std::string, bool> hashed;  // path -> read in full while planning
  for (const auto& f : c.files) hashed[f.path] = f.hashed;
  Outcome out;
  for (std::size_t gi = 0; gi < c.groups.size(); ++gi) {
    if (team_of_group[gi] != my_team) continue;
    GroupRecord g = c.groups[gi];
    const std::string path = group_file(output, g.hash);
    // Every member decides the same way: the leader looks, then tells.
    int complete =
        leader && group_file_complete(path, info.settings_fingerprint, g.ordered ? &g.partner_hash : nullptr) ? 1 : 0;
    team.broadcast_value(complete, 0);
    if (complete) {
      ++out.skipped;
      // A run killed between writing the group file and removing the
      // spectrum's state leaves it behind: the result is in the group file.
      if (leader && c.deck.analysis.curvature.lanczos_steps > 0)
        for (const auto& cs : c.cases)
          FileLanczosStore::remove(lanczos_prefix(output, g.hash, cs.name));
      if (leader && !quiet) {
        std::printf("gnh: [rank %d] %s complete in %s, skipped\n", world.rank(), g.hash.c_str(), path.c_str());
        std::fflush(stdout);
      }
      continue;
    }
    if (g_terminate) {
      ++out.interrupted;
      continue;
    }
    std::string error;
    try {
      std::vector<bool> alias_hashed;
      for (const auto& p : g.alias_paths) alias_hashed.push_back(hashed[p]);
      const std::vector<float> params = group_parameters(team, g, alias_hashed, world.rank(), quiet);
      if (!analyser) analyser = std::make_unique<Analyser>(c.cfg, c.deck.analysis);
      analyser->set_parameters(params);
      const CurvatureSettings& cv = c.deck.analysis.curvature;
      if (cv.preconditioned || (cv.lanczos_steps > 0 && cv.lanczos_php)) {
        std::vector<double> P = group_preconditioner(team, g, c.cfg, g.preconditioner);
        if (leader && !quiet) std::printf("gnh: [rank %d] %s preconditioner: %s\n", world.rank(), g.hash.c_str(),
                                          g.preconditioner.c_str());
        if (leader && P.empty() && cv.lanczos_steps > 0 && cv.lanczos_php)
          std::printf("gnh: note: %s has no AdamW state: no spectrum of P^1/2 H P^1/2 for it "
                      "(curvature.lanczos_operator = \"PHP\")\n", g.hash.c_str());
        analyser->set_preconditioner(P);
      }
      if (g.ordered) {
        // The update's target: the next state's parameters, read by the leader
        // (its hash checked against the plan) and shared.
        std::vector<float> target;
        if (g.partner >= 0) {
          const GroupRecord& b = c.groups[std::size_t(g.partner)];
          target = group_parameters(team, b, std::vector<bool>(b.alias_paths.size(), true), world.rank(), quiet);
        }
        analyser->set_update_target(target);
      }
      for (const auto& cs : c.cases) {
        CaseHooks hooks;
        hooks.stop = [] { return g_terminate != 0; };
        if (leader) {
          log.begin(g.hash, cs.name, cs.blocks * c.deck.analysis.context);
          hooks.progress = [&log](const std::string& stage, index_t done, index_t total) { log(stage, done, total); };
        }
        // The spectrum's state between steps, beside the group file.
        std::unique_ptr<FileLanczosStore> store;
        if (c.deck.analysis.curvature.lanczos_steps > 0) {
          store = std::make_unique<FileLanczosStore>(lanczos_prefix(output, g.hash, cs.name),
                                                     info.settings_fingerprint + " " + g.hash + " " + cs.name);
          hooks.lanczos = store.get();
        }
        CaseRecord rec;
        rec.name = cs.name;
        rec.stats = analyser->analyse(team, cs.data.ids.data(), cs.blocks, hooks);
        if (leader && !quiet && rec.stats.spectrum_resumed_at >= 0) {
          std::printf("gnh: [rank %d] %s %-6s spectrum resumed after step %lld (saved in %s)\n", world.rank(),
                      g.hash.c_str(), cs.name.c_str(), static_cast<long long>(rec.stats.spectrum_resumed_at),
                      store->state_path().c_str());
          std::fflush(stdout);
        }
        rec.stats.update.partner = g.partner_hash;
        if (leader) {
          for (const auto& idc : rec.stats.identities)
            if (!idc.ok())
              std::fprintf(stderr,
                           "gnh: WARNING: [rank %d] group %s case %s: identity %s violated: deviation %.3e > "
                           "tolerance %.1e\n",
                           world.rank(), g.hash.c_str(), cs.name.c_str(), idc.name.c_str(), idc.deviation,
                           idc.tolerance);
          if (!quiet)
            std::printf("gnh: [rank %d] %s %-6s loss %.6f |G|^2 %.4e GHG %.4e B_simple %.4g B_noise %.4g tr(H) %.4g\n",
                        world.rank(), g.hash.c_str(), cs.name.c_str(), rec.stats.loss, rec.stats.m.G_sqnorm,
                        rec.stats.m.GHG, rec.stats.derived.B_simple.value, rec.stats.derived.B_noise.value,
                        rec.stats.derived.trace_H.value);
          std::fflush(stdout);
        }
        g.cases.push_back(std::move(rec));
      }
      if (leader) {
        write_group_file(path, info, g);
        for (const auto& cs : c.cases)
          FileLanczosStore::remove(lanczos_prefix(output, g.hash, cs.name));
      }
      ++out.done;
    } catch (const Interrupted&) {
      ++out.interrupted;
    } catch (const Error& e) {
      error = e.what();
    }
    // A failure on one member (a bad file, a non-finite loss) fails the group
    // for the whole team; the team goes on with its next group.
    const bool team_failed = team.any(!error.empty());
    if (team_failed) {
      ++out.failed;
      if (!error.empty())
        std::fprintf(stderr, "gnh: error: [rank %d] group %s (%s): %s\n", world.rank(), g.hash.c_str(),
                     g.aliases.front().c_str(), error.c_str());
    }
  }
  return out;
}

std::string gib(std::size_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.3g GiB", double(bytes) / double(1ull << 30));
  return buf;
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
    const bool done =
        group_file_complete(path, fingerprint, c.groups[g].ordered ? &c.groups[g].partner_hash : nullptr);
    std::printf("  group %s -> team %d%s: %s\n", c.groups[g].hash.c_str(), team_of_group[g],
                done ? " (complete, will be skipped)" : "", aliases.c_str());
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
    std::printf("  case %-6s %lld blocks (%lld tokens): %lld gradient microbatches; %lld noise batches of %lld%s; "
                "%lld curvature directions in %lld epoch pass(es) (%s directions) of %lld HVP batches (%s)\n",
                cs.name.c_str(), static_cast<long long>(n), static_cast<long long>(n * s.context),
                static_cast<long long>((n + s.grad_microbatch - 1) / s.grad_microbatch), static_cast<long long>(m),
                static_cast<long long>(s.noise_batch), m < s.noise_samples ? " (capped)" : "",
                static_cast<long long>(D), static_cast<long long>(sizes.size()), widths.c_str(),
                static_cast<long long>((n + s.hvp_batch - 1) / s.hvp_batch), to_string(s.curvature_method));
    const MemoryPlan mem = plan_memory(c.cfg, s, p, rpc);
    std::printf("         memory per rank %s: gradient engine %s, curvature engine (K = %lld) %s, checks %s, "
                "vectors %s\n", gib(mem.total()).c_str(), gib(mem.gradient).c_str(),
                static_cast<long long>(sizes.front()), gib(mem.curvature).c_str(), gib(mem.checks).c_str(),
                gib(mem.vectors).c_str());
    if (p.spectrum)
      std::printf("         spectrum: %lld Lanczos chain(s) of up to %lld steps on %s, %lld epoch pass(es) per step; basis "
                  "sharded over the team's %d rank(s): %s per rank (float64)\n",
                  static_cast<long long>(s.curvature.lanczos_chains), static_cast<long long>(s.curvature.lanczos_steps),
                  s.curvature.lanczos_php ? "P^1/2 H P^1/2" : "H",
                  static_cast<long long>(balanced_passes(s.curvature.lanczos_chains, s.directions_per_pass).size()),
                  rpc, gib(mem.spectrum).c_str());
  }
  std::printf("  output %s (group files in %s)\n", output.c_str(), groups_directory(output).c_str());
  std::fflush(stdout);
}

void print_summary(const std::vector<GroupSummary>& groups, const std::string& output) {
  std::printf("\n%-22s %-16s %-7s %10s %10s %11s %11s %10s %10s %10s\n", "checkpoint", "group", "case", "tokens", "loss",
              "|G|^2", "GHG", "B_simple", "B_noise", "tr(H)");
  for (const auto& g : groups)
    for (const auto& alias : g.aliases)
      for (const auto& named : g.cases) {
        const std::string& name = named.first;
        const std::map<std::string, double>& a = named.second;
        auto v = [&](const char* k) { auto it = a.find(k); return it == a.end() ? NAN : it->second; };
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

// "64GiB", "1.5TB", "500MB", "123456" (bytes): decimal and binary units.
std::int64_t parse_size(const std::string& text) {
  std::size_t used = 0;
  double v = 0;
  try {
    v = std::stod(text, &used);
  } catch (const std::exception&) {
    fail("--memory-budget ", text, ": expected a size such as 64GiB, 500MB or a byte count");
  }
  std::string unit = text.substr(used);
  while (!unit.empty() && unit.front() == ' ') unit.erase(0, 1);
  const std::map<std::string, double> units = {{"", 1},       {"B", 1},        {"kB", 1e3},     {"KB", 1e3},
                                                {"MB", 1e6},    {"GB", 1e9},     {"TB", 1e12},    {"KiB", 1024.0},
                                                {"MiB", 1048576.0}, {"GiB", 1073741824.0}, {"TiB", 1099511627776.0}};
  const auto it = units.find(unit);
  if (it == units.end() || !(v > 0))
    fail("--memory-budget ", text, ": expected a size such as 64GiB, 500MB or a byte count");
  return std::int64_t(v * it->second);
}

// The memory one rank may plan for, and what it is: a GPU's memory (one per
// rank) on device builds, else the host's shared by the node's ranks; or
// --memory-budget in their place. Collective (counts the node's ranks).
struct MemoryBudget {
  std::int64_t per_rank = -1;  // -1: unknown (no check)
  std::string what;
};

MemoryBudget memory_budget(const Comm& comm, const RunOptions& opt) {
  const int on_node = comm.ranks_on_node();
  const std::int64_t device = device_memory_total();
  MemoryBudget b;
  const std::int64_t given = opt.memory_budget.empty() ? -1 : parse_size(opt.memory_budget);
  const std::int64_t whole = given >= 0 ? given : device >= 0 ? device : host_memory_total();
  if (whole < 0) return b;
  const std::string source = given >= 0 ? "--memory-budget " + opt.memory_budget + " (" + gib(std::size_t(whole)) + ")"
                             : device >= 0 ? "the GPU's " + gib(std::size_t(whole))
                                           : "the host's " + gib(std::size_t(whole));
  if (device >= 0) {
    b.per_rank = whole;
    b.what = source + " per rank";
  } else {
    b.per_rank = whole / on_node;
    b.what = source + " shared by " + std::to_string(on_node) + " rank(s) on this node";
  }
  return b;
}

// The largest plan of any case, per rank.
std::size_t planned_per_rank(const Campaign& c, const AnalysisSettings& s, int rpc, std::string* which = nullptr) {
  std::size_t most = 0;
  for (const auto& cs : c.cases) {
    const std::size_t t = plan_memory(c.cfg, s, plan_case(s, cs.blocks, true, true), rpc).total();
    if (t > most) {
      most = t;
      if (which) *which = cs.name;
    }
  }
  return most;
}

// Refuses a plan over 90% of the budget, naming what to lower.
void check_memory(const Campaign& c, const MemoryBudget& b) {
  if (b.per_rank < 0) return;
  const AnalysisSettings& s = c.deck.analysis;
  const int rpc = int(c.deck.ranks_per_checkpoint);
  std::string which;
  const std::size_t need = planned_per_rank(c, s, rpc, &which);
  const double limit = 0.9 * double(b.per_rank);
  if (double(need) <= limit) return;
  std::string spectrum;
  if (s.curvature.lanczos_steps > 0)
    spectrum = ", curvature.lanczos_chains (now " + std::to_string(s.curvature.lanczos_chains) +
               ") or curvature.lanczos_steps (now " + std::to_string(s.curvature.lanczos_steps) +
               "), raise parallel.ranks_per_checkpoint (now " + std::to_string(rpc) +
               ": the Lanczos basis is sharded over the team)";
  fail(c.deck.file, ": the plan needs ", gib(need), " per rank (case ", which, ") but 90% of ", b.what, " is ",
       gib(std::size_t(limit)), ": lower analysis.hvp_batch (now ", s.hvp_batch, "), analysis.directions_per_pass (now ",
       s.directions_per_pass, ") or analysis.grad_microbatch (now ", s.grad_microbatch, ")", spectrum,
       ", run fewer ranks per node, or pass --fit-memory to choose directions_per_pass and hvp_batch");
}

// --fit-memory: the largest directions_per_pass (up to a case's directions),
// then the largest hvp_batch (up to a case's blocks), whose plan fits in 90%
// of the budget: {directions_per_pass, hvp_batch}.
std::vector<long long> fit_memory(const Campaign& c, const MemoryBudget& b) {
  if (b.per_rank < 0) fail("--fit-memory: the machine's memory is unknown here; give --memory-budget");
  AnalysisSettings s = c.deck.analysis;
  const int rpc = int(c.deck.ranks_per_checkpoint);
  const double limit = 0.9 * double(b.per_rank);
  index_t most_dirs = 1, most_blocks = 1;
  for (const auto& cs : c.cases) {
    most_dirs = std::max(most_dirs, plan_case(s, cs.blocks, true, true).directions());
    most_blocks = std::max(most_blocks, cs.blocks);
  }
  auto fits = [&](index_t K, index_t B) {
    s.directions_per_pass = K;
    s.hvp_batch = B;
    return double(planned_per_rank(c, s, rpc)) <= limit;
  };
  index_t K = std::min<index_t>(most_dirs, 4096);
  while (K > 1 && !fits(K, 1)) --K;
  if (!fits(K, 1))
    fail(c.deck.file, ": --fit-memory: even one direction per pass and one block per HVP batch need more than 90% of ",
         b.what, ": lower analysis.grad_microbatch (now ", c.deck.analysis.grad_microbatch,
         ") or run fewer ranks per node");
  index_t lo = 1, hi = most_blocks;  // the largest B in [lo, hi] that fits
  while (lo < hi) {
    const index_t mid = lo + (hi - lo + 1) / 2;
    if (fits(K, mid)) lo = mid;
    else hi = mid - 1;
  }
  return {static_cast<long long>(K), static_cast<long long>(lo)};
}

}  // namespace

int run_command(const Comm& comm, const RunOptions& opt) {
  const bool root = comm.rank() == 0;
  Campaign c = prepare_campaign(comm, opt.deck, opt.overrides, opt.quiet, opt.dry_run);
  MemoryBudget budget;
  comm.collective([&] { budget = memory_budget(comm, opt); });
  if (opt.fit_memory) {
    // Rank 0's budget decides for every rank (one campaign, one set of settings).
    std::vector<long long> kb = {0, 0};  // rank 0's choice, summed with zeros: on every rank
    comm.collective([&] {
      if (root) kb = fit_memory(c, budget);
    });
    comm.sum(kb);
    std::vector<std::string> overrides = opt.overrides;
    overrides.push_back("analysis.directions_per_pass=" + std::to_string(kb[0]));
    overrides.push_back("analysis.hvp_batch=" + std::to_string(kb[1]));
    if (root)
      std::printf("gnh: --fit-memory: analysis.directions_per_pass = %lld, analysis.hvp_batch = %lld (90%% of %s)\n",
                  kb[0], kb[1], budget.what.c_str());
    c = prepare_campaign(comm, opt.deck, overrides, true, opt.dry_run);
  }
  comm.collective([&] { check_memory(c, budget); });
  if (opt.self_check && !opt.dry_run)
    self_check(comm, c.deck.analysis.precision, c.deck.analysis.curvature_method, opt.quiet);
  if (opt.shard_count > 1) {
    // A shard of a planned campaign (gnh plan): its share of the groups, dealt
    // as the planner deals them, into a file of its own.
    std::vector<GroupRecord> share;
    for (const index_t g : dealt_share(index_t(c.groups.size()), opt.shard_count, opt.shard_index))
      share.push_back(c.groups[std::size_t(g)]);
    c.groups = share;
    c.output = shard_output(c.output, opt.shard_index, opt.shard_count);
    c.info.shard = std::to_string(opt.shard_index) + "/" + std::to_string(opt.shard_count);
  }
  const Deck& deck = c.deck;
  const std::vector<LoadedCase>& cases = c.cases;
  const std::vector<GroupRecord>& groups = c.groups;
  const RunInfo& ri = c.info;
  const std::string& output = c.output;
  const int rpc = int(deck.ranks_per_checkpoint), teams = comm.size() / rpc, my_team = comm.rank() / rpc;
  std::vector<int> team_of_group(groups.size());
  for (std::size_t g = 0; g < groups.size(); ++g) team_of_group[g] = dealt_to(index_t(g), teams);
  // Nothing is computed unless its results can be written, and by this run
  // alone. The dry run only looks; a run creates the directories, writes a
  // probe and holds the output's lock until it returns.
  OutputLock lock;
  std::string other_run;
  comm.collective([&] {
    if (!root) return;
    check_output_writable(output, groups_directory(output), deck.file + ": run.output", !opt.dry_run);
    if (opt.dry_run)
      other_run = OutputLock::holder(output);
    else
      lock = OutputLock(output, "gnh run " + opt.deck + (opt.shard_count > 1 ? " --shard " + ri.shard : ""));
    // Under the lock no other run writes these: what is there is a killed run's.
    if (!opt.dry_run)
      if (const int n = remove_stale_temporaries(output) + remove_stale_temporaries(csv_path(output)) +
                        remove_stale_temporaries(groups_directory(output) + "/"))
        std::printf("gnh: removed %d temporary file(s) left by an earlier run that did not finish\n", n);
  });
  if (!opt.dry_run) choose_host_gemm(comm, c, opt.quiet, !deck.analysis.fp64());
  if (root && (opt.dry_run || !opt.quiet)) {
    print_plan(c, team_of_group, teams, rpc, output);
    if (budget.per_rank >= 0)
      std::printf("  memory: the plan needs %s per rank, within 90%% of %s (%s)\n",
                  gib(planned_per_rank(c, c.deck.analysis, rpc)).c_str(), budget.what.c_str(),
                  gib(std::size_t(0.9 * double(budget.per_rank))).c_str());
  }
  const AnalysisSettings& as = c.deck.analysis;
  if (root && (as.curvature.blocks || as.curvature.diagonal) && !as.keeps_hv())
    std::printf("gnh: note: [curvature] with curvature_method = \"%s\": the epoch's H v is not formed, so only the "
                "per-block G_sqnorm, trace_sigma and B_simple are computed; trace_H, GHG_contrib, xiHxi_contrib, "
                "frob_H, effective_rank and the diagonal need curvature_method = \"forward-over-reverse\"\n",
                to_string(as.curvature_method));
  if (!other_run.empty())
    std::printf("gnh: note: another gnh run is writing %s now (%s); this run would stop at once\n", output.c_str(),
                other_run.c_str());
  if (opt.dry_run) {
    if (root) std::printf("gnh: dry run: deck, %zu checkpoint(s) and %zu data file(s) are valid; nothing computed\n",
                          c.files.size(), cases.size());
    return 0;
  }

  std::signal(SIGTERM, on_sigterm);
  const Outcome mine = compute_groups(comm, comm.split(my_team), c, team_of_group, my_team, output, opt.quiet);

  // Every group file is on disk (or failed); rank 0 merges.
  // Counts from team leaders only (every member of a team counts the same groups).
  const bool leader = comm.rank() % rpc == 0;
  std::vector<long long> counts = {leader ? mine.failed : 0, leader ? mine.interrupted : 0, g_terminate ? 1 : 0,
                                   leader ? mine.done : 0, leader ? mine.skipped : 0};
  comm.sum(counts);
  if (root) {
    std::printf("gnh: groups: computed %lld, reused %lld (complete from an earlier run with these settings), failed %lld, "
                "interrupted %lld\n", counts[3], counts[4], counts[0], counts[1]);
    std::fflush(stdout);
  }
  std::string write_error;
  int status = 0;
  if (root) {
    std::vector<std::string> complete;
    std::vector<std::string> missing;
    std::vector<std::string> expected;  // this run's (or shard's) checkpoint file names
    for (const auto& g : groups) {
      expected.insert(expected.end(), g.aliases.begin(), g.aliases.end());
      const std::string path = group_file(output, g.hash);
      if (group_file_complete(path, ri.settings_fingerprint)) complete.push_back(path);
      else missing.push_back(g.hash + " (" + g.aliases.front() + ")");
    }
    try {
      if (counts[1] > 0 || counts[2] > 0) {
        std::fprintf(stderr, "gnh: interrupted by SIGTERM: %zu of %zu group(s) complete in %s; run the same command "
                             "again to resume\n", complete.size(), groups.size(), groups_directory(output).c_str());
        status = 143;
      } else {
        merge_results(output, ri, complete, expected);
        std::vector<GroupSummary> summaries;
        for (const auto& p : complete) summaries.push_back(read_group_summary(p));
        print_summary(summaries, output);
        if (!missing.empty()) {
          std::string list;
          for (const auto& m : missing) list += (list.empty() ? "" : ", ") + m;
          std::fprintf(stderr, "gnh: error: %zu group(s) failed and are not in %s: %s\n", missing.size(),
                       output.c_str(), list.c_str());
          status = 1;
        }
      }
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

}  // namespace gnh
