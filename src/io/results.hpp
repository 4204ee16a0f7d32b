// SPDX-License-Identifier: BSD-3-Clause
// The results of SPEC §8. Every finished group is written atomically
// (temporary file, fsync, rename) as its own file in the run's results
// directory; the final file is merged from those, also atomically, with a
// CSV summary beside it. Layout: doc/outputs.md.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "analysis/statistics.hpp"
#include "io/files.hpp"

namespace gnh {

struct CaseRecord {
  std::string name;  // "seen" | "unseen"
  // The samples [sample_first, sample_end) of the case's layout analysed, and
  // the SHA-256 of their tokens as little-endian int32 (io/tokens.hpp).
  std::int64_t sample_first = 0, sample_end = 0;
  std::string tokens_sha256;
  CaseStatistics stats;
};

struct GroupRecord {
  std::string hash;  // first 16 hex digits of param_sha256
  std::string param_sha256;
  std::vector<std::string> aliases;      // checkpoint file names
  std::vector<std::string> alias_paths;  // as found on disk
  std::int64_t n_params = 0;
  std::optional<std::int64_t> iter_num;
  // The training step (iter_num, else the deck's [checkpoints] steps), where a
  // case's samples are tied to it.
  std::optional<std::int64_t> step;
  // [curvature] preconditioned: which alias's AdamW state gave P, or why none.
  std::string preconditioner;
  // [curvature] update: the next state by iter_num (an index into the
  // whole campaign's groups, Campaign::all_groups in a shard), -1 for the
  // last; and its hash, as written.
  bool ordered = false;  // the campaign asked for updates: partner_hash is recorded
  int partner = -1;
  std::string partner_hash;
  std::vector<CaseRecord> cases;
};

struct RunInfo {
  std::string deck_text;       // the deck file as read
  std::string effective_deck;  // after --set overrides
  std::string settings_fingerprint;
  std::string model_config;
  std::string run_name;
  std::string precision;
  int ranks = 1, ranks_per_checkpoint = 1;
  // parallel.parameter_shards and where its slices of the flat order begin
  // (R + 1 bounds, analysis/team.hpp's ShardLayout); the results do not depend on them.
  int parameter_shards = 1;
  std::vector<std::int64_t> parameter_shard_bounds;
  std::string shard = "0/1";                      // this file's share of the campaign
  std::vector<std::string> campaign_checkpoints;  // every checkpoint file name of the deck
  std::string host_gemm;                          // the dense GEMM's kernel ("avx2", "avx512", "vendor", ...)
  std::string host_gemm_probe;                    // the start-up probe behind the choice (JSON), if one ran
  std::string vector_level;                       // host_isa_level() of the vector loops ("device" on a GPU)
  bool strict_kernels = false;                    // run.strict_kernels: groups of one kernel kind only
  // The campaign's consistency checks of each kind: every state x case (the
  // family over which their false-alarm rate is controlled).
  std::int64_t consistency_family = 0;
  // GNH_ADJOINT_CUTS ("0", "1" or "auto") and, per second-order forward
  // engine the plan builds, whether it cuts (they regroup v^T H v's sums).
  std::string adjoint_cuts, adjoint_cuts_engines;
  // Host builds: a rank's host threads (a kernel's reduction split over the
  // threads may change its last bits with their count; the analysis's dot
  // products do not, analysis/dot.hpp); 0 where the analysis runs on a device.
  int host_threads = 0;
  // gnh merge --accept-failed-identities: the failed checks merged anyway.
  std::vector<std::string> accepted_failed_identities;
};

// What the summary table and the merge need of a group file.
struct GroupSummary {
  std::string hash;
  std::vector<std::string> aliases;
  std::optional<std::int64_t> iter_num;
  std::map<std::string, std::map<std::string, double>> cases;  // case -> scalar attributes
  bool identities_ok = true;
  // How it was computed: "host_gemm avx512, vector loops x86-64-v4, 1 host
  // thread(s)" (the group's attributes, else its file's, for older files).
  std::string kernel_kind;
};

// The kernel kind of a run, as GroupSummary::kernel_kind names its groups'.
std::string kernel_kind(const RunInfo& info);

// The groups of each kernel kind, one line per kind ("<kind>: N group(s): hash,
// ..."), when they hold more than one kind; empty otherwise.
std::vector<std::string> kernel_kinds(const std::vector<GroupSummary>& groups);

// The per-run directory of group files: OUTPUT with ".h5" replaced by ".groups".
std::string groups_directory(const std::string& output);
// OUTPUT with ".h5" replaced by suffix.
std::string with_suffix(const std::string& output, const std::string& suffix);
std::string group_file(const std::string& output, const std::string& hash);

void write_group_file(const std::string& path, const RunInfo& info, const GroupRecord& g);
// True if path is a complete group file written with this settings fingerprint
// (and, with partner, whose update went to that state: "" for none).
bool group_file_complete(const std::string& path, const std::string& fingerprint, const std::string* partner = nullptr);
// The tokens_sha256 of each case of a group file's group (none where unreadable).
std::map<std::string, std::string> group_tokens_sha256(const std::string& path);
GroupSummary read_group_summary(const std::string& path);
// Every group of a results, shard or group file.
std::vector<GroupSummary> read_group_summaries(const std::string& path);
// The run attributes of a results or shard file.
RunInfo read_run_info(const std::string& path);

// Merges every group of the source files (group files or shard files, in
// order) into the final file, atomically, and writes the CSV summary beside it
// (OUTPUT with ".h5" replaced by ".csv"). The root attribute `complete` is 1
// when every checkpoint file name in `expected` is an alias of a merged group,
// else 0, with the absent names in `missing_checkpoints`.
// The CSV summary beside a results file: OUTPUT with ".h5" replaced by ".csv".
std::string csv_path(const std::string& output);

void merge_results(const std::string& output, const RunInfo& info, const std::vector<std::string>& sources,
                   const std::vector<std::string>& expected);

}  // namespace gnh
