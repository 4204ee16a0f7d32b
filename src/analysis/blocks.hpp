// SPDX-License-Identifier: BSD-3-Clause
// The two partitions of the canonical flat parameter vector of SPEC §10:
// `tensor` (one block per canonical tensor name of §1) and `layer` (`embed` =
// wte + wpe, `h.<i>` = every tensor of layer i, `head` = ln_f and, when
// untied, lm_head). Both are contiguous ranges of the flat order. No Kokkos.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "model/layout.hpp"

namespace gnh {

struct Partition {
  std::string name;
  std::vector<std::string> names;
  std::vector<std::int64_t> offsets;  // names.size() + 1, from 0 to the parameter count
};

std::vector<Partition> parameter_partitions(const ParamLayout& layout);

// Blocks of the `layer` partition: embed, each layer, head.
inline std::int64_t layer_blocks(const ModelConfig& cfg) { return std::int64_t(cfg.n_layer) + 2; }

}  // namespace gnh
