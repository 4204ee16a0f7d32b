// SPDX-License-Identifier: BSD-3-Clause
// The whole GPT forward and the epoch loop against the double host reference.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>

#include "analysis/epoch.hpp"
#include "analysis/memory.hpp"
#include "analysis/sampling.hpp"
#include "core/random.hpp"
#include "kernel_profile.hpp"
#include "kernels/blas.hpp"
#include "model/gpt.hpp"
#include "support/reference.hpp"
#include "support/views.hpp"

using namespace gnh;

namespace {

ModelConfig make_config(int n_layer, int n_head, int n_embd, int block, int vocab, bool bias, bool tied, Gelu gelu) {
  ModelConfig c;
  c.n_layer = n_layer;
  c.n_head = n_head;
  c.n_embd = n_embd;
  c.block_size = block;
  c.vocab_size = vocab;
  c.bias = bias;
  c.tie_embeddings = tied;
  c.gelu = gelu;
  c.ln_eps = 1e-5;
  return c;
}

// Parameters with every option mattering: LayerNorm weights near 1, biases
// and matrices small but non-zero, embeddings O(1).
std::vector<double> make_params(const ModelConfig& cfg, std::uint64_t seed) {
  const ParamLayout L(cfg);
  std::vector<double> p(static_cast<std::size_t>(L.size()));
  for (const auto& t : L.tensors()) {
    const bool ln_weight = t.name.find("ln_") != std::string::npos && t.name.find("weight") != std::string::npos;
    const bool embedding = t.name.find("wte") != std::string::npos || t.name.find("wpe") != std::string::npos;
    const double scale = ln_weight ? 0.2 : embedding ? 0.8 : 0.3;
    const auto v =
        ref::random_vec(t.size, seed++, scale / (ln_weight || embedding ? 1.0 : std::sqrt(t.shape.back() / 4.0)),
                        ln_weight ? 1.0 : 0.0);
    std::copy(v.begin(), v.end(), p.begin() + t.offset);
  }
  return p;
}

std::vector<std::int32_t> make_tokens(std::size_t n, int vocab, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<std::int32_t> t(n);
  for (auto& x : t) x = static_cast<std::int32_t>(rng() % static_cast<std::uint64_t>(vocab));
  return t;
}

template <class T>
View2<std::int32_t> token_view(const std::vector<std::int32_t>& v, index_t B, index_t Tc) {
  View2<std::int32_t> d("tokens", B, Tc);
  auto h = Kokkos::create_mirror_view(d);
  for (index_t i = 0; i < B * Tc; ++i) h.data()[i] = v[static_cast<std::size_t>(i)];
  Kokkos::deep_copy(d, h);
  return d;
}

}  // namespace

TEMPLATE_TEST_CASE("GPT forward loss matches the double reference for every model option", "[model]", float, double) {
  using T = TestType;
  // (layers, heads, embd, block, vocab, bias, tied, gelu, B, T)
  const auto [nl, nh, ne, block, vocab, bias, tied, gelu, B, Tc] =
      GENERATE(table<int, int, int, int, int, bool, bool, Gelu, index_t, index_t>({
          {1, 1, 4, 8, 7, true, true, Gelu::erf, 1, 1},
          {2, 3, 12, 16, 29, false, true, Gelu::tanh, 2, 13},
          {2, 3, 12, 16, 29, true, false, Gelu::erf, 3, 16},
          {1, 2, 8, 11, 17, false, false, Gelu::tanh, 2, 11},
          {3, 5, 20, 9, 31, true, true, Gelu::tanh, 1, 7},
      }));
  CAPTURE(nl, nh, ne, block, vocab, bias, tied, gelu == Gelu::erf, B, Tc);
  const ModelConfig cfg = make_config(nl, nh, ne, block, vocab, bias, tied, gelu);
  // The reference sees exactly the parameters the model sees (rounded to T).
  const auto p = test::rounded<T>(make_params(cfg, 100));
  const auto tokens = make_tokens(B * Tc, vocab, 7);
  auto targets = make_tokens(B * Tc, vocab, 8);
  const bool ignore_one = B * Tc > 1;
  if (ignore_one) targets[0] = -1;  // an ignored target
  const double want = ref::model_loss(cfg, p, tokens, targets, B, Tc);

  for (bool save : {false, true}) {
    Shape shape;
    shape.batch = B;
    shape.context = Tc;
    shape.reverse = save;
    shape.head_chunk_rows = 3;
    shape.head_chunk_vocab = save ? 5 : 0;  // the head in (3, 5) tiles, or row chunks of the whole vocabulary
    Gpt<T> model(cfg, shape);
    const LossSum got = model.forward_loss(ExecSpace(), test::to_view1<T>(p), token_view<T>(tokens, B, Tc),
                                           token_view<T>(targets, B, Tc));
    REQUIRE(got.count == B * Tc - (ignore_one ? 1 : 0));
    const double loss = got.sum / double(got.count);
    // 1e-5 relative in float, 1e-12 in double: a few hundred eps of the
    // deepest dot products (here at most 4C = 80 long), with room for the
    // layers and the log-sum-exp around them.
    const double rel = std::is_same<T, float>::value ? 1e-5 : 1e-12;
    CAPTURE(save, loss, want);
    REQUIRE(std::abs(loss - want) <= rel * std::abs(want));
  }
}

