// SPDX-License-Identifier: BSD-3-Clause
#include "analysis/spectrum.hpp"

#include <chrono>
#include <cmath>
#include <sstream>
#include <type_traits>

#include "analysis/dot.hpp"
#include "analysis/team.hpp"
#include "analysis/sampling.hpp"
#include "core/compat.hpp"
#include "core/error.hpp"
#include "core/random.hpp"

namespace gnh {

namespace {

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

// sum_i a_i b_i over one chunk in a fixed order: four interleaved partial
// sums (so that it pipelines), combined pairwise.
KOKKOS_INLINE_FUNCTION double chunk_dot(const double* a, const double* b, index_t n) {
  double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  index_t i = 0;
  for (; i + 4 <= n; i += 4) {
    s0 += a[i] * b[i];
    s1 += a[i + 1] * b[i + 1];
    s2 += a[i + 2] * b[i + 2];
    s3 += a[i + 3] * b[i + 3];
  }
  for (; i < n; ++i) s0 += a[i] * b[i];
  return (s0 + s1) + (s2 + s3);
}

// A pair of a dot product: rows of the basis Q (>= 0) or of the work vectors
// W (-1 - row).
struct DotPair {
  int a, b;
};

template <class T>
struct LanczosChains {
  LanczosChains(const ExecSpace& space, Team& team, Engines<T>& engines, BatchStager& stager, Span1<const T> params,
                View1<double> precond, const std::int32_t* ids, index_t n_blocks, std::int64_t tokens,
                const AnalysisSettings& s, const CaseHooks& hooks, CurvatureOperator op,
                const Partition* blocks = nullptr)
      : space_(space),
        team_(team),
        engines_(engines),
        stager_(stager),
        params_(params),
        ids_(ids),
        s_(s),
        hooks_(hooks),
        op_(op),
        store_(blocks                                  ? hooks.lanczos_blocks
               : op == CurvatureOperator::gauss_newton ? hooks.lanczos_ggn
                                                       : hooks.lanczos),
        name_(blocks                                  ? "spectrum_blocks"
              : op == CurvatureOperator::gauss_newton ? "spectrum_ggn"
                                                      : "spectrum"),
        P_(engines.layout().size()),
        slice_(team.shards(), P_),
        C_(blocks ? index_t(blocks->names.size()) : s.curvature.lanczos_chains),
        m_(s.curvature.lanczos_steps),
        rows_(std::min(m_, P_) + 1),
        tokens_(tokens),
        batches_(make_batches(all_blocks(n_blocks), s.hvp_batch)) {
    n_chunks_ = (P_ + kLanczosChunk - 1) / kLanczosChunk;
    local_chunks_ = index_t(dealt_share(n_chunks_, team.size(), team.rank()).size());
    L_ = 0;
    for (index_t k : dealt_share(n_chunks_, team.size(), team.rank()))
      L_ += std::min(kLanczosChunk, P_ - k * kLanczosChunk);
    Q_ = View2<double>("gnh::lanczos::basis", C_ * rows_, L_);
    W_ = View2<double>("gnh::lanczos::work", C_, L_);
    q_ = View2<double>("gnh::lanczos::current", C_, P_);
    whole_ = View1<double>("gnh::lanczos::whole", P_);
    Hv_ = View1<double>("gnh::lanczos::Hv", P_);
    if (s.curvature.lanczos_php) scale_sqrt(precond);
    state_.chains.resize(std::size_t(C_));
    if (blocks) {
      block_names_ = blocks->names;
      for (std::size_t c = 0; c < blocks->names.size(); ++c)
        ranges_.emplace_back(index_t(blocks->offsets[c]), index_t(blocks->offsets[c + 1]));
    }
    std::ostringstream key;
    key << "lanczos v1 op=" << operator_name() << " P=" << P_ << " chains=" << C_ << " m=" << m_
        << " chunk=" << kLanczosChunk << " tol=" << s.curvature.lanczos_tolerance
        << " top=" << s.curvature.top_eigenvalues << " seed=" << s.seed;
    if (blocks) key << " blocks=" << blocks->name;
    state_.key = key.str();
  }

  // The operator's name in the output: H, P^1/2 H P^1/2 ("PHP"), or the same
  // of the Gauss-Newton part ("GGN", "PGP").
  std::string operator_name() const {
    const bool php = s_.curvature.lanczos_php;
    if (op_ == CurvatureOperator::gauss_newton) return php ? "PGP" : "GGN";
    return php ? "PHP" : "H";
  }

