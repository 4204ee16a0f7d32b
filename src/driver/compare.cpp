// SPDX-License-Identifier: BSD-3-Clause
#include "driver/compare.hpp"

#include <CLI/CLI.hpp>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <iomanip>
#include <map>
#include <memory>
#include <sstream>

#include "analysis/analyser.hpp"
#include "analysis/team.hpp"
#include "core/deal.hpp"
#include "core/build_info.hpp"
#include "driver/campaign.hpp"
#include "io/files.hpp"
#include "io/checkpoint.hpp"
#include "io/hdf5.hpp"
#include "io/results.hpp"
#include "parallel/pack.hpp"

namespace gnh {
namespace {

// The statistics whose relative error decides pass/fail (each within the
// tolerance, 5% by default: doc/precision.md).
const std::vector<std::string> kRequested = {"loss",         "G_sqnorm", "GHG",      "trace_sigma",
                                             "trace_HSigma", "trace_H",  "B_simple", "B_noise"};
const std::vector<std::string> kArrays = {"gB_sqnorm", "xi_sqnorm", "G_dot_xi", "xiHxi", "vHv"};

// One case compared: named scalars and per-sample arrays, as written.
struct CaseComparison {
  std::map<std::string, double> scalars;
  std::map<std::string, std::vector<double>> arrays;
};
Pack& operator<<(Pack& p, const CaseComparison& c) { return p << c.scalars << c.arrays; }
Unpack& operator>>(Unpack& u, CaseComparison& c) { return u >> c.scalars >> c.arrays; }

struct PolicyResult {
  CaseStatistics stats;
  CaseVectors vectors;
  std::vector<double> cross;  // this policy's H on the reference policy's xi_j (candidate only)
};

std::map<std::string, double> scalars_of(const CaseStatistics& s) {
  std::map<std::string, double> m = {{"loss", s.loss}, {"G_sqnorm", s.m.G_sqnorm}, {"GHG", s.m.GHG}};
  for (const auto& [name, v] : s.derived.named()) m[name] = v;
  return m;
}

std::map<std::string, std::vector<double>> arrays_of(const CaseStatistics& s) {
  return {{"gB_sqnorm", s.m.gB_sqnorm},
          {"xi_sqnorm", s.m.xi_sqnorm},
          {"G_dot_xi", s.m.G_dot_xi},
          {"xiHxi", s.m.xiHxi},
          {"vHv", s.m.vHv}};
}

double rel_err(double got, double want) { return std::abs(got - want) / std::abs(want); }

void l2_and_cosine(const std::vector<double>& a, const std::vector<double>& b, double& rel_l2, double& cosine) {
  double dd = 0, aa = 0, bb = 0, ab = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    dd += (b[i] - a[i]) * (b[i] - a[i]);
    aa += a[i] * a[i];
    bb += b[i] * b[i];
    ab += a[i] * b[i];
  }
  rel_l2 = std::sqrt(dd / aa);
  cosine = ab / std::sqrt(aa * bb);
}

// One policy on one case; with `cross_dirs`, also this policy's Hessian on those directions.
PolicyResult run_policy(Precision policy, const Deck& deck, const ModelConfig& cfg, const std::vector<float>& params,
                        const LoadedCase& c, const CaseTokens& tk, const std::vector<std::vector<double>>* cross_dirs) {
  AnalysisSettings s = deck.analysis;
  s.precision = policy;
  Analyser analyser(cfg, s);
  analyser.set_parameters(params);
  SoloTeam team;
  PolicyResult r;
  CaseHooks hooks;
  hooks.keep = &r.vectors;
  hooks.block_stride = c.stride;
  r.stats = analyser.analyse(team, tk.ids, tk.blocks, hooks);
  if (cross_dirs && !cross_dirs->empty()) r.cross = analyser.curvature_along(*cross_dirs, tk.ids, tk.blocks, c.stride);
  return r;
}

CaseComparison compare_case(const PolicyResult& a, const PolicyResult& b, double tol) {
  CaseComparison j;
  const auto sa = scalars_of(a.stats), sb = scalars_of(b.stats);
  double worst = 0;
  for (const auto& [name, va] : sa) {
    const double vb = sb.at(name);
    j.scalars["ref_" + name] = va;
    j.scalars["cand_" + name] = vb;
    j.scalars["rel_err_" + name] = rel_err(vb, va);
    j.scalars["sign_agree_" + name] = (va > 0) == (vb > 0) ? 1.0 : 0.0;
  }
  for (const auto& name : kRequested) worst = std::max(worst, rel_err(sb.at(name), sa.at(name)));
  const auto aa = arrays_of(a.stats), ab = arrays_of(b.stats);
  for (const auto& name : kArrays) {
    const auto& x = aa.at(name);
    const auto& y = ab.at(name);
    double m = 0, agree = 0;
    std::vector<double> e;
    for (std::size_t i = 0; i < x.size(); ++i) {
      e.push_back(rel_err(y[i], x[i]));
      m = std::max(m, e.back());
      agree += (x[i] > 0) == (y[i] > 0) ? 1 : 0;
    }
    j.arrays["rel_err_" + name] = e;
    j.scalars["rel_err_max_" + name] = m;
    j.scalars["sign_agree_fraction_" + name] = x.empty() ? 1.0 : agree / double(x.size());
  }
  double g_l2 = 0, g_cos = 0;
  l2_and_cosine(a.vectors.G, b.vectors.G, g_l2, g_cos);
  j.scalars["G_rel_l2"] = g_l2;
  j.scalars["G_cosine"] = g_cos;
  std::vector<double> xl2, xcos, cross;
  double worst_cross = 0;
  for (std::size_t k = 0; k < a.vectors.xi.size(); ++k) {
    double l2 = 0, cs = 0;
    l2_and_cosine(a.vectors.xi[k], b.vectors.xi[k], l2, cs);
    xl2.push_back(l2);
    xcos.push_back(cs);
    cross.push_back(rel_err(b.cross[k], a.stats.m.xiHxi[k]));
    worst_cross = std::max(worst_cross, cross.back());
  }
  j.arrays["xi_rel_l2"] = xl2;
  j.arrays["xi_cosine"] = xcos;
  j.arrays["xiHxi_cand_on_ref_xi"] = b.cross;
  j.arrays["xiHxi_cand_on_ref_xi_rel_err"] = cross;
  j.scalars["rel_err_max_xiHxi_cand_on_ref_xi"] = worst_cross;
  j.scalars["max_rel_err_requested"] = worst;
  j.scalars["tolerance"] = tol;
  j.scalars["pass"] = worst <= tol ? 1.0 : 0.0;
  for (const auto& [tag, r] : {std::pair<const char*, const PolicyResult*>{"ref", &a}, {"cand", &b}}) {
    j.scalars[std::string("time_s_") + tag] = r->stats.timings.back().second;
    j.scalars[std::string("peak_memory_bytes_") + tag] = double(r->stats.peak_memory_bytes);
  }
  return j;
}

// Every comparison of this rank's share of the groups, packed as (hash,
// case -> comparison); a group that fails is reported and left out.
Pack compare_my_groups(const Comm& comm, const Campaign& c, Precision reference, Precision candidate,
                       const CompareOptions& opt, std::string& error) {
  Pack mine;
  for (const index_t g : dealt_share(index_t(c.groups.size()), comm.size(), comm.rank())) {
    const GroupRecord& grp = c.groups[std::size_t(g)];
    try {
      const Checkpoint ck = read_checkpoint(grp.alias_paths.front());
      std::map<std::string, CaseComparison> cases;
      for (const auto& cs : c.cases) {
        const CaseTokens tk = case_tokens(c, cs, grp);
        const PolicyResult ref = run_policy(reference, c.deck, c.cfg, ck.params, cs, tk, nullptr);
        const PolicyResult cand = run_policy(candidate, c.deck, c.cfg, ck.params, cs, tk, &ref.vectors.xi);
        const CaseComparison jc = compare_case(ref, cand, opt.tolerance);
        if (!opt.quiet) {
          std::printf("gnh: [rank %d] %s %-6s largest relative error %.3e (%s), G cosine %.6f\n", comm.rank(),
                      grp.hash.c_str(), cs.name.c_str(), jc.scalars.at("max_rel_err_requested"),
                      jc.scalars.at("pass") == 1.0 ? "pass" : "FAIL", jc.scalars.at("G_cosine"));
          std::fflush(stdout);
        }
        cases[cs.name] = jc;
      }
      mine << grp.hash << cases;
    } catch (const Error& e) {
      error = e.what();
      std::fprintf(stderr, "gnh: error: [rank %d] group %s (%s): %s\n", comm.rank(), grp.hash.c_str(),
                   grp.aliases.front().c_str(), e.what());
    }
  }
  return mine;
}

using Comparisons = std::map<std::string, std::map<std::string, CaseComparison>>;  // hash -> case -> comparison

Comparisons unpack_comparisons(const std::vector<std::string>& gathered) {
  Comparisons by_hash;
  for (const auto& bytes : gathered)
    for (Unpack u(bytes); !u.done();) {
      std::string hash;
      u >> hash;
      u >> by_hash[hash];
    }
  return by_hash;
}

// OUTPUT.compare.h5: the run's provenance, then per group and case every
// comparison's scalars (attributes) and arrays (datasets).
void write_comparison_h5(const std::string& out, const Campaign& c, const CompareOptions& opt, Comparisons& by_hash) {
  write_atomically(out, [&](const std::string& tmp) {
    h5::File f = h5::File::create(tmp);
    h5::write_attr(f.id(), "format", std::string("gnh-compare"));
    h5::write_attr(f.id(), "format_version", std::int64_t(1));
    h5::write_attr(f.id(), "gnh_version", std::string(version()));
    h5::write_attr(f.id(), "git_commit", std::string(git_commit()));
    h5::write_attr(f.id(), "build", build_configuration());
    h5::write_attr(f.id(), "host_gemm", c.info.host_gemm);
    if (!c.info.host_gemm_probe.empty()) h5::write_attr(f.id(), "host_gemm_probe", c.info.host_gemm_probe);
    h5::write_attr(f.id(), "adjoint_cuts", c.info.adjoint_cuts);
    h5::write_attr(f.id(), "adjoint_cuts_engines", c.info.adjoint_cuts_engines);
    h5::write_attr(f.id(), "host_threads", std::int64_t(c.info.host_threads));
    h5::write_attr(f.id(), "deck", c.deck.source_text);
    h5::write_attr(f.id(), "deck_effective", c.deck.effective_text);
    h5::write_attr(f.id(), "policies", opt.policies);
    h5::write_attr(f.id(), "reference_policy", opt.policies[0]);
    h5::write_attr(f.id(), "candidate_policy", opt.policies[1]);
    h5::write_attr(f.id(), "tolerance", opt.tolerance);
    h5::write_attr(f.id(), "requested_statistics", kRequested);
    h5::Handle all = h5::create_group(f.id(), "groups", tmp);
    for (const auto& grp : c.groups) {
      if (!by_hash.count(grp.hash)) continue;
      h5::Handle gg = h5::create_group(all.id(), grp.hash, tmp);
      h5::write_attr(gg.id(), "aliases", grp.aliases);
      for (const auto& [cname, jc] : by_hash[grp.hash]) {
        h5::Handle cg = h5::create_group(gg.id(), cname, tmp);
        for (const auto& [k, v] : jc.scalars) h5::write_attr(cg.id(), k, v);
        for (const auto& [k, v] : jc.arrays) h5::write_dataset(cg.id(), k, v);
      }
    }
    f.close();
  });
}

// OUTPUT.compare.csv: one row per checkpoint and case.
void write_comparison_csv(const std::string& csv, const Campaign& c, Comparisons& by_hash) {
  std::ostringstream o;
  {
    const std::vector<std::string> cols = {"pass",
                                           "max_rel_err_requested",
                                           "G_rel_l2",
                                           "G_cosine",
                                           "rel_err_max_xiHxi_cand_on_ref_xi",
                                           "time_s_ref",
                                           "time_s_cand",
                                           "peak_memory_bytes_ref",
                                           "peak_memory_bytes_cand"};
    o << "checkpoint,group,case";
    for (const auto& k : cols) o << "," << k;
    for (const auto& k : kRequested) o << ",rel_err_" << k << ",sign_agree_" << k;
    o << "\n" << std::setprecision(10);
    for (const auto& grp : c.groups) {
      if (!by_hash.count(grp.hash)) continue;
      for (const auto& alias : grp.aliases)
        for (const auto& [cname, jc] : by_hash[grp.hash]) {
          o << alias << "," << grp.hash << "," << cname;
          for (const auto& k : cols) o << "," << jc.scalars.at(k);
          for (const auto& k : kRequested)
            o << "," << jc.scalars.at("rel_err_" + k) << "," << jc.scalars.at("sign_agree_" + k);
          o << "\n";
        }
    }
  }
  write_file_atomically(csv, o.str());
}

void print_comparison_table(const Campaign& c, Comparisons& by_hash) {
  std::printf("\n%-22s %-7s %-5s %12s %12s %12s\n", "checkpoint", "case", "pass", "max rel err", "G cosine",
              "cross xiHxi");
  for (const auto& grp : c.groups) {
    if (!by_hash.count(grp.hash)) continue;
    for (const auto& alias : grp.aliases)
      for (const auto& [cname, jc] : by_hash[grp.hash]) {
        const auto& s = jc.scalars;
        std::printf("%-22s %-7s %-5s %12.3e %12.8f %12.3e\n", alias.c_str(), cname.c_str(),
                    s.at("pass") == 1.0 ? "pass" : "FAIL", s.at("max_rel_err_requested"), s.at("G_cosine"),
                    s.at("rel_err_max_xiHxi_cand_on_ref_xi"));
      }
  }
}

// Rank 0: the gathered comparisons into OUTPUT.compare.h5 and .csv, and the table.
void write_comparisons(const Campaign& c, const CompareOptions& opt, const std::vector<std::string>& gathered) {
  Comparisons by_hash = unpack_comparisons(gathered);
  const std::string out = with_suffix(c.output, ".compare.h5"), csv = with_suffix(c.output, ".compare.csv");
  write_comparison_h5(out, c, opt, by_hash);
  write_comparison_csv(csv, c, by_hash);
  print_comparison_table(c, by_hash);
  std::printf("\ncomparison (%s against %s, tolerance %.3g): %s and %s\n", opt.policies[1].c_str(),
              opt.policies[0].c_str(), opt.tolerance, out.c_str(), csv.c_str());
  std::fflush(stdout);
}

void check_compare_options(const CompareOptions& opt) {
  if (opt.policies.size() != 2) fail("--policies needs exactly two policies (reference,candidate)");
  for (const auto& p : opt.policies)
    if (!precision_named(p)) fail("--policies: unknown policy \"", p, "\" (fp32, tf32, bf16-amp, fp64)");
  if (opt.policies[0] == opt.policies[1]) fail("--policies: the two policies are the same");
  if (!(opt.tolerance > 0)) fail("--tolerance must be positive");
}

}  // namespace

