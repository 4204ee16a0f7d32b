// SPDX-License-Identifier: BSD-3-Clause
// Whole-model derivatives in double: the gradient against central differences
// of the loss, H v (forward-over-reverse) against central differences of the
// gradient, Hessian symmetry, agreement of the two curvature paths, K
// directions per pass against one, microbatch independence, and float against
// double. Tolerances as in test_op_derivatives.cpp: central differences with
// h = 1e-5 err ~1e-10 relative (truncation h^2 and rounding eps/h alike), so
// 1e-7 against finite differences leaves a thousandfold margin while a wrong
// term is an O(1) error. The two curvature paths evaluate the same double sums
// in different orders over 4,000-4,700 parameters, so they differ by rounding,
// at most eps (1.1e-16) times a few thousand terms, ~1e-12 relative: 1e-10
// bounds that with room and still catches any term either path gets wrong.
#include <catch2/catch.hpp>
#include <algorithm>
#include <limits>
#include <memory>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>

#include "analysis/derivatives.hpp"
#include "analysis/passes.hpp"
#include "core/random.hpp"
#include "kernels/attention_batched.hpp"
#include "kernels/attention_host.hpp"
#include "model/gpt.hpp"
#include "model/plan.hpp"
#include "support/reference.hpp"

using namespace gnh;

namespace {

ModelConfig config(bool bias, bool tied, Gelu gelu) {
  ModelConfig c;
  c.n_layer = 2;
  c.n_head = 3;
  c.n_embd = 12;
  c.block_size = 16;
  c.vocab_size = 29;
  c.bias = bias;
  c.tie_embeddings = tied;
  c.gelu = gelu;
  return c;
}

template <class T>
View1<T> make_params(const ModelConfig& cfg, std::uint64_t seed) {
  const ParamLayout L(cfg);
  View1<T> p("params", L.size());
  for (const auto& t : L.tensors()) {
    const bool ln = t.name.find("ln_") != std::string::npos && t.name.find("weight") != std::string::npos;
    const auto v = ref::random_vec(t.size, seed++, ln ? 0.2 : 0.35, ln ? 1.0 : 0.0);
    for (std::int64_t i = 0; i < t.size; ++i) p(t.offset + i) = static_cast<T>(v[i]);
  }
  return p;
}

std::vector<std::int32_t> make_ids(index_t n, int vocab, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<std::int32_t> ids(n);
  for (auto& x : ids) x = std::int32_t(rng() % std::uint64_t(vocab));
  return ids;
}

// The fused attention's families at awkward sizes: nanoGPT (tanh GELU, biases,
// tied), Llama grouped (n_kv_head 1: the key side sums three query heads),
// GPT-NeoX (partial rotary, parallel residual, untied); with more, nanoGPT
// with exact GELU and no biases, and Llama with q, k, v biases (three
// buffers, three products of one input).
std::vector<ModelConfig> fused_families(bool more) {
  ModelConfig nano = config(true, true, Gelu::tanh), llama = config(false, false, Gelu::erf), neox = nano;
  llama.family = Family::llama;
  llama.n_kv_head = 1;
  llama.intermediate = 20;
  neox.family = Family::gpt_neox;
  neox.rotary_pct = 0.5;
  neox.parallel_residual = true;
  neox.tie_embeddings = false;
  std::vector<ModelConfig> r{nano, llama, neox};
  if (more) {
    ModelConfig qwen = llama;
    qwen.qkv_bias = true;
    r.push_back(config(false, false, Gelu::erf));
    r.push_back(qwen);
  }
  for (ModelConfig& c : r) c.block_size = 48;
  return r;
}

// A GPU-shaped gradient engine under bf16-amp on tok and tgt (nested: as
// planned inside the adjoint cuts): its plan's bytes, whether its attention
// is fused, the loss, the gradient and each sequence's own.
struct Bf16Gradient {
  std::size_t bytes = 0;
  bool fused = false;
  double loss = 0;
  View1<float> g;
  View2<float> per;
};
Bf16Gradient bf16_gradient(const ModelConfig& cfg, const View1<float>& p, const View2<std::int32_t>& tok,
                           const View2<std::int32_t>& tgt, bool nested = false) {
  const index_t B = tok.extent(0), P = ParamLayout(cfg).size();
  Shape s;
  s.batch = B;
  s.context = tok.extent(1);
  s.reverse = true;
  s.bf16 = true;
  s.gpu_shaped = true;
  s.nested = nested;
  Gpt<float> m(cfg, s);
  Bf16Gradient r{m.workspace_bytes(), m.attention_fused(), 0, View1<float>("g", P), View2<float>("per", B, P)};
  r.loss = m.gradient(ExecSpace(), p, tok, tgt, r.g).sum;
  // gradient_per_sequence writes its rows whatever they held.
  Kokkos::deep_copy(r.per, std::numeric_limits<float>::quiet_NaN());
  m.gradient_per_sequence(ExecSpace(), p, tok, tgt, r.per);
  return r;
}

// B sequences of Tc tokens and their next tokens, from ids.
void make_batch(const std::vector<std::int32_t>& ids, index_t B, index_t Tc, View2<std::int32_t>& tok,
                View2<std::int32_t>& tgt) {
  tok = View2<std::int32_t>("tok", B, Tc);
  tgt = View2<std::int32_t>("tgt", B, Tc);
  for (index_t b = 0; b < B; ++b)
    for (index_t t = 0; t < Tc; ++t) tok(b, t) = ids[b * Tc + t], tgt(b, t) = ids[b * Tc + t + 1];
}

// Unit-norm Gaussian directions: the finite-difference step then means the
// same thing whatever the parameter count (|h v| = h).
View2<double> random_dirs(index_t K, index_t P, std::uint64_t seed) {
  View2<double> d("dirs", K, P);
  const auto v = ref::random_vec(K * P, seed);
  for (index_t k = 0; k < K; ++k) {
    double norm = 0;
    for (index_t i = 0; i < P; ++i) norm += v[k * P + i] * v[k * P + i];
    for (index_t i = 0; i < P; ++i) d(k, i) = v[k * P + i] / std::sqrt(norm);
  }
  return d;
}

// Mean loss over the blocks at params + h * dir.
double loss_at(const ModelConfig& cfg, View1<double> p, const double* dir, double h,
               const std::vector<std::int32_t>& ids, index_t Tc, index_t n_blocks) {
  View1<double> q("q", p.extent(0));
  for (index_t i = 0; i < index_t(p.extent(0)); ++i) q(i) = p(i) + h * dir[i];
  Shape s;
  s.batch = 3;
  s.context = Tc;
  Gpt<double> m(cfg, s);
  // Reuse the epoch loop through a gradient-free model: sum of batch losses.
  double sum = 0;
  std::int64_t count = 0;
  View2<std::int32_t> tok("tok", 3, Tc), tgt("tgt", 3, Tc);
  for (index_t first = 0; first < n_blocks; first += 3) {
    for (index_t b = 0; b < 3; ++b)
      for (index_t t = 0; t < Tc; ++t) {
        const bool real = first + b < n_blocks;
        tok(b, t) = real ? ids[(first + b) * Tc + t] : 0;
        tgt(b, t) = real ? ids[(first + b) * Tc + t + 1] : -1;
      }
    const LossSum l = m.forward_loss(ExecSpace(), q, tok, tgt);
    sum += l.sum;
    count += l.count;
  }
  return sum / double(count);
}

std::vector<double> gradient_at(const ModelConfig& cfg, View1<double> p, const double* dir, double h,
                                const std::vector<std::int32_t>& ids, index_t Tc, index_t n_blocks) {
  View1<double> q("q", p.extent(0));
  for (index_t i = 0; i < index_t(p.extent(0)); ++i) q(i) = p(i) + h * dir[i];
  Shape s;
  s.batch = 4;
  s.context = Tc;
  s.reverse = true;
  Gpt<double> m(cfg, s);
  View1<double> G("G", p.extent(0));
  epoch_gradient<double>(ExecSpace(), m, q, ids.data(), all_blocks(n_blocks), G);
  return std::vector<double>(G.data(), G.data() + G.size());
}

// A second-order engine's shape: batch, context, K, the head's vocabulary
// chunk, adjoint cuts (Shape::adjoint_cuts).
Shape second_order_shape(index_t batch, index_t Tc, index_t K, index_t vocab_chunk, int cuts) {
  Shape s;
  s.batch = batch;
  s.context = Tc;
  s.directions = int(K);
  s.second_order = true;
  s.head_chunk_vocab = vocab_chunk;
  s.adjoint_cuts = cuts;
  return s;
}

// The curvature of a GPU-shaped second-order engine under bf16-amp with
// adjoint cuts (batches of 2 sequences of Tc tokens, K Rademacher
// directions, parameters of seed `seed` and directions of seed + 1) over
// n_blocks blocks of ids; look(engine) before the pass.
template <class F>
EpochCurvature bf16_second_order(const ModelConfig& cfg, index_t Tc, index_t K, const std::vector<std::int32_t>& ids,
                                 index_t n_blocks, std::uint64_t seed, const F& look) {
  View1<float> p = make_params<float>(cfg, seed);
  View2<float> dirs("dirs", K, ParamLayout(cfg).size());
  fill_rademacher<float>(ExecSpace(), dirs, seed + 1, 0);
  Shape s = second_order_shape(2, Tc, K, 0, 1);
  s.bf16 = true;
  s.gpu_shaped = true;
  Gpt<float> m(cfg, s);
  look(m);
  return epoch_curvature<float>(ExecSpace(), m, p, dirs, ids.data(), all_blocks(n_blocks),
                                CurvatureMethod::second_order_forward);
}

}  // namespace

