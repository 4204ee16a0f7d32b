// SPDX-License-Identifier: BSD-3-Clause
#include "driver/campaign.hpp"

#include <algorithm>

#include <fnmatch.h>
#include <glob.h>

#include <cstdio>
#include <functional>
#include <tuple>
#include <map>
#include <optional>
#include <nlohmann/json.hpp>
#include <set>
#include <type_traits>

#include "analysis/memory.hpp"
#include "analysis/sampling.hpp"
#include "analysis/team.hpp"
#include "core/build_info.hpp"
#include "core/isa.hpp"
#include "core/sha256.hpp"
#include "io/checkpoint.hpp"
#include "io/hdf5.hpp"
#include "model/layout.hpp"
#include "core/deal.hpp"
#include "driver/gemm_record.hpp"
#include "kernels/gemm_probe.hpp"
#include "parallel/pack.hpp"

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
        fail(d.file, ": checkpoints.paths: two checkpoints share the file name '", name, "' (", it->second, " and ", p,
             "); results are keyed by file name");
      out.push_back({p, name});
    }
    globfree(&g);
  }
  return out;
}

}  // namespace

// A JSON value of a settings member: integers as they are, enumerations by name.
template <class V>
json json_of(const V& v) {
  if constexpr (std::is_enum_v<V>) return to_string(v);
  else return v;
}

std::string settings_fingerprint(const Deck& d, const ModelConfig& cfg, const std::vector<LoadedCase>& cases) {
  // Everything that changes a number in the results, nothing that does not
  // (paths, output location, run name, rank layout).
  json j;
  j["gnh_version"] = version();
  j["context"] = d.analysis.context;
  j["max_blocks"] = d.max_blocks;
  j["model"] = cfg.describe();
  for (const auto& c : cases) {
    if (!c.spec.windowed()) {
      j["data"][c.name] = {{"sha256", c.data.sha256}, {"blocks", c.blocks}};
    } else {
      // The selection, not its tokens: those may differ per state, and each
      // group file records its own (tokens_sha256, checked before reuse).
      j["data"][c.name] = {{"format", c.source.format}, {"dtype", c.source.dtype}, {"tokens", c.source.count}};
      if (c.spec.step_tied()) j["data"][c.name]["steps_before"] = {c.spec.steps_before, c.spec.batch_samples};
      else j["data"][c.name]["samples"] = {c.spec.samples_first, c.spec.samples_end};
    }
    if (c.stride != d.analysis.context) j["data"][c.name]["stride"] = c.stride;  // layout "sequences"
  }
  j["analysis"] = json::object();
  for_each_analysis_key(d.analysis, [&](const AnalysisKey& k, const auto& v) { j["analysis"][k.name] = json_of(v); });
  j["precision"] = to_string(d.analysis.precision);
  // Only when asked for, so that a deck without [curvature] keeps its fingerprint.
  if (d.analysis.curvature.any())
    j["curvature"] = {{"blocks", d.analysis.curvature.blocks},
                      {"diagonal", d.analysis.curvature.diagonal},
                      {"preconditioned", d.analysis.curvature.preconditioned},
                      {"update", d.analysis.curvature.update}};
  // The operator, only when it is not the Hessian alone (likewise).
  if (d.analysis.curvature.op != OperatorChoice::hessian)
    j["curvature"]["operator"] = to_string(d.analysis.curvature.op);
  // The spectrum's keys, only when asked for (earlier fingerprints stay valid).
  if (d.analysis.curvature.lanczos_steps > 0)
    j["curvature"]["lanczos"] = {{"steps", d.analysis.curvature.lanczos_steps},
                                 {"chains", d.analysis.curvature.lanczos_chains},
                                 {"operator", d.analysis.curvature.lanczos_php ? "PHP" : "H"},
                                 {"top_eigenvalues", d.analysis.curvature.top_eigenvalues},
                                 {"tolerance", d.analysis.curvature.lanczos_tolerance}};
  if (d.analysis.curvature.eigenvectors > 0)
    j["curvature"]["lanczos"]["eigenvectors"] = d.analysis.curvature.eigenvectors;
  if (d.analysis.curvature.layer_spectra) j["curvature"]["lanczos"]["spectrum_blocks"] = "layer";
  // The learning rates given in the deck, only where given (likewise).
  for (const auto& [glob, lr] : d.checkpoint_learning_rates) j["learning_rates"][glob] = lr;
  // The variance-reduced traces, only where computed (likewise).
  if (d.analysis.curvature.hutchpp) j["curvature"]["trace_estimator"] = "hutch++";
  // The landscapes, only when asked for (likewise).
  if (d.analysis.landscape.any()) {
    const LandscapeSettings& ls = d.analysis.landscape;
    std::vector<std::string> lines, plane;
    for (const LandscapeDirection& x : ls.directions) lines.push_back(x.name());
    for (const LandscapeDirection& x : ls.plane) plane.push_back(x.name());
    j["landscape"] = {{"directions", lines},
                      {"points", ls.points},
                      {"range", ls.range},
                      {"plane", plane},
                      {"plane_points", ls.plane_points},
                      {"seed", ls.seed}};
  }
  // Adjoint cuts regroup the sums of every v^T H v (doc/derivatives.md):
  // which engines cut, only where one does (a plan without cuts keeps its
  // fingerprint). The rule's other inputs (model, context, widths) are above.
  const PlannedCuts cuts = planned_adjoint_cuts(cfg, d.analysis);
  if (cuts.any())
    j["adjoint_cuts"] = {{"identity_checks", cuts.checks}, {"curvature_from_directions", cuts.curvature_from}};
  return sha256_hex(j.dump()).substr(0, 16);
}

