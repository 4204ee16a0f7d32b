// SPDX-License-Identifier: BSD-3-Clause
// Causal attention as batched GEMMs and row kernels: the GPU's shape of the
// host tiles' formulation (attention_host.cpp), the same quantities as
// attention.hpp's row kernels to rounding.
//
// The sequences are taken in chunks of Bc (as many as the caller's score
// scratch holds). For a chunk, each (direction, sequence, query head) has
// whole Tc x Tc score blocks, one per plane the mode needs; every product of
// the chunk is one mapped batched GEMM (gemm_mapped.hpp: cuBLAS batched on a
// GPU, tensor cores in TF32 under the tf32 policy) over (direction, sequence,
// key/value head, query head of its group), all K directions in the same
// call; a row kernel of one team per score row (Bc H Tc teams) does the
// softmax and its derivatives across every plane, its sums in the team's
// fixed tree order. The primal is formed once per chunk, not per direction.
// Every product goes by causal query blocks (AttentionScratch::query_blocks,
// attention_block_rows): a block's scores are computed against the keys up
// to its end only, the rows' entries after the query within the block are
// zeroed by the row kernel, and the products that read the planes stop at
// the block's end (the key side starts at the block's first row), so no
// product reads what was not written; entries past a row's block are never
// touched. At 4 blocks a product does 5/8 of the square's work.
//
//   forward:   S = scale Q K^T                        P, lse   y = P V
//              S' = scale (Q' K^T + Q K'^T)           P', lse' y' = P' V + P V'
//              S'' = scale (Q'' K^T + 2 Q' K'^T + Q K''^T)
//                                                     P'', lse'' y'' = P'' V + 2 P' V' + P V''
//   reverse:   S, dP = dy V^T                         P, D, dS = P (dP - D) scale
//              dq = dS K,  dk = sum_r dS^T Q,  dv = sum_r P^T dy   (r: the group's query heads)
//   tangent of the reverse: S', dP' = dy' V^T + dy V'^T, and
//              dS' = (P' (dP - D) + P (dP' - D')) scale,  D' = dy'.y + dy.y',
//              dq' = dS' K + dS K',  dk' = sum_r dS'^T Q + dS^T Q',  dv' = sum_r P'^T dy + P^T dy'
// With GQA a key/value head's dk, dv accumulate over its query heads in
// order r = 0, 1, ..., one batched call each, so no two products of a call
// write the same output and the bits do not depend on the thread count.
//
// With tangents the score planes' products take a concatenated inner
// dimension, each plane written by one product (no plane read back):
// S' = scale [Q' | Q] [K | K']^T, S'' = scale [Q | Q'' | 2Q'] [K'' | K | K']^T,
// and in the reverse dP' = [dY' | dY] [V | V']^T, from per-direction copies
// of those blocks (the score operands).
//
// Memory: attention_score_planes() planes of Bc H Tc^2 values; the pointer
// arrays of a queue of products (3 MappedQueue::kMax K Bc H pointers); the
// score operands and under bf16-amp the chunk's rounded operands
// (attention_operand_values).
#pragma once
#include "kernels/attention.hpp"
#include "kernels/gemm_mapped.hpp"