TEST_CASE("whole model, double: gradient, H v and quadratic forms against finite differences", "[derivatives][model]") {
  const auto [bias, tied, gelu] = GENERATE(table<bool, bool, Gelu>(
      {{true, true, Gelu::erf}, {false, false, Gelu::tanh}, {true, false, Gelu::tanh}, {false, true, Gelu::erf}}));
  CAPTURE(bias, tied, gelu == Gelu::erf);
  const ModelConfig cfg = config(bias, tied, gelu);
  const index_t Tc = 7, n_blocks = 5, P = ParamLayout(cfg).size();
  const auto ids = make_ids(n_blocks * Tc + 1, cfg.vocab_size, 3);
  View1<double> p = make_params<double>(cfg, 77);
  const index_t K = 2;
  View2<double> dirs = random_dirs(K, P, 5);
  const double h = 1e-5;

  // Gradient (microbatch 4 over 5 blocks: a padded last batch).
  Shape gs;
  gs.batch = 4;
  gs.context = Tc;
  gs.reverse = true;
  gs.head_chunk_vocab = 6;  // the head in vocabulary chunks (online log-sum-exp)
  Gpt<double> gmodel(cfg, gs);
  View1<double> G("G", P);
  const EpochGradient eg = epoch_gradient<double>(ExecSpace(), gmodel, p, ids.data(), all_blocks(n_blocks), G);
  REQUIRE(eg.tokens == n_blocks * Tc);
  for (index_t k = 0; k < K; ++k) {
    const double* v = dirs.data() + k * P;
    double gv = 0, scale = 0;
    for (index_t i = 0; i < P; ++i) {
      gv += G(i) * v[i];
      scale += std::abs(G(i) * v[i]);
    }
    const double fd = (loss_at(cfg, p, v, h, ids, Tc, n_blocks) - loss_at(cfg, p, v, -h, ids, Tc, n_blocks)) / (2 * h);
    INFO("G.v " << gv << " finite difference " << fd);
    REQUIRE(std::abs(gv - fd) <= 1e-7 * scale);
  }
  // The same gradient with the head's logits in one tile, where the primal
  // reverse engine keeps the head's exponentials (kernels/lm_head_xent.hpp)
  // besides each layer's GELU output and slope (model/gpt_impl.hpp), and from
  // an engine that carries directions, whose primal reverse keeps neither
  // and evaluates them again: the same sums but for rounding. Double
  // rounding (2^-53) of terms no larger than the largest entry, over a few
  // hundred operations per entry, stays below 1e-12 of it.
  for (const int K1 : {0, 1}) {
    Shape s1 = gs;
    s1.head_chunk_vocab = 0;
    s1.directions = K1;
    Gpt<double> m1(cfg, s1);
    View1<double> G1("G1", P);
    const EpochGradient e1 = epoch_gradient<double>(ExecSpace(), m1, p, ids.data(), all_blocks(n_blocks), G1);
    double diff = 0, largest = 0;
    for (index_t i = 0; i < P; ++i) {
      diff = std::max(diff, std::abs(G1(i) - G(i)));
      largest = std::max(largest, std::abs(G(i)));
    }
    CAPTURE(K1, diff, largest);
    REQUIRE(diff <= 1e-12 * largest);
    REQUIRE(std::abs(e1.loss - eg.loss) <= 1e-13 * eg.loss);
  }

  // H v by forward-over-reverse (HVP batch 2, a different batching from the gradient).
  Shape hs;
  hs.batch = 2;
  hs.context = Tc;
  hs.reverse = true;
  hs.directions = int(K);
  hs.head_chunk_rows = 5;  // the head in (5, 4) tiles
  hs.head_chunk_vocab = 4;
  Gpt<double> hmodel(cfg, hs);
  View2<double> Hv("Hv", K, P);
  const EpochCurvature fr = epoch_curvature<double>(ExecSpace(), hmodel, p, dirs, ids.data(), all_blocks(n_blocks),
                                                    CurvatureMethod::forward_over_reverse, Hv);
  for (index_t k = 0; k < K; ++k) {
    const double* v = dirs.data() + k * P;
    const auto gp = gradient_at(cfg, p, v, h, ids, Tc, n_blocks), gm = gradient_at(cfg, p, v, -h, ids, Tc, n_blocks);
    double scale = 0;
    for (index_t i = 0; i < P; ++i) scale = std::max(scale, std::abs(Hv(k, i)));
    for (index_t i = 0; i < P; ++i) {
      const double fd = (gp[i] - gm[i]) / (2 * h);
      INFO("direction " << k << " entry " << i << ": Hv " << Hv(k, i) << " finite difference " << fd);
      REQUIRE(std::abs(Hv(k, i) - fd) <= 1e-7 * scale);
    }
    // The first-order part of the same pass is G.v.
    double gv = 0;
    for (index_t i = 0; i < P; ++i) gv += G(i) * v[i];
    REQUIRE(std::abs(fr.Gv[k] - gv) <= 1e-12 * std::abs(gv) + 1e-15);
  }
  // Symmetry: u^T (H v) = v^T (H u).
  double uHv = 0, vHu = 0, sym_scale = 0;
  for (index_t i = 0; i < P; ++i) {
    uHv += dirs(0, i) * Hv(1, i);
    vHu += dirs(1, i) * Hv(0, i);
    sym_scale += std::abs(dirs(0, i) * Hv(1, i));
  }
  INFO("u^T H v = " << uHv << ", v^T H u = " << vHu);
  REQUIRE(std::abs(uHv - vHu) <= 1e3 * std::numeric_limits<double>::epsilon() * sym_scale);

  // Second-order forward (HVP batch 3) agrees with forward-over-reverse, with
  // the adjoint cuts and without (at K = 2 the default is without).
  for (int cuts : {0, 1}) {
    Gpt<double> smodel(cfg, second_order_shape(3, Tc, K, 3, cuts));
    REQUIRE(smodel.adjoint_cuts() == bool(cuts));
    const EpochCurvature so = epoch_curvature<double>(ExecSpace(), smodel, p, dirs, ids.data(), all_blocks(n_blocks),
                                                      CurvatureMethod::second_order_forward);
    for (index_t k = 0; k < K; ++k) {
      INFO("cuts " << cuts << ", direction " << k << ": second-order " << so.vHv[k] << ", forward-over-reverse "
                   << fr.vHv[k]);
      REQUIRE(std::abs(so.vHv[k] - fr.vHv[k]) <= 1e-10 * std::abs(fr.vHv[k]));
      REQUIRE(std::abs(so.Gv[k] - fr.Gv[k]) <= 1e-10 * std::abs(fr.Gv[k]));
    }
    REQUIRE(std::abs(so.loss - eg.loss) <= 1e-13 * eg.loss);
  }
}

