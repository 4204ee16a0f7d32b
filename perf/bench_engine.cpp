// SPDX-License-Identifier: BSD-3-Clause
// bench_engine: times one batch of each engine mode on a checkpoint and token
// file and prints JSON (rates and the context that makes them comparable).
//
//   bench_engine CKPT.h5 TOKENS.bin --context T --batch B [--directions K,K,...]
//                [--repeats R] [--precision fp32|fp64]
//
// Each timing fences, warms up once and reports the median of R repeats.
#include <sys/resource.h>

#include <Kokkos_Core.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include "core/build_info.hpp"
#include "core/error.hpp"
#include "core/random.hpp"
#include "io/checkpoint.hpp"
#include "io/tokens.hpp"
#include "model/gpt.hpp"

using namespace gnh;

namespace {

struct Options {
  std::string ckpt, tokens, precision = "fp32";
  index_t context = 64, batch = 4;
  std::vector<int> K = {1, 8};
  int repeats = 3;
};

// Test hook for the regression comparison: stretch every timed run by this
// fraction (busy time, as a slower kernel would spend it).
double g_inject_slowdown = 0.0;

struct Timing {
  double median = 0;
  std::vector<double> samples;
  std::string samples_json() const {
    std::ostringstream s;
    s << "[";
    for (std::size_t i = 0; i < samples.size(); ++i) s << (i ? ", " : "") << samples[i];
    return s.str() + "]";
  }
};

template <class F>
Timing time_repeats(int repeats, F&& f) {
  f();  // warm-up (first-touch of workspaces, BLAS initialisation)
  Timing t;
  for (int r = 0; r < repeats; ++r) {
    Kokkos::fence();
    const auto t0 = std::chrono::steady_clock::now();
    f();
    Kokkos::fence();
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (g_inject_slowdown > 0) {
      const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(s * g_inject_slowdown);
      while (std::chrono::steady_clock::now() < until) {
      }
      s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }
    t.samples.push_back(s);
  }
  std::vector<double> sorted = t.samples;
  std::sort(sorted.begin(), sorted.end());
  t.median = sorted[sorted.size() / 2];
  return t;
}

long peak_rss_bytes() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_maxrss * 1024L;
}

// Forward FLOPs of one batch: 2 * (matmul parameters) per token for the
// linear layers and the head, plus causal attention (QK^T and PV).
double forward_flops(const ModelConfig& c, index_t B, index_t T) {
  const double C = c.n_embd, N = double(B * T);
  const double linear = c.n_layer * 12.0 * C * C + double(c.vocab_size) * C;
  const double attention = c.n_layer * 2.0 * 2.0 * C * double(T) * double(T + 1) / 2.0 * B;
  return 2.0 * N * linear + attention;
}

