// SPDX-License-Identifier: BSD-3-Clause
// User-facing errors. Anything a user can fix (deck, files, data) is a gnh::Error
// whose message names the file, key, tensor or offset; main catches it once and
// exits non-zero on every rank without an MPI abort.
#pragma once
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace gnh {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

// Thrown on ranks that did not see a problem themselves but must stop because
// another rank did; main exits quietly (the failing rank printed the message).
class ErrorElsewhere : public std::runtime_error {
 public:
  explicit ErrorElsewhere(int rank)
      : std::runtime_error("error reported by rank " + std::to_string(rank)), rank_(rank) {}
  int rank() const { return rank_; }

 private:
  int rank_;
};

template <class... Args>
std::string cat(Args&&... args) {
  std::ostringstream s;
  (s << ... << std::forward<Args>(args));
  return s.str();
}

template <class... Args>
[[noreturn]] void fail(Args&&... args) {
  throw Error(cat(std::forward<Args>(args)...));
}

}  // namespace gnh
