// SPDX-License-Identifier: BSD-3-Clause
// A row of FP32 values replaced in place by bfloat16 storage (16 bits a
// value over the first half of the row's bytes): the batched attention's
// probabilities, written over their own scores so that the products read 2
// bytes a value and no second buffer is needed.
#pragma once
#include <cstdint>

#include "core/bf16.hpp"
#include "core/types.hpp"

namespace gnh::kernels {

// Entries [0, w) of the row x become f(s) as bfloat16 (x reinterpreted as
// std::uint16_t), where f reads x's own FP32 entry s (no other of x's) and
// anything not written here. By rounds of the team's threads in order: a round's values
// are all read before any is written (a barrier), and a write of entry s
// lands on the bytes of entry s/2 <= s, read in this round or an earlier
// one, never on an entry a later round reads. Every thread of the team calls
// it (the barriers).
template <class Member, class T, class F>
KOKKOS_INLINE_FUNCTION void narrow_in_place(const Member& team, index_t w, T* x, const F& f) {
  static_assert(sizeof(T) >= 2 * sizeof(std::uint16_t), "narrowing needs values of at least 4 bytes");
  auto* h = reinterpret_cast<std::uint16_t*>(x);
  const index_t nt = team.team_size(), t = team.team_rank();
  for (index_t r = 0; r < w; r += nt) {
    const index_t s = r + t;
    const T v = s < w ? f(s) : T(0);
    team.team_barrier();
    if (s < w) h[s] = bf16_bits(float(v));
  }
}

}  // namespace gnh::kernels
