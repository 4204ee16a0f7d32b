// SPDX-License-Identifier: BSD-3-Clause
// Token data of SPEC §3 and §14: a flat little-endian binary file of uint16
// (nanoGPT's train.bin/val.bin) or uint32 ids, an integer HDF5 dataset, a
// Megatron indexed dataset (.idx/.bin pair: GPT-NeoX, Megatron-LM, Pythia),
// or a NumPy .npy file of a 1-D integer array.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace gnh {

struct TokenFile {
  std::string path;
  std::string format = "bin";  // "bin" | "hdf5" | "megatron" | "npy"
  std::string dtype;           // "uint16" | "uint32" | "hdf5", or the file's own (megatron, npy)
  std::string dataset;         // HDF5 dataset path when dtype == "hdf5"
  std::vector<std::int32_t> ids;
  std::string sha256;  // of the file bytes (binary), of the ids as int32 (HDF5), of the token bytes (megatron, npy)
};

// Reads and validates every id against vocab_size; an id >= vocab_size is an
// error naming the file and the element offset.
TokenFile read_tokens(const std::string& path, const std::string& dtype, const std::string& dataset, int vocab_size);

// A token source of any format. "megatron": path names the .bin, the .idx or
// their common prefix; the .idx's magic, version, dtype code, sequence sizes
// and pointers are checked against the .bin, and the sequences are read in
// order as one stream. "npy": the header must describe a 1-D little-endian
// (or one-byte) integer array in C order. Every malformed file is an error
// naming the file and the offset or field.
TokenFile read_token_source(const std::string& path, const std::string& format, const std::string& dtype,
                            const std::string& dataset, int vocab_size);

}  // namespace gnh
