// SPDX-License-Identifier: BSD-3-Clause
// The one dot product of the analysis: sum_i a_i b_i (or sum_i |a_i b_i|),
// widened to double, deterministic for a given backend, length and host
// thread count (OpenMP splits the sum by thread: the count changes its last
// bits, so outputs record it and merges and resumed runs require it). The
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

// sum_i a_i w_i b_i in double (a P-weighted inner product).
template <class A, class B>
struct WeightedDotTerm {
  const A* a;
  const double* w;
  const B* b;
  KOKKOS_INLINE_FUNCTION void operator()(const index_t i, double& acc) const {
    acc += double(a[i]) * w[i] * double(b[i]);
  }
};

template <class A, class B>
double weighted_dot(const ExecSpace& space, const A* a, const double* w, const B* b, index_t n) {
  double s = 0;
  Kokkos::parallel_reduce("gnh::analysis::weighted_dot", range(space, n), WeightedDotTerm<A, B>{a, w, b}, s);
  return s;
}

}  // namespace gnh
