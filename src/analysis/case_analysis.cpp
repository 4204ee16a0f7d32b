// SPDX-License-Identifier: BSD-3-Clause
#include "analysis/case_analysis.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <type_traits>

#include "analysis/blocks.hpp"
#include "analysis/dot.hpp"
#include "analysis/landscape.hpp"
#include "analysis/passes.hpp"
#include "analysis/shard_dot.hpp"
#include "analysis/sampling.hpp"
#include "analysis/spectrum.hpp"
#include "analysis/usage.hpp"
#include "core/error.hpp"
#include "core/random.hpp"

namespace gnh {

template <class T>
Engines<T>::Engines(const ModelConfig& cfg, const AnalysisSettings& s)
    : cfg_(cfg), settings_(s), layout_(cfg), gradient_(std::make_unique<Gpt<T>>(cfg, gradient_shape(s))) {
  sequence_group = s.per_sequence ? gnh::sequence_group(cfg, s, gradient_->shape().gpu_shaped) : 0;
  if (sequence_group > 0 && sequence_group != s.grad_microbatch)
    sequence = std::make_unique<Gpt<T>>(cfg, sequence_shape(s, sequence_group));
}

template <class T>
Gpt<T>& Engines<T>::gradient() {
  if (!gradient_) {
    curvature_.reset();  // freed first: the two are never held together
    gradient_ = std::make_unique<Gpt<T>>(cfg_, gradient_shape(settings_));
  }
  return *gradient_;
}

template <class T>
Gpt<T>& Engines<T>::curvature(index_t K) {
  if (K < 1 || K > settings_.directions_per_pass)
    throw std::logic_error("gnh::engines::curvature: K outside 1..directions_per_pass");
  gradient_.reset();  // freed first: the two are never held together
  if (!curvature_ || curvature_->shape().directions != K) {
    // The new plan runs in the old one's buffers where they fit (a pass of
    // K - 1 after one of K: no fresh memory to fault in, which on a short
    // epoch cost a tenth of the curvature stage); the old engine goes first.
    std::vector<View1<T>> storage;
    if (curvature_) storage = curvature_->release_storage();
    curvature_.reset();
    curvature_ = std::make_unique<Gpt<T>>(cfg_, curvature_shape(settings_, K), std::move(storage));
  }
  return *curvature_;
}

template <class T>
Gpt<T>& Engines<T>::check(bool second_order) {
  gradient_.reset();
  curvature_.reset();
  (second_order ? check_for_ : check_sof_).reset();
  std::unique_ptr<Gpt<T>>& engine = second_order ? check_sof_ : check_for_;
  if (!engine) engine = std::make_unique<Gpt<T>>(cfg_, check_shape(settings_, second_order));
  return *engine;
}

template <class T>
void Engines<T>::release_checks() {
  check_for_.reset();
  check_sof_.reset();
}

namespace {

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

// What the member that computed noise batch j tells the team.
struct NoiseSample {
  double gB_sqnorm = 0, xi_sqnorm = 0, G_dot_xi = 0;
  bool stopped = false;  // a termination signal stopped its gradient pass
  bool finite = false;   // |g_j|^2 is finite
  double xiPxi = 0;      // xi_j^T P xi_j, with the AdamW preconditioner
  double seconds = 0;    // its gradient pass's batches (measured, not a result)
};

// The stages of one case, in order; each fills its part of `out_`. (Every
// member is public: nvcc allows no device lambda in a private member function.)
template <class T>
struct CaseAnalysis {
  CaseAnalysis(const ExecSpace& space, Team& team, Engines<T>& engines, Span1<const T> params,
               const CaseExtras<T>& extras, const std::int32_t* ids, index_t n_blocks, const AnalysisSettings& s,
               const CaseHooks& hooks)
      : space_(space),
        team_(team),
        replicas_(team.replicas()),
        engines_(engines),
        params_(params),
        precond_(extras.precond),
        target_(extras.target),
        ids_(ids),
        s_(s),
        hooks_(hooks),
        plan_(plan_case(s, n_blocks, extras.precond.extent(0) > 0, extras.target.extent(0) > 0)),
        P_(engines.layout().size()),
        slice_(team.shards(), P_),
        begin_(slice_.begin),
        n_(slice_.n),
        stager_(std::max<index_t>(s.grad_microbatch, s.hvp_batch), s.context, hooks.block_stride),
        G_("gnh::case::G", n_) {
    out_.m.n_blocks = n_blocks;
    out_.m.context = s.context;
    out_.m.noise_batch = s.noise_batch;
    out_.m.preconditioned = plan_.preconditioned;
    out_.m.gauss_newton = s.curvature.gauss_newton();
    out_.m.hessian_too = s.curvature.op == OperatorChoice::both;
    if (plan_.update) form_delta();
    if (s.curvature.blocks)
      for (Partition& p : parameter_partitions(engines.layout())) {
        BlockMeasurements b;
        b.partition = std::move(p.name);
        b.names = std::move(p.names);
        b.offsets = std::move(p.offsets);
        b.has_hv = s.keeps_hv();
        blocks_.push_back(std::move(b));
      }
    for (const BlockMeasurements& b : blocks_) n_block_values_ += index_t(b.size());
    if (precond_.extent(0) != 0 && index_t(precond_.extent(0)) != n_)
      throw std::logic_error("gnh::case: the preconditioner is not this member's slice");
  }

  // Delta = theta_b - theta_a in double (this member's slice), from the
  // parameters as the engine holds them. (A member function: nvcc allows no
  // device lambda in a constructor.)
  void form_delta() {
    delta_ = View1<double>("gnh::case::delta", n_);
    auto d = delta_;
    const T* a = params_.data() + begin_;
    const T* b = target_.data() + begin_;
    Kokkos::parallel_for(
        "gnh::case::delta", range(space_, n_), KOKKOS_LAMBDA(const index_t i) { d(i) = double(b[i]) - double(a[i]); });
  }

  // sum_i a_i b_i of two of this member's slices (parallel.parameter_shards;
  // whole vectors at R = 1), the same bits at any R (analysis/shard_dot.hpp).
  template <class A, class B>
  double sdot(const A* a, const B* b) const {
    return sharded_dot(space_, slice_, a, b);
  }
  // The AdamW preconditioner's slice (as the case was given it: its slice with parameter_shards).
  const double* precond_slice() const { return precond_.data(); }

  // sum_i a_i b_i over every block of every partition, in order (all
  // partitions' blocks concatenated), of two of this member's slices; empty
  // without [curvature] blocks.
  template <class A, class B>
  std::vector<double> block_dots(const A* a, const B* b) const {
    std::vector<double> out;
    out.reserve(static_cast<std::size_t>(n_block_values_));
    for (const BlockMeasurements& p : blocks_) {
      const std::vector<double> v = sharded_range_dots(space_, slice_, a, b, p.offsets);
      out.insert(out.end(), v.begin(), v.end());
    }
    return out;
  }

  // A slice made whole (a copy), for what needs every element on every member.
  template <class V>
  V whole_of(V slice) const {
    if (slice_.whole()) return slice;
    V whole(std::string(slice.label()) + "_whole", P_);
    Kokkos::deep_copy(space_, Kokkos::subview(whole, std::make_pair(begin_, begin_ + n_)), slice);
    space_.fence();
    slice_.group->gather(slice_.layout, whole.data());
    return whole;
  }
  // G and Delta whole, for the stages that take them whole (the landscapes):
  // the slices themselves at R = 1, else gathered once.
  View1<double> whole_G() {
    if (G_whole_.extent(0) == 0) G_whole_ = whole_of(G_);
    return G_whole_;
  }
  // The preconditioner whole where the spectrum of P^1/2 H P^1/2 takes it (empty otherwise).
  View1<double> whole_precond() {
    return s_.curvature.lanczos_php && precond_.extent(0) > 0 ? whole_of(precond_) : View1<double>();
  }
  View1<double> whole_delta() {
    if (delta_whole_.extent(0) == 0) delta_whole_ = whole_of(delta_);
    return delta_whole_;
  }
  // Appends the concatenated per-block values v to row lists, one per partition.
  void add_block_row(std::vector<std::vector<double>> BlockMeasurements::*rows, const std::vector<double>& v) {
    std::size_t at = 0;
    for (BlockMeasurements& p : blocks_) {
      (p.*rows).emplace_back(v.begin() + at, v.begin() + at + p.size());
      at += p.size();
    }
  }
  void set_block_values(std::vector<double> BlockMeasurements::*field, const std::vector<double>& v) {
    std::size_t at = 0;
    for (BlockMeasurements& p : blocks_) {
      p.*field = std::vector<double>(v.begin() + at, v.begin() + at + p.size());
      at += p.size();
    }
  }