namespace {

// What planning needs of one checkpoint file, exchanged between ranks.
struct FileInfo {
  std::string sha256, config;
  std::int64_t n_params = 0, hashed = 0, has_iter = 0, iter_num = 0;
};

Pack& operator<<(Pack& p, const FileInfo& f) {
  return p << f.sha256 << f.config << f.n_params << f.hashed << f.has_iter << f.iter_num;
}
Unpack& operator>>(Unpack& u, FileInfo& f) {
  return u >> f.sha256 >> f.config >> f.n_params >> f.hashed >> f.has_iter >> f.iter_num;
}

// [curvature] update (SPEC §10): consecutive distinct states by iter_num. A
// file without iter_num, aliases of one state that disagree on it, or two
// states with the same iter_num leave the order undefined: an error naming
// the files.
void order_by_iteration(const Deck& deck, const std::vector<CheckpointFile>& files, const std::vector<FileInfo>& info,
                        const std::vector<std::size_t>& group_of, std::vector<GroupRecord>& groups) {
  for (std::size_t i = 0; i < files.size(); ++i) {
    if (!info[i].has_iter)
      fail(deck.file, ": curvature.update orders the checkpoints by iter_num, but ", files[i].path,
           " has no iter_num (convert it from a nanoGPT file that has one, or set curvature.update = false)");
    const GroupRecord& g = groups[group_of[i]];
    if (g.iter_num && *g.iter_num != info[i].iter_num)
      fail(deck.file, ": curvature.update: ", files[i].path, " and ", g.alias_paths.front(),
           " hold the same parameters but iter_num ", info[i].iter_num, " and ", *g.iter_num,
           ": their place in the order is ambiguous");
  }
  std::vector<std::size_t> order(groups.size());
  for (std::size_t g = 0; g < order.size(); ++g) {
    order[g] = g;
    groups[g].ordered = true;
  }
  std::stable_sort(order.begin(), order.end(),
                   [&](std::size_t a, std::size_t b) { return *groups[a].iter_num < *groups[b].iter_num; });
  for (std::size_t k = 0; k + 1 < order.size(); ++k) {
    GroupRecord &a = groups[order[k]], &b = groups[order[k + 1]];
    if (*a.iter_num == *b.iter_num)
      fail(deck.file, ": curvature.update: ", a.alias_paths.front(), " and ", b.alias_paths.front(),
           " are different parameter states with the same iter_num ", *a.iter_num, ": the update has no order");
    a.partner = int(order[k + 1]);
    a.partner_hash = b.hash;
  }
}

FileInfo file_info(const std::string& path, bool read_values) {
  FileInfo f;
  CheckpointHeader h;
  if (read_values) {
    Checkpoint ck = read_checkpoint(path);
    f.sha256 = ck.param_sha256;
    f.hashed = !ck.stored_sha256;
    h = std::move(ck);
  } else {
    h = read_checkpoint_header(path);
    if (h.stored_sha256) {
      f.sha256 = *h.stored_sha256;
    } else {
      // From an older gnh-convert: the values must be read to be grouped.
      f.sha256 = read_checkpoint(path).param_sha256;
      f.hashed = 1;
    }
  }
  f.config = h.config.describe();
  f.n_params = h.n_params;
  f.has_iter = h.iter_num.has_value();
  f.iter_num = h.iter_num.value_or(0);
  return f;
}

}  // namespace

