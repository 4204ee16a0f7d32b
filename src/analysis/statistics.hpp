// SPDX-License-Identifier: BSD-3-Clause
// The derived statistics of SPEC §4 from the per-sample measurements of one
// case; definitions and estimators are in doc/statistics.md.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "core/index.hpp"

namespace gnh {

struct CaseMeasurements {
  index_t n_blocks = 0;      // blocks of the epoch
  index_t context = 0;       // tokens per block
  index_t noise_batch = 0;   // B, blocks per noise batch
  double G_sqnorm = 0, GHG = 0;
  std::vector<double> gB_sqnorm, xi_sqnorm, G_dot_xi, xiHxi;  // per noise sample
  std::vector<double> vHv;                                    // per direction
};

struct Estimate {
  double value = 0, se = 0;
};

struct DerivedStatistics {
  double fpc = 1;  // (n-1)/(n-B): finite-population correction of the noise estimators
  Estimate trace_sigma, B_simple, trace_HSigma, B_noise, trace_H;
  double GHG_over_G_sqnorm = 0, eps_star = 0;
  // Batch sizes in tokens (the values above are in sequences).
  Estimate B_simple_tokens, B_noise_tokens;
  // (name, value) pairs in a fixed order, for the output and the CSV table.
  std::vector<std::pair<std::string, double>> named() const;
};

DerivedStatistics derive(const CaseMeasurements& m);

// An identity of SPEC §4 checked on a case's vectors.
struct IdentityCheck {
  std::string name;
  double deviation = 0;  // largest relative deviation found
  double tolerance = 0;  // for the precision
  bool checked = false;  // false where it does not apply (e.g. no partition)
  bool ok() const { return !checked || deviation <= tolerance; }
};

// Everything one case of one parameter state yields: what the results layer
// writes and reads (io/results.hpp), with no engine or device type in it.
struct CaseStatistics {
  double loss = 0;
  std::int64_t tokens = 0;
  CaseMeasurements m;
  DerivedStatistics derived;
  std::vector<std::vector<index_t>> noise_blocks;
  std::vector<IdentityCheck> identities;
  std::vector<std::pair<std::string, double>> timings;  // stage, seconds
  std::int64_t peak_memory_bytes = 0;  // planned memory of the engines and vectors (analysis/memory.hpp)
};

// Mean and standard error (sample sd with ddof 1, over sqrt(count)). Not
// estimable, hence NaN (and absent from the outputs): the mean of no sample,
// the error of fewer than two.
Estimate mean_se(const std::vector<double>& x);

}  // namespace gnh
