// SPDX-License-Identifier: BSD-3-Clause
// Extent checks for kernel entry points: a mismatch is a programming error, but
// it is reported with the kernel's label and the offending extents.
#pragma once
#include <stdexcept>
#include <string>

#include "core/error.hpp"

namespace gnh::kernels {

inline void require_extent(const char* kernel, const char* what, long long got, long long want) {
  if (got != want) throw std::logic_error(cat(kernel, ": ", what, " has extent ", got, ", expected ", want));
}

// The adjoint (N, cols) and the accumulator (K, N) of an adjoint cut that a
// kernel takes as it forms its output's second order.
template <class Adjoint, class Accumulator>
void require_cut(const char* kernel, const Adjoint& adj, const Accumulator& acc, long long N, long long cols,
                 long long K) {
  require_extent(kernel, "adjoint rows", adj.rows(), N);
  require_extent(kernel, "adjoint cols", adj.cols(), cols);
  require_extent(kernel, "cut directions", acc.extent(0), K);
  require_extent(kernel, "cut rows", acc.extent(1), N);
}

}  // namespace gnh::kernels