  CaseStatistics run() {
    loss_and_gradient();
    out_.timings.emplace_back("gradient", clock_.lap());
    noise_samples();
    out_.timings.emplace_back("noise", clock_.lap());
    curvature_passes();
    out_.timings.emplace_back("curvature", clock_.lap());
    if (plan_.spectrum && s_.curvature.op != OperatorChoice::ggn) spectrum(CurvatureOperator::hessian);
    if (plan_.spectrum && s_.curvature.gauss_newton()) spectrum(CurvatureOperator::gauss_newton);
    if (plan_.spectrum && s_.curvature.layer_spectra) layer_spectra();
    if (s_.curvature.hutchpp) {
      traces();
      out_.timings.emplace_back("traces", clock_.lap());
    }
    if (plan_.update) {
      update_step();
      out_.timings.emplace_back("update", clock_.lap());
    }
    if (s_.landscape.any()) {
      landscapes();
      out_.timings.emplace_back("landscape", clock_.lap());
    }
    identities();
    out_.identities.insert(out_.identities.end(), spectrum_checks_.begin(), spectrum_checks_.end());
    out_.timings.emplace_back("checks", clock_.lap());
    out_.derived = derive(out_.m);
    for (const BlockMeasurements& b : blocks_) out_.blocks.push_back(derive_blocks(b, out_.m, out_.derived));
    block_identity();
    sequence_consistency();
    double total = 0;
    for (const auto& t : out_.timings) total += t.second;
    out_.timings.emplace_back("total", total);
    // Within "spectrum": its epoch passes and its Lanczos arithmetic.
    out_.timings.insert(out_.timings.end(), spectrum_parts_.begin(), spectrum_parts_.end());
    out_.peak_memory_bytes = std::int64_t(plan_memory(engines_.config(), s_, plan_, team_.size()).total());
    return std::move(out_);
  }

  ProgressFn progress(const std::string& stage) const {
    if (!hooks_.progress) return {};
    const CaseHooks& h = hooks_;
    return [&h, stage](index_t done, index_t total) { h.progress(stage, done, total); };
  }

  // Stage 1: the epoch's loss and mean gradient G, each member its share of
  // the batches, summed exactly over the team.
  void loss_and_gradient() {
    meter_.begin();
    const auto batches = make_batches(all_blocks(plan_.n_blocks), s_.grad_microbatch);
    ExactSum acc(n_);
    acc.clear(space_);
    std::vector<BatchScalars> table;
    std::unique_ptr<SequenceNorms<T>> seq;
    if (engines_.sequence_group > 0) seq = sequence_norms();
    const bool ok = gradient_pass<T>(space_, engines_.gradient(), stager_, params_, ids_, batches,
                                     team_.share_of(index_t(batches.size())), acc, table, hooks_.stop,
                                     progress("gradient"), seq.get(), &slice_);
    if (team_.any(!ok)) throw Interrupted{};
    replicas_.sum(acc);
    team_.share(table);
    meter_.add(table);
    meter_.end("gradient", out_.measured);
    const BatchScalars gs = sum_in_order(table);
    tokens_ = gs.count;
    out_.tokens = gs.count;
    out_.loss = gs.loss_sum / double(gs.count);
    if (!std::isfinite(out_.loss)) fail("the epoch loss is not finite (", out_.loss, ")");
    acc.to_double(space_, G_.data(), 1.0 / double(gs.count));
    out_.m.G_sqnorm = sdot(G_.data(), G_.data());
    set_block_values(&BlockMeasurements::G_sqnorm, block_dots(G_.data(), G_.data()));
    if (plan_.preconditioned) out_.m.GPG = sharded_weighted_dot(space_, slice_, G_.data(), precond_slice(), G_.data());
    if (seq) sequence_measurements(table, double(gs.count) / double(plan_.n_blocks));
  }

  // analysis.per_sequence: the ranges the norms are taken over (the
  // canonical tensors) and, per block value, the tensors it sums.
  std::unique_ptr<SequenceNorms<T>> sequence_norms() const {
    std::vector<std::int64_t> ranges;
    for (const TensorInfo& t : engines_.layout().tensors()) ranges.push_back(t.offset);
    ranges.push_back(P_);
    std::sort(ranges.begin(), ranges.end());
    std::vector<std::pair<std::size_t, std::size_t>> values;
    auto range_at = [&](std::int64_t offset) {
      const auto it = std::lower_bound(ranges.begin(), ranges.end(), offset);
      if (it == ranges.end() || *it != offset) throw std::logic_error("gnh::case: a block splits a tensor");
      return std::size_t(it - ranges.begin());
    };
    for (const BlockMeasurements& p : blocks_)
      for (std::size_t i = 0; i < p.size(); ++i)
        values.emplace_back(range_at(p.offsets[i]), range_at(p.offsets[i + 1]));
    Gpt<T>& engine = engines_.sequence ? *engines_.sequence : engines_.gradient();
    return std::make_unique<SequenceNorms<T>>(engine, ranges, std::move(values), s_.grad_microbatch);
  }

  // a_i = S_i / (tokens / n), the gradient of sequence i's summed loss
  // scaled so that G is their mean (doc/statistics.md); |a_i|^2 in epoch
  // order, per block the sums of |a_i,b|^2 and |a_i,b|^4 in batch order.
  void sequence_measurements(const std::vector<BatchScalars>& table, double tokens_per_sequence) {
    const double s2 = 1.0 / (tokens_per_sequence * tokens_per_sequence);
    std::vector<double> sum(static_cast<std::size_t>(n_block_values_)), sq(sum.size());
    for (const BatchScalars& r : table) {
      for (const double x : r.seq_sqnorm) out_.m.seq_sqnorm.push_back(x * s2);
      for (std::size_t v = 0; v < sum.size(); ++v) {
        sum[v] += r.seq_block_sum[v] * s2;
        sq[v] += r.seq_block_sq[v] * s2 * s2;
      }
    }
    set_block_values(&BlockMeasurements::seq_sum, sum);
    set_block_values(&BlockMeasurements::seq_sq, sq);
  }

  // The noise vectors are kept as rows of xi_ (as planned, or for a caller
  // that takes them), or computed again when a pass is filled (recompute_xi).
  bool keep_xi() const { return plan_.keep_noise || hooks_.keep != nullptr; }

  // The shard group that computes noise sample j (the team's members in
  // groups of parameter_shards; at R = 1 a member alone), and its first
  // member, whose results the team takes.
  int noise_group(index_t j) const { return dealt_to(j, team_.size() / slice_.layout.R); }
  int my_group() const { return team_.rank() / slice_.layout.R; }

  // Noise sample j's gradient g_j (this member's slice) into gj_, its group's
  // members splitting its batches; false if stopped. Collective in the group.
  bool noise_gradient(index_t j, std::vector<BatchScalars>& t) {
    ShardGroup& group = *slice_.group;
    const auto nb = make_batches(out_.noise_blocks[static_cast<std::size_t>(j)], s_.grad_microbatch);
    Gpt<T>& engine = engines_.gradient();  // first: the curvature engine it replaces is freed before the sum is made
    ExactSum a(n_);
    a.clear(space_);
    if (!gradient_pass<T>(space_, engine, stager_, params_, ids_, nb, group.share_of(index_t(nb.size())), a, t,
                          hooks_.stop, {}, nullptr, &slice_))
      return false;
    group.share(t);
    // g_j made now, the pass's batch gradient gone (analysis/memory.cpp), and
    // freed by the caller once xi_j is formed.
    gj_ = View1<double>(Kokkos::view_alloc(Kokkos::WithoutInitializing, "gnh::case::g_j"), n_);
    a.to_double(space_, gj_.data(), 1.0 / double(sum_in_order(t).count));
    return true;
  }

