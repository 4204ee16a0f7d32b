// SPDX-License-Identifier: BSD-3-Clause
#include "model/config.hpp"

#include <cmath>

#include "core/error.hpp"

namespace gnh {

const char* to_string(Family f) {
  switch (f) {
    case Family::llama:
      return "llama";
    case Family::gpt_neox:
      return "gpt-neox";
    default:
      return "nanogpt";
  }
}

bool family_from_string(const std::string& s, Family& f) {
  for (Family c : {Family::nanogpt, Family::llama, Family::gpt_neox})
    if (s == to_string(c)) {
      f = c;
      return true;
    }
  return false;
}

int ModelConfig::rotary_dims() const {
  // HF: llama rotates every dim of a head; gpt-neox int(head_size * rotary_pct).
  if (family == Family::llama) return head_size();
  if (family == Family::gpt_neox) return int(std::floor(head_size() * rotary_pct));
  return 0;
}

void ModelConfig::validate(const std::string& where) const {
  auto positive = [&](const char* key, int v) {
    if (v <= 0) fail(where, ": config ", key, " = ", v, " must be positive");
  };
  positive("n_layer", n_layer);
  positive("n_head", n_head);
  positive("n_embd", n_embd);
  positive("block_size", block_size);
  positive("vocab_size", vocab_size);
  if (!(ln_eps > 0.0) || !std::isfinite(ln_eps))
    fail(where, ": config ln_eps = ", ln_eps, " must be positive and finite");
  if (family == Family::nanogpt) {
    if (n_embd % n_head != 0) fail(where, ": config n_head = ", n_head, " does not divide n_embd = ", n_embd);
    return;
  }
  if (head_dim <= 0 && n_embd % n_head != 0)
    fail(where, ": config n_head = ", n_head, " does not divide n_embd = ", n_embd, " and head_dim is not given");
  if (n_kv_head < 0 || head_dim < 0 || intermediate < 0)
    fail(where, ": config n_kv_head, head_dim and intermediate_size must be positive (or 0 for the default)");
  if (n_head % kv_heads() != 0) fail(where, ": config n_kv_head = ", kv_heads(), " does not divide n_head = ", n_head);
  if (family == Family::gpt_neox && kv_heads() != n_head)
    fail(where, ": config n_kv_head = ", kv_heads(), ": gpt-neox has as many key/value heads as heads");
  if (!(rope_theta > 0.0) || !std::isfinite(rope_theta))
    fail(where, ": config rope_theta = ", rope_theta, " must be positive and finite");
  if (!(rotary_pct >= 0.0 && rotary_pct <= 1.0)) fail(where, ": config rotary_pct = ", rotary_pct, " is not in [0, 1]");
  if (rotary_dims() % 2 != 0)
    fail(where, ": config rotary_pct = ", rotary_pct, " rotates ", rotary_dims(), " dims of ", head_size(),
         ", an odd number (rotate-half pairs dims)");
}

std::string ModelConfig::describe() const {
  std::string s = cat("n_layer=", n_layer, " n_head=", n_head, " n_embd=", n_embd, " block_size=", block_size,
                      " vocab_size=", vocab_size);
  switch (family) {
    case Family::nanogpt:
      return s + cat(" bias=", bias, " tie_embeddings=", tie_embeddings, " gelu=", to_string(gelu), " ln_eps=", ln_eps);
    case Family::llama:
      return cat("family=llama ", s, " n_kv_head=", kv_heads(), " head_dim=", head_size(),
                 " intermediate_size=", mlp_width(), " rms_norm_eps=", ln_eps, " rope_theta=", rope_theta,
                 " qkv_bias=", qkv_bias, " o_bias=", o_bias, " tie_embeddings=", tie_embeddings);
    case Family::gpt_neox:
      return cat("family=gpt-neox ", s, " head_dim=", head_size(), " intermediate_size=", mlp_width(),
                 " rotary_pct=", rotary_pct, " rotary_emb_base=", rope_theta, " layer_norm_eps=", ln_eps,
                 " use_parallel_residual=", parallel_residual, " gelu=", to_string(gelu), " attention_bias=", qkv_bias,
                 " tie_embeddings=", tie_embeddings);
  }
  return s;
}

bool ModelConfig::operator==(const ModelConfig& o) const {
  return family == o.family && n_layer == o.n_layer && n_head == o.n_head && n_embd == o.n_embd &&
         block_size == o.block_size && vocab_size == o.vocab_size && bias == o.bias &&
         tie_embeddings == o.tie_embeddings && gelu == o.gelu && ln_eps == o.ln_eps && kv_heads() == o.kv_heads() &&
         head_size() == o.head_size() && mlp_width() == o.mlp_width() && rope_theta == o.rope_theta &&
         rotary_pct == o.rotary_pct && parallel_residual == o.parallel_residual && qkv_bias == o.qkv_bias &&
         o_bias == o.o_bias;
}

}  // namespace gnh
