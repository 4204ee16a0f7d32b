// SPDX-License-Identifier: BSD-3-Clause
#include "io/results.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <limits>
#include <set>
#include <sstream>

#include "core/build_info.hpp"
#include "core/error.hpp"
#include "io/hdf5.hpp"

namespace gnh {
namespace {

std::string replace_suffix(const std::string& path, const std::string& suffix) {
  const std::string stem =
      path.size() > 3 && path.substr(path.size() - 3) == ".h5" ? path.substr(0, path.size() - 3) : path;
  return stem + suffix;
}

void write_root_attrs(hid_t root, const RunInfo& info, const std::string& format) {
  h5::write_attr(root, "format", format);
  h5::write_attr(root, "format_version", std::int64_t(1));
  h5::write_attr(root, "gnh_version", std::string(version()));
  h5::write_attr(root, "git_commit", std::string(git_commit()));
  h5::write_attr(root, "build", build_configuration());
  h5::write_attr(root, "deck", info.deck_text);
  h5::write_attr(root, "deck_effective", info.effective_deck);
  h5::write_attr(root, "settings_fingerprint", info.settings_fingerprint);
  h5::write_attr(root, "model_config", info.model_config);
  h5::write_attr(root, "run_name", info.run_name);
  h5::write_attr(root, "precision", info.precision);
  h5::write_attr(root, "ranks", std::int64_t(info.ranks));
  h5::write_attr(root, "ranks_per_checkpoint", std::int64_t(info.ranks_per_checkpoint));
  h5::write_attr(root, "parameter_shards", std::int64_t(info.parameter_shards));
  h5::write_attr(root, "parameter_shard_bounds", info.parameter_shard_bounds);
  h5::write_attr(root, "shard", info.shard);
  h5::write_attr(root, "campaign_checkpoints", info.campaign_checkpoints);
  if (!info.host_gemm.empty()) h5::write_attr(root, "host_gemm", info.host_gemm);
  if (!info.host_gemm_probe.empty()) h5::write_attr(root, "host_gemm_probe", info.host_gemm_probe);
  if (!info.vector_level.empty()) h5::write_attr(root, "vector_level", info.vector_level);
  h5::write_attr(root, "strict_kernels", std::int64_t(info.strict_kernels ? 1 : 0));
  h5::write_attr(root, "consistency_family", info.consistency_family);
  h5::write_attr(root, "consistency_alpha", kConsistencyAlpha);
  if (!info.adjoint_cuts.empty()) h5::write_attr(root, "adjoint_cuts", info.adjoint_cuts);
  if (!info.adjoint_cuts_engines.empty()) h5::write_attr(root, "adjoint_cuts_engines", info.adjoint_cuts_engines);
  if (info.host_threads > 0) h5::write_attr(root, "host_threads", std::int64_t(info.host_threads));
  if (!info.accepted_failed_identities.empty())
    h5::write_attr(root, "accepted_failed_identities", info.accepted_failed_identities);
}

// SPEC §10's spectrum group; doc/outputs.md describes every name.
void write_spectrum(hid_t parent, const std::string& name, const SpectrumStatistics& sp, const std::string& where) {
  h5::Handle g = h5::create_group(parent, name, where);
  const hid_t id = g.id();
  h5::write_attr(id, "operator", sp.op);
  h5::write_attr(id, "steps", std::int64_t(sp.steps));
  h5::write_attr(id, "chains", std::int64_t(sp.chains));
  h5::write_attr(id, "tolerance", sp.tolerance);
  h5::write_attr(id, "dot_chunk", sp.chunk);
  h5::write_attr(id, "broadening", sp.broadening);
  h5::write_attr(id, "broadening_rule",
                 std::string("sigma = 0.01 (max - min Ritz value over all chains); "
                             "grid of 1024 points over [min - 8 sigma, max + 8 sigma]"));
  const std::vector<std::int64_t> shape = {std::int64_t(sp.chains), std::int64_t(sp.steps)};
  h5::write_dataset(id, "alpha", sp.alpha, shape);
  h5::write_dataset(id, "beta", sp.beta, shape);
  h5::write_dataset(id, "ritz_values", sp.ritz_values, shape);
  h5::write_dataset(id, "ritz_weights", sp.ritz_weights, shape);
  h5::write_dataset(id, "chain_steps", sp.chain_steps, {std::int64_t(sp.chain_steps.size())});
  h5::write_dataset(id, "chain_stop", sp.chain_stop);
  h5::write_dataset(id, "start_vHv", sp.start_vHv);
  h5::write_dataset(id, "start_Hv_sqnorm", sp.start_Hv_sqnorm);
  h5::write_dataset(id, "top_eigenvalues", sp.top_eigenvalues);
  h5::write_dataset(id, "top_residuals", sp.top_residuals);
  h5::write_dataset(id, "density_grid", sp.density_grid);
  h5::write_dataset(id, "density", sp.density);
  if (sp.eigenvectors.empty()) return;
  const auto k = std::int64_t(sp.eigenvector_residuals.size());
  h5::write_dataset(id, "eigenvectors", sp.eigenvectors, {k, std::int64_t(sp.eigenvectors.size()) / k});
  h5::write_dataset(id, "eigenvector_residuals", sp.eigenvector_residuals);
  for (const auto& [attr, value] : {std::pair<const char*, double>{"G_in_topk", sp.G_in_topk},
                                    {"delta_in_topk", sp.delta_in_topk},
                                    {"topk_overlap_prev", sp.topk_overlap_prev}})
    if (std::isfinite(value)) h5::write_attr(id, attr, value);
}

// SPEC §13's edge-of-stability attributes of a case, where known.
void write_stability(hid_t id, const CaseStatistics& s) {
  for (const auto& [name, value] : {std::pair<const char*, double>{"learning_rate", s.learning_rate},
                                    {"sharpness_ratio", s.sharpness_ratio},
                                    {"sharpness_ratio_adam", s.sharpness_ratio_adam}})
    if (std::isfinite(value)) h5::write_attr(id, name, value);
}

// SPEC §13's landscape group of a case: a group per direction, and the plane.
void write_landscape(hid_t id, const CaseStatistics& s, const std::string& where) {
  h5::Handle lg = h5::create_group(id, "landscape", where);
  for (const LandscapeLine& l : s.landscape) {
    h5::Handle g = h5::create_group(lg.id(), l.direction, where);
    h5::write_dataset(g.id(), "alpha", l.alpha);
    h5::write_dataset(g.id(), "loss", l.loss);
    h5::write_dataset(g.id(), "quadratic", l.quadratic);
    h5::write_attr(g.id(), "unit", l.unit);
    h5::write_attr(g.id(), "unit_norm", l.unit_norm);
    h5::write_attr(g.id(), "slope", l.slope);
    h5::write_attr(g.id(), "curvature", l.curvature);
    h5::write_attr(g.id(), "argmin_alpha", l.argmin_alpha);
    if (std::isfinite(l.predicted_argmin_alpha))
      h5::write_attr(g.id(), "predicted_argmin_alpha", l.predicted_argmin_alpha);
  }
  if (s.plane.x.empty()) return;
  h5::Handle g = h5::create_group(lg.id(), "plane", where);
  h5::write_dataset(g.id(), "alpha", s.plane.alpha);
  h5::write_dataset(g.id(), "beta", s.plane.beta);
  h5::write_dataset(g.id(), "loss", s.plane.loss,
                    {std::int64_t(s.plane.alpha.size()), std::int64_t(s.plane.beta.size())});
  h5::write_dataset(g.id(), "quadratic", s.plane.quadratic,
                    {std::int64_t(s.plane.alpha.size()), std::int64_t(s.plane.beta.size())});
  h5::write_attr(g.id(), "cross_curvature", s.plane.cross_curvature);
  h5::write_attr(g.id(), "alpha_direction", s.plane.x);
  h5::write_attr(g.id(), "beta_direction", s.plane.y);
}

void write_update(hid_t id, const UpdateStatistics& u, const std::string& where) {
  h5::Handle ug = h5::create_group(id, "update", where);
  h5::write_attr(ug.id(), "partner", u.partner);
  h5::write_attr(ug.id(), "delta_sqnorm", u.delta_sqnorm);
  h5::write_attr(ug.id(), "G_dot_delta", u.G_dot_delta);
  h5::write_attr(ug.id(), "dHd", u.dHd);
  h5::write_attr(ug.id(), "predicted_change", u.predicted_change);
  h5::write_attr(ug.id(), "measured_change", u.measured_change);
  h5::write_attr(ug.id(), "curvature_along", u.curvature_along);
}

void write_blocks(hid_t id, const std::vector<BlockTable>& blocks, const std::string& where) {
  h5::Handle bg = h5::create_group(id, "blocks", where);
  for (const BlockTable& t : blocks) {
    h5::Handle pg = h5::create_group(bg.id(), t.partition, where);
    h5::write_dataset(pg.id(), "names", t.names);
    h5::write_dataset(pg.id(), "offsets", t.offsets, {std::int64_t(t.offsets.size())});
    // A column with no finite value (a standard error from one sample) is left out.
    for (const auto& [name, values] : t.columns)
      if (std::any_of(values.begin(), values.end(), [](double v) { return std::isfinite(v); }))
        h5::write_dataset(pg.id(), name, values);
  }
}

// Statistical checks (doc/statistics.md): the p-value and the first step of
// Holm's procedure over the campaign, alpha / family (the merge applies the
// whole procedure).
void write_consistency(hid_t id, const std::vector<ConsistencyCheck>& checks, std::int64_t family) {
  for (const auto& cc : checks) {
    if (!cc.checked) continue;
    h5::write_attr(id, "consistency_" + cc.name + "_deviation", cc.deviation);
    h5::write_attr(id, "consistency_" + cc.name + "_p_value", cc.p_value);
    h5::write_attr(id, "consistency_" + cc.name + "_threshold",
                   kConsistencyAlpha / double(std::max<std::int64_t>(family, 1)));
  }
}

// family: the campaign's consistency checks of each kind (RunInfo).
void write_case(hid_t parent, const CaseRecord& c, std::int64_t family, const std::string& where) {
  const CaseStatistics& s = c.stats;
  h5::Handle g = h5::create_group(parent, c.name, where);
  const hid_t id = g.id();
  h5::write_attr(id, "loss", s.loss);
  h5::write_attr(id, "tokens", s.tokens);
  h5::write_attr(id, "sample_first", c.sample_first);
  h5::write_attr(id, "sample_end", c.sample_end);
  h5::write_attr(id, "tokens_sha256", c.tokens_sha256);
  h5::write_attr(id, "n_blocks", std::int64_t(s.m.n_blocks));
  h5::write_attr(id, "context", std::int64_t(s.m.context));
  h5::write_attr(id, "G_sqnorm", s.m.G_sqnorm);
  h5::write_attr(id, "GHG", s.m.GHG);
  h5::write_attr(id, "noise_batch", std::int64_t(s.m.noise_batch));
  h5::write_attr(id, "noise_batch_tokens", std::int64_t(s.m.noise_batch * s.m.context));
  h5::write_attr(id, "n_noise", std::int64_t(s.noise_blocks.size()));
  h5::write_attr(id, "n_directions", std::int64_t(s.m.vHv.size()));
  // A quantity that cannot be estimated (no noise samples, no directions) is
  // left out rather than written as NaN.
  for (const auto& [name, value] : s.derived.named())
    if (std::isfinite(value)) h5::write_attr(id, name, value);
  bool ok = true;
  for (const auto& idc : s.identities) {
    if (!idc.checked) continue;
    h5::write_attr(id, "identity_" + idc.name + "_deviation", idc.deviation);
    h5::write_attr(id, "identity_" + idc.name + "_tolerance", idc.tolerance);
    ok = ok && idc.ok();
  }
  h5::write_attr(id, "identities_ok", std::int64_t(ok ? 1 : 0));
  write_consistency(id, s.consistency, family);
  h5::write_attr(id, "peak_memory_bytes", s.peak_memory_bytes);
  const std::int64_t m = std::int64_t(s.noise_blocks.size()), B = s.m.noise_batch;
  std::vector<std::int64_t> nb;
  for (const auto& b : s.noise_blocks) nb.insert(nb.end(), b.begin(), b.end());
  h5::write_dataset(id, "noise_blocks", nb, {m, m > 0 ? B : 0});
  h5::write_dataset(id, "gB_sqnorm", s.m.gB_sqnorm);
  h5::write_dataset(id, "xi_sqnorm", s.m.xi_sqnorm);
  h5::write_dataset(id, "G_dot_xi", s.m.G_dot_xi);
  h5::write_dataset(id, "xiHxi", s.m.xiHxi);
  h5::write_dataset(id, "vHv", s.m.vHv);
  if (s.m.gauss_newton) {  // the samples of xiHxi_ggn and trace_ggn
    h5::write_dataset(id, "xiGGNxi", s.m.xiHxi_ggn);
    h5::write_dataset(id, "vGGNv", s.m.vGv_ggn);
  }
  if (!s.m.seq_sqnorm.empty()) {  // analysis.per_sequence: |a_i|^2 and their histogram
    h5::write_dataset(id, "seq_grad_sqnorm", s.m.seq_sqnorm);
    h5::write_dataset(id, "seq_grad_sqnorm_edges", s.derived.seq_hist_edges);
    h5::write_dataset(id, "seq_grad_sqnorm_counts", s.derived.seq_hist_counts,
                      {std::int64_t(s.derived.seq_hist_counts.size())});
  }
  // SPEC §10, where [curvature] asked for them.
  if (!s.m.Hv_sqnorm.empty()) h5::write_dataset(id, "Hv_sqnorm", s.m.Hv_sqnorm);
  if (s.update.present) write_update(id, s.update, where);
  write_stability(id, s);
  if (!s.landscape.empty() || !s.plane.x.empty()) write_landscape(id, s, where);
  if (s.m.preconditioned) {
    h5::write_dataset(id, "xiPxi", s.m.xiPxi);
    h5::write_dataset(id, "PxiHPxi", s.m.PxiHPxi);
  }
  if (!s.hessian_diagonal.empty()) h5::write_dataset(id, "hessian_diagonal", s.hessian_diagonal);
  if (!s.blocks.empty()) write_blocks(id, s.blocks, where);
  if (s.spectrum.present) write_spectrum(id, "spectrum", s.spectrum, where);
  if (s.spectrum_ggn.present) write_spectrum(id, "spectrum_ggn", s.spectrum_ggn, where);
  if (!s.spectrum_blocks.empty()) {
    h5::Handle sb = h5::create_group(id, "spectrum_blocks", where);
    for (const auto& [block, sp] : s.spectrum_blocks) write_spectrum(sb.id(), block, sp, where);
  }
  std::vector<double> t;
  std::vector<std::string> stages;
  for (const auto& [stage, sec] : s.timings) {
    stages.push_back(stage);
    t.push_back(sec);
  }
  h5::write_dataset(id, "timings", t);
  h5::Handle d(H5Dopen2(id, "timings", H5P_DEFAULT));
  h5::write_attr(d.id(), "stages", stages);
  h5::write_attr(d.id(), "units", std::string("seconds"));
  for (const auto& [name, value] : s.measured)
    if (std::isfinite(value)) h5::write_attr(d.id(), name, value);
}

}  // namespace

std::string groups_directory(const std::string& output) { return replace_suffix(output, ".groups"); }
std::string with_suffix(const std::string& output, const std::string& suffix) { return replace_suffix(output, suffix); }

std::string group_file(const std::string& output, const std::string& hash) {
  return groups_directory(output) + "/" + hash + ".h5";
}

std::string csv_path(const std::string& output) { return replace_suffix(output, ".csv"); }

void write_group_file(const std::string& path, const RunInfo& info, const GroupRecord& g) {
  write_atomically(path, [&](const std::string& tmp) {
    h5::File f = h5::File::create(tmp);
    write_root_attrs(f.id(), info, "gnh-group");
    h5::Handle all = h5::create_group(f.id(), "groups", tmp);
    h5::Handle gg = h5::create_group(all.id(), g.hash, tmp);
    h5::write_attr(gg.id(), "aliases", g.aliases);
    h5::write_attr(gg.id(), "alias_paths", g.alias_paths);
    h5::write_attr(gg.id(), "param_sha256", g.param_sha256);
    h5::write_attr(gg.id(), "n_params", g.n_params);
    if (g.iter_num) h5::write_attr(gg.id(), "iter_num", *g.iter_num);
    if (g.step) h5::write_attr(gg.id(), "step", *g.step);
    if (!g.preconditioner.empty()) h5::write_attr(gg.id(), "preconditioner", g.preconditioner);
    // How this group was computed (SPEC section 7): a campaign's groups may
    // come from several runs, and these change the last bits.
    h5::write_attr(gg.id(), "host_gemm", info.host_gemm);
    h5::write_attr(gg.id(), "vector_level", info.vector_level);
    h5::write_attr(gg.id(), "host_threads", std::int64_t(info.host_threads));
    // [curvature] update: the state the update goes to ("" for the last), so
    // that a rerun whose campaign orders the states differently recomputes.
    if (g.ordered) h5::write_attr(gg.id(), "update_partner", g.partner_hash);
    for (const auto& c : g.cases) write_case(gg.id(), c, info.consistency_family, tmp);
    // Written last: a file without it was never finished.
    h5::write_attr(f.id(), "complete", std::int64_t(1));
    f.close();
  });
}

bool group_file_complete(const std::string& path, const std::string& fingerprint, const std::string* partner) {
  if (!std::filesystem::exists(path)) return false;
  try {
    h5::File f = h5::File::open_read(path);
    const auto fp = h5::read_string_attr(f.id(), "settings_fingerprint", path);
    const auto complete = h5::read_int_attr(f.id(), "complete", path);
    if (!(fp && *fp == fingerprint && complete && *complete == 1)) return false;
    if (!partner) return true;
    h5::Handle all = h5::open_group(f.id(), "groups", path);
    const auto hashes = h5::list_children(all.id(), path);
    if (hashes.size() != 1) return false;
    h5::Handle g = h5::open_group(all.id(), hashes.front(), path);
    return h5::read_string_attr(g.id(), "update_partner", path).value_or("\x01") == *partner;
  } catch (const Error&) {
    return false;  // unreadable (e.g. torn by a crash): recompute
  }
}

std::map<std::string, std::string> group_tokens_sha256(const std::string& path) {
  std::map<std::string, std::string> out;
  try {
    h5::File f = h5::File::open_read(path);
    h5::Handle all = h5::open_group(f.id(), "groups", path);
    for (const auto& hash : h5::list_children(all.id(), path)) {
      h5::Handle g = h5::open_group(all.id(), hash, path);
      for (const auto& c : h5::list_children(g.id(), path)) {
        h5::Handle cg = h5::open_group(g.id(), c, path);
        if (const auto t = h5::read_string_attr(cg.id(), "tokens_sha256", path)) out[c] = *t;
      }
    }
  } catch (const Error&) {
    out.clear();
  }
  return out;
}

namespace {
std::vector<std::string> read_string_array_attr(hid_t obj, const std::string& name, const std::string& where) {
  std::vector<std::string> out;
  if (H5Aexists(obj, name.c_str()) <= 0) fail(where, ": missing attribute '", name, "'");
  h5::Handle a(H5Aopen(obj, name.c_str(), H5P_DEFAULT));
  h5::Handle space(H5Aget_space(a.id()));
  const hssize_t n = H5Sget_simple_extent_npoints(space.id());
  std::vector<char*> ptrs(static_cast<std::size_t>(n));
  h5::Handle mem(H5Tcopy(H5T_C_S1));
  H5Tset_size(mem.id(), H5T_VARIABLE);
  H5Tset_cset(mem.id(), H5T_CSET_UTF8);
  if (n > 0 && H5Aread(a.id(), mem.id(), ptrs.data()) < 0) fail(where, ": cannot read attribute '", name, "'");
  for (char* p : ptrs) {
    out.emplace_back(p ? p : "");
    H5free_memory(p);
  }
  return out;
}

std::string kind_text(const std::string& gemm, const std::string& vector_level, std::int64_t threads) {
  return "host_gemm " + gemm + ", vector loops " + vector_level + ", " +
         (threads > 0 ? std::to_string(threads) + " host thread(s)" : std::string("on a device"));
}

std::string kind_of(hid_t group, hid_t root, const std::string& path) {
  auto str = [&](const char* k) {
    return h5::read_string_attr(group, k, path).value_or(h5::read_string_attr(root, k, path).value_or("?"));
  };
  const auto threads = h5::read_int_attr(group, "host_threads", path);
  return kind_text(str("host_gemm"), str("vector_level"),
                   threads ? *threads : h5::read_int_attr(root, "host_threads", path).value_or(0));
}

GroupSummary summary_of(hid_t root, hid_t all, const std::string& hash, const std::string& path) {
  GroupSummary s;
  s.hash = hash;
  h5::Handle g = h5::open_group(all, hash, path);
  s.kernel_kind = kind_of(g.id(), root, path);
  s.iter_num = h5::read_int_attr(g.id(), "iter_num", path);
  s.aliases = read_string_array_attr(g.id(), "aliases", path + ": group " + hash);
  for (const auto& c : h5::list_children(g.id(), path)) {
    h5::Handle cg = h5::open_group(g.id(), c, path);
    std::map<std::string, double>& attrs = s.cases[c];
    const int n = H5Aget_num_attrs(cg.id());
    for (int i = 0; i < n; ++i) {
      char name[256];
      h5::Handle a(H5Aopen_by_idx(cg.id(), ".", H5_INDEX_NAME, H5_ITER_INC, hsize_t(i), H5P_DEFAULT, H5P_DEFAULT));
      H5Aget_name(a.id(), sizeof(name), name);
      h5::Handle type(H5Aget_type(a.id()));
      if (H5Tget_class(type.id()) == H5T_STRING) continue;  // tokens_sha256: not a statistic
      const auto v = h5::read_double_attr(cg.id(), name, path);
      if (v) attrs[name] = *v;
    }
    if (attrs.count("identities_ok") && attrs["identities_ok"] != 1.0) s.identities_ok = false;
  }
  return s;
}
}  // namespace

std::vector<GroupSummary> read_group_summaries(const std::string& path) {
  h5::File f = h5::File::open_read(path);
  h5::Handle all = h5::open_group(f.id(), "groups", path);
  std::vector<GroupSummary> out;
  for (const auto& hash : h5::list_children(all.id(), path)) out.push_back(summary_of(f.id(), all.id(), hash, path));
  return out;
}

std::string kernel_kind(const RunInfo& info) { return kind_text(info.host_gemm, info.vector_level, info.host_threads); }

std::vector<std::string> kernel_kinds(const std::vector<GroupSummary>& groups) {
  std::map<std::string, std::vector<std::string>> by_kind;
  for (const auto& g : groups) by_kind[g.kernel_kind].push_back(g.hash);
  std::vector<std::string> out;
  if (by_kind.size() < 2) return out;
  for (const auto& [kind, hashes] : by_kind) {
    std::string line = kind + ": " + std::to_string(hashes.size()) + " group(s):";
    for (const auto& h : hashes) line += " " + h;
    out.push_back(line);
  }
  return out;
}

GroupSummary read_group_summary(const std::string& path) {
  auto all = read_group_summaries(path);
  if (all.size() != 1) fail(path, ": expected one group, found ", all.size());
  return all.front();
}

RunInfo read_run_info(const std::string& path) {
  h5::File f = h5::File::open_read(path);
  const hid_t r = f.id();
  auto str = [&](const char* k) {
    auto v = h5::read_string_attr(r, k, path);
    if (!v) fail(path, ": missing root attribute '", k, "'");
    return *v;
  };
  RunInfo ri;
  ri.deck_text = str("deck");
  ri.effective_deck = str("deck_effective");
  ri.settings_fingerprint = str("settings_fingerprint");
  ri.model_config = str("model_config");
  ri.run_name = str("run_name");
  ri.precision = str("precision");
  ri.shard = str("shard");
  ri.ranks = int(h5::read_int_attr(r, "ranks", path).value_or(1));
  ri.ranks_per_checkpoint = int(h5::read_int_attr(r, "ranks_per_checkpoint", path).value_or(1));
  ri.parameter_shards = int(h5::read_int_attr(r, "parameter_shards", path).value_or(1));
  ri.parameter_shard_bounds = h5::read_int_array_attr(r, "parameter_shard_bounds", path);
  ri.campaign_checkpoints = read_string_array_attr(r, "campaign_checkpoints", path);
  ri.host_gemm = h5::read_string_attr(r, "host_gemm", path).value_or("");
  ri.host_gemm_probe = h5::read_string_attr(r, "host_gemm_probe", path).value_or("");
  ri.adjoint_cuts = h5::read_string_attr(r, "adjoint_cuts", path).value_or("");
  ri.adjoint_cuts_engines = h5::read_string_attr(r, "adjoint_cuts_engines", path).value_or("");
  ri.host_threads = int(h5::read_int_attr(r, "host_threads", path).value_or(0));
  ri.vector_level = h5::read_string_attr(r, "vector_level", path).value_or("");
  ri.strict_kernels = h5::read_int_attr(r, "strict_kernels", path).value_or(0) != 0;
  ri.consistency_family = h5::read_int_attr(r, "consistency_family", path).value_or(0);
  return ri;
}

namespace {

// Whether every link of `path` (a/b/c) exists below `loc`.
bool path_exists(hid_t loc, const std::string& path) {
  std::string at;
  std::stringstream parts(path);
  for (std::string p; std::getline(parts, p, '/');) {
    at += (at.empty() ? "" : "/") + p;
    if (H5Lexists(loc, at.c_str(), H5P_DEFAULT) <= 0) return false;
  }
  return true;
}

// |U_a^T U_b|_F^2 / k of two (k, n) float datasets, read in column blocks
// (bounded memory at any n); NaN where either is absent or their shapes differ.
double subspace_overlap(hid_t file, const std::string& a, const std::string& b) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  if (!path_exists(file, a) || !path_exists(file, b)) return nan;
  h5::Handle da(H5Dopen2(file, a.c_str(), H5P_DEFAULT)), db(H5Dopen2(file, b.c_str(), H5P_DEFAULT));
  const std::vector<std::int64_t> sa = h5::dataset_shape(da.id()), sb = h5::dataset_shape(db.id());
  if (sa.size() != 2 || sa != sb || sa[0] == 0) return nan;
  const hsize_t k = hsize_t(sa[0]), n = hsize_t(sa[1]), block = hsize_t(1) << 20;
  std::vector<double> m(k * k, 0.0);
  std::vector<float> xa, xb;
  for (hsize_t c0 = 0; c0 < n; c0 += block) {
    const hsize_t len = std::min(block, n - c0);
    xa.resize(k * len);
    xb.resize(k * len);
    for (auto [d, x] : {std::pair<hid_t, float*>{da.id(), xa.data()}, {db.id(), xb.data()}}) {
      h5::Handle file_space(H5Dget_space(d));
      const hsize_t start[2] = {0, c0}, count[2] = {k, len};
      H5Sselect_hyperslab(file_space.id(), H5S_SELECT_SET, start, nullptr, count, nullptr);
      h5::Handle mem(H5Screate_simple(2, count, nullptr));
      if (H5Dread(d, H5T_NATIVE_FLOAT, mem.id(), file_space.id(), H5P_DEFAULT, x) < 0)
        fail("cannot read ", a, " or ", b, " for topk_overlap_prev");
    }
    for (hsize_t i = 0; i < k; ++i)
      for (hsize_t j = 0; j < k; ++j) {
        double s = 0;
        for (hsize_t l = 0; l < len; ++l) s += double(xa[i * len + l]) * double(xb[j * len + l]);
        m[i * k + j] += s;
      }
  }
  double f = 0;
  for (const double v : m) f += v * v;
  return f / double(k);
}

// SPEC section 10's topk_overlap_prev: on each state's spectra with
// eigenvectors, the overlap with those of the previous state by iter_num
// (states without iter_num have no order and get none).
void topk_overlaps(hid_t file, const std::vector<GroupSummary>& summaries) {
  std::vector<const GroupSummary*> ordered;
  for (const auto& s : summaries)
    if (s.iter_num) ordered.push_back(&s);
  std::stable_sort(ordered.begin(), ordered.end(),
                   [](const GroupSummary* a, const GroupSummary* b) { return *a->iter_num < *b->iter_num; });
  for (std::size_t i = 1; i < ordered.size(); ++i) {
    const GroupSummary &a = *ordered[i - 1], &b = *ordered[i];
    if (*a.iter_num == *b.iter_num) continue;
    for (const auto& [cname, attrs] : b.cases)
      for (const char* kind : {"spectrum", "spectrum_ggn"}) {
        const std::string tail = "/" + cname + "/" + kind;
        const double o = subspace_overlap(file, "groups/" + a.hash + tail + "/eigenvectors",
                                          "groups/" + b.hash + tail + "/eigenvectors");
        if (!std::isfinite(o)) continue;
        h5::Handle g(H5Gopen2(file, ("groups/" + b.hash + tail).c_str(), H5P_DEFAULT));
        h5::write_attr(g.id(), "topk_overlap_prev", o);
      }
  }
}

// Holm's procedure over the file's consistency checks, at the campaign-wide
// rate (doc/statistics.md): the checks it flags, one line each.
std::vector<std::string> consistency_alarms(const std::vector<GroupSummary>& summaries, std::int64_t family) {
  const std::string prefix = "consistency_", suffix = "_p_value";
  std::vector<double> p;
  std::vector<std::string> what;
  for (const auto& s : summaries)
    for (const auto& [cname, attrs] : s.cases)
      for (const auto& [name, value] : attrs) {
        if (name.rfind(prefix, 0) != 0 || name.size() <= prefix.size() + suffix.size() ||
            name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0)
          continue;
        const std::string check = name.substr(prefix.size(), name.size() - prefix.size() - suffix.size());
        const auto dev = attrs.find(prefix + check + "_deviation");
        char line[160];
        std::snprintf(line, sizeof(line), ": p = %.3g, deviation %.3g", value,
                      dev == attrs.end() ? std::nan("") : dev->second);
        p.push_back(value);
        what.push_back("group " + s.hash + " case " + cname + " " + check + line);
      }
  const std::vector<bool> reject =
      holm_rejections(p, kConsistencyAlpha, std::size_t(std::max<std::int64_t>(family, 0)));
  std::vector<std::string> out;
  for (std::size_t i = 0; i < p.size(); ++i)
    if (reject[i]) out.push_back(what[i]);
  return out;
}

// The groups of each kernel kind and the flagged consistency checks, as notes.
void print_merge_notes(const std::string& output, const std::vector<std::string>& kinds,
                       const std::vector<std::string>& alarms) {
  if (!alarms.empty()) {
    std::printf(
        "gnh: note: %zu statistical consistency check(s) of %s fall below the campaign-wide threshold "
        "(Holm, false-alarm rate %g over the campaign; a sign to look, not an identity):\n",
        alarms.size(), output.c_str(), kConsistencyAlpha);
    for (const auto& a : alarms) std::printf("  %s\n", a.c_str());
    std::fflush(stdout);
  }
  if (!kinds.empty()) {
    std::printf(
        "gnh: note: %s holds groups computed in %zu ways (their last bits differ; run.strict_kernels = "
        "true refuses this):\n",
        output.c_str(), kinds.size());
    for (const auto& k : kinds) std::printf("  %s\n", k.c_str());
    std::fflush(stdout);
  }
}

}  // namespace

