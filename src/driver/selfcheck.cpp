// SPDX-License-Identifier: BSD-3-Clause
#include "driver/selfcheck.hpp"

#include <unistd.h>

#include <CLI/CLI.hpp>
#include <memory>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "analysis/analyser.hpp"
#include "analysis/sampling.hpp"
#include "analysis/team.hpp"
#include "core/error.hpp"
#include "driver/install.hpp"
#include "io/checkpoint.hpp"
#include "io/tokens.hpp"

namespace gnh {

namespace {

std::string host_name() {
  char buf[256] = {0};
  return gethostname(buf, sizeof(buf) - 1) == 0 ? std::string(buf) : std::string("?");
}

// One shipped model's values against reference.json's: what is off, or "".
std::string check_model(const std::string& dir, const nlohmann::json& ref, const nlohmann::json& m, Precision precision,
                        CurvatureMethod method) {
  const std::string file = m.at("file").get<std::string>();
  const Checkpoint ck = read_checkpoint(dir + "/" + file);
  const TokenFile tokens =
      read_tokens(dir + "/tokens.bin", ref.at("dtype").get<std::string>(), "", int(ck.config.vocab_size));
  AnalysisSettings s;
  s.context = ref.at("context").get<index_t>();
  s.grad_microbatch = 2;
  s.hvp_batch = 2;
  s.noise_samples = 0;
  s.directions = ref.at("directions").get<index_t>();
  s.directions_per_pass = 1 + s.directions;
  s.seed = ref.at("seed").get<std::uint64_t>();
  s.precision = precision;
  s.curvature_method = method;
  const index_t blocks = epoch_blocks(index_t(tokens.ids.size()), s.context, 0);
  Analyser analyser(ck.config, s);
  analyser.set_parameters(ck.params);
  SoloTeam team;
  const CaseStatistics st = analyser.analyse(team, tokens.ids.data(), blocks, CaseHooks{});
  const double tol = ref.at("tolerance_relative").at(to_string(precision)).get<double>();
  std::string off;
  auto compare = [&](const std::string& name, double got, double want, double scale) {
    const double dev = std::abs(got - want) / std::max(std::abs(want), scale);
    if (!(dev <= tol)) {
      char buf[320];
      std::snprintf(buf, sizeof(buf), "%s: %s %.9g against %.9g (relative %.2e > %.0e)", file.c_str(), name.c_str(),
                    got, want, dev, tol);
      off += (off.empty() ? "" : "; ") + std::string(buf);
    }
  };
  compare("loss", st.loss, m.at("loss"), 0);
  compare("|G|^2", st.m.G_sqnorm, m.at("G_sqnorm"), 0);
  // Quadratic forms relative to |d| |H d| where they cancel (reference.json says why).
  compare("G^T H G", st.m.GHG, m.at("GHG"), m.at("GHG_scale"));
  for (std::size_t k = 0; k < st.m.vHv.size(); ++k)
    compare("v_" + std::to_string(k) + "^T H v_" + std::to_string(k), st.m.vHv[k], m.at("vHv").at(k),
            m.at("vHv_scale").at(k));
  return off;
}

}  // namespace

void self_check(const Comm& comm, Precision precision, CurvatureMethod method, bool quiet) {
  const auto t0 = std::chrono::steady_clock::now();
  comm.collective([&] {
    const std::string dir = (share_directory() / "jobscripts" / "selfcheck").string();
    std::ifstream in(dir + "/reference.json");
    if (!in) fail(dir, "/reference.json: the self-check's reference values are missing (an incomplete installation?)");
    nlohmann::json ref;
    try {
      ref = nlohmann::json::parse(in);
    } catch (const std::exception& e) {
      fail(dir, "/reference.json: not valid JSON (", e.what(), ")");
    }
    std::string off;
    for (const nlohmann::json& m : ref.at("models")) off += check_model(dir, ref, m, precision, method);
    if (!off.empty())
      fail("self-check failed on rank ", comm.rank(), " (host ", host_name(), ", ", to_string(precision), ", ",
           to_string(method), "): ", off,
           ". This node's device or build does not compute what it should; no "
           "analysis was started");
  });
  if (comm.rank() == 0 && !quiet) {
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("gnh: self-check passed on %d rank(s) (%s, %s) in %.2f s\n", comm.size(), to_string(precision),
                to_string(method), s);
    std::fflush(stdout);
  }
}

int self_check_command(const Comm& comm, const std::string& precision, const std::string& method) {
  const auto p = precision_named(precision);
  const auto m = curvature_method_named(method);
  comm.collective([&] {
    if (!p) fail("--precision ", precision, ": expected fp32, tf32, bf16-amp or fp64");
    if (!m) fail("--curvature-method ", method, ": expected second-order-forward or forward-over-reverse");
  });
  self_check(comm, *p, *m, false);
  return 0;
}

Subcommand add_self_check_command(CLI::App& gnh) {
  struct Choice {
    std::string precision = "fp32", method = "second-order-forward";
  };
  auto opt = std::make_shared<Choice>();
  CLI::App* cmd =
      gnh.add_subcommand("self-check",
                         "Check this build and every rank's device on a shipped tiny model against stored float64 "
                         "PyTorch values (seconds); under srun, one rank per device");
  cmd->add_option("--precision", opt->precision, "fp32, tf32, bf16-amp or fp64")->capture_default_str();
  cmd->add_option("--curvature-method", opt->method, "second-order-forward or forward-over-reverse")
      ->capture_default_str();
  return {cmd, [opt](const Comm& comm) { return self_check_command(comm, opt->precision, opt->method); }};
}

}  // namespace gnh
