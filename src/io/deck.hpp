// SPDX-License-Identifier: BSD-3-Clause
// The TOML input deck of SPEC §6, parsed strictly: unknown keys, wrong types and
// out-of-range values are errors with the deck's line number (or the --set
// override that introduced them). Defaults are documented in doc/deck.md.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "analysis/settings.hpp"

namespace gnh {

struct DataCaseSpec {
  std::string name;              // "seen" | "unseen"
  std::string path;              // as written in the deck
  std::string format = "bin";    // "bin" | "hdf5" | "megatron" | "npy" (io/tokens.hpp)
  std::string dtype = "uint16";  // "uint16" | "uint32" | "hdf5" (a bin file's; the others' is in the file)
  std::string dataset;           // HDF5 dataset (dtype "hdf5")
  // "stream": block i is tokens [i T, i T + T] (overlapping by one); "sequences":
  // sample i is tokens [i S, (i + 1) S), its block the first T + 1 of them.
  std::string layout = "stream";
  std::int64_t sequence_length = 0;  // S, with layout "sequences" (at least T + 1)
  // Tokens from one block's first to the next's.
  std::int64_t stride(std::int64_t context) const { return layout == "sequences" ? sequence_length : context; }
  // The samples (blocks of the layout) analysed: all of them (capped by
  // data.max_blocks); with `samples`, [samples_first, samples_end); with
  // steps_before = W and batch_samples = B, for a state of step s the samples
  // of the W training steps before it, [(s - W) B, s B) (from 0 where s < W).
  std::int64_t samples_first = 0, samples_end = 0;  // samples_end > 0: a fixed range
  std::int64_t steps_before = 0, batch_samples = 0;
  // Read per range (never the whole source), with the range per state where step-tied.
  bool windowed() const { return samples_end > 0 || steps_before > 0; }
  bool step_tied() const { return steps_before > 0; }
};

struct Deck {
  std::string file;            // path of the deck as given
  std::string dir;             // directory relative paths are resolved against
  std::string source_text;     // the file as read
  std::string effective_text;  // the parsed deck after overrides, as TOML
  std::vector<std::string> overrides;

  // [run]
  std::string name;
  std::string output;
  bool strict_kernels = false;  // refuse groups computed with another host GEMM or vector level
  // [checkpoints]
  std::vector<std::string> checkpoint_paths;  // globs
  // [checkpoints] steps: a file-name glob and the training step of the files
  // it matches, for files that do not record their step (iter_num).
  std::vector<std::pair<std::string, std::int64_t>> checkpoint_steps;
  // [checkpoints] learning_rates: a file-name glob and the learning rate at
  // the files it matches, over what a file's AdamW state records (SPEC §13).
  std::vector<std::pair<std::string, double>> checkpoint_learning_rates;
  // [data] (data.context is analysis.context)
  std::int64_t max_blocks = 0;  // 0: the whole epoch
  std::vector<DataCaseSpec> cases;
  // [analysis], data.context and [precision], typed (analysis/settings.hpp)
  AnalysisSettings analysis;
  // [parallel]
  std::int64_t ranks_per_checkpoint = 1;
  // "auto" | "keep" | "recompute": AnalysisSettings::keep_noise_vectors, which
  // "auto" takes as keep where the plan fits the memory (driver/run_memory.hpp).
  std::string noise_vectors = "auto";

  // A path from the deck, resolved against the deck's directory unless absolute.
  std::string resolve(const std::string& p) const;
};

// Reads and validates a deck file; overrides are "section.key=value" strings
// whose value is TOML (a bare word that is not valid TOML is taken as a string).
Deck load_deck(const std::string& path, const std::vector<std::string>& overrides = {});
// Same, from text (name is used in messages, dir to resolve paths).
Deck parse_deck(const std::string& text, const std::string& name, const std::string& dir,
                const std::vector<std::string>& overrides = {});

}  // namespace gnh