TEST_CASE("adjoint cuts: the same second order, the same tangents bit for bit", "[derivatives][model]") {
  // Float and double, K = 5, padded batches (targets < 0), the head in
  // vocabulary chunks.
  const ModelConfig cfg = config(true, false, Gelu::tanh);
  const index_t Tc = 6, n_blocks = 5, P = ParamLayout(cfg).size(), K = 5;
  const auto ids = make_ids(n_blocks * Tc + 1, cfg.vocab_size, 31);
  auto run = [&](auto zero, int cuts) {
    using T = decltype(zero);
    View1<T> p = make_params<T>(cfg, 8);
    View2<T> dirs("dirs", K, P);
    fill_rademacher<T>(ExecSpace(), dirs, 7, 0);
    Gpt<T> m(cfg, second_order_shape(3, Tc, K, 8, cuts));
    REQUIRE(m.adjoint_cuts() == (cuts != 0));
    return epoch_curvature<T>(ExecSpace(), m, p, dirs, ids.data(), all_blocks(n_blocks),
                              CurvatureMethod::second_order_forward);
  };
  // The default follows the FLOPs: on this model (dense layers 87% of the
  // forward's FLOPs at T = 6) from K = 7; the cases below force them.
  Shape by_default;
  by_default.context = Tc;
  by_default.second_order = true;
  by_default.directions = 6;
  REQUIRE_FALSE(adjoint_cuts_of(cfg, by_default));
  by_default.directions = 7;
  REQUIRE(adjoint_cuts_of(cfg, by_default));
  // GNH_ADJOINT_CUTS overrides the automatic choice, and a bad value is named.
  ::setenv("GNH_ADJOINT_CUTS", "0", 1);
  REQUIRE_FALSE(adjoint_cuts_of(cfg, by_default));
  by_default.directions = 1;
  ::setenv("GNH_ADJOINT_CUTS", "1", 1);
  REQUIRE(adjoint_cuts_of(cfg, by_default));
  ::setenv("GNH_ADJOINT_CUTS", "yes", 1);
  REQUIRE_THROWS_WITH(adjoint_cuts_of(cfg, by_default),
                      Catch::Contains("GNH_ADJOINT_CUTS") && Catch::Contains("'yes'"));
  ::unsetenv("GNH_ADJOINT_CUTS");
  REQUIRE_FALSE(adjoint_cuts_of(cfg, by_default));
  const EpochCurvature d0 = run(0.0, 0), d1 = run(0.0, 1), f0 = run(0.0f, 0), f1 = run(0.0f, 1);
  for (index_t k = 0; k < K; ++k) {
    CAPTURE(k, d0.vHv[k], d1.vHv[k], f0.vHv[k], f1.vHv[k]);
    // Tangents (and the loss) take the same arithmetic with and without cuts.
    REQUIRE(d1.Gv[k] == d0.Gv[k]);
    REQUIRE(f1.Gv[k] == f0.Gv[k]);
    // The second order: the same sum regrouped. In double, the terms are
    // O(1) and the regrouping moves the result by a few ulps of the largest
    // (1e-12 relative as in the other path comparisons). In float, each path
    // is within ~1e-5 of the double value here (a few hundred float
    // roundings through the layers, amplified by the curvature), so they
    // agree to 1e-4 (the float-against-double bar of the test below).
    REQUIRE(std::abs(d1.vHv[k] - d0.vHv[k]) <= 1e-12 * std::abs(d0.vHv[k]));
    REQUIRE(std::abs(f1.vHv[k] - d0.vHv[k]) <= 1e-4 * std::abs(d0.vHv[k]));
    REQUIRE(std::abs(f0.vHv[k] - d0.vHv[k]) <= 1e-4 * std::abs(d0.vHv[k]));
  }
  REQUIRE(d1.loss == d0.loss);
  // And the cuts did run: the regrouped sums differ from the plain ones in
  // their last bits (equal bits in all ten would mean the same arithmetic).
  int differ = 0;
  for (index_t k = 0; k < K; ++k) differ += (d1.vHv[k] != d0.vHv[k]) + (f1.vHv[k] != f0.vHv[k]);
  REQUIRE(differ > 0);
}

