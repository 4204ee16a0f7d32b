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

// A token source opened and checked (header, index, sizes) but not read:
// what it holds and where its tokens lie, so that a range of them can be read
// without the rest (a published corpus is larger than memory).
struct TokenSource {
  std::string path;  // as named in the deck
  std::string format = "bin", dtype, dataset;
  std::string data_path;    // the file holding the tokens (a Megatron dataset's .bin)
  std::uint64_t count = 0;  // tokens
  std::uint64_t byte0 = 0;  // file offset of token 0 (bin, megatron, npy)
  std::size_t width = 0;    // bytes a token in the file (bin, megatron, npy)
  bool is_signed = false;
};

// Opens and checks a token source of any format (see read_token_source);
// reads no token.
TokenSource open_token_source(const std::string& path, const std::string& format, const std::string& dtype,
                              const std::string& dataset);

// Tokens [first, first + n) of an opened source, each checked against
// vocab_size (an error names the file and the token's offset in the source).
std::vector<std::int32_t> read_token_range(const TokenSource& src, std::uint64_t first, std::uint64_t n,
                                           int vocab_size);

// SHA-256 of token ids as little-endian int32: the same tokens give the same
// digest whatever file format and integer width held them.
std::string tokens_sha256(const std::int32_t* ids, std::size_t n);

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