  // Stage 2: noise batches, each computed by one shard group (one member at
  // R = 1) and shared: its scalars as a NoiseSample, its xi_j as a row of xi_
  // where kept (each member its slice, from its replica in that group).
  void noise_samples() {
    meter_.begin();
    out_.noise_blocks = noise_batches(plan_.n_blocks, s_.noise_batch, s_.noise_samples, s_.seed);
    const index_t m = plan_.n_noise;
    if (index_t(out_.noise_blocks.size()) != m) throw std::logic_error("gnh::case: noise batches differ from the plan");
    xi_ = View2<T>("gnh::case::xi", keep_xi() ? m : 0, n_);
    if (plan_.partition) {
      partition_sum_ = ExactSum(n_);
      partition_sum_.clear(space_);
    }
    bool stopped = false;
    std::vector<double> xi_blocks(static_cast<std::size_t>(n_block_values_));
    for (index_t j = 0; j < m; ++j) {
      const int group = noise_group(j);
      NoiseSample r;
      if (my_group() == group) {
        std::vector<BatchScalars> t;
        if (stopped || !noise_gradient(j, t)) {
          stopped = true;
          r.stopped = true;
        } else {
          for (const BatchScalars& b : t) r.seconds += b.seconds;
          // xi_j = g_j - G is formed in gj_'s place once g_j's own scalars are taken.
          const View1<double> xij = gj_;
          r.gB_sqnorm = sdot(gj_.data(), gj_.data());
          if (plan_.partition) partition_sum_.add(space_, gj_.data());
          xi_of_gj(xij, keep_xi() ? xi_.data() + j * n_ : nullptr);
          r.xi_sqnorm = sdot(xij.data(), xij.data());
          r.G_dot_xi = sdot(G_.data(), xij.data());
          r.finite = std::isfinite(r.gB_sqnorm);
          xi_blocks = block_dots(xij.data(), xij.data());
          if (plan_.preconditioned)
            r.xiPxi = sharded_weighted_dot(space_, slice_, xij.data(), precond_slice(), xij.data());
        }
        space_.fence();
        gj_ = View1<double>();
      }
      const int root = group * slice_.layout.R;
      team_.broadcast_value(r, root);
      if (keep_xi()) replicas_.broadcast(xi_.data() + j * n_, sizeof(T) * static_cast<std::size_t>(n_), group);
      if (!xi_blocks.empty()) team_.broadcast(xi_blocks.data(), sizeof(double) * xi_blocks.size(), root);
      add_block_row(&BlockMeasurements::xi_sqnorm, xi_blocks);
      stopped = stopped || r.stopped;
      if (!stopped && !r.finite) fail("noise batch ", j, ": the gradient is not finite");
      out_.m.gB_sqnorm.push_back(r.gB_sqnorm);
      out_.m.xi_sqnorm.push_back(r.xi_sqnorm);
      out_.m.G_dot_xi.push_back(r.G_dot_xi);
      if (plan_.preconditioned) out_.m.xiPxi.push_back(r.xiPxi);
      meter_.add_seconds(r.seconds);
      if (hooks_.progress) hooks_.progress("noise", j + 1, m);
    }
    if (team_.any(stopped)) throw Interrupted{};
    meter_.end("noise", out_.measured);
    if (hooks_.keep) {
      auto hG = Kokkos::create_mirror_view_and_copy(HostSpace(), whole_of(G_));
      hooks_.keep->G.assign(hG.data(), hG.data() + P_);
      hooks_.keep->xi.assign(static_cast<std::size_t>(m), std::vector<double>(static_cast<std::size_t>(P_)));
      for (index_t j = 0; j < m; ++j) {
        View1<T> row(Kokkos::view_alloc(Kokkos::WithoutInitializing, "gnh::case::xi_row"), n_);
        Kokkos::deep_copy(space_, row, Kokkos::subview(xi_, j, Kokkos::ALL));
        auto hxi = Kokkos::create_mirror_view_and_copy(HostSpace(), whole_of(row));
        for (index_t i = 0; i < P_; ++i) hooks_.keep->xi[j][i] = double(hxi(i));
      }
    }
  }

  // xi_j = g_j - G from the noise batch's gradient in gj_ (slices), in
  // double into x (when given; gj_ itself, in place) and rounded to the
  // engine's scalar into row (a slice, when given).
  void xi_of_gj(View1<double> x, T* row) {
    auto g = gj_;
    auto Gv = G_;
    const Span1<T> out(row, row != nullptr ? n_ : 0);
    const bool to_x = x.extent(0) > 0, to_row = row != nullptr;
    Kokkos::parallel_for(
        "gnh::case::xi", range(space_, n_), KOKKOS_LAMBDA(const index_t i) {
          const double d = g(i) - Gv(i);
          if (to_x) x(i) = d;
          if (to_row) out(i) = static_cast<T>(d);
        });
  }

  // parallel.noise_vectors = "recompute": xi_j into this member's slice of
  // row, its noise batch's gradient computed again by the group that
  // computed it in stage 2, the same pass on the same batches, and shared
  // with the replicas: the bits of the kept row.
  void recompute_xi(T* row, index_t j) {
    const int group = noise_group(j);
    bool ok = true;
    if (my_group() == group) {
      std::vector<BatchScalars> t;
      ok = noise_gradient(j, t);
      if (ok) xi_of_gj(View1<double>(), row + begin_);
      space_.fence();
      gj_ = View1<double>();
    }
    if (team_.any(!ok)) throw Interrupted{};
    replicas_.broadcast(row + begin_, sizeof(T) * static_cast<std::size_t>(n_), group);
  }

  // Direction d of the case into row r of dirs: G, then the xi_j, then the
  // Rademacher v_k (SPEC §4's generator, index k), then with the AdamW
  // preconditioner P (SPEC §10) PG and the P xi_j. Each member fills its
  // slice of the row and fill_directions gathers it; a Rademacher row is
  // generated whole (returns true: nothing to gather).
  bool fill_direction(View2<T> dirs, index_t r, index_t d) {
    const index_t m = plan_.n_noise, K = plan_.directions_asked;
    T* const whole_row = dirs.data() + r * P_;
    const Span1<T> row(whole_row + begin_, n_);
    if (plan_.update && d == plan_.directions() - 1) {
      auto Dv = delta_;
      Kokkos::parallel_for(
          "gnh::case::dir_delta", range(space_, n_), KOKKOS_LAMBDA(const index_t i) { row(i) = T(Dv(i)); });
    } else if (d > m + K) {
      const Span1<const double> Pv(precond_slice(), n_);
      if (d == m + K + 1) {
        auto Gv = G_;
        Kokkos::parallel_for(
            "gnh::case::dir_PG", range(space_, n_), KOKKOS_LAMBDA(const index_t i) { row(i) = T(Pv(i) * Gv(i)); });
      } else {
        if (!keep_xi()) recompute_xi(whole_row, d - m - K - 2);
        const Span1<const T> x(keep_xi() ? xi_.data() + (d - m - K - 2) * n_ : row.data(), n_);
        Kokkos::parallel_for(
            "gnh::case::dir_Pxi", range(space_, n_),
            KOKKOS_LAMBDA(const index_t i) { row(i) = T(Pv(i) * double(x(i))); });
      }
    } else if (d == 0) {
      auto Gv = G_;
      Kokkos::parallel_for(
          "gnh::case::dir_G", range(space_, n_), KOKKOS_LAMBDA(const index_t i) { row(i) = T(Gv(i)); });
    } else if (d <= m) {
      if (keep_xi()) Kokkos::deep_copy(space_, row, Kokkos::subview(xi_, d - 1, Kokkos::ALL));
      else recompute_xi(whole_row, d - 1);
    } else {
      fill_rademacher<T>(space_, Span2<T>(whole_row, 1, P_), s_.seed, std::uint64_t(d - 1 - m));
      return true;
    }
    return false;
  }

  // Rows 0 .. K - 1 of dirs: directions d0 .. d0 + K - 1, whole on every member.
  void fill_directions(View2<T> dirs, index_t K, index_t d0) {
    std::vector<bool> whole(static_cast<std::size_t>(K));
    for (index_t r = 0; r < K; ++r) whole[std::size_t(r)] = fill_direction(dirs, r, d0 + r);
    space_.fence();
    for (index_t r = 0; r < K && !slice_.whole(); ++r)
      if (!whole[std::size_t(r)]) slice_.group->gather(slice_.layout, dirs.data() + r * P_);
  }

  // The first pass's first direction is G: with per-sequence norms, every
  // sequence's a_i . G = S_i . G / (tokens / n), in epoch order.
  void sequence_dot_G(const std::vector<BatchScalars>& table) {
    if (out_.m.seq_sqnorm.empty()) return;
    const double per_sequence = double(tokens_) / double(plan_.n_blocks);
    for (const BatchScalars& r : table)
      for (const double x : r.seq_first) out_.m.seq_dot_G.push_back(x / per_sequence);
  }

  // Stage 3: every direction of the case in the planned epoch passes, each
  // exactly as wide as it needs; first and second derivatives per direction.
  void curvature_passes() {
    meter_.begin();
    const index_t D = plan_.directions(), m = plan_.n_noise;
    const std::vector<index_t>& sizes = plan_.pass_widths;
    const index_t passes = index_t(sizes.size());
    const auto batches = make_batches(all_blocks(plan_.n_blocks), s_.hvp_batch);
    View2<T> dirs("gnh::case::directions", sizes.front(), P_);
    std::vector<double> quad(static_cast<std::size_t>(D)), quad_ggn(static_cast<std::size_t>(D));
    // With [curvature], the epoch's H v of each direction of a pass, summed
    // exactly over the batches and the team (so identical at any rank count).
    const bool keep_hv = s_.keeps_hv();
    std::vector<ExactSum> hv_sums;
    View1<double> Hv;
    if (keep_hv) {
      for (index_t k = 0; k < sizes.front(); ++k) hv_sums.emplace_back(n_);
      Hv = View1<double>("gnh::case::Hv", n_);
      if (s_.curvature.diagonal) {
        diagonal_ = View1<double>("gnh::case::diagonal", n_);
        Kokkos::deep_copy(space_, diagonal_, 0.0);
      }
    }
    first_.assign(static_cast<std::size_t>(D), 0.0);
    for (index_t c = 0, d0 = 0; c < passes; d0 += sizes[std::size_t(c)], ++c) {
      const index_t K = sizes[std::size_t(c)];
      fill_directions(dirs, K, d0);
      std::vector<BatchScalars> ct;
      // The first K rows of dirs, contiguous (LayoutRight).
      const Span2<const T> pass_dirs(dirs.data(), K, P_);
      std::vector<ExactSum> pass_sums(hv_sums.begin(), hv_sums.begin() + (keep_hv ? K : 0));
      for (ExactSum& e : pass_sums) e.clear(space_);
      const bool ok = curvature_pass<T>(space_, engines_.curvature(K), stager_, params_, pass_dirs, ids_, batches,
                                        team_.share_of(index_t(batches.size())), s_.curvature_method, ct, hooks_.stop,
                                        progress("curvature " + std::to_string(c + 1) + "/" + std::to_string(passes)),
                                        keep_hv ? &pass_sums : nullptr, CurvatureOperator::hessian, &slice_);
      if (team_.any(!ok)) throw Interrupted{};
      for (index_t r = 0; keep_hv && r < K; ++r) {
        replicas_.sum(pass_sums[std::size_t(r)]);
        pass_sums[std::size_t(r)].to_double(space_, Hv.data(), 1.0 / double(tokens_));
        kept_hv(dirs.data() + r * P_, Hv, d0 + r);
      }
      team_.share(ct);
      meter_.add(ct, K);
      const BatchScalars cs = sum_in_order(ct);
      if (c == 0) sequence_dot_G(ct);
      for (index_t r = 0; r < K; ++r) {
        quad[d0 + r] = cs.second[r] / double(tokens_);
        quad_ggn[d0 + r] = cs.gauss_newton[r] / double(tokens_);
        first_[d0 + r] = cs.first[r] / double(tokens_);
      }
    }
    if (keep_hv && s_.curvature.op == OperatorChoice::both && s_.curvature.blocks)
      gauss_newton_block_passes(dirs, hv_sums, Hv);
    meter_.end("curvature", out_.measured);
    // The kept noise vectors are done with: freed for the later stages
    // (analysis/memory.cpp plans them to here).
    xi_ = View2<T>();
    record_curvature(quad, quad_ggn);
  }

