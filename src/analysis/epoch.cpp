// SPDX-License-Identifier: BSD-3-Clause
#include "analysis/epoch.hpp"

#include <stdexcept>
#include <vector>

#include "analysis/passes.hpp"
#include "core/error.hpp"

namespace gnh {

void fill_batch(View2<std::int32_t, HostSpace> tokens, View2<std::int32_t, HostSpace> targets, const std::int32_t* ids,
                const index_t* blocks, index_t count, index_t stride) {
  const index_t B = tokens.extent(0), T = tokens.extent(1), step = stride > 0 ? stride : T;
  if (count > B) throw std::logic_error("fill_batch: more blocks than the batch holds");
  for (index_t b = 0; b < B; ++b) {
    const bool real = b < count;
    const std::int32_t* block = real ? ids + blocks[b] * step : ids;
    for (index_t t = 0; t < T; ++t) {
      tokens(b, t) = real ? block[t] : 0;
      targets(b, t) = real ? block[t + 1] : -1;
    }
  }
}

template <class T>
EpochLoss epoch_loss(const ExecSpace& space, Gpt<T>& model, Span1<const T> params, const std::int32_t* ids,
                     index_t n_blocks) {
  Kokkos::Profiling::pushRegion("gnh::epoch::loss");
  const index_t B = model.batch();
  BatchStager stager(B, model.context());
  EpochLoss out;
  Batch blocks;
  for (index_t first = 0; first < n_blocks; first += B) {
    const index_t count = std::min(B, n_blocks - first);
    blocks.resize(static_cast<std::size_t>(count));
    for (index_t b = 0; b < count; ++b) blocks[b] = first + b;
    stager.stage(ids, blocks, B);
    const LossSum s = model.forward_loss(space, params, stager.tokens(), stager.targets());
    out.sum += s.sum;
    out.tokens += s.count;
    ++out.batches;
  }
  out.loss = out.tokens > 0 ? out.sum / double(out.tokens) : 0.0;
  Kokkos::Profiling::popRegion();
  return out;
}

template EpochLoss epoch_loss<float>(const ExecSpace&, Gpt<float>&, Span1<const float>, const std::int32_t*, index_t);
template EpochLoss epoch_loss<double>(const ExecSpace&, Gpt<double>&, Span1<const double>, const std::int32_t*,
                                      index_t);

}  // namespace gnh
