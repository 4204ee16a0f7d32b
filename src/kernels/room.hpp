// SPDX-License-Identifier: BSD-3-Clause
// The layout of a layer input's rounded planes in the layer-input room
// (GemmPolicy::layer_input): written by the kernel that produces the input
// (the norms, kernels/layernorm.hpp), read by the linear layer's products
// (kernels/linear.hpp).
#pragma once
#include "core/types.hpp"

namespace gnh::kernels {

// Where a layer input's rounded planes lie in the layer-input room (C
// columns, N rows a plane): pairs 0, y's N rows then each direction's N
// rows; pairs > 0, the pair blocks of a linear layer's pair products, row n
// of block j < pairs being [y'_2j+1 | y | y'_2j] (3C values; y in every
// block, y'_2j+1 unwritten past the last direction).
struct RoomLayout {
  index_t N = 0, C = 0, pairs = 0;
  KOKKOS_INLINE_FUNCTION index_t copies() const { return pairs > 0 ? pairs : 1; }
  // y(n, c) in copy j < copies().
  KOKKOS_INLINE_FUNCTION index_t value(index_t n, index_t c, index_t j) const {
    return pairs > 0 ? (j * N + n) * 3 * C + C + c : n * C + c;
  }
  // y'_k(n, c).
  KOKKOS_INLINE_FUNCTION index_t direction(index_t k, index_t n, index_t c) const {
    return pairs > 0 ? ((k / 2) * N + n) * 3 * C + (k % 2 == 0 ? 2 * C : 0) + c : (N + k * N + n) * C + c;
  }
};

}  // namespace gnh::kernels
