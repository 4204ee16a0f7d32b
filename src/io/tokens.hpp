// SPDX-License-Identifier: BSD-3-Clause
// Token data of SPEC §3: a flat little-endian binary file of uint16 (nanoGPT's
// train.bin/val.bin) or uint32 ids, or an integer HDF5 dataset.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace gnh {

struct TokenFile {
  std::string path;
  std::string dtype;    // "uint16" | "uint32" | "hdf5"
  std::string dataset;  // HDF5 dataset path when dtype == "hdf5"
  std::vector<std::int32_t> ids;
  std::string sha256;  // of the file bytes (binary) or of the ids as int32 (HDF5)
};

// Reads and validates every id against vocab_size; an id >= vocab_size is an
// error naming the file and the element offset.
TokenFile read_tokens(const std::string& path, const std::string& dtype, const std::string& dataset, int vocab_size);

}  // namespace gnh
