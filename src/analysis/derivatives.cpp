// SPDX-License-Identifier: BSD-3-Clause
#include "analysis/derivatives.hpp"

#include "core/error.hpp"

namespace gnh {

CurvatureMethod parse_curvature_method(const std::string& s) {
  if (s == "forward-over-reverse") return CurvatureMethod::forward_over_reverse;
  if (s == "second-order-forward") return CurvatureMethod::second_order_forward;
  fail("unknown curvature method \"", s, "\" (expected forward-over-reverse or second-order-forward)");
}

const char* to_string(CurvatureMethod m) {
  return m == CurvatureMethod::forward_over_reverse ? "forward-over-reverse" : "second-order-forward";
}

std::vector<index_t> all_blocks(index_t n) {
  std::vector<index_t> b(static_cast<std::size_t>(n));
  for (index_t i = 0; i < n; ++i) b[static_cast<std::size_t>(i)] = i;
  return b;
}

namespace {

// Stages batches of blocks: inputs and targets of each listed block, padded
// with ignored targets past the end of the list.
class BatchStager {
 public:
  BatchStager(index_t B, index_t Tc)
      : tokens_("gnh::batch::tokens", B, Tc), targets_("gnh::batch::targets", B, Tc),
        h_tokens_(Kokkos::create_mirror_view(tokens_)), h_targets_(Kokkos::create_mirror_view(targets_)) {}

  void stage(const std::int32_t* ids, const std::vector<index_t>& blocks, std::size_t first) {
    const index_t B = tokens_.extent(0), Tc = tokens_.extent(1);
    for (index_t b = 0; b < B; ++b) {
      const std::size_t j = first + static_cast<std::size_t>(b);
      const bool real = j < blocks.size();
      const std::int32_t* block = real ? ids + blocks[j] * Tc : ids;
      for (index_t t = 0; t < Tc; ++t) {
        h_tokens_(b, t) = real ? block[t] : 0;
        h_targets_(b, t) = real ? block[t + 1] : -1;
      }
    }
    Kokkos::deep_copy(tokens_, h_tokens_);
    Kokkos::deep_copy(targets_, h_targets_);
  }
  Span2<const std::int32_t> tokens() const { return tokens_; }
  Span2<const std::int32_t> targets() const { return targets_; }