TEST_CASE("the batched attention's causal query blocks change no value of the model", "[derivatives][model]") {
  // The GPU's path on this host, in double, its attention products by whole
  // planes (1 block) and by blocks of 3, 3 and 1 rows (3): the loss, the
  // gradient and both curvature methods' G.v and v^T H v agree within 1e-12
  // relative (the blocks' products add the same terms, in an order that
  // may differ in the last bits; the other path comparisons' bar).
  const ModelConfig cfg = config(true, true, Gelu::erf);
  const index_t Tc = 7, n_blocks = 5, P = ParamLayout(cfg).size(), K = 2;
  const auto ids = make_ids(n_blocks * Tc + 1, cfg.vocab_size, 17);
  View1<double> p = make_params<double>(cfg, 5);
  View2<double> dirs("dirs", K, P);
  fill_rademacher<double>(ExecSpace(), dirs, 99, 0);
  auto shape = [&](index_t blocks, int k, bool reverse) {
    Shape s;
    s.batch = 2;
    s.context = Tc;
    s.directions = k;
    s.reverse = reverse;
    s.second_order = k > 0 && !reverse;
    s.gpu_shaped = true;
    s.attention_blocks = blocks;
    return s;
  };
  auto near = [](double a, double b) { return std::abs(a - b) <= 1e-12 * std::max(std::abs(b), 1e-300); };
  std::vector<double> G[2];
  double loss[2] = {0, 0};
  EpochCurvature c[2][2];
  for (int i = 0; i < 2; ++i) {
    const index_t blocks = i ? 3 : 1;
    Gpt<double> g(cfg, shape(blocks, 0, true));
    View1<double> Gv("G", P);
    loss[i] = epoch_gradient<double>(ExecSpace(), g, p, ids.data(), all_blocks(n_blocks), Gv).loss;
    G[i].assign(Gv.data(), Gv.data() + P);
    int m = 0;
    for (auto method : {CurvatureMethod::forward_over_reverse, CurvatureMethod::second_order_forward}) {
      Gpt<double> e(cfg, shape(blocks, int(K), method == CurvatureMethod::forward_over_reverse));
      c[i][m++] = epoch_curvature<double>(ExecSpace(), e, p, dirs, ids.data(), all_blocks(n_blocks), method);
    }
  }
  REQUIRE(near(loss[1], loss[0]));
  double scale = 0, err = 0;
  for (index_t j = 0; j < P; ++j) {
    scale = std::max(scale, std::abs(G[0][j]));
    err = std::max(err, std::abs(G[1][j] - G[0][j]));
  }
  CAPTURE(err, scale);
  REQUIRE(err <= 1e-12 * scale);
  for (int m = 0; m < 2; ++m)
    for (index_t k = 0; k < K; ++k) {
      CAPTURE(m, k, c[0][m].vHv[k], c[1][m].vHv[k]);
      REQUIRE(near(c[1][m].Gv[k], c[0][m].Gv[k]));
      REQUIRE(near(c[1][m].vHv[k], c[0][m].vHv[k]));
    }
}

TEST_CASE("the fused attention forward: the second order of the batched GEMMs, without score planes",
          "[derivatives][model][fused]") {
  // The GPU's path on this host under bf16-amp with adjoint cuts, at a
  // context of two query tiles (40 = 32 + 8), K = 3: the fused forward
  // (attention_fused.hpp) against the batched GEMMs (GNH_ATTENTION=batched).
  // The primal: both round the same operands to bfloat16 and form the
  // probabilities from the same FP32 statistics (summed in another order),
  // so at most a probability's last bfloat16 bit differs, 2^-8 of it: the
  // losses are within 2^-8 relative however many do. The derivatives: the
  // fused directions round otherwise (P s' in two bfloat16 parts, y'
  // centred after one walk, y'' contracted from FP32 sums; the batched path
  // rounds p (s' - lse') and p'' once each), each to bf16-amp's own error,
  // which on these cancelling sums is large against FP32 (v^T H v of
  // direction 1 here: FP32 2.53, fused 1.56, batched 1.37). So each is
  // compared with the same engine in FP32: the fused error at most twice the
  // batched one, plus 2^-8 of the value (measured: fused 0.2-0.6% off on
  // G v, 0.1-38% on v^T H v; batched 0.1-0.8%, 0.4-46%).
  ModelConfig cfg = config(true, false, Gelu::tanh);
  cfg.block_size = 48;
  const index_t Tc = 40, n_blocks = 3, K = 3;
  const auto ids = make_ids(n_blocks * Tc + 1, cfg.vocab_size, 23);
  auto run = [&](std::size_t& bytes, bool& fused) {
    return bf16_second_order(cfg, Tc, K, ids, n_blocks, 4, [&](const Gpt<float>& m) {
      bytes = m.workspace_bytes();
      fused = m.attention_fused();
    });
  };
  std::size_t fused_bytes = 0, batched_bytes = 0;
  bool fused = false, batched_fused = true;
  const EpochCurvature f = run(fused_bytes, fused);
  ::setenv("GNH_ATTENTION", "batched", 1);
  const EpochCurvature b = run(batched_bytes, batched_fused);
  ::unsetenv("GNH_ATTENTION");
  REQUIRE(fused);
  REQUIRE_FALSE(batched_fused);
  // No score planes, operands or pointer arrays for the fused forward: at
  // least the 1 + 2K planes of H Tc^2 floats of a sequence the batched one holds.
  CAPTURE(fused_bytes, batched_bytes);
  REQUIRE(batched_bytes - fused_bytes >= sizeof(float) * (1 + 2 * K) * cfg.n_head * Tc * Tc);
  View1<float> p = make_params<float>(cfg, 4);
  View2<float> dirs("dirs", K, ParamLayout(cfg).size());
  fill_rademacher<float>(ExecSpace(), dirs, 4 + 1, 0);
  Shape s32 = second_order_shape(2, Tc, K, 0, 1);
  s32.gpu_shaped = true;
  Gpt<float> m32(cfg, s32);
  const EpochCurvature e = epoch_curvature<float>(ExecSpace(), m32, p, dirs, ids.data(), all_blocks(n_blocks),
                                                  CurvatureMethod::second_order_forward);
  const double ulp = std::ldexp(1.0, -8);
  for (index_t k = 0; k < K; ++k) {
    CAPTURE(k, e.Gv[k], f.Gv[k], b.Gv[k], e.vHv[k], f.vHv[k], b.vHv[k]);
    REQUIRE(std::abs(f.Gv[k] - e.Gv[k]) <= 2 * std::abs(b.Gv[k] - e.Gv[k]) + ulp * std::abs(e.Gv[k]));
    REQUIRE(std::abs(f.vHv[k] - e.vHv[k]) <= 2 * std::abs(b.vHv[k] - e.vHv[k]) + ulp * std::abs(e.vHv[k]));
  }
  REQUIRE(std::abs(f.loss - b.loss) <= ulp * std::abs(b.loss));
}

