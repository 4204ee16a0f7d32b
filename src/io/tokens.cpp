// SPDX-License-Identifier: BSD-3-Clause
#include "io/tokens.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <map>
#include <regex>

#include "core/error.hpp"
#include "core/sha256.hpp"
#include "io/files.hpp"
#include "io/hdf5.hpp"

namespace gnh {
namespace {

// Little-endian integers of `width` bytes, signed or not, decoded in turn and
// checked against the vocabulary; `at` counts the elements already decoded
// and `byte0` is the file offset of the stream's first element.
struct IntStream {
  std::string path;
  std::size_t width = 2;
  bool is_signed = false;
  std::uint64_t byte0 = 0;
  int vocab_size = 0;
  std::size_t at = 0;

  void decode(const unsigned char* p, std::size_t n, std::vector<std::int32_t>& ids) {
    for (std::size_t i = 0; i < n; ++i, ++at) {
      std::uint64_t u = 0;
      for (std::size_t k = 0; k < width; ++k) u |= std::uint64_t(p[i * width + k]) << (8 * k);
      std::int64_t v = std::int64_t(u);
      if (is_signed && width < 8 && (u >> (8 * width - 1)) & 1)
        v = std::int64_t(u | (~std::uint64_t(0) << (8 * width)));
      if (is_signed ? (v < 0 || v >= vocab_size) : u >= std::uint64_t(vocab_size))
        fail(path, ": token id ", is_signed ? std::to_string(v) : std::to_string(u), " at offset ", at, " (byte ",
             byte0 + at * width, ") is ",
             is_signed && v < 0 ? "negative" : ">= vocab_size " + std::to_string(vocab_size));
      ids.push_back(std::int32_t(v));
    }
  }
};

std::uint64_t file_size(const std::string& path, const char* what) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) fail(path, ": cannot open ", what, " (no such file or not readable)");
  if (S_ISDIR(st.st_mode)) fail(path, ": ", what, " is a directory");
  return std::uint64_t(st.st_size);
}

// Reads `bytes` bytes of `path` from `offset` in chunks, decoding them as one
// integer stream into ids and, with h, hashing them.
void stream_ids(const std::string& path, std::uint64_t offset, std::uint64_t bytes, IntStream& s,
                std::vector<std::int32_t>& ids, Sha256* h) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(path, ": cannot open");
  in.seekg(std::streamoff(offset));
  ids.reserve(ids.size() + bytes / s.width);
  const std::size_t chunk = (std::size_t(1) << 20) / s.width * s.width;
  std::vector<unsigned char> buf(chunk);
  for (std::uint64_t done = 0; done < bytes;) {
    const std::size_t n = std::size_t(std::min<std::uint64_t>(chunk, bytes - done));
    in.read(reinterpret_cast<char*>(buf.data()), std::streamsize(n));
    if (std::size_t(in.gcount()) != n) fail(path, ": read error at byte ", offset + done);
    if (h) h->update(buf.data(), n);
    s.decode(buf.data(), n / s.width, ids);
    done += n;
  }
}

// A file mapped read-only (a Megatron index can be gigabytes: it is checked
// in place, its pages left to the kernel).
class Mapped {
 public:
  Mapped(const std::string& path, std::uint64_t size) : size_(size) {
    const int fd = ::open(path.c_str(), O_RDONLY);
    if (fd < 0) fail(path, ": cannot open");
    p_ = size ? ::mmap(nullptr, std::size_t(size), PROT_READ, MAP_PRIVATE, fd, 0) : nullptr;
    ::close(fd);
    if (p_ == MAP_FAILED) fail(path, ": cannot map ", size, " bytes");
  }
  ~Mapped() {
    if (p_ && p_ != MAP_FAILED) ::munmap(p_, std::size_t(size_));
  }
  Mapped(const Mapped&) = delete;
  Mapped& operator=(const Mapped&) = delete;
  const unsigned char* data() const { return static_cast<const unsigned char*>(p_); }

 private:
  void* p_ = nullptr;
  std::uint64_t size_ = 0;
};

template <class U>
U little(const unsigned char* b, std::uint64_t at) {
  std::uint64_t v = 0;
  for (std::size_t k = 0; k < sizeof(U); ++k) v |= std::uint64_t(b[at + k]) << (8 * k);
  return U(v);
}