 private:
  View2<std::int32_t> tokens_, targets_;
  typename View2<std::int32_t>::HostMirror h_tokens_, h_targets_;
};

// acc (n) += x (n), widened to double.
template <class T>
void widen_add(const ExecSpace& space, double* acc, const T* x, index_t n, double scale = 1.0) {
  Kokkos::parallel_for(
      "gnh::derivatives::accumulate", range(space, n),
      KOKKOS_LAMBDA(const index_t i) { acc[i] += scale * double(x[i]); });
}

template <class T>
double dot_double(const ExecSpace& space, const T* a, const T* b, index_t n) {
  double s = 0;
  Kokkos::parallel_reduce(
      "gnh::derivatives::dot", range(space, n),
      KOKKOS_LAMBDA(const index_t i, double& acc) { acc += double(a[i]) * double(b[i]); }, s);
  return s;
}

}  // namespace

template <class T>
EpochGradient epoch_gradient(const ExecSpace& space, Gpt<T>& model, Span1<const T> params,
                             const std::int32_t* ids, const std::vector<index_t>& blocks, View1<double> G) {
  Kokkos::Profiling::pushRegion("gnh::epoch::gradient");
  const index_t P = model.layout().size(), B = model.batch();
  if (G.extent(0) != static_cast<std::size_t>(P)) throw std::logic_error("epoch_gradient: G has the wrong length");
  BatchStager stage(B, model.context());
  View1<T> grad("gnh::epoch::batch_gradient", P);
  Kokkos::deep_copy(space, G, 0.0);
  EpochGradient out;
  double sum = 0;
  for (std::size_t first = 0; first < blocks.size(); first += static_cast<std::size_t>(B)) {
    stage.stage(ids, blocks, first);
    Kokkos::deep_copy(space, grad, T(0));
    const LossSum s = model.gradient(space, params, stage.tokens(), stage.targets(), grad);
    widen_add(space, G.data(), grad.data(), P);
    sum += s.sum;
    out.tokens += s.count;
    ++out.batches;
  }
  if (out.tokens > 0) {
    const double inv = 1.0 / double(out.tokens);
    Kokkos::parallel_for("gnh::epoch::gradient::mean", range(space, P), KOKKOS_LAMBDA(const index_t i) { G(i) *= inv; });
    out.loss = sum / double(out.tokens);
  }
  space.fence();
  Kokkos::Profiling::popRegion();
  return out;
}

template <class T>
EpochCurvature epoch_curvature(const ExecSpace& space, Gpt<T>& model, Span1<const T> params,
                               Span2<const T> dirs, const std::int32_t* ids,
                               const std::vector<index_t>& blocks, CurvatureMethod method,
                               View2<double> Hv) {
  Kokkos::Profiling::pushRegion("gnh::epoch::curvature");
  const index_t P = model.layout().size(), B = model.batch(), K = dirs.extent(0);
  if (K != model.shape().directions) throw std::logic_error("epoch_curvature: directions differ from the plan");
  BatchStager stage(B, model.context());
  EpochCurvature out;
  out.vHv.assign(static_cast<std::size_t>(K), 0.0);
  out.Gv.assign(static_cast<std::size_t>(K), 0.0);
  const bool want_hv = Hv.extent(0) > 0;
  if (want_hv) Kokkos::deep_copy(space, Hv, 0.0);
  View1<T> grad;
  View2<T> hv;
  if (method == CurvatureMethod::forward_over_reverse) {
    grad = View1<T>("gnh::epoch::batch_gradient", P);
    hv = View2<T>("gnh::epoch::batch_hv", K, P);
  }
  double sum = 0;
  for (std::size_t first = 0; first < blocks.size(); first += static_cast<std::size_t>(B)) {
    stage.stage(ids, blocks, first);
    LossSum s;
    if (method == CurvatureMethod::second_order_forward) {
      s = model.second_order(space, params, dirs, stage.tokens(), stage.targets());
      for (index_t k = 0; k < K; ++k) out.vHv[k] += s.second[k];
    } else {
      Kokkos::deep_copy(space, grad, T(0));
      Kokkos::deep_copy(space, hv, T(0));
      s = model.hvp(space, params, dirs, stage.tokens(), stage.targets(), grad, hv);
      for (index_t k = 0; k < K; ++k) {
        out.vHv[k] += dot_double(space, dirs.data() + k * P, hv.data() + k * P, P);
        if (want_hv) widen_add(space, Hv.data() + k * P, hv.data() + k * P, P);
      }
    }
    for (index_t k = 0; k < K; ++k) out.Gv[k] += s.first[k];
    sum += s.sum;
    out.tokens += s.count;
    ++out.batches;
  }
  if (out.tokens > 0) {
    const double inv = 1.0 / double(out.tokens);
    for (index_t k = 0; k < K; ++k) {
      out.vHv[k] *= inv;
      out.Gv[k] *= inv;
    }
    out.loss = sum / double(out.tokens);
    if (want_hv) {
      const index_t n = K * P;
      double* h = Hv.data();
      Kokkos::parallel_for("gnh::epoch::curvature::mean", range(space, n), KOKKOS_LAMBDA(const index_t i) { h[i] *= inv; });
    }
  }
  space.fence();
  Kokkos::Profiling::popRegion();
  return out;
}

#define GNH_INSTANTIATE(T)                                                                                  \
  template EpochGradient epoch_gradient<T>(const ExecSpace&, Gpt<T>&, Span1<const T>, const std::int32_t*, \
                                           const std::vector<index_t>&, View1<double>);                     \
  template EpochCurvature epoch_curvature<T>(const ExecSpace&, Gpt<T>&, Span1<const T>, Span2<const T>,     \
                                             const std::int32_t*, const std::vector<index_t>&,              \
                                             CurvatureMethod, View2<double>);
GNH_INSTANTIATE(float)
GNH_INSTANTIATE(double)
#undef GNH_INSTANTIATE

}  // namespace gnh