namespace {

// The deck (with its overrides) and its checkpoint files, on every rank.
void load_campaign_deck(const Comm& comm, Campaign& c, const std::string& deck_path,
                        const std::vector<std::string>& overrides) {
  comm.collective([&] {
    c.deck = load_deck(deck_path, overrides);
    adjoint_cuts_setting();  // a bad GNH_ADJOINT_CUTS stops every rank here
    if (comm.size() % c.deck.ranks_per_checkpoint != 0)
      fail(c.deck.file, ": parallel.ranks_per_checkpoint = ", c.deck.ranks_per_checkpoint,
           " does not divide the number of MPI ranks (", comm.size(), ")");
    c.files = expand_checkpoints(c.deck);
  });
}

void print_banner(const Comm& comm, const Deck& deck, bool quiet) {
  if (comm.rank() != 0) return;
  std::printf("gnh %s (%s) | %s | %d MPI rank(s)\n", version(), git_commit(), build_configuration().c_str(),
              comm.size());
  if (!quiet)
    std::printf("---- deck %s (effective) ----\n%s\n---- end of deck ----\n", deck.file.c_str(),
                deck.effective_text.c_str());
  std::fflush(stdout);
}

// Each rank reads the headers of its share of the checkpoints (dealt
// round-robin), then all ranks share what they found, so that grouping is
// identical everywhere.
std::vector<FileInfo> gather_file_info(const Comm& comm, std::vector<CheckpointFile>& files, bool read_values) {
  Pack local;
  comm.collective([&] {
    for (const index_t i : dealt_share(index_t(files.size()), comm.size(), comm.rank()))
      local << std::int64_t(i) << file_info(files[std::size_t(i)].path, read_values);
  });
  std::vector<FileInfo> info(files.size());
  for (const auto& bytes : comm.allgather(local.bytes()))
    for (Unpack u(bytes); !u.done();) {
      std::int64_t i = 0;
      u >> i >> info[std::size_t(i)];
    }
  std::size_t hashed = 0;
  for (std::size_t i = 0; i < files.size(); ++i) {
    files[i].hashed = info[i].hashed != 0;
    hashed += files[i].hashed;
  }
  if (comm.rank() == 0 && hashed > 0 && !read_values) {
    std::printf(
        "gnh: note: %zu checkpoint file(s) carry no param_sha256 (an older gnh-convert): read in full to be "
        "grouped, and again to be analysed; convert them again to read each once\n",
        hashed);
    std::fflush(stdout);
  }
  return info;
}

// One data case of the deck, opened and checked against the model and the
// settings; read whole unless it selects samples.
LoadedCase load_case(const Deck& deck, const DataCaseSpec& spec, const ModelConfig& cfg) {
  const index_t context = deck.analysis.context;
  LoadedCase c;
  c.name = spec.name;
  c.spec = spec;
  c.source = open_token_source(deck.resolve(spec.path), spec.format, spec.dtype, spec.dataset);
  c.stride = index_t(spec.stride(context));
  c.available = epoch_blocks(index_t(c.source.count), context, 0, c.stride);
  if (c.available == 0)
    fail(c.source.path, ": ", c.source.count, " tokens are too few for one block of context ", context, " (data.",
         spec.name, ")");
  if (spec.windowed()) return c;  // read per state (case_tokens), its size set with the states
  c.data = read_token_source(c.source.path, spec.format, spec.dtype, spec.dataset, cfg.vocab_size);
  c.blocks = epoch_blocks(static_cast<index_t>(c.data.ids.size()), context, deck.max_blocks, c.stride);
  return c;
}

// Every state's samples of every case within its source and enough for the
// noise batches; a windowed case's plan size is the largest.
void check_case_samples(Campaign& c) {
  const Deck& d = c.deck;
  for (auto& cs : c.cases) {
    const std::string key = "data." + cs.name;
    for (const auto& g : c.groups) {
      const auto [first, end] = case_samples(d, cs, g);
      const std::string which =
          cs.spec.step_tied() ? " for " + g.aliases.front() + " (step " + std::to_string(*g.step) + ")" : "";
      if (end <= first)
        fail(d.file, ": ", key, ".steps_before: ", g.aliases.front(), " is at step ", *g.step,
             ": no training step before it, so no samples it was trained on");
      if (end > cs.available)
        fail(cs.source.path, ": ", key, " selects samples [", first, ", ", end, ")", which, ", the source holds ",
             cs.available, " (", cs.source.count, " tokens, a sample every ", cs.stride, " from context ",
             d.analysis.context, ")");
      if (d.analysis.noise_samples > 0 && end - first <= d.analysis.noise_batch)
        fail(cs.source.path, ": ", end - first, " blocks of context ", d.analysis.context, which,
             " are too few for noise batches of ", d.analysis.noise_batch, " (", key,
             " needs more than analysis.noise_batch blocks)");
      if (cs.spec.windowed()) cs.blocks = std::max(cs.blocks, end - first);
    }
  }
}

// The model every checkpoint shares, and the data cases, on every rank.
void load_model_and_data(const Comm& comm, Campaign& c, const std::vector<FileInfo>& info) {
  comm.collective([&] {
    const std::string& first_cfg = info.front().config;
    for (std::size_t i = 1; i < c.files.size(); ++i)
      if (info[i].config != first_cfg)
        fail("inconsistent model configurations: ", c.files[0].path, " has ", first_cfg, " but ", c.files[i].path,
             " has ", info[i].config);
    c.cfg = read_checkpoint_config(c.files[0].path);
    if (c.deck.analysis.context > c.cfg.block_size)
      fail(c.deck.file, ": data.context = ", c.deck.analysis.context, " exceeds the model's block_size ",
           c.cfg.block_size);
    for (const auto& spec : c.deck.cases) c.cases.push_back(load_case(c.deck, spec, c.cfg));
  });
}

// The training step of file i, where a case's samples are tied to it: the
// file's iter_num, else the deck's [checkpoints] steps; a disagreement or no
// step at all is an error naming the file.
std::optional<std::int64_t> file_step(const Deck& d, const CheckpointFile& f, const FileInfo& info) {
  std::optional<std::int64_t> from_deck;
  std::string pattern;
  for (const auto& [glob, step] : d.checkpoint_steps)
    if (::fnmatch(glob.c_str(), f.name.c_str(), 0) == 0) {
      if (from_deck && *from_deck != step)
        fail(d.file, ": checkpoints.steps: \"", pattern, "\" = ", *from_deck, " and \"", glob, "\" = ", step,
             " both match ", f.name);
      from_deck = step;
      pattern = glob;
    }
  if (info.has_iter && from_deck && *from_deck != info.iter_num)
    fail(d.file, ": checkpoints.steps: \"", pattern, "\" = ", *from_deck, " but ", f.path, " records iter_num ",
         info.iter_num);
  if (info.has_iter) return info.iter_num;
  return from_deck;
}

// Identical parameter states grouped, in first appearance order; with
// [curvature] update, ordered by iter_num. Where a case's samples are tied to
// the step, a state is its parameters at its step: the same parameters at two
// steps are analysed on each step's samples.
void group_states(Campaign& c, const std::vector<FileInfo>& info) {
  bool step_tied = false;
  std::string tied_case;
  for (const auto& cs : c.deck.cases)
    if (cs.step_tied()) {
      step_tied = true;
      tied_case = cs.name;
    }
  std::map<std::string, std::size_t> group_of;
  std::vector<std::size_t> file_group(c.files.size());
  for (std::size_t i = 0; i < c.files.size(); ++i) {
    const std::string& sha = info[i].sha256;
    std::optional<std::int64_t> step;
    if (step_tied) {
      step = file_step(c.deck, c.files[i], info[i]);
      if (!step)
        fail(c.deck.file, ": data.", tied_case, ".steps_before needs each checkpoint's training step, but ",
             c.files[i].path, " records no iter_num and no checkpoints.steps pattern matches ", c.files[i].name);
    }
    const std::string key = step ? sha + " step " + std::to_string(*step) : sha;
    auto [it, fresh] = group_of.emplace(key, c.groups.size());
    file_group[i] = it->second;
    if (fresh) {
      GroupRecord g;
      g.param_sha256 = sha;
      g.hash = step ? sha256_hex(key).substr(0, 16) : sha.substr(0, 16);
      g.n_params = info[i].n_params;
      g.step = step;
      c.groups.push_back(g);
    }
    GroupRecord& g = c.groups[it->second];
    g.aliases.push_back(c.files[i].name);
    g.alias_paths.push_back(c.files[i].path);
    if (info[i].has_iter && !g.iter_num) g.iter_num = info[i].iter_num;
  }
  if (c.deck.analysis.curvature.update) order_by_iteration(c.deck, c.files, info, file_group, c.groups);
}

// The second-order forward engines the plan builds and whether each cuts:
// "identity checks K=2: off; curvature K=5: on, K=4: on" (the curvature
// engine at each pass width of any case, widest first, with
// curvature_method = second-order-forward).
std::string adjoint_cuts_engines(const Campaign& c) {
  const AnalysisSettings& s = c.deck.analysis;
  const PlannedCuts cuts = planned_adjoint_cuts(c.cfg, s);
  std::string out = std::string("identity checks K=2: ") + (cuts.checks ? "on" : "off");
  if (s.curvature_method != CurvatureMethod::second_order_forward) return out;
  std::set<index_t, std::greater<index_t>> widths;
  for (const auto& cs : c.cases)
    for (const index_t K : plan_case(s, cs.blocks, true, true).pass_widths) widths.insert(K);
  std::string list;
  for (const index_t K : widths)
    list += (list.empty() ? "" : ", ") + std::string("K=") + std::to_string(K) + (cuts.curvature(K) ? ": on" : ": off");
  return out + (list.empty() ? "" : "; curvature " + list);
}

// What every output of the run records about it.
RunInfo run_info_of(const Campaign& c, int ranks) {
  RunInfo ri;
  ri.deck_text = c.deck.source_text;
  ri.effective_deck = c.deck.effective_text;
  ri.settings_fingerprint = settings_fingerprint(c.deck, c.cfg, c.cases);
  ri.model_config = c.cfg.describe();
  ri.run_name = c.deck.name;
  ri.precision = to_string(c.deck.analysis.precision);
  ri.ranks = ranks;
  ri.ranks_per_checkpoint = int(c.deck.ranks_per_checkpoint);
  ri.parameter_shards = int(c.deck.analysis.parameter_shards);
  for (const index_t b : ShardLayout(ParamLayout(c.cfg).size(), ri.parameter_shards).bounds)
    ri.parameter_shard_bounds.push_back(std::int64_t(b));
  for (const auto& f : c.files) ri.campaign_checkpoints.push_back(f.name);
  ri.strict_kernels = c.deck.strict_kernels;
  ri.consistency_family = std::int64_t(c.groups.size() * c.cases.size());
  ri.adjoint_cuts = adjoint_cuts_setting();
  ri.adjoint_cuts_engines = adjoint_cuts_engines(c);
  if constexpr (std::is_same_v<ExecSpace, Kokkos::DefaultHostExecutionSpace>)
    ri.host_threads = int(Kokkos::DefaultHostExecutionSpace().concurrency());
  return ri;
}

}  // namespace

