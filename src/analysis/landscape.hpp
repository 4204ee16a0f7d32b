// SPDX-License-Identifier: BSD-3-Clause
// The [landscape] of SPEC §13 apart from its epoch passes (those are the
// case's, analysis/case_analysis.cpp): the grid of alpha, a line's quadratic
// model and its measured and predicted minima, and the filter-normalised
// random directions of Li et al. (2018). doc/statistics.md, "Landscapes",
// derives each.
#pragma once
#include <string>
#include <vector>

#include "analysis/statistics.hpp"
#include "core/compat.hpp"
#include "core/random.hpp"
#include "core/types.hpp"
#include "model/layout.hpp"

namespace gnh {

// points values from -range to +range, evenly spaced; the middle one is 0 exactly.
std::vector<double> landscape_grid(index_t points, double range);

// The line of one direction from its measured losses: the quadratic model
// loss + alpha slope + alpha^2 curvature / 2 at every alpha, the measured
// minimum (the lowest point; inside the grid, the vertex of the parabola
// through it and its two neighbours) and the model's (-slope / curvature
// where the curvature is positive, else NaN).
LandscapeLine landscape_line(const std::string& direction, const std::string& unit, double unit_norm, double loss,
                             double slope, double curvature, std::vector<double> alpha, std::vector<double> losses);

// Element i of random:j's Gaussian draw before normalisation: Box-Muller on
// two uniforms from splitmix64 (core/random.hpp) of the direction's key.
KOKKOS_INLINE_FUNCTION std::uint64_t landscape_key(std::uint64_t seed, std::uint64_t j) {
  return splitmix64(direction_key(seed, j) ^ 0x6c616e6473636170ull);  // "landscap": apart from the Rademacher keys
}
KOKKOS_INLINE_FUNCTION double landscape_gaussian(std::uint64_t key, std::uint64_t i) {
  const double u1 = double((splitmix64(key ^ (2 * i)) >> 11) + 1) * 0x1p-53;  // (0, 1]
  const double u2 = double(splitmix64(key ^ (2 * i + 1)) >> 11) * 0x1p-53;    // [0, 1)
  return kmath::sqrt(-2.0 * kmath::log(u1)) * kmath::cos(6.283185307179586 * u2);
}

// random:j into out (P): the Gaussian draw, each row of every matrix (the
// first index of its PyTorch shape: an output unit, or a token's embedding)
// scaled to the norm of the same row of theta; the one-dimensional tensors
// (norms' weights, biases) left at zero, as Li et al. plotted them.
template <class T>
void filter_normalised(const ExecSpace& space, const ParamLayout& layout, const T* theta, std::uint64_t seed,
                       std::uint64_t j, View1<double> out);

}  // namespace gnh