  // The curvature passes' quadratic forms (per token) into the statistics,
  // and the diagonal's estimate.
  void record_curvature(const std::vector<double>& quad, const std::vector<double>& quad_ggn) {
    const index_t m = plan_.n_noise;
    out_.m.GHG = quad[0];
    out_.m.xiHxi.assign(quad.begin() + 1, quad.begin() + 1 + m);
    const index_t K = plan_.directions_asked;
    out_.m.vHv.assign(quad.begin() + 1 + m, quad.begin() + 1 + m + K);
    if (out_.m.gauss_newton) {
      // Every pass's forward gives the Gauss-Newton forms beside v^T H v
      // (the head's z'^T H_z z', kernels/lm_head_xent.hpp).
      out_.m.GHG_ggn = quad_ggn[0];
      out_.m.xiHxi_ggn.assign(quad_ggn.begin() + 1, quad_ggn.begin() + 1 + m);
      out_.m.vGv_ggn.assign(quad_ggn.begin() + 1 + m, quad_ggn.begin() + 1 + m + K);
      for (double q : quad_ggn)
        if (!std::isfinite(q)) fail("a Gauss-Newton quadratic form is not finite");
    }
    if (plan_.preconditioned) {
      out_.m.PG_H_PG = quad[std::size_t(1 + m + K)];
      out_.m.PxiHPxi.assign(quad.begin() + 2 + m + K, quad.begin() + 2 + 2 * m + K);
    }
    if (plan_.update) out_.update.dHd = quad.back();
    for (double q : quad)
      if (!std::isfinite(q)) fail("a curvature quadratic form is not finite");
    if (diagonal_.extent(0) > 0 && s_.directions > 0) {
      out_.hessian_diagonal.resize(static_cast<std::size_t>(P_));
      auto h = Kokkos::create_mirror_view_and_copy(HostSpace(), whole_of(diagonal_));
      for (index_t i = 0; i < P_; ++i) out_.hessian_diagonal[i] = float(h(i) / double(s_.directions));
    }
  }

  // SPEC §10 along the update: |Delta|^2 and G^T Delta in double, Delta^T H
  // Delta from the curvature passes, and L(theta_b) on this case by a
  // forward-only pass split over the team like the gradient pass (summed in
  // batch order, so the same at any rank count).
  void update_step() {
    meter_.begin();
    UpdateStatistics& u = out_.update;
    u.present = true;
    u.delta_sqnorm = sdot(delta_.data(), delta_.data());
    u.G_dot_delta = sdot(G_.data(), delta_.data());
    const auto batches = make_batches(all_blocks(plan_.n_blocks), s_.grad_microbatch);
    std::vector<BatchScalars> table(batches.size());
    const Span1<const T> theta_b(target_.data(), P_);
    for (index_t b : team_.share_of(index_t(batches.size()))) {
      if (hooks_.stop && hooks_.stop()) break;
      const auto t0 = std::chrono::steady_clock::now();
      stager_.stage(ids_, batches[std::size_t(b)], engines_.gradient().batch());
      const LossSum l = engines_.gradient().forward_loss(space_, theta_b, stager_.tokens(), stager_.targets());
      BatchScalars& r = table[std::size_t(b)];
      r.loss_sum = l.sum;
      r.count = l.count;
      r.done = true;
      space_.fence();
      r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }
    bool stopped = false;
    for (index_t b : team_.share_of(index_t(batches.size()))) stopped = stopped || !table[std::size_t(b)].done;
    if (team_.any(stopped)) throw Interrupted{};
    team_.share(table);
    meter_.add(table);
    meter_.end("update", out_.measured);
    const BatchScalars ls = sum_in_order(table);
    const double loss_b = ls.loss_sum / double(ls.count);
    if (!std::isfinite(loss_b)) fail("the epoch loss at the update's target state is not finite (", loss_b, ")");
    u.measured_change = loss_b - out_.loss;
    u.predicted_change = u.G_dot_delta + 0.5 * u.dHd;
    u.curvature_along = u.dHd / u.delta_sqnorm;
  }

  // Stage "traces" (SPEC §13): tr H by Hutch++ at the §4 directions' number
  // of products and by deflation with the top Ritz vectors, tr GGN by
  // Hutch++; each an exact part over a basis Q and Hutchinson samples of the
  // complement (doc/statistics.md, "Traces with less variance").
  void traces() {
    meter_.begin();
    const index_t m = s_.directions, k = hutchpp_sketch(s_);
    if (s_.curvature.op != OperatorChoice::ggn) {
      out_.m.hutchpp = projected_trace(sketch(CurvatureOperator::hessian, k), CurvatureOperator::hessian, out_.m.vHv, k,
                                       m - k, s_.keeps_hv() && !blocks_.empty());
      if (ritz_.extent(0) > 0) {
        View2<T> U("gnh::case::ritz_rounded", ritz_.extent(0), P_);
        auto R = ritz_;
        Kokkos::parallel_for(
            "gnh::case::ritz_round", range(space_, index_t(U.size())),
            KOKKOS_LAMBDA(const index_t i) { U.data()[i] = T(R.data()[i]); });
        out_.m.deflated = projected_trace(U, CurvatureOperator::hessian, out_.m.vHv, 0, m);
      }
    }
    if (s_.curvature.gauss_newton())
      out_.m.hutchpp_ggn = projected_trace(sketch(CurvatureOperator::gauss_newton, k), CurvatureOperator::gauss_newton,
                                           out_.m.vGv_ggn, k, m - k);
    meter_.end("traces", out_.measured);
  }

  // The epoch's A r (A = H or GGN) of every row r of rows (K, P), in passes
  // of at most directions_per_pass, each product summed exactly over the
  // batches and the team and handed to take(i, A r_i) in double.
  // With parameter_shards, the sums are slices and each product is gathered
  // whole before it is handed on.
  template <class Take>
  void products(View2<T> rows, CurvatureOperator op, Take&& take) {
    const index_t K = index_t(rows.extent(0)), width = std::min(K, s_.directions_per_pass);
    std::vector<ExactSum> sums;
    for (index_t r = 0; r < width; ++r) sums.emplace_back(n_);
    View1<double> Ar("gnh::case::trace_product", P_);
    for (index_t first = 0; first < K; first += width) {
      const index_t n = std::min(width, K - first);
      std::vector<ExactSum> pass(sums.begin(), sums.begin() + n);
      for (ExactSum& e : pass) e.clear(space_);
      chunk_pass(rows, first, n, CurvatureMethod::forward_over_reverse, op, "traces", &pass);
      for (index_t r = 0; r < n; ++r) {
        replicas_.sum(pass[std::size_t(r)]);
        pass[std::size_t(r)].to_double(space_, Ar.data() + begin_, 1.0 / double(tokens_));
        space_.fence();
        if (!slice_.whole()) slice_.group->gather(slice_.layout, Ar.data());
        take(first + r, Ar);
      }
    }
  }

  // One epoch curvature pass along rows first .. first + n - 1 of rows
  // (hvp_batch, split over the team), its batch scalars summed in batch
  // order; with sums (forward-over-reverse), each row's product added there.
  BatchScalars chunk_pass(View2<T> rows, index_t first, index_t n, CurvatureMethod method, CurvatureOperator op,
                          const std::string& stage, std::vector<ExactSum>* sums) {
    const auto batches = make_batches(all_blocks(plan_.n_blocks), s_.hvp_batch);
    std::vector<BatchScalars> ct;
    const bool ok = curvature_pass<T>(
        space_, engines_.curvature(n), stager_, params_, Span2<const T>(rows.data() + first * P_, n, P_), ids_, batches,
        team_.share_of(index_t(batches.size())), method, ct, hooks_.stop, progress(stage), sums, op, &slice_);
    if (team_.any(!ok)) throw Interrupted{};
    team_.share(ct);
    meter_.add(ct, n);
    return sum_in_order(ct);
  }