Campaign prepare_campaign(const Comm& comm, const std::string& deck_path, const std::vector<std::string>& overrides,
                          bool quiet, bool read_values) {
  Campaign c;
  load_campaign_deck(comm, c, deck_path, overrides);
  print_banner(comm, c.deck, quiet);
  const std::vector<FileInfo> info = gather_file_info(comm, c.files, read_values);
  load_model_and_data(comm, c, info);
  comm.collective([&] {
    group_states(c, info);
    check_case_samples(c);
  });
  c.output = c.deck.resolve(c.deck.output);
  c.info = run_info_of(c, comm.size());
  if (comm.rank() == 0)
    std::printf("gnh: %zu checkpoint file(s), %zu unique state(s), %zu case(s); model %s\n", c.files.size(),
                c.groups.size(), c.cases.size(), c.cfg.describe().c_str());
  return c;
}

void set_pass_sizes(const Comm& comm, Campaign& c, const PassSizes& sizes) {
  comm.collective([&] {
    std::vector<std::string> overrides = c.deck.overrides;
    overrides.push_back("analysis.directions_per_pass=" + std::to_string(sizes.directions_per_pass));
    overrides.push_back("analysis.hvp_batch=" + std::to_string(sizes.hvp_batch));
    overrides.push_back("analysis.grad_microbatch=" + std::to_string(sizes.grad_microbatch));
    overrides.push_back("parallel.parameter_shards=" + std::to_string(sizes.parameter_shards));
    const Deck d = parse_deck(c.deck.source_text, c.deck.file, c.deck.dir, overrides);
    c.deck.overrides = d.overrides;
    const bool keep_noise = c.deck.analysis.keep_noise_vectors;  // resolved by the run, not in the deck
    c.deck.analysis = d.analysis;
    c.deck.analysis.keep_noise_vectors = keep_noise;
    c.deck.effective_text = d.effective_text;
  });
  c.info.effective_deck = c.deck.effective_text;
  c.info.settings_fingerprint = settings_fingerprint(c.deck, c.cfg, c.cases);
  c.info.adjoint_cuts_engines = adjoint_cuts_engines(c);
  c.info.parameter_shards = int(c.deck.analysis.parameter_shards);
  c.info.parameter_shard_bounds.clear();
  for (const index_t b : ShardLayout(ParamLayout(c.cfg).size(), c.info.parameter_shards).bounds)
    c.info.parameter_shard_bounds.push_back(std::int64_t(b));
}

