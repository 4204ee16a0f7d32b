// SPDX-License-Identifier: BSD-3-Clause
// The causal attention's forward as one kernel on bfloat16 tensor cores
// (bf16-amp), its score planes never written to memory: the GPU's path for a
// forward of the primal, its tangents, or its second order with x'' zero (an
// engine with adjoint cuts), where attention_batched.hpp writes every plane
// of every direction and reads it back.
//
// The primal and the tangents: a team takes 32 query rows of one (sequence,
// query head, direction), as two warps of 16 rows (one 16 x 16 x 16 bfloat16
// tensor-core product at a time: CUDA's WMMA on sm_80 and later; the same
// tiles emulated in FP32 elsewhere, so the host runs the GPU's algorithm). It
// walks the keys up to its last row in tiles of 32, twice:
//   - the statistics: S = scale Q K^T, S' = scale (Q' K^T + Q K'^T) per tile
//     into shared memory, and per row the running maximum m and the sums l =
//     sum e, a1 = sum e s', e = exp(s - m) (rescaled as m grows); then lse =
//     m + log l, lse' = a1 / l: attention_batched.hpp's row statistics;
//   - the outputs: the score tiles again, and from them p = exp(s - lse) and
//     p' = p (s' - lse') rounded to bfloat16 (the batched path's
//     probabilities, to the FP32 rounding of their sums), then y = P V
//     (direction 0's team), y' = P' V + P V' accumulated in FP32 tensor-core
//     fragments.
// The second order (x'' zero: an engine with adjoint cuts) has y'' only to
// contract it with the cut's adjoint a at y, so it never forms it. The
// primal's kernel runs first (y, lse); then a team per 32 query rows of
// (sequence, query head, direction) walks the keys once: per tile S, S',
// S'' = 2 scale Q' K'^T, G = A V^T and H = A V'^T, p = exp(s - lse) rounded,
// P s' rounded in two bfloat16 parts (high, rest), and y' += (P s') V + P V'
// (9 products of the head's width a tile, against 12 in two walks); per row
// (two lanes, each over half the keys in a fixed order) the sums of p, p s',
// p (s'^2 + s''), p g, p s' g, p (s'^2 + s'') g, p h and p s' h. After the
// walk lse' = mu, lse'' = nu (the moments over sum p), y' less mu y (the
// primal's FP32 y; P s' in two parts keeps this subtraction exact where mu
// is far from the spread of s'), and <a, y''> = sum p [(s' - mu)^2 + s'' -
// nu] g + 2 p (s' - mu) h from the moments, one value per (direction, head,
// row); a third kernel sums each row's heads in order into the cut.
// Every operand is rounded to bfloat16 as it is staged in shared memory, so
// no copy of q, k or v is made. Nothing depends on a host value, and no
// launch on more than the previous one's outputs.
//
// Heads of at most kFusedWidth columns (padded to a multiple of 16 with
// zeros); wider ones, x'' nonzero, double and FP32/TF32 policies take the
// batched path. Team scratch: attention_fused_scratch_bytes, at most 45,440
// bytes (the second order at heads of 64), within the 48 KB of shared memory a
// CUDA block has without opting in (attention_fused_scratch_limit).
#pragma once
#include <cstddef>

#include "core/jet.hpp"
#include "core/planes.hpp"
#include "kernels/attention_host.hpp"
#include "kernels/attention_types.hpp"
#include "kernels/instances.hpp"
#include "kernels/room.hpp"

namespace gnh::kernels {

constexpr index_t kFusedQueryRows = 32, kFusedKeyRows = 32, kFusedWidth = 64;

// Team scratch bytes of a call: tangents (Dual or Jet2), second (Jet2).
std::size_t attention_fused_scratch_bytes(index_t hs, bool tangents, bool second);
// The reverse's team scratch for heads of hs columns (either of its two kernels).
std::size_t attention_fused_reverse_scratch_bytes(index_t hs);
// The team scratch one fused team may request on this backend (CUDA: the
// block's shared memory less what Kokkos keeps beside a team of its size).
std::size_t attention_fused_scratch_limit();

// Whether the fused forward can take a call: a valid layout whose heads are
// at most kFusedWidth wide and whose scratch the backend's teams can have.
bool attention_fused_fits(const QkvLayout& L, bool tangents, bool second);

// The second order's cut at the attention's output: acc(k, n) += <adj(n),
// y''_k(n)>, y'' never formed; partial: K H N floats of scratch (each head's
// share, summed over the heads in order).
struct FusedCut {
  Act2<float> adj;
  View2<double> acc;
  float* partial = nullptr;
};

// y (and y'), lse (and lse', lse'') of B sequences of Tc rows in mode S
// (float, Dual<float>, Jet2<float> with x'' zero), bf16-amp's rounding; with
// Jet2 y'' is contracted with cut's adjoint instead of written (cut needed).
// rounded (not null: Bf16Storage<float>, kernels/blas.hpp): y and y' written
// there instead, as the output projection's rounded input
// (kernels/linear.hpp, rounded_input_room), laid as room says (y in each of
// its copies; no rows: y's N rows, then each y''s); keep_y: the primal's y
// written too (the gradient engine's reverse reads it in FP32; with Jet2
// always).
template <class S>
void attention_forward_fused(const ExecSpace& space, Act2<float> y, Act1<float> lse, QkvActs<float> x,
                             const QkvLayout& L, index_t B, index_t Tc, void* rounded = nullptr, bool keep_y = false,
                             const FusedCut* cut = nullptr, RoomLayout room = {});

// Whether the fused reverse can take a call (as attention_fused_fits).
bool attention_fused_reverse_fits(const QkvLayout& L);

// The reverse of the primal under bf16-amp (attention_batched.hpp's
// attention_reverse_batched, primal): dx overwritten, D = dy . y per row
// written; lse the forward's. Two launches: the query side (dq, D), then
// the key side (dk, dv), each output written by one team. rounded (not
// null: Bf16Storage<float>, kernels/blas.hpp; dx one buffer): dx also
// written there, rounded as the input projection's products read it (the
// room with_rounded_adjoint rounds it into); fp32 false: there alone.
void attention_reverse_fused(const ExecSpace& space, QkvActs<float> dx, Act1<float> D, Act2<float> dy, QkvActs<float> x,
                             Act2<float> y, Act1<float> lse, const QkvLayout& L, index_t B, index_t Tc,
                             void* rounded = nullptr, bool fp32 = true);

#define GNH_ATTENTION_FUSED_FORWARD(EXT, S)                                                                      \
  EXT template void attention_forward_fused<S>(const ExecSpace&, Act2<float>, Act1<float>, QkvActs<float>,       \
                                               const QkvLayout&, index_t, index_t, void*, bool, const FusedCut*, \
                                               RoomLayout);
GNH_FORWARD_SCALARS(GNH_ATTENTION_FUSED_FORWARD, extern, float)

}  // namespace gnh::kernels