  // sqrt(P) of the preconditioner: the operator is diag(s) H diag(s).
  void scale_sqrt(View1<double> precond) {
    sqrt_p_ = View1<double>("gnh::lanczos::sqrt_p", P_);
    auto out = sqrt_p_;
    Kokkos::parallel_for(
        "gnh::lanczos::sqrt_p", range(space_, P_),
        KOKKOS_LAMBDA(const index_t i) { out(i) = kmath::sqrt(precond(i)); });
  }

  index_t row(index_t chain, index_t step) const { return chain * rows_ + step; }

  // The global index of local element l: local chunk l / chunk is the
  // member's (l / chunk)-th chunk, global chunk (l / chunk) * size + rank.
  KOKKOS_INLINE_FUNCTION static index_t global_of(index_t l, index_t size, index_t rank) {
    return (l / kLanczosChunk * size + rank) * kLanczosChunk + l % kLanczosChunk;
  }

  // Local elements of a whole vector into row r of W.
  void gather(View1<double> whole, index_t r) {
    auto w = Kokkos::subview(W_, r, Kokkos::ALL);
    const index_t size = team_.size(), rank = team_.rank();
    Kokkos::parallel_for(
        "gnh::lanczos::gather", range(space_, L_),
        KOKKOS_LAMBDA(const index_t l) { w(l) = whole(global_of(l, size, rank)); });
  }

  // Row r of the basis, assembled whole into row `chain` of q_.
  void assemble(index_t r, index_t chain) {
    auto out = Kokkos::subview(q_, chain, Kokkos::ALL);
    auto w = whole_;
    Kokkos::deep_copy(space_, w, 0.0);
    auto q = Kokkos::subview(Q_, r, Kokkos::ALL);
    const index_t size = team_.size(), rank = team_.rank();
    Kokkos::parallel_for(
        "gnh::lanczos::scatter", range(space_, L_),
        KOKKOS_LAMBDA(const index_t l) { w(global_of(l, size, rank)) = q(l); });
    space_.fence();
    team_.combine(whole_);
    Kokkos::deep_copy(space_, out, whole_);
  }

  // Every pair's dot product over the whole vector: per-chunk partial sums
  // by their owners, combined over the team, summed in chunk order.
  std::vector<double> dots(const std::vector<DotPair>& pairs) {
    const index_t n = index_t(pairs.size());
    if (n == 0) return {};
    Kokkos::View<int**, Kokkos::LayoutRight, HostSpace> hp("gnh::lanczos::pairs", n, 2);
    for (index_t p = 0; p < n; ++p) {
      hp(p, 0) = pairs[std::size_t(p)].a;
      hp(p, 1) = pairs[std::size_t(p)].b;
    }
    auto dp = Kokkos::create_mirror_view_and_copy(MemSpace(), hp);
    View1<double> partial("gnh::lanczos::partial", n * n_chunks_);
    auto Q = Q_;
    auto W = W_;
    const index_t nc = n_chunks_, lc = local_chunks_, L = L_, size = team_.size(), rank = team_.rank();
    Kokkos::parallel_for(
        "gnh::lanczos::dots", range(space_, n * lc), KOKKOS_LAMBDA(const index_t j) {
          const index_t p = j / lc, c = j % lc;
          const int ia = dp(p, 0), ib = dp(p, 1);
          const double* a = ia >= 0 ? &Q(ia, 0) : &W(-1 - ia, 0);
          const double* b = ib >= 0 ? &Q(ib, 0) : &W(-1 - ib, 0);
          const index_t start = c * kLanczosChunk, len = L - start < kLanczosChunk ? L - start : kLanczosChunk;
          partial(p * nc + c * size + rank) = chunk_dot(a + start, b + start, len) + 0.0;
        });
    space_.fence();
    team_.combine(partial);
    auto h = Kokkos::create_mirror_view_and_copy(HostSpace(), partial);
    std::vector<double> out(std::size_t(n), 0.0);
    for (index_t p = 0; p < n; ++p)
      for (index_t k = 0; k < nc; ++k) out[std::size_t(p)] += h(p * nc + k);
    return out;
  }

