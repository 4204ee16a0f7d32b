// SPDX-License-Identifier: BSD-3-Clause
// bench_kernels: micro-benchmarks of every op of the model in each of its
// modes (forward, reverse, tangent, tangent of reverse, second-order forward),
// on one shape, printing JSON: seconds (median of repeats, with the samples),
// elements per second, and for the matrix-multiply ops achieved GFLOP/s
// against an analytic count and against this run's sgemm rate.
//
//   bench_kernels [--shape tiny|small|reference] [--directions K] [--repeats R]
//
// Each reverse is timed alone: its forward runs once before the timing.
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
#include "kernels/attention.hpp"
#include "kernels/blas.hpp"
#include "kernels/embedding.hpp"
#include "kernels/gelu.hpp"
#include "kernels/gemm_probe.hpp"
#include "kernels/host_gemm.hpp"
#include "kernels/layernorm.hpp"
#include "kernels/linear.hpp"
#include "kernels/lm_head_xent.hpp"

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
  Planes(index_t K_, index_t r, index_t c, double phase) : buf("planes", (1 + 2 * K_) * r * c), K(K_), rows(r), cols(c) {
    auto h = Kokkos::create_mirror_view(buf);
    for (index_t i = 0; i < index_t(h.extent(0)); ++i) h(i) = T(std::sin(0.37 * double(i) + phase));
    Kokkos::deep_copy(buf, h);
  }
  Act2<T> act(int order) const {
    Act2<T> a;
    a.v = Span2<T>(buf.data(), rows, cols);
    if (order >= 1) a.d = Span3<T>(buf.data() + rows * cols, K, rows, cols);
    if (order >= 2) a.dd = Span3<T>(buf.data() + (1 + K) * rows * cols, K, rows, cols);
    return a;
  }
  Act1<T> act1(int order) const {
    Act1<T> a;
    const index_t n = rows * cols;
    a.v = Span1<T>(buf.data(), n);
    if (order >= 1) a.d = Span2<T>(buf.data() + n, K, n);
    if (order >= 2) a.dd = Span2<T>(buf.data() + (1 + K) * n, K, n);
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
  Params<T> params(int order) const {
    Params<T> p{Span1<const T>(v.data(), P), {}};
    if (order >= 1) p.d = Span2<const T>(d.data(), K, P);
    return p;
  }
  Grads<T> grads(int order) {
    Grads<T> g{Span1<T>(v.data(), P), {}};
    if (order >= 1) g.d = Span2<T>(d.data(), K, P);
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

struct Report {
  std::ostringstream js;
  int repeats;
  double sgemm_rate;
  bool first = true;
  // flops == 0: not a matrix-multiply op (rates in elements/s only).
  void add(const std::string& op, const std::string& mode, double elements, double flops, const std::function<void()>& f) {
    std::vector<double> samples;
    const double t = median_seconds(repeats, f, samples);
    js << (first ? "\n" : ",\n") << "    {\"op\": \"" << op << "\", \"mode\": \"" << mode << "\", \"seconds\": " << t
       << ", \"samples\": [";
    for (std::size_t i = 0; i < samples.size(); ++i) js << (i ? ", " : "") << samples[i];
    js << "], \"elements_per_s\": " << elements / t;
    if (flops > 0) js << ", \"gflops\": " << flops / t * 1e-9 << ", \"fraction_of_sgemm\": " << flops / t * 1e-9 / sgemm_rate;
    js << "}";
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
  const double t = median_seconds(3, [&] { gemm<T>(ExecSpace(), "N", "N", 1.0f, A, B, 0.0f, C); }, s);
  return 2.0 * double(n) * n * n / t * 1e-9;
}

}  // namespace

int main(int argc, char** argv) {
  Kokkos::ScopeGuard kokkos(argc, argv);
  std::string shape_name = "small";
  index_t K = 4;
  int repeats = 5;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 < argc && a == "--shape") shape_name = argv[++i];
    else if (i + 1 < argc && a == "--directions") K = std::stol(argv[++i]);
    else if (i + 1 < argc && a == "--repeats") repeats = std::stoi(argv[++i]);
    else {
      std::fprintf(stderr, "usage: bench_kernels [--shape tiny|small|reference] [--directions K] [--repeats R]\n");
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
  const index_t B = sh.B, Tc = sh.Tc, H = sh.H, C = sh.C, V = sh.V, N = B * Tc, F = 4 * C;
  Report rep;
  rep.repeats = repeats;
  // The dense GEMM as `gnh run` chooses it, on a model of this shape's sizes.
  ModelConfig probe_cfg;
  probe_cfg.n_layer = 1;
  probe_cfg.n_head = int(H);
  probe_cfg.n_embd = int(C);
  probe_cfg.block_size = int(Tc);
  probe_cfg.vocab_size = int(V);
  const std::string probe = kernels::choose_host_gemm(probe_cfg, N).json();
  rep.sgemm_rate = sgemm_rate(512);
  rep.js.precision(6);
  rep.js << "{\n  \"context\": {\"tool\": \"gnh bench_kernels\", \"git_commit\": \"" << git_commit()
         << "\", \"build\": \"" << build_configuration() << "\", \"execution_space\": \"" << ExecSpace::name()
         << "\", \"concurrency\": " << space.concurrency() << ", \"host_gemm\": \""
         << host::name(host::selected_kernel()) << "\", \"host_gemm_probe\": " << probe << ", \"shape\": \""
         << shape_name << "\", \"B\": " << B
         << ", \"T\": " << Tc << ", \"n_head\": " << H << ", \"n_embd\": " << C << ", \"vocab\": " << V
         << ", \"directions\": " << K << "},\n  \"sgemm_gflops\": " << rep.sgemm_rate << ",\n  \"kernels\": [";

  const char* modes[] = {"forward", "tangent", "second-order", "reverse", "tangent-reverse"};
  const int fwd_order[] = {0, 1, 2};
  // ---- linear (N, C) -> (N, 4C), the MLP's c_fc --------------------------------
  {
    Planes x(K, N, C, 0.1), y(K, N, F, 0.2), dy(K, N, F, 0.3), dx(K, N, C, 0.4);
    Flat p(K, F * C, 0.05), g(K, F * C, 0.0);
    const double f1 = 2.0 * N * C * F;
    for (int o : fwd_order)
      rep.add("linear", modes[o], double(N * F), f1 * (o == 0 ? 1 : o == 1 ? 1 + 2 * K : 1 + 4 * K),
              [&] { linear_forward<T>(space, y.act(o), x.act(o), p.params(o), 0, -1); });
    rep.add("linear", "reverse", double(N * F), 2 * f1,
            [&] { linear_reverse<T>(space, dx.act(0), g.grads(0), dy.act(0), x.act(0), p.params(0), 0, -1); });
    rep.add("linear", "tangent-reverse", double(N * F), 2 * f1 * (1 + 2 * K),
            [&] { linear_reverse<T>(space, dx.act(1), g.grads(1), dy.act(1), x.act(1), p.params(1), 0, -1); });
  }
  // ---- layernorm (N, C) --------------------------------------------------------
  {
    Planes x(K, N, C, 0.1), y(K, N, C, 0.2), dy(K, N, C, 0.3), dx(K, N, C, 0.4), mean(K, N, 1, 0), rstd(K, N, 1, 0);
    Flat p(K, C, 1.0), g(K, C, 0.0);
    auto fwd = [&](int o) {
      if (o == 0) layernorm_forward<T>(space, y.act(0), mean.act1(0), rstd.act1(0), x.act(0), p.params(0), 0, -1, 1e-5);
      if (o == 1)
        layernorm_forward<Dual<T>>(space, y.act(1), mean.act1(1), rstd.act1(1), x.act(1), p.params(1), 0, -1, 1e-5);
      if (o == 2)
        layernorm_forward<Jet2<T>>(space, y.act(2), mean.act1(2), rstd.act1(2), x.act(2), p.params(1), 0, -1, 1e-5);
    };
    for (int o : fwd_order) rep.add("layernorm", modes[o], double(N * C), 0, [&] { fwd(o); });
    fwd(0);
    rep.add("layernorm", "reverse", double(N * C), 0, [&] {
      layernorm_reverse<T>(space, dx.act(0), g.grads(0), dy.act(0), x.act(0), mean.act1(0), rstd.act1(0), p.params(0), 0, -1);
    });
    fwd(1);
    rep.add("layernorm", "tangent-reverse", double(N * C), 0, [&] {
      layernorm_reverse<Dual<T>>(space, dx.act(1), g.grads(1), dy.act(1), x.act(1), mean.act1(1), rstd.act1(1),
                                 p.params(1), 0, -1);
    });
  }
  // ---- gelu (N, 4C) ------------------------------------------------------------
  {
    Planes x(K, N, F, 0.1), y(K, N, F, 0.2), dy(K, N, F, 0.3), dx(K, N, F, 0.4);
    rep.add("gelu", "forward", double(N * F), 0, [&] { gelu_forward<T>(space, y.act(0), x.act(0), Gelu::erf); });
    rep.add("gelu", "tangent", double(N * F), 0, [&] { gelu_forward<Dual<T>>(space, y.act(1), x.act(1), Gelu::erf); });
    rep.add("gelu", "second-order", double(N * F), 0,
            [&] { gelu_forward<Jet2<T>>(space, y.act(2), x.act(2), Gelu::erf); });
    rep.add("gelu", "reverse", double(N * F), 0, [&] { gelu_reverse<T>(space, dx.act(0), dy.act(0), x.act(0), Gelu::erf); });
    rep.add("gelu", "tangent-reverse", double(N * F), 0,
            [&] { gelu_reverse<Dual<T>>(space, dx.act(1), dy.act(1), x.act(1), Gelu::erf); });
  }
  // ---- attention (B, T, H heads of C/H) ----------------------------------------
  {
    Planes qkv(K, N, 3 * C, 0.1), y(K, N, C, 0.2), lse(K, B * H * Tc, 1, 0), dy(K, N, C, 0.3), dqkv(K, N, 3 * C, 0.4),
        D(K, B * H * Tc, 1, 0);
    const double f1 = 2.0 * 2.0 * C * double(Tc) * double(Tc + 1) / 2.0 * B;  // causal QK^T and PV
    auto fwd = [&](int o) {
      if (o == 0) attention_forward<T>(space, y.act(0), lse.act1(0), qkv.act(0), B, Tc, int(H));
      if (o == 1) attention_forward<Dual<T>>(space, y.act(1), lse.act1(1), qkv.act(1), B, Tc, int(H));
      if (o == 2) attention_forward<Jet2<T>>(space, y.act(2), lse.act1(2), qkv.act(2), B, Tc, int(H));
    };
    for (int o : fwd_order)
      rep.add("attention", modes[o], double(N * C), f1 * (o == 0 ? 1 : o == 1 ? 1 + 2 * K : 1 + 5 * K), [&] { fwd(o); });
    fwd(0);
    rep.add("attention", "reverse", double(N * C), 2.5 * f1, [&] {
      attention_reverse<T>(space, dqkv.act(0), D.act1(0), dy.act(0), qkv.act(0), y.act(0), lse.act1(0), B, Tc, int(H));
    });
    fwd(1);
    rep.add("attention", "tangent-reverse", double(N * C), 2.5 * f1 * (1 + 2 * K), [&] {
      attention_reverse<Dual<T>>(space, dqkv.act(1), D.act1(1), dy.act(1), qkv.act(1), y.act(1), lse.act1(1), B, Tc,
                                 int(H));
    });
  }
  // ---- lm head + cross-entropy (N, C) x (V, C) ---------------------------------
  {
    // A logits tile as the engine plans it: vocabulary chunks of up to 4096,
    // rows up to 2^24 elements over the 1 + 2K planes.
    const index_t vchunk = std::min<index_t>(V, 4096);
    const index_t chunk = std::max<index_t>(1, std::min<index_t>(N, (index_t(1) << 24) / (vchunk * (1 + 2 * K))));
    Planes h(K, N, C, 0.1), dh(K, N, C, 0.2), lse(K, N, 1, 0), z(K, chunk, vchunk, 0);
    Flat p(K, V * C, 0.05), g(K, V * C, 0.0);
    View1<double> lossbuf("loss", (1 + 2 * K) * N);
    View2<T> stats("stats", N, 2);
    View1<std::int32_t> targets("targets", N);
    {
      auto ht = Kokkos::create_mirror_view(targets);
      for (index_t n = 0; n < N; ++n) ht(n) = std::int32_t((n * 7 + 3) % V);
      Kokkos::deep_copy(targets, ht);
    }
    auto loss = [&](int o) {
      Act1<double> l;
      l.v = Span1<double>(lossbuf.data(), N);
      if (o >= 1) l.d = Span2<double>(lossbuf.data() + N, K, N);
      if (o >= 2) l.dd = Span2<double>(lossbuf.data() + (1 + K) * N, K, N);
      return l;
    };
    const Span1<const std::int32_t> tg(targets.data(), N);
    const double f1 = 2.0 * N * C * V;
    auto fwd = [&](int o) {
      if (o == 0) lm_head_xent_forward<T>(space, loss(0), lse.act1(0), h.act(0), p.params(0), 0, V, tg, z.act(0), stats);
      if (o == 1) lm_head_xent_forward<Dual<T>>(space, loss(1), lse.act1(1), h.act(1), p.params(1), 0, V, tg, z.act(1), stats);
      if (o == 2) lm_head_xent_forward<Jet2<T>>(space, loss(2), lse.act1(2), h.act(2), p.params(1), 0, V, tg, z.act(2), stats);
    };
    for (int o : fwd_order)
      rep.add("lm_head_xent", modes[o], double(N * V), f1 * (o == 0 ? 1 : o == 1 ? 1 + 2 * K : 1 + 4 * K), [&] { fwd(o); });
    fwd(0);
    // The reverse recomputes its chunk's logits (a third GEMM) unless they are current.
    rep.add("lm_head_xent", "reverse", double(N * V), 3 * f1, [&] {
      lm_head_xent_reverse<T>(space, dh.act(0), g.grads(0), lse.act1(0), h.act(0), p.params(0), 0, V, tg, z.act(0));
    });
    fwd(1);
    rep.add("lm_head_xent", "tangent-reverse", double(N * V), 3 * f1 * (1 + 2 * K), [&] {
      lm_head_xent_reverse<Dual<T>>(space, dh.act(1), g.grads(1), lse.act1(1), h.act(1), p.params(1), 0, V, tg, z.act(1));
    });
  }
  // ---- embedding (B, T) tokens -> (N, C) ---------------------------------------
  {
    Planes x(K, N, C, 0.1);
    Flat p(K, (V + Tc) * C, 0.05), g(K, (V + Tc) * C, 0.0);
    View2<std::int32_t> tokens("tokens", B, Tc);
    {
      auto ht = Kokkos::create_mirror_view(tokens);
      for (index_t i = 0; i < N; ++i) ht.data()[i] = std::int32_t((i * 3) % V);
      Kokkos::deep_copy(tokens, ht);
    }
    const Span2<const std::int32_t> tk(tokens.data(), B, Tc);
    rep.add("embedding", "forward", double(N * C), 0, [&] { embedding_forward<T>(space, x.act(0), tk, p.params(0), 0, V * C); });
    rep.add("embedding", "tangent", double(N * C), 0, [&] { embedding_forward<T>(space, x.act(1), tk, p.params(1), 0, V * C); });
    rep.add("embedding", "reverse", double(N * C), 0, [&] { embedding_reverse<T>(space, g.grads(0), x.act(0), tk, 0, V * C); });
    rep.add("embedding", "tangent-reverse", double(N * C), 0,
            [&] { embedding_reverse<T>(space, g.grads(1), x.act(1), tk, 0, V * C); });
  }
  rep.js << "\n  ]\n}\n";
  std::fputs(rep.js.str().c_str(), stdout);
  return 0;
}
