// SPDX-License-Identifier: BSD-3-Clause
// Tiled causal attention for one-thread host execution on FP32 data, built on
// a host sgemm (host_gemm.hpp): per (batch, head) and per tile of TQ query
// rows, the scores of the tile against its keys go through GEMMs into a TQ x T
// scratch block (never T x T), the softmax is applied row by row, and the
// outputs come from GEMMs again. The same quantities as attention.hpp's
// portable kernels (which it replaces when available), to rounding.
//
// Each call covers the (sequence, head) pairs bh0 <= b*H + h < bh1, which
// share nothing: threads on one rank take disjoint ranges (for_ranges in
// host_parallel.hpp), and the result has the same bits at any thread count.
//
// Layouts as in attention.hpp: qkv rows (ld 3C) = [q | k | v], head h owns
// columns h*hs..; y, dy rows (ld C); lse, D indexed (b*H + h)*T + t. Tangent
// planes are (K, N, cols) blocks, direction k at offset k*N*cols.
#pragma once
#include <cstdint>

namespace gnh::kernels::host {

// Whether the tiled kernels can run: on gnh's sgemm for this CPU, or else on
// the vendor BLAS linked in (Arm; GNH_HOST_GEMM=vendor).
bool attention_available();

// The probabilities of one (sequence, head) as the primal forward can keep
// them for the reverse: each tile's TQ x t1 block (masked entries 0), one
// after the other; this many floats per (sequence, head).
std::int64_t attention_kept_elements(std::int64_t T);

// Primal forward: y, lse from qkv; with keep_p, the probabilities of pair bh
// into keep_p + bh * attention_kept_elements(T).
void attention_forward(float* y, float* lse, const float* qkv, std::int64_t B, std::int64_t T, std::int64_t H,
                       std::int64_t hs, std::int64_t bh0, std::int64_t bh1, float* keep_p = nullptr);

// Second-order forward for K directions: planes v, d (K blocks), dd (K blocks)
// of y and lse from those of qkv; qkvdd null: qkv'' is zero (its products skipped).
void attention_forward_jet2(float* y, float* yd, float* ydd, float* lse, float* lsed, float* lsedd, const float* qkv,
                            const float* qkvd, const float* qkvdd, std::int64_t K, std::int64_t B, std::int64_t T,
                            std::int64_t H, std::int64_t hs, std::int64_t bh0, std::int64_t bh1);

// Tangent forward for K directions: planes v, d of y and lse.
void attention_forward_dual(float* y, float* yd, float* lse, float* lsed, const float* qkv, const float* qkvd,
                            std::int64_t K, std::int64_t B, std::int64_t T, std::int64_t H, std::int64_t hs,
                            std::int64_t bh0, std::int64_t bh1);

// Tangent of the reverse for K directions: planes v, d of dqkv (overwritten)
// and D from those of dy, qkv, y and lse.
void attention_reverse_dual(float* dqkv, float* dqkvd, float* D, float* Dd, const float* dy, const float* dyd,
                            const float* qkv, const float* qkvd, const float* y, const float* yd, const float* lse,
                            const float* lsed, std::int64_t K, std::int64_t B, std::int64_t T, std::int64_t H,
                            std::int64_t hs, std::int64_t bh0, std::int64_t bh1);

// Primal reverse: dqkv (overwritten) and D = rowwise dy.y from dy, qkv, y, lse;
// with kept_p (the forward's keep_p), its probabilities rather than the
// scores and softmax again.
void attention_reverse(float* dqkv, float* D, const float* dy, const float* qkv, const float* y, const float* lse,
                       std::int64_t B, std::int64_t T, std::int64_t H, std::int64_t hs, std::int64_t bh0,
                       std::int64_t bh1, const float* kept_p = nullptr);

}  // namespace gnh::kernels::host
