// SPDX-License-Identifier: BSD-3-Clause
// Activations, parameters and gradients in the derivative engine's three modes,
// stored as planes (structure of arrays) so that every GEMM stays a plain BLAS
// call on contiguous LayoutRight blocks:
//
//   primal   v              (N, C)
//   tangent  v, d[k]        d: (K, N, C), one plane per direction k
//   second   v, d[k], dd[k] dd: (K, N, C)
//
// Nonlinear kernels read and write scalars S (T, Dual<T>, Jet2<T>) through Io<S>;
// linear maps act on each plane separately. Direction k of the parameters is
// row k of the (K, P) direction buffer, so the tangent of a weight matrix is a
// contiguous block of it, laid out exactly like the weight.
#pragma once
#include <stdexcept>
#include <type_traits>

#include "core/error.hpp"
#include "core/jet.hpp"
#include "core/types.hpp"

namespace gnh {

template <class T>
struct Act2 {
  Span2<T> v;      // (N, C)
  Span3<T> d, dd;  // (K, N, C) or empty
  KOKKOS_INLINE_FUNCTION index_t rows() const { return v.extent(0); }
  KOKKOS_INLINE_FUNCTION index_t cols() const { return v.extent(1); }
};

template <class T>
struct Act1 {
  Span1<T> v;      // (N)
  Span2<T> d, dd;  // (K, N) or empty
};

// Parameters and, in tangent/second mode, the K directions (parameter tangents).
template <class T>
struct Params {
  Span1<const T> v;  // (P)
  Span2<const T> d;  // (K, P) or empty
};

// Gradient accumulators: the gradient and, in tangent mode, its K tangents (Hv_k).
// Per sequence (the primal only): with seq_rows > 0, every seq_rows
// consecutive rows of the batch are a sequence whose own gradient starts at
// v + s seq_stride, and each row's terms go into its sequence's gradient
// (analysis.per_sequence in one reverse of the batch). Every kernel that
// accumulates a gradient honours it or refuses it (require_summed).
// seq_fresh (per sequence): the weight matrices' products write each
// sequence's first term (beta 0) over whatever its matrix held, the linear
// layers' and the head's, and the later terms add to it; every other
// tensor (norms, biases, the embeddings the products do not write) the
// caller zeroed, and its kernels accumulate as always. The rows then need
// no zeroing pass, and the products no read of C.
template <class T>
struct Grads {
  Span1<T> v;  // (P), or (sequences, seq_stride) flat
  Span2<T> d;  // (K, P) or empty
  index_t seq_rows = 0;
  index_t seq_stride = 0;
  bool seq_fresh = false;
  KOKKOS_INLINE_FUNCTION bool per_sequence() const { return seq_rows > 0; }
  // The offset of the gradient that row n's terms go into.
  KOKKOS_INLINE_FUNCTION index_t row_offset(index_t n) const { return seq_rows > 0 ? (n / seq_rows) * seq_stride : 0; }
};

// The planes of a scalar type's mode: the primal drops the tangents, Dual<T>
// drops the second order, Jet2<T> keeps all. Every kernel entry point applies
// it to the planes it is given, so the derivative mode follows from S alone: a
// caller may pass buffers allocated for a higher mode (the model passes its
// activations with every plane they have), and planes beyond S's are neither
// read nor written.
template <class S>
inline constexpr bool keeps_second_v = std::is_same<S, Jet2<base_t<S>>>::value;
template <class S, class T>
Act2<T> planes_of(Act2<T> a) {
  if constexpr (!has_tangents_v<S>) a.d = Span3<T>();
  if constexpr (!keeps_second_v<S>) a.dd = Span3<T>();
  return a;
}
template <class S, class T>
Act1<T> planes_of(Act1<T> a) {
  if constexpr (!has_tangents_v<S>) a.d = Span2<T>();
  if constexpr (!keeps_second_v<S>) a.dd = Span2<T>();
  return a;
}
template <class S, class T>
Params<T> planes_of(Params<T> p) {
  if constexpr (!has_tangents_v<S>) p.d = Span2<const T>();
  return p;
}
template <class S, class T>
Grads<T> planes_of(Grads<T> g) {
  if constexpr (!has_tangents_v<S>) g.d = Span2<T>();
  return g;
}
// planes_of<S> on each argument, in place (a kernel's first line).
template <class S, class... A>
void keep_planes(A&... a) {
  ((a = planes_of<S>(a)), ...);
}

// The planes S's mode needs on a buffer it is given: K tangent planes (Dual,
// Jet2) and, for activations, K second-order planes (Jet2). A kernel called
// in a mode on buffers without that mode's planes fails here, naming itself
// and the buffer, instead of quietly computing a lower mode.
template <class S, class T>
void require_planes(const char* kernel, const char* what, const Act2<T>& a, index_t K) {
  if constexpr (has_tangents_v<S>)
    if (index_t(a.d.extent(0)) != K)
      throw std::logic_error(cat(kernel, ": ", what, " has ", a.d.extent(0), " tangent planes, expected ", K));
  if constexpr (has_second_v<S>)
    if (index_t(a.dd.extent(0)) != K)
      throw std::logic_error(cat(kernel, ": ", what, " has ", a.dd.extent(0), " second-order planes, expected ", K));
}
// The parameter block and the gradient accumulators: K directions.
template <class S, class B>
void require_planes(const char* kernel, const char* what, const B& b, index_t K) {
  if constexpr (has_tangents_v<S>)
    if (index_t(b.d.extent(0)) != K)
      throw std::logic_error(cat(kernel, ": ", what, " has ", b.d.extent(0), " directions, expected ", K));
}

// Kernels without a per-sequence form (the tangent modes) refuse one.
template <class T>
void require_summed(const char* kernel, const Grads<T>& g) {
  if (g.per_sequence()) throw std::logic_error(cat(kernel, ": no per-sequence gradients in this mode"));
}
// A per-sequence gradient over N rows: whole sequences.
template <class T>
index_t sequences_of(const char* kernel, const Grads<T>& g, index_t N) {
  if (!g.per_sequence()) return 1;
  if (N % g.seq_rows != 0)
    throw std::logic_error(cat(kernel, ": ", N, " rows are not whole sequences of ", g.seq_rows));
  return N / g.seq_rows;
}

template <class S>
struct Io {  // primal: S == T
  using T = S;
  static KOKKOS_INLINE_FUNCTION S get(const Act2<T>& a, int, index_t n, index_t c) { return a.v(n, c); }
  static KOKKOS_INLINE_FUNCTION void put(const Act2<T>& a, int, index_t n, index_t c, const S& x) { a.v(n, c) = x; }
  static KOKKOS_INLINE_FUNCTION S get(const Act1<T>& a, int, index_t n) { return a.v(n); }
  static KOKKOS_INLINE_FUNCTION void put(const Act1<T>& a, int, index_t n, const S& x) { a.v(n) = x; }
  static KOKKOS_INLINE_FUNCTION S param(const Params<T>& p, int, index_t i) { return p.v(i); }
  // Adds x into gradient entry i; the value part is added once (k == 0).
  static KOKKOS_INLINE_FUNCTION void accumulate(const Grads<T>& g, int, index_t i, const S& x) { g.v(i) += x; }
};

template <class T_>
struct Io<Dual<T_>> {
  using T = T_;
  using S = Dual<T>;
  static KOKKOS_INLINE_FUNCTION S get(const Act2<T>& a, int k, index_t n, index_t c) {
    return {a.v(n, c), a.d(k, n, c)};
  }
  static KOKKOS_INLINE_FUNCTION void put(const Act2<T>& a, int k, index_t n, index_t c, const S& x) {
    a.v(n, c) = x.v;
    a.d(k, n, c) = x.d;
  }
  static KOKKOS_INLINE_FUNCTION S get(const Act1<T>& a, int k, index_t n) { return {a.v(n), a.d(k, n)}; }
  static KOKKOS_INLINE_FUNCTION void put(const Act1<T>& a, int k, index_t n, const S& x) {
    a.v(n) = x.v;
    a.d(k, n) = x.d;
  }
  static KOKKOS_INLINE_FUNCTION S param(const Params<T>& p, int k, index_t i) { return {p.v(i), p.d(k, i)}; }
  static KOKKOS_INLINE_FUNCTION void accumulate(const Grads<T>& g, int k, index_t i, const S& x) {
    if (k == 0) g.v(i) += x.v;
    g.d(k, i) += x.d;
  }
};

template <class T_>
struct Io<Jet2<T_>> {
  using T = T_;
  using S = Jet2<T>;
  static KOKKOS_INLINE_FUNCTION S get(const Act2<T>& a, int k, index_t n, index_t c) {
    return {a.v(n, c), a.d(k, n, c), a.dd(k, n, c)};
  }
  static KOKKOS_INLINE_FUNCTION void put(const Act2<T>& a, int k, index_t n, index_t c, const S& x) {
    a.v(n, c) = x.v;
    a.d(k, n, c) = x.d;
    a.dd(k, n, c) = x.dd;
  }
  static KOKKOS_INLINE_FUNCTION S get(const Act1<T>& a, int k, index_t n) { return {a.v(n), a.d(k, n), a.dd(k, n)}; }
  static KOKKOS_INLINE_FUNCTION void put(const Act1<T>& a, int k, index_t n, const S& x) {
    a.v(n) = x.v;
    a.d(k, n) = x.d;
    a.dd(k, n) = x.dd;
  }
  // theta(eps) = theta + eps v: the second derivative of a parameter is 0.
  static KOKKOS_INLINE_FUNCTION S param(const Params<T>& p, int k, index_t i) { return {p.v(i), p.d(k, i), T(0)}; }
};

// Number of directions carried by a scalar type's planes (1 for the primal loop).
template <class S, class A>
index_t directions_of(const A& a) {
  return std::is_same<S, base_t<S>>::value ? 1 : static_cast<index_t>(a.d.extent(0));
}

}  // namespace gnh

namespace gnh {
// Building a scalar from a value and one tangent, and reading the tangent back
// (for kernels that update planes in place: the value is written last).
template <class S>
struct Tangent;
template <class T>
struct Tangent<Dual<T>> {
  static KOKKOS_INLINE_FUNCTION Dual<T> make(T v, T d) { return {v, d}; }
  static KOKKOS_INLINE_FUNCTION T of(const Dual<T>& x) { return x.d; }
};
}  // namespace gnh
