// SPDX-License-Identifier: BSD-3-Clause
// Implementation of Gpt<T>; included by one translation unit per scalar type.
#pragma once
#include <algorithm>
#include <string>
#include <type_traits>

#include "core/error.hpp"
#include "kernels/attention.hpp"
#include "kernels/attention_batched.hpp"
#include "kernels/attention_fused.hpp"
#include "kernels/embedding.hpp"
#include "kernels/gelu.hpp"
#include "kernels/layernorm.hpp"
#include "kernels/linear.hpp"
#include "kernels/lm_head_xent.hpp"
#include "kernels/residual.hpp"
#include "kernels/rmsnorm.hpp"
#include "kernels/rotary.hpp"
#include "kernels/rows.hpp"
#include "kernels/swiglu.hpp"
#include "model/gpt.hpp"

namespace gnh {

// Widths: C = n_embd, A = n_head head_size (C in nanoGPT), F the MLP's
// width (4C in nanoGPT), Q = 3A (nanoGPT's c_attn, GPT-NeoX's
// query_key_value), and for Llama A_kv = n_kv_head head_size.
template <class T>
struct LayerActivations {
  Act2<T> ln1;                 // (N, C) one buffer for every layer and ln2 (recomputed in reverse)
  Act1<T> ln1_mean, ln1_rstd;  // (N) (RMSNorm: rstd only)
  Act2<T> qkv;                 // (N, Q), rotated in place where the family rotates (GPT-NeoX);
                               // Llama without q/k/v biases (N, A + 2 A_kv): [q | k | v]
  Act2<T> q, k, v;             // Llama with q/k/v biases: (N, A), (N, A_kv), (N, A_kv); q and k rotated in place
  Act2<T> att;                 // (N, A) attention output before its projection
  Act1<T> att_lse;             // (B*H*T)
  Act2<T> x_mid;               // (N, C) residual stream after attention
  Act2<T> ln2;                 // (N, C) the same buffer as ln1
  Act1<T> ln2_mean, ln2_rstd;  // (N)
  Act2<T> fc;                  // (N, F) MLP pre-activation (keep_gelu_ but not keep_rounded_: the GELU's slope after);
                               // Llama (N, 2F): [gate | up]
  Act2<T> fc_gelu;             // (N, F) one buffer for every layer (recomputed in reverse) but with keep_gelu_;
                               // Llama: SiLU(gate) up
  Act2<T> x_out;               // (N, C) block output
  Act1<T> att_p;               // keep_attention_: the attention's probabilities (host tiles), else empty
  // keep_rounded_: the inputs of the layer's products as they read them
  // (kernels/blas.hpp, Bf16Storage), N rows each: ln1 and ln2 (then not
  // recomputed in the reverse, their FP32 buffer never written), att (with
  // the fused attention, beside its FP32 y) and fc_gelu (its FP32 buffer
  // shared and never written); else null.
  kernels::Bf16Storage<T>*r_ln1 = nullptr, *r_att = nullptr, *r_ln2 = nullptr, *r_fcg = nullptr;
};

template <class T>
struct Adjoints {
  Act2<T> res;      // (N, C) adjoint of the residual stream
  Act2<T> c1, c2;   // (N, C) scratch
  Act2<T> att;      // (N, A)
  Act2<T> qkv;      // (N, Q)
  Act2<T> q, k, v;  // Llama
  Act2<T> fc_gelu;  // (N, F)
  Act2<T> fc;       // (N, F), Llama (N, 2F)
  Act1<T> D;        // (B*H*T) attention row terms
};

// Adjoint cuts (Gpt<T>::second_order): the primal adjoints of the inputs of
// one block's four linear layers and its attention, from the batch's adjoint pass.
template <class T>
struct CutAdjoints {
  Act2<T> ln1, att, ln2;  // (N, C), (N, A), (N, C): inputs of c_attn, attn.c_proj, c_fc (and their §11 likes)
  Act2<T> qkv;            // (N, Q): input of the attention (nanoGPT, GPT-NeoX: after the rotation)
  Act2<T> q, k, v;        // Llama: the attention's three inputs (q and k rotated)
  Act2<T> fc_gelu;        // (N, F): input of mlp.c_proj (dense_4h_to_h, down_proj)
  // With linear pairs (Gpt::cut_through): the adjoints of the projections
  // after the norms at their outputs, before any rotation, rounded as the
  // products read them: c_attn's (Llama: the fused q, k, v block's, or q's,
  // k's and v's one after another) and c_fc's (gate/up); the qkv, q, k, v
  // above are then not kept.
  kernels::Bf16Storage<T>* qkv_out = nullptr;
  kernels::Bf16Storage<T>* fc_out = nullptr;
};

namespace gpt_detail {
// A value as a rounded operand stores it (Bf16Storage<T>), back in T.
template <class T, class D>
KOKKOS_INLINE_FUNCTION T stored_value(D x) {
  if constexpr (std::is_same<D, std::uint16_t>::value) return bf16_value(x);
  else return T(x);
}

// acc(k, n) += 2 sum_c u_k(n, c) x'_k(n, c), x'_k in the layer-input room
// (kernels/room.hpp), one row (r = k N + n) a task: a projection's y''_k =
// 2 x'_k V_k^T contracted with its cut's adjoint a as 2 <a V_k, x'_k>, u_k
// = a V_k (Gpt::cut_through).
template <class T>
struct CutThroughRow {
  const T* u;
  const kernels::Bf16Storage<T>* room;
  kernels::RoomLayout layout;
  View2<double> acc;
  index_t N, C;
  template <class Lanes>
  KOKKOS_INLINE_FUNCTION void operator()(const Lanes& lanes, const index_t r) const {
    const index_t k = r / N, n = r - k * N;
    const T* ur = u + r * C;
    const T s =
        lanes.template sum<T>(C, [&](index_t c) { return ur[c] * stored_value<T>(room[layout.direction(k, n, c)]); });
    lanes.single([&] { acc(k, n) += 2.0 * double(s); });
  }
};

// acc(k, n) += sum_c adj(n, c) x''_k(n, c), one row (row r = k N + n) a task:
// what a cut contributes to d2/de2 of the summed loss.
template <class T>
struct CutRow {
  Act2<T> adj, x;
  View2<double> acc;
  index_t N, C;
  template <class Lanes>
  KOKKOS_INLINE_FUNCTION void operator()(const Lanes& lanes, const index_t r) const {
    const index_t k = r / N, n = r - k * N;
    const T* a = &adj.v(n, 0);
    const T* b = &x.dd(k, n, 0);
    const T s = lanes.template sum<T>(C, [&](index_t c) { return a[c] * b[c]; });
    lanes.single([&] { acc(k, n) += double(s); });
  }
};

// Zeroes chunk c of every sequence's gradient: a team per (sequence, chunk),
// bounds holding each chunk's first entry and end.
template <class T>
struct ZeroSequenceChunks {
  T* g;
  const index_t* bounds;
  index_t n_chunks, stride;
  template <class Member>
  KOKKOS_INLINE_FUNCTION void operator()(const Member& m) const {
    const index_t s = m.league_rank() / n_chunks, c = m.league_rank() - s * n_chunks;
    T* const row = g + s * stride;
    Kokkos::parallel_for(Kokkos::TeamVectorRange(m, bounds[2 * c], bounds[2 * c + 1]),
                         [&](const index_t i) { row[i] = T(0); });
  }
};
}  // namespace gpt_detail

template <class T>
struct GptBuffers {
  std::vector<LayerActivations<T>> acts;  // one per layer (reverse) or one shared (forward modes)
  Act2<T> x0;                             // (N, C) embedding output (reverse mode only)
  Act2<T> proj;                           // (N, C) c_proj outputs before the residual add
  Act2<T> lnf;                            // (N, C)
  Act1<T> lnf_mean, lnf_rstd;             // (N)
  Act1<T> head_lse;                       // (N)
  Act2<T> logits;        // (rows, vocabulary chunk) per plane: one tile of the head (one second-order plane)
  Act2<T> head_moments;  // (rows, C), K planes: the head's second-order moments
  View2<T> head_stats;   // (N, 2) the head's running maximum and target logit
  Adjoints<T> adj;
  std::vector<CutAdjoints<T>> cuts;  // one per layer, with adjoint cuts
};

template <class T>
Gpt<T>::~Gpt() = default;

template <class T>
Act2<T> Gpt<T>::act2(const char* name, index_t rows, index_t cols, bool tangents, bool second) {
  return act2_planes(name, rows, cols, tangents ? shape_.directions : 0, second ? shape_.directions : 0);
}

// K tangent and KK second-order planes of (rows, cols).
template <class T>
Act2<T> Gpt<T>::act2_planes(const char* name, index_t rows, index_t cols, index_t K, index_t KK) {
  const index_t plane = rows * cols, total = plane * (1 + K + KK);
  workspace_bytes_ += sizeof(T) * static_cast<std::size_t>(total);
  if (!allocate_) return Act2<T>();
  owned_.push_back(buffer(std::string("gnh::gpt::") + name, total));
  T* base = owned_.back().data();
  Act2<T> a;
  a.v = Span2<T>(base, rows, cols);
  if (K > 0) a.d = Span3<T>(base + plane, K, rows, cols);
  if (KK > 0) a.dd = Span3<T>(base + plane * (1 + K), KK, rows, cols);
  return a;
}

// The smallest reusable buffer of this label holding `total`, else a new
// one, after freeing the reusable buffers of this label (too small), so that
// the old and the new plan's buffers of a name are never held together.
template <class T>
View1<T> Gpt<T>::buffer(const std::string& label, index_t total) {
  std::size_t best = reusable_.size();
  for (std::size_t i = 0; i < reusable_.size(); ++i)
    if (reusable_[i].label() == label && reusable_[i].extent(0) >= std::size_t(total) &&
        (best == reusable_.size() || reusable_[i].extent(0) < reusable_[best].extent(0)))
      best = i;
  if (best < reusable_.size()) {
    View1<T> v = reusable_[best];
    reusable_.erase(reusable_.begin() + std::ptrdiff_t(best));
    return v;
  }
  reusable_.erase(
      std::remove_if(reusable_.begin(), reusable_.end(), [&](const View1<T>& v) { return v.label() == label; }),
      reusable_.end());
  return View1<T>(Kokkos::view_alloc(label, Kokkos::WithoutInitializing), total);
}

template <class T>
std::vector<View1<T>> Gpt<T>::release_storage() {
  std::vector<View1<T>> s = std::move(owned_);
  owned_.clear();
  if (adjoint_engine_) {
    std::vector<View1<T>> a = adjoint_engine_->release_storage();
    s.insert(s.end(), a.begin(), a.end());
    adjoint_engine_.reset();
  }
  buf_ = std::make_unique<GptBuffers<T>>();  // no span into the released storage stays
  return s;
}

template <class T>
Act1<T> Gpt<T>::act1(const char* name, index_t n, bool tangents, bool second) {
  const Act2<T> a = act2(name, 1, n, tangents, second);
  Act1<T> r;
  r.v = Span1<T>(a.v.data(), n);
  if (a.d.extent(0) > 0) r.d = Span2<T>(a.d.data(), a.d.extent(0), n);
  if (a.dd.extent(0) > 0) r.dd = Span2<T>(a.dd.data(), a.dd.extent(0), n);
  return r;
}

template <class T>
Gpt<T>::Gpt(const ModelConfig& cfg, index_t batch, index_t context)
    : Gpt(cfg, Shape{batch, context, 0, false, false, 0}) {}

template <class T>
Gpt<T>::Gpt(const ModelConfig& cfg, const Shape& shape) : Gpt(cfg, shape, true) {}

template <class T>
Gpt<T>::Gpt(const ModelConfig& cfg, const Shape& shape, std::vector<View1<T>> storage)
    : Gpt(cfg, shape, true, std::move(storage)) {}

template <class T>
std::size_t Gpt<T>::planned_bytes(const ModelConfig& cfg, const Shape& shape) {
  return Gpt(cfg, shape, false).workspace_bytes_;
}

// Every buffer of the engine, in one list: with allocate false, only counted.
// The steps below run in this order (a buffer reused from `storage` is found
// by its name, so the order of the list is part of the plan).
template <class T>
Gpt<T>::Gpt(const ModelConfig& cfg, const Shape& shape, bool allocate, std::vector<View1<T>> storage)
    : cfg_(cfg),
      layout_(cfg),
      shape_(shape),
      reusable_(std::move(storage)),
      buf_(std::make_unique<GptBuffers<T>>()),
      allocate_(allocate) {
  validate_shape();
  shape_.gpu_shaped = shape.gpu_shaped || gpu_shaped_build();
  N_ = shape.batch * shape.context;
  const index_t H = cfg.n_head, Dh = cfg.head_size();
  // Llama's q, k and v projections: one (A + 2 A_kv, C) block when their
  // weights are adjacent (no q/k/v biases between them), one buffer [q | k | v]
  // of one GEMM; three buffers otherwise (Qwen2).
  fused_qkv_ = cfg.family == Family::llama && !cfg.qkv_bias;
  if (fused_qkv_) qkv_layout_ = kernels::QkvLayout::fused(H, cfg.kv_heads(), Dh);
  else if (cfg.family == Family::llama) qkv_layout_ = kernels::QkvLayout::separate(H, cfg.kv_heads(), Dh);
  else if (cfg.family == Family::gpt_neox) qkv_layout_ = kernels::QkvLayout::interleaved(H, Dh);
  else qkv_layout_ = kernels::QkvLayout::fused(H, H, Dh);
  rotary_dims_ = cfg.rotary_dims();
  if (rotary_dims_ > 0) {
    workspace_bytes_ += sizeof(T) * static_cast<std::size_t>(shape.context * rotary_dims_);
    if (allocate) rotary_table_ = kernels::rotary_table<T>(ExecSpace(), shape.context, rotary_dims_, cfg.rope_theta);
  }
  const GptTiles plan = gpt_tiles(cfg, shape_);
  att_path_ = kernels::attention_path<T>(shape.bf16, shape_.gpu_shaped);
  att_fused_ = std::is_same<T, float>::value && att_path_ == kernels::AttentionPath::batched &&
               attention_forward_fused(cfg, shape_);
  const index_t att_e = choose_kept(plan);
  cuts_ = adjoint_cuts_of(cfg, shape);
  // bf16-amp, GPU-shaped second order with cuts: the projections after the
  // norms as pair products (plan_gemm) and their y'' contracted through
  // their weights (cut_through), never formed.
  linear_pairs_ = shape_.bf16 && shape_.gpu_shaped && shape_.second_order && shape_.directions > 0 &&
                  std::is_same<T, float>::value && cuts_ && linear_pairs_requested();
  plan_layers(att_e);
  plan_attention();
  plan_head(plan);
  if (shape.reverse) plan_adjoints(), plan_accumulated();
  plan_gemm(plan);
  const bool tan = shape.directions > 0, sec = shape.second_order && tan;
  workspace_bytes_ +=
      sizeof(double) * static_cast<std::size_t>(N_ * (1 + (tan ? shape.directions : 0) * (sec ? 3 : 2)));
  if (cuts_) plan_adjoint_cuts();
  reusable_.clear();  // what this plan did not reuse is freed
  reusable_.shrink_to_fit();
  if (!allocate_) return;
  row_loss_v_ = View1<double>("gnh::gpt::row_loss", N_);
  if (tan) row_loss_d_ = View2<double>("gnh::gpt::row_loss_d", shape.directions, N_);
  if (tan) row_loss_gn_ = View2<double>("gnh::gpt::row_loss_gn", shape.directions, N_);
  if (sec) row_loss_dd_ = View2<double>("gnh::gpt::row_loss_dd", shape.directions, N_);
}

template <class T>
void Gpt<T>::validate_shape() const {
  cfg_.validate("model");
  const Shape& shape = shape_;
  if (shape.batch <= 0) fail("batch size ", shape.batch, " must be positive");
  if (shape.context <= 0 || shape.context > cfg_.block_size)
    fail("context ", shape.context, " must be in 1..block_size (", cfg_.block_size, ")");
  if (shape.directions < 0) fail("directions per pass ", shape.directions, " must be >= 0");
}

// What the forward keeps for the reverse beyond the minimum; returns the
// elements of the attention's probabilities kept per sequence and head (0: none).
template <class T>
index_t Gpt<T>::choose_kept(const GptTiles& plan) {
  const index_t C = cfg_.n_embd, H = cfg_.n_head, N = N_;
  const bool tan = shape_.directions > 0;
  // The LayerNorm outputs are not kept per layer: every layer writes them
  // into one buffer (ln_1 and ln_2 share it), and the reverse recomputes them
  // from the block's input and x_mid, which are kept: 2C of the 16C values
  // per token and layer, for two LayerNorm forwards per layer in the reverse.
  // The GELU output likewise, recomputed from fc, except in the primal
  // reverse engine (the gradient's): there the forward keeps each layer's
  // GELU output and writes the GELU's slope over fc, which nothing else
  // reads, so the reverse evaluates no GELU. That is 4C more values per token
  // and layer (14C instead of 10C) against one GELU evaluation per layer,
  // erf and exp of each of the 4C values: 0.5-0.6 ms a layer at preset
  // small (Zen 4, AVX2 build), about a tenth of the reverse's time besides
  // its GEMMs.
  // Llama's SwiGLU output likewise (its reverse reads the gate and up values
  // in fc, so no slope is written there).
  const bool primal_reverse = shape_.reverse && !tan;
  keep_gelu_ = primal_reverse;
  // Under bf16-amp on a GPU the layers' linear inputs too, in bfloat16, as
  // their products read them: the norms, the GELU (SwiGLU) and the fused
  // attention write them rounded, so that neither the forward's products nor
  // the reverse's round them, and the reverse forms no norm again. That is
  // (3C + F) bfloat16 values per token and layer against the GELU output's F
  // floats it replaces, which one shared F-wide buffer keeps the shape of (at
  // the reference shape on a GPU, 2.35 + 0.34 GB for 2.68 GB), and 110 bytes
  // per token and C of a layer's traffic saved with F = 4C (the norms' 2 x
  // 22, the GELU's 4 x 14, the attention output's 10). Not in the adjoint
  // cuts' gradient engine, which the second order holds beside its planes.
  keep_rounded_ = primal_reverse && shape_.bf16 && shape_.gpu_shaped && !shape_.nested;
  // Likewise the head's exponentials, when one tile holds the batch's logits
  // (kernels/lm_head_xent.hpp, keep_exponentials): one exp per logit, not two.
  head_kept_ = primal_reverse && plan.logits_rows >= N && plan.logits_vocab >= cfg_.vocab_size;
  // And, where a tile holds whole vocabulary rows, the head's forward and
  // reverse run together in the reverse, so that no tile's logits are formed
  // twice (on a GPU: 4 of the gradient's 16 head GEMMs at the reference shape).
  head_fused_ = primal_reverse && plan.logits_vocab >= cfg_.vocab_size;
  // And the attention's probabilities (the host tiles' causal blocks), where
  // they take no more memory than the GELU output kept per layer (H E <= 4 C
  // T for E floats per sequence and head): short contexts, T <= 256 at
  // preset small and medium, not the reference's 1024 (where they would add
  // 60%). The reverse then forms neither the scores nor their softmax again.
  index_t att_e = 0;
  if (primal_reverse && att_path_ == kernels::AttentionPath::tiles) {
    att_e = kernels::host::attention_kept_elements(shape_.context);
    if (H * att_e > std::max<index_t>(cfg_.mlp_width(), 4 * C) * shape_.context) att_e = 0;
  }
  keep_attention_ = att_e > 0;
  return att_e;
}

// Every layer's activations (reverse: one slot per layer, else one shared).
template <class T>
void Gpt<T>::plan_layers(index_t att_e) {
  const index_t C = cfg_.n_embd, H = cfg_.n_head, N = N_, F = cfg_.mlp_width();
  const index_t A = H * cfg_.head_size(), Akv = index_t(cfg_.kv_heads()) * cfg_.head_size();
  const bool tan = shape_.directions > 0, sec = shape_.second_order && tan;
  const bool llama = cfg_.family == Family::llama;
  const int slots = shape_.reverse ? cfg_.n_layer : 1;
  residual_in_place_ = shape_.gpu_shaped && !shape_.reverse && !cfg_.parallel_residual;
  // With adjoint cuts the norms' y'' are contracted as they are formed
  // (layernorm_forward_cut, rmsnorm_forward_cut), never stored.
  const Act2<T> ln_shared = act2("ln", N, C, tan, sec && !cuts_);
  // With adjoint cuts the GELU's (SwiGLU's) y'' is contracted as it is
  // formed, never stored (gelu_forward_cut, swiglu_forward_cut): no
  // second-order planes.
  const Act2<T> gelu_shared = keep_gelu_ && !keep_rounded_ ? Act2<T>() : act2("fc_gelu", N, F, tan, sec && !cuts_);
  using R = kernels::Bf16Storage<T>;
  const index_t A_kept = att_fused_ ? A : 0, kept = N * (2 * C + A_kept + F);
  for (int l = 0; l < slots; ++l) {
    LayerActivations<T> a;
    a.ln1 = ln_shared;
    if (!llama) a.ln1_mean = act1("ln1_mean", N, tan, sec);
    a.ln1_rstd = act1("ln1_rstd", N, tan, sec);
    // With linear pairs the projections after the norms form no y''.
    const bool out_sec = sec && !linear_pairs_;
    if (llama && !fused_qkv_) {
      a.q = act2("q", N, A, tan, out_sec);
      a.k = act2("k", N, Akv, tan, out_sec);
      a.v = act2("v", N, Akv, tan, out_sec);
    } else {
      a.qkv = act2("qkv", N, llama ? A + 2 * Akv : 3 * A, tan, out_sec);
    }
    // With cuts the fused attention contracts its y'' as it forms it.
    a.att = act2("att", N, A, tan, sec && !(att_fused_ && cuts_));
    a.att_lse = act1("att_lse", shape_.batch * H * shape_.context, tan, sec);
    if (!residual_in_place_) a.x_mid = act2("x_mid", N, C, tan, sec);
    a.ln2 = ln_shared;
    if (!llama) a.ln2_mean = act1("ln2_mean", N, tan, sec);
    a.ln2_rstd = act1("ln2_rstd", N, tan, sec);
    a.fc = act2("fc", N, llama ? 2 * F : F, tan, out_sec);
    a.fc_gelu = keep_gelu_ && !keep_rounded_ ? act2("fc_gelu", N, F, tan, sec) : gelu_shared;
    a.x_out = act2("x_out", N, C, tan, sec);
    if (keep_rounded_) {
      const index_t floats = index_t((std::size_t(kept) * sizeof(R) + sizeof(T) - 1) / sizeof(T));
      R* const r = reinterpret_cast<R*>(act2_planes("rounded_inputs", 1, floats, 0, 0).v.data());
      if (r) {
        a.r_ln1 = r, a.r_ln2 = r + N * C, a.r_fcg = r + 2 * N * C;
        if (att_fused_) a.r_att = r + N * (2 * C + F);
      }
    }
    if (keep_attention_) a.att_p = act1("att_p", shape_.batch * H * att_e, false, false);
    buf_->acts.push_back(a);
  }
}

// The batched attention's score planes for a chunk of sequences (as many as
// attention_score_budget allows, at least one) and the pointer arrays of a
// queue of its products (kernels/gemm_mapped.hpp).
template <class T>
void Gpt<T>::plan_attention() {
  if (att_path_ != kernels::AttentionPath::batched) return;
  const index_t H = cfg_.n_head, Tc = shape_.context;
  const bool tan = shape_.directions > 0, sec = shape_.second_order && tan;
  const index_t K = tan ? shape_.directions : 0;
  const index_t per = attention_planes_per_sequence(cfg_, shape_);
  if (per == 0) return;  // every call fused: no score planes, operands or pointers
  const index_t seqs = attention_chunk_sequences(cfg_, shape_);
  const index_t pointers = 3 * kernels::MappedQueue<T>::kMax * std::max<index_t>(1, K) * seqs * H;
  // The score operands of a call with tangents, and under bf16-amp the
  // chunk's q, k, v (and dy) rounded, every plane a call reads: the larger
  // of the forward's need (x'' nonzero, the most) and the reverse's.
  const index_t A = H * cfg_.head_size(), Akv = index_t(cfg_.kv_heads()) * cfg_.head_size();
  const index_t width = A + 2 * Akv;
  // (The forward's in bfloat16 storage in float: AttentionScratch::bf16_storage.)
  const bool forward_fused = att_fused_ && (!sec || cuts_);
  const index_t forward =
      forward_fused ? 0
                    : kernels::attention_operand_values(qkv_layout_, Tc, width, false, sec ? 1 + 2 * K : 1 + K, tan,
                                                        sec, shape_.bf16, K, std::is_same<T, float>::value);
  const index_t reverse = shape_.reverse ? kernels::attention_operand_values(qkv_layout_, Tc, width, true, 1 + K, tan,
                                                                             false, shape_.bf16, K)
                                         : 0;
  const index_t operands = seqs * std::max(forward, reverse);
  workspace_bytes_ += sizeof(T) * static_cast<std::size_t>(seqs * per + operands) + sizeof(std::uintptr_t) * pointers;
  if (!allocate_) return;
  if (operands > 0)
    att_scratch_.operands =
        View1<T>(Kokkos::view_alloc("gnh::gpt::att_operands", Kokkos::WithoutInitializing), operands);
  att_scratch_.scores = View1<T>(Kokkos::view_alloc("gnh::gpt::att_scores", Kokkos::WithoutInitializing), seqs * per);
  att_scratch_.max_sequences = seqs;
  att_scratch_.query_blocks = attention_query_blocks(shape_);
  att_scratch_.pointers.pointers = View1<std::uintptr_t>("gnh::gpt::att_pointers", pointers);
}

// Attention on the engine's path: the fused kernel, the batched GEMMs or
// attention.hpp's kernels (the host tiles or the rows); cut: x'' is taken as
// zero and y'' contracted with cut_adj (the cut at the output projection's
// input: the fused kernel as it forms y'', else cut_at). r.dst (not null):
// where the fused kernel runs, y and y' written there as the output
// projection's rounded input, laid as r.layout says (without a cut, the
// primal's y beside them: keep_rounded_); returns whether they were.
template <class T>
template <class S>
bool Gpt<T>::attend(const ExecSpace& space, const Act2<T>& y, const Act1<T>& lse, const kernels::QkvActs<T>& x,
                    bool cut, T* keep_p, const kernels::detail::RoundedInput<T>& r, const Act2<T>& cut_adj) {
  kernels::Bf16Storage<T>* const rounded = r.dst;
  const index_t B = shape_.batch, Tc = shape_.context;
  if constexpr (std::is_same<T, float>::value)
    if (att_fused_ && (!has_second_v<S> || cut)) {
      if (has_second_v<S>) {
        const kernels::FusedCut fc{cut_adj, cut_dd_, cut_att_.data()};
        kernels::attention_forward_fused<S>(space, y, lse, x, qkv_layout_, B, Tc, rounded, false, &fc, r.layout);
      } else {
        kernels::attention_forward_fused<S>(space, y, lse, x, qkv_layout_, B, Tc, rounded, !cut, nullptr, r.layout);
      }
      return rounded != nullptr;
    }
  if (att_path_ == kernels::AttentionPath::batched)
    kernels::attention_forward_batched<S>(space, y, lse, x, qkv_layout_, B, Tc, gemm_.tf32, gemm_.bf16, !cut,
                                          att_scratch_);
  else
    kernels::attention_forward<S>(space, y, lse, x, qkv_layout_, B, Tc, gemm_.bf16, kernels::default_row_shape(), !cut,
                                  keep_p);
  cut_at(space, cut, cut_adj, y);
  return false;
}
template <class T>
template <class S>
void Gpt<T>::attend_reverse(const ExecSpace& space, const kernels::QkvActs<T>& dx, const Act1<T>& D, const Act2<T>& dy,
                            const kernels::QkvActs<T>& x, const Act2<T>& y, const Act1<T>& lse, const T* kept_p,
                            kernels::Bf16Storage<T>* rounded, bool fp32) {
  const index_t B = shape_.batch, Tc = shape_.context;
  if constexpr (std::is_same<T, float>::value && std::is_same<S, T>::value)
    if (att_fused_)
      return kernels::attention_reverse_fused(space, dx, D, dy, x, y, lse, qkv_layout_, B, Tc, rounded, fp32);
  if (rounded) throw std::logic_error("gnh::gpt: rounded attention adjoints without the fused reverse");
  if (att_path_ == kernels::AttentionPath::batched)
    return kernels::attention_reverse_batched<S>(space, dx, D, dy, x, y, lse, qkv_layout_, B, Tc, gemm_.tf32,
                                                 gemm_.bf16, att_scratch_);
  kernels::attention_reverse<S>(space, dx, D, dy, x, y, lse, qkv_layout_, B, Tc, gemm_.bf16,
                                kernels::default_row_shape(), kept_p);
}

// The embedding's output (reverse), the c_proj outputs, the final LayerNorm
// and the head's tile.
template <class T>
void Gpt<T>::plan_head(const GptTiles& plan) {
  const index_t C = cfg_.n_embd, N = N_;
  const bool tan = shape_.directions > 0, sec = shape_.second_order && tan;
  if (shape_.reverse) buf_->x0 = act2("x0", N, C, tan, sec);
  buf_->proj = act2("proj", N, C, tan, sec);
  buf_->lnf = act2("lnf", N, C, tan, sec);
  buf_->lnf_mean = act1("lnf_mean", N, tan, sec);
  buf_->lnf_rstd = act1("lnf_rstd", N, tan, sec);
  buf_->head_lse = act1("head_lse", N, tan, sec);
  // The head forms no second-order logits: one plane of exponentials and the
  // moments M_W, M_k (kernels/lm_head_xent.hpp).
  buf_->logits = act2_planes("logits", plan.logits_rows, plan.logits_vocab, tan ? shape_.directions : 0, sec ? 1 : 0);
  if (sec) buf_->head_moments = act2_planes("head_moments", plan.logits_rows, C, shape_.directions, 0);
  if (allocate_)
    buf_->head_stats = View2<T>(Kokkos::view_alloc("gnh::gpt::head_stats", Kokkos::WithoutInitializing), N, 2);
  workspace_bytes_ += sizeof(T) * static_cast<std::size_t>(2 * N);
}

// The reverse's adjoints (and their tangents, forward-over-reverse).
template <class T>
void Gpt<T>::plan_adjoints() {
  const index_t C = cfg_.n_embd, H = cfg_.n_head, N = N_, F = cfg_.mlp_width();
  const index_t A = H * cfg_.head_size(), Akv = index_t(cfg_.kv_heads()) * cfg_.head_size();
  const bool tan = shape_.directions > 0, llama = cfg_.family == Family::llama;
  buf_->adj.res = act2("d_res", N, C, tan, false);
  buf_->adj.c1 = act2("d_c1", N, C, tan, false);
  buf_->adj.c2 = act2("d_c2", N, C, tan, false);
  buf_->adj.att = act2("d_att", N, A, tan, false);
  if (llama && !fused_qkv_) {
    buf_->adj.q = act2("d_q", N, A, tan, false);
    buf_->adj.k = act2("d_k", N, Akv, tan, false);
    buf_->adj.v = act2("d_v", N, Akv, tan, false);
  } else {
    buf_->adj.qkv = act2("d_qkv", N, llama ? A + 2 * Akv : 3 * A, tan, false);
  }
  buf_->adj.fc_gelu = act2("d_fc_gelu", N, F, tan, false);
  buf_->adj.fc = act2("d_fc", N, llama ? 2 * F : F, tan, false);
  buf_->adj.D = act1("d_D", shape_.batch * H * shape_.context, tan, false);
  // GPU-shaped: the embedding's reverse groups the rows by token on the device.
  if (!shape_.gpu_shaped) return;
  workspace_bytes_ += kernels::detail::TokenWork::bytes(N, cfg_.vocab_size);
  if (allocate_) token_work_ = kernels::detail::TokenWork(N, cfg_.vocab_size);
}

// The operand precision of every matrix multiply, and bf16-amp's scratch.
template <class T>
void Gpt<T>::plan_gemm(const GptTiles& plan) {
  gemm_.tf32 = shape_.tf32 && std::is_same<T, float>::value;
  if (!shape_.bf16) return;
  if (!std::is_same<T, float>::value) fail("the bf16-amp policy runs in float");
  gemm_.bf16 = true;
  gemm_.chunk_elements = plan.bf16_chunk;
  gemm_.single_chunk_elements = plan.bf16_single_chunk;
  workspace_bytes_ += sizeof(T) * static_cast<std::size_t>(plan.bf16_scratch_a + plan.bf16_scratch_b);
  if (allocate_) {
    gemm_.scratch_a =
        View1<T>(Kokkos::view_alloc("gnh::gpt::bf16_a", Kokkos::WithoutInitializing), plan.bf16_scratch_a);
    gemm_.scratch_b =
        View1<T>(Kokkos::view_alloc("gnh::gpt::bf16_b", Kokkos::WithoutInitializing), plan.bf16_scratch_b);
  }
  // Every parameter and the head's K direction blocks, rounded (bfloat16
  // bits on cuBLAS: half the bytes), in as many T; GPU-shaped second order
  // in float, the direction blocks in pair blocks with the head's weights
  // (GemmPolicy::head_pairs): (K + 1) / 2 blocks of 3 (V, C).
  head_pairs_ = shape_.gpu_shaped && shape_.second_order && shape_.directions > 0 && std::is_same<T, float>::value;
  const index_t VC = index_t(cfg_.vocab_size) * cfg_.n_embd;
  const index_t blocks = head_pairs_ ? 3 * ((shape_.directions + 1) / 2) : shape_.directions;
  index_t values = layout_.size() + blocks * VC;
  // With cuts, the weights of the linear layers after the norms (q, k, v or
  // their fused block, and the MLP's first) in pair blocks too, after the
  // head's, and the attention's output projection where the fused attention
  // writes its input in pair blocks.
  pair_weights_.clear();
  if (linear_pairs_) {
    const index_t C = cfg_.n_embd, A = index_t(cfg_.n_head) * cfg_.head_size();
    const index_t Akv = index_t(cfg_.kv_heads()) * cfg_.head_size(), F = cfg_.mlp_width();
    const bool llama = cfg_.family == Family::llama;
    const index_t pairs3 = 3 * ((shape_.directions + 1) / 2);
    const auto add = [&](std::int64_t w, index_t out, index_t in) {
      pair_weights_.push_back({index_t(w), out, in, values});
      values += pairs3 * out * in;
    };
    for (const BlockOffsets& o : layout_.blocks) {
      if (llama && fused_qkv_) add(o.q_w, A + 2 * Akv, C);
      else if (llama) add(o.q_w, A, C), add(o.k_w, Akv, C), add(o.v_w, Akv, C);
      else add(o.attn_w, 3 * A, C);
      if (att_fused_) add(o.attn_proj_w, C, A);
      add(o.fc_w, llama ? 2 * F : F, C);
    }
  }
  const index_t ahead = index_t((std::size_t(values) * sizeof(kernels::Bf16Storage<T>) + sizeof(T) - 1) / sizeof(T));
  workspace_bytes_ += sizeof(T) * static_cast<std::size_t>(ahead);
  if (allocate_)
    rounded_ahead_ = View1<T>(Kokkos::view_alloc("gnh::gpt::weights_bf16", Kokkos::WithoutInitializing), ahead);
  // GPU-shaped with directions: room for a linear layer's input planes
  // rounded once for all its products (kernels/linear.hpp,
  // with_rounded_input): the widest input, x and with second order x'. Not
  // for a second order of so few directions that it runs without adjoint
  // cuts: there the planes' copies would cost more memory than their
  // rounding costs time (K = 1 within 8 GB at the reference shape).
  // A GPU-shaped reverse: room for a layer's adjoint and input, rounded once
  // for all the products that read them (with_rounded_adjoint): the widest
  // layer's inputs and outputs together.
  if (!shape_.gpu_shaped) return;
  index_t inputs = 0;
  if (shape_.directions > 0 && !(shape_.second_order && !cuts_)) {
    const index_t width = std::max<index_t>({cfg_.n_embd, index_t(cfg_.n_head) * cfg_.head_size(), cfg_.mlp_width()});
    inputs = N_ * width * (shape_.second_order ? 1 + shape_.directions : 1);
    // Pair blocks: of the norms' outputs, and of the fused attention's.
    const index_t paired =
        att_fused_ ? std::max<index_t>(cfg_.n_embd, index_t(cfg_.n_head) * cfg_.head_size()) : cfg_.n_embd;
    if (linear_pairs_) inputs = std::max(inputs, N_ * paired * 3 * ((shape_.directions + 1) / 2));
  }
  if (shape_.reverse) {
    const index_t C = cfg_.n_embd, A = index_t(cfg_.n_head) * cfg_.head_size(), F = cfg_.mlp_width();
    const index_t kv = index_t(cfg_.kv_heads()) * cfg_.head_size(), up = cfg_.family == Family::llama ? 2 * F : F;
    inputs = std::max(inputs, N_ * std::max<index_t>({C + A + 2 * kv, A + C, C + up, F + C}));
  }
  if (inputs == 0) return;
  const index_t room = index_t((std::size_t(inputs) * sizeof(kernels::Bf16Storage<T>) + sizeof(T) - 1) / sizeof(T));
  workspace_bytes_ += sizeof(T) * static_cast<std::size_t>(room);
  if (allocate_)
    gemm_.layer_input = View1<T>(Kokkos::view_alloc("gnh::gpt::layer_input_bf16", Kokkos::WithoutInitializing), room);
}

// bf16-amp: p rounded into rounded_ahead_ (one launch; the weights of every
// linear layer and of the head among it) and the head's K direction blocks
// (one launch), and weights_gemm_ reading them: a weight's products (the
// layers' forward and input adjoints, every head tile) then round only
// their activations. The layers' direction blocks, each read by one product
// a batch, are rounded there.
template <class T>
void Gpt<T>::round_ahead(const ExecSpace& space, const Params<T>& p) {
  weights_gemm_ = gemm_;
  if (!gemm_.bf16 || rounded_ahead_.extent(0) == 0) return;
  using D = kernels::Bf16Storage<T>;
  const index_t VC = index_t(cfg_.vocab_size) * cfg_.n_embd, P = layout_.size(), w = layout_.lm_head;
  const index_t K = index_t(p.d.extent(0));
  const index_t blocks = head_pairs_ ? 3 * ((K + 1) / 2) : K;
  const index_t end = pair_weights_.empty() ? P + blocks * VC
                                            : pair_weights_.back().at + 3 * ((K + 1) / 2) * pair_weights_.back().out *
                                                                            pair_weights_.back().in;
  if (end * index_t(sizeof(D)) > index_t(rounded_ahead_.extent(0) * sizeof(T)) ||
      (!pair_weights_.empty() && K != shape_.directions))
    throw std::logic_error("gnh::gpt: the rounded weights hold fewer directions than " + std::to_string(K));
  D* const dst = reinterpret_cast<D*>(rounded_ahead_.data());
  // The matrices span two scalable extents, the vectors (biases, norms) one.
  double values[3] = {0, 0, 0};
  for (const TensorInfo& t : layout_.tensors()) values[t.shape.size() >= 2 ? 2 : 1] += double(t.size);
  kernels::Traffic("gnh::gpt::weights_bf16").add(values[2], sizeof(T) + 2, 2).add(values[1], sizeof(T) + 2, 1);
  kernels::detail::rounded_copies(space, "gnh::gpt::weights_bf16", p.v.data(), 0, P, 0, 1, 1, dst, 0, -1);
  weights_gemm_.ahead[0] = {p.v.data(), P, 1, 0, dst};
  if (K == 0) return;
  if (head_pairs_) {
    kernels::detail::head_pair_blocks<T>(space, p.v.data() + w, p.d.data() + w, K, cfg_.vocab_size, cfg_.n_embd, P,
                                         dst + P);
    weights_gemm_.head_pairs = dst + P;
    weights_gemm_.head_vocab = cfg_.vocab_size;
    for (const PairWeight& q : pair_weights_)
      kernels::detail::head_pair_blocks<T>(space, p.v.data() + q.w, p.d.data() + q.w, K, q.out, q.in, P, dst + q.at);
    return;
  }
  kernels::detail::rounded_copies(space, "gnh::gpt::weights_bf16", p.d.data() + w, P, VC, 0, 1, K, dst + P, VC);
  weights_gemm_.ahead[1] = {p.d.data() + w, VC, K, P, dst + P};
}

// Adjoint cuts: the gradient pass's engine (reverse, no directions), the five
// cut adjoints of every layer, and the contractions per direction and row.
template <class T>
void Gpt<T>::plan_adjoint_cuts() {
  const index_t C = cfg_.n_embd, N = N_;
  Shape g = shape_;
  g.directions = 0;
  g.reverse = true;
  g.second_order = false;
  g.adjoint_cuts = 0;
  g.nested = true;
  const index_t A = index_t(cfg_.n_head) * cfg_.head_size(), Akv = index_t(cfg_.kv_heads()) * cfg_.head_size();
  const bool llama = cfg_.family == Family::llama;
  for (int l = 0; l < cfg_.n_layer; ++l) {
    CutAdjoints<T> c;
    c.ln1 = act2("cut_ln1", N, C, false, false);
    c.att = act2("cut_att", N, A, false, false);
    c.ln2 = act2("cut_ln2", N, C, false, false);
    if (linear_pairs_) {
      using R = kernels::Bf16Storage<T>;
      const index_t values = N * ((llama ? A + 2 * Akv : 3 * A) + (llama ? 2 : 1) * cfg_.mlp_width());
      const index_t floats = index_t((std::size_t(values) * sizeof(R) + sizeof(T) - 1) / sizeof(T));
      R* const r = reinterpret_cast<R*>(act2_planes("cut_out", 1, floats, 0, 0).v.data());
      c.qkv_out = r;
      if (r) c.fc_out = r + N * (llama ? A + 2 * Akv : 3 * A);
    } else if (llama && !fused_qkv_) {
      c.q = act2("cut_q", N, A, false, false);
      c.k = act2("cut_k", N, Akv, false, false);
      c.v = act2("cut_v", N, Akv, false, false);
    } else {
      c.qkv = act2("cut_qkv", N, llama ? A + 2 * Akv : 3 * A, false, false);
    }
    c.fc_gelu = act2("cut_fc_gelu", N, cfg_.mlp_width(), false, false);
    buf_->cuts.push_back(c);
  }
  workspace_bytes_ += Gpt<T>::planned_bytes(cfg_, g) + sizeof(double) * static_cast<std::size_t>(shape_.directions * N);
  // cut_through's a V_k, a (N, C) plane a direction.
  if (linear_pairs_) cut_u_ = act2_planes("cut_u", shape_.directions * N, C, 0, 0).v;
  // The fused attention's cut, a (K, N) plane a head (summed in order).
  if (att_fused_) cut_att_ = act2_planes("cut_att_heads", shape_.directions * cfg_.n_head, N, 0, 0).v;
  if (allocate_) {
    adjoint_engine_.reset(new Gpt<T>(cfg_, g, true, std::move(reusable_)));
    reusable_.clear();
    cut_dd_ = View2<double>("gnh::gpt::cut_dd", shape_.directions, N);
  }
}

template <class T>
Act2<T> Gpt<T>::x_in(int layer) const {
  // Reverse mode keeps every block's output; otherwise the stream alternates
  // between x_out and x_mid of the single slot (never an input of the op that
  // writes it).
  if (!shape_.reverse) return buf_->acts[0].x_out;
  return layer == 0 ? buf_->x0 : buf_->acts[layer - 1].x_out;
}

template <class T>
Act2<T> Gpt<T>::x_final() const {
  return buf_->acts.back().x_out;
}

template <class T>
void Gpt<T>::check_batch(Span2<const std::int32_t> tokens, Span2<const std::int32_t> targets) const {
  using kernels::require_extent;
  require_extent("gnh::gpt", "tokens rows", tokens.extent(0), shape_.batch);
  require_extent("gnh::gpt", "tokens cols", tokens.extent(1), shape_.context);
  require_extent("gnh::gpt", "targets rows", targets.extent(0), shape_.batch);
  require_extent("gnh::gpt", "targets cols", targets.extent(1), shape_.context);
}

template <class T>
template <class S>
LossSum Gpt<T>::forward(const ExecSpace& space, Params<T> p, Span2<const std::int32_t> tokens,
                        Span2<const std::int32_t> targets, bool head) {
  using namespace kernels;
  Kokkos::Profiling::pushRegion("gnh::gpt::forward");
  check_batch(tokens, targets);
  const ParamLayout& L = layout_;
  // Adjoint cuts: before each linear layer and the attention, x'' is
  // contracted with the input's primal adjoint (into cut_dd_) and the layer
  // takes it as zero.
  const bool cut = std::is_same<S, Jet2<T>>::value && cuts_;
  if (cut) {
    kernels::record_fill(double(cut_dd_.size()), sizeof(double), 1);
    Kokkos::deep_copy(space, cut_dd_, 0.0);
  }
  round_ahead(space, p);  // bf16-amp: the weights rounded once, for every product of the pass
  embedding_forward<S>(space, x_in(0), tokens, p, L.wte, L.wpe);
  for (int l = 0; l < cfg_.n_layer; ++l) {
    if (cfg_.family == Family::llama) forward_block_llama<S>(space, p, l, cut);
    else forward_block<S>(space, p, l, cut);
  }
  if (cfg_.family == Family::llama)
    rmsnorm_forward<S>(space, buf_->lnf, buf_->lnf_rstd, x_final(), p, L.lnf_w, -1, cfg_.ln_eps);
  else
    layernorm_forward<S>(space, buf_->lnf, buf_->lnf_mean, buf_->lnf_rstd, x_final(), p, L.lnf_w, L.lnf_b, cfg_.ln_eps);
  head_pending_ = !head;
  if (!head) {
    if (!std::is_same<S, T>::value || !head_fused_)
      throw std::logic_error("gnh::gpt::forward: only the primal gradient engine defers its head");
    Kokkos::Profiling::popRegion();
    return LossSum();
  }
  Act1<double> loss;
  loss.v = row_loss_v_;
  loss.d = row_loss_d_;
  loss.dd = row_loss_dd_;
  Span1<const std::int32_t> flat_targets(targets.data(), N_);
  lm_head_xent_forward<S>(space, loss, buf_->head_lse, buf_->lnf, p, L.lm_head, cfg_.vocab_size, flat_targets,
                          buf_->logits, buf_->head_stats, buf_->head_moments, weights_gemm_, head_rows(),
                          std::is_same<S, T>::value && head_kept_, row_loss_gn_);
  space.fence();
  const LossSum out = loss_sums<S>(flat_targets, cut);
  Kokkos::Profiling::popRegion();
  return out;
}

template <class T>
template <class S>
void Gpt<T>::rotate(const ExecSpace& space, const Act2<T>& x, index_t D, const kernels::RotarySegments& seg) {
  if (has_second_v<S> && x.dd.extent(0) == 0)
    kernels::rotary_forward<Dual<T>>(space, x, x, D, rotary_dims_, rotary_table_, seg);
  else kernels::rotary_forward<S>(space, x, x, D, rotary_dims_, rotary_table_, seg);
}

// acc(k, n) += <adj(n), x''_k(n)> over every direction and row (a cut), when cut.
template <class T>
void Gpt<T>::cut_at(const ExecSpace& space, bool cut, const Act2<T>& adj, const Act2<T>& x) {
  if (!cut) return;
  const index_t K = shape_.directions;
  // Each direction's x'' and the adjoint read; a double a row and direction.
  kernels::Traffic("gnh::gpt::cut")
      .add(double((K + 1) * N_ * x.cols()), sizeof(T), 2)
      .add(double(2 * K * N_), sizeof(double), 1);
  kernels::for_rows<T>(space, "gnh::gpt::cut", K * N_, gpt_detail::CutRow<T>{adj, x, cut_dd_, N_, x.cols()});
}

// A product's input as the kernel producing it rounds it, with cuts
// (kernels/linear.hpp, rounded_input_room): the room for its planes and the
// policy reading them there; without cuts or room, weights_gemm_ alone.
template <class T>
kernels::detail::RoundedInput<T> Gpt<T>::rounded_input(const Act2<T>& in, bool cut, kernels::Bf16Storage<T>* kept,
                                                       bool pairs) const {
  if (cut) return kernels::detail::rounded_input_room(weights_gemm_, in, shape_.directions, pairs && linear_pairs_);
  return {kernels::detail::reading_rounded(weights_gemm_, 2, in, kept), kept, {}};
}

template <class T>
const kernels::Bf16Storage<T>* Gpt<T>::weight_pairs(index_t w) const {
  for (const PairWeight& q : pair_weights_)
    if (q.w == w) return reinterpret_cast<const kernels::Bf16Storage<T>*>(rounded_ahead_.data()) + q.at;
  throw std::logic_error("gnh::gpt: no pair blocks of the weight at " + std::to_string(w));
}

template <class T>
kernels::GemmPolicy<T> Gpt<T>::pairs_of(const kernels::detail::RoundedInput<T>& r, index_t w) const {
  if (!r.pol.input_pairs) return r.pol;
  kernels::GemmPolicy<T> pol = r.pol;
  pol.weight_pairs = weight_pairs(w);
  return pol;
}

// u_k = sum over the projections of a V_k, one batched product a
// projection and parity (V_k in the weight's pair blocks: block k / 2, at
// column 0 for k even, 2C for k odd, rows 3C apart), then each row's
// 2 <u_k, x'_k> with x'_k where the norm wrote it. The same bfloat16 V_k and
// x'_k as the y''_k product, and a rounded as the products round their
// operands; the sums in another order.
template <class T>
void Gpt<T>::cut_through(const ExecSpace& space, const kernels::detail::RoundedInput<T>& r,
                         std::initializer_list<CutProjection> projections) {
  using namespace kernels;
  const index_t N = N_, C = cfg_.n_embd, K = shape_.directions, C3 = 3 * C;
  if (!r.pol.input_pairs || r.layout.C != C || projections.size() == 0)
    throw std::logic_error("gnh::gpt: a cut through the weights without the input's pair blocks");
  T* const u = cut_u_.data();
  T beta = T(0);
  for (const CutProjection& q : projections) {
    const Bf16Storage<T>* const wp = weight_pairs(q.w);
    gemm_batched_rounded<T>(space, false, false, N, C, q.out, T(1), q.adj, q.out, 0, wp, C3, q.out * C3, beta, u, C,
                            2 * N * C, (K + 1) / 2);
    gemm_batched_rounded<T>(space, false, false, N, C, q.out, T(1), q.adj, q.out, 0, wp + 2 * C, C3, q.out * C3, beta,
                            u + N * C, C, 2 * N * C, K / 2);
    beta = T(1);
  }
  // u and x' read (x' in a GPU's bfloat16), a double a row and direction.
  Traffic("gnh::gpt::cut_through").add(double(K * N * C), sizeof(T) + 2, 2).add(double(2 * K * N), sizeof(double), 1);
  for_rows<T>(space, "gnh::gpt::cut_through", K * N, gpt_detail::CutThroughRow<T>{u, r.dst, r.layout, cut_dd_, N, C});
}

// With keep_rounded_ the reverse's products read a layer's input x where the
// forward kept it (ahead slot 3, which with_rounded_adjoint then leaves as
// it is): the same bfloat16 values it would round x to.
template <class T>
kernels::GemmPolicy<T> Gpt<T>::kept_input(const Act2<T>& x, const kernels::Bf16Storage<T>* kept) const {
  return kernels::detail::reading_rounded(weights_gemm_, 3, x, kept);
}

// With keep_rounded_, where an adjoint dy's producer writes it rounded for
// the products that read it: the room with_rounded_adjoint would round it
// into (the layer-input room's start); null where there is none.
template <class T>
kernels::Bf16Storage<T>* Gpt<T>::adjoint_room(const Act2<T>& dy) const {
  using R = kernels::Bf16Storage<T>;
  const std::size_t need = std::size_t(dy.rows() * dy.cols()) * sizeof(R);
  if (!keep_rounded_ || weights_gemm_.layer_input.extent(0) * sizeof(T) < need) return nullptr;
  return reinterpret_cast<R*>(weights_gemm_.layer_input.data());
}

// Block l of the forward (nanoGPT, GPT-NeoX): attention and MLP, each after
// its LayerNorm and added to the residual stream. GPT-NeoX rotates the q and
// k of its query_key_value rows in place (per head [q | k | v]) and, with the
// parallel residual, takes the MLP's LayerNorm of the block's input:
// x_out = x + attn(LN1(x)) + mlp(LN2(x)).
template <class T>
template <class S>
void Gpt<T>::forward_block(const ExecSpace& space, Params<T> p, int l, bool cut) {
  using namespace kernels;
  const Act2<T> proj = buf_->proj;
  const BlockOffsets& o = layout_.blocks[l];
  const LayerActivations<T>& a0 = buf_->acts[shape_.reverse ? l : 0];
  const Act2<T> x = x_in(l);
  const Act2<T> ln1 = a0.ln1, qkv = a0.qkv, att = a0.att;
  // In place, the stream x is x_mid and x_out too.
  const bool in_place = residual_in_place_;
  const Act2<T> x_mid = in_place ? x : a0.x_mid, ln2 = a0.ln2;
  const Act2<T> fc = a0.fc, fc_gelu = a0.fc_gelu, x_out = a0.x_out;
  const CutAdjoints<T> cuts = cut ? buf_->cuts[l] : CutAdjoints<T>();
  // With cuts, the cut at each norm's output is taken as the norm forms y'',
  // and the norms and the GELU write y and y' as the next product's rounded
  // input where bf16-amp has room.
  const auto r1 = rounded_input(ln1, cut, a0.r_ln1, true);
  if (cut)
    layernorm_forward_cut<T>(space, ln1, a0.ln1_mean, a0.ln1_rstd, x, p, o.ln1_w, o.ln1_b, cfg_.ln_eps, cuts.ln1,
                             cut_dd_, r1.dst, r1.layout);
  else if (r1.dst)
    layernorm_forward_rounded<T>(space, ln1, a0.ln1_mean, a0.ln1_rstd, x, p, o.ln1_w, o.ln1_b, cfg_.ln_eps, r1.dst);
  else layernorm_forward<S>(space, ln1, a0.ln1_mean, a0.ln1_rstd, x, p, o.ln1_w, o.ln1_b, cfg_.ln_eps);
  linear_forward<S>(space, qkv, ln1, p, o.attn_w, o.attn_b, pairs_of(r1, o.attn_w), !cut);
  // With linear pairs qkv has no y'': its cut taken through the weights.
  const bool through = cut && linear_pairs_;
  if (through) cut_through(space, r1, {{index_t(o.attn_w), qkv.cols(), cuts.qkv_out}});
  if (rotary_dims_ > 0) rotate<S>(space, qkv, cfg_.head_size(), RotarySegments{3, 2});
  cut_at(space, cut && !through, cuts.qkv, qkv);
  T* const keep_p = std::is_same<S, T>::value && keep_attention_ ? a0.att_p.v.data() : nullptr;
  // With cuts the fused attention writes y and y' in pair blocks.
  const auto r4 = rounded_input(att, cut, a0.r_att, att_fused_);
  const bool att_rounded = attend<S>(space, att, a0.att_lse, QkvActs<T>{qkv, qkv, qkv}, cut, keep_p, r4, cuts.att);
  linear_forward<S>(space, in_place ? x : proj, att, p, o.attn_proj_w, o.attn_proj_b,
                    att_rounded ? pairs_of(r4, o.attn_proj_w) : weights_gemm_, !cut, in_place);
  if (!in_place) residual_forward<S>(space, x_mid, x, proj);
  const Act2<T> mlp_in = cfg_.parallel_residual ? x : x_mid;
  const auto r2 = rounded_input(ln2, cut, a0.r_ln2, true);
  if (cut)
    layernorm_forward_cut<T>(space, ln2, a0.ln2_mean, a0.ln2_rstd, mlp_in, p, o.ln2_w, o.ln2_b, cfg_.ln_eps, cuts.ln2,
                             cut_dd_, r2.dst, r2.layout);
  else if (r2.dst)
    layernorm_forward_rounded<T>(space, ln2, a0.ln2_mean, a0.ln2_rstd, mlp_in, p, o.ln2_w, o.ln2_b, cfg_.ln_eps,
                                 r2.dst);
  else layernorm_forward<S>(space, ln2, a0.ln2_mean, a0.ln2_rstd, mlp_in, p, o.ln2_w, o.ln2_b, cfg_.ln_eps);
  linear_forward<S>(space, fc, ln2, p, o.fc_w, o.fc_b, pairs_of(r2, o.fc_w), !cut);
  if (through) cut_through(space, r2, {{index_t(o.fc_w), fc.cols(), cuts.fc_out}});
  const auto r3 = rounded_input(fc_gelu, cut, a0.r_fcg);
  if constexpr (std::is_same<S, T>::value) {
    // fc keeps the pre-activation where the reverse forms the slope again
    // (keep_rounded_), else holds the slope now (keep_gelu_).
    if (r3.dst) gelu_forward_rounded<T>(space, r3.dst, Span2<const T>(fc.v), cfg_.gelu);
    else if (keep_gelu_) gelu_forward_slope_in_place<T>(space, fc_gelu.v, fc.v, cfg_.gelu);
    else gelu_forward<S>(space, fc_gelu, fc, cfg_.gelu);
  } else if (cut) {
    // The cut at fc_proj's input taken as the GELU forms y'' (not stored).
    gelu_forward_cut<T>(space, fc_gelu, fc, cfg_.gelu, cuts.fc_gelu, cut_dd_, r3.dst);
  } else {
    gelu_forward<S>(space, fc_gelu, fc, cfg_.gelu);
  }
  linear_forward<S>(space, in_place ? x : proj, fc_gelu, p, o.fc_proj_w, o.fc_proj_b, r3.pol, !cut, in_place);
  if (!in_place) residual_forward<S>(space, x_out, x_mid, proj);
}

// Block l of the Llama forward (SPEC §11): RMSNorm, the q, k, v projections
// (k and v of n_kv_head heads), q and k rotated in place, grouped-query
// attention, o_proj; RMSNorm, the gate and up projections as one (2F, C)
// block, SwiGLU, down_proj; each added to the residual stream.
template <class T>
template <class S>
void Gpt<T>::forward_block_llama(const ExecSpace& space, Params<T> p, int l, bool cut) {
  using namespace kernels;
  const index_t D = cfg_.head_size();
  const Act2<T> proj = buf_->proj;
  const BlockOffsets& o = layout_.blocks[l];
  const LayerActivations<T>& a = buf_->acts[shape_.reverse ? l : 0];
  const Act2<T> x = x_in(l);
  // Adjoint cuts (second_order): at the projections' inputs and the attention's.
  const CutAdjoints<T> cuts = cut ? buf_->cuts[l] : CutAdjoints<T>();
  const bool through = cut && linear_pairs_;  // the projections' cuts through their weights (cut_through)
  // With cuts, the norms and SwiGLU write y and y' as the next products'
  // rounded input where bf16-amp has room.
  const auto r1 = rounded_input(a.ln1, cut, a.r_ln1, true);
  if (cut)
    rmsnorm_forward_cut<T>(space, a.ln1, a.ln1_rstd, x, p, o.ln1_w, -1, cfg_.ln_eps, cuts.ln1, cut_dd_, r1.dst,
                           r1.layout);
  else if (r1.dst) rmsnorm_forward_rounded<T>(space, a.ln1, a.ln1_rstd, x, p, o.ln1_w, -1, cfg_.ln_eps, r1.dst);
  else rmsnorm_forward<S>(space, a.ln1, a.ln1_rstd, x, p, o.ln1_w, -1, cfg_.ln_eps);
  if (fused_qkv_) {
    // One GEMM into [q | k | v]; the first n_head + n_kv_head segments rotate.
    const index_t H = cfg_.n_head, G = cfg_.kv_heads();
    linear_forward<S>(space, a.qkv, a.ln1, p, o.q_w, -1, pairs_of(r1, o.q_w), !cut);
    if (through) cut_through(space, r1, {{index_t(o.q_w), a.qkv.cols(), cuts.qkv_out}});
    rotate<S>(space, a.qkv, D, RotarySegments{H + 2 * G, H + G});
    cut_at(space, cut && !through, cuts.qkv, a.qkv);
  } else {
    linear_forward<S>(space, a.q, a.ln1, p, o.q_w, o.q_b, pairs_of(r1, o.q_w), !cut);
    linear_forward<S>(space, a.k, a.ln1, p, o.k_w, o.k_b, pairs_of(r1, o.k_w), !cut);
    linear_forward<S>(space, a.v, a.ln1, p, o.v_w, o.v_b, pairs_of(r1, o.v_w), !cut);
    if (through) {
      const index_t A = a.q.cols(), Akv = a.k.cols();
      cut_through(space, r1,
                  {{index_t(o.q_w), A, cuts.qkv_out},
                   {index_t(o.k_w), Akv, cuts.qkv_out + N_ * A},
                   {index_t(o.v_w), Akv, cuts.qkv_out + N_ * (A + Akv)}});
    }
    rotate<S>(space, a.q, D, RotarySegments{});
    rotate<S>(space, a.k, D, RotarySegments{});
    cut_at(space, cut && !through, cuts.q, a.q);
    cut_at(space, cut && !through, cuts.k, a.k);
    cut_at(space, cut && !through, cuts.v, a.v);
  }
  const QkvActs<T> x3 = fused_qkv_ ? QkvActs<T>{a.qkv, a.qkv, a.qkv} : QkvActs<T>{a.q, a.k, a.v};
  T* const keep_p = std::is_same<S, T>::value && keep_attention_ ? a.att_p.v.data() : nullptr;
  const auto r4 = rounded_input(a.att, cut, a.r_att, att_fused_);
  const bool att_rounded = attend<S>(space, a.att, a.att_lse, x3, cut, keep_p, r4, cuts.att);
  // In place, the stream x is x_mid and x_out too.
  const bool in_place = residual_in_place_;
  const Act2<T> x_mid = in_place ? x : a.x_mid;
  linear_forward<S>(space, in_place ? x : proj, a.att, p, o.attn_proj_w, o.attn_proj_b,
                    att_rounded ? pairs_of(r4, o.attn_proj_w) : weights_gemm_, !cut, in_place);
  if (!in_place) residual_forward<S>(space, x_mid, x, proj);
  const auto r2 = rounded_input(a.ln2, cut, a.r_ln2, true);
  if (cut)
    rmsnorm_forward_cut<T>(space, a.ln2, a.ln2_rstd, x_mid, p, o.ln2_w, -1, cfg_.ln_eps, cuts.ln2, cut_dd_, r2.dst,
                           r2.layout);
  else if (r2.dst) rmsnorm_forward_rounded<T>(space, a.ln2, a.ln2_rstd, x_mid, p, o.ln2_w, -1, cfg_.ln_eps, r2.dst);
  else rmsnorm_forward<S>(space, a.ln2, a.ln2_rstd, x_mid, p, o.ln2_w, -1, cfg_.ln_eps);
  linear_forward<S>(space, a.fc, a.ln2, p, o.fc_w, -1, pairs_of(r2, o.fc_w), !cut);
  if (through) cut_through(space, r2, {{index_t(o.fc_w), a.fc.cols(), cuts.fc_out}});
  const auto r3 = rounded_input(a.fc_gelu, cut, a.r_fcg);
  if (cut) swiglu_forward_cut<T>(space, a.fc_gelu, a.fc, cuts.fc_gelu, cut_dd_, r3.dst);
  else if (r3.dst) swiglu_forward_rounded<T>(space, r3.dst, a.fc, cfg_.mlp_width());
  else swiglu_forward<S>(space, a.fc_gelu, a.fc);
  linear_forward<S>(space, in_place ? x : proj, a.fc_gelu, p, o.fc_proj_w, -1, r3.pol, !cut, in_place);
  if (!in_place) residual_forward<S>(space, a.x_out, x_mid, proj);
}

// The batch's loss over its valid targets and, by mode, its first and second
// derivatives per direction (with cuts, plus every row's contractions), from
// the per-row values of the forward (fenced). Fixed-order host sums in
// double: deterministic on every backend.
template <class T>
template <class S>
LossSum Gpt<T>::loss_sums(Span1<const std::int32_t> flat_targets, bool cut) const {
  auto h_loss = Kokkos::create_mirror_view_and_copy(HostSpace(), row_loss_v_);
  auto h_targets = Kokkos::create_mirror_view_and_copy(HostSpace(), flat_targets);
  LossSum out;
  for (index_t n = 0; n < N_; ++n) {
    if (h_targets(n) < 0) continue;
    out.sum += h_loss(n);
    ++out.count;
  }
  if constexpr (!std::is_same<S, T>::value) {
    const index_t K = shape_.directions;
    auto h_d = Kokkos::create_mirror_view_and_copy(HostSpace(), row_loss_d_);
    auto h_gn = Kokkos::create_mirror_view_and_copy(HostSpace(), row_loss_gn_);
    out.first.assign(K, 0.0);
    out.gauss_newton.assign(K, 0.0);
    for (index_t k = 0; k < K; ++k)
      for (index_t n = 0; n < N_; ++n)
        if (h_targets(n) >= 0) {
          out.first[k] += h_d(k, n);
          out.gauss_newton[k] += h_gn(k, n);
        }
    if (K > 0) {
      const index_t Tc = shape_.context;
      out.first_seq.assign(std::size_t(shape_.batch), 0.0);
      for (index_t n = 0; n < N_; ++n)
        if (h_targets(n) >= 0) out.first_seq[std::size_t(n / Tc)] += h_d(0, n);
    }
    if constexpr (std::is_same<S, Jet2<T>>::value) {
      auto h_dd = Kokkos::create_mirror_view_and_copy(HostSpace(), row_loss_dd_);
      out.second.assign(K, 0.0);
      for (index_t k = 0; k < K; ++k)
        for (index_t n = 0; n < N_; ++n)
          if (h_targets(n) >= 0) out.second[k] += h_dd(k, n);
      if (cut) {
        // Every row's contractions: a row's activations reach other rows' losses.
        auto h_cut = Kokkos::create_mirror_view_and_copy(HostSpace(), cut_dd_);
        for (index_t k = 0; k < K; ++k)
          for (index_t n = 0; n < N_; ++n) out.second[k] += h_cut(k, n);
      }
    }
  }
  return out;
}

template <class T>
template <class S>
void Gpt<T>::reverse(const ExecSpace& space, Params<T> p, Grads<T> g, Span2<const std::int32_t> tokens,
                     Span2<const std::int32_t> targets, bool gauss_newton) {
  using namespace kernels;
  Kokkos::Profiling::pushRegion("gnh::gpt::reverse");
  const ParamLayout& L = layout_;
  const Act2<T> res = buf_->adj.res, c1 = buf_->adj.c1;
  Span1<const std::int32_t> flat_targets(targets.data(), N_);
  // reverse<S> always follows forward<S> of the same batch (gradient, hvp).
  if (std::is_same<S, T>::value && head_pending_) {
    // The head deferred by the forward, forward and reverse tile by tile.
    head_pending_ = false;
    Act1<double> loss;
    loss.v = row_loss_v_;
    lm_head_xent_gradient<T>(space, loss, buf_->head_lse, c1, g, buf_->lnf, p, L.lm_head, cfg_.vocab_size, flat_targets,
                             buf_->logits, buf_->head_stats, weights_gemm_, head_rows(), head_kept_);
  } else {
    const Span2<const T> kept =
        std::is_same<S, T>::value && head_kept_ ? Span2<const T>(buf_->head_stats) : Span2<const T>();
    lm_head_xent_reverse<S>(space, c1, g, buf_->head_lse, buf_->lnf, p, L.lm_head, cfg_.vocab_size, flat_targets,
                            buf_->logits, weights_gemm_, /*logits_current=*/true, kept, head_rows(), gauss_newton);
  }
  if (cfg_.family == Family::llama) rmsnorm_reverse<S>(space, res, g, c1, x_final(), buf_->lnf_rstd, p, L.lnf_w, -1);
  else layernorm_reverse<S>(space, res, g, c1, x_final(), buf_->lnf_mean, buf_->lnf_rstd, p, L.lnf_w, L.lnf_b);
  bool res_rounded = false;
  for (int l = cfg_.n_layer - 1; l >= 0; --l) {
    if (cfg_.family == Family::llama) res_rounded = reverse_block_llama<S>(space, p, g, l, res_rounded);
    else res_rounded = reverse_block<S>(space, p, g, l, res_rounded);
  }
  // The tied head's contribution is already in g[wte]; the embedding adds its own.
  if (g.v.extent(0) > 0)
    embedding_reverse<S>(space, g, res, tokens, L.wte, L.wpe, token_work_.N > 0 ? &token_work_ : nullptr);
  space.fence();
  Kokkos::Profiling::popRegion();
}

// Block l of the reverse (nanoGPT, GPT-NeoX); res holds d x_out and leaves
// holding d x_in.
// With keep_rounded_ the accumulations into res write it as its next
// products read it too (accumulate_res), but the block's last, whose d x_in
// the embedding reads.
template <class T>
template <class S>
bool Gpt<T>::accumulate_res(const ExecSpace& space, const Act2<T>& res, const Act2<T>& a, bool rounded) {
  if constexpr (std::is_same<S, T>::value) {
    if (kernels::Bf16Storage<T>* const dst = rounded ? adjoint_room(res) : nullptr) {
      kernels::accumulate_rounded<T>(space, res, a, dst);
      return true;
    }
  }
  kernels::accumulate<S>(space, res, a);
  return false;
}

// The MLP's output projection and GELU in the reverse of block l
// (nanoGPT, GPT-NeoX): x_out = x_mid + c_proj(gelu(c_fc(ln_2(m)))), m =
// x_mid (x_in when parallel), res holding d x_out and read with proj_pol.
// gelu(fc) is recomputed (a shared buffer, see the planner) except where
// the forward kept it and left gelu'(fc) in fc (keep_gelu_). Without
// directions the recomputation leaves gelu'(fc) in d_fc, which the GELU's
// reverse then scales by d fc_gelu in place. With keep_rounded_ the forward
// kept gelu(fc) rounded and fc itself, and the GELU's reverse forms
// gelu'(fc) again and writes d fc as c_fc's products read it too (in FP32
// only for c_fc's bias), into the room with_rounded_adjoint would round it
// into: one GELU evaluation more, memory-bound on a GPU, for a plane of
// slopes neither written nor read.
// Leaves d fc in the adjoints; returns c_fc's policy.
template <class T>
template <class S>
kernels::GemmPolicy<T> Gpt<T>::reverse_gelu(const ExecSpace& space, Params<T> p, Grads<T> g, int l,
                                            const kernels::GemmPolicy<T>& proj_pol) {
  using namespace kernels;
  const Act2<T> res = buf_->adj.res, d_fcg = buf_->adj.fc_gelu, d_fc = buf_->adj.fc;
  const BlockOffsets& o = layout_.blocks[l];
  const LayerActivations<T>& a = buf_->acts[l];
  GemmPolicy<T> fc_pol = kept_input(a.ln2, a.r_ln2);
  if constexpr (std::is_same<S, T>::value) {
    if (!keep_gelu_) gelu_forward_slope<T>(space, a.fc_gelu.v, d_fc.v, a.fc.v, cfg_.gelu);
    linear_reverse<S>(space, d_fcg, g, res, a.fc_gelu, p, o.fc_proj_w, o.fc_proj_b, proj_pol);
    keep_cut<S>(space, l, &CutAdjoints<T>::fc_gelu, d_fcg);
    if (Bf16Storage<T>* const dst = a.r_fcg ? adjoint_room(d_fc) : nullptr) {
      gelu_reverse_rounded<T>(space, o.fc_b >= 0 ? d_fc.v : Span2<T>(), d_fcg.v, a.fc.v, cfg_.gelu, dst);
      fc_pol = kernels::detail::reading_rounded(fc_pol, 2, d_fc, dst);
    } else {
      gelu_reverse_slope<T>(space, d_fc.v, d_fcg.v, keep_gelu_ ? a.fc.v : d_fc.v);  // where the slope is
      if (keep_into_) keep_cut_rounded<S>(space, keep_into_->cuts[l].fc_out, d_fc);
    }
  } else {
    gelu_forward<S>(space, a.fc_gelu, a.fc, cfg_.gelu);
    linear_reverse<S>(space, d_fcg, g, res, a.fc_gelu, p, o.fc_proj_w, o.fc_proj_b, proj_pol);
    gelu_reverse<S>(space, d_fc, d_fcg, a.fc, cfg_.gelu);
  }
  return fc_pol;
}

// With keep_into_ set (the primal reverse of an engine with adjoint cuts),
// the adjoint of each linear layer's and the attention's input is copied
// out for the cut.
template <class T>
template <class S>
void Gpt<T>::keep_cut(const ExecSpace& space, int l, Act2<T> CutAdjoints<T>::*which, const Act2<T>& adj) {
  if (!std::is_same<S, T>::value || !keep_into_) return;
  const Act2<T>& dst = keep_into_->cuts[l].*which;
  if (dst.v.size() > 0) Kokkos::deep_copy(space, dst.v, adj.v);  // none where kept rounded (keep_cut_rounded)
}

template <class T>
template <class S>
void Gpt<T>::keep_cut_rounded(const ExecSpace& space, kernels::Bf16Storage<T>* dst, const Act2<T>& adj) {
  if (std::is_same<S, T>::value && dst)
    kernels::detail::rounded_copies(space, "gnh::gpt::cut_adjoint", adj.v.data(), 0, adj.cols(), 0, adj.rows(), 1, dst,
                                    0);
}

template <class T>
template <class S>
bool Gpt<T>::reverse_block(const ExecSpace& space, Params<T> p, Grads<T> g, int l, bool res_rounded) {
  using namespace kernels;
  const Act2<T> res = buf_->adj.res, c1 = buf_->adj.c1, c2 = buf_->adj.c2;
  const Act2<T> d_att = buf_->adj.att, d_qkv = buf_->adj.qkv, d_fc = buf_->adj.fc;
  const Act1<T> D = buf_->adj.D;
  const BlockOffsets& o = layout_.blocks[l];
  const LayerActivations<T>& a = buf_->acts[l];
  const bool parallel = cfg_.parallel_residual;
  auto keep = [&](Act2<T> CutAdjoints<T>::*which, const Act2<T>& adj) { keep_cut<S>(space, l, which, adj); };
  // The policy of a product reading res, where it is in the adjoint room.
  const auto res_pol = [&](const GemmPolicy<T>& pol, bool rounded) {
    return kernels::detail::reading_rounded(pol, 2, res, rounded ? adjoint_room(res) : nullptr);
  };
  // The parallel residual's attention reads d x_out before the MLP's adjoint
  // is added to res.
  if (parallel)
    linear_reverse<S>(space, d_att, g, res, a.att, p, o.attn_proj_w, o.attn_proj_b,
                      res_pol(kept_input(a.att, a.r_att), res_rounded));
  // The MLP; ln_2(m) is recomputed (a shared buffer, see the planner) except
  // where the forward kept it rounded (keep_rounded_).
  const GemmPolicy<T> fc_pol = reverse_gelu<S>(space, p, g, l, res_pol(kept_input(a.fc_gelu, a.r_fcg), res_rounded));
  const Act2<T> mlp_in = parallel ? x_in(l) : a.x_mid;
  if (!a.r_ln2) layernorm_forward<S>(space, a.ln2, a.ln2_mean, a.ln2_rstd, mlp_in, p, o.ln2_w, o.ln2_b, cfg_.ln_eps);
  linear_reverse<S>(space, c1, g, d_fc, a.ln2, p, o.fc_w, o.fc_b, fc_pol);
  keep(&CutAdjoints<T>::ln2, c1);
  layernorm_reverse<S>(space, c2, g, c1, mlp_in, a.ln2_mean, a.ln2_rstd, p, o.ln2_w, o.ln2_b);
  // d x_mid (parallel: the MLP's part of d x_in)
  const bool mid_rounded = accumulate_res<S>(space, res, c2, !parallel);
  // x_mid = x_in + c_proj(attn(c_attn(ln_1(x_in)))).
  if (!parallel)
    linear_reverse<S>(space, d_att, g, res, a.att, p, o.attn_proj_w, o.attn_proj_b,
                      res_pol(kept_input(a.att, a.r_att), mid_rounded));
  keep(&CutAdjoints<T>::att, d_att);
  const T* const kept_p = std::is_same<S, T>::value && keep_attention_ ? a.att_p.v.data() : nullptr;
  // With keep_rounded_ and no rotation after it, the fused reverse writes
  // d qkv as c_attn's products read it too (in FP32 only for its bias).
  Bf16Storage<T>* const qkv_room =
      std::is_same<S, T>::value && att_fused_ && rotary_dims_ == 0 ? adjoint_room(d_qkv) : nullptr;
  attend_reverse<S>(space, QkvActs<T>{d_qkv, d_qkv, d_qkv}, D, d_att, QkvActs<T>{a.qkv, a.qkv, a.qkv}, a.att, a.att_lse,
                    kept_p, qkv_room, !qkv_room || o.attn_b >= 0);
  keep(&CutAdjoints<T>::qkv, d_qkv);
  if (rotary_dims_ > 0)
    rotary_reverse<S>(space, d_qkv, d_qkv, cfg_.head_size(), rotary_dims_, rotary_table_, RotarySegments{3, 2});
  if (keep_into_) keep_cut_rounded<S>(space, keep_into_->cuts[l].qkv_out, d_qkv);
  if (!a.r_ln1) layernorm_forward<S>(space, a.ln1, a.ln1_mean, a.ln1_rstd, x_in(l), p, o.ln1_w, o.ln1_b, cfg_.ln_eps);
  const GemmPolicy<T> qkv_pol = kernels::detail::reading_rounded(kept_input(a.ln1, a.r_ln1), 2, d_qkv, qkv_room);
  linear_reverse<S>(space, c1, g, d_qkv, a.ln1, p, o.attn_w, o.attn_b, qkv_pol);
  keep(&CutAdjoints<T>::ln1, c1);
  layernorm_reverse<S>(space, c2, g, c1, x_in(l), a.ln1_mean, a.ln1_rstd, p, o.ln1_w, o.ln1_b);
  return accumulate_res<S>(space, res, c2, l > 0);  // d x_in
}

// Block l of the Llama reverse; res holds d x_out and leaves holding d x_in.
// RMSNorm outputs and SwiGLU are recomputed (shared buffers) but where the
// forward kept them (keep_rounded_, keep_gelu_); q and k hold
// their rotated values, which the attention's reverse reads, and their
// adjoints are rotated back before the projections' reverse.
template <class T>
template <class S>
bool Gpt<T>::reverse_block_llama(const ExecSpace& space, Params<T> p, Grads<T> g, int l, bool res_rounded) {
  using namespace kernels;
  const index_t Dh = cfg_.head_size();
  const Adjoints<T>& d = buf_->adj;
  const BlockOffsets& o = layout_.blocks[l];
  const LayerActivations<T>& a = buf_->acts[l];
  // The cut adjoints, as reverse_block keeps them.
  auto keep = [&](Act2<T> CutAdjoints<T>::*which, const Act2<T>& adj) { keep_cut<S>(space, l, which, adj); };
  // x_out = x_mid + down(silu(gate(n2)) up(n2)), n2 = rmsnorm_2(x_mid); the
  // gate's output is recomputed (a shared buffer) but where the forward kept it.
  if (!keep_gelu_) swiglu_forward<S>(space, a.fc_gelu, a.fc);
  const auto res_pol = [&](const GemmPolicy<T>& pol, bool rounded) {
    return kernels::detail::reading_rounded(pol, 2, d.res, rounded ? adjoint_room(d.res) : nullptr);
  };
  linear_reverse<S>(space, d.fc_gelu, g, d.res, a.fc_gelu, p, o.fc_proj_w, -1,
                    res_pol(kept_input(a.fc_gelu, a.r_fcg), res_rounded));
  keep(&CutAdjoints<T>::fc_gelu, d.fc_gelu);
  swiglu_reverse<S>(space, d.fc, d.fc_gelu, a.fc);
  if (keep_into_) keep_cut_rounded<S>(space, keep_into_->cuts[l].fc_out, d.fc);
  if (!a.r_ln2) rmsnorm_forward<S>(space, a.ln2, a.ln2_rstd, a.x_mid, p, o.ln2_w, -1, cfg_.ln_eps);
  linear_reverse<S>(space, d.c1, g, d.fc, a.ln2, p, o.fc_w, -1, kept_input(a.ln2, a.r_ln2));
  keep(&CutAdjoints<T>::ln2, d.c1);
  rmsnorm_reverse<S>(space, d.c2, g, d.c1, a.x_mid, a.ln2_rstd, p, o.ln2_w, -1);
  const bool mid_rounded = accumulate_res<S>(space, d.res, d.c2, true);  // d x_mid
  // x_mid = x_in + o_proj(attn(rope(q(n1)), rope(k(n1)), v(n1))), n1 = rmsnorm_1(x_in).
  linear_reverse<S>(space, d.att, g, d.res, a.att, p, o.attn_proj_w, o.attn_proj_b,
                    res_pol(kept_input(a.att, a.r_att), mid_rounded));
  keep(&CutAdjoints<T>::att, d.att);
  const T* const kept_p = std::is_same<S, T>::value && keep_attention_ ? a.att_p.v.data() : nullptr;
  const QkvActs<T> x3 = fused_qkv_ ? QkvActs<T>{a.qkv, a.qkv, a.qkv} : QkvActs<T>{a.q, a.k, a.v};
  const QkvActs<T> d3 = fused_qkv_ ? QkvActs<T>{d.qkv, d.qkv, d.qkv} : QkvActs<T>{d.q, d.k, d.v};
  attend_reverse<S>(space, d3, d.D, d.att, x3, a.att, a.att_lse, kept_p);
  if (!a.r_ln1) rmsnorm_forward<S>(space, a.ln1, a.ln1_rstd, x_in(l), p, o.ln1_w, -1, cfg_.ln_eps);
  const GemmPolicy<T> n1 = kept_input(a.ln1, a.r_ln1);
  if (fused_qkv_) {
    const index_t H = cfg_.n_head, G = cfg_.kv_heads();
    keep(&CutAdjoints<T>::qkv, d.qkv);
    rotary_reverse<S>(space, d.qkv, d.qkv, Dh, rotary_dims_, rotary_table_, RotarySegments{H + 2 * G, H + G});
    if (keep_into_) keep_cut_rounded<S>(space, keep_into_->cuts[l].qkv_out, d.qkv);
    linear_reverse<S>(space, d.c1, g, d.qkv, a.ln1, p, o.q_w, -1, n1);
  } else {
    keep(&CutAdjoints<T>::q, d.q);
    keep(&CutAdjoints<T>::k, d.k);
    keep(&CutAdjoints<T>::v, d.v);
    rotary_reverse<S>(space, d.q, d.q, Dh, rotary_dims_, rotary_table_);
    rotary_reverse<S>(space, d.k, d.k, Dh, rotary_dims_, rotary_table_);
    if (Bf16Storage<T>* const out = keep_into_ ? keep_into_->cuts[l].qkv_out : nullptr) {
      const index_t N = N_, A = d.q.cols(), Akv = d.k.cols();
      keep_cut_rounded<S>(space, out, d.q);
      keep_cut_rounded<S>(space, out + N * A, d.k);
      keep_cut_rounded<S>(space, out + N * (A + Akv), d.v);
    }
    linear_reverse<S>(space, d.c1, g, d.q, a.ln1, p, o.q_w, o.q_b, n1);
    linear_reverse<S>(space, d.c2, g, d.k, a.ln1, p, o.k_w, o.k_b, n1);
    accumulate<S>(space, d.c1, d.c2);
    linear_reverse<S>(space, d.c2, g, d.v, a.ln1, p, o.v_w, o.v_b, n1);
    accumulate<S>(space, d.c1, d.c2);
  }
  keep(&CutAdjoints<T>::ln1, d.c1);  // d n1
  rmsnorm_reverse<S>(space, d.c2, g, d.c1, x_in(l), a.ln1_rstd, p, o.ln1_w, -1);
  return accumulate_res<S>(space, d.res, d.c2, l > 0);  // d x_in
}

template <class T>
LossSum Gpt<T>::forward_loss(const ExecSpace& space, Span1<const T> params, Span2<const std::int32_t> tokens,
                             Span2<const std::int32_t> targets) {
  kernels::require_extent("gnh::gpt::forward_loss", "params", params.extent(0), layout_.size());
  return forward<T>(space, Params<T>{params, {}}, tokens, targets);
}

// The losses of a primal forward and reverse whose head ran in the reverse
// (head_fused_), read after the whole pass.
template <class T>
LossSum Gpt<T>::reverse_losses(const ExecSpace& space, Span2<const std::int32_t> targets) const {
  space.fence();
  return loss_sums<T>(Span1<const std::int32_t>(targets.data(), N_), false);
}

template <class T>
LossSum Gpt<T>::gradient(const ExecSpace& space, Span1<const T> params, Span2<const std::int32_t> tokens,
                         Span2<const std::int32_t> targets, Span1<T> grad) {
  if (!shape_.reverse) throw std::logic_error("gnh::gpt::gradient: planned without reverse mode");
  kernels::require_extent("gnh::gpt::gradient", "params", params.extent(0), layout_.size());
  kernels::require_extent("gnh::gpt::gradient", "grad", grad.extent(0), layout_.size());
  const Params<T> p{params, {}};
  const LossSum out = forward<T>(space, p, tokens, targets, !head_fused_);
  reverse<T>(space, p, Grads<T>{grad, {}}, tokens, targets);
  return head_fused_ ? reverse_losses(space, targets) : out;
}

template <class T>
LossSum Gpt<T>::gradient_per_sequence(const ExecSpace& space, Span1<const T> params, Span2<const std::int32_t> tokens,
                                      Span2<const std::int32_t> targets, Span2<T> grads) {
  if (!shape_.reverse) throw std::logic_error("gnh::gpt::gradient_per_sequence: planned without reverse mode");
  kernels::require_extent("gnh::gpt::gradient_per_sequence", "params", params.extent(0), layout_.size());
  kernels::require_extent("gnh::gpt::gradient_per_sequence", "gradient rows", grads.extent(0), tokens.extent(0));
  kernels::require_extent("gnh::gpt::gradient_per_sequence", "gradient length", grads.extent(1), layout_.size());
  const Params<T> p{params, {}};
  const LossSum out = forward<T>(space, p, tokens, targets, !head_fused_);
  zero_accumulated(space, grads);
  Grads<T> g{Span1<T>(grads.data(), grads.size()), {}};
  g.seq_rows = shape_.context;
  g.seq_stride = layout_.size();
  g.seq_fresh = true;
  reverse<T>(space, p, g, tokens, targets);
  return head_fused_ ? reverse_losses(space, targets) : out;
}

// The tensors of a sequence's gradient that the reverse adds into instead of
// writing (Grads::seq_fresh): all but the weight matrices of the linear
// layers and the head (the 2-D tensors other than wpe and an untied wte,
// which the embedding's rows add into), as chunks of at most 2^16 entries
// (a team each), and how many of their entries are matrices'. Planned with
// the engine: a reverse engine may be asked for gradient_per_sequence.
template <class T>
void Gpt<T>::plan_accumulated() {
  const ParamLayout& L = layout_;
  constexpr index_t chunk = index_t(1) << 16;
  std::vector<std::pair<index_t, index_t>> ranges;  // adjacent tensors merged
  accumulated_.vectors = accumulated_.matrices = 0;
  for (const TensorInfo& t : L.tensors()) {
    const bool untied_wte = t.offset == L.wte && L.wte != L.lm_head;
    if (t.shape.size() == 2 && t.offset != L.wpe && !untied_wte) continue;
    (t.shape.size() == 2 ? accumulated_.matrices : accumulated_.vectors) += index_t(t.size);
    const index_t begin = index_t(t.offset), end = index_t(t.offset + t.size);
    if (!ranges.empty() && ranges.back().second == begin) ranges.back().second = end;
    else ranges.emplace_back(begin, end);
  }
  std::vector<index_t> bounds;
  for (const auto& [begin, end] : ranges)
    for (index_t at = begin; at < end; at += chunk) {
      bounds.push_back(at);
      bounds.push_back(std::min(end, at + chunk));
    }
  workspace_bytes_ += sizeof(index_t) * bounds.size();
  if (!allocate_) return;
  accumulated_.bounds = View1<index_t>("gnh::gpt::accumulated_chunks", bounds.size());
  Kokkos::deep_copy(accumulated_.bounds, View1<index_t, HostSpace>(bounds.data(), bounds.size()));
}

template <class T>
void Gpt<T>::zero_accumulated(const ExecSpace& space, Span2<T> grads) {
  const index_t n_chunks = index_t(accumulated_.bounds.extent(0) / 2), S = grads.extent(0);
  if (n_chunks == 0 || S == 0) return;
  kernels::Traffic("gnh::gpt::zero_accumulated")
      .add(double(S * accumulated_.vectors), sizeof(T), 1)
      .add(double(S * accumulated_.matrices), sizeof(T), 2);
  Kokkos::parallel_for(
      "gnh::gpt::zero_accumulated", TeamRange(space, S * n_chunks, Kokkos::AUTO),
      gpt_detail::ZeroSequenceChunks<T>{grads.data(), accumulated_.bounds.data(), n_chunks, index_t(grads.extent(1))});
}

template <class T>
LossSum Gpt<T>::hvp(const ExecSpace& space, Span1<const T> params, Span2<const T> dirs,
                    Span2<const std::int32_t> tokens, Span2<const std::int32_t> targets, Span1<T> grad, Span2<T> hv,
                    CurvatureOperator op) {
  if (!shape_.reverse || shape_.directions == 0)
    throw std::logic_error("gnh::gpt::hvp: planned without reverse mode or directions");
  kernels::require_extent("gnh::gpt::hvp", "directions", dirs.extent(0), shape_.directions);
  kernels::require_extent("gnh::gpt::hvp", "direction length", dirs.extent(1), layout_.size());
  kernels::require_extent("gnh::gpt::hvp", "hv rows", hv.extent(0), shape_.directions);
  kernels::require_extent("gnh::gpt::hvp", "hv cols", hv.extent(1), layout_.size());
  const Params<T> p{params, dirs};
  LossSum out = forward<Dual<T>>(space, p, tokens, targets);
  reverse<Dual<T>>(space, p, Grads<T>{grad, hv}, tokens, targets, op == CurvatureOperator::gauss_newton);
  return out;
}

template <class T>
LossSum Gpt<T>::second_order(const ExecSpace& space, Span1<const T> params, Span2<const T> dirs,
                             Span2<const std::int32_t> tokens, Span2<const std::int32_t> targets) {
  if (!shape_.second_order || shape_.directions == 0)
    throw std::logic_error("gnh::gpt::second_order: planned without second-order planes");
  kernels::require_extent("gnh::gpt::second_order", "directions", dirs.extent(0), shape_.directions);
  kernels::require_extent("gnh::gpt::second_order", "direction length", dirs.extent(1), layout_.size());
  if (cuts_) {
    // Adjoint cuts. d2/de2 of the summed loss L along v is the sum, over the
    // nodes of the graph, of each node's own second-order term contracted with
    // the primal adjoint of its output; the forward carries the x'' of a node
    // on only to account for it downstream. So wherever x'' is replaced by zero
    // and <xbar, x''> is added instead, the sum is unchanged: at the input x
    // of a linear layer (its only consumer), <xbar, x''> = <ybar, x'' W^T>.
    // The layer then forms y''_k = 2 x'_k V_k^T alone and skips the GEMM
    // x''_k W^T of K N rows; the attention, cut at qkv, forms s'' = 2 Q'K'^T
    // and y'' = P''V + 2P'V' alone (three of its eight products a direction
    // shrink or go). The adjoints xbar come from one primal gradient pass of
    // the batch (without the parameter gradient). Tangents and the loss are
    // those of the plain second-order forward, bit for bit.
    struct Reset {
      Gpt<T>* e;
      ~Reset() { e->keep_into_ = nullptr; }
    } reset{adjoint_engine_.get()};
    adjoint_engine_->keep_into_ = buf_.get();
    // The reverse with an empty gradient: the adjoints without the parameter
    // gradient's products (a third of the dense GEMMs and the head's dW).
    const Params<T> p{params, {}};
    adjoint_engine_->template forward<T>(space, p, tokens, targets, !adjoint_engine_->head_fused_);
    adjoint_engine_->template reverse<T>(space, p, Grads<T>{}, tokens, targets);
  }
  return forward<Jet2<T>>(space, Params<T>{params, dirs}, tokens, targets);
}

}  // namespace gnh