  // Hutch++'s basis: Q orthonormal (Gram-Schmidt twice, in double) over the
  // products A v_1 .. A v_k of the first k Rademacher directions, rounded to
  // the engine's scalar (the values its products then apply); a product
  // in the span of the others is dropped.
  View2<T> sketch(CurvatureOperator op, index_t k) {
    View2<T> S("gnh::case::sketch", k, P_);
    fill_rademacher<T>(space_, Span2<T>(S.data(), k, P_), s_.seed, 0);
    View2<T> Q("gnh::case::sketch_basis", k, P_);
    index_t kept = 0;
    products(S, op, [&](index_t, View1<double> y) { kept += orthonormal_row(Q, kept, y) ? 1 : 0; });
    return Kokkos::subview(Q, std::make_pair(index_t(0), kept), Kokkos::ALL);
  }

  // y made orthogonal to rows 0 .. kept-1 of Q (twice) and, unless nothing
  // is left of it, normalised into row `kept`.
  bool orthonormal_row(View2<T> Q, index_t kept, View1<double> y) {
    const double norm0 = std::sqrt(dot(space_, y.data(), y.data(), P_));
    for (int twice = 0; twice < 2; ++twice)
      for (index_t j = 0; j < kept; ++j) {
        const double c = dot(space_, Q.data() + j * P_, y.data(), P_);
        auto q = Kokkos::subview(Q, j, Kokkos::ALL);
        Kokkos::parallel_for(
            "gnh::case::sketch_project", range(space_, P_),
            KOKKOS_LAMBDA(const index_t i) { y(i) -= c * double(q(i)); });
      }
    const double norm = std::sqrt(dot(space_, y.data(), y.data(), P_));
    if (!(norm > 1e-10 * norm0)) return false;
    auto q = Kokkos::subview(Q, kept, Kokkos::ALL);
    const double inv = 1.0 / norm;
    Kokkos::parallel_for(
        "gnh::case::sketch_normalise", range(space_, P_), KOKKOS_LAMBDA(const index_t i) { q(i) = T(y(i) * inv); });
    space_.fence();
    return true;
  }

  // tr(Q^T A Q) from the products along Q, and for the Rademacher directions
  // g = v_{first+1} .. v_end the complement's samples
  //   g^T (I - QQ^T) A (I - QQ^T) g = g^T A g - 2 c.e + c^T M c,
  // c = Q^T g, e = (A Q)^T g, M = Q^T A Q (symmetrised), g^T A g the case's
  // own curvature pass's (vAv); A Q is never held whole.
  // With by_block, each block's share of every sample too (block_hutchpp).
  CaseMeasurements::ProjectedTrace projected_trace(View2<T> Q, CurvatureOperator op, const std::vector<double>& vAv,
                                                   index_t first, index_t end, bool by_block = false) {
    const index_t k = index_t(Q.extent(0)), n = end - first;
    std::vector<double> M(std::size_t(k * k)), c(std::size_t(n * k)), e(std::size_t(n * k));
    // by_block: X[i k + l] = (q_i)_b^T (A q_l)_b and Y[i n + j] = (g_j)_b^T (A q_i)_b, every block b.
    std::vector<std::vector<double>> X(by_block ? std::size_t(k * k) : 0), Y(by_block ? std::size_t(k * n) : 0);
    View2<T> g("gnh::case::trace_g", 1, P_);
    auto dir = [&](index_t j) {
      fill_rademacher<T>(space_, Span2<T>(g.data(), 1, P_), s_.seed, std::uint64_t(first + j));
      return g.data();
    };
    for (index_t j = 0; j < n; ++j) {
      const T* gj = dir(j);
      for (index_t i = 0; i < k; ++i) c[std::size_t(j * k + i)] = dot(space_, Q.data() + i * P_, gj, P_);
    }
    products(Q, op, [&](index_t i, View1<double> Aq) {
      for (index_t j = 0; j < k; ++j) {
        M[std::size_t(i * k + j)] = dot(space_, Q.data() + j * P_, Aq.data(), P_);
        if (by_block) X[std::size_t(j * k + i)] = block_dots(Q.data() + j * P_ + begin_, Aq.data() + begin_);
      }
      for (index_t j = 0; j < n; ++j) {
        e[std::size_t(j * k + i)] = dot(space_, dir(j), Aq.data(), P_);
        if (by_block) Y[std::size_t(i * n + j)] = block_dots(g.data() + begin_, Aq.data() + begin_);
      }
    });
    if (by_block) block_hutchpp(X, Y, c, k, first, n);
    CaseMeasurements::ProjectedTrace t;
    for (index_t i = 0; i < k; ++i) {
      t.top += M[std::size_t(i * k + i)];
      for (index_t j = 0; j < i; ++j)
        M[std::size_t(i * k + j)] = M[std::size_t(j * k + i)] =
            0.5 * (M[std::size_t(i * k + j)] + M[std::size_t(j * k + i)]);
    }
    for (index_t j = 0; j < n; ++j) {
      const double* cj = c.data() + j * k;
      double ce = 0, cMc = 0;
      for (index_t i = 0; i < k; ++i) {
        ce += cj[i] * e[std::size_t(j * k + i)];
        for (index_t l = 0; l < k; ++l) cMc += cj[i] * M[std::size_t(i * k + l)] * cj[l];
      }
      t.rest.push_back(vAv[std::size_t(first + j)] - 2 * ce + cMc);
    }
    return t;
  }

  // Each block's share of Hutch++'s samples: for g_j, sum_i X_ii + (g_j)_b^T
  // (H g_j)_b - 2 sum_i c_i Y_ij + sum_il c_i c_l X_il (doc/statistics.md:
  // unbiased for tr(H_bb), the blocks summing to the sample), with (g_j)_b^T
  // (H g_j)_b the curvature passes' block shares of v_j.
  void block_hutchpp(const std::vector<std::vector<double>>& X, const std::vector<std::vector<double>>& Y,
                     const std::vector<double>& c, index_t k, index_t first, index_t n) {
    const std::size_t nb = std::size_t(n_block_values_);
    // The passes' v^T H v shares, concatenated over the partitions.
    std::vector<std::vector<double>> vHv(static_cast<std::size_t>(n));
    for (const BlockMeasurements& p : blocks_)
      for (index_t j = 0; j < n; ++j) {
        const auto& row = p.vHv[std::size_t(first + j)];
        vHv[std::size_t(j)].insert(vHv[std::size_t(j)].end(), row.begin(), row.end());
      }
    for (index_t j = 0; j < n; ++j) {
      std::vector<double> v = vHv[std::size_t(j)];
      const double* cj = c.data() + j * k;
      for (std::size_t b = 0; b < nb; ++b)
        for (index_t i = 0; i < k; ++i) {
          v[b] += X[std::size_t(i * k + i)][b] - 2 * cj[i] * Y[std::size_t(i * n + j)][b];
          for (index_t l = 0; l < k; ++l) v[b] += cj[i] * cj[l] * X[std::size_t(i * k + l)][b];
        }
      add_block_row(&BlockMeasurements::hutchpp, v);
    }
  }

  // [landscape]: one direction's displacement D at alpha = 1 (in double, of
  // values the engine's scalar holds where the direction is not G's or the
  // update's), its unit, and the quadratic model's D^T G and D^T H D.
  struct LandscapeAxis {
    LandscapeDirection dir;
    View1<double> D;
    std::string unit;
    double slope = 0, curvature = 0;
  };

  // Stage "landscape" (SPEC §13): every direction's displacement, the random
  // directions' D^T H D in one epoch curvature pass, then each line and the
  // plane by forward passes (losses_at).
  void landscapes() {
    meter_.begin();
    const LandscapeSettings& ls = s_.landscape;
    std::vector<LandscapeAxis> axes;
    for (const LandscapeDirection& d : ls.used())
      if (d.kind != LandscapeKind::update || plan_.update) axes.push_back(landscape_axis(d));
    auto axis_of = [&axes](const LandscapeDirection& d) -> const LandscapeAxis* {
      for (const LandscapeAxis& a : axes)
        if (a.dir == d) return &a;
      return nullptr;  // the update, at the last state
    };
    const LandscapeAxis* x = ls.plane.empty() ? nullptr : axis_of(ls.plane[0]);
    const LandscapeAxis* y = ls.plane.empty() ? nullptr : axis_of(ls.plane[1]);
    const double cross = landscape_curvatures(axes, x, y);
    const std::vector<double> grid = landscape_grid(ls.points, ls.range);
    for (const LandscapeDirection& d : ls.directions) {
      const LandscapeAxis* a = axis_of(d);
      if (!a) continue;
      std::vector<std::pair<double, double>> points;
      for (const double x : grid) points.emplace_back(x, 0.0);
      const double norm = std::sqrt(dot(space_, a->D.data(), a->D.data(), P_));
      out_.landscape.push_back(landscape_line(d.name(), a->unit, norm, out_.loss, a->slope, a->curvature, grid,
                                              losses_at(a->D, View1<double>(), points)));
    }
    if (x && y) {
      LandscapePlane& p = out_.plane;
      p.x = x->dir.name();
      p.y = y->dir.name();
      p.alpha = p.beta = landscape_grid(ls.plane_points, ls.range);
      p.cross_curvature = cross;
      std::vector<std::pair<double, double>> points;
      for (const double a : p.alpha)
        for (const double b : p.beta) {
          points.emplace_back(a, b);
          p.quadratic.push_back(out_.loss + a * x->slope + b * y->slope +
                                0.5 * (a * a * x->curvature + 2 * a * b * cross + b * b * y->curvature));
        }
      p.loss = losses_at(x->D, y->D, points);
    }
    meter_.end("landscape", out_.measured);
  }