TEST_CASE("epoch blocks and batch padding follow SPEC §3", "[model]") {
  REQUIRE(epoch_blocks(1, 4, 0) == 0);
  REQUIRE(epoch_blocks(5, 4, 0) == 1);
  REQUIRE(epoch_blocks(12, 4, 0) == 2);  // needs 4n+1 ids
  REQUIRE(epoch_blocks(13, 4, 0) == 3);
  REQUIRE(epoch_blocks(13, 4, 2) == 2);
  std::vector<std::int32_t> ids(13);
  for (int i = 0; i < 13; ++i) ids[i] = i;
  View2<std::int32_t, HostSpace> tok("tok", 3, 4), tgt("tgt", 3, 4);
  const index_t blocks[] = {1, 2};
  fill_batch(tok, tgt, ids.data(), blocks, 2);
  REQUIRE(tok(0, 0) == 4);
  REQUIRE(tgt(0, 3) == 8);
  REQUIRE(tok(1, 3) == 11);
  REQUIRE(tgt(1, 3) == 12);
  for (int t = 0; t < 4; ++t) REQUIRE(tgt(2, t) == -1);
}

TEST_CASE("epoch loss does not depend on the microbatch size", "[model]") {
  const ModelConfig cfg = make_config(2, 3, 12, 16, 23, true, true, Gelu::erf);
  const auto p = make_params(cfg, 300);
  const index_t Tc = 5, n_blocks = 7;  // 7 blocks: batches of 3 leave a padded last batch
  const auto ids = make_tokens(n_blocks * Tc + 1, cfg.vocab_size, 11);
  auto params = test::to_view1<double>(p);
  double reference = 0;
  for (index_t B : {1, 3, 7, 8}) {
    Gpt<double> model(cfg, B, Tc);
    const EpochLoss e = epoch_loss<double>(ExecSpace(), model, params, ids.data(), n_blocks);
    REQUIRE(e.tokens == n_blocks * Tc);
    if (B == 1) {
      // The per-block reference, summed by hand.
      double s = 0;
      for (index_t b = 0; b < n_blocks; ++b) {
        std::vector<std::int32_t> tk(ids.begin() + b * Tc, ids.begin() + b * Tc + Tc);
        std::vector<std::int32_t> tg(ids.begin() + b * Tc + 1, ids.begin() + b * Tc + Tc + 1);
        s += ref::model_loss(cfg, p, tk, tg, 1, Tc) * double(Tc);
      }
      reference = s / double(n_blocks * Tc);
      REQUIRE(std::abs(e.loss - reference) <= 1e-12 * reference);
    }
    // Only the order of the double sums differs between batch sizes.
    CAPTURE(B);
    REQUIRE(std::abs(e.loss - reference) <= 1e-13 * reference);
  }
}