  // W(w) -= sum_i coef_i Q(rows_i) for each listed work row, subtracting in
  // the listed order per element (the same order on any backend).
  void subtract(const std::vector<index_t>& work, const std::vector<std::vector<index_t>>& rows,
                const std::vector<std::vector<double>>& coef) {
    const index_t n = index_t(work.size());
    index_t width = 0;
    for (const auto& r : rows) width = std::max(width, index_t(r.size()));
    if (n == 0 || width == 0) return;
    Kokkos::View<index_t**, Kokkos::LayoutRight, HostSpace> hr("gnh::lanczos::rows", n, width + 1);
    Kokkos::View<double**, Kokkos::LayoutRight, HostSpace> hc("gnh::lanczos::coef", n, width);
    for (index_t a = 0; a < n; ++a) {
      hr(a, width) = work[std::size_t(a)];
      for (index_t i = 0; i < width; ++i) {
        const bool in = i < index_t(rows[std::size_t(a)].size());
        hr(a, i) = in ? rows[std::size_t(a)][std::size_t(i)] : -1;
        hc(a, i) = in ? coef[std::size_t(a)][std::size_t(i)] : 0.0;
      }
    }
    auto dr = Kokkos::create_mirror_view_and_copy(MemSpace(), hr);
    auto dc = Kokkos::create_mirror_view_and_copy(MemSpace(), hc);
    constexpr index_t tile = 2048;
    const index_t tiles = (L_ + tile - 1) / tile, L = L_;
    auto Q = Q_;
    auto W = W_;
    Kokkos::parallel_for(
        "gnh::lanczos::subtract", range(space_, n * tiles), KOKKOS_LAMBDA(const index_t j) {
          const index_t a = j / tiles, t0 = (j % tiles) * tile, t1 = t0 + tile < L ? t0 + tile : L;
          const index_t w = dr(a, width);
          for (index_t i = 0; i < width; ++i) {
            const index_t r = dr(a, i);
            if (r < 0) continue;
            const double c = dc(a, i);
            for (index_t l = t0; l < t1; ++l) W(w, l) -= c * Q(r, l);
          }
        });
  }

  // The epoch's operator applied to the current vectors of `chains`, into
  // their rows of W (local elements): H q, or s * H (s * q).
  void apply(const std::vector<index_t>& chains) {
    const auto t0 = std::chrono::steady_clock::now();
    const index_t K = index_t(chains.size());
    View2<T> dirs("gnh::lanczos::directions", K, P_);
    std::vector<ExactSum> sums;
    for (index_t k = 0; k < K; ++k) {
      sums.emplace_back(slice_.n);
      sums.back().clear(space_);
      auto q = Kokkos::subview(q_, chains[std::size_t(k)], Kokkos::ALL);
      auto d = Kokkos::subview(dirs, k, Kokkos::ALL);
      auto sp = sqrt_p_;
      const bool php = sp.extent(0) > 0;
      Kokkos::parallel_for(
          "gnh::lanczos::direction", range(space_, P_),
          KOKKOS_LAMBDA(const index_t i) { d(i) = T(php ? sp(i) * q(i) : q(i)); });
    }
    space_.fence();
    std::vector<BatchScalars> table;
    const ProgressFn progress =
        hooks_.progress ? ProgressFn([this](index_t done, index_t total) { hooks_.progress(stage_, done, total); })
                        : ProgressFn();
    const bool ok =
        curvature_pass<T>(space_, engines_.curvature(K), stager_, params_, Span2<const T>(dirs.data(), K, P_), ids_,
                          batches_, team_.share_of(index_t(batches_.size())), CurvatureMethod::forward_over_reverse,
                          table, hooks_.stop, progress, &sums, op_, &slice_);
    if (team_.any(!ok)) throw Interrupted{};
    team_.share(table);
    for (const BatchScalars& r : table) {
      batch_seconds_.push_back(r.seconds);
      direction_seconds_.push_back(r.seconds / double(K));
    }
    for (index_t k = 0; k < K; ++k) {
      // With parameter_shards: each member's slice of the product, then the
      // product whole on every member (the basis is dealt over the team).
      team_.replicas().sum(sums[std::size_t(k)]);
      sums[std::size_t(k)].to_double(space_, Hv_.data() + slice_.begin, 1.0 / double(tokens_));
      space_.fence();
      if (!slice_.whole()) slice_.group->gather(slice_.layout, Hv_.data());
      if (sqrt_p_.extent(0) > 0) {
        auto h = Hv_;
        auto sp = sqrt_p_;
        Kokkos::parallel_for(
            "gnh::lanczos::scale", range(space_, P_), KOKKOS_LAMBDA(const index_t i) { h(i) *= sp(i); });
      }
      if (!ranges_.empty()) restrict_to_block(Hv_, chains[std::size_t(k)]);
      gather(Hv_, chains[std::size_t(k)]);
    }
    space_.fence();
    pass_seconds_ += seconds_since(t0);
  }

  // A block's chain applies H_bb: the product's entries outside the block
  // (the off-diagonal blocks' H_ab q_b) are dropped.
  void restrict_to_block(View1<double> x, index_t chain) {
    const index_t lo = ranges_[std::size_t(chain)].first, hi = ranges_[std::size_t(chain)].second;
    Kokkos::parallel_for(
        "gnh::lanczos::block", range(space_, P_), KOKKOS_LAMBDA(const index_t i) {
          if (i < lo || i >= hi) x(i) = 0.0;
        });
  }

