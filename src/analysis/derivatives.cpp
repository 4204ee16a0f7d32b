// SPDX-License-Identifier: BSD-3-Clause
#include "analysis/derivatives.hpp"

#include "analysis/passes.hpp"
#include "analysis/sampling.hpp"
#include "core/error.hpp"

namespace gnh {

std::vector<index_t> all_blocks(index_t n) {
  std::vector<index_t> b(static_cast<std::size_t>(n));
  for (index_t i = 0; i < n; ++i) b[static_cast<std::size_t>(i)] = i;
  return b;
}

template <class T>
EpochGradient epoch_gradient(const ExecSpace& space, Gpt<T>& model, Span1<const T> params, const std::int32_t* ids,
                             const std::vector<index_t>& blocks, View1<double> G) {
  const index_t P = model.layout().size();
  if (G.extent(0) != static_cast<std::size_t>(P)) throw std::logic_error("epoch_gradient: G has the wrong length");
  const auto batches = make_batches(blocks, model.batch());
  ExactSum acc(P);
  std::vector<BatchScalars> table;
  BatchStager stager(model.batch(), model.context());
  gradient_pass<T>(space, model, stager, params, ids, batches, all_blocks(index_t(batches.size())), acc, table);
  const BatchScalars s = sum_in_order(table);
  EpochGradient out;
  out.tokens = s.count;
  out.batches = index_t(batches.size());
  out.loss = s.count > 0 ? s.loss_sum / double(s.count) : 0.0;
  acc.to_double(space, G.data(), s.count > 0 ? 1.0 / double(s.count) : 0.0);
  space.fence();
  return out;
}

template <class T>
EpochCurvature epoch_curvature(const ExecSpace& space, Gpt<T>& model, Span1<const T> params, Span2<const T> dirs,
                               const std::int32_t* ids, const std::vector<index_t>& blocks, CurvatureMethod method,
                               View2<double> Hv, CurvatureOperator op, index_t stride) {
  const index_t K = dirs.extent(0);
  const auto batches = make_batches(blocks, model.batch());
  EpochCurvature out;
  const index_t P = model.layout().size();
  const bool want_hv = Hv.extent(0) > 0;
  if (want_hv && method != CurvatureMethod::forward_over_reverse)
    throw std::logic_error("epoch_curvature: H v vectors need forward-over-reverse");
  std::vector<ExactSum> hv_sums;
  if (want_hv)
    for (index_t k = 0; k < K; ++k) hv_sums.emplace_back(P);
  std::vector<BatchScalars> table;
  BatchStager stager(model.batch(), model.context(), stride);
  curvature_pass<T>(space, model, stager, params, dirs, ids, batches, all_blocks(index_t(batches.size())), method,
                    table, {}, {}, want_hv ? &hv_sums : nullptr, op);
  const BatchScalars s = sum_in_order(table);
  out.tokens = s.count;
  out.batches = index_t(batches.size());
  const double inv = s.count > 0 ? 1.0 / double(s.count) : 0.0;
  out.loss = s.loss_sum * inv;
  out.vHv.resize(static_cast<std::size_t>(K));
  out.Gv.resize(static_cast<std::size_t>(K));
  out.vGv.resize(static_cast<std::size_t>(K));
  for (index_t k = 0; k < K; ++k) {
    out.vHv[k] = s.second[k] * inv;
    out.vGv[k] = s.gauss_newton[k] * inv;
    out.Gv[k] = s.first[k] * inv;
    if (want_hv) hv_sums[k].to_double(space, Hv.data() + k * P, inv);
  }
  space.fence();
  return out;
}

#define GNH_INSTANTIATE(T)                                                                                      \
  template EpochGradient epoch_gradient<T>(const ExecSpace&, Gpt<T>&, Span1<const T>, const std::int32_t*,      \
                                           const std::vector<index_t>&, View1<double>);                         \
  template EpochCurvature epoch_curvature<T>(const ExecSpace&, Gpt<T>&, Span1<const T>, Span2<const T>,         \
                                             const std::int32_t*, const std::vector<index_t>&, CurvatureMethod, \
                                             View2<double>, CurvatureOperator, index_t);
GNH_INSTANTIATE(float)
GNH_INSTANTIATE(double)
#undef GNH_INSTANTIATE

}  // namespace gnh
