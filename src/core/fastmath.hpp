// SPDX-License-Identifier: BSD-3-Clause
// exp and erf for float without branches or library calls, so that loops over
// them vectorise and inline on every backend; double goes to the library.
// Accuracy (float against double over every 64th float, tests/unit/test_fastmath.cpp,
// which requires <= 4 ulp):
//   fexp: 1.2 ulp at most over [-87.3, 88.7]; 0 below (where expf underflows), +inf above.
//   ferf: 2.7 ulp of 1 (1.6e-7) at most everywhere, and 2.7 ulp relative for |x| < 1.
// The approximations: exp(x) = 2^n exp(r), n = round(x / ln 2), |r| <= ln2/2,
// exp(r) by its Taylor polynomial of degree 7 (remainder < 6e-9); erf(x) =
// x P(x^2) (degree 6) for |x| < 1, and 1 - exp(-x^2) Q(1/(1+|x|)) (degree 7)
// above, both least-squares fits in double on [0, 1] and [1, 4] (errors 4.6e-9
// relative and 2.8e-9 absolute before float rounding).
#pragma once
#include <Kokkos_Core.hpp>

#include <cstdint>
#include <cstring>

#include "core/compat.hpp"

namespace gnh {

// exp(xc) = 2^n exp(r) for xc within fexp's range: returns the polynomial
// exp(r) and sets n = round(xc / ln 2) (by the 1.5 * 2^23 shifter, round to
// nearest even).
KOKKOS_FORCEINLINE_FUNCTION float fexp_reduced(float xc, float& n) {
  const float shifter = 12582912.0f;
  const float t = xc * 1.44269504088896341f + shifter;
  n = t - shifter;
  const float r = (xc - n * 0.693145751953125f) - n * 1.428606765330187e-06f;  // ln 2 = hi + lo
  float p = 1.0f / 5040.0f;
  p = p * r + 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  return p * r + 1.0f;
}

// The float 2^e for -126 <= e <= 127.
KOKKOS_FORCEINLINE_FUNCTION float fexp_pow2(std::int32_t e) {
  const std::uint32_t b = static_cast<std::uint32_t>(e + 127) << 23;
  float s;
  std::memcpy(&s, &b, 4);
  return s;
}

KOKKOS_FORCEINLINE_FUNCTION float fexp(float x) {
  const float hi = 88.72283f, lo = -87.33654f;
  const float xc = x > hi ? hi : (x < lo ? lo : x);
  float n;
  const float p = fexp_reduced(xc, n);
  // 2^n in two halves, so that n = 128 (x near hi) does not overflow the exponent.
  const std::int32_t ni = static_cast<std::int32_t>(n);
  const std::int32_t n1 = ni / 2, n2 = ni - n1;
  const float y = p * fexp_pow2(n1) * fexp_pow2(n2);
  return x < lo ? 0.0f : (x > hi ? __builtin_huge_valf() : y);
}

// fexp's bits for x <= 88 (the arguments of the softmaxes and of erf's
// exp(-x^2) are <= 0), without fexp's guard for x near its overflow: there
// n = round(x / ln 2) reaches 128 and 2^n takes two factors; below 88, n <=
// 127 and one factor 2^n is a normal float (n >= -126 after the clamp), and
// p 2^n is rounded once, as p 2^n1 2^n2 was (the first product exact). A
// third fewer operations than fexp.
KOKKOS_FORCEINLINE_FUNCTION float fexp_bounded(float x) {
  const float hi = 88.0f, lo = -87.33654f;
  const float xc = x > hi ? hi : (x < lo ? lo : x);
  float n;
  const float p = fexp_reduced(xc, n);
  return x < lo ? 0.0f : p * fexp_pow2(static_cast<std::int32_t>(n));
}

// erf(x), and in e the exp(-x^2) it evaluates on the way (GELU's derivative
// needs both: Phi and phi at the same point share that exponential).
KOKKOS_FORCEINLINE_FUNCTION float ferf_exp(float x, float& e) {
  const float a = x < 0 ? -x : x;
  // |x| < 1: x P(x^2).
  const float z = x * x;
  float pa = 8.006965832101936e-05f;
  pa = pa * z - 0.0008053775109469395f;
  pa = pa * z + 0.005192960183760954f;
  pa = pa * z - 0.026856070576944755f;
  pa = pa * z + 0.11283634653479661f;
  pa = pa * z - 0.3761262976832201f;
  pa = pa * z + 1.1283791662327152f;
  const float small = x * pa;
  // |x| >= 1: 1 - exp(-x^2) Q(t), t = 1 / (1 + |x|).
  const float t = 1.0f / (1.0f + a);
  float q = -0.6359650204256889f;
  q = q * t + 1.379145892088255f;
  q = q * t - 0.6919271841895539f;
  q = q * t - 0.5909468405977016f;
  q = q * t + 0.4151507005577573f;
  q = q * t + 0.537166247400621f;
  q = q * t + 0.5669866265385325f;
  q = q * t - 0.00011891982670121591f;
  e = fexp_bounded(-z);
  const float big = 1.0f - e * q;
  const float r = a < 1.0f ? small : (x < 0 ? -big : big);
  return x != x ? x : r;  // NaN stays NaN
}

KOKKOS_FORCEINLINE_FUNCTION float ferf(float x) {
  float e;
  return ferf_exp(x, e);
}

// The scalar functions the kernels use: float gets the inline versions,
// double the library's.
KOKKOS_FORCEINLINE_FUNCTION float fast_exp(float x) { return fexp(x); }
KOKKOS_FORCEINLINE_FUNCTION double fast_exp(double x) { return kmath::exp(x); }
// For arguments <= 88 (a softmax's x - max or x - lse): fexp_bounded.
KOKKOS_FORCEINLINE_FUNCTION float fast_exp_bounded(float x) { return fexp_bounded(x); }
KOKKOS_FORCEINLINE_FUNCTION double fast_exp_bounded(double x) { return kmath::exp(x); }
KOKKOS_FORCEINLINE_FUNCTION float fast_erf(float x) { return ferf(x); }
KOKKOS_FORCEINLINE_FUNCTION double fast_erf(double x) { return kmath::erf(x); }
KOKKOS_FORCEINLINE_FUNCTION float fast_erf_exp(float x, float& e) { return ferf_exp(x, e); }
KOKKOS_FORCEINLINE_FUNCTION double fast_erf_exp(double x, double& e) {
  e = kmath::exp(-x * x);
  return kmath::erf(x);
}

}  // namespace gnh

