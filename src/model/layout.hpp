// SPDX-License-Identifier: BSD-3-Clause
// The canonical flat parameter order of SPEC §1 (nanoGPT) and §11 (Llama,
// GPT-NeoX). Parameters, gradients,
// directions and Hessian-vector products are each one contiguous buffer laid out
// by this table; each tensor is a named, contiguous block of it.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "model/config.hpp"

namespace gnh {

struct TensorInfo {
  std::string name;                 // e.g. "transformer.h.0.attn.c_attn.weight"
  std::vector<std::int64_t> shape;  // PyTorch shape
  std::int64_t offset = 0;          // into the flat vector
  std::int64_t size = 0;
};

// Offsets of one transformer block's tensors; -1 where the tensor is absent
// (no bias, or not of the family). attn_w: nanoGPT's c_attn, GPT-NeoX's
// query_key_value; q_w, k_w, v_w: Llama's projections. attn_proj_w: c_proj,
// dense, o_proj. fc_w: c_fc, dense_h_to_4h, or Llama's gate_proj followed by
// up_proj (adjacent: one (2f, d) block); fc_proj_w: c_proj, dense_4h_to_h,
// down_proj.
struct BlockOffsets {
  std::int64_t first = -1;  // the block's first tensor
  std::int64_t ln1_w = -1, ln1_b = -1, attn_w = -1, attn_b = -1, attn_proj_w = -1, attn_proj_b = -1;
  std::int64_t ln2_w = -1, ln2_b = -1, fc_w = -1, fc_b = -1, fc_proj_w = -1, fc_proj_b = -1;
  std::int64_t q_w = -1, q_b = -1, k_w = -1, k_b = -1, v_w = -1, v_b = -1;
};

class ParamLayout {
 public:
  explicit ParamLayout(const ModelConfig& cfg);

  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  std::int64_t size() const { return size_; }
  // Index into tensors(), or -1.
  int find(const std::string& name) const;

  std::int64_t wte, wpe = -1, lnf_w, lnf_b = -1, lm_head;  // lm_head == wte when tied; no wpe in §11
  std::vector<BlockOffsets> blocks;

 private:
  void nanogpt(const ModelConfig& cfg);
  void llama(const ModelConfig& cfg);
  void gpt_neox(const ModelConfig& cfg);

 public:
 private:
  std::int64_t add(const std::string& name, std::vector<std::int64_t> shape);
  std::vector<TensorInfo> tensors_;
  std::int64_t size_ = 0;
};

}  // namespace gnh
