// SPDX-License-Identifier: BSD-3-Clause
#include "analysis/passes.hpp"

#include <algorithm>
#include <chrono>
#include <stdexcept>

#include "analysis/dot.hpp"
#include "analysis/epoch.hpp"
#include "analysis/usage.hpp"
#include "core/error.hpp"
#include "kernels/gemm_ledger.hpp"

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

// The gradients of a group of sequences, g (sequences, P), added into the
// batch's in sequence order, and the sums of each one's squares per chunk of
// the flat order into partial (sequence, chunk); where the engine adds into
// g (an engine of one sequence) g is left zero for the next group (one pass
// over it instead of two), where it writes g (Gpt::gradient_per_sequence) g
// is only read. Each form is deterministic for a backend and team size, and
// independent of the rank that computes it.
// Element i of one sequence's gradient: added into the batch's, left zero
// where asked, its square returned.
template <bool Zero, class T>
KOKKOS_INLINE_FUNCTION double take_square(T* g, T* grad, const index_t i) {
  const T x = g[i];
  if (Zero) g[i] = T(0);
  if (g != grad) grad[i] += x;  // in place (g is the batch's gradient): its square alone
  return double(x) * double(x);
}

// The GPU's form: a team per chunk, its threads over the chunk's entries
// (consecutive threads, consecutive entries), each entry's sum over a group
// of up to kGroup sequences kept in a register, so the microbatch's gradient
// is read and written once a group instead of once a sequence: per entry and
// sequence 4 bytes (g read; 8 where it is zeroed too) where adding sequence
// by sequence moved 16. Each thread's squares per sequence of the group sit
// in the team's scratch (a column a thread), and one thread a sequence adds
// its row of them in thread order: deterministic for a team size.
template <class T>
struct AccumulateSquares {
  static constexpr int kGroup = 16;
  using Member = typename TeamRange::member_type;
  using Scratch = TeamScratch<double>;
  T* g;
  T* grad;
  const index_t* chunks;
  double* partial;
  index_t sequences, P, n_chunks;
  bool zero;
  KOKKOS_INLINE_FUNCTION void operator()(const Member& m) const {
    const index_t c = m.league_rank(), ts = m.team_size(), t = m.team_rank();
    const Scratch acc(m.team_scratch(0), kGroup * ts);  // (sequence of the group, thread)
    for (index_t q0 = 0; q0 < sequences; q0 += kGroup) {
      const index_t nq = sequences - q0 < kGroup ? sequences - q0 : kGroup;
      for (index_t q = 0; q < nq; ++q) acc(q * ts + t) = 0.0;
      for (index_t i = chunks[c] + t; i < chunks[c + 1]; i += ts) {
        T s = grad[i];
        for (index_t q = 0; q < nq; ++q) {
          T* const gq = g + (q0 + q) * P;
          const T x = gq[i];
          if (zero) gq[i] = T(0);
          s += x;
          acc(q * ts + t) += double(x) * double(x);
        }
        if (g != grad) grad[i] = s;  // in place (g is the batch's gradient): its square alone
      }
      m.team_barrier();
      for (index_t q = t; q < nq; q += ts) {
        double v = 0;
        for (index_t j = 0; j < ts; ++j) v += acc(q * ts + j);
        partial[(q0 + q) * n_chunks + c] = v;
      }
      m.team_barrier();
    }
  }
};

// The same on a host backend: a chunk per iteration, each sequence's squares
// summed in eight interleaved lanes (element i into lane i mod 8 of the
// chunk, the lanes then added in order), which the compiler keeps in vector
// registers where one running sum would serialise on its latency.
// Deterministic for the chunk; its rounding differs from the team reduction's.
template <class T>
struct AccumulateSquaresLanes {
  T* g;
  T* grad;
  const index_t* chunks;
  double* partial;
  index_t sequences, P, n_chunks;
  bool zero;
  KOKKOS_INLINE_FUNCTION void operator()(const index_t c) const {
    if (zero) chunk<true>(c);
    else chunk<false>(c);
  }
  template <bool Zero>
  KOKKOS_INLINE_FUNCTION void chunk(const index_t c) const {
    constexpr int lanes = 8;
    const index_t begin = chunks[c], end = chunks[c + 1];
    for (index_t q = 0; q < sequences; ++q) {
      T* const gq = g + q * P;
      double s[lanes] = {};
      index_t i = begin;
      for (; i + lanes <= end; i += lanes)
        for (int l = 0; l < lanes; ++l) s[l] += take_square<Zero>(gq, grad, i + l);
      double total = 0;
      for (; i < end; ++i) total += take_square<Zero>(gq, grad, i);
      for (int l = 0; l < lanes; ++l) total += s[l];
      partial[q * n_chunks + c] = total;
    }
  }
};

