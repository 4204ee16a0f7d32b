// SPDX-License-Identifier: BSD-3-Clause
// bench_kernels: micro-benchmarks of every op of the model in each of its
// modes (forward, reverse, tangent, tangent of reverse, second-order forward),
// on one shape, printing JSON: seconds (median of repeats, with the samples),
// elements per second, and for the matrix-multiply ops achieved GFLOP/s
// against an analytic count and against this run's sgemm rate; and each
// call's cost as recorded: launches, GEMM FLOPs by unit, bytes moved.
//
//   bench_kernels [--shape tiny|small|reference] [--directions K] [--repeats R] [--op NAME] [--mode MODE]
//   bench_kernels --list          the registered ops, one per line
//
// Every op of the registry (kernels/ops.hpp) is timed through its contract
// (kernels/op.hpp) by one loop, at the sizes the model uses it (O::at). Each
// reverse is timed alone: its forward runs once before the timing.
#include <Kokkos_Core.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "core/build_info.hpp"
#include "core/planes.hpp"
#include "kernels/blas.hpp"
#include "kernels/gemm_probe.hpp"
#include "kernels/host_gemm.hpp"
#include "kernels/ops.hpp"
#include "kernel_profile.hpp"

using namespace gnh;
using namespace gnh::kernels;

namespace {

using T = float;

struct Shape {
  index_t B, Tc, H, C, V;
};

// Value, K tangent and K second-order planes of a (rows, cols) activation,
// filled with a smooth deterministic pattern in [-1, 1].
struct Planes {
  View1<T> buf;
  index_t K, rows, cols;
  Planes(index_t K_, index_t r, index_t c, double phase)
      : buf("planes", (1 + 2 * K_) * r * c), K(K_), rows(r), cols(c) {
    auto h = Kokkos::create_mirror_view(buf);
    for (index_t i = 0; i < index_t(h.extent(0)); ++i) h(i) = T(std::sin(0.37 * double(i) + phase));
    Kokkos::deep_copy(buf, h);
  }
  // The planes of scalar S: value, then K tangents (Dual), then K second-order (Jet2).
  template <class S>
  Act2<T> act() const {
    Act2<T> a;
    a.v = Span2<T>(buf.data(), rows, cols);
    if (!std::is_same<S, T>::value) a.d = Span3<T>(buf.data() + rows * cols, K, rows, cols);
    if (std::is_same<S, Jet2<T>>::value) a.dd = Span3<T>(buf.data() + (1 + K) * rows * cols, K, rows, cols);
    return a;
  }
};

struct Flat {
  View1<T> v, d;
  index_t K, P;
  Flat(index_t K_, index_t P_, double scale) : v("p", P_), d("pd", K_ * P_), K(K_), P(P_) {
    auto hv = Kokkos::create_mirror_view(v);
    auto hd = Kokkos::create_mirror_view(d);
    for (index_t i = 0; i < P; ++i) hv(i) = T(scale * std::cos(0.11 * double(i)));
    for (index_t i = 0; i < K * P; ++i) hd(i) = T(scale * std::sin(0.23 * double(i)));
    Kokkos::deep_copy(v, hv);
    Kokkos::deep_copy(d, hd);
  }
  template <class S>
  Params<T> params() const {
    Params<T> p{Span1<const T>(v.data(), P), {}};
    if (!std::is_same<S, T>::value) p.d = Span2<const T>(d.data(), K, P);
    return p;
  }
  template <class S>
  Grads<T> grads() const {
    Grads<T> g{Span1<T>(v.data(), P), {}};
    if (!std::is_same<S, T>::value) g.d = Span2<T>(d.data(), K, P);
    return g;
  }
};

double median_seconds(int repeats, const std::function<void()>& f, std::vector<double>& samples) {
  f();
  Kokkos::fence();
  for (int r = 0; r < repeats; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    Kokkos::fence();
    samples.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::vector<double> s = samples;
  std::sort(s.begin(), s.end());
  return s[s.size() / 2];
}

// What one call costs, recorded (kernel_profile.hpp, kernels/gemm_ledger.hpp):
// the launches a GPU would see of it and every kernel, the GEMM FLOPs by the
// unit a GPU runs them on, the bytes its kernels and products move; beside
// the op's analytic count of its GEMM FLOPs (O::flops).
std::string cost_json(double analytic, const std::function<void()>& f) {
  const perf::RecordedRun r = perf::record_run(f);
  const kernels::GemmWork& w = r.work;
  long device = 0, kernels_run = 0;
  for (const perf::LabelTime& l : r.labels) device += l.device_launches, kernels_run += l.kernels;
  double bytes = 0;
  for (const auto& [label, lw] : w.labels) bytes += lw.total_bytes();
  std::ostringstream s;
  s.precision(17);
  s << "{\"device_launches\": " << device << ", \"kernels\": " << kernels_run
    << ", \"tensor\": " << w.flops(kernels::GemmUnit::tensor) << ", \"fp32\": " << w.flops(kernels::GemmUnit::fp32)
    << ", \"fp64\": " << w.flops(kernels::GemmUnit::fp64) << ", \"bytes\": " << bytes
    << ", \"analytic_gemm_flops\": " << analytic << "}";
  return s.str();
}

struct Report {
  std::ostringstream js;
  int repeats;
  double sgemm_rate;
  bool first = true;
  // flops == 0: not a matrix-multiply op (rates in elements/s only).
  void add(const std::string& op, const std::string& mode, double elements, double flops,
           const std::function<void()>& f) {
    std::vector<double> samples;
    const double t = median_seconds(repeats, f, samples);
    const std::string cost = cost_json(flops, f);
    js << (first ? "\n" : ",\n") << "    {\"op\": \"" << op << "\", \"mode\": \"" << mode << "\", \"seconds\": " << t
       << ", \"samples\": [";
    for (std::size_t i = 0; i < samples.size(); ++i) js << (i ? ", " : "") << samples[i];
    js << "], \"elements_per_s\": " << elements / t;
    if (flops > 0)
      js << ", \"gflops\": " << flops / t * 1e-9 << ", \"fraction_of_sgemm\": " << flops / t * 1e-9 / sgemm_rate;
    js << ", \"cost\": " << cost << "}";
    first = false;
    std::fprintf(stderr, "%-14s %-17s %10.3f ms%s\n", op.c_str(), mode.c_str(), t * 1e3,
                 flops > 0 ? (" " + std::to_string(flops / t * 1e-9) + " GFLOP/s").c_str() : "");
  }
};

double sgemm_rate(index_t n) {
  View2<T> A("A", n, n), B("B", n, n), C("C", n, n);
  Kokkos::deep_copy(A, 0.5f);
  Kokkos::deep_copy(B, 0.25f);
  std::vector<double> s;
  const double t = median_seconds(
      3, [&] { gemm<T>(ExecSpace(), "N", "N", 1.0f, A, B, 0.0f, C); }, s);
  return 2.0 * double(n) * n * n / t * 1e-9;
}

struct ListOps {
  template <class O>
  void operator()() const {
    std::printf("%s\n", O::name);
  }
};

// The buffers of one op at the model sizes, with all planes of K directions.
template <class O>
struct OpBuffers {
  Planes x, y, dy, dx;
  Flat p, g;
  std::vector<Planes> saved;
  OpBuffers(const O& op, index_t K)
      : x(K, op.sizes().rows, op.sizes().in, 0.1),
        y(K, op.sizes().rows, op.sizes().out, 0.2),
        dy(K, op.sizes().rows, op.sizes().out, 0.3),
        dx(K, op.sizes().rows, op.sizes().in, 0.4),
        p(K, op.sizes().params, 0.05),
        g(K, op.sizes().params, 0.0) {
    for (const OpExtent& e : op.saved()) saved.emplace_back(K, e.rows, e.cols, 0.0);
  }
  template <class S>
  OpSaved<T> planes() const {
    OpSaved<T> s;
    for (const Planes& b : saved) s.buf[s.count++] = b.template act<S>();
    return s;
  }
  template <class S>
  void forward(O& op) {
    op.template forward<S>(ExecSpace(), y.act<S>(), x.act<S>(), p.params<S>(), planes<S>());
  }
  template <class S>
  void reverse(O& op) {
    op.template reverse<S>(ExecSpace(), dx.act<S>(), g.grads<S>(), dy.act<S>(), x.act<S>(), y.act<S>(), p.params<S>(),
                           planes<S>());
  }
};

// One op O in every mode, at the model sizes d with K directions.
struct BenchOp {
  Report& rep;
  OpDims dims;
  index_t K;
  std::string only;  // one op's name, or empty for all
  std::string mode;  // one mode's name (op_mode_name), or empty for all
  template <class O>
  void operator()() const {
    if (!only.empty() && only != O::name) return;
    O op = O::at(dims, K);
    const OpSizes sz = op.sizes();
    OpBuffers<O> b(op, K);
    // Elements: the op's outputs, or for the loss head the logits it forms.
    const double elements = double(sz.rows) * double(is_loss_op<O>::value ? sz.params / sz.in : sz.out);
    for (OpMode m : kOpModes) {
      if (!mode.empty() && mode != op_mode_name(m)) continue;
      std::function<void()> run;
      switch (m) {
        case OpMode::forward:
          run = [&] { b.template forward<T>(op); };
          break;
        case OpMode::tangent:
          run = [&] { b.template forward<Dual<T>>(op); };
          break;
        case OpMode::second_order:
          run = [&] { b.template forward<Jet2<T>>(op); };
          break;
        case OpMode::reverse:
          b.template forward<T>(op);
          run = [&] { b.template reverse<T>(op); };
          break;
        case OpMode::tangent_reverse:
          b.template forward<Dual<T>>(op);
          run = [&] { b.template reverse<Dual<T>>(op); };
          break;
      }
      rep.add(O::name, op_mode_name(m), elements, op.flops(m, K), run);
    }
  }
};

}  // namespace

int main(int argc, char** argv) {
  Kokkos::ScopeGuard kokkos(argc, argv);
  std::string shape_name = "small";
  index_t K = 4;
  int repeats = 5;
  std::string only;
  std::string mode;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 < argc && a == "--shape") shape_name = argv[++i];
    else if (i + 1 < argc && a == "--directions") K = std::stol(argv[++i]);
    else if (i + 1 < argc && a == "--repeats") repeats = std::stoi(argv[++i]);
    else if (i + 1 < argc && a == "--op") only = argv[++i];
    else if (i + 1 < argc && a == "--mode") mode = argv[++i];
    else if (a == "--list") {
      Ops::for_each<T>(ListOps{});
      return 0;
    } else {
      std::fprintf(stderr,
                   "usage: bench_kernels [--shape tiny|small|reference] [--directions K] [--repeats R] [--op NAME] "
                   "[--mode MODE] | --list\n");
      return 2;
    }
  }
  Shape sh;
  if (shape_name == "tiny") sh = {2, 16, 2, 16, 64};
  else if (shape_name == "small") sh = {4, 128, 4, 128, 1024};
  else if (shape_name == "reference") sh = {8, 1024, 5, 320, 32000};  // 8 of the 64 sequences of a batch
  else {
    std::fprintf(stderr, "bench_kernels: unknown shape '%s'\n", shape_name.c_str());
    return 2;
  }
  if (K < 1 || repeats < 1) {
    std::fprintf(stderr, "bench_kernels: --directions and --repeats must be >= 1\n");
    return 2;
  }
  const ExecSpace space;
  const index_t B = sh.B, Tc = sh.Tc, H = sh.H, C = sh.C, V = sh.V, N = B * Tc;
  Report rep;
  rep.repeats = repeats;
  // The dense GEMM as `gnh run` chooses it, on a model of this shape's sizes.
  const std::string probe = kernels::choose_host_gemm(C, V, N).json();
  rep.sgemm_rate = sgemm_rate(512);
  rep.js.precision(6);
  rep.js << "{\n  \"context\": {\"tool\": \"gnh bench_kernels\", \"git_commit\": \"" << git_commit()
         << "\", \"build\": \"" << build_configuration() << "\", \"execution_space\": \"" << ExecSpace::name()
         << "\", \"concurrency\": " << space.concurrency() << ", \"host_gemm\": \""
         << host::name(host::selected_kernel()) << "\", \"host_gemm_probe\": " << probe << ", \"shape\": \""
         << shape_name << "\", \"B\": " << B << ", \"T\": " << Tc << ", \"n_head\": " << H << ", \"n_embd\": " << C
         << ", \"vocab\": " << V << ", \"directions\": " << K << "},\n  \"sgemm_gflops\": " << rep.sgemm_rate
         << ",\n  \"kernels\": [";

  Ops::for_each<T>(BenchOp{rep, OpDims{B, Tc, H, C, V}, K, only, mode});
  rep.js << "\n  ]\n}\n";
  std::fputs(rep.js.str().c_str(), stdout);
  return 0;
}
