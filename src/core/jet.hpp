// SPDX-License-Identifier: BSD-3-Clause
// Truncated Taylor arithmetic for the derivative engine.
//
//   Dual<T>  {v, d}      x(eps) = v + eps d                 (tangent mode; with the
//                                                           reverse kernels it gives
//                                                           forward-over-reverse)
//   Jet2<T>  {v, d, dd}  x(eps) with x'(0) = d, x''(0) = dd  (second-order forward)
//
// The nonlinear kernels are written once, generic in their scalar S, and run
// with S = T (primal), Dual<T> or Jet2<T>. Comparisons look at the value only:
// they select branches (the softmax shift) and never enter derivatives.
#pragma once
#include "core/compat.hpp"

namespace gnh {

template <class T>
struct Dual {
  T v, d;
  KOKKOS_INLINE_FUNCTION Dual() : v(0), d(0) {}
  KOKKOS_INLINE_FUNCTION Dual(T v_) : v(v_), d(0) {}
  KOKKOS_INLINE_FUNCTION Dual(T v_, T d_) : v(v_), d(d_) {}
};

template <class T>
struct Jet2 {
  T v, d, dd;
  KOKKOS_INLINE_FUNCTION Jet2() : v(0), d(0), dd(0) {}
  KOKKOS_INLINE_FUNCTION Jet2(T v_) : v(v_), d(0), dd(0) {}
  KOKKOS_INLINE_FUNCTION Jet2(T v_, T d_, T dd_) : v(v_), d(d_), dd(dd_) {}
};

// The underlying real type of a scalar.
template <class S>
struct Base {
  using type = S;
};
template <class T>
struct Base<Dual<T>> {
  using type = T;
};
template <class T>
struct Base<Jet2<T>> {
  using type = T;
};
template <class S>
using base_t = typename Base<S>::type;
// Whether the scalar S carries tangent planes (Dual, Jet2) or second-order
// planes (Jet2). Namespace-scope constants: a device lambda tests them in an
// `if constexpr` without capturing anything (nvcc allows no first capture there).
template <class S>
inline constexpr bool has_tangents_v = !std::is_same<S, base_t<S>>::value;
template <class S>
inline constexpr bool has_second_v = std::is_same<S, Jet2<base_t<S>>>::value;

template <class T>
KOKKOS_INLINE_FUNCTION T primal_value(T x) {
  return x;
}
template <class T>
KOKKOS_INLINE_FUNCTION T primal_value(const Dual<T>& x) {
  return x.v;
}
template <class T>
KOKKOS_INLINE_FUNCTION T primal_value(const Jet2<T>& x) {
  return x.v;
}

// ---- Dual ------------------------------------------------------------------
template <class T>
KOKKOS_INLINE_FUNCTION Dual<T> operator+(const Dual<T>& a, const Dual<T>& b) {
  return {a.v + b.v, a.d + b.d};
}
template <class T>
KOKKOS_INLINE_FUNCTION Dual<T> operator-(const Dual<T>& a, const Dual<T>& b) {
  return {a.v - b.v, a.d - b.d};
}
template <class T>
KOKKOS_INLINE_FUNCTION Dual<T> operator-(const Dual<T>& a) {
  return {-a.v, -a.d};
}
template <class T>
KOKKOS_INLINE_FUNCTION Dual<T> operator*(const Dual<T>& a, const Dual<T>& b) {
  return {a.v * b.v, a.d * b.v + a.v * b.d};
}
template <class T>
KOKKOS_INLINE_FUNCTION Dual<T> operator*(const Dual<T>& a, T s) {
  return {a.v * s, a.d * s};
}
template <class T>
KOKKOS_INLINE_FUNCTION Dual<T> operator*(T s, const Dual<T>& a) {
  return {a.v * s, a.d * s};
}
template <class T>
KOKKOS_INLINE_FUNCTION Dual<T> operator+(const Dual<T>& a, T s) {
  return {a.v + s, a.d};
}
template <class T>
KOKKOS_INLINE_FUNCTION Dual<T> operator-(const Dual<T>& a, T s) {
  return {a.v - s, a.d};
}
template <class T>
KOKKOS_INLINE_FUNCTION Dual<T> operator/(const Dual<T>& a, T s) {
  return {a.v / s, a.d / s};
}
template <class T>
KOKKOS_INLINE_FUNCTION Dual<T> operator/(const Dual<T>& a, const Dual<T>& b) {
  const T q = a.v / b.v;
  return {q, (a.d - q * b.d) / b.v};
}
template <class T>
KOKKOS_INLINE_FUNCTION Dual<T>& operator+=(Dual<T>& a, const Dual<T>& b) {
  a.v += b.v;
  a.d += b.d;
  return a;
}
template <class T>
KOKKOS_INLINE_FUNCTION Dual<T>& operator*=(Dual<T>& a, T s) {
  a.v *= s;
  a.d *= s;
  return a;
}
// f(x) with f'(x) given.
template <class T>
KOKKOS_INLINE_FUNCTION Dual<T> chain(const Dual<T>& x, T f, T f1, T) {
  return {f, f1 * x.d};
}

// ---- Jet2 ------------------------------------------------------------------
template <class T>
KOKKOS_INLINE_FUNCTION Jet2<T> operator+(const Jet2<T>& a, const Jet2<T>& b) {
  return {a.v + b.v, a.d + b.d, a.dd + b.dd};
}
template <class T>
KOKKOS_INLINE_FUNCTION Jet2<T> operator-(const Jet2<T>& a, const Jet2<T>& b) {
  return {a.v - b.v, a.d - b.d, a.dd - b.dd};
}
template <class T>
KOKKOS_INLINE_FUNCTION Jet2<T> operator-(const Jet2<T>& a) {
  return {-a.v, -a.d, -a.dd};
}
template <class T>
KOKKOS_INLINE_FUNCTION Jet2<T> operator*(const Jet2<T>& a, const Jet2<T>& b) {
  return {a.v * b.v, a.d * b.v + a.v * b.d, a.dd * b.v + T(2) * a.d * b.d + a.v * b.dd};
}
template <class T>
KOKKOS_INLINE_FUNCTION Jet2<T> operator*(const Jet2<T>& a, T s) {
  return {a.v * s, a.d * s, a.dd * s};
}
template <class T>
KOKKOS_INLINE_FUNCTION Jet2<T> operator*(T s, const Jet2<T>& a) {
  return {a.v * s, a.d * s, a.dd * s};
}
template <class T>
KOKKOS_INLINE_FUNCTION Jet2<T> operator+(const Jet2<T>& a, T s) {
  return {a.v + s, a.d, a.dd};
}
template <class T>
KOKKOS_INLINE_FUNCTION Jet2<T> operator-(const Jet2<T>& a, T s) {
  return {a.v - s, a.d, a.dd};
}
template <class T>
KOKKOS_INLINE_FUNCTION Jet2<T> operator/(const Jet2<T>& a, T s) {
  return {a.v / s, a.d / s, a.dd / s};
}
template <class T>
KOKKOS_INLINE_FUNCTION Jet2<T>& operator+=(Jet2<T>& a, const Jet2<T>& b) {
  a.v += b.v;
  a.d += b.d;
  a.dd += b.dd;
  return a;
}
template <class T>
KOKKOS_INLINE_FUNCTION Jet2<T>& operator*=(Jet2<T>& a, T s) {
  a.v *= s;
  a.d *= s;
  a.dd *= s;
  return a;
}
// f(x(eps)): value f, first f1 x', second f2 x'^2 + f1 x''.
template <class T>
KOKKOS_INLINE_FUNCTION Jet2<T> chain(const Jet2<T>& x, T f, T f1, T f2) {
  return {f, f1 * x.d, f2 * x.d * x.d + f1 * x.dd};
}
template <class T>
KOKKOS_INLINE_FUNCTION Jet2<T> operator/(const Jet2<T>& a, const Jet2<T>& b) {
  const T r = T(1) / b.v;
  return a * chain(b, r, -r * r, T(2) * r * r * r);
}

// ---- mixed scalar-left operations ------------------------------------------
template <template <class> class J, class T>
KOKKOS_INLINE_FUNCTION J<T> operator+(T s, const J<T>& a) {
  return a + s;
}
template <template <class> class J, class T>
KOKKOS_INLINE_FUNCTION J<T> operator-(T s, const J<T>& a) {
  return -a + s;
}
template <class T>
KOKKOS_INLINE_FUNCTION Dual<T> operator/(T s, const Dual<T>& b) {
  return Dual<T>(s) / b;
}
template <class T>
KOKKOS_INLINE_FUNCTION Jet2<T> operator/(T s, const Jet2<T>& b) {
  return Jet2<T>(s) / b;
}

// ---- elementary functions, generic over T, Dual<T>, Jet2<T> -----------------
template <class T>
KOKKOS_INLINE_FUNCTION T jexp(T x) {
  return kmath::exp(x);
}
template <class T>
KOKKOS_INLINE_FUNCTION T jlog(T x) {
  return kmath::log(x);
}
template <class T>
KOKKOS_INLINE_FUNCTION T jsqrt(T x) {
  return kmath::sqrt(x);
}
template <class T>
KOKKOS_INLINE_FUNCTION T jerf(T x) {
  return kmath::erf(x);
}
template <class T>
KOKKOS_INLINE_FUNCTION T jtanh(T x) {
  return kmath::tanh(x);
}

template <template <class> class J, class T>
KOKKOS_INLINE_FUNCTION J<T> jexp(const J<T>& x) {
  const T e = kmath::exp(x.v);
  return chain(x, e, e, e);
}
template <template <class> class J, class T>
KOKKOS_INLINE_FUNCTION J<T> jlog(const J<T>& x) {
  const T r = T(1) / x.v;
  return chain(x, kmath::log(x.v), r, -r * r);
}
template <template <class> class J, class T>
KOKKOS_INLINE_FUNCTION J<T> jsqrt(const J<T>& x) {
  const T s = kmath::sqrt(x.v);
  return chain(x, s, T(0.5) / s, T(-0.25) / (s * x.v));
}
template <template <class> class J, class T>
KOKKOS_INLINE_FUNCTION J<T> jerf(const J<T>& x) {
  const T f1 = T(1.12837916709551257390) * kmath::exp(-x.v * x.v);  // 2/sqrt(pi) e^{-x^2}
  return chain(x, kmath::erf(x.v), f1, T(-2) * x.v * f1);
}
template <template <class> class J, class T>
KOKKOS_INLINE_FUNCTION J<T> jtanh(const J<T>& x) {
  const T t = kmath::tanh(x.v), f1 = T(1) - t * t;
  return chain(x, t, f1, T(-2) * t * f1);
}

}  // namespace gnh