// Megatron's indexed dataset (MMapIndexedDataset): PREFIX.idx holds the magic
// "MMIDIDX\0\0", version 1 (uint64), a dtype code (uint8), the sequence and
// document counts n and d (uint64 each), then n int32 sizes, n int64 byte
// pointers into PREFIX.bin and d int64 document indices. The sequences are
// read in order as one stream.
TokenSource open_megatron(const std::string& path) {
  std::string prefix = path;
  for (const char* ext : {".bin", ".idx"})
    if (prefix.size() > 4 && prefix.compare(prefix.size() - 4, 4, ext) == 0) prefix.resize(prefix.size() - 4);
  const std::string idx = prefix + ".idx", bin = prefix + ".bin";
  const std::uint64_t idx_size = file_size(idx, "the Megatron index"), bin_size = file_size(bin, "the Megatron data");
  constexpr std::uint64_t kHeader = 34;
  if (idx_size < kHeader) fail(idx, ": truncated: ", idx_size, " bytes, the header alone has ", kHeader);
  const Mapped map(idx, idx_size);
  const unsigned char* b = map.data();
  if (std::memcmp(b, "MMIDIDX\0\0", 9) != 0) fail(idx, ": not a Megatron index (no MMIDIDX magic at byte 0)");
  if (const auto version = little<std::uint64_t>(b, 9); version != 1)
    fail(idx, ": version ", version, " at byte 9 (gnh reads version 1)");
  static const std::map<int, std::pair<std::size_t, bool>> codes = {{1, {1, false}}, {2, {1, true}}, {3, {2, true}},
                                                                    {4, {4, true}},  {5, {8, true}}, {8, {2, false}}};
  const int code = b[17];
  if (code == 6 || code == 7) fail(idx, ": dtype code ", code, " at byte 17 is a floating-point type, not token ids");
  if (!codes.count(code)) fail(idx, ": unknown dtype code ", code, " at byte 17 (1-5 and 8 are integers)");
  const std::uint64_t n = little<std::uint64_t>(b, 18), d = little<std::uint64_t>(b, 26);
  if (n > idx_size / 12 || d > idx_size / 8 || kHeader + 12 * n + 8 * d != idx_size)
    fail(idx, ": ", n, " sequences (byte 18) and ", d, " document indices (byte 26) need ", kHeader, " + 12 n + 8 d",
         " bytes, the file has ", idx_size);
  const auto [width, is_signed] = codes.at(code);
  std::uint64_t end = 0;  // the byte after the sequences so far
  for (std::uint64_t i = 0; i < n; ++i) {
    const std::int32_t size = little<std::int32_t>(b, kHeader + 4 * i);
    const std::uint64_t at = kHeader + 4 * n + 8 * i;
    const std::int64_t pointer = little<std::int64_t>(b, at);
    if (size < 0) fail(idx, ": sequence ", i, " has size ", size, " (byte ", kHeader + 4 * i, ")");
    if (pointer < 0 || std::uint64_t(pointer) != end)
      fail(idx, ": sequence ", i, "'s pointer ", pointer, " (byte ", at, ") disagrees with the sizes before it (", end,
           ")");
    end += std::uint64_t(size) * width;
  }
  if (end != bin_size)
    fail(bin, end > bin_size ? ": truncated: " : ": ", bin_size, " bytes, where the index's ", n, " sequences of ",
         width, "-byte tokens take ", end);
  for (std::uint64_t j = 0; j < d; ++j) {
    const std::int64_t doc = little<std::int64_t>(b, kHeader + 12 * n + 8 * j);
    const std::int64_t before = j ? little<std::int64_t>(b, kHeader + 12 * n + 8 * (j - 1)) : 0;
    if (doc < before || std::uint64_t(doc) > n)
      fail(idx, ": document index ", j, " = ", doc, " (byte ", kHeader + 12 * n + 8 * j,
           ") is not within the sequences in order");
  }
  TokenSource src;
  src.path = path;
  src.format = "megatron";
  src.dtype = std::string(is_signed ? "int" : "uint") + std::to_string(8 * width);
  src.data_path = bin;
  src.count = bin_size / width;
  src.width = width;
  src.is_signed = is_signed;
  return src;
}

