// SPDX-License-Identifier: BSD-3-Clause
// An elementwise op's second-order forward with an adjoint cut at its output
// (model/gpt_impl.hpp, adjoint cuts): y and y' written, y'' formed and
// contracted with the cut's adjoint as it is formed, never stored.
//
// An element is a functor with
//   primal(x, j, y, c): output column j's value y and the coefficients c[0..kCoefficients)
//                       of its derivatives, from the input row's values x
//   tangents(c, x', x'', j, y', y''): column j's tangent and second-order
//                       values in one direction, from that direction's input planes
// On a GPU a thread takes an element of a row (k, n) and forms its primal
// again for each direction k (the kernel is memory-bound there). On a host a
// task takes a row n and all K directions: the primal is formed once per
// element, into a chunk on the stack, and the K directions' planes stream
// past it. GELU's erf and SiLU's exponential were formed K times before: on
// the AMD EPYC Zen 3 (AVX2) at preset small, K = 16, the second-order
// forward's GELU cut took 67 ms of 466 and SwiGLU's 65 of 448.
#pragma once
#include "core/bf16.hpp"
#include "core/planes.hpp"
#include "kernels/check.hpp"
#include "kernels/cloned.hpp"
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
// x without second-order planes: x'' taken as zero (the model's cut at x
// contracts its x'' through the weights instead, model/gpt_impl.hpp), the
// element given a null x''.
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
    const T* xdd = x.dd.extent(0) > 0 ? &x.dd(k, n, 0) : nullptr;
    const T* a = &adj.v(n, 0);
    T* yv = &y.v(n, 0);
    T* yd = &y.d(k, n, 0);
    D* ov = out ? out + n * F : nullptr;
    D* od = out ? out + (N + k * N + n) * F : nullptr;
    const T s = lanes.template sum<T>(F, [&](index_t j) {
      T v, v1, v2, c[Element::kCoefficients];
      element.primal(xv, j, v, c);
      element.tangents(c, xd, xdd, j, v1, v2);
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

// The host's shape of ElementwiseCutRow: a task a row n, all K directions.
// Each chunk of kCols columns has its primal formed once; then each
// direction's columns add their terms into that direction's kRowLanes
// partials, column c into partial c mod kRowLanes in the order of c, and
// the partials are added in order at the row's end: lane_sum's order of
// additions, so each acc(k, n) has the bits that ElementwiseCutRow's host
// rows give it. Directions go kDirs at a time (the partials stay on the
// stack). Compiled per x86-64 level as the rows are (kernels/cloned.hpp), so
// that y and y' have the bits of the op's forward (gelu_forward<Jet2<T>>).
template <class T, class Element, class D = T>
struct ElementwiseCutHostRow {
  static constexpr index_t kCols = 256, kDirs = 16, L = kRowLanes;
  static constexpr int C = Element::kCoefficients;
  Act2<T> y, x, adj;
  View2<double> acc;
  index_t N, K;
  Element element;
  D* out = nullptr;
  void operator()(const index_t n) const {
    for (index_t k0 = 0; k0 < K; k0 += kDirs) directions(n, k0, K - k0 < kDirs ? K - k0 : kDirs);
  }
  // Directions k0 .. k0 + nk - 1 of row n.
  void directions(const index_t n, const index_t k0, const index_t nk) const {
    const index_t F = y.cols();
    T part[kDirs][L];
    for (index_t k = 0; k < nk; ++k)
      for (index_t l = 0; l < L; ++l) part[k][l] = T(0);
    for (index_t c0 = 0; c0 < F; c0 += kCols) {
      const index_t m = F - c0 < kCols ? F - c0 : kCols;
      T v[kCols], coef[C][kCols];  // by coefficient: the columns' loops vectorise
      for (index_t j = 0; j < m; ++j) {
        T c[C];
        element.primal(&x.v(n, 0), c0 + j, v[j], c);
        for (int i = 0; i < C; ++i) coef[i][j] = c[i];
      }
      if (k0 == 0) {
        for (index_t j = 0; j < m; ++j) {
          if (out) out[n * F + c0 + j] = bf16_as<D>(v[j]);
          else y.v(n, c0 + j) = v[j];
        }
      }
      for (index_t k = 0; k < nk; ++k) columns(n, k0 + k, c0, m, coef, part[k]);
    }
    for (index_t k = 0; k < nk; ++k) {
      T s = T(0);
      for (index_t l = 0; l < L; ++l) s += part[k][l];
      acc(k0 + k, n) += double(s);
    }
  }
  // Columns c0 .. c0 + m - 1 of direction k: y'_k written, the terms added
  // into part as lane_sum adds them (c0 a multiple of L).
  void columns(const index_t n, const index_t k, const index_t c0, const index_t m, const T (*coef)[kCols],
               T* part) const {
    const index_t F = y.cols();
    const T* xd = &x.d(k, n, 0);
    const T* xdd = x.dd.extent(0) > 0 ? &x.dd(k, n, 0) : nullptr;
    const T* a = &adj.v(n, c0);
    T* yd = &y.d(k, n, c0);
    D* od = out ? out + (N + k * N + n) * F + c0 : nullptr;
    const auto term = [&](const index_t j) {
      T c[C], v1, v2;
      for (int i = 0; i < C; ++i) c[i] = coef[i][j];
      element.tangents(c, xd, xdd, c0 + j, v1, v2);
      if (od) od[j] = bf16_as<D>(v1);
      else yd[j] = v1;
      return a[j] * v2;
    };
    index_t j = 0;
    for (; j + L <= m; j += L)
      for (index_t l = 0; l < L; ++l) part[l] += term(j + l);
    for (index_t l = 0; j < m; ++j, ++l) part[l] += term(j);
  }
};
}  // namespace detail

// Every row (k, n) of y from x by element (detail::ElementwiseCutRow), one
// launch of `label`; x has `width` times y's columns.
// out (not null): y and y' rounded there (detail::ElementwiseCutRow). x
// with no second-order planes: x'' taken as zero.
template <class T, class Element, class D = T>
void elementwise_cut(const ExecSpace& space, const char* label, Act2<T> y, Act2<T> x, Act2<T> adj, View2<double> acc,
                     index_t width, const Element& element, D* out = nullptr) {
  const index_t N = x.rows(), F = y.cols(), K = x.d.extent(0);
  require_extent(label, "y rows", y.rows(), N);
  require_extent(label, "x cols", x.cols(), width * F);
  require_cut(label, adj, acc, N, F, K);
  const bool second = x.dd.extent(0) > 0;
  if (second) require_planes<Jet2<T>>(label, "x", x, K);
  else require_planes<Dual<T>>(label, "x", x, K);
  require_planes<Dual<T>>(label, "y", y, K);
  // x's and y's value planes and the adjoint once; each direction's x' and
  // x'' read, y' written (a GPU's bfloat16 where rounded); a double a row and
  // direction.
  Traffic(label)
      .add(double((width + 1 + (second ? 2 : 1) * width * K) * N * F), sizeof(T), 2)
      .add(double((1 + K) * N * F), out ? 2 : sizeof(T), 2)
      .add(double(2 * K * N), sizeof(double), 1);
  if constexpr (default_row_shape() == RowShape::host) {
    Kokkos::parallel_for(label, range(space, N),
                         cloned(detail::ElementwiseCutHostRow<T, Element, D>{y, x, adj, acc, N, K, element, out}));
  } else {
    for_rows<T>(space, label, K * N, detail::ElementwiseCutRow<T, Element, D>{y, x, adj, acc, N, element, out});
  }
}

}  // namespace gnh::kernels