TEST_CASE("the second order's projections as pair products, cut through their weights: the values apart",
          "[derivatives][model][fused]") {
  // The GPU's path on this host under bf16-amp with adjoint cuts, K = 3 (a
  // pair without its odd direction), every family's projections after the
  // norms (nanoGPT's and GPT-NeoX's qkv and c_fc, Llama's fused q, k, v or
  // Qwen2's three, and gate/up): their x'_k W^T + x V_k^T as one product of
  // pair blocks (kernels/linear.hpp, pair_forward), and their y''_k =
  // 2 x'_k V_k^T contracted with the cut's adjoint a through the weights as
  // 2 <a V_k, x'_k> (Gpt::cut_through), against the two products and y''
  // formed and contracted (GNH_LINEAR_PAIRS=0). The same bfloat16 products
  // summed in another order, and a rounded to bfloat16 as a product's
  // operand, so at most an operand's last bfloat16 bit differs further on,
  // 2^-8 of it: G.v and v^T H v within 2^-8 relative (as the fused
  // attention's forward against the batched GEMMs). A norm writing its
  // planes where the pairs do not read them, or a weight's pair blocks
  // built from another direction, is O(1) off; the cuts through the weights
  // taken 5% short move v^T H v by 1.2% here.
  for (const ModelConfig& cfg : fused_families(true)) {
    CAPTURE(to_string(cfg.family), cfg.qkv_bias, cfg.bias);
    const index_t Tc = 40, n_blocks = 3, K = 3;
    const auto ids = make_ids(n_blocks * Tc + 1, cfg.vocab_size, 31);
    auto run = [&](bool& pairs) {
      return bf16_second_order(cfg, Tc, K, ids, n_blocks, 7, [&](const Gpt<float>& m) { pairs = m.linear_pairs(); });
    };
    bool paired = false, apart = true;
    const EpochCurvature a = run(paired);
    ::setenv("GNH_LINEAR_PAIRS", "0", 1);
    const EpochCurvature b = run(apart);
    ::unsetenv("GNH_LINEAR_PAIRS");
    REQUIRE(paired);
    REQUIRE_FALSE(apart);
    const double ulp = std::ldexp(1.0, -8);
    for (index_t k = 0; k < K; ++k) {
      CAPTURE(k, a.Gv[k], b.Gv[k], a.vHv[k], b.vHv[k]);
      REQUIRE(std::isfinite(a.vHv[k]));
      REQUIRE(std::abs(a.Gv[k] - b.Gv[k]) <= ulp * std::abs(b.Gv[k]));
      REQUIRE(std::abs(a.vHv[k] - b.vHv[k]) <= ulp * std::abs(b.vHv[k]));
    }
  }
  ::setenv("GNH_LINEAR_PAIRS", "2", 1);
  REQUIRE_THROWS_WITH(linear_pairs_requested(), Catch::Contains("GNH_LINEAR_PAIRS=2"));
  ::unsetenv("GNH_LINEAR_PAIRS");
}

TEST_CASE("the fused attention reverse: the gradient of the batched GEMMs, without score planes",
          "[derivatives][model][fused]") {
  // A GPU-shaped gradient engine under bf16-amp, context of two tiles (40),
  // every family's attention layout: the fused forward and reverse
  // (attention_fused.hpp) against the batched GEMMs (GNH_ATTENTION=batched),
  // the summed gradient and each sequence's own (gradient_per_sequence).
  // Both round the same operands and form P and dS from FP32 statistics
  // summed in other orders, so an operand's last bfloat16 bit may differ,
  // 2^-8 of it: every gradient entry within 2^-8 of the gradient's largest
  // magnitude, the loss within 2^-8 of itself.
  for (const ModelConfig& cfg : fused_families(false)) {
    CAPTURE(to_string(cfg.family));
    const index_t Tc = 40, B = 2, P = ParamLayout(cfg).size();
    View2<std::int32_t> tok, tgt;
    make_batch(make_ids(B * Tc + 1, cfg.vocab_size, 29), B, Tc, tok, tgt);
    const View1<float> p = make_params<float>(cfg, 6);
    auto run = [&] { return bf16_gradient(cfg, p, tok, tgt); };
    const Bf16Gradient f = run();
    ::setenv("GNH_ATTENTION", "batched", 1);
    const Bf16Gradient b = run();
    ::unsetenv("GNH_ATTENTION");
    REQUIRE(f.fused);
    REQUIRE_FALSE(b.fused);
    // No score planes for the fused reverse: at least the 2 planes of H Tc^2
    // floats of a sequence that the batched reverse holds.
    CAPTURE(f.bytes, b.bytes);
    REQUIRE(b.bytes - f.bytes >= sizeof(float) * 2 * cfg.n_head * Tc * Tc);
    const double ulp = std::ldexp(1.0, -8);
    REQUIRE(std::abs(f.loss - b.loss) <= ulp * std::abs(b.loss));
    auto check = [&](const float* x, const float* y, index_t n) {
      double scale = 0, err = 0;
      index_t not_finite = 0;  // std::max passes NaN over
      for (index_t i = 0; i < n; ++i) {
        scale = std::max(scale, std::abs(double(y[i])));
        err = std::max(err, std::abs(double(x[i]) - double(y[i])));
        not_finite += !std::isfinite(x[i]) + !std::isfinite(y[i]);
      }
      CAPTURE(err, scale);
      REQUIRE(not_finite == 0);
      REQUIRE(scale > 0);
      REQUIRE(err <= ulp * scale);
    };
    check(f.g.data(), b.g.data(), P);
    for (index_t q = 0; q < B; ++q) check(f.per.data() + q * P, b.per.data() + q * P, P);
  }
}

TEST_CASE("the bf16-amp gradient engine keeps its layers' inputs rounded: the nested engine's bits",
          "[derivatives][model][fused]") {
  // A GPU-shaped gradient engine under bf16-amp keeps each layer's linear
  // inputs as its products read them, written rounded by the norms, the GELU
  // (SwiGLU) and the fused attention, and its reverse forms no norm again
  // and has the GELU's reverse, the fused attention's (without rotary) and
  // the residual stream's sums write its adjoints rounded too; the engine
  // nested in the adjoint cuts (Shape::nested) recomputes the norms and
  // rounds each product's operands. They round the same FP32 values, so
  // the loss, the gradient and each sequence's own gradient agree bit for
  // bit, in every family and GELU kind (the host's exact GELU takes its
  // vector loop), with and without the fused attention (GNH_ATTENTION).
  for (const char* attention : {"", "batched"})
    for (const ModelConfig& cfg : fused_families(true)) {
      CAPTURE(to_string(cfg.family), int(cfg.gelu), attention);
      if (*attention) ::setenv("GNH_ATTENTION", attention, 1);
      const index_t Tc = 40, B = 2, P = ParamLayout(cfg).size(), N = B * Tc;
      View2<std::int32_t> tok, tgt;
      make_batch(make_ids(B * Tc + 1, cfg.vocab_size, 31), B, Tc, tok, tgt);
      const View1<float> p = make_params<float>(cfg, 8);
      const Bf16Gradient k = bf16_gradient(cfg, p, tok, tgt), n = bf16_gradient(cfg, p, tok, tgt, true);
      ::unsetenv("GNH_ATTENTION");
      REQUIRE(k.fused == !*attention);
      REQUIRE(k.loss == n.loss);
      REQUIRE(std::memcmp(k.g.data(), n.g.data(), sizeof(float) * std::size_t(P)) == 0);
      REQUIRE(std::memcmp(k.per.data(), n.per.data(), sizeof(float) * std::size_t(B * P)) == 0);
      // The plan: per layer ln1, ln2, fc_gelu and (fused) att kept rounded (a
      // float each on a host) for fc_gelu's float, which one shared buffer
      // holds instead.
      const index_t C = cfg.n_embd, A = index_t(cfg.n_head) * cfg.head_size(), F = cfg.mlp_width();
      CAPTURE(k.bytes, n.bytes);
      REQUIRE(k.bytes - n.bytes == sizeof(float) * std::size_t(cfg.n_layer * N * (2 * C + (k.fused ? A : 0)) + N * F));
    }
}