// NumPy's .npy: "\x93NUMPY", a version (1, 2 or 3), the header's length
// (uint16, or uint32 from version 2), the header (a Python dict literal), the
// array's bytes.
TokenSource open_npy(const std::string& path) {
  const std::uint64_t size = file_size(path, "the token file");
  std::ifstream in(path, std::ios::binary);
  unsigned char pre[12] = {};
  in.read(reinterpret_cast<char*>(pre), std::streamsize(std::min<std::uint64_t>(size, 12)));
  if (size < 10 || std::memcmp(pre, "\x93NUMPY", 6) != 0) fail(path, ": not a NumPy .npy file (no magic at byte 0)");
  const int major = pre[6];
  if (major < 1 || major > 3) fail(path, ": .npy format version ", major, " at byte 6 (1, 2 or 3 are read)");
  const std::uint64_t header_len = major == 1 ? std::uint64_t(pre[8] | (pre[9] << 8))
                                              : std::uint64_t(pre[8]) | std::uint64_t(pre[9]) << 8 |
                                                    std::uint64_t(pre[10]) << 16 | std::uint64_t(pre[11]) << 24;
  const std::uint64_t data0 = (major == 1 ? 10 : 12) + header_len;
  if (data0 > size) fail(path, ": truncated .npy header (", header_len, " bytes from byte ", data0 - header_len, ")");
  std::string header(std::size_t(header_len), '\0');
  in.seekg(std::streamoff(data0 - header_len));
  in.read(header.data(), std::streamsize(header_len));
  std::smatch m;
  if (!std::regex_search(header, m, std::regex("'descr'\\s*:\\s*'([^']*)'")))
    fail(path, ": .npy header has no descr: ", header);
  const std::string descr = m[1];
  std::smatch f;
  if (!std::regex_search(header, f, std::regex("'fortran_order'\\s*:\\s*(True|False)")) || f[1] == "True")
    fail(path, ": .npy header: the array must be in C order (fortran_order False): ", header);
  std::smatch sh;
  if (!std::regex_search(header, sh, std::regex("'shape'\\s*:\\s*\\(\\s*(\\d+)\\s*,\\s*\\)")))
    fail(path, ": .npy header: the array must be one-dimensional (shape (N,)): ", header);
  static const std::map<std::string, std::pair<std::size_t, bool>> types = {
      {"|u1", {1, false}}, {"|i1", {1, true}}, {"<u2", {2, false}}, {"<i2", {2, true}},
      {"<u4", {4, false}}, {"<i4", {4, true}}, {"<u8", {8, false}}, {"<i8", {8, true}}};
  if (!types.count(descr))
    fail(path, ": .npy dtype '", descr, "': token ids must be a little-endian integer array (|u1, <u2, <i4, <i8, ...)");
  const auto [width, is_signed] = types.at(descr);
  const std::uint64_t count = std::stoull(sh[1]);
  if (size - data0 != count * width)
    fail(path, ": shape (", count, ",) of '", descr, "' needs ", count * width, " bytes after the header (byte ", data0,
         "), the file has ", size - data0);
  TokenSource src;
  src.path = path;
  src.format = "npy";
  src.dtype = std::string(is_signed ? "int" : "uint") + std::to_string(8 * width);
  src.data_path = path;
  src.count = count;
  src.byte0 = data0;
  src.width = width;
  src.is_signed = is_signed;
  return src;
}

// A flat file of uint16 or uint32 ids, or a one-dimensional integer HDF5 dataset.
TokenSource open_flat(const std::string& path, const std::string& dtype, const std::string& dataset) {
  require_not_directory(path, "the token data path");
  TokenSource src;
  src.path = src.data_path = path;
  src.dtype = dtype;
  src.dataset = dataset;
  if (dtype == "hdf5") {
    src.format = "hdf5";
    h5::File f = h5::File::open_read(path);
    const std::string where = path + ": dataset '" + dataset + "'";
    if (dataset.empty() || !h5::exists(f.id(), dataset)) fail(where, " not found");
    h5::Handle d(H5Dopen2(f.id(), dataset.c_str(), H5P_DEFAULT));
    h5::Handle type(H5Dget_type(d.id()));
    if (!d || H5Tget_class(type.id()) != H5T_INTEGER) fail(where, " is not an integer dataset");
    const auto shape = h5::dataset_shape(d.id());
    if (shape.size() != 1) fail(where, " must be one-dimensional");
    src.count = std::uint64_t(shape[0]);
    return src;
  }
  if (dtype == "uint16") src.width = 2;
  else if (dtype == "uint32") src.width = 4;
  else fail(path, ": unknown token dtype \"", dtype, "\" (expected uint16, uint32 or hdf5)");
  const std::uint64_t size = file_size(path, "the token file");
  if (size % src.width != 0) fail(path, ": size ", size, " bytes is not a multiple of ", src.width, " (", dtype, ")");
  src.count = size / src.width;
  return src;
}

