// SPDX-License-Identifier: BSD-3-Clause
#include "model/config.hpp"

#include <cmath>

#include "core/error.hpp"

namespace gnh {

void ModelConfig::validate(const std::string& where) const {
  auto positive = [&](const char* key, int v) {
    if (v <= 0) fail(where, ": config ", key, " = ", v, " must be positive");
  };
  positive("n_layer", n_layer);
  positive("n_head", n_head);
  positive("n_embd", n_embd);
  positive("block_size", block_size);
  positive("vocab_size", vocab_size);
  if (n_embd % n_head != 0) fail(where, ": config n_head = ", n_head, " does not divide n_embd = ", n_embd);
  if (!(ln_eps > 0.0) || !std::isfinite(ln_eps))
    fail(where, ": config ln_eps = ", ln_eps, " must be positive and finite");
}

std::string ModelConfig::describe() const {
  return cat("n_layer=", n_layer, " n_head=", n_head, " n_embd=", n_embd, " block_size=", block_size,
             " vocab_size=", vocab_size, " bias=", bias, " tie_embeddings=", tie_embeddings, " gelu=", to_string(gelu),
             " ln_eps=", ln_eps);
}

bool ModelConfig::operator==(const ModelConfig& o) const {
  return n_layer == o.n_layer && n_head == o.n_head && n_embd == o.n_embd && block_size == o.block_size &&
         vocab_size == o.vocab_size && bias == o.bias && tie_embeddings == o.tie_embeddings && gelu == o.gelu &&
         ln_eps == o.ln_eps;
}

}  // namespace gnh