// Chunks of at most this many parameters: enough teams to fill a GPU at any
// model size, few enough that the partial sums are a small copy per batch.
constexpr std::int64_t sequence_chunk = std::int64_t(1) << 16;

// The rounds a pass runs: its batches, or with a shard group of R > 1 (its
// members in step) the most any member has.
index_t pass_rounds(const std::vector<index_t>& mine, const Slice* slice) {
  return slice && !slice->whole() ? slice->group->max(index_t(mine.size())) : index_t(mine.size());
}
// A stop seen by any member of a shard group in step stops them all.
bool stopping(const StopCheck& stop, const Slice* slice) {
  const bool s = stop && stop();
  return slice && !slice->whole() ? slice->group->any(s) : s;
}

}  // namespace

template <class T>
SequenceNorms<T>::SequenceNorms(Gpt<T>& engine, const std::vector<std::int64_t>& ranges,
                                std::vector<std::pair<std::size_t, std::size_t>> values, index_t max_batch)
    : engine_(engine), values_(std::move(values)), n_ranges_(ranges.size() - 1) {
  if (engine.shape().directions != 0 || !engine.shape().reverse || max_batch % engine.batch() != 0)
    throw std::logic_error("SequenceNorms: the engine is not a gradient engine of a divisor of the batch");
  std::vector<index_t> bounds{0};
  for (std::size_t r = 0; r < n_ranges_; ++r)
    for (std::int64_t at = ranges[r]; at < ranges[r + 1];) {
      at = std::min(at + sequence_chunk, ranges[r + 1]);
      bounds.push_back(index_t(at));
      chunk_range_.push_back(r);
    }
  for (const auto& t : engine.layout().tensors())
    if (t.shape.size() == 1) vector_params_ += index_t(t.size);
  chunks_ = View1<index_t>("gnh::pass::sequence_chunks", bounds.size());
  Kokkos::deep_copy(chunks_, View1<index_t, HostSpace>(bounds.data(), bounds.size()));
  in_place_ = max_batch == 1 && engine.batch() == 1;
  g_ = View2<T>("gnh::pass::sequence_gradient", in_place_ ? 0 : engine.batch(), engine.layout().size());
  partial_ = View2<double>("gnh::pass::sequence_squares", max_batch, index_t(chunk_range_.size()));
}

// A group's gradients g_ into grad and their squares into partial: on a
// host, chunk by chunk in lanes (AccumulateSquaresLanes); on a GPU, and for
// GPU-shaped engines on a host, a team per chunk (AccumulateSquares: 256
// threads on a GPU, as many as a host team holds).
template <class T>
void SequenceNorms<T>::accumulate_squares(const ExecSpace& space, Span1<T> grad, double* partial) const {
  const index_t G = in_place_ ? 1 : index_t(g_.extent(0)), P = index_t(g_.extent(1));
  const index_t n_chunks = index_t(chunk_range_.size());
  T* const g = in_place_ ? grad.data() : g_.data();
  constexpr bool host = Kokkos::SpaceAccessibility<Kokkos::HostSpace, MemSpace>::accessible;
  const bool lanes = host && !engine_.shape().gpu_shaped, zero = G == 1 && !in_place_;
  // Each g read (and zeroed where the engine of one sequence adds into it),
  // the batch's gradient read and written once a sequence (lanes) or once a
  // group of AccumulateSquares::kGroup (teams): the parameters' extents, two
  // for the matrices (C^2, V C), one for the norms' and biases' vectors.
  constexpr index_t group = AccumulateSquares<T>::kGroup;
  const double passes = in_place_ ? 1.0 : double(G * (zero ? 2 : 1) + 2 * (lanes ? G : (G + group - 1) / group));
  kernels::Traffic("gnh::pass::sequence_squares")
      .add(passes * double(P - vector_params_), sizeof(T), 2)
      .add(passes * double(vector_params_), sizeof(T), 1);
  if (lanes) {
    Kokkos::parallel_for("gnh::pass::sequence_squares", range(space, n_chunks),
                         AccumulateSquaresLanes<T>{g, grad.data(), chunks_.data(), partial, G, P, n_chunks, zero});
    return;
  }
  using F = AccumulateSquares<T>;
  const F f{g, grad.data(), chunks_.data(), partial, G, P, n_chunks, zero};
  const int most = TeamRange(space, 1, 1).team_size_max(f, Kokkos::ParallelForTag());
  const int ts = host ? std::max(1, most) : std::min(256, most);
  const auto bytes = F::Scratch::shmem_size(F::kGroup * ts);
  Kokkos::parallel_for("gnh::pass::sequence_squares",
                       TeamRange(space, n_chunks, ts).set_scratch_size(0, Kokkos::PerTeam(bytes)), f);
}

