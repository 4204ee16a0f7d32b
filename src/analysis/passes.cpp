// SPDX-License-Identifier: BSD-3-Clause
#include "analysis/passes.hpp"

#include <chrono>

#include "analysis/dot.hpp"
#include "analysis/epoch.hpp"
#include "analysis/usage.hpp"
#include "core/error.hpp"

namespace gnh {
namespace {

// The wall time of one batch (its kernels fenced) and the device memory in
// use at its end, into its row.
class BatchClock {
 public:
  void finish(const ExecSpace& space, BatchScalars& r) const {
    space.fence();
    r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
    r.device_bytes = double(device_memory_in_use());
  }

 private:
  std::chrono::steady_clock::time_point t0_ = std::chrono::steady_clock::now();
};

}  // namespace

BatchStager::BatchStager(index_t max_batch, index_t context)
    : context_(context),
      tokens_("gnh::batch::tokens", max_batch, context),
      targets_("gnh::batch::targets", max_batch, context),
      h_tokens_(Kokkos::create_mirror_view(tokens_)),
      h_targets_(Kokkos::create_mirror_view(targets_)) {}

void BatchStager::stage(const std::int32_t* ids, const Batch& blocks, index_t B) {
  if (B > index_t(tokens_.extent(0))) throw std::logic_error("BatchStager: batch larger than planned");
  rows_ = B;
  const View2<std::int32_t, HostSpace> ht(h_tokens_.data(), B, context_), hg(h_targets_.data(), B, context_);
  fill_batch(ht, hg, ids, blocks.data(), index_t(blocks.size()));
  const std::size_t n = std::size_t(B * context_);
  Kokkos::deep_copy(Span1<std::int32_t>(tokens_.data(), n), Span1<std::int32_t, HostSpace>(h_tokens_.data(), n));
  Kokkos::deep_copy(Span1<std::int32_t>(targets_.data(), n), Span1<std::int32_t, HostSpace>(h_targets_.data(), n));
}

template <class T>
bool gradient_pass(const ExecSpace& space, Gpt<T>& model, BatchStager& stager, Span1<const T> params,
                   const std::int32_t* ids, const std::vector<Batch>& batches, const std::vector<index_t>& mine,
                   ExactSum& acc, std::vector<BatchScalars>& table, const StopCheck& stop, const ProgressFn& progress) {
  Kokkos::Profiling::pushRegion("gnh::pass::gradient");
  const index_t P = model.layout().size();
  View1<T> grad("gnh::pass::batch_gradient", P);
  table.resize(batches.size());
  index_t done = 0;
  for (index_t b : mine) {
    if (stop && stop()) {
      Kokkos::Profiling::popRegion();
      return false;
    }
    const BatchClock clock;
    stager.stage(ids, batches[static_cast<std::size_t>(b)], model.batch());
    Kokkos::deep_copy(space, grad, T(0));
    const LossSum s = model.gradient(space, params, stager.tokens(), stager.targets(), grad);
    acc.add(space, grad.data());
    BatchScalars& r = table[static_cast<std::size_t>(b)];
    r.loss_sum = s.sum;
    r.count = s.count;
    r.done = true;
    clock.finish(space, r);
    if (progress) progress(++done, index_t(mine.size()));
  }
  space.fence();
  Kokkos::Profiling::popRegion();
  return true;
}

template <class T>
bool curvature_pass(const ExecSpace& space, Gpt<T>& model, BatchStager& stager, Span1<const T> params,
                    Span2<const T> dirs, const std::int32_t* ids, const std::vector<Batch>& batches,
                    const std::vector<index_t>& mine, CurvatureMethod method, std::vector<BatchScalars>& table,
                    const StopCheck& stop, const ProgressFn& progress, std::vector<ExactSum>* hv_sums,
                    CurvatureOperator op) {
  Kokkos::Profiling::pushRegion("gnh::pass::curvature");
  const index_t P = model.layout().size(), K = dirs.extent(0);
  if (K != model.shape().directions) throw std::logic_error("curvature_pass: directions differ from the plan");
  View1<T> grad;
  View2<T> hv;
  if (method == CurvatureMethod::forward_over_reverse) {
    grad = View1<T>("gnh::pass::batch_gradient", P);
    hv = View2<T>("gnh::pass::batch_hv", K, P);
  }
  table.resize(batches.size());
  index_t done = 0;
  for (index_t b : mine) {
    if (stop && stop()) {
      Kokkos::Profiling::popRegion();
      return false;
    }
    const BatchClock clock;
    stager.stage(ids, batches[static_cast<std::size_t>(b)], model.batch());
    BatchScalars& r = table[static_cast<std::size_t>(b)];
    LossSum s;
    if (method == CurvatureMethod::second_order_forward) {
      s = model.second_order(space, params, dirs, stager.tokens(), stager.targets());
      r.second = s.second;
    } else {
      Kokkos::deep_copy(space, grad, T(0));
      Kokkos::deep_copy(space, hv, T(0));
      s = model.hvp(space, params, dirs, stager.tokens(), stager.targets(), grad, hv, op);
      r.second.assign(static_cast<std::size_t>(K), 0.0);
      for (index_t k = 0; k < K; ++k) {
        r.second[k] = dot(space, dirs.data() + k * P, hv.data() + k * P, P);
        if (hv_sums) (*hv_sums)[static_cast<std::size_t>(k)].add(space, hv.data() + k * P);
      }
    }
    r.first = s.first;
    r.gauss_newton = s.gauss_newton;
    r.loss_sum = s.sum;
    r.count = s.count;
    r.done = true;
    clock.finish(space, r);
    if (progress) progress(++done, index_t(mine.size()));
  }
  space.fence();
  Kokkos::Profiling::popRegion();
  return true;
}

BatchScalars sum_in_order(const std::vector<BatchScalars>& table) {
  BatchScalars s;
  for (const auto& r : table) {
    if (!r.done) throw std::logic_error("sum_in_order: a batch has no result");
    s.loss_sum += r.loss_sum;
    s.count += r.count;
    if (s.first.size() < r.first.size()) s.first.resize(r.first.size(), 0.0);
    if (s.second.size() < r.second.size()) s.second.resize(r.second.size(), 0.0);
    for (std::size_t k = 0; k < r.first.size(); ++k) s.first[k] += r.first[k];
    for (std::size_t k = 0; k < r.second.size(); ++k) s.second[k] += r.second[k];
    if (s.gauss_newton.size() < r.gauss_newton.size()) s.gauss_newton.resize(r.gauss_newton.size(), 0.0);
    for (std::size_t k = 0; k < r.gauss_newton.size(); ++k) s.gauss_newton[k] += r.gauss_newton[k];
  }
  s.done = true;
  return s;
}

#define GNH_INSTANTIATE(T)                                                                                          \
  template bool gradient_pass<T>(const ExecSpace&, Gpt<T>&, BatchStager&, Span1<const T>, const std::int32_t*,      \
                                 const std::vector<Batch>&, const std::vector<index_t>&, ExactSum&,                 \
                                 std::vector<BatchScalars>&, const StopCheck&, const ProgressFn&);                  \
  template bool curvature_pass<T>(const ExecSpace&, Gpt<T>&, BatchStager&, Span1<const T>, Span2<const T>,          \
                                  const std::int32_t*, const std::vector<Batch>&, const std::vector<index_t>&,      \
                                  CurvatureMethod, std::vector<BatchScalars>&, const StopCheck&, const ProgressFn&, \
                                  std::vector<ExactSum>*, CurvatureOperator);
GNH_INSTANTIATE(float)
GNH_INSTANTIATE(double)
#undef GNH_INSTANTIATE

}  // namespace gnh
