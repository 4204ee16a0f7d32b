// SPDX-License-Identifier: BSD-3-Clause
// Batch-level passes over a list of batches, of which the caller computes a
// subset (its share when ranks split an epoch). Vector results go into an
// ExactSum, scalar results into a per-batch table; callers combine tables in
// batch order, so every sum is the same bit for bit on any split.
#pragma once
#include <utility>
#include <vector>

#include "analysis/batch_scalars.hpp"
#include "analysis/derivatives.hpp"
#include "analysis/exact_sum.hpp"
#include "analysis/team.hpp"
#include "model/gpt.hpp"

namespace gnh {

// Stages batches of blocks on the device, the one way every pass does it:
// fill_batch (analysis/epoch.hpp) on the host, then a copy. Sized once for the
// largest batch; a batch of B rows uses the first B rows (contiguous).
class BatchStager {
 public:
  // stride: tokens from one block's first to the next's in ids (0: context).
  BatchStager(index_t max_batch, index_t context, index_t stride = 0);
  // Rows 0..B-1 hold the listed blocks (at most B), padding after them.
  void stage(const std::int32_t* ids, const Batch& blocks, index_t B);
  Span2<const std::int32_t> tokens() const { return Span2<const std::int32_t>(tokens_.data(), rows_, context_); }
  Span2<const std::int32_t> targets() const { return Span2<const std::int32_t>(targets_.data(), rows_, context_); }

 private:
  index_t context_, stride_, rows_ = 0;
  View2<std::int32_t> tokens_, targets_;
  typename View2<std::int32_t>::HostMirror h_tokens_, h_targets_;
};

// What the epoch gradient pass measures of every sequence's own gradient
// (analysis.per_sequence): a gradient engine of G sequences, G dividing the
// batch, computes each sequence's gradient S_b of its summed loss apart (G = 1:
// an engine of one sequence; G > 1: Gpt::gradient_per_sequence, the weight
// products batched per sequence); the batch's gradient is their sum in
// sequence order. `ranges` splits the flat order into contiguous ranges (the
// canonical tensors, from 0 to P) whose |S_b|^2 are taken; `values` maps each
// block value (SPEC section 10's partitions, concatenated) to the ranges
// [first, last) it sums.
template <class T>
class SequenceNorms {
 public:
  SequenceNorms(Gpt<T>& engine, const std::vector<std::int64_t>& ranges,
                std::vector<std::pair<std::size_t, std::size_t>> values, index_t max_batch);
  // Gradients of the first n sequences (rows) of a batch, their sum added
  // into grad, their norms into r (BatchScalars::seq_*).
  LossSum gradients(const ExecSpace& space, Span1<const T> params, Span2<const std::int32_t> tokens,
                    Span2<const std::int32_t> targets, index_t n, Span1<T> grad, BatchScalars& r);
  void accumulate_squares(const ExecSpace& space, Span1<T> grad, double* partial) const;

 private:
  Gpt<T>& engine_;
  std::vector<std::size_t> chunk_range_;  // the range of each chunk
  std::vector<std::pair<std::size_t, std::size_t>> values_;
  std::size_t n_ranges_;
  index_t vector_params_ = 0;  // parameters of one-extent tensors (norms, biases): the cost model's extents
  View1<index_t> chunks_;      // chunk boundaries in the flat order (n_chunks + 1)
  View2<T> g_;                 // (G, P): a group's gradients; (0, P) in place
  // Batches of one sequence through an engine of one: the sequence's
  // gradient is the batch's, written into it and its squares taken there.
  bool in_place_ = false;
  View2<double> partial_;  // (max_batch, n_chunks) sums of squares
};

// Gradients of the summed loss of each batch in `mine`, added into acc.
// Returns false if stopped early. With seq, every sequence's gradient apart
// (SequenceNorms). With a slice of a shard group of R > 1, acc is this
// member's slice and every batch's gradient is scattered into the members'
// slices as it is made (Slice::add): the members go in step, a batch each
// at a time (one without a batch left adds nothing), and a stop stops them
// all at the same batch.
template <class T>
bool gradient_pass(const ExecSpace& space, Gpt<T>& model, BatchStager& stager, Span1<const T> params,
                   const std::int32_t* ids, const std::vector<Batch>& batches, const std::vector<index_t>& mine,
                   ExactSum& acc, std::vector<BatchScalars>& table, const StopCheck& stop = {},
                   const ProgressFn& progress = {}, SequenceNorms<T>* seq = nullptr, const Slice* slice = nullptr);

// Quadratic forms of each batch in `mine` along dirs (K, P) = the model's directions.
// With forward-over-reverse, hv_sums (K of them) may also collect H_sum v_k,
// by slices as the gradient pass's sum with a slice of R > 1.
template <class T>
bool curvature_pass(const ExecSpace& space, Gpt<T>& model, BatchStager& stager, Span1<const T> params,
                    Span2<const T> dirs, const std::int32_t* ids, const std::vector<Batch>& batches,
                    const std::vector<index_t>& mine, CurvatureMethod method, std::vector<BatchScalars>& table,
                    const StopCheck& stop = {}, const ProgressFn& progress = {},
                    std::vector<ExactSum>* hv_sums = nullptr, CurvatureOperator op = CurvatureOperator::hessian,
                    const Slice* slice = nullptr);

}  // namespace gnh
