// SPDX-License-Identifier: BSD-3-Clause
// The GPT graph of SPEC §1 on a fixed batch shape, templated on the scalar, in
// every mode of the derivative engine:
//   forward_loss    primal loss
//   gradient        loss and the gradient of the batch's summed loss (reverse)
//   hvp             forward-over-reverse: gradient and H v_k for K directions
//                   sharing one primal forward and one primal backward
//   second_order    second-order forward: d/de and d2/de2 of the summed loss
//                   along K directions, no backward pass, one layer of storage
//                   (or, with adjoint cuts, one primal gradient pass first:
//                   see Gpt<T>::second_order in gpt_impl.hpp)
// Memory (activations, their tangent planes, adjoints, workspaces) is planned
// once in the constructor for the modes the Shape asks for.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "core/planes.hpp"
#include "kernels/attention_host.hpp"
#include "kernels/attention_types.hpp"
#include "kernels/blas.hpp"
#include "kernels/embedding.hpp"
#include "kernels/rows.hpp"
#include "model/config.hpp"
#include "model/layout.hpp"
#include "model/plan.hpp"

namespace gnh {

// Sums over the valid targets (>= 0) of one batch.
struct LossSum {
  double sum = 0.0;            // sum of token losses
  std::int64_t count = 0;      // valid targets
  std::vector<double> first;   // per direction: d/de of the sum
  std::vector<double> second;  // per direction: d2/de2 of the sum
  // per direction: v^T GGN v of the sum, the Gauss-Newton part of second
  // (every pass with directions: the head's z'^T H_z z', kernels/lm_head_xent.hpp)
  std::vector<double> gauss_newton;
  // per sequence (row of the batch): d/de of its summed loss along the first
  // direction (the per-sequence statistics' a_i . G, doc/statistics.md)
  std::vector<double> first_seq;
};

// What hvp applies: the Hessian, or its Gauss-Newton part GGN = J^T H_z J (J
// the Jacobian of the logits, H_z the Hessian of the loss in them).
enum class CurvatureOperator { hessian, gauss_newton };

// Every buffer of the graph (activations, their planes, adjoints, the head's
// tile), defined in gpt_impl.hpp beside the graph that uses them.
template <class T>
struct GptBuffers;
template <class T>
struct CutAdjoints;
namespace kernels {
struct RotarySegments;
}

template <class T>
class Gpt {
 public:
  Gpt(const ModelConfig& cfg, const Shape& shape);
  // The same, its buffers taken where they fit from `storage` (what another
  // engine's release_storage() gave up): a buffer of the same name and at
  // least the size needed is reused, contents and all (nothing is read
  // before it is written); the rest of `storage` is freed before anything new
  // is allocated for a name it held. A narrower pass then runs in the wider
  // pass's memory without the page faults of fresh memory, and an engine
  // planned again for the wider pass finds its buffers still there.
  Gpt(const ModelConfig& cfg, const Shape& shape, std::vector<View1<T>> storage);
  // Gives up the engine's large buffers (its own and its adjoint engine's),
  // leaving it unusable: for Gpt(cfg, shape, storage) of the next plan.
  std::vector<View1<T>> release_storage();
  // The bytes Gpt(cfg, shape) allocates, counted without allocating them.
  static std::size_t planned_bytes(const ModelConfig& cfg, const Shape& shape);
  // Primal only, keeping one layer of activations (the loss pass).
  Gpt(const ModelConfig& cfg, index_t batch, index_t context);
  ~Gpt();
  Gpt(const Gpt&) = delete;
  Gpt& operator=(const Gpt&) = delete;

  const ModelConfig& config() const { return cfg_; }
  const ParamLayout& layout() const { return layout_; }
  const Shape& shape() const { return shape_; }
  index_t batch() const { return shape_.batch; }
  index_t context() const { return shape_.context; }
  // Bytes of activations, tangent planes, adjoints and workspaces planned.
  std::size_t workspace_bytes() const { return workspace_bytes_; }
  // Whether second_order runs with adjoint cuts (Shape::adjoint_cuts).
  bool adjoint_cuts() const { return cuts_; }
  // Whether the gradient's reverse reads the attention's probabilities kept
  // by its forward (host tiles, short contexts: gpt_impl.hpp).
  bool keeps_attention() const { return keep_attention_; }
  kernels::AttentionPath attention_path() const { return att_path_; }
  // Whether the attention's forward runs as the fused tensor-core kernel
  // (attention_forward_fused in model/plan.hpp; a second order's with cuts only).
  bool attention_fused() const { return att_fused_; }
  bool linear_pairs() const { return linear_pairs_; }  // the pair products of kernels/linear.hpp
  // The head's row kernels: a team a vocabulary row when GPU-shaped (tiles
  // of a few hundred whole rows), else the backend's default shape.
  kernels::RowShape head_rows() const {
    return shape_.gpu_shaped ? kernels::RowShape::wide : kernels::default_row_shape();
  }

