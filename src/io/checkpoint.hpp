// SPDX-License-Identifier: BSD-3-Clause
// Reader for the HDF5 checkpoint of SPEC §2.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "model/config.hpp"

namespace gnh {

struct Checkpoint {
  std::string path;
  ModelConfig config;
  std::vector<float> params;  // flat, canonical order (ParamLayout)
  std::string param_sha256;   // of the float32 little-endian flat vector
  std::string source_file, source_sha256;
  std::optional<std::int64_t> iter_num;
};

// Reads only the root and /config attributes (cheap; for planning and checks).
ModelConfig read_checkpoint_config(const std::string& path);

// Reads and validates everything: format, config, every tensor present with the
// right shape and dtype, no unknown tensors, all values finite. Throws
// gnh::Error naming the file and the tensor.
Checkpoint read_checkpoint(const std::string& path);

// Content hash of a flat parameter vector (what groups identical states).
std::string params_sha256(const std::vector<float>& params);

}  // namespace gnh