TEST_CASE("K directions per pass equal one direction at a time", "[derivatives][model]") {
  const ModelConfig cfg = config(true, true, Gelu::erf);
  const index_t Tc = 5, n_blocks = 4, P = ParamLayout(cfg).size(), K = 3;
  const auto ids = make_ids(n_blocks * Tc + 1, cfg.vocab_size, 9);
  View1<double> p = make_params<double>(cfg, 12);
  View2<double> dirs("dirs", K, P);
  fill_rademacher<double>(ExecSpace(), dirs, 1234, 0);
  for (auto method : {CurvatureMethod::forward_over_reverse, CurvatureMethod::second_order_forward}) {
    auto shape = [&](int k) {
      Shape s;
      s.batch = 2;
      s.context = Tc;
      s.directions = k;
      s.reverse = method == CurvatureMethod::forward_over_reverse;
      s.second_order = !s.reverse;
      return s;
    };
    Gpt<double> all(cfg, shape(int(K)));
    const EpochCurvature stacked =
        epoch_curvature<double>(ExecSpace(), all, p, dirs, ids.data(), all_blocks(n_blocks), method);
    Gpt<double> one(cfg, shape(1));
    for (index_t k = 0; k < K; ++k) {
      View2<double> d1("d1", 1, P);
      for (index_t i = 0; i < P; ++i) d1(0, i) = dirs(k, i);
      const EpochCurvature single =
          epoch_curvature<double>(ExecSpace(), one, p, d1, ids.data(), all_blocks(n_blocks), method);
      CAPTURE(to_string(method), k);
      // Stacking changes GEMM shapes and so the rounding, nothing else.
      REQUIRE(std::abs(stacked.vHv[k] - single.vHv[0]) <= 1e-12 * std::abs(single.vHv[0]));
    }
  }
}

TEST_CASE("curvature does not depend on the batch size; float agrees with double", "[derivatives][model]") {
  const ModelConfig cfg = config(false, true, Gelu::tanh);
  const index_t Tc = 6, n_blocks = 7, P = ParamLayout(cfg).size(), K = 2;
  const auto ids = make_ids(n_blocks * Tc + 1, cfg.vocab_size, 4);
  View1<double> p = make_params<double>(cfg, 21);
  View1<float> pf = make_params<float>(cfg, 21);
  View2<double> dirs("dirs", K, P);
  View2<float> dirs_f("dirs_f", K, P);
  fill_rademacher<double>(ExecSpace(), dirs, 99, 0);
  fill_rademacher<float>(ExecSpace(), dirs_f, 99, 0);
  std::vector<double> reference;
  for (index_t B : {1, 3, 7, 8}) {
    Shape s;
    s.batch = B;
    s.context = Tc;
    s.directions = int(K);
    s.second_order = true;
    Gpt<double> m(cfg, s);
    const auto c = epoch_curvature<double>(ExecSpace(), m, p, dirs, ids.data(), all_blocks(n_blocks),
                                           CurvatureMethod::second_order_forward);
    if (reference.empty()) reference = c.vHv;
    for (index_t k = 0; k < K; ++k) REQUIRE(std::abs(c.vHv[k] - reference[k]) <= 1e-12 * std::abs(reference[k]));
  }
  // Float: parameters rounded to float are the same as the double model's only
  // to 6e-8 relative (fp32 unit roundoff), and v^T H v, a sum of terms of both
  // signs through two layers of products, amplifies that rounding by its
  // cancellation and depth; 1e-4 (some 1700 units of roundoff) covers it,
  // while a wrong term moves v^T H v by its own size.
  for (auto method : {CurvatureMethod::forward_over_reverse, CurvatureMethod::second_order_forward}) {
    Shape s;
    s.batch = 4;
    s.context = Tc;
    s.directions = int(K);
    s.reverse = method == CurvatureMethod::forward_over_reverse;
    s.second_order = !s.reverse;
    Gpt<float> m(cfg, s);
    const auto c = epoch_curvature<float>(ExecSpace(), m, pf, dirs_f, ids.data(), all_blocks(n_blocks), method);
    for (index_t k = 0; k < K; ++k) {
      CAPTURE(to_string(method), k, c.vHv[k], reference[k]);
      REQUIRE(std::abs(c.vHv[k] - reference[k]) <= 1e-4 * std::abs(reference[k]));
    }
  }
  // The float gradient, whose engine keeps each layer's GELU output and slope,
  // the head's exponentials and (on the host tiles) the attention's
  // probabilities for its reverse, against the double gradient. Float
  // parameters and products round at 6e-8; over this model's few hundred
  // operations per entry 1e-5 of the largest entry is ample, while a wrong
  // kept quantity moves entries by their own size.
  Shape gs;
  gs.batch = 4;
  gs.context = Tc;
  gs.reverse = true;
  Gpt<float> gf(cfg, gs);
  Gpt<double> gd(cfg, gs);
  REQUIRE(gf.keeps_attention() == (gf.attention_path() == kernels::AttentionPath::tiles));
  REQUIRE(gf.attention_path() == kernels::attention_path<float>(false, gf.shape().gpu_shaped));
  REQUIRE_FALSE(gd.keeps_attention());  // the host tiles are float only
  View1<double> Gf("Gf", P);            // epoch sums are double
  View1<double> Gd("Gd", P);
  epoch_gradient<float>(ExecSpace(), gf, pf, ids.data(), all_blocks(n_blocks), Gf);
  epoch_gradient<double>(ExecSpace(), gd, p, ids.data(), all_blocks(n_blocks), Gd);
  double diff = 0, largest = 0;
  for (index_t i = 0; i < P; ++i) {
    diff = std::max(diff, std::abs(Gf(i) - Gd(i)));
    largest = std::max(largest, std::abs(Gd(i)));
  }
  CAPTURE(diff, largest);
  REQUIRE(diff <= 1e-5 * largest);
}

TEST_CASE("Rademacher directions follow SPEC §4", "[random]") {
  // splitmix64 of 0 (the first output of the reference generator seeded with 0).
  REQUIRE(splitmix64(0) == 0xE220A8397B1DCDAFull);
  View2<double> d("d", 2, 64);
  fill_rademacher<double>(ExecSpace(), d, 1234, 0);
  int plus = 0;
  for (index_t i = 0; i < 64; ++i) {
    const std::uint64_t key = splitmix64(1234ull ^ splitmix64(0));
    const double want = (splitmix64(key ^ std::uint64_t(i)) >> 63) == 0 ? 1.0 : -1.0;
    REQUIRE(d(0, i) == want);
    plus += d(1, i) > 0;
  }
  REQUIRE(plus > 16);  // direction 1 is a different, balanced-looking sign pattern
  REQUIRE(plus < 48);
}

