// SPDX-License-Identifier: BSD-3-Clause
// The one dot product of the analysis: sum_i a_i b_i (or sum_i |a_i b_i|),
// widened to double, deterministic for a given backend and length.
#pragma once
#include "core/types.hpp"

namespace gnh {

template <class T>
double dot(const ExecSpace& space, const T* a, const T* b, index_t n, bool absolute = false) {
  double s = 0;
  Kokkos::parallel_reduce(
      "gnh::analysis::dot", range(space, n),
      KOKKOS_LAMBDA(const index_t i, double& acc) {
        const double p = double(a[i]) * double(b[i]);
        acc += absolute && p < 0 ? -p : p;
      },
      s);
  return s;
}

}  // namespace gnh