TEST_CASE("the tf32 policy is FP32 on the host: gradient and curvature equal bit for bit", "[model][precision]") {
  // TF32 changes only how cuBLAS multiplies (gnh's own handle in TF32 math,
  // kernels/blas.hpp); on a host backend there is none and every number must
  // be identical.
  REQUIRE_FALSE(kernels::tf32_tensor_cores);
  const ModelConfig cfg = make_config(2, 2, 16, 8, 29, false, true, Gelu::erf);
  const auto pd = make_params(cfg, 500);
  std::vector<float> pf(pd.begin(), pd.end());
  auto params = test::to_view1<float>(std::vector<double>(pf.begin(), pf.end()));
  const index_t B = 2, Tc = 8, P = index_t(pf.size());
  const auto ids = make_tokens(B * Tc + 1, cfg.vocab_size, 3);
  std::vector<std::int32_t> tk(ids.begin(), ids.begin() + B * Tc), tg(ids.begin() + 1, ids.end());
  const auto tokens = token_view<float>(tk, B, Tc), targets = token_view<float>(tg, B, Tc);
  View2<float> dirs("dirs", 2, P);
  fill_rademacher<float>(ExecSpace(), dirs, 7, 0);
  std::vector<float> grads[2];
  std::vector<double> second[2];
  for (int tf32 = 0; tf32 < 2; ++tf32) {
    Shape s;
    s.batch = B;
    s.context = Tc;
    s.reverse = true;
    s.tf32 = tf32 == 1;
    Gpt<float> g(cfg, s);
    View1<float> grad("grad", P);
    g.gradient(ExecSpace(), params, tokens, targets, grad);
    auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), grad);
    grads[tf32].assign(h.data(), h.data() + P);
    Shape c = s;
    c.reverse = false;
    c.second_order = true;
    c.directions = 2;
    Gpt<float> so(cfg, c);
    second[tf32] = so.second_order(ExecSpace(), params, dirs, tokens, targets).second;
  }
  REQUIRE(std::memcmp(grads[0].data(), grads[1].data(), sizeof(float) * grads[0].size()) == 0);
  REQUIRE(second[0] == second[1]);
}

TEST_CASE("bf16-amp rounds every weight once a pass: a layer's products copy only their activations", "[model]") {
  // A gradient pass under bf16-amp rounds the parameters in one launch and
  // every product of a weight reads them there. Per layer, its four linear
  // layers' products then copy their activation operand in the forward and
  // in the input adjoint, and both operands of the weight adjoint: 16
  // copies a layer (24 with each weight rounded again by each product). The
  // model is small enough that every operand is one chunk.
  long copies[3] = {0, 0, 0};
  for (int nl = 1; nl <= 2; ++nl) {
    const ModelConfig cfg = make_config(nl, 2, 16, 8, 29, true, true, Gelu::erf);
    const auto pd = make_params(cfg, 600);
    auto params = test::to_view1<float>(pd);
    const index_t B = 2, Tc = 8, P = index_t(pd.size());
    const auto ids = make_tokens(B * Tc + 1, cfg.vocab_size, 4);
    std::vector<std::int32_t> tk(ids.begin(), ids.begin() + B * Tc), tg(ids.begin() + 1, ids.end());
    const auto tokens = token_view<float>(tk, B, Tc), targets = token_view<float>(tg, B, Tc);
    Shape s;
    s.batch = B;
    s.context = Tc;
    s.reverse = true;
    s.bf16 = true;
    Gpt<float> g(cfg, s);
    View1<float> grad("grad", P);
    const auto run = perf::record_run([&] { g.gradient(ExecSpace(), params, tokens, targets, grad); });
    long weights = 0;
    for (const auto& l : run.labels) {
      if (l.label == "gnh::gemm::round_bf16") copies[nl] = l.device_launches;
      if (l.label == "gnh::gpt::weights_bf16") weights = l.device_launches;
    }
    REQUIRE(weights == 1);
  }
  REQUIRE(copies[2] - copies[1] == 16);
}