  // Row 0 of every chain: the SPEC §4 direction v_c, normalised (on a
  // block's chain, v_c restricted to the block, normalised).
  void start() {
    View2<double> v("gnh::lanczos::start", C_, P_);
    fill_rademacher<double>(space_, Span2<double>(v.data(), C_, P_), s_.seed, 0);
    auto q = q_;
    const index_t P = P_;
    if (ranges_.empty()) {
      const double scale = 1.0 / std::sqrt(double(P_));
      Kokkos::parallel_for(
          "gnh::lanczos::normalise", range(space_, C_ * P),
          KOKKOS_LAMBDA(const index_t j) { q(j / P, j % P) = v(j / P, j % P) * scale; });
    }
    for (index_t c = 0; c < index_t(ranges_.size()); ++c) {
      const index_t lo = ranges_[std::size_t(c)].first, hi = ranges_[std::size_t(c)].second;
      const double scale = 1.0 / std::sqrt(double(hi - lo));
      Kokkos::parallel_for(
          "gnh::lanczos::normalise_block", range(space_, P),
          KOKKOS_LAMBDA(const index_t i) { q(c, i) = i >= lo && i < hi ? v(c, i) * scale : 0.0; });
    }
    for (index_t c = 0; c < C_; ++c) {
      gather(Kokkos::subview(q_, c, Kokkos::ALL), c);
      Kokkos::deep_copy(space_, Kokkos::subview(Q_, row(c, 0), Kokkos::ALL), Kokkos::subview(W_, c, Kokkos::ALL));
      store_row(c, 0);
    }
  }

  void store_row(index_t c, index_t step) {
    if (!store_) return;
    space_.fence();
    auto h = Kokkos::create_mirror_view_and_copy(HostSpace(), Kokkos::subview(Q_, row(c, step), Kokkos::ALL));
    const std::int64_t base = (std::int64_t(c) * std::int64_t(rows_) + step) * std::int64_t(P_);
    for (index_t lc = 0; lc < local_chunks_; ++lc) {
      const index_t start = lc * kLanczosChunk, len = std::min(kLanczosChunk, L_ - start);
      store_->write(base + global_of(start, team_.size(), team_.rank()), h.data() + start, len);
    }
  }

  void load_row(index_t c, index_t step) {
    auto h = Kokkos::create_mirror_view(HostSpace(), Kokkos::subview(Q_, row(c, step), Kokkos::ALL));
    const std::int64_t base = (std::int64_t(c) * std::int64_t(rows_) + step) * std::int64_t(P_);
    for (index_t lc = 0; lc < local_chunks_; ++lc) {
      const index_t start = lc * kLanczosChunk, len = std::min(kLanczosChunk, L_ - start);
      store_->read(base + global_of(start, team_.size(), team_.rank()), h.data() + start, len);
    }
    Kokkos::deep_copy(Kokkos::subview(Q_, row(c, step), Kokkos::ALL), h);
  }

  // The team leader's saved state, shared: true if the chains resume from it.
  bool resume() {
    if (!store_) return false;
    std::vector<double> flat;
    std::string error;
    if (team_.rank() == 0) {
      try {
        LanczosState saved;
        saved.key = state_.key;
        if (store_->load(saved) && index_t(saved.chains.size()) == C_) {
          for (const LanczosChainState& c : saved.chains) {
            flat.insert(flat.end(), {double(c.steps), double(int(c.stop)), c.start_vHv, c.start_Hv_sqnorm});
            flat.insert(flat.end(), c.alpha.begin(), c.alpha.end());
            flat.insert(flat.end(), c.beta.begin(), c.beta.end());
          }
        }
      } catch (const Error& e) {
        error = e.what();
      }
    }
    if (team_.any(!error.empty())) throw Error(error);
    std::int64_t n = std::int64_t(flat.size());
    team_.broadcast_value(n, 0);
    if (n == 0) return false;
    flat.resize(std::size_t(n));
    team_.broadcast(flat.data(), sizeof(double) * flat.size(), 0);
    std::size_t at = 0;
    for (LanczosChainState& c : state_.chains) {
      c.steps = std::int64_t(flat[at]);
      c.stop = ChainStop(int(flat[at + 1]));
      c.start_vHv = flat[at + 2];
      c.start_Hv_sqnorm = flat[at + 3];
      at += 4;
      c.alpha.assign(flat.begin() + std::ptrdiff_t(at), flat.begin() + std::ptrdiff_t(at + std::size_t(c.steps)));
      at += std::size_t(c.steps);
      c.beta.assign(flat.begin() + std::ptrdiff_t(at), flat.begin() + std::ptrdiff_t(at + std::size_t(c.steps)));
      at += std::size_t(c.steps);
    }
    // Every row a running chain still needs: all of them, the last the
    // current vector; and the first chain's, for its Ritz vectors.
    for (index_t c = 0; c < C_; ++c) {
      const LanczosChainState& st = state_.chains[std::size_t(c)];
      const bool running = st.stop == ChainStop::running;
      if (!running && !(c == 0 && s_.curvature.eigenvectors > 0)) continue;
      for (index_t j = 0; j < index_t(st.steps) + (running ? 1 : 0); ++j) load_row(c, j);
      if (running) assemble(row(c, index_t(st.steps)), c);
    }
    resumed_at_ = 0;
    for (const LanczosChainState& c : state_.chains) resumed_at_ = std::max<std::int64_t>(resumed_at_, c.steps);
    return true;
  }