  LandscapeAxis landscape_axis(const LandscapeDirection& d) {
    LandscapeAxis a{d, View1<double>("gnh::case::landscape_D", P_), "", 0, 0};
    auto D = a.D;
    double scale = 1;
    switch (d.kind) {
      case LandscapeKind::gradient: {
        // D = -eps* G, eps* = |G|^2 / G^T H G: alpha = 1 at the quadratic
        // model's step; where G^T H G <= 0, |G|^2 / |G^T H G| (D^T H D < 0).
        const double G2 = out_.m.G_sqnorm, GHG = out_.m.GHG;
        scale = GHG != 0 ? G2 / std::abs(GHG) : 1.0;
        a.unit = GHG > 0 ? "eps* |G|, eps* = |G|^2 / G^T H G" : "|G|^3 / |G^T H G| (G^T H G <= 0)";
        a.slope = -scale * G2;
        a.curvature = scale * scale * GHG;
        auto Gv = whole_G();
        const double e = scale;
        Kokkos::parallel_for(
            "gnh::case::landscape_G", range(space_, P_), KOKKOS_LAMBDA(const index_t i) { D(i) = -e * Gv(i); });
        break;
      }
      case LandscapeKind::update:
        a.unit = "the next state (Delta)";
        Kokkos::deep_copy(space_, D, whole_delta());
        a.slope = out_.update.G_dot_delta;
        a.curvature = out_.update.dHd;
        break;
      case LandscapeKind::eigenvector: {
        // D = (2 / |lambda_i|) u_i; u_i^T H u_i is its Ritz value.
        const double lambda = ritz_values_.at(std::size_t(d.index - 1));
        scale = lambda != 0 ? 2 / std::abs(lambda) : 1.0;
        a.unit = "2 / |lambda_i| along the unit Ritz vector";
        auto y = Kokkos::subview(ritz_, d.index - 1, Kokkos::ALL);
        const double e = scale;
        Kokkos::parallel_for(
            "gnh::case::landscape_u", range(space_, P_), KOKKOS_LAMBDA(const index_t i) { D(i) = e * y(i); });
        a.slope = dot(space_, D.data(), whole_G().data(), P_);
        a.curvature = scale * scale * lambda;
        break;
      }
      case LandscapeKind::random: {
        // Rounded to the engine's scalar, the direction its curvature pass applies.
        a.unit = "filter-normalised: each matrix row as long as theta's";
        filter_normalised<T>(space_, engines_.layout(), params_.data(), s_.landscape.seed, std::uint64_t(d.index), D);
        Kokkos::parallel_for(
            "gnh::case::landscape_round", range(space_, P_),
            KOKKOS_LAMBDA(const index_t i) { D(i) = double(T(D(i))); });
        a.slope = dot(space_, D.data(), whole_G().data(), P_);
        break;
      }
    }
    space_.fence();
    return a;
  }

  // D^T H D of the random directions and, for the plane, (D_x + D_y)^T H
  // (D_x + D_y) (its cross term), in epoch curvature passes of their own
  // (the case's method, hvp_batch, at most directions_per_pass directions
  // each), summed in batch order over the team.
  // Returns the plane's cross term D_x^T H D_y (0 without a plane).
  double landscape_curvatures(std::vector<LandscapeAxis>& axes, const LandscapeAxis* x, const LandscapeAxis* y) {
    std::vector<LandscapeAxis*> random;
    for (LandscapeAxis& a : axes)
      if (a.dir.kind == LandscapeKind::random) random.push_back(&a);
    const index_t R = index_t(random.size()), K = R + (x && y ? 1 : 0);
    if (K == 0) return 0;
    View2<T> dirs("gnh::case::landscape_dirs", K, P_);
    for (index_t r = 0; r < K; ++r) {
      auto row = Kokkos::subview(dirs, r, Kokkos::ALL);
      auto D = r < R ? random[std::size_t(r)]->D : x->D;
      auto E = r < R ? View1<double>() : y->D;
      const bool sum = r == R;
      Kokkos::parallel_for(
          "gnh::case::landscape_dir", range(space_, P_),
          KOKKOS_LAMBDA(const index_t i) { row(i) = T(sum ? D(i) + E(i) : D(i)); });
    }
    space_.fence();
    // In passes of at most directions_per_pass.
    std::vector<double> dHd;
    for (index_t first = 0, width = std::min(K, s_.directions_per_pass); first < K; first += width) {
      const index_t n = std::min(width, K - first);
      const BatchScalars cs =
          chunk_pass(dirs, first, n, s_.curvature_method, CurvatureOperator::hessian, "landscape curvature", nullptr);
      for (index_t r = 0; r < n; ++r) dHd.push_back(cs.second[std::size_t(r)] / double(tokens_));
    }
    for (index_t r = 0; r < R; ++r) random[std::size_t(r)]->curvature = dHd[std::size_t(r)];
    if (K == R) return 0;
    return 0.5 * (dHd[std::size_t(R)] - x->curvature - y->curvature);
  }

  // The epoch loss (mean over its tokens) at theta + a D1 + b D2 for every
  // point (a, b) (D2 empty: a line): each batch staged once for all points,
  // each point's parameters formed in the engine's scalar, the batches split
  // over the team and summed in batch order (the same at any rank count).
  std::vector<double> losses_at(View1<double> D1, View1<double> D2,
                                const std::vector<std::pair<double, double>>& points) {
    const auto batches = make_batches(all_blocks(plan_.n_blocks), s_.grad_microbatch);
    const std::size_t n = points.size();
    std::vector<BatchScalars> table(batches.size());
    Gpt<T>& engine = engines_.gradient();  // first: the curvature engine it replaces is freed
    View1<T> theta(Kokkos::view_alloc(Kokkos::WithoutInitializing, "gnh::case::landscape_theta"), P_);
    const bool two = D2.extent(0) > 0;
    auto p0 = params_;
    const ProgressFn report = progress("landscape");
    const std::vector<index_t> mine = team_.share_of(index_t(batches.size()));
    index_t done = 0;
    for (index_t b : mine) {
      if (hooks_.stop && hooks_.stop()) break;
      const auto t0 = std::chrono::steady_clock::now();
      stager_.stage(ids_, batches[std::size_t(b)], engine.batch());
      BatchScalars& r = table[std::size_t(b)];
      r.first.assign(n, 0.0);  // per point: the batch's summed loss
      for (std::size_t p = 0; p < n; ++p) {
        const double a = points[p].first, c = points[p].second;
        Kokkos::parallel_for(
            "gnh::case::landscape_point", range(space_, P_),
            KOKKOS_LAMBDA(const index_t i) { theta(i) = T(double(p0(i)) + a * D1(i) + (two ? c * D2(i) : 0.0)); });
        const LossSum l =
            engine.forward_loss(space_, Span1<const T>(theta.data(), P_), stager_.tokens(), stager_.targets());
        r.first[p] = l.sum;
        r.count = l.count;
      }
      r.done = true;
      space_.fence();
      r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (report) report(++done, index_t(mine.size()));
    }
    bool stopped = false;
    for (index_t b : mine) stopped = stopped || !table[std::size_t(b)].done;
    if (team_.any(stopped)) throw Interrupted{};
    team_.share(table);
    meter_.add(table);
    const BatchScalars sum = sum_in_order(table);
    std::vector<double> out;
    for (std::size_t p = 0; p < n; ++p) {
      out.push_back(sum.first[p] / double(sum.count));
      if (!std::isfinite(out.back())) out.back() = std::numeric_limits<double>::quiet_NaN();
    }
    return out;
  }

  // What the epoch's H v of direction d (dir, in the engine's precision, as
  // the pass applied it) gives beyond d^T H d: its per-block shares and, for a
  // Rademacher direction, |Hv|^2 (whole and per block) and the diagonal.
  // Hv is this member's slice, dir whole.
  void kept_hv(const T* whole_dir, View1<double> Hv, index_t d) {
    const index_t m = plan_.n_noise;
    if (d > m + plan_.directions_asked) return;  // the preconditioned and update directions
    const T* const dir = whole_dir + begin_;
    const std::vector<double> shares = block_dots(dir, Hv.data());
    if (d == 0) set_block_values(&BlockMeasurements::GHG, shares);
    else if (d <= m) add_block_row(&BlockMeasurements::xiHxi, shares);
    else {
      add_block_row(&BlockMeasurements::vHv, shares);
      add_block_row(&BlockMeasurements::Hv_sqnorm, block_dots(Hv.data(), Hv.data()));
      out_.m.Hv_sqnorm.push_back(sdot(Hv.data(), Hv.data()));
      if (diagonal_.extent(0) > 0) {
        auto diag = diagonal_;
        Kokkos::parallel_for(
            "gnh::case::diagonal", range(space_, n_),
            KOKKOS_LAMBDA(const index_t i) { diag(i) += double(dir[i]) * Hv(i); });
      }
    }
  }