void print_engine_settings(const Comm& comm, const Campaign& c) {
  if (comm.rank() != 0) return;
  std::printf("gnh: adjoint cuts (GNH_ADJOINT_CUTS=%s): %s", c.info.adjoint_cuts.c_str(),
              c.info.adjoint_cuts_engines.c_str());
  if (c.info.host_threads > 0) std::printf("; %d host thread(s) per rank", c.info.host_threads);
  std::printf("\n");
  std::fflush(stdout);
}

bool same_host_threads(const RunInfo& a, const RunInfo& b) {
  // Without a record: a one-thread run (Serial builds) or a device build.
  auto threads = [](const RunInfo& i) { return i.host_threads > 0 ? i.host_threads : 1; };
  return threads(a) == threads(b);
}

bool group_file_reusable(const std::string& path, const RunInfo& info, const std::string* partner) {
  if (!group_file_complete(path, info.settings_fingerprint, partner)) return false;
  RunInfo recorded;
  std::string kind;
  try {
    recorded = read_run_info(path);
    kind = read_group_summary(path).kernel_kind;
  } catch (const Error&) {
    return false;
  }
  if (!same_host_threads(recorded, info)) return false;
  // run.strict_kernels: a group of another kernel kind is recomputed.
  return !info.strict_kernels || info.host_gemm.empty() || kind == kernel_kind(info);
}

