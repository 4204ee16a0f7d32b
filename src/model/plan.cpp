// SPDX-License-Identifier: BSD-3-Clause
#include "model/plan.hpp"

#include <algorithm>
#include <cstdlib>
#include <stdexcept>
#include <string>

#include "core/error.hpp"
#include "kernels/attention_fused.hpp"
#include "kernels/attention_types.hpp"
#include "model/gpt.hpp"

namespace gnh {

bool adjoint_cuts_of(const ModelConfig& cfg, const Shape& shape) {
  if (!shape.second_order || shape.directions <= 0) return false;
  if (shape.adjoint_cuts >= 0) return shape.adjoint_cuts > 0;
  // GNH_ADJOINT_CUTS=0 keeps the plain second-order forward (no gradient pass,
  // no stored activations: SPEC §5's memory), 1 cuts at any K.
  const std::string setting = adjoint_cuts_setting();
  if (setting != "auto") return setting == "1";
  // A direction saves one dense product and 1.5 of attention's two; the pass
  // costs a forward and the adjoints' products (2 forwards). Cut from 3 times
  // the break-even by FLOPs: the pass's other costs (its elementwise work, the
  // contractions) put the measured break-even at about 1.5 times it (preset
  // small, AVX2, Zen 4: K = 4 gave 27.0-34.3 ms a direction with cuts against
  // 28.1-30.7 without), so the default cuts from about twice that.
  const ForwardFlops f = forward_flops_per_token(cfg, shape.context);
  return double(shape.directions) * (f.dense + 0.75 * f.attention) >= 3.0 * 2.0 * f.total();
}

std::string adjoint_cuts_setting() {
  const char* env = std::getenv("GNH_ADJOINT_CUTS");
  const std::string v = env ? env : "";
  if (v.empty()) return "auto";
  if (v != "0" && v != "1") fail("GNH_ADJOINT_CUTS: expected 0 or 1, got '", v, "'");
  return v;
}

ForwardFlops forward_flops_per_token(const ModelConfig& cfg, index_t context) {
  const double C = double(cfg.n_embd), L = double(cfg.n_layer), F = double(cfg.mlp_width());
  const double A = double(cfg.n_head) * cfg.head_size(), Akv = double(cfg.kv_heads()) * cfg.head_size();
  // Per layer: q, k, v and the output projection; the MLP's two (SwiGLU's three) products.
  const double mlp = (cfg.family == Family::llama ? 3.0 : 2.0) * C * F;
  ForwardFlops f;
  f.dense = 2.0 * L * (C * (A + 2.0 * Akv) + A * C + mlp);
  f.head = 2.0 * double(cfg.vocab_size) * C;
  f.attention = L * 2.0 * 2.0 * A * (double(context) + 1.0) / 2.0;
  return f;
}

namespace {
// The head's logits tile in values over its planes. GPU-shaped: whole
// vocabulary rows in 2^29 values (2 GiB in float), or 2^25 a plane where
// that is more, so that a tile's row kernels have hundreds of rows to spread
// over the multiprocessors, a batch few tiles: at the reference shape (V =
// 32000, 64 x 1024 rows) 4 tiles in the gradient, 20 at K = 1 and 63 at K =
// 16 second order (35 planes: 1,049 rows, 4.7 GB). On a host 2^24.
index_t head_tile_budget(const Shape& shape, index_t planes) {
  if (!shape.gpu_shaped) return index_t(1) << 24;
  return std::max<index_t>(index_t(1) << 29, planes * (index_t(1) << 25));
}
}  // namespace

GptTiles gpt_tiles(const ModelConfig& cfg, const Shape& shape) {
  GptTiles t;
  const index_t N = shape.batch * shape.context, C = cfg.n_embd, V = cfg.vocab_size;
  const bool tan = shape.directions > 0, sec = shape.second_order && tan;
  const index_t K = tan ? shape.directions : 0;
  // Logits tile on a host: at most 2^24 elements over all planes (64 MiB in
  // float). The
  // whole (N, V) block when it fits (the reverse then reuses the forward's
  // logits); otherwise vocabulary chunks of up to 4096 entries and as many
  // rows as fit, so that the head GEMMs keep large shapes for any K.
  // Second order: one plane of exponentials, and (K + 1) moment planes of
  // (rows, C) counted as up to K + 1 more logit planes.
  const index_t planes = 1 + K + (sec ? 2 + K : 0), budget = head_tile_budget(shape, planes);
  index_t vchunk = shape.head_chunk_vocab > 0 ? std::min<index_t>(shape.head_chunk_vocab, V) : V;
  if (shape.head_chunk_vocab <= 0 && !shape.gpu_shaped && N * V * planes > budget) vchunk = std::min<index_t>(V, 4096);
  // A miniature (Shape::scale) takes the full engine's tiles, of its sc times
  // more rows and vocabulary (head_chunk_rows counts the full engine's rows),
  // each sc times fewer rows.
  const index_t sc = std::max(1, shape.scale);
  index_t rows =
      shape.head_chunk_rows > 0 ? shape.head_chunk_rows : std::max<index_t>(1, budget / (vchunk * sc * planes));
  if (sc > 1) {
    const index_t tiles = (N * sc + rows - 1) / rows;
    rows = std::max<index_t>(1, (N + tiles - 1) / tiles);
  }
  t.logits_rows = std::min<index_t>(rows, N);
  t.logits_vocab = vchunk;
  if (shape.bf16) {
    // Operands are rounded chunk by chunk into two scratch buffers: chunks of
    // at most 2^22 elements of activations (no more than N rows of the
    // widest activation operand, 4C or the logits tile), and the largest
    // weight block whole. The chunk changes no value where it cuts C's rows
    // (op(A) = A, the stacked K N-row products among them: a row of C depends
    // only on its row of A); a product contracted over rows (op(A) = A^T)
    // accumulates C over its chunks, so its last bits follow the plan, the
    // same on every rank and thread count. gemm_batched rounds the operands of its K
    // products side by side (kernels/blas.hpp, bf16_batched), so each buffer
    // holds K of them: K weight blocks of up to 4096 vocabulary rows (a
    // larger logits tile batches fewer directions per call, not more memory).
    // The widest activation and the largest weight block of a layer: nanoGPT's
    // 4C; the MLP's F (Llama's gate and up: 2F rows), the fused q, k, v.
    const index_t G = std::max<index_t>(1, K), F = cfg.mlp_width();
    const index_t A = index_t(cfg.n_head) * cfg.head_size();
    const index_t wide = std::max<index_t>({4 * C, 2 * F, 3 * A});
    // A chunk is bf16_chunk elements but for one row of the widest operand
    // (kernels/blas.hpp, bf16_chunk_rows: equal chunks of rows). GPU-shaped,
    // the K chunks of a group share 2^26 elements (256 MiB in float) where
    // that is more than 2^22 each: each chunk is a copy and a product launch,
    // so the gradient's (K = 0) 84 M-element operands at the reference shape
    // go in 2 chunks, not 20; at K = 16 the chunk stays 2^22.
    const index_t widest = std::max<index_t>(wide, t.logits_vocab);
    const index_t per =
        shape.gpu_shaped ? std::max<index_t>(index_t(1) << 22, (index_t(1) << 26) / G) : index_t(1) << 22;
    t.bf16_chunk = std::min<index_t>(per / (sc * sc), N * widest);
    // A product alone, the K directions' N-row products stacked among them
    // (K N rows), takes the room of the K chunks of a batched one: at the
    // reference shape at K = 16 its 1 M rows go in 20 chunks of 2^26
    // elements, not 320 of 2^22, each a copy and a library call (a 4 us
    // launch for 3.4 us of bfloat16 product at 790 TFLOP/s). On a host
    // chunks stay as the host path's speed was measured with.
    t.bf16_single_chunk = shape.gpu_shaped ? G * t.bf16_chunk : t.bf16_chunk;  // bf16_chunk <= N widest already
    t.bf16_scratch_a = G * (t.bf16_chunk + widest);
    // GPU-shaped second order: a head tile's operands against the pair blocks
    // (kernels/lm_head_xent.hpp, pair_logits: K blocks of rows x 2C), then its
    // exponentials (rows x vocabulary chunk), rounded whole.
    if (shape.gpu_shaped && sec)
      t.bf16_scratch_a = std::max({t.bf16_scratch_a, K * t.logits_rows * 2 * C, t.logits_rows * t.logits_vocab});
    const index_t block = std::max<index_t>(wide * C, std::min<index_t>(t.logits_vocab, 4096) * C);
    // The gradient's head rounds a tile of h there (kernels/lm_head_xent.hpp,
    // with_rounded_tile).
    t.bf16_scratch_b = std::max({G * std::max(t.bf16_chunk + widest, block), V * C, t.logits_rows * C});
  }
  return t;
}

bool gpu_shaped_build() {
  return !std::is_same<ExecSpace, Kokkos::DefaultHostExecutionSpace>::value || gpu_shaped_from_env();
}

bool gpu_shaped_from_env() {
  const char* env = std::getenv("GNH_GPU_SHAPED");
  if (!env || !*env || std::string(env) == "0") return false;
  if (std::string(env) == "1") return true;
  throw std::invalid_argument(std::string("GNH_GPU_SHAPED=") + env + ": expected 0 or 1");
}

index_t attention_score_budget(bool device, index_t planes, bool directions) {
  if (!device) return planes * (index_t(1) << 20);
  return std::max(planes * (index_t(1) << 25), index_t(1) << (directions ? 28 : 30));
}

bool linear_pairs_requested() {
  const char* env = std::getenv("GNH_LINEAR_PAIRS");
  if (!env || !*env || std::string(env) == "1") return true;
  if (std::string(env) == "0") return false;
  throw std::invalid_argument(std::string("GNH_LINEAR_PAIRS=") + env + ": expected 0 or 1");
}

bool attention_forward_fused(const ModelConfig& cfg, const Shape& shape) {
  if (!shape.bf16 || cfg.head_size() > kernels::kFusedWidth) return false;
  return !kernels::attention_batched_requested();
}

namespace {
// The score planes of the engine's largest batched attention call (its
// forward's where that is not fused, or its reverse's); 0 where none is.
index_t score_planes(const ModelConfig& cfg, const Shape& shape) {
  const bool tan = shape.directions > 0, sec = shape.second_order && tan;
  const index_t K = tan ? shape.directions : 0;
  const bool fused = attention_forward_fused(cfg, shape) && (!sec || adjoint_cuts_of(cfg, shape));
  // The reverse of the primal is fused where the forward is (a gradient).
  const bool fused_reverse = attention_forward_fused(cfg, shape) && !tan;
  return std::max(fused ? index_t(0) : kernels::attention_score_planes(false, tan, sec, K),
                  shape.reverse && !fused_reverse ? kernels::attention_score_planes(true, tan, false, K) : index_t(0));
}
}  // namespace

index_t attention_planes_per_sequence(const ModelConfig& cfg, const Shape& shape) {
  return score_planes(cfg, shape) * index_t(cfg.n_head) * shape.context * shape.context;
}

index_t attention_chunk_sequences(const ModelConfig& cfg, const Shape& shape) {
  if (shape.attention_sequences > 0) return std::min(shape.attention_sequences, shape.batch);
  // A miniature plans as the full engine: its planes of sc^2 times more values.
  const index_t sc = std::max(1, shape.scale), planes = score_planes(cfg, shape);
  const index_t per = attention_planes_per_sequence(cfg, shape) * sc * sc;
  if (per == 0) return shape.batch;  // no batched call: one chunk of nothing
  return std::clamp<index_t>(
      attention_score_budget(shape.gpu_shaped, planes, shape.directions > 0 || shape.nested) / per, 1, shape.batch);
}

index_t attention_query_blocks(const Shape& shape) {
  if (shape.attention_blocks > 0) return shape.attention_blocks;
  const index_t T = shape.context * std::max(1, shape.scale);
  return std::max<index_t>(1, (T + kernels::kAttentionQueryRows - 1) / kernels::kAttentionQueryRows);
}

std::size_t plan_gpt_bytes(const ModelConfig& cfg, const Shape& shape, std::size_t scalar_bytes) {
  return scalar_bytes == sizeof(double) ? Gpt<double>::planned_bytes(cfg, shape)
                                        : Gpt<float>::planned_bytes(cfg, shape);
}

}  // namespace gnh
