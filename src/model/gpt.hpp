// SPDX-License-Identifier: BSD-3-Clause
// The GPT graph of SPEC §1 on a fixed batch shape, templated on the scalar, in
// every mode of the derivative engine:
//   forward_loss    primal loss
//   gradient        loss and the gradient of the batch's summed loss (reverse)
//   hvp             forward-over-reverse: gradient and H v_k for K directions
//                   sharing one primal forward and one primal backward
//   second_order    second-order forward: d/de and d2/de2 of the summed loss
//                   along K directions, no backward pass, one layer of storage
// Memory (activations, their tangent planes, adjoints, workspaces) is planned
// once in the constructor for the modes the Shape asks for.
#pragma once
#include <cstdint>
#include <vector>

#include "core/planes.hpp"
#include "kernels/blas.hpp"
#include "model/config.hpp"
#include "model/layout.hpp"
#include "model/plan.hpp"

namespace gnh {

// Sums over the valid targets (>= 0) of one batch.
struct LossSum {
  double sum = 0.0;                // sum of token losses
  std::int64_t count = 0;          // valid targets
  std::vector<double> first;       // per direction: d/de of the sum
  std::vector<double> second;      // per direction: d2/de2 of the sum
};

template <class T>
struct LayerActivations {
  Act2<T> ln1;                 // (N, C) one buffer for every layer and ln2 (recomputed in reverse)
  Act1<T> ln1_mean, ln1_rstd;  // (N)
  Act2<T> qkv;                 // (N, 3C)
  Act2<T> att;                 // (N, C) attention output before c_proj
  Act1<T> att_lse;             // (B*H*T)
  Act2<T> x_mid;               // (N, C) residual stream after attention
  Act2<T> ln2;                 // (N, C) the same buffer as ln1
  Act1<T> ln2_mean, ln2_rstd;  // (N)
  Act2<T> fc;                  // (N, 4C) MLP pre-activation
  Act2<T> fc_gelu;             // (N, 4C) one buffer for every layer (recomputed in reverse)
  Act2<T> x_out;               // (N, C) block output
};

template <class T>
struct Adjoints {
  Act2<T> res;      // (N, C) adjoint of the residual stream
  Act2<T> c1, c2;   // (N, C) scratch
  Act2<T> att;      // (N, C)
  Act2<T> qkv;      // (N, 3C)
  Act2<T> fc_gelu;  // (N, 4C)
  Act2<T> fc;       // (N, 4C)
  Act1<T> D;        // (B*H*T) attention row terms
};

template <class T>
class Gpt {
 public:
  Gpt(const ModelConfig& cfg, const Shape& shape);
  // The bytes Gpt(cfg, shape) allocates, counted without allocating them.
  static std::size_t planned_bytes(const ModelConfig& cfg, const Shape& shape);
  // Primal only, keeping one layer of activations (the loss pass).
  Gpt(const ModelConfig& cfg, index_t batch, index_t context);

  const ModelConfig& config() const { return cfg_; }
  const ParamLayout& layout() const { return layout_; }
  const Shape& shape() const { return shape_; }
  index_t batch() const { return shape_.batch; }
  index_t context() const { return shape_.context; }
  // Bytes of activations, tangent planes, adjoints and workspaces planned.
  std::size_t workspace_bytes() const { return workspace_bytes_; }

  // tokens, targets: (B, T) device views; a target < 0 is ignored.
  LossSum forward_loss(const ExecSpace& space, Span1<const T> params, Span2<const std::int32_t> tokens,
                       Span2<const std::int32_t> targets);
  // grad (P) += gradient of the batch's summed loss.
  LossSum gradient(const ExecSpace& space, Span1<const T> params, Span2<const std::int32_t> tokens,
                   Span2<const std::int32_t> targets, Span1<T> grad);
  // dirs (K, P); grad (P) += gradient, hv (K, P) += H_sum dirs_k (H of the summed loss).
  LossSum hvp(const ExecSpace& space, Span1<const T> params, Span2<const T> dirs,
              Span2<const std::int32_t> tokens, Span2<const std::int32_t> targets, Span1<T> grad,
              Span2<T> hv);
  // dirs (K, P); returns first[k] = G_sum.v_k and second[k] = v_k^T H_sum v_k.
  LossSum second_order(const ExecSpace& space, Span1<const T> params, Span2<const T> dirs,
                       Span2<const std::int32_t> tokens, Span2<const std::int32_t> targets);

  // Per-row losses of the last forward (N = B*T), for tests.
  View1<double> row_loss() const { return row_loss_v_; }

 private:
  template <class S>
  LossSum forward(const ExecSpace& space, Params<T> p, Span2<const std::int32_t> tokens,
                  Span2<const std::int32_t> targets);
  template <class S>
  void reverse(const ExecSpace& space, Params<T> p, Grads<T> g, Span2<const std::int32_t> tokens,
               Span2<const std::int32_t> targets);
  Gpt(const ModelConfig& cfg, const Shape& shape, bool allocate);
  Act2<T> x_in(int layer) const;
  Act2<T> x_final() const;
  Act2<T> act2(const char* name, index_t rows, index_t cols, bool tangents, bool second);
  Act1<T> act1(const char* name, index_t n, bool tangents, bool second);
  void check_batch(Span2<const std::int32_t> tokens, Span2<const std::int32_t> targets) const;

  ModelConfig cfg_;
  ParamLayout layout_;
  Shape shape_;
  index_t N_;
  std::vector<View1<T>> owned_;
  std::vector<LayerActivations<T>> acts_;
  Act2<T> x0_;                  // (N, C) embedding output (reverse mode only)
  Act2<T> proj_;                // (N, C) c_proj outputs before the residual add
  Act2<T> lnf_;                 // (N, C)
  Act1<T> lnf_mean_, lnf_rstd_;  // (N)
  Act1<T> head_lse_;            // (N)
  Act2<T> logits_;              // (rows, vocabulary chunk) per plane: one tile of the head
  View2<T> head_stats_;         // (N, 2) the head's running maximum and target logit
  Adjoints<T> adj_;
  kernels::GemmPolicy<T> gemm_;  // operand precision of every matrix multiply
  View1<double> row_loss_v_;
  View2<double> row_loss_d_, row_loss_dd_;  // (K, N)
  std::size_t workspace_bytes_ = 0;
  bool allocate_ = true;  // false: only count the bytes (planned_bytes)
};

extern template class Gpt<float>;
extern template class Gpt<double>;

}  // namespace gnh