// Tokens [first, first + n); with h, the bytes read hashed as stored (the
// HDF5 dataset's ids as int32).
std::vector<std::int32_t> read_range(const TokenSource& src, std::uint64_t first, std::uint64_t n, int vocab_size,
                                     Sha256* h) {
  if (first > src.count || n > src.count - first)
    fail(src.path, ": tokens [", first, ", ", first + n, ") asked for, the source holds ", src.count);
  std::vector<std::int32_t> ids;
  if (src.format == "hdf5") {
    const std::string where = src.path + ": dataset '" + src.dataset + "'";
    h5::File f = h5::File::open_read(src.path);
    h5::Handle d(H5Dopen2(f.id(), src.dataset.c_str(), H5P_DEFAULT));
    std::vector<std::int64_t> raw(static_cast<std::size_t>(n));
    if (n > 0) {
      h5::Handle space(H5Dget_space(d.id()));
      const hsize_t start = first, count = n;
      h5::Handle mem(H5Screate_simple(1, &count, nullptr));
      if (H5Sselect_hyperslab(space.id(), H5S_SELECT_SET, &start, nullptr, &count, nullptr) < 0 ||
          H5Dread(d.id(), H5T_NATIVE_INT64, mem.id(), space.id(), H5P_DEFAULT, raw.data()) < 0)
        fail(where, " cannot be read");
    }
    ids.resize(raw.size());
    for (std::size_t i = 0; i < raw.size(); ++i) {
      if (raw[i] < 0 || raw[i] >= vocab_size)
        fail(where, ": token id ", raw[i], " at offset ", first + i, " is outside 0..vocab_size-1 (", vocab_size - 1,
             ")");
      ids[i] = static_cast<std::int32_t>(raw[i]);
    }
    if (h) h->update(ids.data(), ids.size() * sizeof(std::int32_t));
    return ids;
  }
  IntStream s{src.data_path, src.width, src.is_signed, src.byte0, vocab_size, std::size_t(first)};
  stream_ids(src.data_path, src.byte0 + first * src.width, n * src.width, s, ids, h);
  return ids;
}

}  // namespace

TokenSource open_token_source(const std::string& path, const std::string& format, const std::string& dtype,
                              const std::string& dataset) {
  if (format == "megatron") return open_megatron(path);
  if (format == "npy") return open_npy(path);
  if (format != "bin" && format != "hdf5")
    fail(path, ": unknown token format \"", format, "\" (expected bin, hdf5, megatron or npy)");
  return open_flat(path, format == "hdf5" ? "hdf5" : dtype, dataset);
}

std::vector<std::int32_t> read_token_range(const TokenSource& src, std::uint64_t first, std::uint64_t n,
                                           int vocab_size) {
  return read_range(src, first, n, vocab_size, nullptr);
}

std::string tokens_sha256(const std::int32_t* ids, std::size_t n) {
  static_assert(sizeof(std::int32_t) == 4);
  Sha256 h;
  unsigned char buf[4096];
  for (std::size_t i = 0; i < n;) {
    std::size_t k = 0;
    for (; k + 4 <= sizeof(buf) && i < n; ++i, k += 4) {
      const auto u = std::uint32_t(ids[i]);
      for (int b = 0; b < 4; ++b) buf[k + std::size_t(b)] = static_cast<unsigned char>(u >> (8 * b));
    }
    h.update(buf, k);
  }
  return h.hexdigest();
}

TokenFile read_token_source(const std::string& path, const std::string& format, const std::string& dtype,
                            const std::string& dataset, int vocab_size) {
  const TokenSource src = open_token_source(path, format, dtype, dataset);
  TokenFile tf;
  tf.path = path;
  tf.format = src.format;
  tf.dtype = src.dtype;
  tf.dataset = src.dataset;
  Sha256 h;
  tf.ids = read_range(src, 0, src.count, vocab_size, &h);
  tf.sha256 = h.hexdigest();
  return tf;
}

TokenFile read_tokens(const std::string& path, const std::string& dtype, const std::string& dataset, int vocab_size) {
  return read_token_source(path, dtype == "hdf5" ? "hdf5" : "bin", dtype, dataset, vocab_size);
}

}  // namespace gnh