// Engines::curvature plans a narrower pass in the wider pass's released
// buffers (and the wider one again in those). The contract: nothing is read
// before it is written, so an engine in reused storage gives a fresh engine's
// bits. The storage is filled with NaN between plans, so a read of stale
// memory would show; the pointers show that the storage was reused.
TEST_CASE("an engine planned in another's released storage gives a fresh engine's bits", "[derivatives][model]") {
  const ModelConfig cfg = config(true, true, Gelu::erf);
  const index_t Tc = 7, n_blocks = 4, P = ParamLayout(cfg).size();
  const auto ids = make_ids(n_blocks * Tc + 1, cfg.vocab_size, 11);
  View1<float> p("p", P);
  {
    View1<double> pd = make_params<double>(cfg, 5);
    for (index_t i = 0; i < P; ++i) p(i) = float(pd(i));
  }
  View2<double> dd = random_dirs(3, P, 9);
  View2<float> dirs("dirs", 3, P);
  for (index_t k = 0; k < 3; ++k)
    for (index_t i = 0; i < P; ++i) dirs(k, i) = float(dd(k, i));
  auto first = [&](index_t K) { return Span2<const float>(dirs.data(), K, P); };
  auto poison = [](std::vector<View1<float>>& s) {
    for (auto& v : s) Kokkos::deep_copy(v, std::numeric_limits<float>::quiet_NaN());
  };
  auto same = [](const EpochCurvature& a, const EpochCurvature& b) {
    REQUIRE(a.loss == b.loss);
    REQUIRE(a.vHv == b.vHv);
    REQUIRE(a.Gv == b.Gv);
    for (double x : a.vHv) REQUIRE(std::isfinite(x));
  };
  auto pointers = [](const std::vector<View1<float>>& s) {
    std::vector<const float*> r;
    for (const auto& v : s) r.push_back(v.data());
    std::sort(r.begin(), r.end());
    return r;
  };
  // Second-order forward, cuts on at K = 3 and off at K = 2 (different
  // buffer sets: the cuts' adjoints and engine come and go); forward over
  // reverse.
  for (const bool sof : {true, false}) {
    CAPTURE(sof);
    auto shape = [&](index_t K, int cuts) {
      Shape s = sof ? second_order_shape(2, Tc, K, 0, cuts) : Shape{};
      if (!sof) {
        s.batch = 2;
        s.context = Tc;
        s.directions = int(K);
        s.reverse = true;
      }
      return s;
    };
    const CurvatureMethod method = sof ? CurvatureMethod::second_order_forward : CurvatureMethod::forward_over_reverse;
    auto run = [&](Gpt<float>& m, index_t K) {
      return epoch_curvature<float>(ExecSpace(), m, p, first(K), ids.data(), all_blocks(n_blocks), method);
    };
    Gpt<float> fresh3(cfg, shape(3, 1)), fresh2(cfg, shape(2, 0));
    const EpochCurvature r3 = run(fresh3, 3), r2 = run(fresh2, 2);
    auto wide = std::make_unique<Gpt<float>>(cfg, shape(3, 1));
    same(run(*wide, 3), r3);
    std::vector<View1<float>> s = wide->release_storage();
    wide.reset();
    const auto before = pointers(s);
    poison(s);
    auto narrow = std::make_unique<Gpt<float>>(cfg, shape(2, 0), std::move(s));
    same(run(*narrow, 2), r2);
    s = narrow->release_storage();
    narrow.reset();
    // Every buffer of the narrower plan came from the wider one's storage,
    // but the norms' and GELU's outputs: with cuts their second-order planes
    // are contracted as they are formed and have no storage, so the plan
    // without cuts frees the smaller buffer of that name and takes a new one.
    for (const View1<float>& v : s) {
      if (std::binary_search(before.begin(), before.end(), static_cast<const float*>(v.data()))) continue;
      CAPTURE(v.label());
      REQUIRE(sof);
      REQUIRE((v.label() == "gnh::gpt::ln" || v.label() == "gnh::gpt::fc_gelu"));
    }
    poison(s);
    Gpt<float> again(cfg, shape(3, 1), std::move(s));
    same(run(again, 3), r3);
  }
}

// The Gauss-Newton part GGN = J^T H_z J of the Hessian (its PyTorch and
// finite-difference checks are in tests/oracle/test_derivative_oracle.py).
// Here its identities: the products by forward-over-reverse are symmetric;
// their forms v^T (GGN v) equal the forms every path's forward gives (the
// head's z'^T H_z z') and are non-negative; along the untied head's weights
// alone the logits are linear in the parameters, so there the Hessian and its
// Gauss-Newton part agree; elsewhere they differ (the network's own second
// derivatives). Each comparison is of the same double sums in different
// orders over a few thousand terms: 1e-10 relative, as above.
TEST_CASE("Gauss-Newton products and forms: symmetric, non-negative, one value by every path", "[derivatives][model]") {
  const bool tied = GENERATE(false, true);
  CAPTURE(tied);
  const ModelConfig cfg = config(true, tied, Gelu::erf);
  const ParamLayout L(cfg);
  const index_t Tc = 6, n_blocks = 5, P = L.size(), K = 3;
  const auto ids = make_ids(n_blocks * Tc + 1, cfg.vocab_size, 21);
  View1<double> p = make_params<double>(cfg, 31);
  View2<double> dirs = random_dirs(K, P, 8);
  // Direction 2: the head's weights alone (the embedding's when tied).
  const index_t head = tied ? L.wte : L.lm_head, head_size = index_t(cfg.vocab_size) * cfg.n_embd;
  for (index_t i = 0; i < P; ++i)
    if (i < head || i >= head + head_size) dirs(2, i) = 0.0;
  Shape hs;
  hs.batch = 2;
  hs.context = Tc;
  hs.reverse = true;
  hs.directions = int(K);
  hs.head_chunk_vocab = 7;  // the online log-sum-exp over vocabulary chunks
  Gpt<double> hmodel(cfg, hs);
  View2<double> Gv("Gv", K, P);
  const EpochCurvature gn =
      epoch_curvature<double>(ExecSpace(), hmodel, p, dirs, ids.data(), all_blocks(n_blocks),
                              CurvatureMethod::forward_over_reverse, Gv, CurvatureOperator::gauss_newton);
  const EpochCurvature fr = epoch_curvature<double>(ExecSpace(), hmodel, p, dirs, ids.data(), all_blocks(n_blocks),
                                                    CurvatureMethod::forward_over_reverse);
  double uGv = 0, vGu = 0, scale = 0;
  for (index_t i = 0; i < P; ++i) {
    uGv += dirs(0, i) * Gv(1, i);
    vGu += dirs(1, i) * Gv(0, i);
    scale += std::abs(dirs(0, i) * Gv(1, i));
  }
  INFO("u^T GGN v = " << uGv << ", v^T GGN u = " << vGu);
  REQUIRE(std::abs(uGv - vGu) <= 1e3 * std::numeric_limits<double>::epsilon() * scale);
  for (int cuts : {0, 1}) {
    Gpt<double> smodel(cfg, second_order_shape(3, Tc, K, 5, cuts));
    const EpochCurvature so = epoch_curvature<double>(ExecSpace(), smodel, p, dirs, ids.data(), all_blocks(n_blocks),
                                                      CurvatureMethod::second_order_forward);
    for (index_t k = 0; k < K; ++k) {
      double form = 0;
      for (index_t i = 0; i < P; ++i) form += dirs(k, i) * Gv(k, i);
      CAPTURE(cuts, k, form, gn.vHv[k], gn.vGv[k], fr.vGv[k], so.vGv[k], fr.vHv[k]);
      REQUIRE(form > 0);
      REQUIRE(std::abs(gn.vHv[k] - form) <= 1e-10 * form);  // the pass's own v . (GGN v)
      REQUIRE(std::abs(gn.vGv[k] - form) <= 1e-10 * form);
      REQUIRE(std::abs(fr.vGv[k] - form) <= 1e-10 * form);
      REQUIRE(std::abs(so.vGv[k] - form) <= 1e-10 * form);
      if (k == 2 && !tied) REQUIRE(std::abs(fr.vHv[k] - form) <= 1e-10 * form);
      if (k < 2) REQUIRE(std::abs(fr.vHv[k] - form) > 1e-3 * form);
    }
  }
}

