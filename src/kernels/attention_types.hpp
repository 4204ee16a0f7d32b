// SPDX-License-Identifier: BSD-3-Clause
// What an engine holds for attention, without the kernels: its q, k and v
// buffers, which kernels it takes, and the batched path's working memory
// (attention.hpp, attention_batched.hpp).
#pragma once
#include <algorithm>
#include <cstdlib>
#include <stdexcept>
#include <string>

#include "core/planes.hpp"
#include "kernels/gemm_mapped.hpp"

namespace gnh::kernels {

// q, k and v of an attention call, each with its planes: one buffer three
// times (nanoGPT's c_attn, GPT-NeoX's query_key_value) or three (Llama).
template <class T>
struct QkvActs {
  Act2<T> q, k, v;
};

// Which attention kernels a call takes: the host tiles (FP32 on a host with
// its sgemm, outside bf16-amp), the batched GEMMs (the default on a GPU), or
// the portable row kernels. GNH_ATTENTION=batched in the environment takes
// the batched GEMMs wherever they can run (the tests, the benchmarks);
// auto, or unset, the default.
enum class AttentionPath { tiles, batched, rows };
// GNH_ATTENTION as read here: true for batched, false for auto or unset;
// another value is an error naming it.
inline bool attention_batched_requested() {
  const char* env = std::getenv("GNH_ATTENTION");
  if (!env || !*env || std::string(env) == "auto") return false;
  if (std::string(env) == "batched") return true;
  throw std::invalid_argument(std::string("GNH_ATTENTION=") + env + ": expected auto or batched");
}

// Score blocks per (sequence, query head) that a call keeps: the forward 1
// plane, with tangents 1 + K, second order 1 + 2K; the reverse 2, its
// tangent 2 + 2K.
inline index_t attention_score_planes(bool reverse, bool tangents, bool second, index_t K) {
  if (reverse) return tangents ? 2 + 2 * K : 2;
  return !tangents ? 1 : second ? 1 + 2 * K : 1 + K;
}

// The causal query blocks of the batched path: a block of Tb query rows
// needs the keys up to its last row only, so its score products are Tb x e
// (e its end) instead of Tb x Tc, and the products that read the planes
// stop there too; the blocks' products cover (nb + 1) / (2 nb) of the
// square (5/8 at nb = 4). Each block is one more launch per product and
// reads the keys and values up to its end again, so blocks are large:
// kAttentionQueryRows rows of the context (at the reference shape, T = 1024,
// the H200 cost model predicts 256-row blocks 1.5-3.5% faster a pass than 128
// or 512). nb blocks of Tc rows have ceil(Tc / nb) rows each, the last what
// remains.
constexpr index_t kAttentionQueryRows = 256;
inline index_t attention_block_rows(index_t Tc, index_t blocks) {
  const index_t nb = std::clamp<index_t>(blocks, 1, Tc);
  return (Tc + nb - 1) / nb;
}
// Score values per (sequence, head) that the blocks of Tb rows compute: the
// sum over blocks of rows x end.
inline index_t attention_block_values(index_t Tc, index_t Tb) {
  index_t total = 0;
  for (index_t r = 0; r < Tc; r += Tb) {
    const index_t e = std::min(r + Tb, Tc);
    total += (e - r) * e;
  }
  return total;
}

// The working memory of the batched path: the score planes of one chunk of
// sequences, and the mapped GEMMs' pointer arrays.
template <class T>
struct AttentionScratch {
  View1<T> scores;
  MappedScratch pointers;
  // A forward with tangents' score operands, and bf16-amp's rounded q, k, v
  // (and the reverse's dy) of a chunk (attention_operand_values per sequence).
  View1<T> operands;
  // The most sequences a chunk takes (0: as many as the score planes hold):
  // the owner's plan, for which it sized the operands and pointer arrays.
  // Without it a call of fewer planes (a reverse engine's forward) would
  // take chunks of more sequences than those were sized for.
  index_t max_sequences = 0;
  // Causal query blocks per sequence (attention_block_rows): the owner's
  // plan; 1 computes whole Tc x Tc planes.
  index_t query_blocks = 1;
  // Under bf16-amp, a float forward's operands in bfloat16 storage (2 bytes
  // a value; on cuBLAS bfloat16 tensor cores); false keeps them as rounded
  // floats, the same values (tests compare the two bit for bit).
  bool bf16_storage = true;
  // Sequences per chunk for this many planes of H Tc^2 values (0: none fit).
  index_t sequences(index_t planes, index_t H, index_t Tc) const {
    const index_t fit = index_t(scores.extent(0)) / (planes * H * Tc * Tc);
    return max_sequences > 0 ? std::min(fit, max_sequences) : fit;
  }
};

}  // namespace gnh::kernels
