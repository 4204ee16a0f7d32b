// SPDX-License-Identifier: BSD-3-Clause
#include "driver/run_memory.hpp"

#include <algorithm>
#include <cstdio>
#include <map>

#include "analysis/memory.hpp"
#include "analysis/usage.hpp"
#include "core/error.hpp"

namespace gnh {
namespace {

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
  const std::map<std::string, double> units = {{"", 1},
                                               {"B", 1},
                                               {"kB", 1e3},
                                               {"KB", 1e3},
                                               {"MB", 1e6},
                                               {"GB", 1e9},
                                               {"TB", 1e12},
                                               {"KiB", 1024.0},
                                               {"MiB", 1048576.0},
                                               {"GiB", 1073741824.0},
                                               {"TiB", 1099511627776.0}};
  const auto it = units.find(unit);
  if (it == units.end() || !(v > 0))
    fail("--memory-budget ", text, ": expected a size such as 64GiB, 500MB or a byte count");
  return std::int64_t(v * it->second);
}

}  // namespace

std::string gib(std::size_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.3g GiB", double(bytes) / double(1ull << 30));
  return buf;
}

MemoryBudget memory_budget(const Comm& comm, const std::string& given_text) {
  const int on_node = comm.ranks_on_node();
  const std::int64_t device = device_memory_total();
  MemoryBudget b;
  const std::int64_t given = given_text.empty() ? -1 : parse_size(given_text);
  const std::int64_t whole = given >= 0 ? given : device >= 0 ? device : host_memory_total();
  if (whole < 0) return b;
  const std::string source = given >= 0    ? "--memory-budget " + given_text + " (" + gib(std::size_t(whole)) + ")"
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

std::size_t planned_per_rank(const Campaign& c, const AnalysisSettings& s, int rpc, std::string* which) {
  std::size_t most = 0;
  for (const auto& cs : c.cases) {
    const MemoryPlan m = plan_memory(c.cfg, s, plan_case(s, cs.blocks, true, true), rpc);
    if (m.total() > most) {
      most = m.total();
      if (which)
        *which = cs.name + "; its largest stage, " + m.peak_stage + ": engines " + gib(m.peak_engines) + ", vectors " +
                 gib(m.peak_vectors);
    }
  }
  return most;
}

bool keep_noise_vectors(const Campaign& c, const MemoryBudget& b) {
  if (c.deck.noise_vectors != "auto") return c.deck.noise_vectors == "keep";
  if (b.per_rank < 0) return true;
  AnalysisSettings s = c.deck.analysis;
  s.keep_noise_vectors = true;
  return double(planned_per_rank(c, s, int(c.deck.ranks_per_checkpoint))) <= 0.9 * double(b.per_rank);
}

namespace {

// "lower a (now 4), b (now 2) or c (now 8)" of the settings above 1, or "".
std::string lower_of(const std::vector<std::pair<std::string, std::int64_t>>& settings) {
  std::vector<std::string> named;
  for (const auto& s : settings)
    if (s.second > 1) named.push_back(s.first + " (now " + std::to_string(s.second) + ")");
  std::string out;
  for (std::size_t i = 0; i < named.size(); ++i)
    out += (i == 0 ? "lower " : i + 1 == named.size() ? " or " : ", ") + named[i];
  return out;
}

// The smallest parameter_shards above the deck's whose plan fits the limit
// (at most kMostShards; 0: none).
constexpr int kMostShards = 64;
int shards_that_fit(const Campaign& c, AnalysisSettings s, int rpc, double limit) {
  for (int R = int(s.parameter_shards) + 1; R <= kMostShards; ++R) {
    s.parameter_shards = R;
    if (double(planned_per_rank(c, s, std::max(rpc, R))) <= limit) return R;
  }
  return 0;
}

// What else frees memory: more parameter shards, the noise vectors kept,
// Hutch++'s sketch, the Lanczos basis.
std::string other_remedies(const Campaign& c, int rpc, double limit) {
  const AnalysisSettings& s = c.deck.analysis;
  std::string out;
  if (const int R = shards_that_fit(c, s, rpc, limit))
    out +=
        ", set parallel.parameter_shards = " + std::to_string(R) +
        (rpc % R == 0 ? "" : " with parallel.ranks_per_checkpoint a multiple of it (now " + std::to_string(rpc) + ")") +
        " (each rank then holds a slice of the analysis's vectors)";
  // Recomputing them frees the kept vectors but holds an exact sum and a
  // batch gradient in the curvature passes: advised where that is less.
  bool noise = false;
  for (const auto& cs : c.cases) {
    const CasePlan kept = plan_case(s, cs.blocks, true, true);
    CasePlan again = kept;
    again.keep_noise = false;
    noise = noise ||
            (kept.n_noise > 0 && plan_memory(c.cfg, s, again, rpc).total() < plan_memory(c.cfg, s, kept, rpc).total());
  }
  if (s.keep_noise_vectors && noise)
    out +=
        ", set parallel.noise_vectors = \"recompute\" (the noise vectors computed again in the curvature passes, not "
        "kept)";
  if (s.curvature.hutchpp) {
    AnalysisSettings plain = s;
    plain.curvature.hutchpp = false;
    bool frees = false;
    for (const auto& cs : c.cases) {
      const CasePlan p = plan_case(s, cs.blocks, true, true);
      frees = frees || plan_memory(c.cfg, plain, p, rpc).total() < plan_memory(c.cfg, s, p, rpc).total();
    }
    if (frees) out += ", set curvature.trace_estimator = \"hutchinson\" (no Hutch++ sketch)";
  }
  if (s.curvature.lanczos_steps > 0) {
    const std::string lanczos = lower_of({{"curvature.lanczos_chains", s.curvature.lanczos_chains},
                                          {"curvature.lanczos_steps", s.curvature.lanczos_steps}});
    if (!lanczos.empty()) out += ", " + lanczos;
    out += ", raise parallel.ranks_per_checkpoint (now " + std::to_string(rpc) +
           ": the Lanczos basis is sharded over the team)";
  }
  return out;
}

}  // namespace

void check_memory(const Campaign& c, const MemoryBudget& b) {
  if (b.per_rank < 0) return;
  const AnalysisSettings& s = c.deck.analysis;
  const int rpc = int(c.deck.ranks_per_checkpoint);
  std::string which;
  const std::size_t need = planned_per_rank(c, s, rpc, &which);
  const double limit = 0.9 * double(b.per_rank);
  if (double(need) <= limit) return;
  std::string lower = lower_of({{"analysis.hvp_batch", s.hvp_batch},
                                {"analysis.directions_per_pass", s.directions_per_pass},
                                {"analysis.grad_microbatch", s.grad_microbatch}});
  const std::string fit =
      s.hvp_batch > 1 || s.directions_per_pass > 1 || s.grad_microbatch > 1 || shards_that_fit(c, s, rpc, limit) > 0
          ? ", or pass --fit-memory to choose directions_per_pass, hvp_batch, grad_microbatch and parameter_shards"
          : "";
  fail(c.deck.file, ": the plan needs ", gib(need), " per rank (case ", which, ") but 90% of ", b.what, " is ",
       gib(std::size_t(limit)), ": ", lower.empty() ? "every batch setting is at 1" : lower,
       other_remedies(c, rpc, limit), ", run fewer ranks per node", fit);
}

// The smallest parameter_shards dividing the team whose plan fits at one
// direction a pass and one block an HVP batch with the deck's
// grad_microbatch; where none
// does, the most shards and the largest grad_microbatch that fit; then the
// largest directions_per_pass, then the largest hvp_batch.
MemoryFit fit_memory(const Campaign& c, const MemoryBudget& b) {
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
  std::vector<index_t> shards;
  for (int R = 1; R <= rpc; ++R)
    if (rpc % R == 0) shards.push_back(R);
  bool found = false;
  for (const index_t R : shards) {
    s.parameter_shards = R;
    if ((found = fits(1, 1))) break;
  }
  if (!found) {  // the most shards; the largest grad_microbatch below the deck's that fits
    index_t lo = 0, hi = s.grad_microbatch - 1;
    while (lo < hi) {
      const index_t mid = lo + (hi - lo + 1) / 2;
      s.grad_microbatch = mid;
      if (fits(1, 1)) lo = mid;
      else hi = mid - 1;
    }
    s.grad_microbatch = std::max<index_t>(lo, 1);
    if (lo == 0 || !fits(1, 1)) {
      fail(c.deck.file,
           ": --fit-memory: even one direction per pass, one block per HVP batch and per gradient "
           "microbatch",
           rpc > 1 ? " and parallel.parameter_shards = " + std::to_string(shards.back()) : "",
           " need more than 90% of ", b.what, ": every batch setting is at 1", other_remedies(c, rpc, limit),
           ", or run fewer ranks per node");
    }
  }
  index_t K = std::min<index_t>(most_dirs, 4096);
  while (K > 1 && !fits(K, 1)) --K;
  index_t lo = 1, hi = most_blocks;  // the largest B in [lo, hi] that fits
  while (lo < hi) {
    const index_t mid = lo + (hi - lo + 1) / 2;
    if (fits(K, mid)) lo = mid;
    else hi = mid - 1;
  }
  return {static_cast<long long>(K), static_cast<long long>(lo), static_cast<long long>(s.grad_microbatch),
          static_cast<long long>(s.parameter_shards)};
}

}  // namespace gnh
