// SPDX-License-Identifier: BSD-3-Clause
#include "driver/run_groups.hpp"

#include <fnmatch.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <limits>
#include <map>
#include <memory>

#include "analysis/analyser.hpp"
#include "core/deal.hpp"
#include "io/checkpoint.hpp"
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
                  static_cast<long long>(total),
                  double(tokens_) * double(done) / double(total) / std::max(elapsed, 1e-9), elapsed, eta);
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

// The files of a case's spectrum between Lanczos steps (io/lanczos_store.hpp);
// kind "lanczos" for H's, "lanczos_ggn" for the Gauss-Newton part's,
// "lanczos_blocks" for the per-block spectra's.
std::string lanczos_prefix(const std::string& output, const std::string& hash, const std::string& cas,
                           const std::string& kind = "lanczos") {
  return groups_directory(output) + "/" + hash + "." + cas + "." + kind;
}

// The parameters of group g, read once: the team leader reads the first file
// (its hash computed from the values read and checked against the plan), and
// the team's members read the other files of the group that planning grouped
// by their stored param_sha256 alone, to prove them the same state. With
// parameter shards each member of a shard group reads its slice of the first
// file by hyperslab and the group gathers them; the leader checks that
// file's hash reading it in blocks (never the vector whole in one piece).
// Throws gnh::Error on every member when any member found a problem.
std::vector<float> group_parameters(MpiTeam& team, const GroupRecord& g, const std::vector<bool>& alias_hashed,
                                    int world_rank, bool quiet) {
  std::vector<float> params;
  std::string error;
  ShardGroup& shards = team.shards();
  const ShardLayout layout(g.n_params, shards.size());
  auto read_slice = [&] {
    const auto t0 = std::chrono::steady_clock::now();
    const std::string& path = g.alias_paths[0];
    if (team.rank() == 0 && verify_param_hash(path) != g.param_sha256)
      fail(path, ": parameters hash to another state than the ", g.hash,
           " it was grouped by (changed while the run was starting?)");
    const int r = shards.rank();
    params.assign(std::size_t(g.n_params), 0.0f);
    const std::vector<float> mine = read_param_slice(path, layout.begin(r), layout.end(r));
    std::copy(mine.begin(), mine.end(), params.begin() + layout.begin(r));
    if (!quiet) {
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      std::printf("gnh: [rank %d] read %s: parameters [%lld, %lld) in %.2f s\n", world_rank, g.aliases[0].c_str(),
                  static_cast<long long>(layout.begin(r)), static_cast<long long>(layout.end(r)), s);
      std::fflush(stdout);
    }
  };
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
    if (shards.size() > 1) read_slice();
    else if (team.rank() == 0) params = read(0);
    for (std::size_t a = 1; a < g.alias_paths.size(); ++a)
      if (!alias_hashed[a] && dealt_to(index_t(a - 1), team.size()) == team.rank()) read(a);
  } catch (const Error& e) {
    error = e.what();
  }
  if (team.any(!error.empty())) throw Error(error);  // empty on the members that found nothing
  params.resize(static_cast<std::size_t>(g.n_params));
  if (shards.size() > 1) shards.gather(layout, params.data());
  else team.broadcast(params.data(), sizeof(float) * params.size(), 0);
  return params;
}

