// SPDX-License-Identifier: BSD-3-Clause
#include "driver/run.hpp"

#include <glob.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "analysis/epoch.hpp"
#include "core/build_info.hpp"
#include "core/sha256.hpp"
#include "io/checkpoint.hpp"
#include "io/deck.hpp"
#include "io/results.hpp"
#include "io/tokens.hpp"
#include "model/gpt.hpp"

namespace gnh {
namespace {

using json = nlohmann::json;

struct CheckpointFile {
  std::string path;  // as found
  std::string name;  // file name
};

std::string basename_of(const std::string& p) { return p.substr(p.find_last_of('/') + 1); }

std::vector<CheckpointFile> expand_checkpoints(const Deck& d) {
  std::vector<CheckpointFile> out;
  std::set<std::string> seen_paths;
  std::map<std::string, std::string> by_name;
  for (const auto& pattern : d.checkpoint_paths) {
    const std::string full = d.resolve(pattern);
    glob_t g{};
    const int rc = ::glob(full.c_str(), 0, nullptr, &g);
    if (rc == GLOB_NOMATCH || (rc == 0 && g.gl_pathc == 0)) {
      globfree(&g);
      if (full.find_first_of("*?[") == std::string::npos)
        fail(d.file, ": checkpoints.paths: file '", full, "' does not exist");
      fail(d.file, ": checkpoints.paths: pattern '", full, "' matched no files");
    }
    if (rc != 0) {
      globfree(&g);
      fail(d.file, ": checkpoints.paths: cannot expand '", full, "'");
    }
    for (std::size_t i = 0; i < g.gl_pathc; ++i) {
      const std::string p = g.gl_pathv[i];
      if (!seen_paths.insert(p).second) continue;
      const std::string name = basename_of(p);
      auto [it, fresh] = by_name.emplace(name, p);
      if (!fresh)
        fail(d.file, ": checkpoints.paths: two checkpoints share the file name '", name, "' (",
             it->second, " and ", p, "); results are keyed by file name");
      out.push_back({p, name});
    }
    globfree(&g);
  }
  return out;
}

struct LoadedCase {
  std::string name;
  TokenFile data;
  index_t blocks = 0;
};

std::string settings_fingerprint(const Deck& d, const ModelConfig& cfg,
                                 const std::vector<LoadedCase>& cases) {
  // Everything that changes a number in the results, nothing that does not
  // (paths, output location, run name, rank layout).
  json j;
  j["context"] = d.context;
  j["max_blocks"] = d.max_blocks;
  j["model"] = cfg.describe();
  for (const auto& c : cases) j["data"][c.name] = {{"sha256", c.data.sha256}, {"blocks", c.blocks}};
  j["analysis"] = {{"grad_microbatch", d.grad_microbatch}, {"hvp_batch", d.hvp_batch},
                   {"noise_samples", d.noise_samples},     {"noise_batch", d.noise_batch},
                   {"directions", d.directions},           {"seed", d.seed},
                   {"curvature_method", d.curvature_method}};
  j["precision"] = d.policy;
  return sha256_hex(j.dump()).substr(0, 16);
}

template <class T>
void compute_groups(const Comm& comm, const Deck& d, const ModelConfig& cfg,
                    const std::vector<LoadedCase>& cases, std::vector<GroupResult>& mine,
                    bool quiet) {
  index_t most_blocks = 1;
  for (const auto& c : cases) most_blocks = std::max(most_blocks, c.blocks);
  const index_t batch = std::min<index_t>(d.grad_microbatch, most_blocks);
  ExecSpace space;
  Gpt<T> model(cfg, batch, d.context);
  const ParamLayout& layout = model.layout();
  View1<T> params("gnh::run::params", layout.size());
  auto h_params = Kokkos::create_mirror_view(params);
  for (auto& g : mine) {
    g.workspace_bytes = static_cast<std::int64_t>(model.workspace_bytes() + sizeof(T) * layout.size());
    try {
      const Checkpoint ck = read_checkpoint(g.alias_paths.front());
      if (ck.param_sha256 != g.param_sha256)
        fail(ck.path, ": content changed while the run was starting (sha256 differs)");
      for (index_t i = 0; i < layout.size(); ++i) h_params(i) = static_cast<T>(ck.params[i]);
      Kokkos::deep_copy(params, h_params);
    } catch (const Error& e) {
      g.error = e.what();
      std::cerr << "gnh: error: " << g.error << "\n";
      continue;
    }
    for (const auto& c : cases) {
      CaseResult r;
      r.name = c.name;
      const auto t0 = std::chrono::steady_clock::now();
      const EpochLoss e = epoch_loss<T>(space, model, params, c.data.ids.data(), c.blocks);
      r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      r.loss = e.loss;
      r.tokens = e.tokens;
      r.blocks = c.blocks;
      if (!std::isfinite(r.loss)) {
        r.error = cat("group ", g.hash, " (", g.aliases.front(), ") case ", c.name,
                      ": loss is not finite (", r.loss, ")");
        std::cerr << "gnh: error: [rank " << comm.rank() << "] " << r.error << "\n";
      } else if (!quiet) {
        std::printf("gnh: [rank %d] %s %-6s loss %.6f over %lld tokens (%.0f tokens/s)\n",
                    comm.rank(), g.hash.c_str(), c.name.c_str(), r.loss,
                    static_cast<long long>(r.tokens), double(r.tokens) / std::max(r.seconds, 1e-9));
        std::fflush(stdout);
      }
      g.cases.push_back(r);
    }
  }
}

json to_json(const GroupResult& g) {
  json j = {{"hash", g.hash}, {"param_sha256", g.param_sha256}, {"aliases", g.aliases},
            {"alias_paths", g.alias_paths}, {"n_params", g.n_params}, {"rank", g.rank},
            {"workspace_bytes", g.workspace_bytes}, {"error", g.error}};
  if (g.iter_num) j["iter_num"] = *g.iter_num;
  for (const auto& c : g.cases)
    j["cases"].push_back({{"name", c.name}, {"loss", c.loss}, {"tokens", c.tokens},
                          {"blocks", c.blocks}, {"seconds", c.seconds}, {"error", c.error}});
  return j;
}

GroupResult from_json(const json& j) {
  GroupResult g;
  g.hash = j.at("hash");
  g.param_sha256 = j.at("param_sha256");
  g.aliases = j.at("aliases").get<std::vector<std::string>>();
  g.alias_paths = j.at("alias_paths").get<std::vector<std::string>>();
  g.n_params = j.at("n_params");
  g.rank = j.at("rank");
  g.workspace_bytes = j.at("workspace_bytes");
  g.error = j.at("error");
  if (j.contains("iter_num")) g.iter_num = j.at("iter_num").get<std::int64_t>();
  if (j.contains("cases"))
    for (const auto& c : j.at("cases")) {
      CaseResult r;
      r.name = c.at("name");
      r.loss = c.at("loss");
      r.tokens = c.at("tokens");
      r.blocks = c.at("blocks");
      r.seconds = c.at("seconds");
      r.error = c.at("error");
      g.cases.push_back(r);
    }
  return g;
}

void print_summary(const std::vector<GroupResult>& groups, const std::string& output) {
  std::printf("\n%-28s %-16s %-7s %12s %12s %12s\n", "checkpoint", "group", "case", "tokens",
              "loss", "perplexity");
  for (const auto& g : groups)
    for (const auto& alias : g.aliases) {
      if (!g.error.empty()) {
        std::printf("%-28s %-16s %-7s %12s %12s %12s\n", alias.c_str(), g.hash.c_str(), "-", "-",
                    "FAILED", "-");
        continue;
      }
      for (const auto& c : g.cases) {
        if (!c.error.empty())
          std::printf("%-28s %-16s %-7s %12lld %12s %12s\n", alias.c_str(), g.hash.c_str(),
                      c.name.c_str(), static_cast<long long>(c.tokens), "FAILED", "-");
        else
          std::printf("%-28s %-16s %-7s %12lld %12.6f %12.4f\n", alias.c_str(), g.hash.c_str(),
                      c.name.c_str(), static_cast<long long>(c.tokens), c.loss, std::exp(c.loss));
      }
    }
  std::printf("\nresults: %s\n", output.c_str());
  std::fflush(stdout);
}

}  // namespace

int run_command(const Comm& comm, const RunOptions& opt) {
  const bool root = comm.rank() == 0;
  Deck deck;
  std::vector<CheckpointFile> files;
  comm.collective([&] {
    deck = load_deck(opt.deck, opt.overrides);
    if (deck.policy == "bf16-amp")
      fail(deck.file, ": precision.policy = \"bf16-amp\" is not available in this version of gnh "
                      "(use fp32, tf32 or fp64)");
    if (deck.ranks_per_checkpoint != 1)
      fail(deck.file, ": parallel.ranks_per_checkpoint = ", deck.ranks_per_checkpoint,
           " is not available in this version of gnh (use 1)");
    files = expand_checkpoints(deck);
  });
  if (root) {
    std::printf("gnh %s (%s) | %s | %d MPI rank(s)\n", version(), git_commit(),
                build_configuration().c_str(), comm.size());
    if (!opt.quiet)
      std::printf("---- deck %s (effective) ----\n%s\n---- end of deck ----\n", deck.file.c_str(),
                  deck.effective_text.c_str());
    std::fflush(stdout);
  }

  // Each rank reads and hashes every size-th checkpoint; then all ranks share
  // the hashes and configurations so that grouping is identical everywhere.
  json local = json::array();
  comm.collective([&] {
    for (std::size_t i = static_cast<std::size_t>(comm.rank()); i < files.size();
         i += static_cast<std::size_t>(comm.size())) {
      const Checkpoint ck = read_checkpoint(files[i].path);
      json e = {{"index", i}, {"sha256", ck.param_sha256}, {"config", ck.config.describe()},
                {"n_params", ck.params.size()}};
      if (ck.iter_num) e["iter_num"] = *ck.iter_num;
      local.push_back(e);
    }
  });
  std::vector<json> info(files.size());
  for (const auto& s : comm.allgather(local.dump()))
    for (const auto& e : json::parse(s)) info[e.at("index").get<std::size_t>()] = e;

  ModelConfig cfg;
  std::vector<LoadedCase> cases;
  comm.collective([&] {
    const std::string first_cfg = info.front().at("config");
    for (std::size_t i = 1; i < files.size(); ++i)
      if (info[i].at("config") != first_cfg)
        fail("inconsistent model configurations: ", files[0].path, " has ", first_cfg, " but ",
             files[i].path, " has ", info[i].at("config").get<std::string>());
    cfg = read_checkpoint_config(files[0].path);
    if (deck.context > cfg.block_size)
      fail(deck.file, ": data.context = ", deck.context, " exceeds the model's block_size ",
           cfg.block_size);
    for (const auto& spec : deck.cases) {
      LoadedCase c;
      c.name = spec.name;
      c.data = read_tokens(deck.resolve(spec.path), spec.dtype, spec.dataset, cfg.vocab_size);
      c.blocks = epoch_blocks(static_cast<index_t>(c.data.ids.size()), deck.context, deck.max_blocks);
      if (c.blocks == 0)
        fail(c.data.path, ": ", c.data.ids.size(), " tokens are too few for one block of context ",
             deck.context, " (data.", spec.name, ")");
      cases.push_back(std::move(c));
    }
  });

  // Group identical parameter states (first appearance order); deal round-robin.
  std::vector<GroupResult> groups;
  std::map<std::string, std::size_t> group_of;
  for (std::size_t i = 0; i < files.size(); ++i) {
    const std::string sha = info[i].at("sha256");
    auto [it, fresh] = group_of.emplace(sha, groups.size());
    if (fresh) {
      GroupResult g;
      g.param_sha256 = sha;
      g.hash = sha.substr(0, 16);
      g.n_params = info[i].at("n_params");
      g.rank = static_cast<int>(groups.size() % static_cast<std::size_t>(comm.size()));
      groups.push_back(g);
    }
    GroupResult& g = groups[it->second];
    g.aliases.push_back(files[i].name);
    g.alias_paths.push_back(files[i].path);
    if (info[i].contains("iter_num") && !g.iter_num) g.iter_num = info[i].at("iter_num").get<std::int64_t>();
  }
  if (root) {
    std::printf("gnh: %zu checkpoint file(s), %zu unique state(s), %zu case(s), %d rank(s); "
                "model %s\n", files.size(), groups.size(), cases.size(), comm.size(),
                cfg.describe().c_str());
    std::fflush(stdout);
  }

  std::vector<GroupResult> mine;
  for (const auto& g : groups)
    if (g.rank == comm.rank()) mine.push_back(g);
  // fp32 and tf32 are the same computation on the host backend.
  if (deck.policy == "fp64")
    compute_groups<double>(comm, deck, cfg, cases, mine, opt.quiet);
  else
    compute_groups<float>(comm, deck, cfg, cases, mine, opt.quiet);

  json mine_json = json::array();
  for (const auto& g : mine) mine_json.push_back(to_json(g));
  const std::vector<std::string> gathered = comm.allgather(mine_json.dump());
  std::map<std::string, GroupResult> done;
  for (const auto& s : gathered)
    for (const auto& j : json::parse(s)) {
      GroupResult g = from_json(j);
      done[g.hash] = g;
    }
  for (auto& g : groups) g = done.at(g.hash);

  int failures = 0;
  for (const auto& g : groups) {
    failures += g.error.empty() ? 0 : 1;
    for (const auto& c : g.cases) failures += c.error.empty() ? 0 : 1;
  }
  std::string write_error;
  const std::string output = deck.resolve(deck.output);
  if (root) {
    RunInfo ri;
    ri.deck_text = deck.source_text;
    ri.effective_deck = deck.effective_text;
    ri.settings_fingerprint = settings_fingerprint(deck, cfg, cases);
    ri.model_config = cfg.describe();
    ri.run_name = deck.name;
    ri.ranks = comm.size();
    try {
      write_results(output, ri, groups);
      print_summary(groups, output);
    } catch (const Error& e) {
      write_error = e.what();
    }
  }
  comm.collective([&] {
    if (!write_error.empty()) throw Error(write_error);
  });
  if (failures > 0) {
    if (root)
      std::fprintf(stderr, "gnh: error: %d group/case computation(s) failed; the others are in %s\n",
                   failures, output.c_str());
    return 1;
  }
  return 0;
}

}  // namespace gnh