  // tokens, targets: (B, T) device views; a target < 0 is ignored.
  LossSum forward_loss(const ExecSpace& space, Span1<const T> params, Span2<const std::int32_t> tokens,
                       Span2<const std::int32_t> targets);
  // grad (P) += gradient of the batch's summed loss.
  LossSum gradient(const ExecSpace& space, Span1<const T> params, Span2<const std::int32_t> tokens,
                   Span2<const std::int32_t> targets, Span1<T> grad);
  // grads (B, P): row s = sequence s's own gradient of its summed loss
  // (whatever the rows held), from one forward and one reverse of the batch
  // whose weight products are batched per sequence (kernels' Grads per
  // sequence): the same products as gradient()'s, of T rows each instead of
  // B T. The weight matrices' first products write their rows (beta 0), the
  // rest of each row is zeroed first (Grads::seq_fresh).
  LossSum gradient_per_sequence(const ExecSpace& space, Span1<const T> params, Span2<const std::int32_t> tokens,
                                Span2<const std::int32_t> targets, Span2<T> grads);
  // dirs (K, P); grad (P) += gradient, hv (K, P) += H_sum dirs_k (H of the summed loss).
  // op gauss_newton: hv += GGN_sum dirs_k instead, and grad receives nothing.
  LossSum hvp(const ExecSpace& space, Span1<const T> params, Span2<const T> dirs, Span2<const std::int32_t> tokens,
              Span2<const std::int32_t> targets, Span1<T> grad, Span2<T> hv,
              CurvatureOperator op = CurvatureOperator::hessian);
  // dirs (K, P); returns first[k] = G_sum.v_k, second[k] = v_k^T H_sum v_k and
  // gauss_newton[k] = v_k^T GGN_sum v_k.
  LossSum second_order(const ExecSpace& space, Span1<const T> params, Span2<const T> dirs,
                       Span2<const std::int32_t> tokens, Span2<const std::int32_t> targets);

  // Per-row losses of the last forward (N = B*T), for tests.
  View1<double> row_loss() const { return row_loss_v_; }

