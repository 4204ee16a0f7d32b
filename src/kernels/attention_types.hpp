// SPDX-License-Identifier: BSD-3-Clause
// What an engine holds for attention, without the kernels: its q, k and v
// buffers, which kernels it takes, and the batched path's working memory
// (attention.hpp, attention_batched.hpp).
#pragma once
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

// Score blocks per (sequence, query head) that a call keeps: the forward 1
// plane, with tangents 1 + K, second order 1 + 2K; the reverse 2, its
// tangent 2 + 2K.
inline index_t attention_score_planes(bool reverse, bool tangents, bool second, index_t K) {
  if (reverse) return tangents ? 2 + 2 * K : 2;
  return !tangents ? 1 : second ? 1 + 2 * K : 1 + K;
}

// The working memory of the batched path: the score planes of one chunk of
// sequences, and the mapped GEMMs' pointer arrays.
template <class T>
struct AttentionScratch {
  View1<T> scores;
  MappedScratch pointers;
  // Sequences per chunk for this many planes of H Tc^2 values (0: none fit).
  index_t sequences(index_t planes, index_t H, index_t Tc) const {
    return index_t(scores.extent(0)) / (planes * H * Tc * Tc);
  }
};

}  // namespace gnh::kernels
