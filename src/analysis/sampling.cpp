// SPDX-License-Identifier: BSD-3-Clause
#include "analysis/sampling.hpp"

#include <algorithm>

#include "core/error.hpp"
#include "core/random.hpp"

namespace gnh {

index_t epoch_blocks(index_t n_tokens, index_t context, index_t cap, index_t stride) {
  if (context <= 0) fail("context ", context, " must be positive");
  const index_t step = stride > 0 ? stride : context;
  const index_t n = n_tokens > context ? (n_tokens - context - 1) / step + 1 : 0;
  return cap > 0 && cap < n ? cap : n;
}

std::vector<std::vector<index_t>> noise_batches(index_t n_blocks, index_t noise_batch, index_t noise_samples,
                                                std::uint64_t seed) {
  std::vector<std::vector<index_t>> out;
  if (noise_batch <= 0 || n_blocks <= 0) return out;
  const index_t m = std::min(noise_samples, n_blocks / noise_batch);
  const std::uint64_t key = splitmix64(seed ^ 0x6E6F697365000000ull);
  std::vector<index_t> perm(static_cast<std::size_t>(n_blocks));
  for (index_t i = 0; i < n_blocks; ++i) perm[static_cast<std::size_t>(i)] = i;
  for (index_t i = n_blocks - 1; i >= 1; --i) {
    const std::uint64_t j = splitmix64(key ^ std::uint64_t(i)) % std::uint64_t(i + 1);
    std::swap(perm[static_cast<std::size_t>(i)], perm[static_cast<std::size_t>(j)]);
  }
  for (index_t j = 0; j < m; ++j) {
    std::vector<index_t> b(perm.begin() + j * noise_batch, perm.begin() + (j + 1) * noise_batch);
    std::sort(b.begin(), b.end());
    out.push_back(std::move(b));
  }
  return out;
}

std::vector<std::vector<index_t>> make_batches(const std::vector<index_t>& blocks, index_t size) {
  std::vector<std::vector<index_t>> out;
  for (std::size_t i = 0; i < blocks.size(); i += static_cast<std::size_t>(size))
    out.emplace_back(
        blocks.begin() + static_cast<std::ptrdiff_t>(i),
        blocks.begin() + static_cast<std::ptrdiff_t>(std::min(blocks.size(), i + static_cast<std::size_t>(size))));
  return out;
}

std::vector<index_t> balanced_passes(index_t directions, index_t max_per_pass) {
  if (directions <= 0) return {};
  const index_t passes = (directions + max_per_pass - 1) / max_per_pass;
  const index_t base = directions / passes, larger = directions % passes;
  std::vector<index_t> sizes(static_cast<std::size_t>(passes), base);
  for (index_t c = 0; c < larger; ++c) ++sizes[static_cast<std::size_t>(c)];
  return sizes;
}

}  // namespace gnh