 private:
  // head false (the primal gradient engine, head_fused_): the forward stops
  // at the head, which the reverse then runs whole (no losses returned).
  template <class S>
  LossSum forward(const ExecSpace& space, Params<T> p, Span2<const std::int32_t> tokens,
                  Span2<const std::int32_t> targets, bool head = true);
  template <class S>
  void reverse(const ExecSpace& space, Params<T> p, Grads<T> g, Span2<const std::int32_t> tokens,
               Span2<const std::int32_t> targets, bool gauss_newton = false);
  template <class S>
  void forward_block(const ExecSpace& space, Params<T> p, int layer, bool cut);
  template <class S>
  void forward_block_llama(const ExecSpace& space, Params<T> p, int layer, bool cut);
  // res_rounded: the adjoint res (d x_out) already in the adjoint room, as
  // its products read it; returns whether d x_in left there is.
  template <class S>
  bool reverse_block(const ExecSpace& space, Params<T> p, Grads<T> g, int layer, bool res_rounded);
  template <class S>
  bool reverse_block_llama(const ExecSpace& space, Params<T> p, Grads<T> g, int layer, bool res_rounded);
  template <class S>
  kernels::GemmPolicy<T> reverse_gelu(const ExecSpace& space, Params<T> p, Grads<T> g, int layer,
                                      const kernels::GemmPolicy<T>& proj_pol);
  template <class S>
  void keep_cut(const ExecSpace& space, int layer, Act2<T> CutAdjoints<T>::*which, const Act2<T>& adj);
  void cut_at(const ExecSpace& space, bool cut, const Act2<T>& adj, const Act2<T>& x);
  // x's rotary embedding in place (kernels/rotary.hpp), every plane S has;
  // in a second order where x has no second-order planes (cut_through), its
  // value and tangents.
  template <class S>
  void rotate(const ExecSpace& space, const Act2<T>& x, index_t D, const kernels::RotarySegments& seg);
  // With linear pairs, in the primal reverse of the adjoint cuts' engine: adj
  // rounded into the outer engine's cut adjoint at dst (null: nothing).
  template <class S>
  void keep_cut_rounded(const ExecSpace& space, kernels::Bf16Storage<T>* dst, const Act2<T>& adj);
  // A projection after a norm: its weight's offset, its output's width and
  // the cut adjoint at its output (rounded, CutAdjoints::qkv_out or fc_out).
  struct CutProjection {
    index_t w, out;
    const kernels::Bf16Storage<T>* adj;
  };
  // With linear pairs and cuts: the y''_k = 2 x'_k V_k^T of the projections
  // reading r's input, contracted with their cut adjoints a through the
  // weights, 2 <a V_k, x'_k> a row into cut_dd_, instead of formed.
  void cut_through(const ExecSpace& space, const kernels::detail::RoundedInput<T>& r,
                   std::initializer_list<CutProjection> projections);
  // The pair blocks of the weight at offset w (linear_pairs_).
  const kernels::Bf16Storage<T>* weight_pairs(index_t w) const;
  template <class S>
  LossSum loss_sums(Span1<const std::int32_t> flat_targets, bool cut) const;
  LossSum reverse_losses(const ExecSpace& space, Span2<const std::int32_t> targets) const;
  Gpt(const ModelConfig& cfg, const Shape& shape, bool allocate, std::vector<View1<T>> storage = {});
  // The constructor's steps, in order (gpt_impl.hpp).
  void validate_shape() const;
  index_t choose_kept(const GptTiles& plan);
  void plan_layers(index_t att_elements);
  void plan_attention();
  template <class S>
  bool attend(const ExecSpace& space, const Act2<T>& y, const Act1<T>& lse, const kernels::QkvActs<T>& x, bool cut,
              T* keep_p, const kernels::detail::RoundedInput<T>& r, const Act2<T>& cut_adj);
  template <class S>
  void attend_reverse(const ExecSpace& space, const kernels::QkvActs<T>& dx, const Act1<T>& D, const Act2<T>& dy,
                      const kernels::QkvActs<T>& x, const Act2<T>& y, const Act1<T>& lse, const T* kept_p,
                      kernels::Bf16Storage<T>* rounded = nullptr, bool fp32 = true);
  void plan_head(const GptTiles& plan);
  void plan_adjoints();
  void plan_gemm(const GptTiles& plan);
  // bf16-amp: the parameters (and the head's directions) rounded once a
  // pass, and the policy of the weights' products that reads them there.
  void round_ahead(const ExecSpace& space, const Params<T>& p);
  // A product's input as the kernel producing it rounds it: with cuts into
  // the layer-input room, else into kept (keep_rounded_; null: not so rounded).
  // pairs: with cuts, for the pair products of the linear layers reading it
  // (linear_pairs_), in pair blocks.
  kernels::detail::RoundedInput<T> rounded_input(const Act2<T>& in, bool cut, kernels::Bf16Storage<T>* kept = nullptr,
                                                 bool pairs = false) const;
  // The policy of the linear layer of weight offset w reading r: with
  // input pairs, the weight's pair blocks too.
  kernels::GemmPolicy<T> pairs_of(const kernels::detail::RoundedInput<T>& r, index_t w) const;
  // A reverse product's policy reading its input x where the forward kept it
  // rounded (kept; null: weights_gemm_).
  kernels::GemmPolicy<T> kept_input(const Act2<T>& x, const kernels::Bf16Storage<T>* kept) const;
  kernels::Bf16Storage<T>* adjoint_room(const Act2<T>& dy) const;
  // res accumulates a; with S = T and an adjoint room, res is also written
  // there rounded for the next products: returns whether it was.
  template <class S>
  bool accumulate_res(const ExecSpace& space, const Act2<T>& res, const Act2<T>& a, bool rounded);
  void plan_adjoint_cuts();
  View1<T> buffer(const std::string& label, index_t total);
  Act2<T> x_in(int layer) const;
  Act2<T> x_final() const;
  Act2<T> act2(const char* name, index_t rows, index_t cols, bool tangents, bool second);
  Act2<T> act2_planes(const char* name, index_t rows, index_t cols, index_t K, index_t KK);
  Act1<T> act1(const char* name, index_t n, bool tangents, bool second);
  void check_batch(Span2<const std::int32_t> tokens, Span2<const std::int32_t> targets) const;
  void plan_accumulated();
  void zero_accumulated(const ExecSpace& space, Span2<T> grads);