template <class T>
LossSum SequenceNorms<T>::gradients(const ExecSpace& space, Span1<const T> params,
                                    Span2<const std::int32_t> batch_tokens, Span2<const std::int32_t> batch_targets,
                                    index_t n, Span1<T> grad, BatchScalars& r) {
  const index_t context = engine_.context(), n_chunks = index_t(chunk_range_.size());
  const index_t G = engine_.batch(), P = index_t(g_.extent(1));
  if (n > index_t(partial_.extent(0)) || batch_tokens.extent(0) % G != 0)
    throw std::logic_error("SequenceNorms: a batch of " + std::to_string(batch_tokens.extent(0)) +
                           " sequences for groups of " + std::to_string(G));
  LossSum total;
  // Groups of G sequences, each through the engine of G (G = 1: a plain
  // gradient of one sequence). The last group may hold the batch's padding
  // past n: its gradients are zero, and its squares, in partial_'s rows past
  // n, are not read.
  for (index_t b = 0; b < n; b += G) {
    const Span2<const std::int32_t> tokens(batch_tokens.data() + b * context, G, context);
    const Span2<const std::int32_t> targets(batch_targets.data() + b * context, G, context);
    // An engine of one sequence adds into g_, zero (AccumulateSquares left
    // it so); gradient_per_sequence writes every row.
    const LossSum s = in_place_ ? engine_.gradient(space, params, tokens, targets, grad)
                      : G == 1  ? engine_.gradient(space, params, tokens, targets, Span1<T>(g_.data(), P))
                                : engine_.gradient_per_sequence(space, params, tokens, targets, g_);
    total.sum += s.sum;
    total.count += s.count;
    accumulate_squares(space, grad, partial_.data() + b * n_chunks);
  }
  // One copy per batch: every sequence's sums, then in order per range,
  // sequence and block value on the host.
  auto h = Kokkos::create_mirror_view(partial_);
  Kokkos::deep_copy(space, h, partial_);
  space.fence();
  r.seq_sqnorm.assign(std::size_t(n), 0.0);
  r.seq_block_sum.assign(values_.size(), 0.0);
  r.seq_block_sq.assign(values_.size(), 0.0);
  std::vector<double> range_sq(n_ranges_);
  for (index_t b = 0; b < n; ++b) {
    std::fill(range_sq.begin(), range_sq.end(), 0.0);
    for (index_t c = 0; c < n_chunks; ++c) range_sq[chunk_range_[std::size_t(c)]] += h(b, c);
    for (const double x : range_sq) r.seq_sqnorm[std::size_t(b)] += x;
    for (std::size_t v = 0; v < values_.size(); ++v) {
      double x = 0;
      for (std::size_t q = values_[v].first; q < values_[v].second; ++q) x += range_sq[q];
      r.seq_block_sum[v] += x;
      r.seq_block_sq[v] += x * x;
    }
  }
  return total;
}

BatchStager::BatchStager(index_t max_batch, index_t context, index_t stride)
    : context_(context),
      stride_(stride > 0 ? stride : context),
      tokens_("gnh::batch::tokens", max_batch, context),
      targets_("gnh::batch::targets", max_batch, context),
      h_tokens_(Kokkos::create_mirror_view(tokens_)),
      h_targets_(Kokkos::create_mirror_view(targets_)) {}

void BatchStager::stage(const std::int32_t* ids, const Batch& blocks, index_t B) {
  if (B > index_t(tokens_.extent(0))) throw std::logic_error("BatchStager: batch larger than planned");
  rows_ = B;
  const View2<std::int32_t, HostSpace> ht(h_tokens_.data(), B, context_), hg(h_targets_.data(), B, context_);
  fill_batch(ht, hg, ids, blocks.data(), index_t(blocks.size()), stride_);
  const std::size_t n = std::size_t(B * context_);
  Kokkos::deep_copy(Span1<std::int32_t>(tokens_.data(), n), Span1<std::int32_t, HostSpace>(h_tokens_.data(), n));
  Kokkos::deep_copy(Span1<std::int32_t>(targets_.data(), n), Span1<std::int32_t, HostSpace>(h_targets_.data(), n));
}

