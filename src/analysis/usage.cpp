// SPDX-License-Identifier: BSD-3-Clause
#include "analysis/usage.hpp"

#include "core/types.hpp"

#include <Kokkos_Core.hpp>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#if defined(KOKKOS_ENABLE_CUDA)
#include <cuda_runtime.h>
#endif

namespace gnh {
namespace {

// The value of "Key:   N kB" in a /proc file, in bytes; -1 if absent.
std::int64_t proc_kb(const char* path, const char* key) {
  std::ifstream in(path);
  std::string line;
  const std::size_t n = std::strlen(key);
  while (std::getline(in, line))
    if (line.compare(0, n, key) == 0 && line.size() > n && line[n] == ':') {
      long long kb = -1;
      if (std::sscanf(line.c_str() + n + 1, "%lld", &kb) == 1) return std::int64_t(kb) * 1024;
    }
  return -1;
}

bool g_watched = false;
std::int64_t g_allocated = 0, g_peak_allocated = 0;

bool in_execution_memory(const Kokkos::Tools::SpaceHandle& h) {
  return std::strcmp(h.name, ExecSpace::memory_space::name()) == 0;
}
void on_allocate(const Kokkos::Tools::SpaceHandle h, const char*, const void*, const std::uint64_t size) {
  if (!in_execution_memory(h)) return;
  g_allocated += std::int64_t(size);
  g_peak_allocated = std::max(g_peak_allocated, g_allocated);
}
void on_deallocate(const Kokkos::Tools::SpaceHandle h, const char*, const void*, const std::uint64_t size) {
  if (in_execution_memory(h)) g_allocated -= std::int64_t(size);
}

}  // namespace

void watch_allocations() {
  if (g_watched) return;
  Kokkos::Tools::Experimental::set_allocate_data_callback(on_allocate);
  Kokkos::Tools::Experimental::set_deallocate_data_callback(on_deallocate);
  g_watched = true;
}
void reset_peak_allocated() { g_peak_allocated = g_allocated; }
std::int64_t peak_allocated() { return g_watched ? g_peak_allocated : -1; }

bool reset_peak_host_memory() {
  std::FILE* f = std::fopen("/proc/self/clear_refs", "w");
  if (!f) return false;
  const bool ok = std::fputs("5", f) >= 0;
  return std::fclose(f) == 0 && ok;
}

std::int64_t peak_host_memory() { return proc_kb("/proc/self/status", "VmHWM"); }

std::int64_t host_memory_total() {
  std::int64_t total = proc_kb("/proc/meminfo", "MemTotal");
  for (const char* limit : {"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"}) {
    std::ifstream in(limit);
    long long v = 0;
    if (in >> v && v > 0 && (total < 0 || v < total)) total = std::int64_t(v);
  }
  return total;
}

std::int64_t device_memory_in_use() {
#if defined(KOKKOS_ENABLE_CUDA)
  std::size_t free = 0, total = 0;
  if (cudaMemGetInfo(&free, &total) == cudaSuccess) return std::int64_t(total - free);
#endif
  return -1;
}

std::int64_t device_memory_total() {
#if defined(KOKKOS_ENABLE_CUDA)
  std::size_t free = 0, total = 0;
  if (cudaMemGetInfo(&free, &total) == cudaSuccess) return std::int64_t(total);
#endif
  return -1;
}

Spread spread(std::vector<double> x) {
  if (x.empty()) return {NAN, NAN, NAN};
  std::sort(x.begin(), x.end());
  auto at = [&](double q) { return x[std::min(x.size() - 1, std::size_t(q * double(x.size() - 1) + 0.5))]; };
  return {at(0.5), at(0.1), at(0.9)};
}

void StageMeter::begin() {
  batch_.clear();
  direction_.clear();
  device_ = -1;
  reset_ = reset_peak_host_memory();
  reset_peak_allocated();
}

void StageMeter::add(const std::vector<BatchScalars>& table, index_t K) {
  for (const BatchScalars& r : table) {
    if (!r.done) continue;
    add_seconds(r.seconds, K > 0 ? r.seconds / double(K) : -1);
    device_ = std::max(device_, r.device_bytes);
  }
}

void StageMeter::add_seconds(double batch_seconds, double direction_seconds) {
  batch_.push_back(batch_seconds);
  if (direction_seconds >= 0) direction_.push_back(direction_seconds);
}

void StageMeter::end(const std::string& stage, std::vector<std::pair<std::string, double>>& out) {
  out.emplace_back(stage + "_batches", double(batch_.size()));
  const Spread b = spread(batch_);
  out.emplace_back(stage + "_batch_seconds_median", b.median);
  out.emplace_back(stage + "_batch_seconds_p10", b.p10);
  out.emplace_back(stage + "_batch_seconds_p90", b.p90);
  if (!direction_.empty()) {
    const Spread d = spread(direction_);
    out.emplace_back(stage + "_direction_seconds_median", d.median);
    out.emplace_back(stage + "_direction_seconds_p10", d.p10);
    out.emplace_back(stage + "_direction_seconds_p90", d.p90);
  }
  out.emplace_back(stage + "_peak_host_bytes", double(peak_host_memory()));
  if (!reset_) out.emplace_back(stage + "_peak_host_since_start", 1.0);
  if (const std::int64_t a = peak_allocated(); a >= 0) out.emplace_back(stage + "_peak_allocated_bytes", double(a));
  if (device_ >= 0) out.emplace_back(stage + "_device_bytes", device_);
}

}  // namespace gnh
