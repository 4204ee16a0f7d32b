// SPDX-License-Identifier: BSD-3-Clause
// The random directions of SPEC §4: splitmix64, and Rademacher vectors
//   key_k = splitmix64(s ^ splitmix64(k)),  v_k[i] = +1 if the top bit of
//   splitmix64(key_k ^ i) is 0, else -1.
// Pure integer arithmetic: the same seed gives the same directions on every
// backend, rank count and precision.
#pragma once
#include <cstdint>

#include "core/types.hpp"

namespace gnh {

KOKKOS_INLINE_FUNCTION std::uint64_t splitmix64(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  std::uint64_t z = x;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

KOKKOS_INLINE_FUNCTION std::uint64_t direction_key(std::uint64_t seed, std::uint64_t k) {
  return splitmix64(seed ^ splitmix64(k));
}

KOKKOS_INLINE_FUNCTION int rademacher(std::uint64_t key, std::uint64_t i) {
  return (splitmix64(key ^ i) >> 63) == 0 ? 1 : -1;
}

// Row r of dirs (K, P) = v_{first + r}.
template <class T>
void fill_rademacher(const ExecSpace& space, Span2<T> dirs, std::uint64_t seed, std::uint64_t first) {
  const index_t K = dirs.extent(0), P = dirs.extent(1);
  Kokkos::parallel_for(
      "gnh::random::rademacher", range(space, K * P), KOKKOS_LAMBDA(const index_t j) {
        const index_t r = j / P, i = j % P;
        dirs(r, i) = T(rademacher(direction_key(seed, first + std::uint64_t(r)), std::uint64_t(i)));
      });
}

}  // namespace gnh
