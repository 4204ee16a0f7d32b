// SPDX-License-Identifier: BSD-3-Clause
// Full-epoch passes (SPEC §3): with context T, block b has inputs
// ids[bT .. bT+T-1] and targets ids[bT+1 .. bT+T]; an epoch is blocks 0..n-1,
// n = floor((N-1)/T), optionally capped. Blocks are processed in microbatches
// of the model's batch size; the last one is padded with ignored targets, and
// every sum is divided by the epoch's true target count.
#pragma once
#include <cstdint>

#include "analysis/sampling.hpp"
#include "core/types.hpp"
#include "model/gpt.hpp"

namespace gnh {

// Fills one (B, T) batch with the listed blocks (count <= B), block k the
// T + 1 tokens from ids + k stride (stride 0: T, a stream's overlapping
// blocks); rows past count are padding: token 0 and ignored targets (-1).
void fill_batch(View2<std::int32_t, HostSpace> tokens, View2<std::int32_t, HostSpace> targets, const std::int32_t* ids,
                const index_t* blocks, index_t count, index_t stride = 0);

struct EpochLoss {
  double loss = 0.0;        // sum / tokens
  double sum = 0.0;         // sum of token losses, accumulated in double in block order
  std::int64_t tokens = 0;  // true target count
  index_t batches = 0;
};

// Mean token loss over blocks 0..n_blocks-1 of ids (which must hold at least
// n_blocks*T + 1 ids). Deterministic: batches are summed in order in double.
template <class T>
EpochLoss epoch_loss(const ExecSpace& space, Gpt<T>& model, Span1<const T> params, const std::int32_t* ids,
                     index_t n_blocks);

}  // namespace gnh
