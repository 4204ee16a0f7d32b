// SPDX-License-Identifier: BSD-3-Clause
#include "driver/campaign.hpp"

#include <glob.h>

#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <type_traits>

#include "analysis/epoch.hpp"
#include "core/build_info.hpp"
#include "core/sha256.hpp"
#include "io/checkpoint.hpp"
#include "kernels/gemm_probe.hpp"

namespace gnh {
namespace {
using json = nlohmann::json;
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
        fail(d.file, ": checkpoints.paths: two checkpoints share the file name '", name, "' (", it->second,
             " and ", p, "); results are keyed by file name");
      out.push_back({p, name});
    }
    globfree(&g);
  }
  return out;
}

}  // namespace

AnalysisSettings settings_of(const Deck& d) {
  AnalysisSettings s;
  s.context = d.context;
  s.grad_microbatch = d.grad_microbatch;
  s.hvp_batch = d.hvp_batch;
  s.noise_samples = d.noise_samples;
  s.noise_batch = d.noise_batch;
  s.directions = d.directions;
  s.directions_per_pass = d.directions_per_pass;
  s.seed = d.seed;
  s.method = parse_curvature_method(d.curvature_method);
  s.bf16 = d.policy == "bf16-amp";
  s.tf32 = d.policy == "tf32";
  return s;
}

namespace {
std::string settings_fingerprint(const Deck& d, const ModelConfig& cfg, const std::vector<LoadedCase>& cases) {
  // Everything that changes a number in the results, nothing that does not
  // (paths, output location, run name, rank layout, directions per pass,
  // batch sizes: those change rounding only within the stated tolerances).
  json j;
  j["gnh_version"] = version();
  j["context"] = d.context;
  j["max_blocks"] = d.max_blocks;
  j["model"] = cfg.describe();
  for (const auto& c : cases) j["data"][c.name] = {{"sha256", c.data.sha256}, {"blocks", c.blocks}};
  j["analysis"] = {{"grad_microbatch", d.grad_microbatch}, {"hvp_batch", d.hvp_batch},
                   {"noise_samples", d.noise_samples},     {"noise_batch", d.noise_batch},
                   {"directions", d.directions},           {"directions_per_pass", d.directions_per_pass},
                   {"seed", d.seed},                       {"curvature_method", d.curvature_method}};
  j["precision"] = d.policy;
  return sha256_hex(j.dump()).substr(0, 16);
}

}  // namespace

