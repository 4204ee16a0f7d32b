// SPDX-License-Identifier: BSD-3-Clause
// The model families: nanoGPT (SPEC §1), Llama and GPT-NeoX (SPEC §11).
#pragma once
#include <string>

#include "core/gelu_kind.hpp"

namespace gnh {

enum class Family { nanogpt, llama, gpt_neox };

// "nanogpt", "llama", "gpt-neox" (the checkpoint's /config family).
const char* to_string(Family f);
// The family of that name; false if there is none.
bool family_from_string(const std::string& s, Family& f);

struct ModelConfig {
  Family family = Family::nanogpt;
  int n_layer = 0;
  int n_head = 0;
  int n_embd = 0;      // hidden_size
  int block_size = 0;  // the longest context analysed (max_position_embeddings for §11)
  int vocab_size = 0;
  bool bias = true;  // nanogpt: every linear layer and LayerNorm has a bias
  bool tie_embeddings = true;
  Gelu gelu = Gelu::erf;  // nanogpt and gpt-neox
  double ln_eps = 1e-5;   // LayerNorm's (nanogpt, gpt-neox) or RMSNorm's (llama) eps

  // Llama and GPT-NeoX (SPEC §11); 0 where a size takes its default.
  int n_kv_head = 0;               // num_key_value_heads (llama; default n_head)
  int head_dim = 0;                // default n_embd / n_head
  int intermediate = 0;            // intermediate_size (default 4 n_embd)
  double rope_theta = 10000.0;     // rope_theta (llama), rotary_emb_base (gpt-neox)
  double rotary_pct = 1.0;         // gpt-neox: the share of each head's dims that rotate
  bool parallel_residual = false;  // gpt-neox: use_parallel_residual
  bool qkv_bias = false;           // llama: q, k, v projections; gpt-neox: query_key_value and dense (attention_bias)
  bool o_bias = false;             // llama: o_proj

  int kv_heads() const { return n_kv_head > 0 ? n_kv_head : n_head; }
  int head_size() const { return head_dim > 0 ? head_dim : n_embd / n_head; }
  int mlp_width() const { return intermediate > 0 ? intermediate : 4 * n_embd; }
  // Dims of each head that rotate (even; 0 for nanogpt).
  int rotary_dims() const;

  // Throws gnh::Error naming `where` and the offending field.
  void validate(const std::string& where) const;
  std::string describe() const;
  bool operator==(const ModelConfig& o) const;
  bool operator!=(const ModelConfig& o) const { return !(*this == o); }
};

}  // namespace gnh
