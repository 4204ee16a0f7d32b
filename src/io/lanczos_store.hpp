// SPDX-License-Identifier: BSD-3-Clause
// The spectrum's state between Lanczos steps (analysis/lanczos.hpp) in two
// files beside the group files: PREFIX.state (the chains' scalars, replaced
// atomically after every step) and PREFIX.basis (the basis, chains x (steps
// + 1) x n_params doubles, each team member writing its own elements in
// place). A run killed mid-spectrum resumes from the last saved step; the
// files go when the group file is written.
#pragma once
#include <string>

#include "analysis/lanczos.hpp"

namespace gnh {

class FileLanczosStore final : public LanczosStore {
 public:
  // key: what the saved state must have been computed for beyond its shape
  // (the settings fingerprint, the state's hash, the case).
  FileLanczosStore(std::string prefix, std::string key);
  ~FileLanczosStore() override;
  FileLanczosStore(const FileLanczosStore&) = delete;
  FileLanczosStore& operator=(const FileLanczosStore&) = delete;

  bool load(LanczosState& state) override;
  void save(const LanczosState& state) override;
  void write(std::int64_t offset, const double* x, std::int64_t count) override;
  void read(std::int64_t offset, double* x, std::int64_t count) override;
  void sync() override;

  std::string state_path() const { return prefix_ + ".state"; }
  std::string basis_path() const { return prefix_ + ".basis"; }
  // Removes both files (after the group file holds the result).
  static void remove(const std::string& prefix);

 private:
  int basis();  // the basis file, opened on first use
  std::string prefix_, key_;
  int fd_ = -1;
};

}  // namespace gnh
