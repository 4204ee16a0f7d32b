// SPDX-License-Identifier: BSD-3-Clause
#include "io/lanczos_store.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include "core/error.hpp"
#include "io/results.hpp"

namespace gnh {
namespace {

constexpr char kMagic[] = "gnh-lanczos-state 1\n";
constexpr std::uint64_t kTrailer = 0x676e686c616e637aull;  // the file was written to its end

template <class V>
void put(std::ostream& out, const V& v) {
  out.write(reinterpret_cast<const char*>(&v), sizeof(V));
}
template <class V>
bool get(std::ifstream& in, V& v) {
  return bool(in.read(reinterpret_cast<char*>(&v), sizeof(V)));
}

}  // namespace

FileLanczosStore::FileLanczosStore(std::string prefix, std::string key)
    : prefix_(std::move(prefix)), key_(std::move(key)) {}

FileLanczosStore::~FileLanczosStore() {
  if (fd_ >= 0) ::close(fd_);
}

bool FileLanczosStore::load(LanczosState& state) {
  std::ifstream in(state_path(), std::ios::binary);
  if (!in) return false;
  char magic[sizeof(kMagic) - 1];
  if (!in.read(magic, sizeof(magic)) || std::memcmp(magic, kMagic, sizeof(magic)) != 0) return false;
  std::uint64_t n = 0;
  if (!get(in, n) || n > (1u << 20)) return false;
  std::string key(n, '\0');
  if (!in.read(key.data(), std::streamsize(n)) || key != key_ + " | " + state.key) return false;
  std::int64_t chains = 0;
  if (!get(in, chains) || chains < 0 || chains > 4096) return false;
  std::vector<LanczosChainState> out(static_cast<std::size_t>(chains));
  for (LanczosChainState& c : out) {
    std::int64_t stop = 0;
    if (!get(in, c.steps) || !get(in, stop) || !get(in, c.start_vHv) || !get(in, c.start_Hv_sqnorm)) return false;
    if (c.steps < 0 || c.steps > (1 << 20) || stop < 0 || stop > 3) return false;
    c.stop = ChainStop(int(stop));
    c.alpha.resize(static_cast<std::size_t>(c.steps));
    c.beta.resize(static_cast<std::size_t>(c.steps));
    for (double& a : c.alpha)
      if (!get(in, a)) return false;
    for (double& b : c.beta)
      if (!get(in, b)) return false;
  }
  std::uint64_t trailer = 0;
  if (!get(in, trailer) || trailer != kTrailer) return false;
  state.chains = std::move(out);
  return true;
}

void FileLanczosStore::save(const LanczosState& state) {
  std::ostringstream out(std::ios::binary);
  {
    out.write(kMagic, sizeof(kMagic) - 1);
    const std::string key = key_ + " | " + state.key;
    put(out, std::uint64_t(key.size()));
    out.write(key.data(), std::streamsize(key.size()));
    put(out, std::int64_t(state.chains.size()));
    for (const LanczosChainState& c : state.chains) {
      put(out, c.steps);
      put(out, std::int64_t(c.stop));
      put(out, c.start_vHv);
      put(out, c.start_Hv_sqnorm);
      for (double a : c.alpha) put(out, a);
      for (double b : c.beta) put(out, b);
    }
    put(out, kTrailer);
  }
  write_file_atomically(state_path(), out.str());
}

int FileLanczosStore::basis() {
  if (fd_ < 0) {
    fd_ = ::open(basis_path().c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd_ < 0) fail(basis_path(), ": cannot open the spectrum's basis file: ", std::strerror(errno));
  }
  return fd_;
}

void FileLanczosStore::write(std::int64_t offset, const double* x, std::int64_t count) {
  const int fd = basis();
  const auto* p = reinterpret_cast<const char*>(x);
  std::size_t left = sizeof(double) * std::size_t(count);
  off_t at = off_t(offset) * off_t(sizeof(double));
  while (left > 0) {
    const ssize_t w = ::pwrite(fd, p, left, at);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) fail(basis_path(), ": cannot write the spectrum's basis at byte ", at, ": ", std::strerror(errno));
    p += w;
    at += w;
    left -= std::size_t(w);
  }
}

void FileLanczosStore::read(std::int64_t offset, double* x, std::int64_t count) {
  const int fd = basis();
  auto* p = reinterpret_cast<char*>(x);
  std::size_t left = sizeof(double) * std::size_t(count);
  off_t at = off_t(offset) * off_t(sizeof(double));
  while (left > 0) {
    const ssize_t r = ::pread(fd, p, left, at);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0)
      fail(basis_path(), ": the spectrum's basis ends at byte ", at, " before the saved state's steps (", state_path(),
           "); remove both files to start the spectrum afresh");
    p += r;
    at += r;
    left -= std::size_t(r);
  }
}

void FileLanczosStore::sync() {
  if (fd_ >= 0 && ::fdatasync(fd_) != 0) fail(basis_path(), ": fdatasync failed: ", std::strerror(errno));
}

void FileLanczosStore::remove(const std::string& prefix) {
  std::remove((prefix + ".state").c_str());
  std::remove((prefix + ".basis").c_str());
}

}  // namespace gnh
