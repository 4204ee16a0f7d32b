// SPDX-License-Identifier: BSD-3-Clause
// The GPT graph of SPEC §1 on a fixed batch shape (B sequences of T tokens),
// templated on the scalar. Memory (activations and workspaces) is planned once
// in the constructor; forward_loss() then runs without allocating.
#pragma once
#include <cstdint>
#include <vector>

#include "core/types.hpp"
#include "model/config.hpp"
#include "model/layout.hpp"

namespace gnh {

// Sum of token losses over the targets >= 0 of one batch, and their count.
struct LossSum {
  double sum = 0.0;
  std::int64_t count = 0;
};

template <class T>
struct LayerActivations {
  View2<T> ln1;                 // (N, C)
  View1<T> ln1_mean, ln1_rstd;  // (N)
  View2<T> qkv;                 // (N, 3C)
  View2<T> att;                 // (N, C) attention output before c_proj
  View1<T> att_lse;             // (B*H*T)
  View2<T> x_mid;               // (N, C) residual stream after attention
  View2<T> ln2;                 // (N, C)
  View1<T> ln2_mean, ln2_rstd;  // (N)
  View2<T> fc;                  // (N, 4C) MLP pre-activation
  View2<T> fc_gelu;             // (N, 4C)
  View2<T> x_out;               // (N, C) block output
};

template <class T>
class Gpt {
 public:
  // save_activations: keep every layer's activations (for reverse mode);
  // otherwise one layer's buffers are reused and the forward updates the
  // residual stream in place. head_chunk_rows bounds the (rows, V) logits
  // workspace of the fused LM head (0: choose automatically).
  Gpt(const ModelConfig& cfg, index_t batch, index_t context, bool save_activations,
      index_t head_chunk_rows = 0);

  const ModelConfig& config() const { return cfg_; }
  const ParamLayout& layout() const { return layout_; }
  index_t batch() const { return B_; }
  index_t context() const { return T_; }
  // Bytes held by the activations and workspaces planned for this batch shape.
  std::size_t workspace_bytes() const { return workspace_bytes_; }

  // tokens, targets: (B, T) device views; a target < 0 is ignored.
  LossSum forward_loss(const ExecSpace& space, Span1<const T> params,
                       Span2<const std::int32_t> tokens, Span2<const std::int32_t> targets);

  // Per-row losses of the last forward_loss (N = B*T), for tests and reductions.
  View1<double> row_loss() const { return row_loss_; }

 private:
  Span2<T> x_in(int layer);
  ModelConfig cfg_;
  ParamLayout layout_;
  index_t B_, T_, N_;
  bool save_;
  std::vector<LayerActivations<T>> acts_;
  View2<T> x0_;                   // (N, C) embedding output (save mode only)
  View2<T> proj_;                 // (N, C) c_proj outputs before the residual add
  View2<T> lnf_;                  // (N, C)
  View1<T> lnf_mean_, lnf_rstd_;  // (N)
  View1<T> head_lse_;             // (N)
  View2<T> logits_;               // (chunk, V)
  View1<double> row_loss_;        // (N)
  View1<double, HostSpace> h_row_loss_;
  std::size_t workspace_bytes_ = 0;
};

extern template class Gpt<float>;
extern template class Gpt<double>;

}  // namespace gnh
