// SPDX-License-Identifier: BSD-3-Clause
// Implementation of Gpt<T>; included by one translation unit per scalar type.
#pragma once
#include <string>

#include "kernels/attention.hpp"
#include "kernels/embedding.hpp"
#include "kernels/gelu.hpp"
#include "kernels/layernorm.hpp"
#include "kernels/linear.hpp"
#include "kernels/lm_head_xent.hpp"
#include "kernels/residual.hpp"
#include "model/gpt.hpp"

namespace gnh {

namespace detail {
template <class T>
Span1<const T> vec(Span1<const T> p, std::int64_t off, std::int64_t n) {
  if (off < 0) return Span1<const T>();
  return Span1<const T>(p.data() + off, n);
}
template <class T>
Span2<const T> mat(Span1<const T> p, std::int64_t off, std::int64_t rows, std::int64_t cols) {
  return Span2<const T>(p.data() + off, rows, cols);
}
}  // namespace detail

template <class T>
Gpt<T>::Gpt(const ModelConfig& cfg, index_t batch, index_t context, bool save_activations,
            index_t head_chunk_rows)
    : cfg_(cfg), layout_(cfg), B_(batch), T_(context), N_(batch * context), save_(save_activations) {
  cfg_.validate("model");
  if (batch <= 0) fail("batch size ", batch, " must be positive");
  if (context <= 0 || context > cfg.block_size)
    fail("context ", context, " must be in 1..block_size (", cfg.block_size, ")");
  const index_t C = cfg.n_embd, H = cfg.n_head, V = cfg.vocab_size, N = N_;
  std::size_t bytes = 0;
  auto v1 = [&](const char* name, index_t n) {
    bytes += sizeof(T) * n;
    return View1<T>(Kokkos::view_alloc(std::string("gnh::gpt::") + name, Kokkos::WithoutInitializing), n);
  };
  auto v2 = [&](const char* name, index_t r, index_t c) {
    bytes += sizeof(T) * r * c;
    return View2<T>(Kokkos::view_alloc(std::string("gnh::gpt::") + name, Kokkos::WithoutInitializing), r, c);
  };
  const int slots = save_ ? cfg.n_layer : 1;
  for (int l = 0; l < slots; ++l) {
    LayerActivations<T> a;
    a.ln1 = v2("ln1", N, C);
    a.ln1_mean = v1("ln1_mean", N);
    a.ln1_rstd = v1("ln1_rstd", N);
    a.qkv = v2("qkv", N, 3 * C);
    a.att = v2("att", N, C);
    a.att_lse = v1("att_lse", B_ * H * T_);
    a.x_mid = v2("x_mid", N, C);
    a.ln2 = v2("ln2", N, C);
    a.ln2_mean = v1("ln2_mean", N);
    a.ln2_rstd = v1("ln2_rstd", N);
    a.fc = v2("fc", N, 4 * C);
    a.fc_gelu = v2("fc_gelu", N, 4 * C);
    a.x_out = v2("x_out", N, C);
    acts_.push_back(a);
  }
  if (save_) x0_ = v2("x0", N, C);
  proj_ = v2("proj", N, C);
  lnf_ = v2("lnf", N, C);
  lnf_mean_ = v1("lnf_mean", N);
  lnf_rstd_ = v1("lnf_rstd", N);
  head_lse_ = v1("head_lse", N);
  // Default logits chunk: at most 2^24 elements (64 MiB in float), at least one row.
  if (head_chunk_rows <= 0) head_chunk_rows = std::max<index_t>(1, (index_t(1) << 24) / V);
  head_chunk_rows = std::min<index_t>(head_chunk_rows, N);
  logits_ = v2("logits", head_chunk_rows, V);
  row_loss_ = View1<double>(Kokkos::view_alloc("gnh::gpt::row_loss", Kokkos::WithoutInitializing), N);
  bytes += sizeof(double) * N;
  h_row_loss_ = Kokkos::create_mirror_view(row_loss_);
  workspace_bytes_ = bytes;
}

template <class T>
Span2<T> Gpt<T>::x_in(int layer) {
  // Save mode keeps every block's output; otherwise the stream lives in x_out of
  // the single slot and is updated in place.
  if (!save_) return acts_[0].x_out;
  return layer == 0 ? Span2<T>(x0_) : Span2<T>(acts_[layer - 1].x_out);
}

template <class T>
LossSum Gpt<T>::forward_loss(const ExecSpace& space, Span1<const T> p,
                             Span2<const std::int32_t> tokens, Span2<const std::int32_t> targets) {
  using namespace kernels;
  using detail::mat;
  using detail::vec;
  Kokkos::Profiling::pushRegion("gnh::gpt::forward");
  require_extent("gnh::gpt::forward", "params", p.extent(0), layout_.size());
  require_extent("gnh::gpt::forward", "tokens rows", tokens.extent(0), B_);
  require_extent("gnh::gpt::forward", "tokens cols", tokens.extent(1), T_);
  require_extent("gnh::gpt::forward", "targets rows", targets.extent(0), B_);
  require_extent("gnh::gpt::forward", "targets cols", targets.extent(1), T_);
  const index_t C = cfg_.n_embd, V = cfg_.vocab_size;
  const ParamLayout& L = layout_;

  embedding_forward<T>(space, x_in(0), tokens, mat(p, L.wte, V, C), mat(p, L.wpe, cfg_.block_size, C));
  for (int l = 0; l < cfg_.n_layer; ++l) {
    const BlockOffsets& o = L.blocks[l];
    LayerActivations<T>& a = acts_[save_ ? l : 0];
    Span2<T> x = x_in(l);
    layernorm_forward<T>(space, a.ln1, a.ln1_mean, a.ln1_rstd, x, vec(p, o.ln1_w, C),
                         vec(p, o.ln1_b, C), cfg_.ln_eps);
    linear_forward<T>(space, a.qkv, a.ln1, mat(p, o.attn_w, 3 * C, C), vec(p, o.attn_b, 3 * C));
    attention_forward<T>(space, a.att, a.att_lse, a.qkv, B_, T_, cfg_.n_head);
    linear_forward<T>(space, proj_, a.att, mat(p, o.attn_proj_w, C, C), vec(p, o.attn_proj_b, C));
    residual_forward<T>(space, a.x_mid, x, proj_);
    layernorm_forward<T>(space, a.ln2, a.ln2_mean, a.ln2_rstd, a.x_mid, vec(p, o.ln2_w, C),
                         vec(p, o.ln2_b, C), cfg_.ln_eps);
    linear_forward<T>(space, a.fc, a.ln2, mat(p, o.fc_w, 4 * C, C), vec(p, o.fc_b, 4 * C));
    gelu_forward<T>(space, a.fc_gelu, a.fc, cfg_.gelu);
    linear_forward<T>(space, proj_, a.fc_gelu, mat(p, o.fc_proj_w, C, 4 * C), vec(p, o.fc_proj_b, C));
    residual_forward<T>(space, a.x_out, a.x_mid, proj_);
  }
  Span2<T> x_final = save_ ? Span2<T>(acts_.back().x_out) : Span2<T>(acts_[0].x_out);
  layernorm_forward<T>(space, lnf_, lnf_mean_, lnf_rstd_, x_final, vec(p, L.lnf_w, C),
                       vec(p, L.lnf_b, C), cfg_.ln_eps);
  Span1<const std::int32_t> flat_targets(targets.data(), N_);
  lm_head_xent_forward<T>(space, row_loss_, head_lse_, lnf_, mat(p, L.lm_head, V, C), flat_targets,
                          logits_);
  space.fence();
  Kokkos::deep_copy(h_row_loss_, row_loss_);
  auto h_targets = Kokkos::create_mirror_view_and_copy(HostSpace(), flat_targets);
  // Fixed-order host sum in double: deterministic on every backend.
  LossSum out;
  for (index_t n = 0; n < N_; ++n) {
    if (h_targets(n) < 0) continue;
    out.sum += h_row_loss_(n);
    ++out.count;
  }
  Kokkos::Profiling::popRegion();
  return out;
}

}  // namespace gnh