TEST_CASE("curvature passes: fewest, balanced, never padded", "[analysis]") {
  using V = std::vector<gnh::index_t>;
  CHECK(gnh::balanced_passes(9, 8) == V{5, 4});
  CHECK(gnh::balanced_passes(9, 9) == V{9});
  CHECK(gnh::balanced_passes(9, 16) == V{9});
  CHECK(gnh::balanced_passes(16, 8) == V{8, 8});
  CHECK(gnh::balanced_passes(17, 8) == V{6, 6, 5});
  CHECK(gnh::balanced_passes(1, 8) == V{1});
  CHECK(gnh::balanced_passes(5, 1) == V{1, 1, 1, 1, 1});
  CHECK(gnh::balanced_passes(0, 8).empty());
  for (gnh::index_t D = 1; D <= 70; ++D)
    for (gnh::index_t K = 1; K <= 20; ++K) {
      const V s = gnh::balanced_passes(D, K);
      gnh::index_t sum = 0;
      for (auto k : s) sum += k;
      CHECK(sum == D);
      CHECK(gnh::index_t(s.size()) == (D + K - 1) / K);  // the fewest passes
      CHECK(s.front() <= K);
      CHECK(s.front() - s.back() <= 1);  // balanced, larger first
    }
}

TEST_CASE("the engine allocates exactly its plan (model/plan.hpp), for every mode", "[model][plan]") {
  // The dry run prints plan_gpt_bytes, counted by the constructor without
  // allocating: it is what the engine allocates, for every mode, tiling and
  // the bf16 scratch.
  // Every family (SPEC §11): Llama's q, k, v and gate|up buffers, GPT-NeoX's
  // widths, the rotary table.
  ModelConfig llama = make_config(2, 4, 16, 16, 37, false, false, Gelu::erf), neox = llama;
  llama.family = Family::llama;
  llama.n_kv_head = 2;
  llama.head_dim = 6;
  llama.intermediate = 24;
  neox.family = Family::gpt_neox;
  neox.intermediate = 40;
  neox.rotary_pct = 0.5;
  neox.parallel_residual = true;
  for (const ModelConfig& cfg : {make_config(2, 2, 16, 16, 37, true, true, Gelu::erf), llama, neox})
    for (int K : {0, 1, 3})
      for (bool reverse : {false, true})
        for (bool second : {false, true})
          for (bool bf16 : {false, true})
            for (index_t vocab_tile : {index_t(0), index_t(7)}) {
              Shape s;
              s.batch = 3;
              s.context = 5;
              s.directions = K;
              s.reverse = reverse;
              s.second_order = second;
              s.bf16 = bf16;
              s.head_chunk_vocab = vocab_tile;
              CAPTURE(K, reverse, second, bf16, vocab_tile);
              const Gpt<float> f(cfg, s);
              REQUIRE(f.workspace_bytes() == plan_gpt_bytes(cfg, s, sizeof(float)));
              if (!bf16) {
                const Gpt<double> d(cfg, s);
                REQUIRE(d.workspace_bytes() == plan_gpt_bytes(cfg, s, sizeof(double)));
              }
            }
}

TEST_CASE("per-sequence groups: the microbatch where its gradients fit, else a divisor with its own engine",
          "[analysis][plan]") {
  // analysis.per_sequence's grouping (analysis/memory.hpp) over a sweep of
  // microbatches and contexts of a model whose gradient is 0.2 GB: on a host
  // one sequence a reverse; on the GPU's path a divisor of the microbatch,
  // the whole of it exactly when its gradients fit the room, and the plan
  // holds the group's gradients and, below the microbatch, its engine.
  ModelConfig cfg;
  cfg.n_layer = 2;
  cfg.n_head = 16;
  cfg.n_embd = 1024;
  cfg.block_size = 2048;
  cfg.vocab_size = 32000;
  const std::size_t one = sizeof(float) * std::size_t(ParamLayout(cfg).size());
  int whole = 0, divisor = 0;
  for (index_t mb : {1, 4, 12, 64})
    for (index_t Tc : {64, 512, 2048}) {
      AnalysisSettings s;
      s.grad_microbatch = mb;
      s.context = Tc;
      CAPTURE(mb, Tc);
      REQUIRE(sequence_group(cfg, s, false) == 1);
      const index_t G = sequence_group(cfg, s, true);
      REQUIRE(mb % G == 0);
      const std::size_t engine = plan_gpt_bytes(cfg, gradient_shape(s), sizeof(float));
      const std::size_t room =
          std::max({engine, one + plan_gpt_bytes(cfg, sequence_shape(s, 1), sizeof(float)), kSequenceGroupFloor});
      REQUIRE((G == mb) == (one * std::size_t(mb) <= room));
      s.per_sequence = true;
      const MemoryPlan m = plan_memory(cfg, s, plan_case(s, 100, false, false), 1, true);
      const std::size_t own = G == mb ? 0 : plan_gpt_bytes(cfg, sequence_shape(s, G), sizeof(float));
      // Batches of one sequence take its norms in the batch's own gradient: no gradient of its own.
      REQUIRE(m.sequence == (mb == 1 ? 0 : one * std::size_t(G)) + own);
      REQUIRE(m.sequence <= room);
      whole += G == mb && mb > 1;
      divisor += G > 1 && G < mb;
    }
  REQUIRE(whole > 0);
  REQUIRE(divisor > 0);
}

