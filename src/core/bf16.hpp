// SPDX-License-Identifier: BSD-3-Clause
// bfloat16 rounding, emulated exactly on any backend: the value of a float
// rounded to the nearest bfloat16 (round to nearest, ties to even), returned
// as a float. NaN stays NaN (quieted, sign kept), +-Inf stay, finite values
// that round past the largest bfloat16 become +-Inf, subnormals round like
// every other value (bfloat16 has float's exponent range).
#pragma once
#include <cstdint>
#include <type_traits>
#include <cstring>

#include "core/jet.hpp"

namespace gnh {

KOKKOS_INLINE_FUNCTION float round_bf16(float x) {
  std::uint32_t bits;
  std::memcpy(&bits, &x, sizeof(bits));
  if ((bits & 0x7F800000u) == 0x7F800000u && (bits & 0x007FFFFFu) != 0) {
    bits = (bits | 0x00400000u) & 0xFFFF0000u;  // quiet NaN, truncated payload
  } else {
    const std::uint32_t lsb = (bits >> 16) & 1u;
    bits = (bits + 0x7FFFu + lsb) & 0xFFFF0000u;
  }
  float r;
  std::memcpy(&r, &bits, sizeof(r));
  return r;
}

// The bfloat16 storage of x (its 16 bits), rounded as round_bf16: what a
// bfloat16 GEMM (cuBLAS on tensor cores) reads.
KOKKOS_INLINE_FUNCTION std::uint16_t bf16_bits(float x) {
  const float r = round_bf16(x);
  std::uint32_t bits;
  std::memcpy(&bits, &r, sizeof(bits));
  return static_cast<std::uint16_t>(bits >> 16);
}

// The float a bfloat16 storage holds (exact).
KOKKOS_INLINE_FUNCTION float bf16_value(std::uint16_t b) {
  const std::uint32_t bits = std::uint32_t(b) << 16;
  float r;
  std::memcpy(&r, &bits, sizeof(r));
  return r;
}

// Double is never rounded (the fp64 policy), and jets round every component
// (primal and tangents are matrix-multiply operands alike).
KOKKOS_INLINE_FUNCTION double round_bf16(double x) { return x; }
template <class T>
KOKKOS_INLINE_FUNCTION Dual<T> round_bf16(const Dual<T>& x) {
  return {round_bf16(x.v), round_bf16(x.d)};
}
template <class T>
KOKKOS_INLINE_FUNCTION Jet2<T> round_bf16(const Jet2<T>& x) {
  return {round_bf16(x.v), round_bf16(x.d), round_bf16(x.dd)};
}

// x as a rounded operand stored in D: bfloat16 bits (std::uint16_t, from
// float), or the rounded value itself.
template <class D, class T>
KOKKOS_INLINE_FUNCTION D bf16_as(T x) {
  if constexpr (std::is_same<D, std::uint16_t>::value) return bf16_bits(float(x));
  else return D(round_bf16(x));
}

}  // namespace gnh
