// SPDX-License-Identifier: BSD-3-Clause
#include "kernel_profile.hpp"

#include <Kokkos_Core.hpp>
#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>
#ifdef KOKKOS_ENABLE_CUDA
#include <cuda_runtime.h>
#endif

namespace gnh::perf {
namespace {

using SpaceHandle = Kokkos::Tools::SpaceHandle;

// Memory of the default execution space (its memory space's name).
bool ours(const SpaceHandle& h) {
  return std::strcmp(h.name, Kokkos::DefaultExecutionSpace::memory_space::name()) == 0;
}

std::size_t g_current = 0, g_peak = 0, g_device_peak = 0;
bool g_installed = false;

void on_allocate(const SpaceHandle h, const char*, const void*, const std::uint64_t size) {
  if (!ours(h)) return;
  g_current += size;
  g_peak = std::max(g_peak, g_current);
}

void on_deallocate(const SpaceHandle h, const char*, const void*, const std::uint64_t size) {
  if (ours(h)) g_current -= std::min<std::size_t>(g_current, size);
}

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// Fences, samples the device's memory in use, returns the time.
double fenced_now() {
  Kokkos::fence();
#ifdef KOKKOS_ENABLE_CUDA
  std::size_t free = 0, total = 0;
  if (cudaMemGetInfo(&free, &total) == cudaSuccess) g_device_peak = std::max(g_device_peak, total - free);
#endif
  return now();
}

struct Open {
  std::string label;
  double start = 0, nested = 0;
  bool kernel = false;  // a parallel_for/_reduce/_scan, not a region
  long calls = 0;       // a GEMM region's library calls (gnh::gemm::call regions inside it)
};
std::vector<Open> g_stack;
std::map<std::string, LabelTime> g_labels;
bool g_recording = false;

// A GEMM entry point's region (kernels/blas.hpp, gemm_mapped.cpp): one library call.
bool gemm_region(const std::string& label) { return label.rfind("gnh::gemm", 0) == 0; }
// bf16-amp's operand copies (kernels/blas.hpp): kernels of their own on a GPU
// too, before the library call, the same copies on every backend.
bool bf16_copy(const std::string& label) { return label == "gnh::gemm::round_bf16" || label == "gnh::gemm::to_bf16"; }
// One library call of a GEMM entry point that makes several (bf16-amp's
// chunks: kernels/blas.hpp): a launch of the region around it, not a label.
bool library_call(const std::string& label) { return label == "gnh::gemm::call"; }
bool inside_gemm() {
  for (const Open& o : g_stack)
    if (!o.kernel && gemm_region(o.label)) return true;
  return false;
}

void open(const char* name, bool kernel) {
  if (!g_recording) return;
  g_stack.push_back({name, fenced_now(), 0.0, kernel});
}

void close() {
  if (!g_recording || g_stack.empty()) return;
  const double t = fenced_now();
  const Open o = g_stack.back();
  g_stack.pop_back();
  const double elapsed = t - o.start;
  if (library_call(o.label)) {
    // Its time (less any kernel inside) stays the enclosing region's; that
    // region counts its calls.
    for (auto it = g_stack.rbegin(); it != g_stack.rend(); ++it)
      if (!it->kernel && gemm_region(it->label) && !library_call(it->label)) {
        it->calls += 1;
        break;
      }
    if (!g_stack.empty()) g_stack.back().nested += o.nested;
    return;
  }
  LabelTime& l = g_labels[o.label];
  l.label = o.label;
  l.seconds += elapsed - o.nested;
  l.launches += 1;
  if (o.kernel) l.kernels += 1;
  if ((o.kernel || gemm_region(o.label)) && (!inside_gemm() || (o.kernel && bf16_copy(o.label))))
    l.device_launches += o.kernel || o.calls == 0 ? 1 : o.calls;
  if (!g_stack.empty()) g_stack.back().nested += elapsed;
}

void on_begin_kernel(const char* name, const std::uint32_t, std::uint64_t* id) {
  *id = g_stack.size();
  open(name, true);
}
void on_end_kernel(const std::uint64_t) { close(); }
void on_push(const char* name) { open(name, false); }
void on_pop() { close(); }

// The kernel and region callbacks are set only while a profile records: a
// set kernel callback makes Kokkos fence around every kernel.
void set_kernel_callbacks(bool on) {
  namespace T = Kokkos::Tools::Experimental;
  T::set_begin_parallel_for_callback(on ? on_begin_kernel : nullptr);
  T::set_end_parallel_for_callback(on ? on_end_kernel : nullptr);
  T::set_begin_parallel_reduce_callback(on ? on_begin_kernel : nullptr);
  T::set_end_parallel_reduce_callback(on ? on_end_kernel : nullptr);
  T::set_begin_parallel_scan_callback(on ? on_begin_kernel : nullptr);
  T::set_end_parallel_scan_callback(on ? on_end_kernel : nullptr);
  T::set_push_region_callback(on ? on_push : nullptr);
  T::set_pop_region_callback(on ? on_pop : nullptr);
}

}  // namespace

void MemoryWatch::install() {
  if (g_installed) return;
  Kokkos::Tools::Experimental::set_allocate_data_callback(on_allocate);
  Kokkos::Tools::Experimental::set_deallocate_data_callback(on_deallocate);
  g_installed = true;
}

void MemoryWatch::reset_peak() {
  g_peak = g_current;
  g_device_peak = 0;
}
std::size_t MemoryWatch::peak_bytes() { return g_peak; }
std::size_t MemoryWatch::current_bytes() { return g_current; }
std::size_t MemoryWatch::sampled_device_peak_bytes() { return g_device_peak; }

void KernelProfile::start() {
  MemoryWatch::install();
  g_labels.clear();
  g_stack.clear();
  t0_ = fenced_now();
  g_recording = true;
  set_kernel_callbacks(true);
}

std::vector<LabelTime> KernelProfile::stop() {
  const double t1 = fenced_now();
  g_recording = false;
  set_kernel_callbacks(false);
  total_ = t1 - t0_;
  std::vector<LabelTime> out;
  double labelled = 0;
  for (const auto& [label, l] : g_labels) {
    out.push_back(l);
    labelled += l.seconds;
  }
  // Host time outside every kernel and region (planning, host loops, launches).
  if (total_ > labelled) out.push_back({"(outside kernels and regions)", total_ - labelled, 0});
  std::sort(out.begin(), out.end(), [](const LabelTime& a, const LabelTime& b) { return a.seconds > b.seconds; });
  return out;
}

}  // namespace gnh::perf