  // The batch and the per-sequence estimators of tr(Sigma) estimate the same
  // epoch quantity (doc/statistics.md): a statistical consistency check, with
  // the batch side's null distribution taken from the per-sequence side.
  void sequence_consistency() {
    const DerivedStatistics& d = out_.derived;
    out_.consistency.push_back(noise_estimators_consistency(
        d.trace_sigma.value, d.trace_sigma_seq.value, d.trace_sigma_seq.se, d.n_sequences,
        double(out_.m.xi_sqnorm.size()), double(out_.m.noise_batch), double(out_.m.n_blocks)));
  }

  // SPEC §10: each partition's block values sum to the whole-model ones.
  // Every block value is a double dot product of the same vectors as the
  // whole one (or a mean of such), so they agree to double rounding except
  // where the whole value was summed batch by batch from the engine's
  // per-batch products (G^T H G, xi^T H xi, v^T H v): there the engine's
  // identity tolerance (fp64 1e-10, fp32 1e-4, bf16 1e-2) applies.
  void block_identity() {
    if (blocks_.empty()) return;
    constexpr bool fp64 = std::is_same<T, double>::value;
    const double tol = fp64 ? 1e-10 : s_.bf16() ? 1e-2 : 1e-4;
    IdentityCheck sums{"block_sums", 0, tol, true};
    const DerivedStatistics& d = out_.derived;
    const Estimate xiHxi_mean = mean_se(out_.m.xiHxi);
    const std::pair<const char*, double> whole[] = {{"G_sqnorm", out_.m.G_sqnorm},
                                                    {"trace_sigma", d.trace_sigma.value},
                                                    {"trace_sigma_seq", d.trace_sigma_seq.value},
                                                    {"trace_H", d.trace_H.value},
                                                    {"GHG_contrib", out_.m.GHG},
                                                    {"xiHxi_contrib", xiHxi_mean.value},
                                                    {"frob_H", d.frob_H.value}};
    for (const BlockTable& t : out_.blocks)
      for (const auto& [name, value] : whole) {
        const std::vector<double>* col = t.column(name);
        if (!col || !std::isfinite(value)) continue;
        double sum = 0, abs_sum = 0;
        for (double x : *col) {
          sum += x;
          abs_sum += std::abs(x);
        }
        const double scale = std::max(std::abs(value), abs_sum);
        sums.deviation = std::max(sums.deviation, std::abs(sum - value) / std::max(scale, 1e-300));
      }
    out_.identities.push_back(sums);
  }

  // Stage 4: the identities of SPEC §4. Tolerances: the |g|^2 identity is
  // double arithmetic on double vectors (1e-10); the others compare two
  // computations in the engine's precision (fp64 1e-10; fp32 1e-4, a few
  // hundred float eps amplified by the depth of the graph). Under bf16-amp the
  // compared computations round their operands at different points (8-bit
  // mantissas): 1e-2.
  void identities() {
    reset_peak_allocated();
    constexpr bool fp64 = std::is_same<T, double>::value;
    const double tol = fp64 ? 1e-10 : s_.bf16() ? 1e-2 : 1e-4;
    const index_t m = plan_.n_noise;
    CaseMeasurements& cm = out_.m;
    IdentityCheck pyth{"norm_decomposition", 0, 1e-10, m > 0};
    for (index_t j = 0; j < m; ++j) {
      const double rhs = cm.G_sqnorm + 2 * cm.G_dot_xi[j] + cm.xi_sqnorm[j];
      pyth.deviation = std::max(pyth.deviation, std::abs(cm.gB_sqnorm[j] - rhs) / cm.gB_sqnorm[j]);
    }
    IdentityCheck gradient_first{"gradient_first_order", std::abs(first_[0] - cm.G_sqnorm) / cm.G_sqnorm, tol, true};
    IdentityCheck part{"partition_mean_gradient", 0, tol, plan_.partition};
    if (plan_.partition) {
      replicas_.sum(partition_sum_);
      gj_ = View1<double>(Kokkos::view_alloc(Kokkos::WithoutInitializing, "gnh::case::partition_mean"), n_);
      partition_sum_.to_double(space_, gj_.data(), 1.0 / double(m));
      auto g = gj_;
      auto Gv = G_;
      Kokkos::parallel_for(
          "gnh::case::partition", range(space_, n_), KOKKOS_LAMBDA(const index_t i) { g(i) -= Gv(i); });
      part.deviation = std::sqrt(sdot(gj_.data(), gj_.data()) / cm.G_sqnorm);
    }
    // Symmetry u^T(Hv) = v^T(Hu) and agreement of the two curvature paths, on block 0.
    IdentityCheck symmetry{"hessian_symmetry", 0, tol, true}, paths{"curvature_paths", 0, tol, true};
    View2<T> uv("gnh::case::check_dirs", 2, P_);
    fill_rademacher<T>(space_, uv, s_.seed, 0);
    View1<T> grad("gnh::case::check_grad", P_);  // a sink: each product adds the gradient
    View1<T> product(Kokkos::view_alloc(Kokkos::WithoutInitializing, "gnh::case::check_product"), P_);
    stager_.stage(ids_, Batch{0}, 1);
    const CheckForms h = check_forms(uv, grad, product, CurvatureOperator::hessian);
    symmetry.deviation = std::abs(h.uv - h.vu) / h.uv_abs;
    const LossSum so = engines_.check_sof().second_order(space_, params_, uv, stager_.tokens(), stager_.targets());
    for (index_t k = 0; k < 2; ++k)
      paths.deviation = std::max(paths.deviation, std::abs(so.second[k] - h.self[k]) / h.self_abs[k]);
    out_.identities = {pyth, gradient_first, part, symmetry, paths};
    if (cm.gauss_newton) gauss_newton_identities(uv, grad, product, so, tol);
    engines_.release_checks();
    if (const std::int64_t a = peak_allocated(); a >= 0)
      out_.measured.emplace_back("checks_peak_allocated_bytes", double(a));
  }

  // The checks' forms of op on u and v (the rows of uv), by
  // forward-over-reverse on block 0 (staged), one direction at a time into
  // one product: an engine of one direction and one product vector.
  struct CheckForms {
    double uv = 0, vu = 0, uv_abs = 0;              // u^T(op v), v^T(op u), |u|^T|op v|
    double self[2] = {0, 0}, self_abs[2] = {0, 0};  // v_k^T(op v_k) and |v_k|^T|op v_k|
  };
  CheckForms check_forms(View2<T> uv, View1<T> grad, View1<T> product, CurvatureOperator op) {
    CheckForms f;
    for (index_t k = 0; k < 2; ++k) {
      Kokkos::deep_copy(space_, product, T(0));
      engines_.check_for().hvp(space_, params_, Span2<const T>(uv.data() + k * P_, 1, P_), stager_.tokens(),
                               stager_.targets(), grad, Span2<T>(product.data(), 1, P_), op);
      const T* self = uv.data() + k * P_;
      const T* other = uv.data() + (1 - k) * P_;
      f.self[k] = dot(space_, self, product.data(), P_, false);
      f.self_abs[k] = dot(space_, self, product.data(), P_, true);
      if (k == 0) {
        f.vu = dot(space_, other, product.data(), P_, false);
      } else {
        f.uv = dot(space_, other, product.data(), P_, false);
        f.uv_abs = dot(space_, other, product.data(), P_, true);
      }
    }
    return f;
  }

  // The Gauss-Newton operator's identities, on block 0 with the same two
  // directions: GGN v_k by forward-over-reverse is symmetric, u^T(GGN v) =
  // v^T(GGN u); its forms v^T(GGN v) equal the head's z'^T H_z z' of the
  // second-order forward (two different computations of one number); and
  // every form of the case is non-negative (GGN is positive semi-definite:
  // each token contributes a variance), to rounding of the largest form.
  void gauss_newton_identities(View2<T> uv, View1<T> grad, View1<T> product, const LossSum& so, double tol) {
    const CheckForms g = check_forms(uv, grad, product, CurvatureOperator::gauss_newton);
    IdentityCheck symmetry{"ggn_symmetry", std::abs(g.uv - g.vu) / g.uv_abs, tol, true},
        paths{"ggn_paths", 0, tol, true};
    for (index_t k = 0; k < 2; ++k)
      paths.deviation = std::max(paths.deviation, std::abs(so.gauss_newton[k] - g.self[k]) / g.self_abs[k]);
    const CaseMeasurements& cm = out_.m;
    std::vector<double> forms = cm.xiHxi_ggn;
    forms.push_back(cm.GHG_ggn);
    forms.insert(forms.end(), cm.vGv_ggn.begin(), cm.vGv_ggn.end());
    double lowest = 0, largest = 0;
    for (double q : forms) {
      lowest = std::min(lowest, q);
      largest = std::max(largest, std::abs(q));
    }
    IdentityCheck psd{"ggn_nonnegative", largest > 0 ? -lowest / largest : 0.0, tol, true};
    out_.identities.push_back(symmetry);
    out_.identities.push_back(paths);
    out_.identities.push_back(psd);
  }