  void save() {
    if (!store_) return;
    std::string error;
    try {
      store_->sync();
    } catch (const Error& e) {
      error = e.what();
    }
    if (team_.any(!error.empty())) throw Error(error);
    if (team_.rank() == 0) store_->save(state_);
  }

  // The row of a chain's w (the operator's result) in dots' numbering.
  static int w_row(index_t c) { return int(-1 - c); }

  // One Lanczos step of every running chain.
  void step(const std::vector<index_t>& active) {
    const index_t n = index_t(active.size());
    // The operator on every active chain's current vector, in the fewest
    // passes of at most directions_per_pass.
    index_t first = 0;
    for (const index_t K : balanced_passes(n, s_.directions_per_pass)) {
      apply(std::vector<index_t>(active.begin() + first, active.begin() + first + K));
      first += K;
    }
    const auto t0 = std::chrono::steady_clock::now();
    recurrence(active);
    const std::vector<double> norm = reorthogonalise(active);
    next_vectors(active, norm);
    space_.fence();
    arithmetic_seconds_ += seconds_since(t0);
    for (index_t c : active) {
      const LanczosChainState& st = state_.chains[std::size_t(c)];
      if (st.stop != ChainStop::running) continue;
      store_row(c, index_t(st.steps));
      assemble(row(c, index_t(st.steps)), c);
    }
  }

  // alpha_j = q_j . w (and, at the first step, |w|^2 = |H q_1|^2), then the
  // three-term recurrence: w -= alpha q_j + beta_{j-1} q_{j-1}.
  void recurrence(const std::vector<index_t>& active) {
    const index_t n = index_t(active.size());
    std::vector<DotPair> pairs;
    for (index_t c : active) {
      const auto j = index_t(state_.chains[std::size_t(c)].steps);
      pairs.push_back({int(row(c, j)), w_row(c)});
      if (j == 0) pairs.push_back({w_row(c), w_row(c)});
    }
    const std::vector<double> d = dots(pairs);
    std::vector<std::vector<index_t>> rows(static_cast<std::size_t>(n));
    std::vector<std::vector<double>> coef(static_cast<std::size_t>(n));
    std::size_t at = 0;
    for (index_t a = 0; a < n; ++a) {
      LanczosChainState& st = state_.chains[std::size_t(active[std::size_t(a)])];
      const index_t c = active[std::size_t(a)], j = index_t(st.steps);
      const double alpha = d[at++];
      if (j == 0) {
        st.start_vHv = alpha;
        st.start_Hv_sqnorm = d[at++];
      }
      if (!std::isfinite(alpha))
        fail("spectrum: chain ", c, ", step ", j + 1, ": the Hessian-vector product is not finite (q^T H q = ", alpha,
             ")");
      st.alpha.push_back(alpha);
      rows[std::size_t(a)] = {row(c, j)};
      coef[std::size_t(a)] = {alpha};
      if (j > 0) {
        rows[std::size_t(a)].push_back(row(c, j - 1));
        coef[std::size_t(a)].push_back(st.beta.back());
      }
    }
    subtract(active, rows, coef);
  }

