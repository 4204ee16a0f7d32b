// SPDX-License-Identifier: BSD-3-Clause
#include "driver/merge.hpp"

#include <CLI/CLI.hpp>
#include <memory>
#include <cmath>
#include <cstdio>
#include <map>
#include <set>

#include "driver/campaign.hpp"
#include "io/hdf5.hpp"
#include "io/results.hpp"

namespace gnh {
namespace {

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}

struct ShardHeader {
  std::string path, format, fingerprint, version, commit;
  RunInfo info;
};

ShardHeader read_header(const std::string& path) {
  ShardHeader h;
  h.path = path;
  {
    h5::File f = h5::File::open_read(path);
    h.format = h5::read_string_attr(f.id(), "format", path).value_or("");
    if (h.format != "gnh-results") fail(path, ": not a gnh results or shard file (format \"", h.format, "\")");
    h.version = h5::read_string_attr(f.id(), "gnh_version", path).value_or("");
    h.commit = h5::read_string_attr(f.id(), "git_commit", path).value_or("");
  }
  h.info = read_run_info(path);
  h.fingerprint = h.info.settings_fingerprint;
  return h;
}

// Re-checks the identities recorded in one case from its datasets and
// attributes; returns those whose recorded deviation exceeds its tolerance,
// as "where: identity_<name> = deviation > tolerance".
std::vector<std::string> recheck_case(hid_t cg, const std::string& where) {
  auto attr = [&](const char* k) {
    auto v = h5::read_double_attr(cg, k, where);
    if (!v) fail(where, ": incomplete (no attribute '", k, "')");
    return *v;
  };
  const double G2 = attr("G_sqnorm");
  // trace_H and the noise quantities are absent where a campaign asked for
  // no directions or no noise samples: such a campaign merges too.
  for (const char* k : {"loss", "GHG", "identities_ok"}) attr(k);
  auto dataset = [&](const char* name) {
    if (!h5::exists(cg, name)) fail(where, ": incomplete (no dataset '", name, "')");
    h5::Handle d(H5Dopen2(cg, name, H5P_DEFAULT));
    const auto shape = h5::dataset_shape(d.id());
    std::vector<double> v(shape.empty() ? 0 : static_cast<std::size_t>(shape[0]));
    if (!v.empty() && H5Dread(d.id(), H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data()) < 0)
      fail(where, ": cannot read dataset '", name, "'");
    return v;
  };
  const auto g2 = dataset("gB_sqnorm"), x2 = dataset("xi_sqnorm"), gx = dataset("G_dot_xi");
  dataset("xiHxi");
  dataset("vHv");
  for (std::size_t j = 0; j < g2.size(); ++j) {
    const double dev = std::abs(g2[j] - (G2 + 2 * gx[j] + x2[j])) / g2[j];
    if (!(dev <= 1e-10))
      fail(where, ": noise sample ", j, " violates |g|^2 = |G|^2 + 2 G.xi + |xi|^2 (relative deviation ", dev, ")");
  }
  std::vector<std::string> failed;
  const int n = H5Aget_num_attrs(cg);
  for (int i = 0; i < n; ++i) {
    char name[256];
    h5::Handle a(H5Aopen_by_idx(cg, ".", H5_INDEX_NAME, H5_ITER_INC, hsize_t(i), H5P_DEFAULT, H5P_DEFAULT));
    H5Aget_name(a.id(), sizeof(name), name);
    const std::string s = name;
    const std::string suffix = "_deviation";
    if (s.rfind("identity_", 0) != 0 || s.size() < suffix.size() || s.substr(s.size() - suffix.size()) != suffix)
      continue;
    const std::string base = s.substr(0, s.size() - suffix.size());
    const double dev = attr(s.c_str()), tol = attr((base + "_tolerance").c_str());
    if (!(dev <= tol)) {
      char buf[96];
      std::snprintf(buf, sizeof(buf), " = %.3e > tolerance %.1e", dev, tol);
      failed.push_back(where + ": " + base + buf);
    }
  }
  if (failed.empty() && attr("identities_ok") != 1.0) failed.push_back(where + ": identities_ok = 0");
  return failed;
}

// Why two shards' settings fingerprints differ, as far as their records tell.
std::string settings_difference(const RunInfo& a, const RunInfo& b) {
  if (a.effective_deck == b.effective_deck && a.adjoint_cuts_engines != b.adjoint_cuts_engines)
    return "adjoint cuts " + a.adjoint_cuts_engines + " with GNH_ADJOINT_CUTS=" + a.adjoint_cuts + ", against " +
           b.adjoint_cuts_engines + " with GNH_ADJOINT_CUTS=" + b.adjoint_cuts +
           "; run every shard with the same GNH_ADJOINT_CUTS";
  return "shards of different decks or settings";
}

// run.strict_kernels: every group of one kernel kind (host GEMM, vector level,
// threads), or no merge.
void refuse_mixed_kernels(const std::vector<ShardHeader>& headers) {
  std::vector<GroupSummary> groups;
  bool strict = false;
  for (const auto& h : headers) {
    strict = strict || h.info.strict_kernels;
    for (auto& g : read_group_summaries(h.path)) groups.push_back(std::move(g));
  }
  const std::vector<std::string> kinds = kernel_kinds(groups);
  if (!strict || kinds.empty()) return;
  std::string list;
  for (const auto& k : kinds) list += "\n  " + k;
  fail("cannot merge: run.strict_kernels = true, and the shards' groups were computed in ", kinds.size(),
       " ways:", list, "\n(recompute the groups of one kind with GNH_HOST_GEMM set to the other's kernel)");
}

void validate_and_merge(const MergeOptions& opt) {
  if (opt.shards.empty()) fail("gnh merge: no shard files given");
  std::vector<ShardHeader> headers;
  for (const auto& p : opt.shards) headers.push_back(read_header(p));
  const ShardHeader& first = headers.front();
  for (const auto& h : headers) {
    if (h.fingerprint != first.fingerprint)
      fail(h.path, ": settings fingerprint ", h.fingerprint, " differs from ", first.path, "'s ", first.fingerprint,
           " (", settings_difference(h.info, first.info), ")");
    if (h.version != first.version || h.commit != first.commit)
      fail(h.path, ": written by gnh ", h.version, " (", h.commit, "), ", first.path, " by gnh ", first.version, " (",
           first.commit, "); merge shards of one code version");
    if (!same_host_threads(h.info, first.info))
      fail(h.path, ": computed with ", h.info.host_threads, " host thread(s) per rank, ", first.path, " with ",
           first.info.host_threads,
           " (a host build's dot products are summed per thread: their last bits differ); "
           "run every shard with the same OMP_NUM_THREADS");
    if (h.info.campaign_checkpoints != first.info.campaign_checkpoints)
      fail(h.path, ": lists a different set of campaign checkpoints from ", first.path);
  }
  // Coverage: every checkpoint file name exactly once, every group complete.
  std::map<std::string, std::string> seen;  // checkpoint name -> shard
  std::map<std::string, std::string> group_seen;
  std::set<std::string> case_names;
  std::vector<std::string> failed_identities;
  for (const auto& h : headers) {
    h5::File f = h5::File::open_read(h.path);
    h5::Handle all = h5::open_group(f.id(), "groups", h.path);
    for (const auto& hash : h5::list_children(all.id(), h.path)) {
      if (group_seen.count(hash)) fail("group ", hash, " appears in both ", group_seen[hash], " and ", h.path);
      group_seen[hash] = h.path;
      h5::Handle g = h5::open_group(all.id(), hash, h.path);
      const auto cases = h5::list_children(g.id(), h.path);
      if (case_names.empty()) case_names.insert(cases.begin(), cases.end());
      if (std::set<std::string>(cases.begin(), cases.end()) != case_names)
        fail(h.path, ": group ", hash, " has cases {", join(cases), "}, expected {",
             join(std::vector<std::string>(case_names.begin(), case_names.end())), "}");
      for (const auto& c : cases) {
        h5::Handle cg = h5::open_group(g.id(), c, h.path);
        for (auto& f : recheck_case(cg.id(), h.path + ": group " + hash + " case " + c))
          failed_identities.push_back(std::move(f));
      }
    }
    for (const auto& s : read_group_summaries(h.path))
      for (const auto& a : s.aliases) {
        if (seen.count(a)) fail("checkpoint ", a, " appears in both ", seen[a], " and ", h.path);
        seen[a] = h.path;
      }
  }
  std::vector<std::string> missing;
  for (const auto& name : first.info.campaign_checkpoints)
    if (!seen.count(name)) missing.push_back(name);
  if (!missing.empty())
    fail("cannot merge: ", missing.size(), " of ", first.info.campaign_checkpoints.size(),
         " checkpoint(s) are in none of the shards: ", join(missing),
         " (a shard is missing or incomplete; resubmit it and merge again)");
  for (const auto& [name, shard] : seen)
    if (std::find(first.info.campaign_checkpoints.begin(), first.info.campaign_checkpoints.end(), name) ==
        first.info.campaign_checkpoints.end())
      fail(shard, ": checkpoint ", name, " is not part of the campaign");
  refuse_mixed_kernels(headers);
  if (!failed_identities.empty()) {
    std::string list;
    for (const auto& f : failed_identities) list += "\n  " + f;
    if (!opt.accept_failed_identities)
      fail("cannot merge: ", failed_identities.size(), " recorded identity check(s) failed:", list,
           "\n(recompute those groups, or pass --accept-failed-identities to merge them anyway; that is recorded "
           "in the output)");
    std::fprintf(stderr, "gnh: WARNING: merging %zu failed identity check(s) (--accept-failed-identities):%s\n",
                 failed_identities.size(), list.c_str());
  }
  RunInfo info = first.info;
  info.shard = "merged from " + std::to_string(headers.size()) + " shard(s)";
  info.accepted_failed_identities = failed_identities;
  merge_results(opt.output, info, opt.shards, first.info.campaign_checkpoints);
  std::printf("gnh: merged %zu shard(s), %zu group(s), %zu checkpoint file(s) into %s\n", headers.size(),
              group_seen.size(), seen.size(), opt.output.c_str());
  std::fflush(stdout);
}

}  // namespace

int merge_command(const Comm& comm, const MergeOptions& opt) {
  // One writer: rank 0 validates and merges; errors reach every rank.
  comm.collective([&] {
    if (comm.rank() == 0) validate_and_merge(opt);
  });
  return 0;
}

Subcommand add_merge_command(CLI::App& gnh) {
  auto opt = std::make_shared<MergeOptions>();
  CLI::App* cmd = gnh.add_subcommand(
      "merge",
      "Validate the shard outputs of a planned campaign (one settings fingerprint and code version, every "
      "checkpoint exactly once, every group complete, identities re-checked) and combine them");
  cmd->add_option("output", opt->output, "Combined results file to write")->required();
  cmd->add_option("shards", opt->shards, "Shard result files (OUTPUT.shard-I-of-N.h5)")->required();
  cmd->add_flag("--accept-failed-identities", opt->accept_failed_identities,
                "Merge shards whose recorded identity checks failed (refused otherwise); the failed checks are "
                "listed in the output's accepted_failed_identities attribute");
  return {cmd, [opt](const Comm& comm) { return merge_command(comm, *opt); }};
}

}  // namespace gnh