Campaign prepare_campaign(const Comm& comm, const std::string& deck_path, const std::vector<std::string>& overrides,
                          bool quiet) {
  const bool root = comm.rank() == 0;
  Campaign c;
  Deck& deck = c.deck;
  std::vector<CheckpointFile>& files = c.files;
  comm.collective([&] {
    deck = load_deck(deck_path, overrides);
    if (comm.size() % deck.ranks_per_checkpoint != 0)
      fail(deck.file, ": parallel.ranks_per_checkpoint = ", deck.ranks_per_checkpoint,
           " does not divide the number of MPI ranks (", comm.size(), ")");
    files = expand_checkpoints(deck);
  });
  if (root) {
    std::printf("gnh %s (%s) | %s | %d MPI rank(s)\n", version(), git_commit(), build_configuration().c_str(),
                comm.size());
    if (!quiet)
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

  ModelConfig& cfg = c.cfg;
  std::vector<LoadedCase>& cases = c.cases;
  comm.collective([&] {
    const std::string first_cfg = info.front().at("config");
    for (std::size_t i = 1; i < files.size(); ++i)
      if (info[i].at("config") != first_cfg)
        fail("inconsistent model configurations: ", files[0].path, " has ", first_cfg, " but ", files[i].path,
             " has ", info[i].at("config").get<std::string>());
    cfg = read_checkpoint_config(files[0].path);
    if (deck.context > cfg.block_size)
      fail(deck.file, ": data.context = ", deck.context, " exceeds the model's block_size ", cfg.block_size);
    for (const auto& spec : deck.cases) {
      LoadedCase c;
      c.name = spec.name;
      c.data = read_tokens(deck.resolve(spec.path), spec.dtype, spec.dataset, cfg.vocab_size);
      c.blocks = epoch_blocks(static_cast<index_t>(c.data.ids.size()), deck.context, deck.max_blocks);
      if (c.blocks == 0)
        fail(c.data.path, ": ", c.data.ids.size(), " tokens are too few for one block of context ", deck.context,
             " (data.", spec.name, ")");
      if (deck.noise_samples > 0 && c.blocks <= deck.noise_batch)
        fail(c.data.path, ": ", c.blocks, " blocks of context ", deck.context, " are too few for noise batches of ",
             deck.noise_batch, " (data.", spec.name, " needs more than analysis.noise_batch blocks)");
      cases.push_back(std::move(c));
    }
  });

  // Group identical parameter states (first appearance order); deal round-robin over teams.
  std::vector<GroupRecord>& groups = c.groups;
  std::map<std::string, std::size_t> group_of;
  for (std::size_t i = 0; i < files.size(); ++i) {
    const std::string sha = info[i].at("sha256");
    auto [it, fresh] = group_of.emplace(sha, groups.size());
    if (fresh) {
      GroupRecord g;
      g.param_sha256 = sha;
      g.hash = sha.substr(0, 16);
      g.n_params = info[i].at("n_params");
      groups.push_back(g);
    }
    GroupRecord& g = groups[it->second];
    g.aliases.push_back(files[i].name);
    g.alias_paths.push_back(files[i].path);
    if (info[i].contains("iter_num") && !g.iter_num) g.iter_num = info[i].at("iter_num").get<std::int64_t>();
  }
  c.output = deck.resolve(deck.output);
  RunInfo& ri = c.info;
  ri.deck_text = deck.source_text;
  ri.effective_deck = deck.effective_text;
  ri.settings_fingerprint = settings_fingerprint(deck, cfg, cases);
  ri.model_config = cfg.describe();
  ri.run_name = deck.name;
  ri.precision = deck.policy;
  ri.ranks = comm.size();
  ri.ranks_per_checkpoint = int(deck.ranks_per_checkpoint);
  for (const auto& f : files) ri.campaign_checkpoints.push_back(f.name);
  if (root) {
    std::printf("gnh: %zu checkpoint file(s), %zu unique state(s), %zu case(s); model %s\n", files.size(),
                groups.size(), cases.size(), cfg.describe().c_str());
  }
  return c;
}

void choose_host_gemm(const Comm& comm, Campaign& c, bool quiet, bool float_gemms) {
  if constexpr (!std::is_same_v<ExecSpace, Kokkos::DefaultHostExecutionSpace>) {
    c.info.host_gemm = "device BLAS";
    (void)comm, (void)quiet, (void)float_gemms;
  } else {
    if (!float_gemms || ExecSpace().concurrency() != 1) {
      // gnh's kernel is single precision and single threaded.
      c.info.host_gemm = "vendor";
      return;
    }
    std::string mine;
    if (comm.rank() == 0) {
      const kernels::GemmProbe p = kernels::choose_host_gemm(c.cfg, c.deck.hvp_batch * c.deck.context);
      mine = p.json();
      if (!quiet) {
        std::printf("gnh: host sgemm: %s (%s)\n", kernels::host::name(p.chosen), p.reason.c_str());
        std::fflush(stdout);
      }
    }
    c.info.host_gemm_probe = comm.allgather(mine).front();
    const std::string chosen = json::parse(c.info.host_gemm_probe).at("chosen");
    if (const auto k = kernels::host::kernel_named(chosen)) kernels::host::select_kernel(*k);
    c.info.host_gemm = chosen;
  }
}

std::string shard_output(const std::string& output, int index, int count) {
  return with_suffix(output, ".shard-" + std::to_string(index) + "-of-" + std::to_string(count) + ".h5");
}

}  // namespace gnh