// SPEC §10's AdamW preconditioner of group g, from the first alias that
// carries AdamW state (aliases share parameters, not necessarily optimizer
// state: which one was used is recorded). Without parameter shards the team
// leader reads it whole and the team shares it; with them every member reads
// its slice by hyperslab (doc/sharding.md) and holds no more. Empty when no
// alias has state; `note` says which or why not.
std::vector<double> group_preconditioner(MpiTeam& team, const GroupRecord& g, const ModelConfig& cfg,
                                         std::string& note) {
  std::vector<double> P;
  std::string error;
  std::int64_t source = -1;
  const int R = team.shards().size();
  if (team.rank() == 0) {
    try {
      // With shards the leader only finds the alias (its hyperparameters); the members read the tensors.
      for (std::size_t a = 0; a < g.alias_paths.size() && source < 0; ++a) {
        const std::string& path = g.alias_paths[a];
        if (R > 1) {
          if (read_adam_hyperparameters(path)) source = std::int64_t(a);
        } else if (const auto st = read_adam_state(path)) {
          P = adam_preconditioner(*st, cfg, path);
          source = std::int64_t(a);
        }
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
  note = "AdamW state of " + g.aliases[std::size_t(source)];
  if (R > 1) {
    const ShardLayout layout(g.n_params, R);
    const int r = team.shards().rank();
    try {
      const std::string& path = g.alias_paths[std::size_t(source)];
      P = adam_preconditioner(*read_adam_state_slice(path, layout.begin(r), layout.end(r)), cfg, path, layout.begin(r));
    } catch (const Error& e) {
      error = e.what();
    }
    if (team.any(!error.empty())) throw Error(error);
    return P;
  }
  P.resize(static_cast<std::size_t>(g.n_params));
  team.broadcast(P.data(), sizeof(double) * P.size(), 0);
  return P;
}

// The edge of stability's inputs of group g (SPEC §13): the learning rate
// from the first [checkpoints] learning_rates pattern, in the deck's order,
// that matches one of its file names, else from the first alias whose AdamW
// state records one; beta1 from the first alias with AdamW state. Read by
// the team leader (hyperparameters only) and shared; NaN where unknown.
struct Stability {
  double learning_rate = std::numeric_limits<double>::quiet_NaN();
  double beta1 = std::numeric_limits<double>::quiet_NaN();
};
Stability group_stability(MpiTeam& team, const GroupRecord& g, const Deck& d) {
  Stability st;
  std::string error;
  if (team.rank() == 0) {
    for (const auto& [glob, lr] : d.checkpoint_learning_rates)
      for (const auto& a : g.aliases)
        if (!(st.learning_rate == st.learning_rate) && ::fnmatch(glob.c_str(), a.c_str(), 0) == 0)
          st.learning_rate = lr;
    try {
      for (const auto& path : g.alias_paths) {
        if (st.beta1 == st.beta1 && st.learning_rate == st.learning_rate) break;  // both known
        if (const auto h = read_adam_hyperparameters(path)) {
          if (!(st.beta1 == st.beta1)) st.beta1 = h->beta1;
          if (!(st.learning_rate == st.learning_rate)) st.learning_rate = h->lr;
        }
      }
    } catch (const Error& e) {
      error = e.what();
    }
  }
  if (team.any(!error.empty())) throw Error(error);
  team.broadcast_value(st, 0);
  return st;
}

// SPEC §13's ratios from a case's spectrum: eta lambda_max / 2 on H's, and
// eta lambda_max (1 - beta1) / (2 + 2 beta1) on P^1/2 H P^1/2's.
void stability_ratios(const Stability& st, CaseStatistics& s) {
  s.learning_rate = st.learning_rate;
  if (!s.spectrum.present || s.spectrum.top_eigenvalues.empty()) return;
  const double top = s.spectrum.top_eigenvalues.front();
  if (s.spectrum.op == "H") s.sharpness_ratio = st.learning_rate * top / 2;
  if (s.spectrum.op == "PHP") s.sharpness_ratio_adam = st.learning_rate * top * (1 - st.beta1) / (2 + 2 * st.beta1);
}

// One team's groups, one after the other, on one Analyser (its engines are
// planned once). Every member calls every step: the collectives match.
class GroupRunner {
 public:
  GroupRunner(const Comm& world, const Comm& team_comm, const Campaign& c, const std::string& output, bool quiet)
      : team_(team_comm, int(c.deck.analysis.parameter_shards)),
        leader_(team_.rank() == 0),
        rank_(world.rank()),
        c_(c),
        output_(output),
        quiet_(quiet),
        log_(world.rank(), quiet) {
    for (const auto& f : c.files) hashed_[f.path] = f.hashed;
  }

  void run_group(GroupRecord g, Outcome& out) {
    const std::string path = group_file(output_, g.hash);
    // The state's samples of every case (read here where they are a window
    // of their source: a bad token fails this group alone).
    std::vector<CaseTokens> tokens;
    std::string error;
    try {
      for (const auto& cs : c_.cases) tokens.push_back(case_tokens(c_, cs, g));
    } catch (const Error& e) {
      error = e.what();
    }
    if (team_.any(!error.empty())) {
      // Every member read the same tokens: the leader's line stands for the team's.
      const bool leader_failed = team_.any(leader_ && !error.empty());
      ++out.failed;
      if (!error.empty() && (leader_ || !leader_failed))
        std::fprintf(stderr, "gnh: error: [rank %d] group %s (%s): %s\n", rank_, g.hash.c_str(),
                     g.aliases.front().c_str(), error.c_str());
      return;
    }
    if (already_complete(g, path, tokens)) {
      ++out.skipped;
      return;
    }
    if (g_terminate) {
      ++out.interrupted;
      return;
    }
    try {
      load_state(g);
      for (std::size_t k = 0; k < c_.cases.size(); ++k) g.cases.push_back(analyse_case(g, c_.cases[k], tokens[k]));
      if (leader_) {
        write_group_file(path, c_.info, g);
        remove_spectrum_states(g);
      }
      ++out.done;
    } catch (const Interrupted&) {
      ++out.interrupted;
    } catch (const Error& e) {
      error = e.what();
    }
    // A failure on one member (a bad file, a non-finite loss) fails the group
    // for the whole team; the team goes on with its next group.
    if (team_.any(!error.empty())) {
      ++out.failed;
      if (!error.empty())
        std::fprintf(stderr, "gnh: error: [rank %d] group %s (%s): %s\n", rank_, g.hash.c_str(),
                     g.aliases.front().c_str(), error.c_str());
    }
  }

 private:
  // Every member decides the same way: the leader looks, then tells.
  bool already_complete(const GroupRecord& g, const std::string& path, const std::vector<CaseTokens>& tokens) {
    int complete = leader_ && group_file_reusable(path, c_.info, g.ordered ? &g.partner_hash : nullptr) &&
                           same_case_tokens(path, c_, tokens)
                       ? 1
                       : 0;
    team_.broadcast_value(complete, 0);
    if (!complete) return false;
    // A run killed between writing the group file and removing the
    // spectrum's state leaves it behind: the result is in the group file.
    if (leader_ && c_.deck.analysis.curvature.lanczos_steps > 0) remove_spectrum_states(g);
    if (leader_ && !quiet_) {
      std::printf("gnh: [rank %d] %s complete in %s, skipped\n", rank_, g.hash.c_str(), path.c_str());
      std::fflush(stdout);
    }
    return true;
  }

  void remove_spectrum_states(const GroupRecord& g) const {
    for (const auto& cs : c_.cases)
      for (const char* kind : {"lanczos", "lanczos_ggn", "lanczos_blocks"})
        FileLanczosStore::remove(lanczos_prefix(output_, g.hash, cs.name, kind));
  }

  // The state's parameters and, where [curvature] asks, its preconditioner
  // and update target, into the analyser.
  void load_state(GroupRecord& g) {
    std::vector<bool> alias_hashed;
    for (const auto& p : g.alias_paths) alias_hashed.push_back(hashed_[p]);
    const std::vector<float> params = group_parameters(team_, g, alias_hashed, rank_, quiet_);
    if (!analyser_) analyser_ = std::make_unique<Analyser>(c_.cfg, c_.deck.analysis);
    analyser_->set_parameters(params);
    const CurvatureSettings& cv = c_.deck.analysis.curvature;
    stability_ = group_stability(team_, g, c_.deck);
    if (cv.preconditioned || (cv.lanczos_steps > 0 && cv.lanczos_php)) {
      std::vector<double> P = group_preconditioner(team_, g, c_.cfg, g.preconditioner);
      if (leader_ && !quiet_)
        std::printf("gnh: [rank %d] %s preconditioner: %s\n", rank_, g.hash.c_str(), g.preconditioner.c_str());
      if (leader_ && P.empty() && cv.lanczos_steps > 0 && cv.lanczos_php)
        std::printf(
            "gnh: note: %s has no AdamW state: no spectrum of P^1/2 H P^1/2 for it "
            "(curvature.lanczos_operator = \"PHP\")\n",
            g.hash.c_str());
      analyser_->set_preconditioner(P);
    }
    if (g.ordered) {
      // The update's target: the next state's parameters, read by the leader
      // (its hash checked against the plan) and shared.
      std::vector<float> target;
      if (g.partner >= 0) {
        // partner indexes the whole campaign's groups (a shard holds a share).
        const GroupRecord& b = (c_.all_groups.empty() ? c_.groups : c_.all_groups)[std::size_t(g.partner)];
        target = group_parameters(team_, b, std::vector<bool>(b.alias_paths.size(), true), rank_, quiet_);
      }
      analyser_->set_update_target(target);
    }
  }

  CaseRecord analyse_case(const GroupRecord& g, const LoadedCase& cs, const CaseTokens& tk) {
    CaseHooks hooks;
    hooks.stop = [] { return g_terminate != 0; };
    hooks.block_stride = cs.stride;
    if (leader_) {
      log_.begin(g.hash, cs.name, tk.blocks * c_.deck.analysis.context);
      hooks.progress = [this](const std::string& stage, index_t done, index_t total) { log_(stage, done, total); };
    }
    // The spectrum's state between steps, beside the group file.
    std::unique_ptr<FileLanczosStore> store, store_ggn, store_blocks;
    const CurvatureSettings& cv = c_.deck.analysis.curvature;
    const std::string key = c_.info.settings_fingerprint + " " + g.hash + " " + cs.name;
    if (cv.lanczos_steps > 0 && cv.op != OperatorChoice::ggn) {
      store = std::make_unique<FileLanczosStore>(lanczos_prefix(output_, g.hash, cs.name), key);
      hooks.lanczos = store.get();
    }
    if (cv.lanczos_steps > 0 && cv.gauss_newton()) {
      store_ggn = std::make_unique<FileLanczosStore>(lanczos_prefix(output_, g.hash, cs.name, "lanczos_ggn"), key);
      hooks.lanczos_ggn = store_ggn.get();
    }
    if (cv.lanczos_steps > 0 && cv.layer_spectra) {
      store_blocks =
          std::make_unique<FileLanczosStore>(lanczos_prefix(output_, g.hash, cs.name, "lanczos_blocks"), key);
      hooks.lanczos_blocks = store_blocks.get();
    }
    CaseRecord rec;
    rec.name = cs.name;
    rec.sample_first = tk.first;
    rec.sample_end = tk.end;
    rec.tokens_sha256 = tk.sha256;
    rec.stats = analyser_->analyse(team_, tk.ids, tk.blocks, hooks);
    if (leader_ && !quiet_ && rec.stats.spectrum_resumed_at >= 0) {
      std::printf("gnh: [rank %d] %s %-6s spectrum resumed after step %lld (saved in %s)\n", rank_, g.hash.c_str(),
                  cs.name.c_str(), static_cast<long long>(rec.stats.spectrum_resumed_at),
                  (store ? store : store_ggn)->state_path().c_str());
      std::fflush(stdout);
    }
    rec.stats.update.partner = g.partner_hash;
    stability_ratios(stability_, rec.stats);
    if (leader_) report_case(g, rec);
    return rec;
  }

  // The leader's lines for a finished case: identity warnings, then its statistics.
  void report_case(const GroupRecord& g, const CaseRecord& rec) const {
    for (const auto& idc : rec.stats.identities)
      if (!idc.ok())
        std::fprintf(stderr,
                     "gnh: WARNING: [rank %d] group %s case %s: identity %s violated: deviation %.3e > "
                     "tolerance %.1e\n",
                     rank_, g.hash.c_str(), rec.name.c_str(), idc.name.c_str(), idc.deviation, idc.tolerance);
    // A statistical check: noted against the campaign's first Holm threshold, never an error.
    const double threshold = kConsistencyAlpha / double(std::max<std::int64_t>(c_.info.consistency_family, 1));
    for (const auto& cc : rec.stats.consistency)
      if (cc.checked && cc.p_value <= threshold)
        std::printf(
            "gnh: note: [rank %d] group %s case %s: consistency check %s: p = %.3g (deviation %.3g), below "
            "the campaign-wide threshold %.3g\n",
            rank_, g.hash.c_str(), rec.name.c_str(), cc.name.c_str(), cc.p_value, cc.deviation, threshold);
    if (!quiet_)
      std::printf("gnh: [rank %d] %s %-6s loss %.6f |G|^2 %.4e GHG %.4e B_simple %.4g B_noise %.4g tr(H) %.4g\n", rank_,
                  g.hash.c_str(), rec.name.c_str(), rec.stats.loss, rec.stats.m.G_sqnorm, rec.stats.m.GHG,
                  rec.stats.derived.B_simple.value, rec.stats.derived.B_noise.value, rec.stats.derived.trace_H.value);
    std::fflush(stdout);
  }

  MpiTeam team_;
  const bool leader_;
  const int rank_;  // in the world
  const Campaign& c_;
  const std::string& output_;
  const bool quiet_;
  ProgressLog log_;
  std::map<std::string, bool> hashed_;  // path -> read in full while planning
  std::unique_ptr<Analyser> analyser_;
  Stability stability_;  // of the group being analysed
};

}  // namespace

void stop_on_sigterm() { std::signal(SIGTERM, on_sigterm); }

bool terminated() { return g_terminate != 0; }

Outcome compute_groups(const Comm& world, const Comm& team_comm, const Campaign& c,
                       const std::vector<int>& team_of_group, int my_team, const std::string& output, bool quiet) {
  GroupRunner runner(world, team_comm, c, output, quiet);
  Outcome out;
  for (std::size_t gi = 0; gi < c.groups.size(); ++gi)
    if (team_of_group[gi] == my_team) runner.run_group(c.groups[gi], out);
  return out;
}

}  // namespace gnh