template <class T>
void run(const Options& o) {
  const ExecSpace space;
  const auto t_setup = std::chrono::steady_clock::now();
  const Checkpoint ck = read_checkpoint(o.ckpt);
  const double read_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_setup).count();
  const TokenFile tf = read_tokens(o.tokens, "uint16", "", ck.config.vocab_size);
  const index_t P = ParamLayout(ck.config).size(), B = o.batch, Tc = o.context;
  if (index_t(tf.ids.size()) < B * Tc + 1) throw Error("token file too short for one batch");
  View1<T> params("params", P);
  for (index_t i = 0; i < P; ++i) params(i) = static_cast<T>(ck.params[i]);
  View2<std::int32_t> tokens("tokens", B, Tc), targets("targets", B, Tc);
  for (index_t b = 0; b < B; ++b)
    for (index_t t = 0; t < Tc; ++t) {
      tokens(b, t) = tf.ids[b * Tc + t];
      targets(b, t) = tf.ids[b * Tc + t + 1];
    }
  const double ntok = double(B * Tc), fflops = forward_flops(ck.config, B, Tc);
  const bool bf16 = o.precision == "bf16-amp";
  std::ostringstream js;
  js.precision(6);
  js << "{\n  \"context\": {\"tool\": \"gnh\", \"git_commit\": \"" << git_commit() << "\", \"build\": \""
     << build_configuration() << "\", \"execution_space\": \"" << ExecSpace::name()
     << "\", \"concurrency\": " << ExecSpace().concurrency() << ", \"precision\": \"" << o.precision
     << "\", \"n_params\": " << P << ", \"batch\": " << B << ", \"seq_len\": " << Tc << "},\n";
  {
    Shape s;
    s.batch = B;
    s.context = Tc;
    s.bf16 = bf16;
    Gpt<T> m(ck.config, s);
    const Timing tm = time_repeats(o.repeats, [&] { m.forward_loss(space, params, tokens, targets); });
    const double t = tm.median;
    js << "  \"forward\": {\"seconds\": " << t << ", \"samples\": " << tm.samples_json()
       << ", \"tokens_per_s\": " << ntok / t << ", \"gflops\": " << fflops / t * 1e-9 << "},\n";
  }
  {
    Shape s;
    s.batch = B;
    s.context = Tc;
    s.reverse = true;
    s.bf16 = bf16;
    const auto t_plan = std::chrono::steady_clock::now();
    Gpt<T> m(ck.config, s);
    View1<T> grad("grad", P);
    // Group start-up as a run sees it: read the checkpoint, plan an engine.
    const double setup =
        read_seconds + std::chrono::duration<double>(std::chrono::steady_clock::now() - t_plan).count();
    js << "  \"setup_seconds\": " << setup << ",\n";
    const Timing tm = time_repeats(o.repeats, [&] { m.gradient(space, params, tokens, targets, grad); });
    const double t = tm.median;
    js << "  \"gradient\": {\"seconds\": " << t << ", \"samples\": " << tm.samples_json()
       << ", \"tokens_per_s\": " << ntok / t
       << ", \"gflops\": " << 3 * fflops / t * 1e-9 << ", \"workspace_bytes\": " << m.workspace_bytes() << "},\n";
  }
  js << "  \"curvature\": [";
  bool first = true;
  for (int K : o.K) {
    View2<T> dirs("dirs", K, P);
    fill_rademacher<T>(space, dirs, 1234, 0);
    for (const char* method : {"forward-over-reverse", "second-order-forward"}) {
      Shape s;
      s.batch = B;
      s.context = Tc;
      s.directions = K;
      s.reverse = std::string(method) == "forward-over-reverse";
      s.second_order = !s.reverse;
      s.bf16 = bf16;
      Gpt<T> m(ck.config, s);
      View1<T> grad;
      View2<T> hv;
      if (s.reverse) {
        grad = View1<T>("grad", P);
        hv = View2<T>("hv", K, P);
      }
      const Timing tm = time_repeats(o.repeats, [&] {
        if (s.reverse) m.hvp(space, params, dirs, tokens, targets, grad, hv);
        else m.second_order(space, params, dirs, tokens, targets);
      });
      const double t = tm.median;
      js << (first ? "\n" : ",\n") << "    {\"method\": \"" << method << "\", \"K\": " << K << ", \"seconds\": " << t
         << ", \"samples\": " << tm.samples_json()
         << ", \"seconds_per_direction\": " << t / K << ", \"workspace_bytes\": " << m.workspace_bytes() << "}";
      first = false;
    }
  }
  js << "\n  ],\n  \"peak_rss_bytes\": " << peak_rss_bytes() << "\n}\n";
  std::fputs(js.str().c_str(), stdout);
}

}  // namespace

int main(int argc, char** argv) {
  Kokkos::ScopeGuard kokkos(argc, argv);
  Options o;
  std::vector<std::string> pos;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) throw std::runtime_error("missing value after " + a);
      return argv[++i];
    };
    try {
      if (a == "--context") o.context = std::stol(next());
      else if (a == "--batch") o.batch = std::stol(next());
      else if (a == "--repeats") o.repeats = std::stoi(next());
      else if (a == "--precision") o.precision = next();
      else if (a == "--inject-slowdown") g_inject_slowdown = std::stod(next());
      else if (a == "--directions") {
        o.K.clear();
        std::stringstream ss(next());
        for (std::string k; std::getline(ss, k, ',');) o.K.push_back(std::stoi(k));
      } else pos.push_back(a);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "bench_engine: %s\n", e.what());
      return 2;
    }
  }
  if (pos.size() != 2) {
    std::fprintf(stderr, "usage: bench_engine CKPT.h5 TOKENS.bin --context T --batch B [--directions 1,8] "
                         "[--repeats R] [--precision fp32|fp64]\n");
    return 2;
  }
  o.ckpt = pos[0];
  o.tokens = pos[1];
  try {
    if (o.precision == "fp64") run<double>(o);
    else run<float>(o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_engine: %s\n", e.what());
    return 1;
  }
  return 0;
}
