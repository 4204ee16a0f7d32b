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
  const std::int64_t C = cfg.n_embd, V = cfg.vocab_size, T = cfg.block_size;
  wte = add("transformer.wte.weight", {V, C});
  wpe = add("transformer.wpe.weight", {T, C});
  for (int i = 0; i < cfg.n_layer; ++i) {
    const std::string p = "transformer.h." + std::to_string(i) + ".";
    BlockOffsets b{};
    auto bias = [&](const std::string& name, std::int64_t n) -> std::int64_t {
      return cfg.bias ? add(p + name, {n}) : -1;
    };
    b.ln1_w = add(p + "ln_1.weight", {C});
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

int ParamLayout::find(const std::string& name) const {
  for (std::size_t i = 0; i < tensors_.size(); ++i)
    if (tensors_[i].name == name) return static_cast<int>(i);
  return -1;
}

}  // namespace gnh
