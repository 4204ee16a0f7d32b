// SPDX-License-Identifier: BSD-3-Clause
// The shape an engine (Gpt<T>) is planned for, its tiles, and its memory as a
// function of the configuration and the shape: the engine allocates by these
// and the dry run prints them, so the two cannot disagree. No Kokkos here.
#pragma once
#include <cstddef>
#include <string>

#include "core/index.hpp"
#include "model/config.hpp"

namespace gnh {

struct Shape {
  index_t batch = 1;
  index_t context = 1;
  int directions = 0;         // K, for hvp and second_order
  bool reverse = false;       // gradient / hvp: keep every layer's activations
  bool second_order = false;  // second_order: second-derivative planes
  // second_order with adjoint cuts (model/gpt_impl.hpp): the x'' of each
  // linear layer's and the attention's input is contracted with the batch's
  // primal adjoint instead of multiplied through, which costs one adjoint pass
  // per batch and saves one of each dense layer's four GEMMs per direction.
  // -1: automatic (adjoint_cuts_of), 0: off, 1: on.
  int adjoint_cuts = -1;
  index_t head_chunk_rows = 0;   // rows of a logits tile (0: automatic)
  index_t head_chunk_vocab = 0;  // vocabulary entries of a logits tile (0: automatic)
  // The batched attention's sequences per chunk of score planes (0: as
  // attention_score_budget allows).
  index_t attention_sequences = 0;
  // The batched attention's causal query blocks per sequence (0: as
  // attention_query_blocks plans them).
  index_t attention_blocks = 0;
  // A miniature (bench_engine --predict): this engine's context, widths and
  // vocabulary are `scale` times smaller than those of the engine it stands
  // for, whose plan it takes where a plan counts extents: as many attention
  // chunks and head tiles (head_chunk_rows, where set, counts that engine's
  // rows), bf16-amp chunks scale^2 times smaller. Engines it plans inside
  // (the adjoint cuts' gradient engine) are miniatures too.
  int scale = 1;
  bool bf16 = false;  // bf16-amp: matrix-multiply operands rounded to bfloat16 (float only)
  bool tf32 = false;  // tf32: TF32 tensor-core GEMMs where the backend has them (cuBLAS)
  // An engine planned inside another (the adjoint cuts' gradient engine):
  // its memory is part of that engine's, so its score planes keep the budget
  // of an engine with directions (attention_score_budget).
  bool nested = false;
  // The GPU's kernels and tiles (the batched attention, the head's whole
  // vocabulary rows): always on a GPU; on a host for bench_engine --predict,
  // which counts the launches of that path.
  bool gpu_shaped = false;
};
// GNH_GPU_SHAPED=1 in the environment makes every engine GPU-shaped (the
// tests run the GPU's path on a host so); unset or 0, only those asked to be.
// Another value is an error naming it.
bool gpu_shaped_from_env();
// Whether every engine of this build runs the GPU's path whatever its Shape
// asks: a device execution space, or GNH_GPU_SHAPED=1 on a host. An engine
// is GPU-shaped where this holds or its Shape::gpu_shaped is set.
bool gpu_shaped_build();

// Forward FLOPs of one token at context T: the dense layers, the LM head and
// the causal attention (QK^T and PV over the s <= t pairs, on average (T+1)/2).
struct ForwardFlops {
  double dense = 0, head = 0, attention = 0;
  double total() const { return dense + head + attention; }
};
ForwardFlops forward_flops_per_token(const ModelConfig& cfg, index_t context);

// Whether an engine of this shape whose attention takes the batched GEMMs
// runs the attention's forward as the fused tensor-core kernel instead
// (kernels/attention_fused.hpp): under bf16-amp, with heads of at most 64
// columns, unless GNH_ATTENTION=batched asks for the batched GEMMs
// throughout. A second-order forward is fused only with adjoint cuts (x'' is
// zero at the attention); its reverse is always the batched GEMMs'.
bool attention_forward_fused(const ModelConfig& cfg, const Shape& shape);
// Whether the second order's linear layers after the norms run as pair
// products where they can (kernels/linear.hpp, pair_forward): yes unless
// GNH_LINEAR_PAIRS=0 (1 or unset: yes; anything else is refused).
bool linear_pairs_requested();

// Whether an engine of this shape runs the second order with adjoint cuts:
// Shape::adjoint_cuts 0 or 1, else GNH_ADJOINT_CUTS (0 or 1) where it is set,
// else when what they save (per direction, one of each dense layer's products
// and 1.5 of attention's two: K x those forward FLOPs) is at least 3 times
// what they cost (a forward and the adjoints' products: 2 forwards). Preset
// small: from K = 8; the reference model (dense layers 43% of the forward's
// FLOPs): from K = 12.
bool adjoint_cuts_of(const ModelConfig& cfg, const Shape& shape);
// GNH_ADJOINT_CUTS as this process reads it: "0" or "1" where it is set, else
// "auto" (the rule above). Cuts regroup the sums of every v^T H v, so the
// setting is recorded in the outputs; another value is an error naming it.
std::string adjoint_cuts_setting();

// The engine's tiles: the head's logits tile and the bf16-amp operand scratch,
// sized for the host's caches or, GPU-shaped, for a GPU's memory and
// multiprocessors.
struct GptTiles {
  index_t logits_rows = 0, logits_vocab = 0;  // the head's logits tile
  // bf16-amp operand scratch (elements; 0 without bf16): rows of A per chunk
  // come from bf16_chunk, and the two buffers hold a chunk (or a weight
  // block) for each of the K directions of a batched product.
  index_t bf16_chunk = 0, bf16_scratch_a = 0, bf16_scratch_b = 0;
  // A product alone (not a batch of K): GPU-shaped, the K chunks' room.
  index_t bf16_single_chunk = 0;
};
GptTiles gpt_tiles(const ModelConfig& cfg, const Shape& shape);
// Values of the batched attention's score planes (kernels/attention_batched.hpp)
// that an engine holds at once, for `planes` planes per (sequence, head): as
// many sequences per chunk as fit, at least one. On a device 2^25 a plane
// (128 MiB in float), and at least 2^28 values (1 GiB) for an engine with
// directions (or nested in one), 2^30 (4 GiB) for one without (the
// gradient's, whose memory no K = 1 limit binds and whose chunks are most of
// its launches): at the
// reference shape (5 heads, T = 1024: 5.2 M values a plane and sequence) the
// second order at K = 16 (33 planes) takes 6 sequences a chunk, 11 chunks a
// batch of 64, in 4.2 GB; the second order at K = 1 (3 planes) 17, in 1.1
// GB; the gradient (2 planes) the whole batch of 64 in one chunk, 2.7 GB,
// where the 1 GiB floor made it 3 chunks and a fifth of its time launches.
// On a host 2^20 a plane, where the path serves checks.
index_t attention_score_budget(bool device, index_t planes, bool directions);
// The batched attention's score planes per sequence of an engine of this
// shape, and its sequences per chunk: Shape::attention_sequences where set,
// else as many as attention_score_budget allows, at least one, at most the batch.
index_t attention_planes_per_sequence(const ModelConfig& cfg, const Shape& shape);
index_t attention_chunk_sequences(const ModelConfig& cfg, const Shape& shape);
// The batched attention's causal query blocks per sequence
// (kernels/attention_types.hpp): Shape::attention_blocks where set, else
// blocks of about kAttentionQueryRows rows of the context (a miniature: of
// the full engine's), at least one.
index_t attention_query_blocks(const Shape& shape);

// Every buffer an engine whose scalar has `scalar_bytes` bytes (4 or 8)
// allocates, counted by running its constructor without allocating
// (Gpt<T>::planned_bytes): the engine's own list of buffers is the only one.
std::size_t plan_gpt_bytes(const ModelConfig& cfg, const Shape& shape, std::size_t scalar_bytes);

}  // namespace gnh
