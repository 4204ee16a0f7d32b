// SPDX-License-Identifier: BSD-3-Clause
// Epoch-level derivatives over a list of blocks (the whole epoch, or a noise
// batch): the mean gradient, and quadratic forms v^T H v of the mean loss along
// K directions that share each primal pass, by either curvature path.
// Every sum over batches is taken in double, in block order (deterministic);
// means divide by the true target count of the block list.
#pragma once
#include <string>
#include <vector>

#include "analysis/settings.hpp"
#include "core/types.hpp"
#include "model/gpt.hpp"

namespace gnh {

struct EpochGradient {
  double loss = 0.0;
  std::int64_t tokens = 0;
  index_t batches = 0;
};

struct EpochCurvature {
  double loss = 0.0;
  std::int64_t tokens = 0;
  std::vector<double> vHv;  // per direction: v^T H v of the mean loss
  std::vector<double> Gv;   // per direction: G . v (first derivative along v)
  std::vector<double> vGv;  // per direction: v^T GGN v of the mean loss (its Gauss-Newton part)
  index_t batches = 0;
};

// G (P) = gradient of the mean loss over `blocks` (indices into ids, each of
// context T). model must be planned with reverse mode.
template <class T>
EpochGradient epoch_gradient(const ExecSpace& space, Gpt<T>& model, Span1<const T> params, const std::int32_t* ids,
                             const std::vector<index_t>& blocks, View1<double> G);

// Quadratic forms along dirs (K, P), K = the model's planned directions.
// forward_over_reverse needs a model planned with reverse mode; if Hv is
// non-empty it receives H v_k of the mean loss (K, P). second_order_forward
// needs second-order planes. stride: tokens from one block's first to the
// next's in ids (0: the context; BatchStager).
template <class T>
EpochCurvature epoch_curvature(const ExecSpace& space, Gpt<T>& model, Span1<const T> params, Span2<const T> dirs,
                               const std::int32_t* ids, const std::vector<index_t>& blocks, CurvatureMethod method,
                               View2<double> Hv = View2<double>(), CurvatureOperator op = CurvatureOperator::hessian,
                               index_t stride = 0);

// 0, 1, ..., n-1.
std::vector<index_t> all_blocks(index_t n);

}  // namespace gnh