void merge_results(const std::string& output, const RunInfo& info, const std::vector<std::string>& sources,
                   const std::vector<std::string>& expected) {
  std::vector<GroupSummary> summaries;
  std::vector<std::string> origin;
  for (const auto& p : sources)
    for (auto& g : read_group_summaries(p)) {
      summaries.push_back(std::move(g));
      origin.push_back(p);
    }
  std::set<std::string> present;
  for (const auto& s : summaries) present.insert(s.aliases.begin(), s.aliases.end());
  std::vector<std::string> missing;
  for (const auto& name : expected)
    if (!present.count(name)) missing.push_back(name);
  bool all_ok = true;
  for (const auto& s : summaries) all_ok = all_ok && s.identities_ok;
  const std::vector<std::string> kinds = kernel_kinds(summaries);
  const std::vector<std::string> alarms = consistency_alarms(summaries, info.consistency_family);
  print_merge_notes(output, kinds, alarms);
  write_atomically(output, [&](const std::string& tmp) {
    h5::File f = h5::File::create(tmp);
    write_root_attrs(f.id(), info, "gnh-results");
    // One line per kind when the groups were computed in more than one way.
    h5::write_attr(f.id(), "kernel_kinds", kinds);
    h5::write_attr(f.id(), "consistency_alarms", alarms);
    h5::write_attr(f.id(), "identities_ok", std::int64_t(all_ok ? 1 : 0));
    // Whether every checkpoint this file was asked to hold is in it.
    h5::write_attr(f.id(), "complete", std::int64_t(missing.empty() ? 1 : 0));
    h5::write_attr(f.id(), "missing_checkpoints", missing);
    h5::Handle all = h5::create_group(f.id(), "groups", tmp);
    for (std::size_t i = 0; i < summaries.size(); ++i) {
      h5::File src = h5::File::open_read(origin[i]);
      const std::string name = "groups/" + summaries[i].hash;
      if (H5Ocopy(src.id(), name.c_str(), f.id(), name.c_str(), H5P_DEFAULT, H5P_DEFAULT) < 0)
        fail(origin[i], ": cannot copy ", name, " into ", output);
    }
    topk_overlaps(f.id(), summaries);
    f.close();
  });
  // CSV: one row per checkpoint file name and case.
  const std::string csv = csv_path(output);
  {
    std::ostringstream out;
    std::vector<std::string> columns = {"loss", "tokens", "sample_first", "sample_end", "G_sqnorm", "GHG"};
    for (const auto& [name, value] : DerivedStatistics().named()) columns.push_back(name);
    columns.push_back("noise_batch");
    columns.push_back("n_noise");
    columns.push_back("n_directions");
    columns.push_back("identities_ok");
    out << "checkpoint,group,iter_num,case";
    for (const auto& c : columns) out << "," << c;
    out << "\n" << std::setprecision(17);
    for (const auto& s : summaries)
      for (const auto& alias : s.aliases)
        for (const auto& [cname, attrs] : s.cases) {
          out << alias << "," << s.hash << "," << (s.iter_num ? std::to_string(*s.iter_num) : "") << "," << cname;
          for (const auto& c : columns) {
            auto it = attrs.find(c);
            out << ",";
            if (it != attrs.end()) out << it->second;
          }
          out << "\n";
        }
    write_file_atomically(csv, out.str());
  }
}

}  // namespace gnh
