// SPDX-License-Identifier: BSD-3-Clause
#include "kernels/gemm_probe.hpp"

#include "core/isa.hpp"

#include <KokkosBlas3_gemm.hpp>
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <limits>
#include <sstream>
#include <tuple>
#include <utility>

#include "kernels/host_parallel.hpp"

namespace gnh::kernels {
namespace {

using HostMatrix = Kokkos::View<float**, Kokkos::LayoutRight, Kokkos::HostSpace>;

template <class F>
double seconds(F&& f) {
  const auto t0 = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// The best of `repeats` runs of each, taken in turns: a, b, a, b, ... Whatever
// else the node is doing then (other ranks probing, another job) falls on both
// alike, where timing all of a's runs and then all of b's could give one of them
// a quiet second and the other a busy one.
template <class A, class B>
std::pair<double, double> best_seconds_interleaved(int repeats, A&& a, B&& b) {
  a();  // warm-up: first touch, packing buffers, the BLAS's own initialisation
  b();
  double best_a = std::numeric_limits<double>::infinity(), best_b = best_a;
  for (int r = 0; r < std::max(repeats, 1); ++r) {
    best_a = std::min(best_a, seconds(a));
    best_b = std::min(best_b, seconds(b));
  }
  return {best_a, best_b};
}

void fill(HostMatrix a, std::uint32_t seed) {
  float* p = a.data();
  for (std::size_t i = 0; i < a.size(); ++i) {
    seed = seed * 1664525u + 1013904223u;
    p[i] = float(seed >> 8) * (1.0f / 16777216.0f) - 0.5f;
  }
}

}  // namespace

host::GemmKernel decide_host_gemm(host::GemmKernel native, double native_seconds, double vendor_seconds,
                                  double margin) {
  if (native == host::GemmKernel::none) return native;
  return native_seconds > (1.0 + margin) * vendor_seconds ? host::GemmKernel::none : native;
}

double GemmProbe::native_total() const {
  double t = 0;
  for (const auto& e : entries) t += e.native_seconds;
  return t;
}

double GemmProbe::vendor_total() const {
  double t = 0;
  for (const auto& e : entries) t += e.vendor_seconds;
  return t;
}

std::string GemmProbe::json() const {
  std::ostringstream js;
  js << "{\"host_isa\": \"" << host_isa_level() << "\", \"native\": \"" << host::name(native) << "\", \"chosen\": \""
     << host::name(chosen) << "\", \"threads\": " << threads << ", \"probed\": " << (probed ? "true" : "false")
     << ", \"margin\": " << margin << ", \"rule\": \"vendor only when gnh's kernel takes more than (1 + margin) "
     << "times its time\", \"reason\": \"" << reason << "\"";
  if (!forced_by_test.empty()) js << ", \"forced_by_test\": \"" << forced_by_test << "\"";
  js << ", \"shapes\": [";
  for (std::size_t i = 0; i < entries.size(); ++i) {
    const auto& e = entries[i];
    js << (i ? ", " : "") << "{\"what\": \"" << e.shape.what << "\", \"op\": \"" << (e.shape.ta ? 'T' : 'N')
       << (e.shape.tb ? 'T' : 'N') << "\", \"m\": " << e.shape.m << ", \"n\": " << e.shape.n << ", \"k\": " << e.shape.k
       << ", \"native_gflops\": " << e.gflops(e.native_seconds) << ", \"vendor_gflops\": " << e.gflops(e.vendor_seconds)
       << "}";
  }
  js << "]}";
  return js.str();
}

std::vector<GemmShape> model_gemm_shapes(index_t n_embd, index_t vocab_size, index_t rows) {
  const index_t N = std::clamp<index_t>(rows, 1, 512), C = n_embd;
  const index_t V = std::min<index_t>(vocab_size, 4096);  // the LM head's vocabulary tile
  std::vector<GemmShape> out;
  auto linear = [&](const char* name, index_t in, index_t o) {
    out.push_back({false, true, N, o, in, std::string(name) + " forward"});
    out.push_back({false, false, N, in, o, std::string(name) + " input adjoint"});
    out.push_back({true, false, o, in, N, std::string(name) + " weight adjoint"});
  };
  linear("c_attn", C, 3 * C);
  linear("attn.c_proj", C, C);
  linear("c_fc", C, 4 * C);
  linear("mlp.c_proj", 4 * C, C);
  linear("lm_head", C, V);
  return out;
}

GemmProbe probe_host_gemm(const std::vector<GemmShape>& shapes, int repeats) {
  GemmProbe p;
  // Both on every thread of the host space, as kernels::gemm runs them.
  const Kokkos::DefaultHostExecutionSpace host_space;
  p.threads = host_space.concurrency();
  p.native = host::native_kernel();
  p.chosen = p.native;
  if (p.native == host::GemmKernel::none) {
    p.reason = "no gnh kernel for this CPU: vendor BLAS";
    return p;
  }
  for (const auto& s : shapes) {
    HostMatrix A("gnh::probe::A", s.ta ? s.k : s.m, s.ta ? s.m : s.k);
    HostMatrix B("gnh::probe::B", s.tb ? s.n : s.k, s.tb ? s.k : s.n);
    HostMatrix C("gnh::probe::C", s.m, s.n);
    fill(A, 1);
    fill(B, 2);
    GemmProbeEntry e;
    e.shape = s;
    std::tie(e.native_seconds, e.vendor_seconds) = best_seconds_interleaved(
        repeats,
        [&] {
          host::sgemm_on(host_space, p.native, s.ta, s.tb, s.m, s.n, s.k, 1.0f, A.data(), A.extent(1), B.data(),
                         B.extent(1), 0.0f, C.data(), C.extent(1));
          host_space.fence();
        },
        [&] {
          if (!host::sgemm_on(host_space, host::GemmKernel::none, s.ta, s.tb, s.m, s.n, s.k, 1.0f, A.data(),
                              A.extent(1), B.data(), B.extent(1), 0.0f, C.data(), C.extent(1)))
            KokkosBlas::gemm(s.ta ? "T" : "N", s.tb ? "T" : "N", 1.0f, A, B, 0.0f, C);
          host_space.fence();
        });
    p.entries.push_back(e);
  }
  p.probed = true;
  const double tn = p.native_total(), tv = p.vendor_total();
  p.chosen = decide_host_gemm(p.native, tn, tv, p.margin);
  double flops = 0;
  for (const auto& x : p.entries) flops += 2.0 * double(x.shape.m) * double(x.shape.n) * double(x.shape.k);
  char line[240];
  std::snprintf(line, sizeof(line),
                "probe of %zu model shapes on %d thread(s): %s %.1f GFLOP/s, vendor BLAS %.1f GFLOP/s; "
                "vendor only when faster by more than %.0f%%",
                p.entries.size(), p.threads, host::name(p.native), flops / tn * 1e-9, flops / tv * 1e-9,
                100 * p.margin);
  p.reason = line;
  if (const char* w = std::getenv("GNH_TEST_ONLY_PROBE_WINNER")) {
    const std::string winner = w;
    if (winner != "native" && winner != "vendor")
      throw std::invalid_argument("GNH_TEST_ONLY_PROBE_WINNER=" + winner + ": expected native or vendor");
    p.forced_by_test = winner;
    p.chosen = winner == "vendor" ? host::GemmKernel::none : p.native;
    p.reason += "; decided by GNH_TEST_ONLY_PROBE_WINNER (a variable for tests only)";
  }
  return p;
}

GemmProbe choose_host_gemm(index_t n_embd, index_t vocab_size, index_t rows) {
  GemmProbe p;
  if (host::kernel_forced()) {
    p.native = p.chosen = host::native_kernel();
    p.reason = "pinned by GNH_HOST_GEMM";
  } else {
    p = probe_host_gemm(model_gemm_shapes(n_embd, vocab_size, rows));
  }
  host::select_kernel(p.chosen);
  return p;
}

}  // namespace gnh::kernels