TEST_CASE("the work ledger counts the primal's value plane once: LayerNorm's reverse and the head's forward",
          "[model][plan]") {
  // What the cost model prices (bench_engine --predict) is what each kernel
  // records moving. The LayerNorm reverse reads dy and x and writes dx once
  // per plane (and reads a row's two statistics); its parameters' column
  // sums read dy and x and add into 2 C gradient values. The head's forward,
  // one tile holding the batch with its exponentials kept, reads each logit
  // twice (the maximum, then the sum) and writes its exponential, and per
  // row writes two statistics. In the tangent of the reverse the LayerNorm's
  // planes are moved once more per direction. A value plane counted as a
  // direction (the primal's K is 1 where kernels loop over planes) doubles them.
  const ModelConfig cfg = make_config(2, 2, 16, 8, 29, true, true, Gelu::erf);
  const auto pd = make_params(cfg, 700);
  auto params = test::to_view1<float>(pd);
  const index_t B = 2, Tc = 8, P = index_t(pd.size()), N = B * Tc, C = 16, V = 29, L = 2, K = 3;
  const auto ids = make_tokens(N + 1, cfg.vocab_size, 5);
  std::vector<std::int32_t> tk(ids.begin(), ids.begin() + N), tg(ids.begin() + 1, ids.end());
  const auto tokens = token_view<float>(tk, B, Tc), targets = token_view<float>(tg, B, Tc);
  const auto bytes = [](const perf::RecordedRun& run, const std::string& label) {
    const auto it = run.work.labels.find(label);
    REQUIRE(it != run.work.labels.end());
    double b = 0;
    for (const double x : it->second.bytes) b += x;
    return b;
  };
  const double f = sizeof(float), calls = 2 * L + 1;  // ln_1 and ln_2 of each layer, ln_f
  for (const index_t k : {index_t(0), K}) {
    CAPTURE(k);
    Shape s;
    s.batch = B;
    s.context = Tc;
    s.reverse = true;
    s.directions = int(k);
    Gpt<float> g(cfg, s);
    View1<float> grad("grad", P);
    View2<float> dirs("dirs", k, P), hv("hv", k, P);
    const auto run = perf::record_run([&] {
      if (k == 0) g.gradient(ExecSpace(), params, tokens, targets, grad);
      else g.hvp(ExecSpace(), params, dirs, tokens, targets, grad, hv);
    });
    const double planes = double(1 + k);
    REQUIRE(bytes(run, "gnh::layernorm::reverse::input") == calls * (3 * planes * N * C + 2 * N) * f);
    REQUIRE(bytes(run, "gnh::layernorm::reverse::params") == calls * 2 * planes * (N * C + C) * f);
    // With directions (the host's row shape): the logits read twice, then
    // per direction the logits again (the weights exp(z - m)) and its
    // tangent plane; per row two statistics and lse' of each direction.
    if (k == 0) REQUIRE(bytes(run, "gnh::lm_head_xent::forward") == (3.0 * N * V + 2 * 2 * N) * f);
    else REQUIRE(bytes(run, "gnh::lm_head_xent::forward") == ((2.0 + 2 * k) * N * V + 2 * (2 + k) * N) * f);
  }
}
