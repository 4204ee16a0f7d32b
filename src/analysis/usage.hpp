// SPDX-License-Identifier: BSD-3-Clause
// What the machine has and what a run uses of it, measured (not planned):
// the host's memory and its high-water mark, a GPU's memory in use. Linux.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "analysis/batch_scalars.hpp"

namespace gnh {

// Resets this process's resident high-water mark (/proc/self/clear_refs);
// false where the kernel refuses, and then peak_host_memory() counts from
// the process's start.
bool reset_peak_host_memory();
// This process's resident high-water mark (VmHWM), bytes; -1 if unknown.
std::int64_t peak_host_memory();
// The host memory this process may use: MemTotal, or the cgroup's limit
// where lower; -1 if unknown.
std::int64_t host_memory_total();
// On a CUDA build, the device's memory in use (total - free) and its total;
// -1 on host backends.
std::int64_t device_memory_in_use();
std::int64_t device_memory_total();

// Bytes allocated through Kokkos in the execution space's memory, watched
// from watch_allocations() on (once, after Kokkos::initialize; a program
// with its own Kokkos Tools callbacks does not call it): the high-water mark
// since reset_peak_allocated(), -1 when not watched.
void watch_allocations();
void reset_peak_allocated();
std::int64_t peak_allocated();

// Median and the 10th and 90th percentiles (nearest rank) of x; NaN if empty.
struct Spread {
  double median, p10, p90;
};
Spread spread(std::vector<double> x);

// What one stage of a case measured: its batches' wall times (and per
// direction, a batch's time over its K directions), the device memory in use
// at the batches' ends (GPU builds), and the host high-water mark over the
// stage on this rank.
class StageMeter {
 public:
  void begin();
  void add(const std::vector<BatchScalars>& table, index_t K = 0);
  void add_seconds(double batch_seconds, double direction_seconds = -1);
  // Appends <stage>_batches, <stage>_batch_seconds_{median,p10,p90},
  // <stage>_direction_seconds_{...} (passes with directions),
  // <stage>_peak_host_bytes, <stage>_peak_allocated_bytes (where watched)
  // and <stage>_device_bytes (GPU) to out.
  void end(const std::string& stage, std::vector<std::pair<std::string, double>>& out);

 private:
  std::vector<double> batch_, direction_;
  double device_ = -1;
  bool reset_ = false;
};

}  // namespace gnh
