// SPDX-License-Identifier: BSD-3-Clause
// Plain double-precision host references of every op and of the whole model,
// written as directly from the definitions as possible (no tricks shared with
// the kernels: full softmax instead of online, materialised logits).
#pragma once
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "model/config.hpp"
#include "model/layout.hpp"

namespace gnh::ref {

using Vec = std::vector<double>;

inline Vec random_vec(std::size_t n, std::uint64_t seed, double scale = 1.0, double shift = 0.0) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> nd(0.0, 1.0);
  Vec v(n);
  for (auto& x : v) x = shift + scale * nd(rng);
  return v;
}

// y (N, out) = x (N, in) W^T (out, in) + b
inline Vec linear(const Vec& x, const Vec& w, const Vec* b, std::size_t N, std::size_t in, std::size_t out) {
  Vec y(N * out);
  for (std::size_t n = 0; n < N; ++n)
    for (std::size_t o = 0; o < out; ++o) {
      double s = b ? (*b)[o] : 0.0;
      for (std::size_t i = 0; i < in; ++i) s += x[n * in + i] * w[o * in + i];
      y[n * out + o] = s;
    }
  return y;
}

inline Vec layernorm(const Vec& x, const Vec& w, const Vec* b, std::size_t N, std::size_t C, double eps) {
  Vec y(N * C);
  for (std::size_t n = 0; n < N; ++n) {
    double mu = 0, var = 0;
    for (std::size_t c = 0; c < C; ++c) mu += x[n * C + c];
    mu /= double(C);
    for (std::size_t c = 0; c < C; ++c) var += (x[n * C + c] - mu) * (x[n * C + c] - mu);
    var /= double(C);
    for (std::size_t c = 0; c < C; ++c)
      y[n * C + c] = (x[n * C + c] - mu) / std::sqrt(var + eps) * w[c] + (b ? (*b)[c] : 0.0);
  }
  return y;
}

inline double gelu(double x, Gelu kind) {
  if (kind == Gelu::erf) return 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0)));
  const double pi = std::acos(-1.0);
  return 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / pi) * (x + 0.044715 * x * x * x)));
}

// qkv (B*T, 3C) -> y (B*T, C), causal softmax attention with H heads.
inline Vec attention(const Vec& qkv, std::size_t B, std::size_t T, std::size_t C, std::size_t H) {
  const std::size_t hs = C / H;
  Vec y(B * T * C, 0.0);
  for (std::size_t b = 0; b < B; ++b)
    for (std::size_t h = 0; h < H; ++h)
      for (std::size_t t = 0; t < T; ++t) {
        Vec s(t + 1);
        double m = -INFINITY;
        for (std::size_t u = 0; u <= t; ++u) {
          double d = 0;
          for (std::size_t k = 0; k < hs; ++k)
            d += qkv[(b * T + t) * 3 * C + h * hs + k] * qkv[(b * T + u) * 3 * C + C + h * hs + k];
          s[u] = d / std::sqrt(double(hs));
          m = std::max(m, s[u]);
        }
        double z = 0;
        for (auto& e : s) z += (e = std::exp(e - m));
        for (std::size_t u = 0; u <= t; ++u)
          for (std::size_t k = 0; k < hs; ++k)
            y[(b * T + t) * C + h * hs + k] += s[u] / z * qkv[(b * T + u) * 3 * C + 2 * C + h * hs + k];
      }
  return y;
}

// Per-row cross-entropy of logits h W^T against targets (0 where target < 0).
inline Vec xent_rows(const Vec& h, const Vec& w, const std::vector<std::int32_t>& targets, std::size_t N, std::size_t C,
                     std::size_t V) {
  const Vec z = linear(h, w, nullptr, N, C, V);
  Vec loss(N, 0.0);
  for (std::size_t n = 0; n < N; ++n) {
    if (targets[n] < 0) continue;
    double m = -INFINITY, s = 0;
    for (std::size_t v = 0; v < V; ++v) m = std::max(m, z[n * V + v]);
    for (std::size_t v = 0; v < V; ++v) s += std::exp(z[n * V + v] - m);
    loss[n] = m + std::log(s) - z[n * V + static_cast<std::size_t>(targets[n])];
  }
  return loss;
}

// Whole-model mean loss over the valid targets of one (B, T) batch.
inline double model_loss(const ModelConfig& cfg, const Vec& p, const std::vector<std::int32_t>& tokens,
                         const std::vector<std::int32_t>& targets, std::size_t B, std::size_t T) {
  const ParamLayout L(cfg);
  const std::size_t C = cfg.n_embd, V = cfg.vocab_size, N = B * T;
  auto slice = [&](std::int64_t off, std::size_t n) {
    return off < 0 ? Vec() : Vec(p.begin() + off, p.begin() + off + static_cast<std::int64_t>(n));
  };
  auto opt = [](const Vec& v) { return v.empty() ? nullptr : &v; };
  Vec x(N * C);
  for (std::size_t n = 0; n < N; ++n)
    for (std::size_t c = 0; c < C; ++c) x[n * C + c] = p[L.wte + tokens[n] * C + c] + p[L.wpe + (n % T) * C + c];
  for (const auto& o : L.blocks) {
    const Vec b1 = slice(o.ln1_b, C), ba = slice(o.attn_b, 3 * C), bp = slice(o.attn_proj_b, C);
    const Vec b2 = slice(o.ln2_b, C), bf = slice(o.fc_b, 4 * C), bfp = slice(o.fc_proj_b, C);
    const Vec h1 = layernorm(x, slice(o.ln1_w, C), opt(b1), N, C, cfg.ln_eps);
    const Vec qkv = linear(h1, slice(o.attn_w, 3 * C * C), opt(ba), N, C, 3 * C);
    const Vec att = attention(qkv, B, T, C, cfg.n_head);
    const Vec pr = linear(att, slice(o.attn_proj_w, C * C), opt(bp), N, C, C);
    for (std::size_t i = 0; i < N * C; ++i) x[i] += pr[i];
    const Vec h2 = layernorm(x, slice(o.ln2_w, C), opt(b2), N, C, cfg.ln_eps);
    Vec f = linear(h2, slice(o.fc_w, 4 * C * C), opt(bf), N, C, 4 * C);
    for (auto& e : f) e = gelu(e, cfg.gelu);
    const Vec pr2 = linear(f, slice(o.fc_proj_w, 4 * C * C), opt(bfp), N, 4 * C, C);
    for (std::size_t i = 0; i < N * C; ++i) x[i] += pr2[i];
  }
  const Vec bf = slice(L.lnf_b, C);
  const Vec hf = layernorm(x, slice(L.lnf_w, C), opt(bf), N, C, cfg.ln_eps);
  const Vec rows = xent_rows(hf, slice(L.lm_head, V * C), targets, N, C, V);
  double s = 0;
  std::size_t count = 0;
  for (std::size_t n = 0; n < N; ++n)
    if (targets[n] >= 0) {
      s += rows[n];
      ++count;
    }
  return s / double(count);
}

}  // namespace gnh::ref
