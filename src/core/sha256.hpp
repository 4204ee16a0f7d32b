// SPDX-License-Identifier: BSD-3-Clause
// SHA-256 (FIPS 180-4) for content hashes of parameter states, data files and
// settings fingerprints.
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

namespace gnh {

class Sha256 {
 public:
  Sha256();
  void update(const void* data, std::size_t n);
  void update(const std::string& s) { update(s.data(), s.size()); }
  std::array<std::uint8_t, 32> digest();
  std::string hexdigest();

 private:
  void block(const std::uint8_t* p);
  std::array<std::uint32_t, 8> h_;
  std::array<std::uint8_t, 64> buf_{};
  std::size_t fill_ = 0;
  std::uint64_t bytes_ = 0;
};

std::string sha256_hex(const std::string& s);
// Hex digest of a whole file; throws gnh::Error naming the file when unreadable.
std::string sha256_file(const std::string& path);

}  // namespace gnh
