// SPDX-License-Identifier: BSD-3-Clause
// The one dot product of the analysis: sum_i a_i b_i (or sum_i |a_i b_i|),
// widened to double, deterministic for a given backend and length. The
// operands may differ in type (a direction in the engine's precision against
// an H v in double). A functor, not a lambda: nvcc cannot name an extended
// lambda's enclosing function template when two of its parameters are
// template types.
#pragma once
#include "core/types.hpp"

namespace gnh {

template <class A, class B>
struct DotTerm {
  const A* a;
  const B* b;
  bool absolute;
  KOKKOS_INLINE_FUNCTION void operator()(const index_t i, double& acc) const {
    const double p = double(a[i]) * double(b[i]);
    acc += absolute && p < 0 ? -p : p;
  }
};

template <class A, class B>
double dot(const ExecSpace& space, const A* a, const B* b, index_t n, bool absolute = false) {
  double s = 0;
  Kokkos::parallel_reduce("gnh::analysis::dot", range(space, n), DotTerm<A, B>{a, b, absolute}, s);
  return s;
}

}  // namespace gnh