namespace gnh::kernels {

// x_second false (Jet2): x'' is taken as zero (its products skipped).
// bf16 (bf16-amp): every GEMM operand (q, k, v, dy, and the probabilities
// and score adjoints the row kernels write) rounded to bfloat16, the scores,
// softmax and accumulation FP32: the rounding of the row kernels in
// attention.hpp. Rounded operands are exact in TF32, so on cuBLAS the
// products run on TF32 tensor cores (tf32 or not) with the bits of bfloat16
// products.
template <class S>
void attention_forward_batched(const ExecSpace& space, Act2<base_t<S>> y, Act1<base_t<S>> lse, QkvActs<base_t<S>> x,
                               const QkvLayout& L, index_t B, index_t Tc, bool tf32, bool bf16, bool x_second,
                               const AttentionScratch<base_t<S>>& scratch);

// dx is overwritten; D is a (B*H*T) scratch of the same mode.
template <class S>
void attention_reverse_batched(const ExecSpace& space, QkvActs<base_t<S>> dx, Act1<base_t<S>> D, Act2<base_t<S>> dy,
                               QkvActs<base_t<S>> x, Act2<base_t<S>> y, Act1<base_t<S>> lse, const QkvLayout& L,
                               index_t B, index_t Tc, bool tf32, bool bf16, const AttentionScratch<base_t<S>>& scratch);

// Columns of v's rows that attention reads, from its first (L.off[2]).
inline index_t attention_v_columns(const QkvLayout& L) { return (L.G - 1) * L.stride[2] + L.hs; }

// Values per sequence of the operand scratch (AttentionScratch::operands)
// that one call needs. A call with tangents (score_ops; K directions) holds
// its score operands: a forward's K rows of H (xs ? 4 : 2) hs + G (xs ? 3 :
// 2) hs values per token (xs: second order with x'' nonzero), a reverse's
// 4 (H + G) hs. Under bf16-amp a forward with tangents holds v's `planes`
// planes rounded besides, any other call the rounded planes of q, k and v
// (`width` columns in all: one buffer or three) and, in the reverse, of dy
// (H hs columns). half: a forward's operands in bfloat16 storage
// (AttentionScratch::bf16_storage, float): half the values, each of its (at
// most three) buffers rounded up to a whole value.
inline index_t attention_operand_values(const QkvLayout& L, index_t Tc, index_t width, bool reverse, index_t planes,
                                        bool score_ops, bool xs, bool bf16, index_t K, bool half = false) {
  const index_t rounded = bf16 ? Tc * (width + (reverse ? L.H * L.hs : 0)) * planes : 0;
  index_t values = rounded;
  if (score_ops && reverse) values = K * Tc * 4 * (L.H + L.G) * L.hs + rounded;
  else if (score_ops)
    values =
        K * Tc * (L.H * (xs ? 4 : 2) + L.G * (xs ? 3 : 2)) * L.hs + (bf16 ? Tc * attention_v_columns(L) * planes : 0);
  return half && bf16 && !reverse ? (values + 1) / 2 + 3 : values;
}

const char* attention_path_name(AttentionPath p);
// gpu_shaped: the engine runs the GPU's kernels and tiles (on a GPU always;
// on a host for the launch count of bench_engine --predict).
template <class T>
AttentionPath attention_path(bool bf16, bool gpu_shaped);

#define GNH_ATTENTION_BATCHED_FORWARD(EXT, S)                                                                        \
  EXT template void attention_forward_batched<S>(const ExecSpace&, Act2<base_t<S>>, Act1<base_t<S>>,                 \
                                                 QkvActs<base_t<S>>, const QkvLayout&, index_t, index_t, bool, bool, \
                                                 bool, const AttentionScratch<base_t<S>>&);
#define GNH_ATTENTION_BATCHED_REVERSE(EXT, S)                                                                      \
  EXT template void attention_reverse_batched<S>(                                                                  \
      const ExecSpace&, QkvActs<base_t<S>>, Act1<base_t<S>>, Act2<base_t<S>>, QkvActs<base_t<S>>, Act2<base_t<S>>, \
      Act1<base_t<S>>, const QkvLayout&, index_t, index_t, bool, bool, const AttentionScratch<base_t<S>>&);
#define GNH_ATTENTION_BATCHED(EXT, T)                        \
  GNH_FORWARD_SCALARS(GNH_ATTENTION_BATCHED_FORWARD, EXT, T) \
  GNH_REVERSE_SCALARS(GNH_ATTENTION_BATCHED_REVERSE, EXT, T) \
  EXT template AttentionPath attention_path<T>(bool, bool);
GNH_ATTENTION_BATCHED(extern, float)
GNH_ATTENTION_BATCHED(extern, double)

}  // namespace gnh::kernels
