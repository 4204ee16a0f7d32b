// SPDX-License-Identifier: BSD-3-Clause
// Noise batches (SPEC §4): effective batches of `noise_batch` distinct blocks,
// chosen reproducibly from the seed, disjoint, capped at the batches available.
//   m = min(noise_samples, n / noise_batch)
//   key = splitmix64(seed ^ 0x6E6F697365000000)
//   perm = 0..n-1; for i = n-1 .. 1: j = splitmix64(key ^ i) mod (i+1); swap(perm[i], perm[j])
//   batch j = sorted(perm[j*B .. (j+1)*B - 1])
#pragma once
#include <cstdint>
#include <vector>

#include "core/index.hpp"

namespace gnh {

// Number of blocks of an epoch over n_tokens ids, block b the T + 1 ids from
// b stride (stride 0: T, SPEC §3's floor((N-1)/T); a sample length for
// layout "sequences"): those whose ids are all there. cap <= 0 means no cap.
index_t epoch_blocks(index_t n_tokens, index_t context, index_t cap, index_t stride = 0);

std::vector<std::vector<index_t>> noise_batches(index_t n_blocks, index_t noise_batch, index_t noise_samples,
                                                std::uint64_t seed);

// Direction counts of the curvature passes serving `directions` directions with
// at most `max_per_pass` each: the fewest passes, balanced (sizes differ by at
// most one, larger first), so that no pass carries padding. 9 at 8 -> {5, 4}.
std::vector<index_t> balanced_passes(index_t directions, index_t max_per_pass);

// Consecutive batches of at most `size` of the given blocks (the last may be short).
std::vector<std::vector<index_t>> make_batches(const std::vector<index_t>& blocks, index_t size);

}  // namespace gnh
