// SPDX-License-Identifier: BSD-3-Clause
// Tiled causal attention for one-thread host execution on FP32 data, built on
// a host sgemm (host_gemm.hpp): per (batch, head) and per tile of TQ query
// rows, the scores of the tile against its keys go through GEMMs into a TQ x T
// scratch block (never T x T), the softmax is applied row by row, and the
// outputs come from GEMMs again. The same quantities as attention.hpp's
// portable kernels (which it replaces when available), to rounding.
//
// Each forward call covers the (sequence, head) pairs bh0 <= b*H + h < bh1,
// and each reverse call the (sequence, key/value head) units below, which
// share nothing: threads on one rank take disjoint ranges (for_ranges in
// host_parallel.hpp), and the result has the same bits at any thread count.
//
// Layouts as in attention.hpp: q, k and v columns where a QkvLayout puts
// them, in one buffer or three (Qkv3: each part's plane 0 and row stride);
// y, dy rows (ld H*hs); lse, D indexed (b*H + h)*T + t. Tangent planes are
// (K, N, cols) blocks, direction k of part i at k*N*ld[i] from its plane 0.
#pragma once
#include <cstdint>

namespace gnh::kernels {

// Where attention finds each head's columns: query head h at column off[0] +
// h stride[0] of the q rows; key/value head j at off[1] + j stride[1] of the
// k rows and off[2] + j stride[2] of the v rows. Query head h reads key/value
// head floor(h G / H) (grouped-query attention; G = H is multi-head).
struct QkvLayout {
  std::int64_t H = 0, G = 0, hs = 0;
  std::int64_t off[3] = {0, 0, 0}, stride[3] = {0, 0, 0};
  // Rows [q (H hs) | k (G hs) | v (G hs)] in one buffer (nanoGPT's c_attn: G = H).
  static QkvLayout fused(std::int64_t H, std::int64_t G, std::int64_t hs) {
    return {H, G, hs, {0, H * hs, (H + G) * hs}, {hs, hs, hs}};
  }
  // Rows of H heads, each [q | k | v] (GPT-NeoX's query_key_value).
  static QkvLayout interleaved(std::int64_t H, std::int64_t hs) {
    return {H, H, hs, {0, hs, 2 * hs}, {3 * hs, 3 * hs, 3 * hs}};
  }
  // q (H hs), k and v (G hs each) in buffers of their own (Llama's projections).
  static QkvLayout separate(std::int64_t H, std::int64_t G, std::int64_t hs) {
    return {H, G, hs, {0, 0, 0}, {hs, hs, hs}};
  }
  // Query heads per key/value head.
  std::int64_t group() const { return H / G; }
  bool valid() const { return H > 0 && G > 0 && hs > 0 && H % G == 0; }
};

// One plane of each of q, k, v (possibly the same buffer) and their row strides.
template <class F>
struct Qkv3 {
  F* p[3] = {nullptr, nullptr, nullptr};
  std::int64_t ld[3] = {0, 0, 0};
};

}  // namespace gnh::kernels

namespace gnh::kernels::host {

// Whether the tiled kernels can run: on gnh's sgemm for this CPU, or else on
// the vendor BLAS linked in (Arm; GNH_HOST_GEMM=vendor).
bool attention_available();

// The probabilities of one (sequence, head) as the primal forward can keep
// them for the reverse: each tile's TQ x t1 block (masked entries 0), one
// after the other; this many floats per (sequence, head).
std::int64_t attention_kept_elements(std::int64_t T);

// Primal forward over the (sequence, query head) pairs bh0 <= b*H + h < bh1:
// y, lse from x; with keep_p, the probabilities of pair bh into keep_p + bh *
// attention_kept_elements(T).
void attention_forward(float* y, float* lse, Qkv3<const float> x, const QkvLayout& L, std::int64_t B, std::int64_t T,
                       std::int64_t bh0, std::int64_t bh1, float* keep_p = nullptr);

// Second-order forward for K directions over the pairs bh0..bh1: planes v, d
// (K blocks), dd (K blocks) of y and lse from those of x (xd, xdd: each
// part's first tangent and second-order plane); xdd's pointers null: x'' is
// zero (its products skipped).
void attention_forward_jet2(float* y, float* yd, float* ydd, float* lse, float* lsed, float* lsedd, Qkv3<const float> x,
                            Qkv3<const float> xd, Qkv3<const float> xdd, std::int64_t K, const QkvLayout& L,
                            std::int64_t B, std::int64_t T, std::int64_t bh0, std::int64_t bh1);

// Tangent forward for K directions: planes v, d of y and lse.
void attention_forward_dual(float* y, float* yd, float* lse, float* lsed, Qkv3<const float> x, Qkv3<const float> xd,
                            std::int64_t K, const QkvLayout& L, std::int64_t B, std::int64_t T, std::int64_t bh0,
                            std::int64_t bh1);

// The reverse runs over (sequence, key/value head) units u0 <= b*G + j < u1:
// each unit's query heads in order, so that its dk, dv columns are written by
// its range alone.

// Tangent of the reverse for K directions: planes v, d of dx (overwritten,
// the layout and row strides of x) and D from those of dy, x, y and lse.
void attention_reverse_dual(Qkv3<float> dx, Qkv3<float> dxd, float* D, float* Dd, const float* dy, const float* dyd,
                            Qkv3<const float> x, Qkv3<const float> xd, const float* y, const float* yd,
                            const float* lse, const float* lsed, std::int64_t K, const QkvLayout& L, std::int64_t B,
                            std::int64_t T, std::int64_t u0, std::int64_t u1);

// Primal reverse: dx (overwritten) and D = rowwise dy.y from dy, x, y, lse;
// with kept_p (the forward's keep_p), its probabilities rather than the
// scores and softmax again.
void attention_reverse(Qkv3<float> dx, float* D, const float* dy, Qkv3<const float> x, const float* y, const float* lse,
                       const QkvLayout& L, std::int64_t B, std::int64_t T, std::int64_t u0, std::int64_t u1,
                       const float* kept_p = nullptr);

}  // namespace gnh::kernels::host
