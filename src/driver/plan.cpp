// SPDX-License-Identifier: BSD-3-Clause
#include "driver/plan.hpp"

#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <type_traits>

#include "analysis/blocks.hpp"
#include "analysis/memory.hpp"
#include "core/deal.hpp"
#include "core/build_info.hpp"
#include "driver/campaign.hpp"
#include "driver/install.hpp"
#include "driver/shell.hpp"
#include "io/files.hpp"
#include "io/results.hpp"

namespace gnh {
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

// What a timing profile is measured for: the model, the context, the
// precision, the rank layout and the [analysis] keys marked `recipe`.
json recipe_of(const Campaign& c) {
  const Deck& d = c.deck;
  json r = {{"model", c.cfg.describe()},
            {"context", d.analysis.context},
            {"precision", to_string(d.analysis.precision)},
            {"ranks_per_checkpoint", d.ranks_per_checkpoint}};
  for_each_analysis_key(d.analysis, [&](const AnalysisKey& k, const auto& v) {
    if (!k.recipe) return;
    if constexpr (std::is_enum_v<std::decay_t<decltype(v)>>) r[k.name] = to_string(v);
    else r[k.name] = v;
  });
  return r;
}

std::vector<fs::path> profile_dirs() {
  std::vector<fs::path> dirs;
  if (const char* env = std::getenv("GNH_PROFILE_DIR")) dirs.emplace_back(env);
  dirs.emplace_back(share_directory() / "jobscripts" / "profiles");
  return dirs;
}

json load_json(const fs::path& p) {
  std::ifstream in(p);
  if (!in) fail(p.string(), ": cannot open profile");
  try {
    return json::parse(in);
  } catch (const std::exception& e) {
    fail(p.string(), ": not a valid profile (", e.what(), ")");
  }
}

// The target a profile was measured on; profiles from before targets were
// recorded were all measured on CPUs.
std::string target_of(const json& profile) { return profile.value("target", std::string("cpu")); }

// The profile to use: the one named, or the one measured on the plan's
// target for this recipe. A profile of another target is refused: a CPU's
// timings say nothing about a GH200 shard's.
std::pair<std::string, json> find_profile(const PlanOptions& opt, const json& recipe) {
  if (!opt.profile.empty()) {
    fs::path p(opt.profile);
    if (!fs::exists(p))
      for (const auto& d : profile_dirs())
        if (fs::exists(d / (opt.profile + ".json"))) p = d / (opt.profile + ".json");
    if (!fs::exists(p)) fail("--profile ", opt.profile, ": no such profile (looked in jobscripts/profiles)");
    json j = load_json(p);
    if (j.at("recipe") != recipe)
      fail(p.string(), ": measured for a different recipe (", j.at("recipe").dump(), "), not this deck's (",
           recipe.dump(), "); measure one with perf/make_profile.py or pass --time");
    if (target_of(j) != opt.target)
      fail(p.string(), ": measured on target ", target_of(j), ", not --target ", opt.target,
           "; measure one there with perf/make_profile.py or pass --time");
    return {p.string(), j};
  }
  std::string elsewhere;
  for (const auto& d : profile_dirs()) {
    if (!fs::is_directory(d)) continue;
    for (const auto& e : fs::directory_iterator(d))
      if (e.path().extension() == ".json") {
        json j = load_json(e.path());
        if (!j.contains("recipe") || j.at("recipe") != recipe) continue;
        if (target_of(j) == opt.target) return {e.path().string(), j};
        elsewhere += (elsewhere.empty() ? "" : ", ") + e.path().string() + " (" + target_of(j) + ")";
      }
  }
  if (!elsewhere.empty() && opt.time.empty())
    fail("no timing profile of this recipe for --target ", opt.target, "; only for other targets: ", elsewhere,
         "; measure one on a ", opt.target, " node with perf/make_profile.py or give --time HH:MM:SS");
  return {"", json()};
}

std::string hhmmss(double seconds) {
  const long s = long(std::ceil(seconds));
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%02ld:%02ld:%02ld", s / 3600, (s / 60) % 60, s % 60);
  return buf;
}

double parse_time(const std::string& t) {
  int h = 0, m = 0, s = 0;
  if (std::sscanf(t.c_str(), "%d:%d:%d", &h, &m, &s) != 3 || h < 0 || m < 0 || m > 59 || s < 0 || s > 59)
    fail("--time ", t, ": expected HH:MM:SS");
  return h * 3600.0 + m * 60.0 + s;
}

// A measured timing profile's unit times (seconds); all 0 without one.
struct ProfileTimes {
  double gradient_microbatch = 0, hvp_batch_per_direction = 0, group_startup = 0, shard_startup = 0;
};

ProfileTimes profile_times(const json& profile) {
  return {profile.at("seconds_per_gradient_microbatch"), profile.at("seconds_per_hvp_batch_per_direction"),
          profile.at("seconds_per_group_startup"), profile.at("seconds_per_shard_startup")};
}

// The estimated seconds of one group: its start-up and every case's work in profile units.
double seconds_per_group(const Campaign& c, const ProfileTimes& t) {
  const AnalysisSettings& a = c.deck.analysis;
  double per_group = t.group_startup;
  for (const auto& cs : c.cases) {
    const CasePlan p = plan_case(a, cs.blocks, true, true);
    const index_t n = cs.blocks, m = p.n_noise;
    const index_t grad_batches = (n + a.grad_microbatch - 1) / a.grad_microbatch;
    const index_t noise_batches = m * ((a.noise_batch + a.grad_microbatch - 1) / a.grad_microbatch);
    // Passes are balanced and carry no padding: D directions cost D per-direction
    // units (measured at the full K; a narrower pass shares its primal among
    // fewer directions, which the wall-time margin covers).
    // The spectrum: one direction per chain and Lanczos step (an upper bound:
    // chains that converge early drop out), for each operator's spectrum.
    const index_t spectra = a.curvature.op == OperatorChoice::both ? 2 : 1;
    // With "both" and per-block values, GGN v_k of each Rademacher direction too.
    const bool ggn_blocks = a.curvature.op == OperatorChoice::both && a.curvature.blocks && a.keeps_hv();
    // With per-layer spectra, one chain per layer block besides.
    const index_t chains = a.curvature.lanczos_chains * spectra + (a.curvature.layer_spectra ? layer_blocks(c.cfg) : 0);
    const index_t D =
        p.directions() + (ggn_blocks ? a.directions : 0) + (p.spectrum ? a.curvature.lanczos_steps * chains : 0);
    const index_t hvp_batches = (n + a.hvp_batch - 1) / a.hvp_batch;
    per_group += double(grad_batches + noise_batches) * t.gradient_microbatch +
                 double(D * hvp_batches) * t.hvp_batch_per_direction / double(c.deck.ranks_per_checkpoint);
  }
  return per_group;
}

// What every script of the plan needs.
struct PlanContext {
  const Campaign& c;
  const PlanOptions& opt;
  std::string out_dir, gnh_bin, deck_abs, sets;  // sets: the --set overrides, quoted for the shell
  bool measured = false;                         // a profile was found
  ProfileTimes times;
};

// Shard s's Slurm script: its share of the groups through `gnh run --shard`.
void write_shard_script(const PlanContext& p, int s, double request, const std::string& script) {
  const Deck& d = p.c.deck;
  const PlanOptions& opt = p.opt;
  std::ostringstream f;
  f << "#!/bin/bash\n# Generated by gnh plan: shard " << s << " of " << opt.jobs << " of " << d.name << ".\n"
    << "#SBATCH --job-name=gnh-" << d.name << "-" << s << "\n"
    << "#SBATCH --time=" << hhmmss(request) << "\n"
    << "#SBATCH --ntasks=" << d.ranks_per_checkpoint << "\n"
    << "#SBATCH --signal=B:TERM@" << opt.term_seconds << "\n"
    << "#SBATCH --requeue\n#SBATCH --open-mode=append\n"
    << "#SBATCH --output=" << fs::absolute(p.out_dir).string() << "/shard-" << s << "-%j.out\n";
  if (opt.target == "gh200") f << "#SBATCH --gpus-per-task=1\n#SBATCH --cpus-per-task=72\n";
  if (!opt.partition.empty()) f << "#SBATCH --partition=" << opt.partition << "\n";
  if (!opt.account.empty()) f << "#SBATCH --account=" << opt.account << "\n";
  f << "source " << shell_quote((share_directory() / "jobscripts" / "gnh-shard-body.sh").string()) << "\n"
    << "gnh_shard_run " << shell_quote(opt.target) << " " << shell_quote(p.gnh_bin) << " run "
    << shell_quote(p.deck_abs) << " --shard " << s << "/" << opt.jobs << " --self-check" << p.sets << "\n";
  write_file_atomically(script, f.str());
}

// Shard s of the receipt: its groups and checkpoints, wall time and node-hours,
// output and script (written here).
json plan_shard(const PlanContext& p, int s, double per_group) {
  const Campaign& c = p.c;
  const PlanOptions& opt = p.opt;
  json shard = {{"index", s}, {"groups", json::array()}, {"checkpoints", json::array()}};
  int n_groups = 0;
  for (const index_t g : dealt_share(index_t(c.groups.size()), opt.jobs, s)) {
    shard["groups"].push_back(c.groups[std::size_t(g)].hash);
    for (const auto& alias : c.groups[std::size_t(g)].aliases) shard["checkpoints"].push_back(alias);
    ++n_groups;
  }
  double request = 0;
  if (p.measured) {
    const double est = p.times.shard_startup + n_groups * per_group;
    shard["estimate_seconds"] = est;
    request = std::ceil((2 * est + 1800) / 3600.0) * 3600.0;
  }
  if (!opt.time.empty()) request = parse_time(opt.time);
  shard["time_request"] = hhmmss(request);
  // Nodes a shard holds: one CPU node, or one GH200 node per 4 ranks (one GPU each).
  const int rpc = int(c.deck.ranks_per_checkpoint);
  const int nodes = opt.target == "gh200" ? (rpc + 3) / 4 : 1;
  shard["nodes"] = nodes;
  shard["node_hours_requested"] = request * nodes / 3600.0;
  if (shard.contains("estimate_seconds"))
    shard["node_hours_estimated"] = shard["estimate_seconds"].get<double>() * nodes / 3600.0;
  shard["output"] = shard_output(c.output, s, opt.jobs);
  const std::string script = p.out_dir + "/shard-" + std::to_string(s) + ".sbatch";
  write_shard_script(p, s, request, script);
  shard["script"] = script;
  return shard;
}

// The merge job's script: merge the shards, then draw the report.
void write_merge_script(const PlanContext& p, const json& receipt, const std::string& script) {
  const PlanOptions& opt = p.opt;
  const std::string& name = p.c.deck.name;
  std::ostringstream f;
  f << "#!/bin/bash\n# Generated by gnh plan: merge the shards of " << name << " and draw the report.\n"
    << "#SBATCH --job-name=gnh-" << name << "-merge\n#SBATCH --time=00:30:00\n#SBATCH --ntasks=1\n"
    << "#SBATCH --output=" << fs::absolute(p.out_dir).string() << "/merge-%j.out\n";
  if (!opt.partition.empty()) f << "#SBATCH --partition=" << opt.partition << "\n";
  if (!opt.account.empty()) f << "#SBATCH --account=" << opt.account << "\n";
  const std::string merged = receipt["merge"]["output"].get<std::string>();
  const std::string report = receipt["merge"]["report"].get<std::string>();
  f << "set -euo pipefail\n" << shell_quote(p.gnh_bin) << " merge " << shell_quote(merged);
  for (const auto& shard : receipt["shards"]) f << " " << shell_quote(shard["output"].get<std::string>());
  f << "\n" << shell_quote(p.gnh_bin) << " report " << shell_quote(merged) << " --out " << shell_quote(report) << "\n";
  write_file_atomically(script, f.str());
}

// The receipt of the plan: the campaign's identity, then every shard; its
// node-hours summed; the merge job's script written.
json plan_receipt(const PlanContext& p, const json& recipe, const std::string& profile_path) {
  const Campaign& c = p.c;
  json receipt = {{"deck", p.deck_abs},
                  {"run_name", c.deck.name},
                  {"settings_fingerprint", c.info.settings_fingerprint},
                  {"gnh_version", version()},
                  {"git_commit", git_commit()},
                  {"recipe", recipe},
                  {"profile", profile_path.empty() ? json(nullptr) : json(profile_path)},
                  {"wall_time_rule", "twice the estimate plus 30 minutes, rounded up to the hour"},
                  {"target", p.opt.target},
                  {"shards", json::array()}};
  const double per_group = seconds_per_group(c, p.times);
  for (int s = 0; s < p.opt.jobs; ++s) receipt["shards"].push_back(plan_shard(p, s, per_group));
  double requested = 0, estimated = 0;
  for (const auto& shard : receipt["shards"]) {
    requested += shard["node_hours_requested"].get<double>();
    estimated += shard.value("node_hours_estimated", 0.0);
  }
  receipt["node_hours_requested"] = requested;
  if (p.measured) receipt["node_hours_estimated"] = estimated;
  receipt["merge"] = {
      {"script", p.out_dir + "/merge.sbatch"}, {"output", c.output}, {"report", with_suffix(c.output, ".report")}};
  write_merge_script(p, receipt, receipt["merge"]["script"].get<std::string>());
  return receipt;
}

// --submit: every shard, then the merge job after all of them (afterok); the
// job ids go into the receipt.
void submit_plan(json& receipt) {
  std::string deps;
  for (auto& shard : receipt["shards"]) {
    int st = 0;
    const std::string script = shard["script"].get<std::string>();
    const std::string id = run_capture("sbatch --parsable " + shell_quote(script) + " 2>&1", st);
    if (st != 0) fail("sbatch ", script, " failed: ", id);
    shard["job_id"] = id.substr(0, id.find(';'));
    deps += ":" + shard["job_id"].get<std::string>();
  }
  const std::string merge_script = receipt["merge"]["script"].get<std::string>();
  int st = 0;
  const std::string id =
      run_capture("sbatch --parsable --dependency=afterok" + deps + " " + shell_quote(merge_script) + " 2>&1", st);
  if (st != 0) fail("sbatch ", merge_script, " failed: ", id);
  receipt["merge"]["job_id"] = id.substr(0, id.find(';'));
}

void print_receipt(const PlanContext& p, const json& receipt, const std::string& profile_path) {
  std::printf("gnh plan: %zu group(s) of %s in %d shard(s)%s\n", p.c.groups.size(), p.c.deck.name.c_str(), p.opt.jobs,
              profile_path.empty() ? " (no profile: wall time from --time)" : "");
  if (!profile_path.empty()) std::printf("  profile %s\n", profile_path.c_str());
  for (const auto& shard : receipt["shards"]) {
    std::printf("  shard %d: %zu group(s), %zu checkpoint file(s)", shard["index"].get<int>(), shard["groups"].size(),
                shard["checkpoints"].size());
    if (shard.contains("estimate_seconds")) std::printf(", estimate %.1f s", shard["estimate_seconds"].get<double>());
    std::printf(", request %s on %d node(s) = %.2f node-hours%s%s\n", shard["time_request"].get<std::string>().c_str(),
                shard["nodes"].get<int>(), shard["node_hours_requested"].get<double>(),
                shard.contains("job_id") ? ", job " : "",
                shard.contains("job_id") ? shard["job_id"].get<std::string>().c_str() : "");
  }
  std::printf("  campaign: %.2f node-hours requested", receipt["node_hours_requested"].get<double>());
  if (!profile_path.empty()) std::printf(" (%.3f estimated)", receipt["node_hours_estimated"].get<double>());
  std::printf(" on %s\n", p.opt.target.c_str());
  if (receipt["merge"].contains("job_id"))
    std::printf("  merge: job %s after all shards (afterok)\n", receipt["merge"]["job_id"].get<std::string>().c_str());
  std::printf("  scripts and receipt in %s\n", p.out_dir.c_str());
  std::fflush(stdout);
}

}  // namespace

