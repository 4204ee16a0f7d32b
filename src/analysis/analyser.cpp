// SPDX-License-Identifier: BSD-3-Clause
#include "analysis/analyser.hpp"

#include <string>

#include "analysis/case_analysis.hpp"
#include "analysis/derivatives.hpp"
#include "analysis/sampling.hpp"

namespace gnh {

struct Analyser::Impl {
  virtual ~Impl() = default;
  virtual void set_parameters(const std::vector<float>& params) = 0;
  virtual void set_preconditioner(const std::vector<double>& P) = 0;
  virtual void set_update_target(const std::vector<float>& theta_b) = 0;
  virtual CaseStatistics analyse(Team& team, const std::int32_t* ids, index_t n_blocks, const CaseHooks& hooks) = 0;
  virtual std::vector<double> curvature_along(const std::vector<std::vector<double>>& dirs, const std::int32_t* ids,
                                              index_t n_blocks, index_t stride) = 0;
};

namespace {

// A host vector on the device (empty when it is), of the layout's size P
// (P < 0: of its own size).
template <class D, class S>
View1<D> device_copy(const std::vector<S>& v, index_t P, const char* label) {
  if (v.empty()) return View1<D>();
  if (P < 0) P = index_t(v.size());
  if (index_t(v.size()) != P) throw std::logic_error(std::string(label) + ": size differs from the layout");
  View1<D> out(std::string(label), P);
  auto h = Kokkos::create_mirror_view(out);
  for (index_t i = 0; i < P; ++i) h(i) = static_cast<D>(v[static_cast<std::size_t>(i)]);
  Kokkos::deep_copy(out, h);
  return out;
}

// The engines and parameters of one scalar type.
template <class T>
struct EnginesOf final : Analyser::Impl {
  EnginesOf(const ModelConfig& cfg, const AnalysisSettings& s) : settings(s), engines(cfg, s) {}

  void set_parameters(const std::vector<float>& p) override {
    params = device_copy<T>(p, engines.layout().size(), "gnh::analyser::params");
  }
  void set_preconditioner(const std::vector<double>& p) override {
    // This member's slice with parameter_shards (analyse_case checks its size).
    precond = device_copy<double>(p, -1, "gnh::analyser::preconditioner");
  }
  void set_update_target(const std::vector<float>& b) override {
    target = device_copy<T>(b, engines.layout().size(), "gnh::analyser::update_target");
  }

  CaseStatistics analyse(Team& team, const std::int32_t* ids, index_t n_blocks, const CaseHooks& hooks) override {
    return analyse_case<T>(space, team, engines, params, CaseExtras<T>{precond, target}, ids, n_blocks, settings,
                           hooks);
  }

  std::vector<double> curvature_along(const std::vector<std::vector<double>>& dirs, const std::int32_t* ids,
                                      index_t n_blocks, index_t stride) override {
    const index_t P = engines.layout().size();
    std::vector<double> out;
    for (const index_t K : balanced_passes(index_t(dirs.size()), settings.directions_per_pass)) {
      const index_t c0 = index_t(out.size());
      View2<T> d("gnh::analyser::dirs", K, P);
      auto hd = Kokkos::create_mirror_view(d);
      for (index_t r = 0; r < K; ++r)
        for (index_t i = 0; i < P; ++i) hd(r, i) = static_cast<T>(dirs[std::size_t(c0 + r)][std::size_t(i)]);
      Kokkos::deep_copy(d, hd);
      const EpochCurvature ec =
          epoch_curvature<T>(space, engines.curvature(K), params, d, ids, all_blocks(n_blocks),
                             settings.curvature_method, View2<double>(), CurvatureOperator::hessian, stride);
      out.insert(out.end(), ec.vHv.begin(), ec.vHv.end());
    }
    return out;
  }

  ExecSpace space;
  AnalysisSettings settings;
  Engines<T> engines;
  View1<T> params;
  View1<double> precond;  // empty: no preconditioned statistics
  View1<T> target;        // empty: no update statistics
};

}  // namespace

Analyser::Analyser(const ModelConfig& cfg, const AnalysisSettings& s) {
  if (s.fp64()) impl_ = std::make_unique<EnginesOf<double>>(cfg, s);
  else  // fp32, tf32 (the same computation on a host backend) and bf16-amp
    impl_ = std::make_unique<EnginesOf<float>>(cfg, s);
}

Analyser::~Analyser() = default;

void Analyser::set_parameters(const std::vector<float>& params) { impl_->set_parameters(params); }
void Analyser::set_preconditioner(const std::vector<double>& P) { impl_->set_preconditioner(P); }
void Analyser::set_update_target(const std::vector<float>& theta_b) { impl_->set_update_target(theta_b); }

CaseStatistics Analyser::analyse(Team& team, const std::int32_t* ids, index_t n_blocks, const CaseHooks& hooks) {
  return impl_->analyse(team, ids, n_blocks, hooks);
}

std::vector<double> Analyser::curvature_along(const std::vector<std::vector<double>>& dirs, const std::int32_t* ids,
                                              index_t n_blocks, index_t stride) {
  return impl_->curvature_along(dirs, ids, n_blocks, stride);
}

}  // namespace gnh
