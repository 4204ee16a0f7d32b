// SPDX-License-Identifier: BSD-3-Clause
// Reader for the HDF5 checkpoint of SPEC §2.
#pragma once
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "model/config.hpp"

namespace gnh {

// What a checkpoint says of itself without its parameter values: cheap to
// read (attributes and dataset headers), enough to plan a campaign.
struct CheckpointHeader {
  std::string path;
  ModelConfig config;
  std::int64_t n_params = 0;
  // The converter's param_sha256 attribute (gnh-convert writes it); files from
  // older converters have none and must be read in full to be grouped.
  std::optional<std::string> stored_sha256;
  std::string source_file, source_sha256;
  std::optional<std::int64_t> iter_num;
};

struct Checkpoint : CheckpointHeader {
  std::vector<float> params;  // flat, canonical order (ParamLayout)
  std::string param_sha256;   // of the float32 little-endian flat vector, computed from the values read
};

// Reads only the root and /config attributes.
ModelConfig read_checkpoint_config(const std::string& path);

// Reads and validates the header: format, config, every tensor present with
// the right shape and dtype, no unknown tensors; no values. Throws gnh::Error
// naming the file and the tensor.
CheckpointHeader read_checkpoint_header(const std::string& path);

// Reads and validates everything: the header, all values finite, and the
// hash of the values read equal to the stored param_sha256 where there is one.
Checkpoint read_checkpoint(const std::string& path);

// The AdamW state of /optimizer (SPEC §2), as gnh-convert writes it.
struct AdamState {
  std::int64_t step = 0;
  double beta1 = 0, beta2 = 0, eps = 0;
  double lr = std::numeric_limits<double>::quiet_NaN();  // the learning rate at the state (NaN: not recorded)
  std::vector<float> exp_avg_sq;                         // flat, canonical order
};

// The file's AdamW state, validated (every tensor present, float32, the
// parameter's shape, finite and >= 0; step >= 1; 0 <= beta2 < 1; eps >= 0),
// or nothing when the file has no /optimizer. Throws gnh::Error naming the
// file, the attribute or the tensor.
std::optional<AdamState> read_adam_state(const std::string& path);
// The same without its tensors (exp_avg_sq left empty): the hyperparameters.
std::optional<AdamState> read_adam_hyperparameters(const std::string& path);
// The same with exp_avg_sq's values [lo, hi) of the flat order only (a
// sharded run's slice), read by hyperslab; every tensor's type and shape is
// checked all the same.
std::optional<AdamState> read_adam_state_slice(const std::string& path, std::int64_t lo, std::int64_t hi);

// SPEC §10's preconditioner P = 1/(sqrt(v_hat) + eps), v_hat = exp_avg_sq /
// (1 - beta2^step), flat (the values [lo, lo + exp_avg_sq's size) of it);
// throws naming the file, tensor and index where it is not finite (eps = 0
// with a zero second moment).
std::vector<double> adam_preconditioner(const AdamState& s, const ModelConfig& cfg, const std::string& path,
                                        std::int64_t lo = 0);

// Content hash of a flat parameter vector (what groups identical states).
std::string params_sha256(const std::vector<float>& params);

// Values [lo, hi) of the flat canonical parameter vector (the slice a rank of
// a sharded run holds), read by hyperslab from the tensors the range crosses,
// never the whole vector; the header is validated as by
// read_checkpoint_header and the values read checked finite. Throws naming
// the file and the tensor.
std::vector<float> read_param_slice(const std::string& path, std::int64_t lo, std::int64_t hi);

// The file's parameter vector hashed as params_sha256 does, read in canonical
// order `block` values at a time (one block in memory, never the vector):
// how a sharded run, whose ranks hold slices only, checks a file against
// its param_sha256. Throws naming the file when a value is not finite or the
// hash differs from the stored one; returns the hash.
std::string verify_param_hash(const std::string& path, std::int64_t block = std::int64_t(1) << 22);

}  // namespace gnh
