// SPDX-License-Identifier: BSD-3-Clause
// What every command that analyses a deck does first, on every rank: parse the
// deck, expand and hash the checkpoints, group identical states, check their
// configurations agree, load and validate the data. Every user error stops
// every rank here, before any expensive work.
#pragma once
#include <string>
#include <vector>

#include "analysis/settings.hpp"
#include "driver/gemm_record.hpp"
#include "io/deck.hpp"
#include "io/results.hpp"
#include "io/tokens.hpp"
#include "model/config.hpp"
#include "parallel/comm.hpp"

namespace gnh {

struct CheckpointFile {
  std::string path;     // as found
  std::string name;     // file name
  bool hashed = false;  // its values were read and hashed while planning (no stored param_sha256)
};

struct LoadedCase {
  std::string name;
  DataCaseSpec spec;
  TokenSource source;     // opened and checked
  TokenFile data;         // the whole source, where the case analyses it whole (not spec.windowed())
  index_t available = 0;  // samples the source holds in the case's layout
  // Samples analysed: the most of any state where they are tied to its step
  // (the plan's size), else every state's.
  index_t blocks = 0;
  index_t stride = 0;  // tokens from one block's first to the next's (DataCaseSpec::stride)
};

// The tokens of one case for one state: samples [first, end) of the case's
// layout, block 0 at ids.
struct CaseTokens {
  std::vector<std::int32_t> owned;  // read for this state (a windowed case)
  const std::int32_t* ids = nullptr;
  index_t blocks = 0, first = 0, end = 0;
  std::string sha256;  // of the tokens from block 0's first to the last block's last target
};

struct Campaign {
  Deck deck;
  std::vector<CheckpointFile> files;
  ModelConfig cfg;
  std::vector<LoadedCase> cases;
  std::vector<GroupRecord> groups;  // identical states grouped, first appearance order
  // A shard's campaign (gnh run --shard): every group of the campaign, which
  // GroupRecord::partner indexes (the update's partner may be another shard's).
  std::vector<GroupRecord> all_groups;
  RunInfo info;
  std::string output;  // run.output resolved
};

// The samples [first, end) a case analyses for state g (checked when the
// campaign was prepared).
std::pair<index_t, index_t> case_samples(const Deck& deck, const LoadedCase& cs, const GroupRecord& g);
// The tokens of case cs for state g: a windowed case's read from its source
// (each checked against the vocabulary), another's taken from the whole
// source in memory.
CaseTokens case_tokens(const Campaign& c, const LoadedCase& cs, const GroupRecord& g);
// Whether a complete group file's windowed cases hold the tokens of `tokens`
// (the fingerprint names a windowed case's selection, not its tokens).
bool same_case_tokens(const std::string& path, const Campaign& c, const std::vector<CaseTokens>& tokens);

// Groups checkpoints by their stored param_sha256 (the header only), or by
// reading and hashing the values of a file that has none. With read_values,
// every file is read and validated in full (the dry run's check).
Campaign prepare_campaign(const Comm& comm, const std::string& deck, const std::vector<std::string>& overrides,
                          bool quiet, bool read_values = false);
// Sets analysis.directions_per_pass and analysis.hvp_batch of a prepared
// campaign in place (--fit-memory's choice); nothing is read again. The deck
// text in hand is parsed again with the two as --set, so that they are
// validated as a --set is and the effective deck (echoed into the output)
// shows them; the settings fingerprint follows. Collective.
struct PassSizes {
  index_t directions_per_pass, hvp_batch, grad_microbatch, parameter_shards;
};
void set_pass_sizes(const Comm& comm, Campaign& c, const PassSizes& sizes);
// The settings fingerprint: a hash of everything that changes a number in the
// results (every [analysis] key, the data, the model, the precision, gnh's version).
std::string settings_fingerprint(const Deck& d, const ModelConfig& cfg, const std::vector<LoadedCase>& cases);
// The host's dense float GEMM for this run: the campaign's choice for this CPU
// class (driver/gemm_record.hpp; campaign_output is run.output, a shard's
// too), taken by rank 0, selected on every rank; recorded in c.info with the
// vector-loop level, and printed. Without float GEMMs (fp64 only) nothing is
// probed: the vendor BLAS multiplies.
// The campaign's host GEMM for this CPU class, recorded beside campaign_output
// (driver/gemm_record.hpp), probed on the model's GEMM shapes where there is
// none; `who` names the command in the record. One process.
GemmChoice campaign_gemm_choice(const Campaign& c, const std::string& campaign_output, const char* who);
void choose_host_gemm(const Comm& comm, Campaign& c, const std::string& campaign_output, bool quiet, bool float_gemms);
// One line for the log (rank 0): GNH_ADJOINT_CUTS, whether each second-order
// forward engine of the plan cuts, and the host threads of a rank.
void print_engine_settings(const Comm& comm, const Campaign& c);
// Whether two runs' host threads agree (results of a host build differ in the
// last bits of their dot products otherwise); no record counts as one thread.
bool same_host_threads(const RunInfo& a, const RunInfo& b);
// A group file this run can take as its own: complete with its settings
// fingerprint (and, with partner, update target) and computed with as many
// host threads. A resumed run recomputes the others.
bool group_file_reusable(const std::string& path, const RunInfo& info, const std::string* partner = nullptr);
// The output file of shard I of N: OUTPUT with ".h5" replaced by ".shard-I-of-N.h5".
std::string shard_output(const std::string& output, int index, int count);

}  // namespace gnh