  // Full reorthogonalisation against q_1..q_j by classical Gram-Schmidt,
  // repeated once where it removed more than 1 - 1/sqrt(2) of the norm
  // (Daniel, Gragg, Kaufman and Stewart's criterion: twice is enough).
  // Returns |w| of each active chain.
  std::vector<double> reorthogonalise(const std::vector<index_t>& active) {
    const std::size_t n = active.size();
    std::vector<double> norm(n), before(n);
    std::vector<index_t> pending = active;
    std::vector<DotPair> pairs;
    std::vector<std::vector<index_t>> rows;
    std::vector<std::vector<double>> coef;
    for (int pass = 0; pass < 2 && !pending.empty(); ++pass) {
      pairs.clear();
      for (index_t c : pending) {
        const auto j = index_t(state_.chains[std::size_t(c)].steps);
        pairs.push_back({w_row(c), w_row(c)});
        for (index_t i = 0; i <= j; ++i) pairs.push_back({int(row(c, i)), w_row(c)});
      }
      std::vector<double> d = dots(pairs);
      rows.assign(pending.size(), {});
      coef.assign(pending.size(), {});
      std::size_t at = 0;
      for (std::size_t a = 0; a < pending.size(); ++a) {
        const index_t c = pending[a], j = index_t(state_.chains[std::size_t(c)].steps);
        before[a] = d[at++];
        for (index_t i = 0; i <= j; ++i) {
          rows[a].push_back(row(c, i));
          coef[a].push_back(d[at++]);
        }
      }
      subtract(pending, rows, coef);
      pairs.clear();
      for (index_t c : pending) pairs.push_back({w_row(c), w_row(c)});
      d = dots(pairs);
      std::vector<index_t> again;
      for (std::size_t a = 0; a < pending.size(); ++a) {
        const auto k = std::size_t(std::find(active.begin(), active.end(), pending[a]) - active.begin());
        norm[k] = std::sqrt(d[a]);
        if (d[a] < 0.5 * before[a]) again.push_back(pending[a]);
      }
      pending = again;
    }
    return norm;
  }

  // beta_j = |w|; each chain's stop test; q_{j+1} = w / beta_j where the chain goes on.
  void next_vectors(const std::vector<index_t>& active, const std::vector<double>& norm) {
    for (std::size_t a = 0; a < active.size(); ++a) {
      const index_t c = active[a];
      LanczosChainState& st = state_.chains[std::size_t(c)];
      const double beta = norm[a];
      st.beta.push_back(beta);
      ++st.steps;
      const index_t j = index_t(st.steps);
      const RitzPairs r = ritz_pairs(st.alpha, st.beta);
      // A block's chain spans at most the block's dimension.
      index_t cap = std::min(m_, rows_ - 1);
      if (!ranges_.empty()) cap = std::min(cap, ranges_[std::size_t(c)].second - ranges_[std::size_t(c)].first);
      st.stop = chain_stop(r, beta, s_.curvature.top_eigenvalues, s_.curvature.lanczos_tolerance, j, cap);
      if (st.stop != ChainStop::running) continue;
      auto next = Kokkos::subview(Q_, row(c, j), Kokkos::ALL);
      auto w = Kokkos::subview(W_, c, Kokkos::ALL);
      const double inv = 1.0 / beta;
      Kokkos::parallel_for(
          "gnh::lanczos::next", range(space_, L_), KOKKOS_LAMBDA(const index_t l) { next(l) = w(l) * inv + 0.0; });
    }
  }

  SpectrumRun run() {
    SpectrumRun out;
    if (!resume()) {
      start();
      save();
    }
    out.resumed_at = resumed_at_;
    for (;;) {
      std::vector<index_t> active;
      index_t done = 0;
      for (index_t c = 0; c < C_; ++c) {
        const LanczosChainState& st = state_.chains[std::size_t(c)];
        if (st.stop == ChainStop::running) active.push_back(c);
        done = std::max(done, index_t(st.steps));
      }
      if (active.empty()) break;
      stage_ = name_ + " " + std::to_string(done + 1) + "/" + std::to_string(m_);
      step(active);
      save();
      if (hooks_.progress) hooks_.progress(name_, done + 1, m_);
    }
    out.pass_seconds = pass_seconds_;
    out.arithmetic_seconds = arithmetic_seconds_;
    out.batch_seconds = batch_seconds_;
    out.direction_seconds = direction_seconds_;
    finish(out);
    return out;
  }

