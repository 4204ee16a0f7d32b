// SPDX-License-Identifier: BSD-3-Clause
#include "analysis/case_analysis.hpp"

#include <chrono>
#include <cmath>
#include <type_traits>

#include "analysis/dot.hpp"
#include "analysis/sampling.hpp"
#include "core/error.hpp"
#include "core/random.hpp"

namespace gnh {
namespace {

Shape make_shape(index_t batch, index_t context, int K, bool reverse, bool second, const AnalysisSettings& a) {
  Shape s;
  s.bf16 = a.bf16;
  s.tf32 = a.tf32;
  s.batch = batch;
  s.context = context;
  s.directions = K;
  s.reverse = reverse;
  s.second_order = second;
  return s;
}

class Stopwatch {
 public:
  double lap() {
    const auto now = std::chrono::steady_clock::now();
    const double s = std::chrono::duration<double>(now - t_).count();
    t_ = now;
    return s;
  }

 private:
  std::chrono::steady_clock::time_point t_ = std::chrono::steady_clock::now();
};

}  // namespace

template <class T>
Engines<T>::Engines(const ModelConfig& cfg, const AnalysisSettings& s)
    : gradient(cfg, make_shape(s.grad_microbatch, s.context, 0, true, false, s)),
      check_for(cfg, make_shape(1, s.context, 2, true, false, s)),
      check_sof(cfg, make_shape(1, s.context, 2, false, true, s)),
      cfg_(cfg),
      settings_(s) {}

template <class T>
Gpt<T>& Engines<T>::curvature(index_t K) {
  if (K < 1 || K > settings_.directions_per_pass)
    throw std::logic_error("gnh::engines::curvature: K outside 1..directions_per_pass");
  if (!curvature_ || curvature_->shape().directions != K) {
    curvature_.reset();  // free the old plan before making the new one
    const AnalysisSettings& s = settings_;
    curvature_ = std::make_unique<Gpt<T>>(
        cfg_, make_shape(s.hvp_batch, s.context, int(K), s.method == CurvatureMethod::forward_over_reverse,
                         s.method == CurvatureMethod::second_order_forward, s));
    curvature_peak_bytes_ = std::max(curvature_peak_bytes_, curvature_->workspace_bytes());
  }
  return *curvature_;
}

template <class T>
std::size_t Engines<T>::bytes() const {
  return gradient.workspace_bytes() + curvature_peak_bytes_ + check_for.workspace_bytes() +
         check_sof.workspace_bytes();
}

template <class T>
CaseStatistics analyse_case(const ExecSpace& space, Team& team, Engines<T>& engines, Span1<const T> params,
                            const std::int32_t* ids, index_t n_blocks, const AnalysisSettings& s,
                            const CaseHooks& hooks) {
  constexpr bool fp64 = std::is_same<T, double>::value;
  const index_t P = engines.gradient.layout().size();
  CaseStatistics out;
  out.m.n_blocks = n_blocks;
  out.m.context = s.context;
  out.m.noise_batch = s.noise_batch;
  Stopwatch clock;
  auto progress = [&](const std::string& stage) -> ProgressFn {
    if (!hooks.progress) return {};
    return [&hooks, stage](index_t done, index_t total) { hooks.progress(stage, done, total); };
  };

  // 1. The epoch gradient.
  const std::vector<index_t> blocks = all_blocks(n_blocks);
  const auto gbatches = make_batches(blocks, s.grad_microbatch);
  ExactSum acc(P);
  acc.clear(space);
  std::vector<BatchScalars> table;
  bool ok = gradient_pass<T>(space, engines.gradient, params, ids, gbatches, team.share_of(index_t(gbatches.size())),
                             acc, table, hooks.stop, progress("gradient"));
  if (team.any(!ok)) throw Interrupted{};
  team.sum(acc);
  team.share(table);
  const BatchScalars gs = sum_in_order(table);
  out.tokens = gs.count;
  out.loss = gs.loss_sum / double(gs.count);
  if (!std::isfinite(out.loss)) fail("the epoch loss is not finite (", out.loss, ")");
  View1<double> G("gnh::case::G", P);
  acc.to_double(space, G.data(), 1.0 / double(gs.count));
  out.m.G_sqnorm = dot(space, G.data(), G.data(), P);
  out.timings.emplace_back("gradient", clock.lap());

  // 2. Noise batches: each computed whole by one member, then shared.
  out.noise_blocks = noise_batches(n_blocks, s.noise_batch, s.noise_samples, s.seed);
  const index_t m = index_t(out.noise_blocks.size());
  const bool partition = m > 0 && m * s.noise_batch == n_blocks;
  View2<T> xi("gnh::case::xi", m, P);
  View1<double> gj("gnh::case::g_j", P), xij("gnh::case::xi_j", P);
  ExactSum gsum(partition ? P : 0);
  if (partition) gsum.clear(space);
  bool stopped = false;
  for (index_t j = 0; j < m; ++j) {
    const int owner = team.owner(j);
    double msg[5] = {0, 0, 0, 0, 0};  // |g|^2, |xi|^2, G.xi, stopped, finite
    if (team.rank() == owner) {
      const auto nb = make_batches(out.noise_blocks[static_cast<std::size_t>(j)], s.grad_microbatch);
      ExactSum a(P);
      a.clear(space);
      std::vector<BatchScalars> t;
      if (stopped || !gradient_pass<T>(space, engines.gradient, params, ids, nb, all_blocks(index_t(nb.size())), a,
                                       t, hooks.stop)) {
        stopped = true;
        msg[3] = 1;
      } else {
        const BatchScalars ns = sum_in_order(t);
        a.to_double(space, gj.data(), 1.0 / double(ns.count));
        auto g = gj;
        auto x = xij;
        auto Gv = G;
        auto xr = Kokkos::subview(xi, j, Kokkos::ALL);
        Kokkos::parallel_for("gnh::case::xi", range(space, P), KOKKOS_LAMBDA(const index_t i) {
          x(i) = g(i) - Gv(i);
          xr(i) = static_cast<T>(x(i));
        });
        msg[0] = dot(space, gj.data(), gj.data(), P);
        msg[1] = dot(space, xij.data(), xij.data(), P);
        msg[2] = dot(space, G.data(), xij.data(), P);
        msg[4] = std::isfinite(msg[0]) ? 1 : 0;
        if (partition) gsum.add(space, gj.data());
      }
      space.fence();
    }
    team.broadcast(msg, sizeof(msg), owner);
    team.broadcast(xi.data() + j * P, sizeof(T) * static_cast<std::size_t>(P), owner);
    stopped = stopped || msg[3] != 0;
    if (!stopped && msg[4] == 0) fail("noise batch ", j, ": the gradient is not finite");
    out.m.gB_sqnorm.push_back(msg[0]);
    out.m.xi_sqnorm.push_back(msg[1]);
    out.m.G_dot_xi.push_back(msg[2]);
    if (hooks.progress) hooks.progress("noise", j + 1, m);
  }
  if (team.any(stopped)) throw Interrupted{};
  if (hooks.keep) {
    auto hG = Kokkos::create_mirror_view_and_copy(HostSpace(), G);
    auto hxi = Kokkos::create_mirror_view_and_copy(HostSpace(), xi);
    hooks.keep->G.assign(hG.data(), hG.data() + P);
    hooks.keep->xi.assign(static_cast<std::size_t>(m), std::vector<double>(static_cast<std::size_t>(P)));
    for (index_t j = 0; j < m; ++j)
      for (index_t i = 0; i < P; ++i) hooks.keep->xi[j][i] = double(hxi(j, i));
  }
  out.timings.emplace_back("noise", clock.lap());

  // 3. Curvature: every direction of the case in the fewest epoch passes of at
  // most directions_per_pass, balanced, each pass exactly as wide as it needs.
  const index_t D = 1 + m + s.directions;
  const std::vector<index_t> sizes = balanced_passes(D, s.directions_per_pass);
  const index_t passes = index_t(sizes.size());
  const auto cbatches = make_batches(blocks, s.hvp_batch);
  View2<T> dirs("gnh::case::directions", sizes.front(), P);
  std::vector<double> quad(static_cast<std::size_t>(D)), first(static_cast<std::size_t>(D));
  for (index_t c = 0, d0 = 0; c < passes; d0 += sizes[std::size_t(c)], ++c) {
    const index_t K = sizes[std::size_t(c)];
    for (index_t r = 0; r < K; ++r) {
      const index_t d = d0 + r;
      auto row = Kokkos::subview(dirs, r, Kokkos::ALL);
      if (d == 0) {
        auto Gv = G;
        Kokkos::parallel_for("gnh::case::dir_G", range(space, P), KOKKOS_LAMBDA(const index_t i) { row(i) = T(Gv(i)); });
      } else if (d <= m) {
        Kokkos::deep_copy(space, row, Kokkos::subview(xi, d - 1, Kokkos::ALL));
      } else {
        fill_rademacher<T>(space, Span2<T>(dirs.data() + r * P, 1, P), s.seed, std::uint64_t(d - 1 - m));
      }
    }
    space.fence();
    std::vector<BatchScalars> ct;
    // The first K rows of dirs, contiguous (LayoutRight).
    const Span2<const T> pass_dirs(dirs.data(), K, P);
    ok = curvature_pass<T>(space, engines.curvature(K), params, pass_dirs, ids, cbatches,
                           team.share_of(index_t(cbatches.size())), s.method, ct, hooks.stop,
                           progress("curvature " + std::to_string(c + 1) + "/" + std::to_string(passes)));
    if (team.any(!ok)) throw Interrupted{};
    team.share(ct);
    const BatchScalars cs = sum_in_order(ct);
    for (index_t r = 0; r < K; ++r) {
      quad[d0 + r] = cs.second[r] / double(gs.count);
      first[d0 + r] = cs.first[r] / double(gs.count);
    }
  }
  out.m.GHG = quad[0];
  out.m.xiHxi.assign(quad.begin() + 1, quad.begin() + 1 + m);
  out.m.vHv.assign(quad.begin() + 1 + m, quad.end());
  for (double q : quad)
    if (!std::isfinite(q)) fail("a curvature quadratic form is not finite");
  out.timings.emplace_back("curvature", clock.lap());

  // 4. Identities (SPEC §4). Tolerances: the |g|^2 identity is double
  // arithmetic on double vectors (1e-10); the others compare two computations
  // in the engine's precision (fp64 1e-10; fp32 1e-4, a few hundred float eps
  // amplified by the depth of the graph).
  // Under bf16-amp the compared computations round their operands at
  // different points (8-bit mantissas): 1e-2.
  const double tol = fp64 ? 1e-10 : s.bf16 ? 1e-2 : 1e-4;
  IdentityCheck pyth{"norm_decomposition", 0, 1e-10, m > 0};
  for (index_t j = 0; j < m; ++j) {
    const double rhs = out.m.G_sqnorm + 2 * out.m.G_dot_xi[j] + out.m.xi_sqnorm[j];
    pyth.deviation = std::max(pyth.deviation, std::abs(out.m.gB_sqnorm[j] - rhs) / out.m.gB_sqnorm[j]);
  }
  IdentityCheck gradient_first{"gradient_first_order", std::abs(first[0] - out.m.G_sqnorm) / out.m.G_sqnorm, tol, true};
  IdentityCheck part{"partition_mean_gradient", 0, tol, partition};
  if (partition) {
    team.sum(gsum);
    gsum.to_double(space, gj.data(), 1.0 / double(m));
    auto g = gj;
    auto Gv = G;
    double num = 0;
    Kokkos::parallel_reduce(
        "gnh::case::partition", range(space, P),
        KOKKOS_LAMBDA(const index_t i, double& a) { a += (g(i) - Gv(i)) * (g(i) - Gv(i)); }, num);
    part.deviation = std::sqrt(num / out.m.G_sqnorm);
  }
  // Symmetry u^T(Hv) = v^T(Hu) and agreement of the two curvature paths, on block 0.
  IdentityCheck symmetry{"hessian_symmetry", 0, tol, true}, paths{"curvature_paths", 0, tol, true};
  {
    View2<T> uv("gnh::case::check_dirs", 2, P);
    fill_rademacher<T>(space, uv, s.seed, 0);
    std::vector<Batch> one{Batch{0}};
    View1<T> grad("gnh::case::check_grad", P);
    View2<T> hv("gnh::case::check_hv", 2, P);
    Kokkos::deep_copy(space, grad, T(0));
    Kokkos::deep_copy(space, hv, T(0));
    View2<std::int32_t> tok("tok", 1, s.context), tgt("tgt", 1, s.context);
    auto ht = Kokkos::create_mirror_view(tok);
    auto hg = Kokkos::create_mirror_view(tgt);
    for (index_t t = 0; t < s.context; ++t) {
      ht(0, t) = ids[t];
      hg(0, t) = ids[t + 1];
    }
    Kokkos::deep_copy(tok, ht);
    Kokkos::deep_copy(tgt, hg);
    engines.check_for.hvp(space, params, uv, tok, tgt, grad, hv);
    const double uHv = dot(space, uv.data(), hv.data() + P, P, false);
    const double vHu = dot(space, uv.data() + P, hv.data(), P, false);
    const double scale = dot(space, uv.data(), hv.data() + P, P, true);
    symmetry.deviation = std::abs(uHv - vHu) / scale;
    const LossSum so = engines.check_sof.second_order(space, params, uv, tok, tgt);
    for (index_t k = 0; k < 2; ++k) {
      const double q = dot(space, uv.data() + k * P, hv.data() + k * P, P, false);
      const double qs = dot(space, uv.data() + k * P, hv.data() + k * P, P, true);
      paths.deviation = std::max(paths.deviation, std::abs(so.second[k] - q) / qs);
    }
  }
  out.identities = {pyth, gradient_first, part, symmetry, paths};
  out.timings.emplace_back("checks", clock.lap());
  out.derived = derive(out.m);
  double total = 0;
  for (const auto& t : out.timings) total += t.second;
  out.timings.emplace_back("total", total);
  out.peak_memory_bytes = std::int64_t(engines.bytes()) + std::int64_t(sizeof(double)) * P * 4 +
                          std::int64_t(sizeof(fixed128)) * P * (partition ? 3 : 2) +
                          std::int64_t(sizeof(T)) * P * (m + sizes.front() + 2 + 3);
  return out;
}

template struct Engines<float>;
template struct Engines<double>;
template CaseStatistics analyse_case<float>(const ExecSpace&, Team&, Engines<float>&, Span1<const float>,
                                            const std::int32_t*, index_t, const AnalysisSettings&, const CaseHooks&);
template CaseStatistics analyse_case<double>(const ExecSpace&, Team&, Engines<double>&, Span1<const double>,
                                             const std::int32_t*, index_t, const AnalysisSettings&, const CaseHooks&);

}  // namespace gnh
