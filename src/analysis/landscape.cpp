// SPDX-License-Identifier: BSD-3-Clause
#include "analysis/landscape.hpp"

#include <cmath>
#include <limits>

namespace gnh {

std::vector<double> landscape_grid(index_t points, double range) {
  std::vector<double> out;
  const index_t half = (points - 1) / 2;
  for (index_t k = 0; k < points; ++k) out.push_back(range * double(k - half) / double(half));
  return out;
}

LandscapeLine landscape_line(const std::string& direction, const std::string& unit, double unit_norm, double loss,
                             double slope, double curvature, std::vector<double> alpha, std::vector<double> losses) {
  LandscapeLine l;
  l.direction = direction;
  l.unit = unit;
  l.unit_norm = unit_norm;
  l.slope = slope;
  l.curvature = curvature;
  for (const double a : alpha) l.quadratic.push_back(loss + a * slope + 0.5 * a * a * curvature);
  std::size_t k = 0;
  for (std::size_t i = 1; i < losses.size(); ++i)
    if (losses[i] < losses[k]) k = i;
  l.argmin_alpha = alpha[k];
  if (k > 0 && k + 1 < losses.size()) {
    // The vertex of the parabola through the lowest point and its neighbours
    // (equally spaced by h): convex there, since the middle one is lowest.
    const double h = alpha[k + 1] - alpha[k], lo = losses[k - 1], mid = losses[k], hi = losses[k + 1];
    const double bend = lo - 2 * mid + hi;
    if (bend > 0) l.argmin_alpha += 0.5 * h * (lo - hi) / bend;
  }
  l.predicted_argmin_alpha = curvature > 0 ? -slope / curvature : std::numeric_limits<double>::quiet_NaN();
  l.alpha = std::move(alpha);
  l.loss = std::move(losses);
  return l;
}

template <class T>
void filter_normalised(const ExecSpace& space, const ParamLayout& layout, const T* theta, std::uint64_t seed,
                       std::uint64_t j, View1<double> out) {
  Kokkos::deep_copy(space, out, 0.0);
  // Every row of every matrix: its first element and its length.
  std::vector<index_t> first, length;
  for (const TensorInfo& t : layout.tensors()) {
    if (t.shape.size() < 2) continue;
    const index_t rows = t.shape.front(), cols = t.size / rows;
    for (index_t r = 0; r < rows; ++r) {
      first.push_back(t.offset + r * cols);
      length.push_back(cols);
    }
  }
  const index_t n = index_t(first.size());
  View1<index_t> f("gnh::landscape::row_first", n), len("gnh::landscape::row_length", n);
  Kokkos::deep_copy(space, f, Kokkos::View<const index_t*, HostSpace, Kokkos::MemoryUnmanaged>(first.data(), n));
  Kokkos::deep_copy(space, len, Kokkos::View<const index_t*, HostSpace, Kokkos::MemoryUnmanaged>(length.data(), n));
  const std::uint64_t key = landscape_key(seed, j);
  Kokkos::parallel_for(
      "gnh::landscape::filter_normalised", range(space, n), KOKKOS_LAMBDA(const index_t r) {
        const index_t a = f(r), b = a + len(r);
        double theta_sq = 0, draw_sq = 0;
        for (index_t i = a; i < b; ++i) {
          const double z = landscape_gaussian(key, std::uint64_t(i));
          out(i) = z;
          theta_sq += double(theta[i]) * double(theta[i]);
          draw_sq += z * z;
        }
        const double scale = draw_sq > 0 ? kmath::sqrt(theta_sq / draw_sq) : 0.0;
        for (index_t i = a; i < b; ++i) out(i) *= scale;
      });
  space.fence();
}

template void filter_normalised<float>(const ExecSpace&, const ParamLayout&, const float*, std::uint64_t, std::uint64_t,
                                       View1<double>);
template void filter_normalised<double>(const ExecSpace&, const ParamLayout&, const double*, std::uint64_t,
                                        std::uint64_t, View1<double>);

}  // namespace gnh