TEMPLATE_TEST_CASE("each sequence's own gradient from one reverse of the batch is that sequence's gradient alone",
                   "[derivatives][model]", float, double) {
  // Gpt::gradient_per_sequence batches every weight product over the
  // sequences (T rows each) and splits the column sums, the embedding's rows
  // and the head's tiles at sequence boundaries (tiles of 7 rows straddle the
  // sequences of 5, vocabulary chunks of 11); each row of its result must be
  // the gradient of an engine of that sequence alone, in every family, and a
  // padded sequence (targets ignored) exactly zero, whatever the rows held
  // before (NaN here: the weight matrices' first products write them, the
  // rest is zeroed, tied and untied wte alike). Both sides add the same
  // terms, in orders that differ only in how the head's tile and chunk
  // products group them: a few roundings of the largest entry, 64 units
  // (eps of T) bounds that, while a row sent to the wrong sequence moves
  // entries by their own size.
  using T = TestType;
  const double tol = 64 * double(std::numeric_limits<T>::epsilon());
  ModelConfig nano = config(true, true, Gelu::tanh), llama = config(false, false, Gelu::erf), neox = nano;
  llama.family = Family::llama;
  llama.n_kv_head = 1;
  llama.intermediate = 20;
  llama.qkv_bias = true;
  neox.family = Family::gpt_neox;
  neox.rotary_pct = 0.5;
  neox.parallel_residual = true;
  neox.tie_embeddings = false;
  const index_t Tc = 5, B = 4;
  for (const ModelConfig& cfg : {nano, llama, neox}) {
    CAPTURE(to_string(cfg.family));
    const index_t P = ParamLayout(cfg).size();
    const View1<T> p = make_params<T>(cfg, 31);
    const auto ids = make_ids(B * Tc + 1, cfg.vocab_size, 8);
    View2<std::int32_t> tok("tok", B, Tc), tgt("tgt", B, Tc);
    for (index_t b = 0; b < B; ++b)
      for (index_t t = 0; t < Tc; ++t) {
        tok(b, t) = ids[b * Tc + t];
        tgt(b, t) = b == B - 1 ? -1 : ids[b * Tc + t + 1];  // the last sequence: padding
      }
    Shape s;
    s.batch = B;
    s.context = Tc;
    s.reverse = true;
    s.head_chunk_rows = 7;
    s.head_chunk_vocab = 11;
    Gpt<T> batch(cfg, s);
    View2<T> per("per", B, P);
    Kokkos::deep_copy(per, std::numeric_limits<T>::quiet_NaN());
    const LossSum all = batch.gradient_per_sequence(ExecSpace(), p, tok, tgt, per);
    s.batch = 1;
    Gpt<T> one(cfg, s);
    View1<T> g("g", P), sum("sum", P);
    double loss = 0;
    for (index_t b = 0; b < B; ++b) {
      Kokkos::deep_copy(g, T(0));
      const auto row = [&](const View2<std::int32_t>& v) {
        return Span2<const std::int32_t>(v.data() + b * Tc, 1, Tc);
      };
      loss += one.gradient(ExecSpace(), p, row(tok), row(tgt), g).sum;
      double diff = 0, largest = 0, padding = 0;
      index_t not_finite = 0;  // std::max passes NaN over
      for (index_t i = 0; i < P; ++i) {
        diff = std::max(diff, std::abs(double(per(b, i)) - double(g(i))));
        largest = std::max(largest, std::abs(double(g(i))));
        padding = std::max(padding, std::abs(double(per(b, i))));
        not_finite += !std::isfinite(per(b, i));
      }
      CAPTURE(b, diff, largest);
      REQUIRE(not_finite == 0);
      if (b == B - 1) REQUIRE(padding == 0.0);
      else REQUIRE((largest > 0 && diff <= tol * largest));
    }
    REQUIRE(std::abs(all.sum - loss) <= tol * std::abs(loss));
    // The epoch pass's norms (SequenceNorms) by groups of the whole batch and
    // of one sequence, over the sequences before the padding: every |S_b|^2
    // and the batch's gradient, their sum, alike to the same rounding
    // (squares: twice the relative error).
    const std::vector<std::int64_t> ranges{0, std::int64_t(P)};
    std::vector<double> norms[2];
    View1<T> grads[2] = {View1<T>("grad_batch", P), View1<T>("grad_one", P)};
    for (int e = 0; e < 2; ++e) {
      SequenceNorms<T> q(e == 0 ? batch : one, ranges, {{0, 1}}, B);
      BatchScalars r;
      q.gradients(ExecSpace(), p, Span2<const std::int32_t>(tok.data(), B, Tc),
                  Span2<const std::int32_t>(tgt.data(), B, Tc), B - 1, grads[e], r);
      norms[e] = r.seq_sqnorm;
    }
    REQUIRE(norms[0].size() == std::size_t(B - 1));
    REQUIRE(norms[1].size() == std::size_t(B - 1));
    for (index_t b = 0; b < B - 1; ++b) {
      CAPTURE(b, norms[0][b], norms[1][b]);
      REQUIRE(norms[1][b] > 0.0);
      REQUIRE(std::abs(norms[0][b] - norms[1][b]) <= 2 * tol * norms[1][b]);
    }
    double diff = 0, largest = 0;
    for (index_t i = 0; i < P; ++i) {
      diff = std::max(diff, std::abs(double(grads[0](i)) - double(grads[1](i))));
      largest = std::max(largest, std::abs(double(grads[1](i))));
    }
    CAPTURE(diff, largest);
    REQUIRE(diff <= tol * largest);
  }
}