// The campaign's host GEMM for this node's CPU class, chosen once for every
// shard (driver/gemm_record.hpp): shards on nodes of this class multiply with
// it; a node of another class probes once for its class.
void record_host_gemm(const Campaign& c) {
  if constexpr (std::is_same_v<ExecSpace, Kokkos::DefaultHostExecutionSpace>) {
    if (c.deck.analysis.fp64()) return;  // no float GEMMs
    const GemmChoice g = campaign_gemm_choice(c, c.output, "gnh plan");
    std::printf("gnh: host sgemm for the campaign: %s (%s)\n", g.kernel.c_str(), g.how.c_str());
  } else {
    (void)c;
  }
}

int plan_command(const Comm& comm, const PlanOptions& opt) {
  Campaign c = prepare_campaign(comm, opt.deck, opt.overrides, true);
  if (comm.rank() != 0) return 0;  // planning is serial; every rank validated above
  if (opt.jobs < 1) fail("--jobs must be at least 1");
  if (opt.target != "cpu" && opt.target != "gh200") fail("--target ", opt.target, ": expected cpu or gh200");
  const json recipe = recipe_of(c);
  if (opt.print_recipe) {
    std::printf("%s\n", recipe.dump().c_str());
    return 0;
  }
  auto [profile_path, profile] = find_profile(opt, recipe);
  if (profile_path.empty() && opt.time.empty())
    fail("no measured timing profile for this recipe ", recipe.dump(),
         "; measure one on the target machine (perf/make_profile.py, see doc/operations.md) or give --time HH:MM:SS");
  record_host_gemm(c);
  PlanContext p{c, opt};
  p.out_dir = opt.out_dir.empty() ? with_suffix(c.output, ".plan") : opt.out_dir;
  fs::create_directories(p.out_dir);
  p.gnh_bin = fs::canonical("/proc/self/exe").string();
  p.deck_abs = fs::absolute(opt.deck).string();
  for (const auto& o : opt.overrides) p.sets += " --set " + shell_quote(o);
  p.measured = !profile_path.empty();
  if (p.measured) p.times = profile_times(profile);
  json receipt = plan_receipt(p, recipe, profile_path);
  if (opt.submit) submit_plan(receipt);
  write_file_atomically(p.out_dir + "/receipt.json", receipt.dump(2) + "\n");
  print_receipt(p, receipt, profile_path);
  return 0;
}

