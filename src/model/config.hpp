// SPDX-License-Identifier: BSD-3-Clause
// The nanoGPT model family of SPEC §1.
#pragma once
#include <string>

#include "core/gelu_kind.hpp"

namespace gnh {

struct ModelConfig {
  int n_layer = 0;
  int n_head = 0;
  int n_embd = 0;
  int block_size = 0;
  int vocab_size = 0;
  bool bias = true;
  bool tie_embeddings = true;
  Gelu gelu = Gelu::erf;
  double ln_eps = 1e-5;

  // Throws gnh::Error naming `where` and the offending field.
  void validate(const std::string& where) const;
  std::string describe() const;
  bool operator==(const ModelConfig& o) const;
  bool operator!=(const ModelConfig& o) const { return !(*this == o); }
};

}  // namespace gnh
