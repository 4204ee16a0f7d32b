// SPDX-License-Identifier: BSD-3-Clause
#include "io/tokens.hpp"

#include <fstream>

#include "core/error.hpp"
#include "core/sha256.hpp"
#include "io/files.hpp"
#include "io/hdf5.hpp"

namespace gnh {
namespace {

template <class U>
void decode(const std::vector<unsigned char>& bytes, std::vector<std::int32_t>& ids, const std::string& path,
            int vocab_size) {
  const std::size_t n = bytes.size() / sizeof(U);
  ids.resize(n);
  for (std::size_t i = 0; i < n; ++i) {
    std::uint64_t v = 0;
    for (std::size_t k = 0; k < sizeof(U); ++k)
      v |= std::uint64_t(bytes[i * sizeof(U) + k]) << (8 * k);  // little-endian on disk
    if (v >= static_cast<std::uint64_t>(vocab_size))
      fail(path, ": token id ", v, " at offset ", i, " (byte ", i * sizeof(U), ") is >= vocab_size ", vocab_size);
    ids[i] = static_cast<std::int32_t>(v);
  }
}

}  // namespace

TokenFile read_tokens(const std::string& path, const std::string& dtype, const std::string& dataset, int vocab_size) {
  TokenFile tf;
  tf.path = path;
  tf.dtype = dtype;
  tf.dataset = dataset;
  require_not_directory(path, "the token data path");
  if (dtype == "hdf5") {
    h5::File f = h5::File::open_read(path);
    const std::string where = path + ": dataset '" + dataset + "'";
    if (dataset.empty() || !h5::exists(f.id(), dataset)) fail(where, " not found");
    h5::Handle d(H5Dopen2(f.id(), dataset.c_str(), H5P_DEFAULT));
    h5::Handle type(H5Dget_type(d.id()));
    if (!d || H5Tget_class(type.id()) != H5T_INTEGER) fail(where, " is not an integer dataset");
    const auto shape = h5::dataset_shape(d.id());
    if (shape.size() != 1) fail(where, " must be one-dimensional");
    std::vector<std::int64_t> raw(static_cast<std::size_t>(shape[0]));
    if (!raw.empty() && H5Dread(d.id(), H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, raw.data()) < 0)
      fail(where, " cannot be read");
    tf.ids.resize(raw.size());
    for (std::size_t i = 0; i < raw.size(); ++i) {
      if (raw[i] < 0 || raw[i] >= vocab_size)
        fail(where, ": token id ", raw[i], " at offset ", i, " is outside 0..vocab_size-1 (", vocab_size - 1, ")");
      tf.ids[i] = static_cast<std::int32_t>(raw[i]);
    }
    Sha256 h;
    h.update(tf.ids.data(), tf.ids.size() * sizeof(std::int32_t));
    tf.sha256 = h.hexdigest();
    return tf;
  }
  std::size_t width = 0;
  if (dtype == "uint16") width = 2;
  else if (dtype == "uint32") width = 4;
  else fail(path, ": unknown token dtype \"", dtype, "\" (expected uint16, uint32 or hdf5)");
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) fail(path, ": cannot open token file");
  const std::streamoff size = in.tellg();
  if (size % static_cast<std::streamoff>(width) != 0)
    fail(path, ": size ", size, " bytes is not a multiple of ", width, " (", dtype, ")");
  std::vector<unsigned char> bytes(static_cast<std::size_t>(size));
  in.seekg(0);
  in.read(reinterpret_cast<char*>(bytes.data()), size);
  if (!in) fail(path, ": read error");
  if (width == 2) decode<std::uint16_t>(bytes, tf.ids, path, vocab_size);
  else decode<std::uint32_t>(bytes, tf.ids, path, vocab_size);
  Sha256 h;
  h.update(bytes.data(), bytes.size());
  tf.sha256 = h.hexdigest();
  return tf;
}

}  // namespace gnh