int compare_command(const Comm& comm, const CompareOptions& opt) {
  comm.collective([&] { check_compare_options(opt); });
  Campaign c = prepare_campaign(comm, opt.deck, opt.overrides, opt.quiet);
  const Precision reference = *precision_named(opt.policies[0]), candidate = *precision_named(opt.policies[1]);
  choose_host_gemm(comm, c, c.output, opt.quiet, reference != Precision::fp64 || candidate != Precision::fp64);
  if (!opt.quiet) print_engine_settings(comm, c);
  std::string error;
  const Pack mine = compare_my_groups(comm, c, reference, candidate, opt, error);
  const auto gathered = comm.allgather(mine.bytes());
  std::vector<long long> failures = {error.empty() ? 0 : 1};
  comm.sum(failures);
  std::string write_error;
  if (comm.rank() == 0) {
    try {
      write_comparisons(c, opt, gathered);
    } catch (const Error& e) {
      write_error = e.what();
    }
  }
  comm.collective([&] {
    if (!write_error.empty()) throw Error(write_error);
  });
  return failures[0] > 0 ? 1 : 0;
}

Subcommand add_compare_command(CLI::App& gnh) {
  auto opt = std::make_shared<CompareOptions>();
  auto policies = std::make_shared<std::string>("fp32,bf16-amp");
  CLI::App* cmd = gnh.add_subcommand(
      "compare",
      "Run DECK's analysis under two precision policies with matched batches and directions and report "
      "the candidate's errors against the reference (HDF5 and CSV beside run.output)");
  cmd->add_option("deck", opt->deck, "Input deck (TOML)")->required();
  cmd->add_option("--policies", *policies, "REFERENCE,CANDIDATE (fp32, tf32, bf16-amp, fp64)")->capture_default_str();
  cmd->add_option("--tolerance", opt->tolerance, "Largest relative error of the requested statistics that passes")
      ->capture_default_str();
  cmd->add_option("--set", opt->overrides, "Override a deck key (repeatable)")
      ->type_name("KEY=VALUE")
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  cmd->add_flag("--quiet", opt->quiet, "Do not echo the deck or per-case progress");
  return {cmd, [opt, policies](const Comm& comm) {
            opt->policies.clear();
            std::stringstream ss(*policies);
            for (std::string p; std::getline(ss, p, ',');) opt->policies.push_back(p);
            return compare_command(comm, *opt);
          }};
}

}  // namespace gnh
