// SPDX-License-Identifier: BSD-3-Clause
// The canonical flat parameter order of SPEC §1. Parameters, gradients,
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

// Offsets of one transformer block's tensors; -1 where the tensor is absent (no bias).
struct BlockOffsets {
  std::int64_t ln1_w, ln1_b, attn_w, attn_b, attn_proj_w, attn_proj_b;
  std::int64_t ln2_w, ln2_b, fc_w, fc_b, fc_proj_w, fc_proj_b;
};

class ParamLayout {
 public:
  explicit ParamLayout(const ModelConfig& cfg);

  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  std::int64_t size() const { return size_; }
  // Index into tensors(), or -1.
  int find(const std::string& name) const;

  std::int64_t wte, wpe, lnf_w, lnf_b, lm_head;  // lm_head == wte when tied
  std::vector<BlockOffsets> blocks;

 private:
  std::int64_t add(const std::string& name, std::vector<std::int64_t> shape);
  std::vector<TensorInfo> tensors_;
  std::int64_t size_ = 0;
};

}  // namespace gnh