GemmChoice campaign_gemm_choice(const Campaign& c, const std::string& campaign_output, const char* who) {
  const index_t rows = c.deck.analysis.hvp_batch * c.deck.analysis.context;
  return campaign_host_gemm(campaign_output, who, c.cfg.n_embd, c.cfg.vocab_size, rows);
}

void choose_host_gemm(const Comm& comm, Campaign& c, const std::string& campaign_output, bool quiet, bool float_gemms) {
  if constexpr (!std::is_same_v<ExecSpace, Kokkos::DefaultHostExecutionSpace>) {
    c.info.host_gemm = "device BLAS";
    c.info.vector_level = "device";
    (void)comm, (void)campaign_output, (void)quiet, (void)float_gemms;
  } else {
    c.info.vector_level = host_isa_level();
    if (!float_gemms) {
      // gnh's kernel is single precision.
      c.info.host_gemm = "vendor";
      return;
    }
    // Rank 0 takes the campaign's choice for this CPU class (probing where
    // there is none yet); every rank selects its answer (the kernel's name)
    // and records the probe behind it (JSON, for the output).
    Pack mine;
    comm.collective([&] {
      if (comm.rank() != 0) return;
      const GemmChoice g = campaign_gemm_choice(c, campaign_output, "gnh run");
      mine << g.kernel << g.probe;
      if (!quiet) {
        std::printf("gnh: host sgemm: %s (%s); vector loops: %s\n", g.kernel.c_str(), g.how.c_str(), host_isa_level());
        std::fflush(stdout);
      }
    });
    std::string chosen;
    Unpack(comm.allgather(mine.bytes()).front()) >> chosen >> c.info.host_gemm_probe;
    if (const auto k = kernels::host::kernel_named(chosen)) kernels::host::select_kernel(*k);
    c.info.host_gemm = chosen;
  }
}

