// SPDX-License-Identifier: BSD-3-Clause
// In-process Kokkos Tools callbacks for the benchmarks (no tool library to
// load, the same on every backend):
//   - MemoryWatch: bytes held in Kokkos allocations and their high-water
//     mark, per memory space, from the allocation callbacks (always on once
//     installed); on a GPU build the device's high-water mark is also sampled
//     from cudaMemGetInfo while a profile records, which counts what Kokkos
//     does not allocate (cuBLAS workspaces);
//   - KernelProfile: while recording, each kernel (parallel_for, _reduce,
//     _scan) and each region (the GEMM entry points are regions) is fenced
//     before and after, and its exclusive time and launch count are summed
//     by label, and the launches a GPU would see of it (LabelTime). Fencing
//     serialises the pass, so a profile is run apart from the timed repeats
//     and its total is reported beside theirs.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "kernels/gemm_ledger.hpp"

namespace gnh::perf {

struct MemoryWatch {
  // Installs the allocation callbacks (idempotent; after Kokkos::initialize).
  static void install();
  // Starts a new high-water mark at the bytes held now.
  static void reset_peak();
  // High-water mark of the default execution space's memory since reset_peak.
  static std::size_t peak_bytes();
  // Bytes held now in the default execution space's memory.
  static std::size_t current_bytes();
  // Device bytes in use (total - free, cudaMemGetInfo) at their highest while
  // a profile recorded since reset_peak; 0 on host builds.
  static std::size_t sampled_device_peak_bytes();
};

struct LabelTime {
  std::string label;
  double seconds = 0;  // exclusive: minus the time of kernels and regions nested in it
  long launches = 0;
  // What a GPU launches of it: a kernel, or a GEMM entry point's region (one
  // library call, or as many as it makes: bf16-amp's chunks and groups, each
  // a gnh::gemm::call region inside it), not nested in a GEMM entry point
  // (whose host loops, panels are the library's business), or one of
  // bf16-amp's operand copies (kernels of their own before the call, on
  // every backend); other regions 0.
  long device_launches = 0;
  // Kernels alone (parallel_for, _reduce, _scan), nested or not: what a
  // Kokkos Tools library's kernel callbacks count.
  long kernels = 0;
};

class KernelProfile {
 public:
  // Records until stop(); one profile at a time.
  void start();
  // Stops recording. Returns the labels by descending exclusive time.
  std::vector<LabelTime> stop();
  // Fenced wall time between start() and stop().
  double total_seconds() const { return total_; }

 private:
  double t0_ = 0, total_ = 0;
};

// One run of a pass with every kernel and region profiled and the work
// ledger (kernels/gemm_ledger.hpp) recording: its labels, longest first, and
// the work it issued.
struct RecordedRun {
  std::vector<LabelTime> labels;
  kernels::GemmWork work;
  double seconds = 0;  // fenced, with the profile's fences
};
// scale: the miniature's (kernels::GemmWork::scale).
template <class F>
RecordedRun record_run(F&& pass, int scale = 1) {
  KernelProfile p;
  kernels::GemmWork& w = kernels::gemm_work();
  w = kernels::GemmWork();
  w.on = true;
  w.scale = scale;
  p.start();
  pass();
  RecordedRun r;
  r.labels = p.stop();
  w.on = false;
  r.work = w;
  r.seconds = p.total_seconds();
  return r;
}

}  // namespace gnh::perf