  // The first chain's top k Ritz vectors y_i = sum_j S(j, i) q_j (S the
  // eigenvectors of its tridiagonal, q_j its basis), whole on every member,
  // their residuals beta_n |S(n - 1, i)| = |H y_i - theta_i y_i|, and the
  // identity that they are orthonormal (the basis is, to double rounding,
  // after full reorthogonalisation: 1e-10).
  void ritz_vectors(SpectrumRun& out) {
    const LanczosChainState& st = state_.chains.front();
    const index_t k = std::min<index_t>(s_.curvature.eigenvectors, index_t(st.alpha.size()));
    if (k == 0) return;
    const RitzPairs r = ritz_pairs(st.alpha, st.beta, true);
    const index_t n = index_t(r.values.size());
    Kokkos::View<double**, Kokkos::LayoutRight, HostSpace> hc("gnh::lanczos::ritz_coefficients", k, n);
    for (index_t i = 0; i < k; ++i) {
      for (index_t j = 0; j < n; ++j) hc(i, j) = r.vectors[std::size_t(j * n + (n - 1 - i))];
      out.values.push_back(r.values[std::size_t(n - 1 - i)]);
    }
    auto coef = Kokkos::create_mirror_view_and_copy(MemSpace(), hc);
    View2<double> local("gnh::lanczos::ritz_local", k, L_);
    auto Q = Q_;
    const index_t first = row(0, 0), L = L_;
    Kokkos::parallel_for(
        "gnh::lanczos::ritz_vectors", range(space_, k * L), KOKKOS_LAMBDA(const index_t at) {
          const index_t i = at / L, l = at % L;
          double y = 0;
          for (index_t j = 0; j < n; ++j) y += coef(i, j) * Q(first + j, l);
          local(i, l) = y;
        });
    out.vectors = View2<double>("gnh::lanczos::ritz", k, P_);
    const index_t size = team_.size(), rank = team_.rank();
    for (index_t i = 0; i < k; ++i) {
      auto w = whole_;
      auto y = Kokkos::subview(local, i, Kokkos::ALL);
      Kokkos::deep_copy(space_, w, 0.0);
      Kokkos::parallel_for(
          "gnh::lanczos::ritz_scatter", range(space_, L_),
          KOKKOS_LAMBDA(const index_t l) { w(global_of(l, size, rank)) = y(l); });
      space_.fence();
      team_.combine(whole_);
      Kokkos::deep_copy(space_, Kokkos::subview(out.vectors, i, Kokkos::ALL), whole_);
    }
    const TopRitz top = top_ritz(r, st.beta.empty() ? 0 : st.beta.back(), k);
    out.stats.eigenvector_residuals = top.residuals;
    out.orthonormal = IdentityCheck{name_ + "_eigenvectors_orthonormal", 0, 1e-10, true};
    for (index_t i = 0; i < k; ++i)
      for (index_t j = 0; j <= i; ++j) {
        const double d = dot(space_, out.vectors.data() + i * P_, out.vectors.data() + j * P_, P_);
        out.orthonormal.deviation = std::max(out.orthonormal.deviation, std::abs(d - (i == j ? 1.0 : 0.0)));
      }
  }

  // The outputs of SPEC §10 from the chains' tridiagonals: one spectrum of
  // every chain, or on blocks one per block's chain.
  void finish(SpectrumRun& out) {
    out.quadrature = IdentityCheck{name_ + "_quadrature", 0, 1e-10, true};
    double lowest = 0, largest = 0;
    if (ranges_.empty()) {
      std::vector<index_t> all(static_cast<std::size_t>(C_));
      for (index_t c = 0; c < C_; ++c) all[std::size_t(c)] = c;
      out.stats = statistics_of(all, out.quadrature, lowest, largest);
      ritz_vectors(out);
    } else {
      for (index_t c = 0; c < C_; ++c)
        out.blocks.emplace_back(block_names_[std::size_t(c)], statistics_of({c}, out.quadrature, lowest, largest));
    }
    // The Gauss-Newton operator is positive semi-definite, and Ritz values lie
    // in its numerical range: none below zero by more than the products'
    // rounding (the engine's identity tolerance, as the case's checks).
    if (op_ == CurvatureOperator::gauss_newton) {
      const double tol = std::is_same<T, double>::value ? 1e-10 : s_.bf16() ? 1e-2 : 1e-4;
      out.nonnegative = IdentityCheck{name_ + "_nonnegative", largest > 0 ? -lowest / largest : 0.0, tol, true};
    }
  }

  // The spectrum of the listed chains (the first gives the top eigenvalues),
  // their quadrature identity into `quadrature`, their extreme Ritz values
  // into lowest and largest (|theta|).
  SpectrumStatistics statistics_of(const std::vector<index_t>& chains, IdentityCheck& quadrature, double& lowest,
                                   double& largest) const {
    SpectrumStatistics sp;
    sp.present = true;
    sp.op = operator_name();
    sp.steps = m_;
    sp.chains = index_t(chains.size());
    sp.tolerance = s_.curvature.lanczos_tolerance;
    sp.chunk = kLanczosChunk;
    const std::size_t width = std::size_t(m_) * chains.size();
    sp.alpha.assign(width, 0.0);
    sp.beta.assign(width, 0.0);
    sp.ritz_values.assign(width, 0.0);
    sp.ritz_weights.assign(width, 0.0);
    std::vector<RitzPairs> ritz;
    for (std::size_t k = 0; k < chains.size(); ++k) {
      const LanczosChainState& st = state_.chains[std::size_t(chains[k])];
      sp.chain_steps.push_back(st.steps);
      sp.chain_stop.push_back(to_string(st.stop));
      sp.start_vHv.push_back(st.start_vHv);
      sp.start_Hv_sqnorm.push_back(st.start_Hv_sqnorm);
      ritz.push_back(ritz_pairs(st.alpha, st.beta));
      const RitzPairs& r = ritz.back();
      const std::size_t at = k * std::size_t(m_);
      std::copy(st.alpha.begin(), st.alpha.end(), sp.alpha.begin() + std::ptrdiff_t(at));
      std::copy(st.beta.begin(), st.beta.end(), sp.beta.begin() + std::ptrdiff_t(at));
      std::copy(r.values.begin(), r.values.end(), sp.ritz_values.begin() + std::ptrdiff_t(at));
      std::copy(r.weights.begin(), r.weights.end(), sp.ritz_weights.begin() + std::ptrdiff_t(at));
      for (double v : r.values) {
        lowest = std::min(lowest, v);
        largest = std::max(largest, std::abs(v));
      }
      quadrature.deviation = std::max(quadrature.deviation, quadrature_deviation(r, st));
    }
    const LanczosChainState& first = state_.chains[std::size_t(chains.front())];
    const TopRitz top =
        top_ritz(ritz.front(), first.beta.empty() ? 0 : first.beta.back(), s_.curvature.top_eigenvalues);
    sp.top_eigenvalues = top.values;
    sp.top_residuals = top.residuals;
    const SpectralDensity dens = slq_density(ritz, 1024, 0.01);
    sp.broadening = dens.broadening;
    sp.density_grid = dens.grid;
    sp.density = dens.density;
    return sp;
  }