std::pair<index_t, index_t> case_samples(const Deck& deck, const LoadedCase& cs, const GroupRecord& g) {
  const DataCaseSpec& sp = cs.spec;
  index_t first = 0, end = 0;
  if (sp.step_tied()) {
    const index_t s = *g.step;
    first = std::max<index_t>(s - sp.steps_before, 0) * sp.batch_samples;
    end = s * sp.batch_samples;
  } else if (sp.windowed()) {
    first = sp.samples_first;
    end = sp.samples_end;
  } else {
    return {0, cs.blocks};
  }
  if (deck.max_blocks > 0 && end - first > deck.max_blocks) end = first + deck.max_blocks;
  return {first, end};
}

CaseTokens case_tokens(const Campaign& c, const LoadedCase& cs, const GroupRecord& g) {
  CaseTokens t;
  std::tie(t.first, t.end) = case_samples(c.deck, cs, g);
  t.blocks = t.end - t.first;
  // From the first sample's first token to the last block's last target.
  const index_t n = (t.blocks - 1) * cs.stride + c.deck.analysis.context + 1;
  if (cs.spec.windowed()) {
    t.owned = read_token_range(cs.source, std::uint64_t(t.first * cs.stride), std::uint64_t(n), c.cfg.vocab_size);
    t.ids = t.owned.data();
  } else {
    t.ids = cs.data.ids.data();
  }
  t.sha256 = tokens_sha256(t.ids, std::size_t(n));
  return t;
}

bool same_case_tokens(const std::string& path, const Campaign& c, const std::vector<CaseTokens>& tokens) {
  std::map<std::string, std::string> recorded;
  for (std::size_t k = 0; k < c.cases.size(); ++k)
    if (c.cases[k].spec.windowed()) {
      if (recorded.empty()) recorded = group_tokens_sha256(path);
      const auto it = recorded.find(c.cases[k].name);
      if (it == recorded.end() || it->second != tokens[k].sha256) return false;
    }
  return true;
}

std::string shard_output(const std::string& output, int index, int count) {
  return with_suffix(output, ".shard-" + std::to_string(index) + "-of-" + std::to_string(count) + ".h5");
}

}  // namespace gnh
