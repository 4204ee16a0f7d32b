// SPDX-License-Identifier: BSD-3-Clause
#include "model/layout.hpp"

namespace gnh {

std::int64_t ParamLayout::add(const std::string& name, std::vector<std::int64_t> shape) {
  TensorInfo t;
  t.name = name;
  t.size = 1;
  for (auto s : shape) t.size *= s;
  t.shape = std::move(shape);
  t.offset = size_;
  size_ += t.size;
  tensors_.push_back(std::move(t));
  return tensors_.back().offset;
}

ParamLayout::ParamLayout(const ModelConfig& cfg) {
  switch (cfg.family) {
    case Family::llama:
      llama(cfg);
      break;
    case Family::gpt_neox:
      gpt_neox(cfg);
      break;
    default:
      nanogpt(cfg);
  }
}

void ParamLayout::nanogpt(const ModelConfig& cfg) {
  const std::int64_t C = cfg.n_embd, V = cfg.vocab_size, T = cfg.block_size;
  wte = add("transformer.wte.weight", {V, C});
  wpe = add("transformer.wpe.weight", {T, C});
  for (int i = 0; i < cfg.n_layer; ++i) {
    const std::string p = "transformer.h." + std::to_string(i) + ".";
    BlockOffsets b{};
    auto bias = [&](const std::string& name, std::int64_t n) -> std::int64_t {
      return cfg.bias ? add(p + name, {n}) : -1;
    };
    b.ln1_w = b.first = add(p + "ln_1.weight", {C});
    b.ln1_b = bias("ln_1.bias", C);
    b.attn_w = add(p + "attn.c_attn.weight", {3 * C, C});
    b.attn_b = bias("attn.c_attn.bias", 3 * C);
    b.attn_proj_w = add(p + "attn.c_proj.weight", {C, C});
    b.attn_proj_b = bias("attn.c_proj.bias", C);
    b.ln2_w = add(p + "ln_2.weight", {C});
    b.ln2_b = bias("ln_2.bias", C);
    b.fc_w = add(p + "mlp.c_fc.weight", {4 * C, C});
    b.fc_b = bias("mlp.c_fc.bias", 4 * C);
    b.fc_proj_w = add(p + "mlp.c_proj.weight", {C, 4 * C});
    b.fc_proj_b = bias("mlp.c_proj.bias", C);
    blocks.push_back(b);
  }
  lnf_w = add("transformer.ln_f.weight", {C});
  lnf_b = cfg.bias ? add("transformer.ln_f.bias", {C}) : -1;
  lm_head = cfg.tie_embeddings ? wte : add("lm_head.weight", {V, C});
}

// SPEC §11's order: the reference implementation's registration order.
void ParamLayout::llama(const ModelConfig& cfg) {
  const std::int64_t d = cfg.n_embd, V = cfg.vocab_size, F = cfg.mlp_width();
  const std::int64_t q = std::int64_t(cfg.n_head) * cfg.head_size(),
                     kv = std::int64_t(cfg.kv_heads()) * cfg.head_size();
  wte = add("model.embed_tokens.weight", {V, d});
  for (int i = 0; i < cfg.n_layer; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    BlockOffsets b{};
    b.q_w = b.first = add(p + "self_attn.q_proj.weight", {q, d});
    if (cfg.qkv_bias) b.q_b = add(p + "self_attn.q_proj.bias", {q});
    b.k_w = add(p + "self_attn.k_proj.weight", {kv, d});
    if (cfg.qkv_bias) b.k_b = add(p + "self_attn.k_proj.bias", {kv});
    b.v_w = add(p + "self_attn.v_proj.weight", {kv, d});
    if (cfg.qkv_bias) b.v_b = add(p + "self_attn.v_proj.bias", {kv});
    b.attn_proj_w = add(p + "self_attn.o_proj.weight", {d, q});
    if (cfg.o_bias) b.attn_proj_b = add(p + "self_attn.o_proj.bias", {d});
    b.fc_w = add(p + "mlp.gate_proj.weight", {F, d});
    add(p + "mlp.up_proj.weight", {F, d});  // right after gate_proj: fc_w spans both
    b.fc_proj_w = add(p + "mlp.down_proj.weight", {d, F});
    b.ln1_w = add(p + "input_layernorm.weight", {d});
    b.ln2_w = add(p + "post_attention_layernorm.weight", {d});
    blocks.push_back(b);
  }
  lnf_w = add("model.norm.weight", {d});
  lm_head = cfg.tie_embeddings ? wte : add("lm_head.weight", {V, d});
}

void ParamLayout::gpt_neox(const ModelConfig& cfg) {
  const std::int64_t d = cfg.n_embd, V = cfg.vocab_size, F = cfg.mlp_width();
  const std::int64_t a = std::int64_t(cfg.n_head) * cfg.head_size();
  wte = add("gpt_neox.embed_in.weight", {V, d});
  for (int i = 0; i < cfg.n_layer; ++i) {
    const std::string p = "gpt_neox.layers." + std::to_string(i) + ".";
    BlockOffsets b{};
    b.ln1_w = b.first = add(p + "input_layernorm.weight", {d});
    b.ln1_b = add(p + "input_layernorm.bias", {d});
    b.ln2_w = add(p + "post_attention_layernorm.weight", {d});
    b.ln2_b = add(p + "post_attention_layernorm.bias", {d});
    b.attn_w = add(p + "attention.query_key_value.weight", {3 * a, d});
    if (cfg.qkv_bias) b.attn_b = add(p + "attention.query_key_value.bias", {3 * a});
    b.attn_proj_w = add(p + "attention.dense.weight", {d, a});
    if (cfg.qkv_bias) b.attn_proj_b = add(p + "attention.dense.bias", {d});
    b.fc_w = add(p + "mlp.dense_h_to_4h.weight", {F, d});
    b.fc_b = add(p + "mlp.dense_h_to_4h.bias", {F});
    b.fc_proj_w = add(p + "mlp.dense_4h_to_h.weight", {d, F});
    b.fc_proj_b = add(p + "mlp.dense_4h_to_h.bias", {d});
    blocks.push_back(b);
  }
  lnf_w = add("gpt_neox.final_layer_norm.weight", {d});
  lnf_b = add("gpt_neox.final_layer_norm.bias", {d});
  lm_head = cfg.tie_embeddings ? wte : add("embed_out.weight", {V, d});
}

int ParamLayout::find(const std::string& name) const {
  for (std::size_t i = 0; i < tensors_.size(); ++i)
    if (tensors_[i].name == name) return static_cast<int>(i);
  return -1;
}

}  // namespace gnh
