// SPDX-License-Identifier: BSD-3-Clause
// Typed records over Comm::allgather: fields are written and read back in one
// order, as fixed-width integers and length-prefixed strings. For exchanging
// plain structures between ranks without a text format in between.
#pragma once
#include <cstdint>
#include <cstring>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

namespace gnh {

class Pack {
 public:
  Pack& operator<<(std::int64_t v) {
    bytes_.append(reinterpret_cast<const char*>(&v), sizeof v);
    return *this;
  }
  Pack& operator<<(double v) {
    bytes_.append(reinterpret_cast<const char*>(&v), sizeof v);
    return *this;
  }
  Pack& operator<<(const std::string& s) {
    *this << std::int64_t(s.size());
    bytes_ += s;
    return *this;
  }
  template <class V>
  Pack& operator<<(const std::vector<V>& v) {
    *this << std::int64_t(v.size());
    for (const auto& x : v) *this << x;
    return *this;
  }
  template <class V>
  Pack& operator<<(const std::map<std::string, V>& m) {
    *this << std::int64_t(m.size());
    for (const auto& [k, v] : m) *this << k << v;
    return *this;
  }
  const std::string& bytes() const { return bytes_; }

 private:
  std::string bytes_;
};

class Unpack {
 public:
  explicit Unpack(const std::string& bytes) : bytes_(bytes) {}
  bool done() const { return at_ == bytes_.size(); }
  Unpack& operator>>(std::int64_t& v) {
    take(&v, sizeof v);
    return *this;
  }
  Unpack& operator>>(double& v) {
    take(&v, sizeof v);
    return *this;
  }
  template <class V>
  Unpack& operator>>(std::vector<V>& v) {
    v.resize(count());
    for (auto& x : v) *this >> x;
    return *this;
  }
  template <class V>
  Unpack& operator>>(std::map<std::string, V>& m) {
    m.clear();
    for (std::size_t n = count(); n > 0; --n) {
      std::string k;
      *this >> k >> m[k];
    }
    return *this;
  }
  Unpack& operator>>(std::string& s) {
    std::int64_t n = 0;
    *this >> n;
    if (n < 0 || std::size_t(n) > bytes_.size() - at_) throw std::logic_error("gnh::Unpack: short record");
    s.assign(bytes_, at_, std::size_t(n));
    at_ += std::size_t(n);
    return *this;
  }

 private:
  std::size_t count() {
    std::int64_t n = 0;
    *this >> n;
    if (n < 0 || std::size_t(n) > bytes_.size() - at_) throw std::logic_error("gnh::Unpack: short record");
    return std::size_t(n);
  }
  void take(void* dst, std::size_t n) {
    if (n > bytes_.size() - at_) throw std::logic_error("gnh::Unpack: short record");
    std::memcpy(dst, bytes_.data() + at_, n);
    at_ += n;
  }
  const std::string& bytes_;
  std::size_t at_ = 0;
};

}  // namespace gnh
