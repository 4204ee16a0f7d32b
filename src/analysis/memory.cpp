// SPDX-License-Identifier: BSD-3-Clause
#include "analysis/memory.hpp"

#include <algorithm>

#include "analysis/blocks.hpp"
#include "analysis/exact_sum.hpp"
#include "analysis/sampling.hpp"
#include "analysis/lanczos.hpp"
#include "analysis/team.hpp"
#include "model/layout.hpp"

namespace gnh {
namespace {
Shape shape_of(const AnalysisSettings& s, index_t batch, index_t K, bool reverse, bool second) {
  Shape sh;
  sh.bf16 = s.bf16();
  sh.tf32 = s.tf32();
  sh.batch = batch;
  sh.context = s.context;
  sh.directions = int(K);
  sh.reverse = reverse;
  sh.second_order = second;
  return sh;
}
}  // namespace

CasePlan plan_case(const AnalysisSettings& s, index_t n_blocks, bool preconditioned, bool update) {
  CasePlan c;
  c.preconditioned = preconditioned && s.curvature.preconditioned;
  c.update = update && s.curvature.update;
  c.n_blocks = n_blocks;
  c.n_noise = s.noise_batch > 0 && n_blocks > 0 ? std::min(s.noise_samples, n_blocks / s.noise_batch) : 0;
  c.partition = c.n_noise > 0 && c.n_noise * s.noise_batch == n_blocks;
  c.directions_asked = s.directions;
  c.pass_widths = balanced_passes(c.directions(), s.directions_per_pass);
  c.spectrum = s.curvature.lanczos_steps > 0 && (!s.curvature.lanczos_php || preconditioned);
  c.keep_noise = s.keep_noise_vectors;
  return c;
}

Shape gradient_shape(const AnalysisSettings& s) { return shape_of(s, s.grad_microbatch, 0, true, false); }

Shape curvature_shape(const AnalysisSettings& s, index_t K) {
  return shape_of(s, s.hvp_batch, K, s.curvature_method == CurvatureMethod::forward_over_reverse,
                  s.curvature_method == CurvatureMethod::second_order_forward);
}

Shape check_shape(const AnalysisSettings& s, bool second_order) {
  // The second-order forward along both directions at once; forward-over-reverse one at a time.
  return shape_of(s, 1, second_order ? 2 : 1, !second_order, second_order);
}

std::size_t sequence_group_bytes(const ModelConfig& cfg, const AnalysisSettings& s, index_t G) {
  const std::size_t scalar = s.fp64() ? sizeof(double) : sizeof(float);
  // Batches of one sequence take it in place: its gradient is the batch's (analysis/passes.hpp).
  const std::size_t grads = s.grad_microbatch == 1 ? 0 : scalar * std::size_t(ParamLayout(cfg).size()) * std::size_t(G);
  return grads + (G == s.grad_microbatch ? 0 : plan_gpt_bytes(cfg, sequence_shape(s, G), scalar));
}

index_t sequence_group(const ModelConfig& cfg, const AnalysisSettings& s, bool gpu_shaped) {
  if (!gpu_shaped) return 1;
  const std::size_t scalar = s.fp64() ? sizeof(double) : sizeof(float);
  const std::size_t room =
      std::max({plan_gpt_bytes(cfg, gradient_shape(s), scalar), sequence_group_bytes(cfg, s, 1), kSequenceGroupFloor});
  index_t G = 1;
  for (index_t d = 2; d <= s.grad_microbatch; ++d)
    if (s.grad_microbatch % d == 0 && sequence_group_bytes(cfg, s, d) <= room) G = d;
  return G;
}

Shape sequence_shape(const AnalysisSettings& s, index_t G) { return shape_of(s, G, 0, true, false); }

PlannedCuts planned_adjoint_cuts(const ModelConfig& cfg, const AnalysisSettings& s) {
  PlannedCuts p;
  p.checks = adjoint_cuts_of(cfg, check_shape(s, true));
  if (s.curvature_method != CurvatureMethod::second_order_forward) return p;
  for (index_t K = 1; K <= s.directions_per_pass && p.curvature_from == 0; ++K)
    if (adjoint_cuts_of(cfg, curvature_shape(s, K))) p.curvature_from = K;
  return p;
}

namespace {

// A stage of a case (case_stages): its name, whether the case runs it, what
// its engines take and its parameter-sized vectors.
struct Stage {
  const char* name = "";
  bool runs = true;
  std::size_t engines = 0;
  std::size_t sliced = 0, whole = 0, buffers = 0;  // the vectors' bytes by kind
  index_t count = 0;                               // how many vectors
  std::size_t vectors() const { return sliced + whole + buffers; }
};
constexpr const char* kCurvaturePasses = "the curvature passes";

// What a stage's engines take: the per-sequence gradients' throughout; the
// gradient's or the curvature's, never both (analysis/case_analysis.hpp,
// Engines: the gradient engine recomputes the noise vectors of a curvature
// pass before its curvature engine is made); the checks' engine alone.
struct StageEngines {
  std::size_t gradient, curvature, checks, landscape, trace;
};
StageEngines stage_engines(const ModelConfig& cfg, const AnalysisSettings& s, const MemoryPlan& m, std::size_t scalar) {
  const index_t R = std::min(s.landscape.curvature_directions(), s.directions_per_pass);
  const std::size_t random =
      R > 0 ? std::max(m.curvature, plan_gpt_bytes(cfg, curvature_shape(s, R), scalar)) : std::size_t(0);
  // The traces' passes at their widest, directions_per_pass (the plan does not grow with the directions).
  const std::size_t traces =
      std::max(m.curvature, plan_gpt_bytes(cfg, curvature_shape(s, s.directions_per_pass), scalar));
  return {m.sequence + m.gradient, m.sequence + m.curvature, m.sequence + m.checks,
          m.sequence + std::max(m.gradient, random), m.sequence + traces};
}

// The parameter-sized vectors, stage by stage (analysis/case_analysis.cpp):
// those held throughout the case and each stage's own, in double, in 128-bit
// exact sums and in the engine's scalar, for the gradient pass, the noise
// batches, the curvature passes, the identity checks, the landscapes and the
// traces (a curvature pass's filling, where it recomputes noise vectors, apart
// from the pass). The kept noise vectors live from the noise batches to the
// end of the curvature passes; g_j only from the end of its batch's gradient
// pass until xi_j is formed, and the checks take its place again for the
// partition's mean. With parameter_shards R > 1 the doubles, the exact sums
// and the kept noise vectors are a member's slice (the largest, ShardLayout);
// what the engines read (parameters, directions, a batch's gradient and
// products) is whole, as are the doubles of the landscapes and the traces
// (w: their displacements, Ritz vectors and products, and G and Delta
// gathered for the landscapes), and a scatter's round buffers are added.
// In the order they run, the spectrum's apart (plan_memory).
std::vector<Stage> case_stages(const ModelConfig& cfg, const AnalysisSettings& s, const CasePlan& c,
                               const MemoryPlan& m, std::size_t P, std::size_t scalar) {
  struct Count {
    const char* name;
    bool runs;
    std::size_t engines;
    index_t d = 0, x = 0, t = 0, w = 0, kept = 0;
  };
  const index_t K = c.pass_widths.front(), part = c.partition ? 1 : 0;
  const bool fr = s.curvature_method == CurvatureMethod::forward_over_reverse;
  const bool recompute = !c.keep_noise && c.n_noise > 0, hv = s.keeps_hv();
  const index_t R = std::min(s.landscape.curvature_directions(), s.directions_per_pass);
  // The Ritz vectors kept past the spectrum (landscapes, the deflated trace);
  // Hutch++'s sketch of k3 directions and its passes' width.
  const bool keeps_ritz = c.spectrum && !s.curvature.lanczos_php && s.curvature.op != OperatorChoice::ggn &&
                          (s.landscape.top_eigenvector() > 0 || s.curvature.hutchpp);
  // The sketch planned at its largest, directions_per_pass: the plan does not grow with the directions.
  const index_t ritz = keeps_ritz ? s.curvature.eigenvectors : 0, k3 = s.directions_per_pass;
  const index_t tw = s.directions_per_pass;  // the traces' passes, at their widest
  // Throughout: G, the parameters; the AdamW preconditioner; the update's
  // Delta and theta_b; the diagonal.
  const Count held{"", true,
                   0,  1 + (c.preconditioned ? 1 : 0) + (c.update ? 1 : 0) + (hv && s.curvature.diagonal ? 1 : 0),
                   0,  1 + (c.update ? 1 : 0)};
  const index_t kept = c.keep_noise ? c.n_noise : 0;  // slices
  const int shards = int(s.parameter_shards);
  const std::size_t Ps = shards > 1 ? std::size_t(ShardLayout(index_t(P), shards).largest()) : P;
  // A scatter's round: R pieces sent and R received, one staged (ShardLayout::round).
  const std::size_t rounds =
      shards > 1 ? scalar * std::size_t(ShardLayout(index_t(P), shards).round()) * (2 * std::size_t(shards) + 1) : 0;
  const StageEngines e = stage_engines(cfg, s, m, scalar);
  const Count stages[] = {
      // the gradient: the epoch's exact sum, a batch's gradient
      {"the gradient pass", true, e.gradient, 0, 1, 1},
      // the noise batches: a batch's exact sum (and the partition's), a
      // batch's gradient; the noise vectors kept. Then, the pass done, g_j
      // (xi_j formed in its place) beside the sum
      {"the noise batches", true, e.gradient, 0, 1 + part, 1, 0, kept},
      {"the noise batches", true, e.gradient, 1, 1 + part, 0, 0, kept},
      // a curvature pass's noise vectors recomputed as its directions are
      // filled (by the gradient engine): the partition's sum; the K
      // directions; the noise batch's exact sum and a batch's gradient, then
      // g_j beside the sum; with H v kept, an exact sum per direction and
      // H v in double
      {"the noise vectors recomputed", recompute, e.gradient, hv ? 1 : 0, part + 1 + (hv ? K : 0), K + 1},
      {"the noise vectors recomputed", recompute, e.gradient, (hv ? 1 : 0) + 1, part + 1 + (hv ? K : 0), K},
      // the curvature passes: the partition's sum; the pass's K directions;
      // forward-over-reverse's batch gradient and K products; with H v kept,
      // an exact sum per direction and H v in double; the noise vectors kept
      {kCurvaturePasses, true, e.curvature, hv ? 1 : 0, part + (hv ? K : 0), K + (fr ? 1 + K : 0), 0, kept},
      // the identity checks: the partition's sum and its mean; two
      // directions, a gradient and one product at a time (the Gauss-Newton
      // part's in the same)
      {"the identity checks", true, e.checks, part, part, 4},
      // the landscapes: every direction's displacement in double (and the
      // Ritz vectors they take), one point's parameters; the random
      // directions' curvature pass (its directions, forward-over-reverse's
      // batch gradient and products)
      {"the landscapes", s.landscape.any(), e.landscape, 0, part, 1 + R + (fr && R > 0 ? 1 + R : 0),
       index_t(s.landscape.used().size()) + ritz + (shards > 1 ? 1 + (c.update ? 1 : 0) : 0)},
      // the traces: the Ritz vectors (and their rounded copies), a product in
      // double, a pass's exact sums; the sketch and its basis, a direction,
      // forward-over-reverse's batch gradient and the pass's products
      {"the traces", s.curvature.hutchpp, e.trace, 0, part + tw, 2 * k3 + ritz + 1 + 1 + tw, ritz + 1},
  };
  std::vector<Stage> out;
  for (const Count& n : stages) {
    Stage v;
    v.name = n.name;
    v.runs = n.runs;
    v.engines = n.engines;
    v.sliced = Ps * (sizeof(double) * std::size_t(held.d + n.d) + sizeof(fixed128) * std::size_t(held.x + n.x) +
                     scalar * std::size_t(n.kept));
    v.whole = P * (scalar * std::size_t(held.t + n.t) + sizeof(double) * std::size_t(n.w));
    v.buffers = rounds;
    v.count = held.d + n.d + held.x + n.x + n.kept + held.t + n.t + n.w;
    out.push_back(v);
  }
  return out;
}

// The Lanczos chains' share of a rank, the layer blocks' chains included
// (they run after the spectrum's, in their own basis: one chain per block,
// n_layer + 2, each over the whole flat order).
std::size_t spectrum_bytes(const ModelConfig& cfg, const AnalysisSettings& s, std::size_t P, int members) {
  std::size_t bytes = lanczos_bytes(index_t(P), s.curvature, s.directions_per_pass, members);
  if (s.curvature.layer_spectra) {
    CurvatureSettings blocks = s.curvature;
    blocks.lanczos_chains = layer_blocks(cfg);
    blocks.eigenvectors = 0;
    bytes = std::max(bytes, lanczos_bytes(index_t(P), blocks, s.directions_per_pass, members));
  }
  return bytes;
}

}  // namespace

MemoryPlan plan_memory(const ModelConfig& cfg, const AnalysisSettings& s, const CasePlan& c, int members,
                       bool gpu_shaped) {
  const std::size_t scalar = s.fp64() ? sizeof(double) : sizeof(float);
  const std::size_t P = std::size_t(ParamLayout(cfg).size());
  const index_t K = c.pass_widths.front();
  MemoryPlan m;
  m.gradient = plan_gpt_bytes(cfg, gradient_shape(s), scalar);
  m.curvature = plan_gpt_bytes(cfg, curvature_shape(s, K), scalar);
  // The checks' two engines, one at a time (analysis/case_analysis.hpp, Engines).
  m.checks =
      std::max(plan_gpt_bytes(cfg, check_shape(s, false), scalar), plan_gpt_bytes(cfg, check_shape(s, true), scalar));
  if (s.per_sequence) m.sequence = sequence_group_bytes(cfg, s, sequence_group(cfg, s, gpu_shaped));
  const std::vector<Stage> stages = case_stages(cfg, s, c, m, P, scalar);
  auto peak = [&m](const char* name, std::size_t e, std::size_t v) {
    if (e + v <= m.peak) return;
    m.peak = e + v;
    m.peak_stage = name;
    m.peak_engines = e;
    m.peak_vectors = v;
  };
  const Stage* passes = nullptr;  // the curvature passes', which the spectrum's bound takes
  for (const Stage& st : stages) {
    if (st.name == kCurvaturePasses) passes = &st;
    if (!st.runs) continue;
    if (st.vectors() > m.vectors) {
      m.vectors = st.vectors();
      m.vector_count = st.count;
      m.vectors_sliced = st.sliced;
      m.vectors_whole = st.whole;
      m.vectors_buffers = st.buffers;
    }
    peak(st.name, st.engines, st.vectors());
  }
  if (c.spectrum) {
    m.spectrum = spectrum_bytes(cfg, s, P, members);
    // The curvature engine at the chains' width, and forward-over-reverse's
    // batch products of a pass, where it is wider than the §4 passes'.
    const index_t Ks = std::min(s.curvature.lanczos_chains, s.directions_per_pass);
    if (Ks > K) {
      m.curvature = plan_gpt_bytes(cfg, curvature_shape(s, Ks), scalar);
      m.spectrum += scalar * P * std::size_t(Ks - K);
    }
    // The spectrum's passes: the curvature engine, the curvature stage's
    // vectors (an upper bound: the noise vectors are gone) and the chains.
    peak("the spectrum", m.sequence + m.curvature, passes->vectors() + m.spectrum);
  }
  return m;
}

}  // namespace gnh