  const ExecSpace& space_;
  Team& team_;
  Team& replicas_;  // the members holding this member's slice, one per shard group
  Engines<T>& engines_;
  Span1<const T> params_;
  View1<double> precond_;  // the AdamW preconditioner P, or empty
  View1<T> target_;        // theta_b of the update, or empty
  View1<double> delta_;    // theta_b - theta_a
  const std::int32_t* ids_;
  const AnalysisSettings& s_;
  const CaseHooks& hooks_;
  const CasePlan plan_;
  const index_t P_;
  // parallel.parameter_shards: this member's slice [begin_, begin_ + n_) of
  // the flat order; G_, gj_, xi_'s rows, delta_, the exact sums, Hv and the
  // diagonal hold it alone (the whole order at R = 1).
  const Slice slice_;
  const index_t begin_, n_;
  BatchStager stager_;
  Stopwatch clock_;
  CaseStatistics out_;
  std::int64_t tokens_ = 0;  // targets of the epoch
  // (n_) the epoch's mean gradient; a noise batch's while its xi_j is formed (then the partition's mean)
  View1<double> G_, gj_;
  View1<double> G_whole_, delta_whole_;  // (P) G and Delta gathered (whole_G, whole_delta), where asked for
  View2<T> xi_;                          // (m, n_) the noise vectors
  // With operator "both" and per-block statistics: the epoch's GGN v_k of
  // each Rademacher direction (K more forward-over-reverse directions, in
  // passes no wider than the planned ones), for the per-block trace_ggn.
  void gauss_newton_block_passes(View2<T> dirs, const std::vector<ExactSum>& hv_sums, View1<double> Hv) {
    const index_t m = plan_.n_noise, K = plan_.directions_asked;
    const auto batches = make_batches(all_blocks(plan_.n_blocks), s_.hvp_batch);
    const std::vector<index_t> widths = balanced_passes(K, plan_.pass_widths.front());
    for (index_t c = 0, d0 = 1 + m; c < index_t(widths.size()); d0 += widths[std::size_t(c)], ++c) {
      const index_t W = widths[std::size_t(c)];
      fill_directions(dirs, W, d0);
      std::vector<ExactSum> sums(hv_sums.begin(), hv_sums.begin() + W);  // the planned sums, reused
      for (ExactSum& e : sums) e.clear(space_);
      std::vector<BatchScalars> ct;
      const bool ok = curvature_pass<T>(
          space_, engines_.curvature(W), stager_, params_, Span2<const T>(dirs.data(), W, P_), ids_, batches,
          team_.share_of(index_t(batches.size())), CurvatureMethod::forward_over_reverse, ct, hooks_.stop,
          progress("curvature ggn " + std::to_string(c + 1) + "/" + std::to_string(widths.size())), &sums,
          CurvatureOperator::gauss_newton, &slice_);
      if (team_.any(!ok)) throw Interrupted{};
      for (index_t r = 0; r < W; ++r) {
        replicas_.sum(sums[std::size_t(r)]);
        sums[std::size_t(r)].to_double(space_, Hv.data(), 1.0 / double(tokens_));
        add_block_row(&BlockMeasurements::vGv, block_dots(dirs.data() + r * P_ + begin_, Hv.data()));
      }
      team_.share(ct);
      meter_.add(ct, W);
    }
  }

  // SPEC §10's spectrum of H or of its Gauss-Newton part: the stage
  // "spectrum" or "spectrum_ggn", its output, identities and time.
  // curvature.eigenvectors: what the span U of the top Ritz vectors holds of
  // G and of the update Delta (H's and GGN's vectors; those of the
  // preconditioned operators live in P^1/2-scaled coordinates and are not
  // projected), U in float for the output, and the orthonormality identity.
  void topk_projections(SpectrumRun& sp) {
    SpectrumStatistics& st = sp.stats;
    const index_t k = index_t(sp.vectors.extent(0));
    const double nan = std::numeric_limits<double>::quiet_NaN();
    st.G_in_topk = st.delta_in_topk = st.topk_overlap_prev = nan;
    if (!s_.curvature.lanczos_php) {
      double g = 0, d = 0;
      for (index_t i = 0; i < k; ++i) {
        const double* y = sp.vectors.data() + i * P_;
        const double a = sdot(y + begin_, G_.data());
        g += a * a;
        if (plan_.update) {
          const double b = sdot(y + begin_, delta_.data());
          d += b * b;
        }
      }
      st.G_in_topk = g / out_.m.G_sqnorm;
      if (plan_.update) st.delta_in_topk = d / sdot(delta_.data(), delta_.data());
    }
    auto h = Kokkos::create_mirror_view_and_copy(HostSpace(), sp.vectors);
    st.eigenvectors.resize(std::size_t(k * P_));
    for (index_t i = 0; i < k * P_; ++i) st.eigenvectors[std::size_t(i)] = float(h.data()[i]);
    spectrum_checks_.push_back(sp.orthonormal);
  }

  // curvature.spectrum_blocks = "layer": Lanczos on every layer block's H_bb,
  // the blocks' chains in shared passes.
  void layer_spectra() {
    meter_.begin();
    Partition layer;
    for (Partition& p : parameter_partitions(engines_.layout()))
      if (p.name == "layer") layer = std::move(p);
    SpectrumRun sp = lanczos_spectrum<T>(space_, team_, engines_, stager_, params_, whole_precond(), ids_,
                                         plan_.n_blocks, tokens_, s_, hooks_, CurvatureOperator::hessian, &layer);
    out_.spectrum_blocks = std::move(sp.blocks);
    record_spectrum("spectrum_blocks", sp);
  }

  // A spectrum run's identities, measured time and stage timings, under name.
  void record_spectrum(const std::string& name, const SpectrumRun& sp) {
    spectrum_checks_.push_back(sp.quadrature);
    if (sp.nonnegative.checked) spectrum_checks_.push_back(sp.nonnegative);
    for (std::size_t i = 0; i < sp.batch_seconds.size(); ++i)
      meter_.add_seconds(sp.batch_seconds[i], sp.direction_seconds[i]);
    meter_.end(name, out_.measured);
    out_.timings.emplace_back(name, clock_.lap());
    spectrum_parts_.emplace_back(name + "_passes", sp.pass_seconds);
    spectrum_parts_.emplace_back(name + "_arithmetic", sp.arithmetic_seconds);
  }

  void spectrum(CurvatureOperator op) {
    const bool ggn = op == CurvatureOperator::gauss_newton;
    const std::string name = ggn ? "spectrum_ggn" : "spectrum";
    meter_.begin();
    SpectrumRun sp = lanczos_spectrum<T>(space_, team_, engines_, stager_, params_, whole_precond(), ids_,
                                         plan_.n_blocks, tokens_, s_, hooks_, op);
    if (sp.vectors.extent(0) > 0) topk_projections(sp);
    // The eigenvector:i landscapes' directions, and the deflated trace's basis.
    if (!ggn && !s_.curvature.lanczos_php && (s_.landscape.top_eigenvector() > 0 || s_.curvature.hutchpp)) {
      ritz_ = sp.vectors;
      ritz_values_ = sp.values;
    }
    (ggn ? out_.spectrum_ggn : out_.spectrum) = std::move(sp.stats);
    if (!ggn || out_.spectrum_resumed_at < 0) out_.spectrum_resumed_at = sp.resumed_at;
    record_spectrum(name, sp);
  }

  ExactSum partition_sum_;                      // sum of the g_j when the noise batches partition the epoch
  std::vector<double> first_;                   // per direction: G . d
  std::vector<BlockMeasurements> blocks_;       // [curvature] blocks: one per partition
  index_t n_block_values_ = 0;                  // blocks of all partitions together
  View1<double> diagonal_;                      // [curvature] diagonal: sum_k v_k * (H v_k)
  std::vector<IdentityCheck> spectrum_checks_;  // the spectra's quadrature (and Gauss-Newton sign) identities
  StageMeter meter_;                            // the measured time and memory of the stage under way
  View2<double> ritz_;                          // the eigenvector:i landscapes' Ritz vectors (k, P)
  std::vector<double> ritz_values_;             // and their Ritz values
  std::vector<std::pair<std::string, double>> spectrum_parts_;
};

}  // namespace

template <class T>
CaseStatistics analyse_case(const ExecSpace& space, Team& team, Engines<T>& engines, Span1<const T> params,
                            const CaseExtras<T>& extras, const std::int32_t* ids, index_t n_blocks,
                            const AnalysisSettings& s, const CaseHooks& hooks) {
  return CaseAnalysis<T>(space, team, engines, params, extras, ids, n_blocks, s, hooks).run();
}

template struct Engines<float>;
template struct Engines<double>;
template CaseStatistics analyse_case<float>(const ExecSpace&, Team&, Engines<float>&, Span1<const float>,
                                            const CaseExtras<float>&, const std::int32_t*, index_t,
                                            const AnalysisSettings&, const CaseHooks&);
template CaseStatistics analyse_case<double>(const ExecSpace&, Team&, Engines<double>&, Span1<const double>,
                                             const CaseExtras<double>&, const std::int32_t*, index_t,
                                             const AnalysisSettings&, const CaseHooks&);

}  // namespace gnh