  ModelConfig cfg_;
  ParamLayout layout_;
  kernels::QkvLayout qkv_layout_;                                   // where attention finds the heads (by family)
  kernels::AttentionPath att_path_ = kernels::AttentionPath::rows;  // which attention kernels run
  kernels::AttentionScratch<T> att_scratch_;                        // the batched path's score planes
  bool att_fused_ = false;                 // the batched path's forward fused (kernels/attention_fused.hpp)
  kernels::detail::TokenWork token_work_;  // GPU-shaped reverse: the embedding's rows grouped on the device
  struct {
    View1<index_t> bounds;  // chunks' (first, end) pairs
    index_t vectors = 0, matrices = 0;
  } accumulated_;            // what gradient_per_sequence zeroes (plan_accumulated)
  bool fused_qkv_ = false;   // Llama's q, k, v projections as one GEMM (gpt_impl.hpp)
  index_t rotary_dims_ = 0;  // dims of each head rotated (0: no rotary embedding)
  View2<T> rotary_table_;    // cos and sin of every position's angles (kernels/rotary.hpp)
  Shape shape_;
  index_t N_;
  std::vector<View1<T>> owned_;
  std::vector<View1<T>> reusable_;  // during construction: storage not yet reused
  std::unique_ptr<GptBuffers<T>> buf_;
  kernels::GemmPolicy<T> gemm_;  // operand precision of every matrix multiply
  // bf16-amp: every parameter and, with directions, the head's K blocks of
  // them, rounded once a pass (the linear layers' forward and reverse and
  // every head tile read them); weights_gemm_ is gemm_ with those blocks
  // (GemmPolicy::ahead), the policy of every product of a weight.
  View1<T> rounded_ahead_;
  bool head_pairs_ = false;  // the head's direction blocks in pair blocks (GemmPolicy::head_pairs)
  // With cuts, the linear layers after the norms as pair products
  // (kernels/linear.hpp, pair_forward): their weights' pair blocks, rounded
  // a pass after the head's (offset `at` in rounded values), and their
  // inputs in the layer-input room in pair blocks.
  bool linear_pairs_ = false;
  struct PairWeight {
    index_t w, out, in, at;
  };
  std::vector<PairWeight> pair_weights_;
  kernels::GemmPolicy<T> weights_gemm_;
  View1<double> row_loss_v_;
  View2<double> row_loss_d_, row_loss_dd_, row_loss_gn_;  // (K, N)
  std::size_t workspace_bytes_ = 0;
  bool allocate_ = true;  // false: only count the bytes (planned_bytes)
  // The primal reverse engine (reverse, no directions) keeps each layer's GELU
  // output, and the GELU's slope in place of its pre-activation (gpt_impl.hpp).
  bool keep_gelu_ = false;
  // And under bf16-amp, GPU-shaped (not the adjoint cuts' gradient engine):
  // each layer's linear inputs kept as their products read them, rounded by
  // the kernels that produce them, and not formed again in the reverse.
  bool keep_rounded_ = false;
  // GPU-shaped forward-only engines without the parallel residual: each
  // block's output projections accumulate into the residual stream in place
  // (linear_forward's accumulate) and x_mid is the stream itself.
  bool residual_in_place_ = false;
  bool head_kept_ = false;  // and the head's exponentials over its logits tile
  // The head's forward run in the primal reverse, tile by tile with its
  // reverse (kernels/lm_head_xent.hpp, lm_head_xent_gradient), where a tile
  // holds whole vocabulary rows; head_pending_: the last forward stopped
  // before the head.
  bool head_fused_ = false;
  bool head_pending_ = false;
  bool keep_attention_ = false;  // and the attention's probabilities (short contexts, host tiles)
  // Adjoint cuts: the engine of the primal gradient pass, and per direction
  // and row the contractions at the cuts.
  bool cuts_ = false;
  std::unique_ptr<Gpt<T>> adjoint_engine_;
  View2<double> cut_dd_;                // (K, N)
  Span2<T> cut_u_;                      // (K N, C): cut_through's a V_k
  Span2<T> cut_att_;                    // (K H, N): the fused attention's cut, head by head
  GptBuffers<T>* keep_into_ = nullptr;  // set on the adjoint engine during its reverse: where the cut adjoints go
};

extern template class Gpt<float>;
extern template class Gpt<double>;

}  // namespace gnh
