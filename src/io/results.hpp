// SPDX-License-Identifier: BSD-3-Clause
// The results file of SPEC §8, written atomically (temporary file, fsync, rename).
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace gnh {

struct CaseResult {
  std::string name;  // "seen" | "unseen"
  double loss = 0.0;
  std::int64_t tokens = 0;
  std::int64_t blocks = 0;
  double seconds = 0.0;
  std::string error;  // non-empty: this case failed (e.g. a non-finite loss)
};

struct GroupResult {
  std::string hash;          // group name: first 16 hex digits of param_sha256
  std::string param_sha256;
  std::vector<std::string> aliases;      // checkpoint file names
  std::vector<std::string> alias_paths;  // as found on disk
  std::int64_t n_params = 0;
  std::optional<std::int64_t> iter_num;
  std::int64_t workspace_bytes = 0;
  int rank = 0;
  std::vector<CaseResult> cases;
  std::string error;  // non-empty: the group failed before any case finished
};

struct RunInfo {
  std::string deck_text;        // the deck file as read
  std::string effective_deck;   // after --set overrides
  std::string settings_fingerprint;
  std::string model_config;
  std::string run_name;
  int ranks = 1;
};

void write_results(const std::string& path, const RunInfo& info,
                   const std::vector<GroupResult>& groups);

}  // namespace gnh