namespace gnh {

// Sums (and maxima) over [0, n) in 16 interleaved partial accumulators, so
// that the compiler vectorises them without reassociating floating point (the
// order is fixed: lane j takes the terms i = j mod 16, then the lanes are added
// in order, whatever the backend).
template <class T, class F>
KOKKOS_INLINE_FUNCTION T lane_sum(std::int64_t n, const F& f) {
  constexpr int L = 16;
  T part[L];
  for (int j = 0; j < L; ++j) part[j] = T(0);
  std::int64_t i = 0;
  for (; i + L <= n; i += L)
    for (int j = 0; j < L; ++j) part[j] += f(i + j);
  for (int j = 0; i < n; ++i, ++j) part[j] += f(i);
  T s = T(0);
  for (int j = 0; j < L; ++j) s += part[j];
  return s;
}

// Two sums over the same terms at once: f(i, a, b) adds its terms to a and b.
template <class T, class F>
KOKKOS_INLINE_FUNCTION void lane_sum2(std::int64_t n, const F& f, T& a, T& b) {
  constexpr int L = 16;
  T pa[L], pb[L];
  for (int j = 0; j < L; ++j) pa[j] = pb[j] = T(0);
  std::int64_t i = 0;
  for (; i + L <= n; i += L)
    for (int j = 0; j < L; ++j) f(i + j, pa[j], pb[j]);
  for (int j = 0; i < n; ++i, ++j) f(i, pa[j], pb[j]);
  a = b = T(0);
  for (int j = 0; j < L; ++j) {
    a += pa[j];
    b += pb[j];
  }
}

template <class T>
KOKKOS_INLINE_FUNCTION T lane_max(std::int64_t n, const T* x) {
  constexpr int L = 16;
  if (n < L) {
    T m = x[0];
    for (std::int64_t i = 1; i < n; ++i) m = x[i] > m ? x[i] : m;
    return m;
  }
  T part[L];
  for (int j = 0; j < L; ++j) part[j] = x[j];
  std::int64_t i = L;
  for (; i + L <= n; i += L)
    for (int j = 0; j < L; ++j) part[j] = x[i + j] > part[j] ? x[i + j] : part[j];
  for (int j = 0; i < n; ++i, ++j) part[j] = x[i] > part[j] ? x[i] : part[j];
  T m = part[0];
  for (int j = 1; j < L; ++j) m = part[j] > m ? part[j] : m;
  return m;
}

}  // namespace gnh