  // Gauss quadrature with a chain's nodes and weights is exact for the
  // first moments: sum w theta = q^T H q and sum w theta^2 = |H q|^2.
  // Double arithmetic on m x m matrices: 1e-10 relative.
  static double quadrature_deviation(const RitzPairs& r, const LanczosChainState& st) {
    double m1 = 0, m1abs = 0, m2 = 0;
    for (std::size_t i = 0; i < r.values.size(); ++i) {
      m1 += r.weights[i] * r.values[i];
      m1abs += r.weights[i] * std::abs(r.values[i]);
      m2 += r.weights[i] * r.values[i] * r.values[i];
    }
    return std::max(std::abs(m1 - st.start_vHv) / std::max(m1abs, 1e-300),
                    std::abs(m2 - st.start_Hv_sqnorm) / std::max(st.start_Hv_sqnorm, 1e-300));
  }

  const ExecSpace& space_;
  Team& team_;
  Engines<T>& engines_;
  BatchStager& stager_;
  Span1<const T> params_;
  const std::int32_t* ids_;
  const AnalysisSettings& s_;
  const CaseHooks& hooks_;
  const CurvatureOperator op_;
  LanczosStore* const store_;  // the operator's saved state between steps, or none
  const std::string name_;     // "spectrum" or "spectrum_ggn": stage, group and identity names
  const index_t P_;
  const Slice slice_;  // parallel.parameter_shards: this member's slice of the products' exact sums
  const index_t C_, m_, rows_;
  const std::int64_t tokens_;
  const std::vector<Batch> batches_;
  index_t n_chunks_ = 0, local_chunks_ = 0, L_ = 0;
  View2<double> Q_, W_, q_;  // basis shard (chains x rows, L); work rows (chains, L); current vectors (chains, P)
  View1<double> whole_, Hv_, sqrt_p_;
  LanczosState state_;
  std::string stage_;
  double pass_seconds_ = 0, arithmetic_seconds_ = 0;
  std::vector<double> batch_seconds_, direction_seconds_;
  std::int64_t resumed_at_ = -1;
  // spectrum_blocks: each chain's block, a range of the flat order, and its name.
  std::vector<std::pair<index_t, index_t>> ranges_;
  std::vector<std::string> block_names_;
};

}  // namespace

template <class T>
SpectrumRun lanczos_spectrum(const ExecSpace& space, Team& team, Engines<T>& engines, BatchStager& stager,
                             Span1<const T> params, View1<double> precond, const std::int32_t* ids, index_t n_blocks,
                             std::int64_t tokens, const AnalysisSettings& s, const CaseHooks& hooks,
                             CurvatureOperator op, const Partition* blocks) {
  return LanczosChains<T>(space, team, engines, stager, params, precond, ids, n_blocks, tokens, s, hooks, op, blocks)
      .run();
}

template SpectrumRun lanczos_spectrum<float>(const ExecSpace&, Team&, Engines<float>&, BatchStager&, Span1<const float>,
                                             View1<double>, const std::int32_t*, index_t, std::int64_t,
                                             const AnalysisSettings&, const CaseHooks&, CurvatureOperator,
                                             const Partition*);
template SpectrumRun lanczos_spectrum<double>(const ExecSpace&, Team&, Engines<double>&, BatchStager&,
                                              Span1<const double>, View1<double>, const std::int32_t*, index_t,
                                              std::int64_t, const AnalysisSettings&, const CaseHooks&,
                                              CurvatureOperator, const Partition*);

}  // namespace gnh
