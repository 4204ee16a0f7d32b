// SPDX-License-Identifier: BSD-3-Clause
// An elementwise op's second-order forward with an adjoint cut at its output
// (model/gpt_impl.hpp, adjoint cuts): y and y' written, y'' formed and
// contracted with the cut's adjoint as it is formed, never stored.
#pragma once
#include "core/bf16.hpp"
#include "core/planes.hpp"
#include "kernels/check.hpp"
#include "kernels/gemm_ledger.hpp"
#include "kernels/rows.hpp"

namespace gnh::kernels {

namespace detail {
// Row (k, n): y'_k written (and y by the rows of k = 0), acc(k, n) +=
// sum_j adj(n, j) y''(k, n, j), its terms in the row shape's order (that of
// the cut's own row kernel). element(x, x', x'', j, y, y', y'') gives output
// column j of a row from the input row's planes.
// With out (D: bfloat16 storage, or T holding rounded values), y and y' are
// written there instead, rounded as the products that read them round them
// (kernels/linear.hpp, with_rounded_input's layout: y's plane, then the K
// planes of y'), and y is not written.
template <class T, class Element, class D = T>
struct ElementwiseCutRow {
  Act2<T> y, x, adj;
  View2<double> acc;
  index_t N;
  Element element;
  D* out = nullptr;
  template <class Lanes>
  KOKKOS_INLINE_FUNCTION void operator()(const Lanes& lanes, const index_t r) const {
    const index_t k = r / N, n = r - k * N, F = y.cols();
    const T* xv = &x.v(n, 0);
    const T* xd = &x.d(k, n, 0);
    const T* xdd = &x.dd(k, n, 0);
    const T* a = &adj.v(n, 0);
    T* yv = &y.v(n, 0);
    T* yd = &y.d(k, n, 0);
    D* ov = out ? out + n * F : nullptr;
    D* od = out ? out + (N + k * N + n) * F : nullptr;
    const T s = lanes.template sum<T>(F, [&](index_t j) {
      T v, v1, v2;
      element(xv, xd, xdd, j, v, v1, v2);
      if (ov) {
        if (k == 0) ov[j] = bf16_as<D>(v);
        od[j] = bf16_as<D>(v1);
      } else {
        if (k == 0) yv[j] = v;
        yd[j] = v1;
      }
      return a[j] * v2;
    });
    lanes.single([&] { acc(k, n) += double(s); });
  }
};
}  // namespace detail

// Every row (k, n) of y from x by element (detail::ElementwiseCutRow), one
// launch of `label`; x has `width` times y's columns.
// out (not null): y and y' rounded there (detail::ElementwiseCutRow).
template <class T, class Element, class D = T>
void elementwise_cut(const ExecSpace& space, const char* label, Act2<T> y, Act2<T> x, Act2<T> adj, View2<double> acc,
                     index_t width, const Element& element, D* out = nullptr) {
  const index_t N = x.rows(), F = y.cols(), K = x.d.extent(0);
  require_extent(label, "y rows", y.rows(), N);
  require_extent(label, "x cols", x.cols(), width * F);
  require_cut(label, adj, acc, N, F, K);
  require_planes<Jet2<T>>(label, "x", x, K);
  require_planes<Dual<T>>(label, "y", y, K);
  // x's and y's value planes and the adjoint once; each direction's x' and
  // x'' read, y' written (a GPU's bfloat16 where rounded); a double a row and
  // direction.
  Traffic(label)
      .add(double((width + 1 + 2 * width * K) * N * F), sizeof(T), 2)
      .add(double((1 + K) * N * F), out ? 2 : sizeof(T), 2)
      .add(double(2 * K * N), sizeof(double), 1);
  for_rows<T>(space, label, K * N, detail::ElementwiseCutRow<T, Element, D>{y, x, adj, acc, N, element, out});
}

}  // namespace gnh::kernels