Subcommand add_plan_command(CLI::App& gnh) {
  auto opt = std::make_shared<PlanOptions>();
  CLI::App* cmd = gnh.add_subcommand(
      "plan",
      "Deal DECK's groups to N shards, estimate each shard's wall time from a measured timing profile, "
      "write Slurm scripts and a receipt; --submit submits the shards and a merge job (afterok)");
  cmd->add_option("deck", opt->deck, "Input deck (TOML)")->required();
  cmd->add_option("--jobs", opt->jobs, "Number of shards")->required();
  cmd->add_option("--profile", opt->profile,
                  "Timing profile (name in jobscripts/profiles or a path); default: the one measured for this "
                  "deck's recipe");
  cmd->add_option("--time", opt->time, "Wall time per shard (HH:MM:SS); required when no profile matches");
  cmd->add_option("--out", opt->out_dir, "Directory for scripts and receipt (default OUTPUT.plan)");
  cmd->add_option("--target", opt->target, "cpu or gh200")->capture_default_str();
  cmd->add_option("--partition", opt->partition, "Slurm partition");
  cmd->add_option("--account", opt->account, "Slurm account");
  cmd->add_option("--term-seconds", opt->term_seconds, "SIGTERM this many seconds before the time limit")
      ->capture_default_str();
  cmd->add_option("--set", opt->overrides, "Override a deck key (repeatable)")
      ->type_name("KEY=VALUE")
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  cmd->add_flag("--submit", opt->submit, "Submit the shards and the merge job with sbatch");
  cmd->add_flag("--print-recipe", opt->print_recipe,
                "Print the deck's recipe (the key of timing profiles) as JSON and stop");
  return {cmd, [opt](const Comm& comm) { return plan_command(comm, *opt); }};
}

}  // namespace gnh
