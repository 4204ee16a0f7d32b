// SPDX-License-Identifier: BSD-3-Clause
// A campaign's host GEMM choice, made once per CPU class: the first run of an
// output (or `gnh plan` for its shards) probes (kernels/gemm_probe.hpp) and
// records its choice beside the output, in OUTPUT.host-gemm.json; every later
// run of the campaign on a node of that class (a resume, a resubmitted shard,
// the other shards of a plan) multiplies with the recorded kernel and says so.
// A node of another class probes for itself and adds its class. The record is
// read and written under a lock (OUTPUT.host-gemm.json.lock), so shards that
// start together on a new class probe once. GNH_HOST_GEMM still wins, and is
// recorded where the class has no record yet.
#pragma once
#include <string>

#include "core/types.hpp"

namespace gnh {

struct GemmChoice {
  std::string kernel;  // host::name of the kernel: "avx512", "avx2" or "vendor"
  std::string probe;   // the probe behind it (JSON), as recorded
  std::string how;     // for the log line: where the choice came from
};

// OUTPUT with ".h5" replaced by ".host-gemm.json".
std::string gemm_record_path(const std::string& campaign_output);

// One process (rank 0): the recorded choice for this CPU class, or a probe of
// the model's GEMM shapes (n_embd, vocab_size, rows) recorded for it. `who`
// names the command in the record ("gnh run", "gnh plan"). Selects nothing.
GemmChoice campaign_host_gemm(const std::string& campaign_output, const std::string& who, index_t n_embd,
                              index_t vocab_size, index_t rows);

}  // namespace gnh