template <class T>
bool gradient_pass(const ExecSpace& space, Gpt<T>& model, BatchStager& stager, Span1<const T> params,
                   const std::int32_t* ids, const std::vector<Batch>& batches, const std::vector<index_t>& mine,
                   ExactSum& acc, std::vector<BatchScalars>& table, const StopCheck& stop, const ProgressFn& progress,
                   SequenceNorms<T>* seq, const Slice* slice) {
  Kokkos::Profiling::pushRegion("gnh::pass::gradient");
  const index_t P = model.layout().size();
  View1<T> grad("gnh::pass::batch_gradient", P);
  table.resize(batches.size());
  const index_t rounds = pass_rounds(mine, slice);
  for (index_t i = 0; i < rounds; ++i) {
    if (stopping(stop, slice)) {
      Kokkos::Profiling::popRegion();
      return false;
    }
    const bool have = i < index_t(mine.size());
    if (!have) {  // a member of a shard group without a batch left
      slice->add(space, static_cast<const T*>(nullptr), acc);
      continue;
    }
    const index_t b = mine[std::size_t(i)];
    const BatchClock clock;
    const Batch& blocks = batches[static_cast<std::size_t>(b)];
    stager.stage(ids, blocks, model.batch());
    Kokkos::deep_copy(space, grad, T(0));
    BatchScalars& r = table[static_cast<std::size_t>(b)];
    const LossSum s =
        seq ? seq->gradients(space, params, stager.tokens(), stager.targets(), index_t(blocks.size()), grad, r)
            : model.gradient(space, params, stager.tokens(), stager.targets(), grad);
    if (slice) slice->add(space, static_cast<const T*>(grad.data()), acc);
    else acc.add(space, grad.data());
    r.loss_sum = s.sum;
    r.count = s.count;
    r.done = true;
    clock.finish(space, r);
    if (progress) progress(i + 1, index_t(mine.size()));
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
                    CurvatureOperator op, const Slice* slice) {
  Kokkos::Profiling::pushRegion("gnh::pass::curvature");
  const index_t P = model.layout().size(), K = dirs.extent(0);
  if (K != model.shape().directions) throw std::logic_error("curvature_pass: directions differ from the plan");
  View1<T> grad;
  View2<T> hv;
  if (method == CurvatureMethod::forward_over_reverse) {
    grad = View1<T>("gnh::pass::batch_gradient", P);
    hv = View2<T>("gnh::pass::batch_hv", K, P);
  }
  // Only the products' sums are scattered: without them the members need not go in step.
  const Slice* scatter = hv_sums && method == CurvatureMethod::forward_over_reverse ? slice : nullptr;
  table.resize(batches.size());
  const index_t rounds = pass_rounds(mine, scatter);
  for (index_t i = 0; i < rounds; ++i) {
    if (stopping(stop, scatter)) {
      Kokkos::Profiling::popRegion();
      return false;
    }
    if (i >= index_t(mine.size())) {  // a member of a shard group without a batch left
      for (index_t k = 0; k < K; ++k) scatter->add(space, static_cast<const T*>(nullptr), (*hv_sums)[std::size_t(k)]);
      continue;
    }
    const index_t b = mine[std::size_t(i)];
    const BatchClock clock;
    const Batch& blocks = batches[static_cast<std::size_t>(b)];
    stager.stage(ids, blocks, model.batch());
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
        if (!hv_sums) continue;
        const T* hk = hv.data() + k * P;
        if (scatter) scatter->add(space, hk, (*hv_sums)[static_cast<std::size_t>(k)]);
        else (*hv_sums)[static_cast<std::size_t>(k)].add(space, hk);
      }
    }
    r.first = s.first;
    r.seq_first.assign(s.first_seq.begin(), s.first_seq.begin() + std::ptrdiff_t(blocks.size()));
    r.gauss_newton = s.gauss_newton;
    r.loss_sum = s.sum;
    r.count = s.count;
    r.done = true;
    clock.finish(space, r);
    if (progress) progress(i + 1, index_t(mine.size()));
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

#define GNH_INSTANTIATE(T)                                                                                           \
  template bool gradient_pass<T>(const ExecSpace&, Gpt<T>&, BatchStager&, Span1<const T>, const std::int32_t*,       \
                                 const std::vector<Batch>&, const std::vector<index_t>&, ExactSum&,                  \
                                 std::vector<BatchScalars>&, const StopCheck&, const ProgressFn&, SequenceNorms<T>*, \
                                 const Slice*);                                                                      \
  template class SequenceNorms<T>;                                                                                   \
  template bool curvature_pass<T>(const ExecSpace&, Gpt<T>&, BatchStager&, Span1<const T>, Span2<const T>,           \
                                  const std::int32_t*, const std::vector<Batch>&, const std::vector<index_t>&,       \
                                  CurvatureMethod, std::vector<BatchScalars>&, const StopCheck&, const ProgressFn&,  \
                                  std::vector<ExactSum>*, CurvatureOperator, const Slice*);
GNH_INSTANTIATE(float)
GNH_INSTANTIATE(double)
#undef GNH_INSTANTIATE

}  // namespace gnh
