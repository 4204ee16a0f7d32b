// SPDX-License-Identifier: BSD-3-Clause
// bench_engine: times one batch of each engine mode and prints JSON: rates,
// achieved FLOP/s against an analytic count, this run's measured sgemm rate,
// peak memory per pass, and the context that makes runs comparable.
//
//   bench_engine CKPT.h5 TOKENS.bin --context T --batch B [options]   (needs the I/O layer)
//   bench_engine --synthetic tiny|small|medium|reference|L,H,C,V [--context T] --batch B [options]
//                [--family nanogpt|llama|gpt-neox]
//
// options: --directions 1,4,16   directions per primal pass of the curvature passes
//          --methods second-order-forward,forward-over-reverse
//          --passes forward,gradient,sequence,curvature (sequence: the gradient with
//                   every sequence's own gradient norms, analysis.per_sequence)
//          --repeats R           timed repeats after one warm-up (median reported); 0: one
//                                run without warm-up
//          --precision fp32|tf32|bf16-amp|fp64
//          --plan-only           print the engines' planned workspace bytes per pass, run nothing
//          --scratch             print the fused attention's team scratch per kernel (JSON), run nothing
//          --validation          also print loss, G.G and v^T H v (K of the first entry of
//                                --directions, Rademacher seed 1234) by both methods
//          --adjoint-cuts auto|0|1   the second-order forward's adjoint cuts (default auto)
//          --head-tile ROWS,VOCAB    the LM head's logits tile (default: the plan's)
//          --attention-sequences N   the batched attention's sequences per chunk (default: the plan's)
//          --attention-blocks N      the batched attention's causal query blocks (default: the plan's)
//          --profile             after the timed repeats, one more run of each pass with
//                                every kernel and region fenced and timed by label
//          --gpu-shaped          the GPU's kernels and tiles on this backend (Shape::gpu_shaped:
//                                the batched attention, the head's whole vocabulary rows): with
//                                --profile, the launches of each label a GPU would see
//          --no-probe            skip the host GEMM probe and the sgemm rates (always
//                                skipped where the execution space is not the host's)
//          --dump DIR            write the model, tokens and validation directions for
//                                another program (perf/device/torch_seed.py)
//          --dump-batch B        sequences of tokens to dump (synthetic; default --batch)
//          --inject-slowdown F   stretch every timed run by F (tests of perf/compare.py)
//          --predict h200|gh200  predict the gradient (bf16-amp unless --precision; TF32 beside it) and
//                                the second-order forward (bf16-amp, K of --directions, else 16) on
//                                one H200 or one GH200's GPU (perf/cost_model.hpp), per batch, epoch
//                                and label, from
//                                the GPU-shaped path run here on a miniature of the shape (below);
//                                the last line: "predicted h200: gradient X s/epoch, second-order
//                                K=16 bf16-amp Y s/direction, launches per pass N"
//          --predict-scale S     the miniature's scale (a power of two; default the largest up to 32
//                                that divides the context and widths; 1: the shape itself)
//          --epoch-tokens N      tokens of a full epoch (default 10,202,112, SPEC §9's)
//          --parameter-shards R  with --predict: the same passes in a team of --gpus GPUs of the
//                                GPU's node (perf/cost_model.hpp, Fabric) whose parameter-sized
//                                vectors are sliced over shard groups of R: the layer gathers and
//                                gradient scatters at the node's link bandwidth, overlapped with
//                                the next layer's compute, and the memory a GPU holds; K as the
//                                memory allows (at most 16) unless --directions gives it. The
//                                last line: "predicted gh200 x4, parameter_shards R: gradient X
//                                s/epoch, direction Y s (K=k), memory Z GiB a GPU of W, ..."
//          --gpus N              GPUs of the team (default: one node's)
//
// --synthetic L,H,d,V,kv,I: a published shape, its key/value heads kv (Llama's)
// and MLP width I given, its head untied (Llama-2-7B: 32,32,4096,32000,32,11008).
// --family: the synthetic model at the preset's sizes in that family, as
// perf/side_by_side.py's family_config: Llama with n_head/2 key/value heads and a
// SwiGLU of width 8d/3 rounded up to 16, tied; GPT-NeoX as Pythia (parallel
// residual, rotary_pct 0.25, biases, untied).
// A synthetic model is bias-free, tied, GELU-erf, with N(0, 0.02) weights and
// unit LayerNorm scales drawn from splitmix64 (the same numbers on every
// machine), and tokens drawn the same way: what perf/device/run.sh uses, with
// no checkpoint file and no HDF5. Everything runs on the default execution
// space; host mirrors feed it.
//
// Memory: each pass reports the plan's workspace, the high-water mark of the
// Kokkos allocations it made in the execution space's memory (measured by
// allocation callbacks, kernel_profile.hpp) and the process's peak RSS.
#include <sys/resource.h>

#include <Kokkos_Core.hpp>
#include <algorithm>
#include <chrono>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <fstream>
#include <iterator>
#include <map>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "analysis/blocks.hpp"
#include "analysis/memory.hpp"
#include "analysis/passes.hpp"
#include "kernels/gemm_ledger.hpp"
#include "analysis/settings.hpp"
#include "core/build_info.hpp"
#include "core/error.hpp"
#include "core/random.hpp"
#include "kernels/attention_fused.hpp"
#include "kernels/blas.hpp"
#include "kernels/gemm_probe.hpp"
#include "kernels/host_gemm.hpp"
#include "model/gpt.hpp"
#include "model/layout.hpp"
#include "cost_model.hpp"
#include "kernel_profile.hpp"
#ifdef GNH_BENCH_WITH_IO
#include "io/checkpoint.hpp"
#include "io/tokens.hpp"
#endif

using namespace gnh;

namespace {

struct Options {
  std::string ckpt, tokens, synthetic, precision = "fp32", family = "nanogpt";
  Precision policy = Precision::fp32;  // precision, parsed
  index_t context = 0, batch = 4;
  std::vector<int> K = {1, 4, 16};
  std::vector<std::string> methods = {"second-order-forward", "forward-over-reverse"};
  std::vector<std::string> passes = {"forward", "gradient", "curvature"};
  int repeats = 3;
  int adjoint_cuts = -1;                  // Shape::adjoint_cuts
  index_t head_rows = 0, head_vocab = 0;  // Shape::head_chunk_rows, head_chunk_vocab
  index_t attention_sequences = 0;        // Shape::attention_sequences
  index_t attention_blocks = 0;           // Shape::attention_blocks
  bool validation = false;
  bool plan_only = false;
  bool scratch = false;  // --scratch: the fused attention's team scratch requests
  bool profile = false;
  bool gpu_shaped = false;
  bool probe = true;
  std::string dump;
  index_t dump_batch = 0;          // sequences of tokens.i32 (0: --batch)
  std::string predict;             // --predict: the GPU whose time to predict
  int predict_scale = 0;           // the miniature's scale (0: the largest up to 32)
  int parameter_shards = 0;        // --parameter-shards: R (0: no sharded prediction)
  int gpus = 0;                    // --gpus: the team's GPUs (0: one node's)
  double epoch_tokens = 10202112;  // a full epoch (SPEC §9's reference run)
  bool precision_given = false, directions_given = false;
  bool has(const std::string& p) const { return std::find(passes.begin(), passes.end(), p) != passes.end(); }
};

// Test hook for the regression comparison: stretch every timed run by this
// fraction (busy time, as a slower kernel would spend it).
double g_inject_slowdown = 0.0;

struct Timing {
  double median = 0;
  std::vector<double> samples;
  double min() const { return *std::min_element(samples.begin(), samples.end()); }
  double max() const { return *std::max_element(samples.begin(), samples.end()); }
  // "seconds" (the median) and the spread of the samples.
  std::string json() const {
    std::ostringstream s;
    s << "\"seconds\": " << median << ", \"min_seconds\": " << min() << ", \"max_seconds\": " << max()
      << ", \"samples\": " << samples_json();
    return s.str();
  }
  std::string samples_json() const {
    std::ostringstream s;
    s << "[";
    for (std::size_t i = 0; i < samples.size(); ++i) s << (i ? ", " : "") << samples[i];
    return s.str() + "]";
  }
};

template <class F>
Timing time_repeats(int repeats, F&& f) {
  Timing t;
  if (repeats == 0) {  // one timed run, no warm-up (large configurations)
    Kokkos::fence();
    const auto t0 = std::chrono::steady_clock::now();
    f();
    Kokkos::fence();
    t.median = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    t.samples.push_back(t.median);
    return t;
  }
  f();  // warm-up (first-touch of workspaces, BLAS initialisation)
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

// Peak resident memory of the process (bytes), and a reset of it (Linux:
// writing 5 to clear_refs resets VmHWM), so that each pass reports its own
// peak. On the host backend this is the engine's memory; on a GPU it is the
// host side only, and the engine's device memory is workspace_bytes.
long peak_rss_bytes() {
  std::ifstream f("/proc/self/status");
  for (std::string line; std::getline(f, line);)
    if (line.rfind("VmHWM:", 0) == 0) return std::stol(line.substr(6)) * 1024L;
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_maxrss * 1024L;
}
void reset_peak_rss() {
  std::ofstream f("/proc/self/clear_refs");
  if (f) f << "5";
}

// Forward FLOPs of one batch, split into the dense layers, the LM head and
// the causal attention (QK^T and PV over the s <= t pairs).
struct Flops {
  double dense = 0, head = 0, attention = 0;
  double forward() const { return dense + head + attention; }
  // Second-order forward with K directions: each dense product gains two
  // per direction for the tangent (x'W + xW') and two for the second order
  // (x''W + 2x'W'; W'' = 0); the head two for the tangent logits and one
  // (q V_k) for the second order, plus q W once (kernels/lm_head_xent.hpp);
  // each attention product two and three. With adjoint cuts (Shape::adjoint_cuts)
  // each dense product forms no x''W (three per direction), the scores' second
  // order one product and the values' two, plus a gradient pass without the
  // parameter gradient (the forward and the adjoints' products: 2 forwards).
  double second_order(int K, bool cuts = false) const {
    if (cuts) return dense * (1 + 3.0 * K) + head * (2 + 3.0 * K) + attention * (1 + 3.5 * K) + 2 * forward();
    return dense * (1 + 4.0 * K) + head * (2 + 3.0 * K) + attention * (1 + 5.0 * K);
  }
  // Gradient: 3x the forward (a GEMM and its two transposes). Forward-over-
  // reverse: the gradient, and per direction twice its products again.
  double gradient() const { return 3 * forward(); }
  double hvp(int K) const { return gradient() * (1 + 2.0 * K); }
};

Flops flops_of(const ModelConfig& c, index_t B, index_t T) {
  const ForwardFlops t = forward_flops_per_token(c, T);  // model/plan.hpp
  const double N = double(B * T);
  Flops f;
  f.dense = N * t.dense;
  f.head = N * t.head;
  f.attention = N * t.attention;
  return f;
}

// sgemm rate of this run, (n x n) * (n x n), through gnh's GEMM entry point
// (gnh's host kernel where one is selected) and through Kokkos Kernels (the
// vendor BLAS).
double sgemm_gflops(index_t n, bool vendor) {
  View2<float> A("A", n, n), B("B", n, n), C("C", n, n);
  Kokkos::deep_copy(A, 0.5f);
  Kokkos::deep_copy(B, 0.25f);
  const ExecSpace space;
  auto run = [&] {
    if (vendor) KokkosBlas::gemm("N", "N", 1.0f, A, B, 0.0f, C);
    else kernels::gemm<float>(space, "N", "N", 1.0f, A, B, 0.0f, C);
  };
  const int reps = std::max(1, int(2e9 / (2.0 * n * n * n)));
  const Timing t = time_repeats(3, [&] {
    for (int r = 0; r < reps; ++r) run();
  });
  return 2.0 * n * n * n * reps / t.median * 1e-9;
}

struct Model {
  ModelConfig config;
  std::vector<double> params;     // host, flat
  std::vector<std::int32_t> ids;  // B*T + 1 tokens
};

std::uint64_t mix(std::uint64_t a, std::uint64_t b) { return splitmix64(a ^ splitmix64(b)); }

// A synthetic model's token ids: the first n of one stream, for any batch.
std::vector<std::int32_t> synthetic_ids(index_t n, int vocab) {
  std::vector<std::int32_t> ids(static_cast<std::size_t>(n));
  for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = std::int32_t(mix(2, i) % std::uint64_t(vocab));
  return ids;
}

Model synthetic_model(const ModelConfig& cfg, index_t B, index_t T);

// The configuration of a synthetic model (nothing allocated).
ModelConfig synthetic_config(const std::string& spec, index_t& T, const std::string& family = "nanogpt") {
  static const std::map<std::string, std::vector<int>> presets = {
      // n_layer, n_head, n_embd, vocab, context (as perf/side_by_side.py)
      {"tiny", {1, 2, 16, 64, 16}},
      {"small", {2, 4, 128, 1024, 128}},
      {"medium", {4, 4, 256, 4096, 256}},
      {"reference", {8, 5, 320, 32000, 1024}}};
  std::vector<int> v;
  if (presets.count(spec)) {
    v = presets.at(spec);
  } else {
    std::stringstream ss(spec);
    for (std::string x; std::getline(ss, x, ',');) v.push_back(std::stoi(x));
    if (v.size() != 4 && v.size() != 6)
      throw Error(
          "--synthetic: expected a preset, n_layer,n_head,n_embd,vocab or n_layer,n_head,n_embd,vocab,"
          "kv_heads,intermediate, got '" +
          spec + "'");
    v.insert(v.begin() + 4, 0);  // the context: --context's
  }
  if (T == 0) T = v[4] > 0 ? v[4] : 64;
  Model m;
  m.config.n_layer = v[0];
  m.config.n_head = v[1];
  m.config.n_embd = v[2];
  m.config.vocab_size = v[3];
  m.config.block_size = int(T);
  m.config.bias = false;
  m.config.tie_embeddings = true;
  if (family == "llama") {
    m.config.family = Family::llama;
    m.config.n_kv_head = std::max(1, v[1] / 2);
    m.config.intermediate = (8 * v[2] / 3 + 15) / 16 * 16;
    m.config.ln_eps = 1e-6;
  } else if (family == "gpt-neox") {
    m.config.family = Family::gpt_neox;
    m.config.intermediate = 4 * v[2];
    m.config.rotary_pct = 0.25;
    m.config.parallel_residual = true;
    m.config.qkv_bias = true;
    m.config.tie_embeddings = false;
  } else if (family != "nanogpt") {
    throw Error("--family: expected nanogpt, llama or gpt-neox, got '" + family + "'");
  }
  if (v.size() == 7) {  // a published shape's key/value heads and MLP width, its head untied
    if (family == "nanogpt") throw Error("--synthetic: kv_heads and intermediate need --family llama or gpt-neox");
    if (family == "llama") m.config.n_kv_head = v[5];
    m.config.intermediate = v[6];
    m.config.tie_embeddings = false;
  }
  m.config.validate("--synthetic");
  return m.config;
}

Model synthetic(const std::string& spec, index_t B, index_t& T, const std::string& family = "nanogpt") {
  const ModelConfig cfg = synthetic_config(spec, T, family);
  return synthetic_model(cfg, B, T);
}

// The synthetic weights and tokens of a model of this configuration.
Model synthetic_model(const ModelConfig& cfg, index_t B, index_t T) {
  Model m;
  m.config = cfg;
  m.config.validate("--synthetic");
  const ParamLayout layout(m.config);
  m.params.assign(std::size_t(layout.size()), 0.0);
  for (const TensorInfo& t : layout.tensors()) {
    const bool ln = t.name.find("ln_") != std::string::npos || t.name.find("norm.weight") != std::string::npos;
    const bool bias = t.name.size() > 5 && t.name.compare(t.name.size() - 5, 5, ".bias") == 0;
    for (std::int64_t i = 0; i < t.size; ++i) {
      const std::uint64_t j = std::uint64_t(t.offset + i);
      if (ln && !bias) {
        m.params[j] = 1.0;
      } else if (bias) {
        m.params[j] = 0.0;
      } else {  // Box-Muller on two splitmix64 uniforms in (0, 1]
        const double u1 = (double(mix(1, 2 * j) >> 11) + 1.0) * 0x1p-53;
        const double u2 = double(mix(1, 2 * j + 1) >> 11) * 0x1p-53;
        m.params[j] = 0.02 * std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
      }
    }
  }
  m.ids = synthetic_ids(B * T + 1, m.config.vocab_size);
  return m;
}

// A model's parameters and a batch of its tokens (targets one further) in
// the execution space's memory.
template <class T>
struct DeviceCase {
  View1<T> params;
  View2<std::int32_t> tokens, targets;
  DeviceCase(const Model& m, index_t B, index_t Tc)
      : params("params", index_t(m.params.size())), tokens("tokens", B, Tc), targets("targets", B, Tc) {
    auto h = Kokkos::create_mirror_view(params);
    for (std::size_t i = 0; i < m.params.size(); ++i) h(i) = static_cast<T>(m.params[i]);
    Kokkos::deep_copy(params, h);
    auto ht = Kokkos::create_mirror_view(tokens);
    auto hg = Kokkos::create_mirror_view(targets);
    for (index_t b = 0; b < B; ++b)
      for (index_t t = 0; t < Tc; ++t) {
        ht(b, t) = m.ids[std::size_t(b * Tc + t)];
        hg(b, t) = m.ids[std::size_t(b * Tc + t + 1)];
      }
    Kokkos::deep_copy(tokens, ht);
    Kokkos::deep_copy(targets, hg);
  }
};

// An engine shape of this run: batch, context, precision; reverse mode and
// K directions by the pass.
Shape shape_of(const Options& o, index_t context, bool reverse, int K = 0, bool second = false) {
  Shape s;
  s.batch = o.batch;
  s.context = context;
  s.reverse = reverse;
  s.directions = K;
  s.second_order = second;
  s.adjoint_cuts = o.adjoint_cuts;
  s.head_chunk_rows = o.head_rows;
  s.head_chunk_vocab = o.head_vocab;
  s.attention_sequences = o.attention_sequences;
  s.attention_blocks = o.attention_blocks;
  s.bf16 = o.policy == Precision::bf16_amp;
  s.tf32 = o.policy == Precision::tf32;
  s.gpu_shaped = o.gpu_shaped || !std::is_same<ExecSpace, Kokkos::DefaultHostExecutionSpace>::value;
  return s;
}

std::string json_doubles(const std::vector<double>& v) {
  std::ostringstream s;
  s.precision(17);
  s << "[";
  for (std::size_t i = 0; i < v.size(); ++i) s << (i ? ", " : "") << v[i];
  return s.str() + "]";
}

// The validation's engine: the timed engine's storage, filled with NaN, under
// a new plan of the same shape, so that a value read before it is written
// shows in the results (the timed engine is unusable afterwards).
template <class T>
Gpt<T> poisoned(Gpt<T>& timed, const ModelConfig& cfg, const Shape& shape) {
  std::vector<View1<T>> storage = timed.release_storage();
  for (View1<T>& v : storage) Kokkos::deep_copy(v, std::numeric_limits<T>::quiet_NaN());
  return Gpt<T>(cfg, shape, std::move(storage));
}

// One profiled run of a pass: the fenced time and launches of each label
// (and those a GPU would see: perf::LabelTime), longest first, and the GEMM
// FLOPs the pass issued by the unit a GPU runs them on (kernels/gemm_ledger.hpp).
template <class F>
std::string profile_json(F&& pass) {
  const perf::RecordedRun run = perf::record_run(pass);
  const std::vector<perf::LabelTime>& labels = run.labels;
  const kernels::GemmWork& work = run.work;
  std::ostringstream s;
  s.precision(6);
  long launches = 0, device = 0;
  for (const perf::LabelTime& l : labels) launches += l.launches, device += l.device_launches;
  s << "{\"seconds\": " << run.seconds << ", \"launches\": " << launches << ", \"device_launches\": " << device
    << ", \"sampled_device_peak_bytes\": " << perf::MemoryWatch::sampled_device_peak_bytes()
    << ", \"gemm_flops\": {\"tensor\": " << work.flops(kernels::GemmUnit::tensor)
    << ", \"fp32\": " << work.flops(kernels::GemmUnit::fp32) << ", \"fp64\": " << work.flops(kernels::GemmUnit::fp64)
    << "}, \"labels\": [";
  for (std::size_t i = 0; i < labels.size(); ++i)
    s << (i ? ", " : "") << "{\"label\": \"" << labels[i].label << "\", \"seconds\": " << labels[i].seconds
      << ", \"launches\": " << labels[i].launches << ", \"device_launches\": " << labels[i].device_launches << "}";
  s << "]}";
  return s.str();
}

// The case of a run for another program: model.json (the configuration and
// each tensor's name, shape and offset in the flat vector), params.f32 (the
// flat parameters), tokens.i32 (B*T + 1 ids; sequence b is ids[bT, bT + T),
// its targets one further; B is --dump-batch, for a synthetic model) and dirs.i8 (the validation's Rademacher
// directions, K rows of P signs: seed 1234, K the first of --directions).
void dump_case(const Options& o, const Model& m, index_t T) {
  const std::string dir = o.dump;
  auto open = [&](const std::string& name) {
    std::ofstream f(dir + "/" + name, std::ios::binary);
    if (!f) throw Error("--dump: cannot write " + dir + "/" + name + ": " + std::strerror(errno));
    return f;
  };
  auto closed = [&](std::ofstream& f, const std::string& name) {
    f.close();
    if (!f) throw Error("--dump: writing " + dir + "/" + name + " failed: " + std::strerror(errno));
  };
  const ParamLayout layout(m.config);
  const index_t P = layout.size();
  const int K = o.K.front();
  const index_t batch = o.dump_batch > 0 && !o.synthetic.empty() ? o.dump_batch : o.batch;
  {
    std::ofstream f = open("model.json");
    f << "{\"n_layer\": " << m.config.n_layer << ", \"n_head\": " << m.config.n_head
      << ", \"n_embd\": " << m.config.n_embd << ", \"vocab_size\": " << m.config.vocab_size
      << ", \"block_size\": " << m.config.block_size << ", \"bias\": " << (m.config.bias ? "true" : "false")
      << ", \"tie_embeddings\": " << (m.config.tie_embeddings ? "true" : "false") << ", \"gelu\": \""
      << to_string(m.config.gelu) << "\", \"ln_eps\": " << m.config.ln_eps << ", \"batch\": " << batch
      << ", \"seq_len\": " << T << ", \"n_params\": " << P << ", \"directions\": " << K
      << ", \"direction_seed\": 1234, \"tensors\": [";
    bool comma = false;
    for (const TensorInfo& t : layout.tensors()) {
      f << (comma ? ", " : "") << "{\"name\": \"" << t.name << "\", \"offset\": " << t.offset << ", \"shape\": [";
      for (std::size_t i = 0; i < t.shape.size(); ++i) f << (i ? ", " : "") << t.shape[i];
      f << "]}";
      comma = true;
    }
    f << "]}\n";
    closed(f, "model.json");
  }
  {
    std::vector<float> p(m.params.begin(), m.params.end());
    std::ofstream f = open("params.f32");
    f.write(reinterpret_cast<const char*>(p.data()), std::streamsize(p.size() * sizeof(float)));
    closed(f, "params.f32");
  }
  {
    const std::vector<std::int32_t> ids = batch == o.batch ? m.ids : synthetic_ids(batch * T + 1, m.config.vocab_size);
    std::ofstream f = open("tokens.i32");
    f.write(reinterpret_cast<const char*>(ids.data()), std::streamsize(ids.size() * sizeof(std::int32_t)));
    closed(f, "tokens.i32");
  }
  {
    std::vector<std::int8_t> signs(static_cast<std::size_t>(P));
    std::ofstream f = open("dirs.i8");
    for (int k = 0; k < K; ++k) {
      const std::uint64_t key = direction_key(1234, std::uint64_t(k));
      for (index_t i = 0; i < P; ++i) signs[std::size_t(i)] = std::int8_t(rademacher(key, std::uint64_t(i)));
      f.write(reinterpret_cast<const char*>(signs.data()), std::streamsize(signs.size()));
    }
    closed(f, "dirs.i8");
  }
}

template <class T>
void run(const Options& o) {
  const ExecSpace space;
  const auto t_setup = std::chrono::steady_clock::now();
  index_t Tc = o.context;
  Model model;
  if (!o.synthetic.empty()) {
    model = synthetic(o.synthetic, o.batch, Tc, o.family);
  } else {
#ifdef GNH_BENCH_WITH_IO
    const Checkpoint ck = read_checkpoint(o.ckpt);
    if (Tc == 0) Tc = 64;
    const TokenFile tf = read_tokens(o.tokens, "uint16", "", ck.config.vocab_size);
    model.config = ck.config;
    model.params.assign(ck.params.begin(), ck.params.end());
    if (index_t(tf.ids.size()) < o.batch * Tc + 1) throw Error("token file too short for one batch");
    model.ids.assign(tf.ids.begin(), tf.ids.begin() + o.batch * Tc + 1);
#else
    throw Error("this bench_engine was built without the I/O layer: use --synthetic");
#endif
  }
  const double read_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_setup).count();
  const ModelConfig& cfg = model.config;
  const index_t P = ParamLayout(cfg).size(), B = o.batch;
  const DeviceCase<T> dc(model, B, Tc);
  const View1<T> params = dc.params;
  const View2<std::int32_t> tokens = dc.tokens, targets = dc.targets;
  const double ntok = double(B * Tc);
  const Flops fl = flops_of(cfg, B, Tc);
  const bool float_run = std::is_same<T, float>::value;
  // The host GEMM probe and the sgemm rates mean nothing where the engine
  // runs on a device (perf/device/run.sh measures the device's ceilings).
  const bool host_space = Kokkos::SpaceAccessibility<Kokkos::HostSpace, ExecSpace::memory_space>::accessible;
  const bool probe = float_run && host_space && o.probe;
  // The dense GEMM as `gnh run` chooses it: probed on this model's shapes.
  const std::string probe_json = probe ? kernels::choose_host_gemm(cfg.n_embd, cfg.vocab_size, B * Tc).json() : "null";
  // Not const: nvcc would fold the fp64 run's 0 into a "division by zero" warning below.
  double gemm_rate = probe ? sgemm_gflops(512, false) : 0.0;
  const double vendor_rate = probe ? sgemm_gflops(512, true) : 0.0;
  if (!o.dump.empty()) dump_case(o, model, Tc);
  std::ostringstream js;
  js.precision(17);
  js << "{\n  \"context\": {\"tool\": \"gnh\", \"git_commit\": \"" << git_commit() << "\", \"build\": \""
     << build_configuration() << "\", \"execution_space\": \"" << ExecSpace::name()
     << "\", \"concurrency\": " << ExecSpace().concurrency()
     << ", \"gpu_shaped\": " << (o.gpu_shaped ? "true" : "false") << ", \"precision\": \"" << o.precision
     << "\", \"model\": \"" << (o.synthetic.empty() ? o.ckpt : "synthetic " + o.synthetic)
     << "\", \"n_layer\": " << cfg.n_layer << ", \"n_head\": " << cfg.n_head << ", \"n_embd\": " << cfg.n_embd
     << ", \"vocab_size\": " << cfg.vocab_size << ", \"n_params\": " << P << ", \"batch\": " << B
     << ", \"seq_len\": " << Tc << ", \"host_gemm\": \""
     << (host_space ? kernels::host::name(kernels::host::selected_kernel()) : "none")
     << "\", \"host_gemm_probe\": " << probe_json << "},\n";
  if (probe)
    js << "  \"sgemm_gflops\": {\"gnh\": " << gemm_rate << ", \"vendor\": " << vendor_rate << ", \"n\": 512},\n";
  js << "  \"flops_per_batch\": {\"forward\": " << fl.forward()
     << ", \"attention_share\": " << fl.attention / fl.forward() << "},\n";
  auto rates = [&](double flops, double t) {
    std::ostringstream s;
    s << ", \"flops\": " << flops << ", \"gflops\": " << flops / t * 1e-9;
    if (gemm_rate > 0) s << ", \"fraction_of_sgemm\": " << flops / t * 1e-9 / gemm_rate;
    return s.str();
  };
  // Memory and profile of a pass, after its timed repeats: the high-water
  // mark of its own allocations (beyond what was held before it), then one
  // profiled run of it.
  std::size_t held_before = 0;
  auto start_pass = [&] {
    reset_peak_rss();
    perf::MemoryWatch::reset_peak();
    held_before = perf::MemoryWatch::current_bytes();
  };
  auto finish_pass = [&](auto&& f) {
    std::ostringstream s;
    s << ", \"measured_peak_bytes\": " << perf::MemoryWatch::peak_bytes() - held_before
      << ", \"peak_rss_bytes\": " << peak_rss_bytes();
    if (o.profile) s << ", \"profile\": " << profile_json(f);
    return s.str();
  };
  std::vector<double> validation;
  if (o.has("forward")) {
    start_pass();
    Gpt<T> m(cfg, shape_of(o, Tc, false));
    LossSum loss;
    auto pass = [&] { loss = m.forward_loss(space, params, tokens, targets); };
    const Timing tm = time_repeats(o.repeats, pass);
    const double t = tm.median;
    js << "  \"forward\": {" << tm.json() << ", \"tokens_per_s\": " << ntok / t << rates(fl.forward(), t)
       << ", \"workspace_bytes\": " << m.workspace_bytes() << finish_pass(pass) << "},\n";
    if (o.validation) {
      Gpt<T> mv = poisoned(m, cfg, shape_of(o, Tc, false));
      loss = mv.forward_loss(space, params, tokens, targets);
      js << "  \"loss_mean\": " << json_doubles({loss.sum / double(loss.count)}) << ",\n";
    }
  }
  if (o.has("gradient")) {
    start_pass();
    const auto t_plan = std::chrono::steady_clock::now();
    Gpt<T> m(cfg, shape_of(o, Tc, true));
    View1<T> grad("grad", P);
    // Group start-up as a run sees it: read the checkpoint, plan an engine.
    const double setup =
        read_seconds + std::chrono::duration<double>(std::chrono::steady_clock::now() - t_plan).count();
    js << "  \"setup_seconds\": " << setup << ",\n";
    auto pass = [&] { m.gradient(space, params, tokens, targets, grad); };
    const Timing tm = time_repeats(o.repeats, pass);
    const double t = tm.median;
    js << "  \"gradient\": {" << tm.json() << ", \"tokens_per_s\": " << ntok / t << rates(fl.gradient(), t)
       << ", \"workspace_bytes\": " << m.workspace_bytes() << finish_pass(pass) << "},\n";
    if (o.validation) {
      Gpt<T> mv = poisoned(m, cfg, shape_of(o, Tc, true));
      Kokkos::deep_copy(grad, T(0));  // the engine adds the gradient into it
      mv.gradient(space, params, tokens, targets, grad);
      auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), grad);
      double gg = 0;
      for (index_t i = 0; i < P; ++i) gg += double(h(i)) * double(h(i));
      js << "  \"gradient_sum_norm2\": " << json_doubles({gg}) << ",\n";
    }
  }
  if (o.has("sequence")) {
    // The gradient with every sequence's own gradient and its norms per
    // tensor (analysis.per_sequence), as a run groups them: on a host an
    // engine of one sequence beside the batched gradient pass above; on the
    // GPU's path the gradient engine, the batch's sequences apart in its
    // reverse (analysis/memory.hpp, sequence_group).
    start_pass();
    Shape one_shape = shape_of(o, Tc, true);
    if (!one_shape.gpu_shaped && !gpu_shaped_build()) one_shape.batch = 1;
    Gpt<T> one(cfg, one_shape);
    std::vector<std::int64_t> ranges;
    for (const TensorInfo& t : one.layout().tensors()) ranges.push_back(t.offset);
    ranges.push_back(P);
    std::sort(ranges.begin(), ranges.end());
    SequenceNorms<T> norms(one, ranges, {}, o.batch);
    View1<T> grad("grad", P);
    BatchScalars r;
    auto pass = [&] { norms.gradients(space, params, tokens, targets, o.batch, grad, r); };
    const Timing tm = time_repeats(o.repeats, pass);
    js << "  \"gradient_per_sequence\": {" << tm.json() << ", \"tokens_per_s\": " << ntok / tm.median
       << rates(fl.gradient(), tm.median) << ", \"workspace_bytes\": " << one.workspace_bytes() << finish_pass(pass)
       << "},\n";
  }
  js << "  \"curvature\": [";
  bool first = true;
  std::map<std::string, std::vector<double>> quad;
  std::vector<double> hv_norm;
  if (o.has("curvature")) {
    for (int K : o.K) {
      View2<T> dirs("dirs", K, P);
      fill_rademacher<T>(space, dirs, 1234, 0);
      for (const std::string& method : o.methods) {
        const bool fwd_over_rev = method == "forward-over-reverse";
        const Shape s = shape_of(o, Tc, fwd_over_rev, K, !fwd_over_rev);
        start_pass();
        Gpt<T> m(cfg, s);
        View1<T> grad;
        View2<T> hv;
        if (s.reverse) {
          grad = View1<T>("grad", P);
          hv = View2<T>("hv", K, P);
        }
        LossSum ls;
        auto pass = [&] {
          if (s.reverse) m.hvp(space, params, dirs, tokens, targets, grad, hv);
          else ls = m.second_order(space, params, dirs, tokens, targets);
        };
        const Timing tm = time_repeats(o.repeats, pass);
        const double t = tm.median;
        js << (first ? "\n" : ",\n") << "    {\"method\": \"" << method << "\", \"K\": " << K << ", " << tm.json()
           << ", \"seconds_per_direction\": " << t / K
           << rates(s.reverse ? fl.hvp(K) : fl.second_order(K, m.adjoint_cuts()), t)
           << ", \"adjoint_cuts\": " << (m.adjoint_cuts() ? "true" : "false") << ", \"head_tile\": ["
           << gpt_tiles(cfg, s).logits_rows << ", " << gpt_tiles(cfg, s).logits_vocab
           << "], \"workspace_bytes\": " << m.workspace_bytes() << finish_pass(pass) << "}";
        first = false;
        if (o.validation && K == o.K.front()) {
          std::vector<double> q(std::size_t(K), 0.0);
          Gpt<T> mv = poisoned(m, cfg, s);
          if (s.reverse) {
            Kokkos::deep_copy(hv, T(0));  // the engine adds into both
            Kokkos::deep_copy(grad, T(0));
            mv.hvp(space, params, dirs, tokens, targets, grad, hv);
            auto hh = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), hv);
            auto hd = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), dirs);
            hv_norm.assign(std::size_t(K), 0.0);
            for (int k = 0; k < K; ++k)
              for (index_t i = 0; i < P; ++i) {
                q[k] += double(hd(k, i)) * double(hh(k, i));
                hv_norm[k] += double(hh(k, i)) * double(hh(k, i));
              }
            for (double& n : hv_norm) n = std::sqrt(n);
          } else {
            q = mv.second_order(space, params, dirs, tokens, targets).second;
          }
          quad[method] = q;
        }
      }
    }
  }
  js << "\n  ]";
  for (const auto& [method, q] : quad) js << ",\n  \"vHv_sum " << method << "\": " << json_doubles(q);
  // |v| of a Rademacher direction is sqrt(P); |Hv| from forward-over-reverse:
  // the scale that quadratic forms are compared on (|v^T H v| <= |v| |Hv|).
  if (!hv_norm.empty()) {
    js << ",\n  \"Hv_norm forward-over-reverse\": " << json_doubles(hv_norm);
    js << ",\n  \"v_norm\": " << json_doubles({std::sqrt(double(P))});
  }
  js << ",\n  \"peak_rss_bytes\": " << peak_rss_bytes() << "\n}\n";
  std::fputs(js.str().c_str(), stdout);
}

// --predict: a pass's time on a GPU, from the GPU-shaped path run on this
// backend at a miniature of the shape (perf/cost_model.hpp). The miniature
// is the model with every scalable extent s times smaller (the context, the
// embedding, the heads' width, the MLP's, the vocabulary), the same batch,
// layers, heads and directions, and the full shape's plan imposed where a
// plan counts extents: its attention chunks, head tiles, bf16 operand chunks
// and adjoint cuts. It then issues the full shape's launches, label by
// label, and s^3 times fewer GEMM FLOPs and s^d times fewer bytes spanning d
// extents (kernels/gemm_ledger.hpp), so that it is the full pass's work, at
// a cost of about 1/s^2 of it. --predict-scale 1 runs the shape itself.
struct Miniature {
  ModelConfig config;
  Shape shape;
};

// Whether extents all divide by s, the rotary dims scale with them, and the
// miniature is a model gnh takes (GPT-NeoX's quarter of a head of 4 would
// rotate one dim: rotate-half needs pairs).
bool scalable(const ModelConfig& c, index_t T, int s) {
  const int hs = c.head_size();
  if (T % s || c.n_embd % s || hs % s || c.mlp_width() % s || c.vocab_size % s) return false;
  ModelConfig m = c;
  m.n_embd /= s;
  if (c.head_dim > 0) m.head_dim /= s;
  if (c.intermediate > 0) m.intermediate /= s;
  m.vocab_size /= s;
  m.block_size = int(T / s);
  if (m.head_size() * s != hs || m.rotary_dims() * s != c.rotary_dims()) return false;
  try {
    m.validate("miniature");
  } catch (const Error&) {
    return false;
  }
  return true;
}

// The largest power of two up to `most` that scales this model (1 at least).
int miniature_scale(const ModelConfig& c, index_t T, int most) {
  int s = 1;
  while (2 * s <= most && scalable(c, T, 2 * s)) s *= 2;
  return s;
}

// What a plan counts of an engine: attention chunks and head tiles a batch,
// the attention's causal query blocks and their rows (counted at the full
// extents: a miniature's times its scale).
std::string plan_counts(const ModelConfig& c, const Shape& s) {
  const index_t N = s.batch * s.context, seqs = attention_chunk_sequences(c, s);
  const index_t rows = gpt_tiles(c, s).logits_rows, blocks = attention_query_blocks(s);
  const index_t block_rows = kernels::attention_block_rows(s.context, blocks) * std::max(1, s.scale);
  return "[" + std::to_string((s.batch + seqs - 1) / seqs) + ", " + std::to_string((N + rows - 1) / rows) + ", " +
         std::to_string(blocks) + ", " + std::to_string(block_rows) + "]";
}

Miniature miniature_of(const ModelConfig& c, const Shape& full, int s) {
  if (!scalable(c, full.context, s))
    throw Error("--predict-scale " + std::to_string(s) +
                ": the context, widths and vocabulary of this model do not all divide by it");
  Miniature m{c, full};
  m.config.n_embd /= s;
  if (c.head_dim > 0) m.config.head_dim /= s;
  if (c.intermediate > 0) m.config.intermediate /= s;
  m.config.vocab_size /= s;
  m.config.block_size = int(full.context / s);
  m.shape.context = full.context / s;
  m.shape.scale = s;  // plans as the full shape (Shape::scale), its inner engines too
  m.shape.adjoint_cuts = adjoint_cuts_of(c, full) ? 1 : 0;
  if (plan_counts(c, full) != plan_counts(m.config, m.shape))
    throw Error("--predict-scale " + std::to_string(s) + ": the miniature's " +
                std::to_string(full.batch * full.context / s) +
                " rows cannot make the full shape's attention chunks, "
                "head tiles and query blocks " +
                plan_counts(c, full) + "; take a smaller scale");
  return m;
}

// One run of the pass (the gradient, or the second-order forward along K
// directions) on the miniature, recorded.
perf::RecordedRun run_miniature(const Miniature& mini) {
  using T = float;
  const ExecSpace space;
  const index_t B = mini.shape.batch, Tc = mini.shape.context;
  const Model model = synthetic_model(mini.config, B, Tc);
  const index_t P = ParamLayout(mini.config).size();
  const DeviceCase<T> dc(model, B, Tc);
  const View1<T> params = dc.params;
  const View2<std::int32_t> tokens = dc.tokens, targets = dc.targets;
  Gpt<T> engine(mini.config, mini.shape);
  if (mini.shape.directions == 0) {
    View1<T> grad("grad", P);
    return perf::record_run([&] { engine.gradient(space, params, tokens, targets, grad); }, mini.shape.scale);
  }
  View2<T> dirs("dirs", mini.shape.directions, P);
  fill_rademacher<T>(space, dirs, 1234, 0);
  return perf::record_run([&] { engine.second_order(space, params, dirs, tokens, targets); }, mini.shape.scale);
}

// The plans of the full engine and of its miniature, side by side (they
// must count alike), and of the adjoint cuts' gradient engine inside each.
std::string plans_json(const ModelConfig& c, const Shape& full, const Miniature& m) {
  auto inner = [](Shape g) {
    g.directions = 0, g.reverse = true, g.second_order = false, g.adjoint_cuts = 0, g.nested = true;
    return g;
  };
  std::string js = "{\"engine\": [" + plan_counts(c, full) + ", " + plan_counts(m.config, m.shape) + "]";
  if (adjoint_cuts_of(c, full))
    js += ", \"cut_gradient\": [" + plan_counts(c, inner(full)) + ", " + plan_counts(m.config, inner(m.shape)) + "]";
  return js + "}";
}

// Kokkos's fills, whatever their rank (and a memset on a GPU), as one label.
std::string cost_label(const std::string& label) {
  return label.rfind("Kokkos::ViewFill", 0) == 0 ? "Kokkos::ViewFill" : label;
}

// The epoch gradient pass's per-sequence norms (analysis.per_sequence) on the
// miniature: B sequences through an engine of the miniature's batch (as a
// GPU build groups them, analysis/memory.hpp: the gradient engine itself at
// the reference shape), their gradients added into the batch's and their
// squares taken; recorded.
perf::RecordedRun run_sequences(const Miniature& one, index_t B) {
  using T = float;
  const ExecSpace space;
  const index_t Tc = one.shape.context;
  const Model model = synthetic_model(one.config, B, Tc);
  const index_t P = ParamLayout(one.config).size();
  const DeviceCase<T> dc(model, B, Tc);
  Gpt<T> engine(one.config, one.shape);
  SequenceNorms<T> norms(engine, {0, std::int64_t(P)}, {{0, 1}}, B);
  View1<T> grad("grad", P);
  BatchScalars r;
  return perf::record_run([&] { norms.gradients(space, dc.params, dc.tokens, dc.targets, B, grad, r); },
                          one.shape.scale);
}

struct PassPrediction {
  std::string json;
  double seconds = 0;
  long device_launches = 0;
};

PassPrediction predict_pass(const std::string& name, const perf::RecordedRun& r, double s, const perf::Ceilings& c,
                            double batches, double per) {
  std::map<std::string, long> launches;
  long kokkos = 0;
  for (const perf::LabelTime& l : r.labels) {
    if (l.device_launches > 0) launches[cost_label(l.label)] += l.device_launches;
    kokkos += l.kernels;
  }
  for (const auto& [label, w] : r.work.labels) launches.emplace(cost_label(label), 0L);
  std::map<std::string, kernels::LabelWork> work;
  for (const auto& [label, w] : r.work.labels) {
    kernels::LabelWork& t = work[cost_label(label)];
    for (int d = 0; d < kernels::kScaledDims; ++d) t.bytes[std::size_t(d)] += w.bytes[std::size_t(d)];
    for (const auto& [k, n] : w.products) t.products[k] += n;
  }
  std::vector<perf::LabelCost> costs;
  PassPrediction p;
  double tensor = 0, fp32 = 0, fp64 = 0, bytes = 0;
  for (const auto& [label, n] : launches) {
    costs.push_back(perf::label_cost(label, n, work[label], s, c));
    const perf::LabelCost& l = costs.back();
    p.seconds += l.seconds();
    p.device_launches += l.launches;
    tensor += l.tensor, fp32 += l.fp32, fp64 += l.fp64, bytes += l.bytes;
  }
  std::sort(costs.begin(), costs.end(),
            [](const perf::LabelCost& a, const perf::LabelCost& b) { return a.seconds() > b.seconds(); });
  std::ostringstream js;
  js.precision(17);  // exact counts: a miniature's scaled work compares equal to the pass's
  js << "{\"pass\": \"" << name << "\", \"seconds_per_batch\": " << p.seconds << ", \"batches_per_epoch\": " << batches
     << ", \"seconds_per_epoch\": " << p.seconds * batches
     << ", \"seconds_per_epoch_direction\": " << p.seconds * batches / per
     << ", \"device_launches\": " << p.device_launches
     << ", \"launch_share\": " << double(p.device_launches) * c.launch / p.seconds
     << ", \"launch_budget\": " << perf::kLaunchShare << ", \"kokkos_kernels\": " << kokkos
     << ", \"gemm_flops\": {\"tensor\": " << tensor << ", \"fp32\": " << fp32 << ", \"fp64\": " << fp64
     << "}, \"bytes\": " << bytes << ", \"labels\": [";
  for (std::size_t i = 0; i < costs.size(); ++i) {
    const perf::LabelCost& l = costs[i];
    js << (i ? ", " : "") << "{\"label\": \"" << l.label << "\", \"seconds\": " << l.seconds()
       << ", \"launches\": " << l.launches << ", \"tensor\": " << l.tensor << ", \"fp32\": " << l.fp32
       << ", \"fp64\": " << l.fp64 << ", \"bytes\": " << l.bytes << ", \"compute_s\": " << l.compute_s
       << ", \"memory_s\": " << l.memory_s << ", \"launch_s\": " << l.launch_s << ", \"shapes\": [";
    // A GEMM label's longest product shapes (m, n, k at the full scale).
    for (std::size_t j = 0; j < std::min<std::size_t>(l.shapes.size(), 6); ++j) {
      const perf::ShapeCost& h = l.shapes[j];
      js << (j ? ", " : "") << "{\"m\": " << h.m << ", \"n\": " << h.n << ", \"k\": " << h.k
         << ", \"count\": " << h.count << ", \"unit\": \""
         << (h.unit == 0   ? "tensor"
             : h.unit == 1 ? "fp32"
                           : "fp64")
         << "\", \"bytes\": " << h.bytes << ", \"seconds\": " << h.seconds << "}";
    }
    js << "]}";
  }
  js << "]}";
  p.json = js.str();
  return p;
}

// The largest power of two up to 32 at which every shape's miniature can be
// made (1 at least: the shape itself).
int miniature_scale_for(const ModelConfig& c, const std::vector<Shape>& shapes) {
  for (int s = miniature_scale(c, shapes.front().context, 32); s > 1; s /= 2) {
    try {
      for (const Shape& sh : shapes) miniature_of(c, sh, s);
      return s;
    } catch (const Error&) {
    }
  }
  return 1;
}

// What one GPU of a sharded team holds (bytes): the engines whole, the
// parameter-sized vectors of the case's plan (noise vectors recomputed) and
// the parameters as slices, and the gathered layer buffers: the weights and
// the pass's K directions of the layer computing and of the next one in
// flight (the largest layer block: embed, a layer, the head).
struct ShardedMemory {
  double gradient = 0, curvature = 0, checks = 0, sequence = 0;  // the engines
  double engines = 0, vectors = 0, parameters = 0, gathered = 0;
  double total() const { return engines + vectors + parameters + gathered; }
};

ShardedMemory sharded_memory(const ModelConfig& c, index_t B, index_t Tc, int K, int R, double epoch_tokens) {
  AnalysisSettings a;
  a.context = Tc;
  a.grad_microbatch = a.hvp_batch = B;
  a.directions_per_pass = K;
  a.precision = Precision::bf16_amp;
  a.keep_noise_vectors = false;
  const MemoryPlan m = plan_memory(c, a, plan_case(a, index_t(epoch_tokens / double(Tc)), false, false), 1, true);
  const ParamLayout layout(c);
  std::int64_t largest = 0;
  for (const Partition& p : parameter_partitions(layout))
    if (p.names.size() == std::size_t(layer_blocks(c)))
      for (std::size_t b = 0; b + 1 < p.offsets.size(); ++b)
        largest = std::max(largest, p.offsets[b + 1] - p.offsets[b]);
  ShardedMemory sm;
  sm.gradient = double(m.gradient), sm.curvature = double(m.curvature), sm.checks = double(m.checks);
  sm.sequence = double(m.sequence);
  // The engines of the stage that holds the most (analysis/memory.cpp): the
  // gradient's and the curvature's in the passes, or the checks' alone.
  sm.engines = std::max(sm.gradient + sm.curvature, sm.checks) + sm.sequence;
  sm.vectors = double(m.vectors) / double(R);
  sm.parameters = 4.0 * double(layout.size()) / double(R);
  sm.gathered = R > 1 ? 2.0 * double(1 + K) * 4.0 * double(largest) : 0.0;
  return sm;
}

struct Predictions {
  PassPrediction gradient, gradient_tf32, second_order, sequence;
  std::string json;
};

// The gradient (bf16-amp unless --precision), its TF32 twin, the second-order
// forward along K directions (bf16-amp) and the per-sequence gradient, each
// from its miniature.
Predictions predict_passes(const Options& o, const ModelConfig& c, index_t Tc, int K, const perf::Ceilings& ceilings,
                           double batches) {
  const index_t B = o.batch;
  Options og = o;
  og.gpu_shaped = true;
  og.policy = o.precision_given ? o.policy : Precision::bf16_amp;
  Options ot = og;
  ot.policy = Precision::tf32;
  Options os = o;
  os.gpu_shaped = true;
  os.policy = Precision::bf16_amp;
  const Shape gs = shape_of(og, Tc, true), ts = shape_of(ot, Tc, true), ss = shape_of(os, Tc, false, K, true);
  const int s = o.predict_scale > 0 ? o.predict_scale : miniature_scale_for(c, {gs, ts, ss});
  Predictions p;
  const Miniature mg = miniature_of(c, gs, s), ms = miniature_of(c, ss, s);
  p.gradient = predict_pass("gradient", run_miniature(mg), s, ceilings, batches, 1.0);
  p.gradient_tf32 = predict_pass("gradient", run_miniature(miniature_of(c, ts, s)), s, ceilings, batches, 1.0);
  p.second_order = predict_pass("second-order", run_miniature(ms), s, ceilings, batches, double(K));
  // The gradient pass with analysis.per_sequence (the deck's default): the
  // gradient engine with its weight products batched per sequence.
  p.sequence = predict_pass("sequence", run_sequences(mg, B), s, ceilings, batches, 1.0);
  const std::string gp = o.precision_given ? o.precision : "bf16-amp";
  char head[1024];
  std::snprintf(head, sizeof(head),
                "{\"predict\": \"%s\", \"model\": \"%s\", \"family\": \"%s\", \"batch\": %ld, \"seq_len\": %ld, "
                "\"epoch_tokens\": %.0f, \"scale\": %d, \"execution_space\": \"%s\",\n \"ceilings\": {\"bf16\": %g, "
                "\"tf32\": %g, \"fp32\": %g, \"fp64\": %g, \"copy\": %g, \"memory\": %g, \"launch\": %g, "
                "\"sms\": %d},\n",
                o.predict.c_str(), o.synthetic.empty() ? "reference" : o.synthetic.c_str(), o.family.c_str(), long(B),
                long(Tc), o.epoch_tokens, s, ExecSpace::name(), ceilings.bf16, ceilings.tf32, ceilings.fp32,
                ceilings.fp64, ceilings.copy, ceilings.memory, ceilings.launch, ceilings.sms);
  p.json = std::string(head) + " \"gradient\": {\"precision\": \"" + gp + "\", \"plans\": " + plans_json(c, gs, mg) +
           ", \"prediction\": " + p.gradient.json + "},\n \"second_order\": {\"K\": " + std::to_string(K) +
           ", \"precision\": \"bf16-amp\", \"adjoint_cuts\": " + (adjoint_cuts_of(c, ss) ? "true" : "false") +
           ", \"plans\": " + plans_json(c, ss, ms) + ", \"prediction\": " + p.second_order.json +
           "},\n \"per_sequence\": {\"precision\": \"" + gp + "\", \"plans\": " + plans_json(c, gs, mg) +
           ", \"prediction\": " + p.sequence.json +
           "},\n \"gradient_tf32\": {\"precision\": \"tf32\", \"prediction\": " + p.gradient_tf32.json + "}";
  return p;
}

// --parameter-shards: the team's epoch (its GPUs split the batches) with the
// collectives of a shard group of R: a batch of the gradient gathers every
// layer's weights twice (forward, reverse) and reduce-scatters its gradient;
// a curvature batch gathers the weights and the K directions' slices once
// (the second-order forward's products are scalars: nothing to scatter).
std::string sharded_json(const Options& o, const ModelConfig& c, int K, const ShardedMemory& mem, const Predictions& p,
                         const perf::Fabric& f, int gpus, double batches, std::string& line) {
  const double P4 = 4.0 * double(ParamLayout(c).size());
  const int R = o.parameter_shards;
  const double per_gpu = std::ceil(batches / double(gpus));
  perf::ShardedBatch g{p.gradient.seconds, 3 * perf::collective_seconds(P4, R, f), c.n_layer};
  perf::ShardedBatch d{p.second_order.seconds, perf::collective_seconds(double(1 + K) * P4, R, f), c.n_layer};
  const bool fits = mem.total() <= 0.9 * f.memory;
  auto pass = [&](const perf::ShardedBatch& b, double per) {
    std::ostringstream js;
    js.precision(17);
    js << "{\"compute_s_per_batch\": " << b.compute << ", \"communication_s_per_batch\": " << b.communication
       << ", \"exposed_s_per_batch\": " << b.exposed() << ", \"seconds\": " << per_gpu * b.seconds() / per
       << ", \"communication_share\": " << b.communication_share() << "}";
    return js.str();
  };
  std::ostringstream js;
  js.precision(17);
  js << ",\n \"sharded\": {\"fabric\": \"" << f.name << "\", \"peer\": " << f.peer << ", \"injection\": " << f.injection
     << ", \"network\": " << f.network << ", \"gpus\": " << gpus << ", \"parameter_shards\": " << R << ", \"K\": " << K
     << ", \"batches_per_gpu\": " << per_gpu << ", \"memory_bytes\": {\"gradient_engine\": " << mem.gradient
     << ", \"curvature_engine\": " << mem.curvature << ", \"check_engines\": " << mem.checks
     << ", \"sequence_gradients\": " << mem.sequence << ", \"engines\": " << mem.engines
     << ", \"vectors\": " << mem.vectors << ", \"parameters\": " << mem.parameters << ", \"gathered\": " << mem.gathered
     << ", \"total\": " << mem.total() << ", \"gpu\": " << f.memory << ", \"fits\": " << (fits ? "true" : "false")
     << "}, \"gradient_epoch\": " << pass(g, 1.0) << ", \"direction\": " << pass(d, double(K)) << "}";
  char buf[512];
  std::snprintf(buf, sizeof(buf),
                "predicted %s x%d, parameter_shards %d: gradient %.3g s/epoch, direction %.3g s (K=%d), memory "
                "%.1f GiB a GPU of %.0f GB%s, communication %.1f%% of the gradient's time, %.1f%% of a "
                "direction's\n",
                o.predict.c_str(), gpus, R, per_gpu * g.seconds(), per_gpu * d.seconds() / K, K,
                mem.total() / double(1 << 30), f.memory / 1e9, fits ? "" : " (does not fit)",
                100 * g.communication_share(), 100 * d.communication_share());
  line = buf;
  return js.str();
}

void predict(const Options& o) {
  const std::optional<perf::Ceilings> known = perf::ceilings_named(o.predict);
  if (!known) throw Error("--predict: the cost model knows h200 and gh200, not '" + o.predict + "'");
  index_t Tc = o.context;
  // The configuration alone: a miniature's weights are made for it, and a 7B
  // model's own would not fit a small host.
  const ModelConfig c = synthetic_config(o.synthetic.empty() ? "reference" : o.synthetic, Tc, o.family);
  const perf::Ceilings ceilings = *known;
  const double batches = std::ceil(o.epoch_tokens / double(o.batch * Tc));
  int K = o.directions_given ? o.K.front() : 16;
  if (o.parameter_shards <= 0) {
    // The gradient at --precision where given, else under bf16-amp (the
    // PyTorch pipeline's production policy, that of its 28.7 s gradient, and
    // the faster of the tensor-core policies here), and at TF32 (the FP32
    // class's) beside it; the second-order forward under bf16-amp at K (16
    // unless --directions gives it).
    const Predictions p = predict_passes(o, c, Tc, K, ceilings, batches);
    std::printf("%s}\n", p.json.c_str());
    std::printf(
        "predicted %s: gradient %.3g s/epoch, second-order K=%d bf16-amp %.3g s/direction, launches per pass %ld\n",
        o.predict.c_str(), p.gradient.seconds * batches, K, p.second_order.seconds * batches / K,
        p.second_order.device_launches);
    return;
  }
  const perf::Fabric f = *perf::fabric_named(o.predict);
  const int gpus = o.gpus > 0 ? o.gpus : f.gpus_per_node;
  const int R = o.parameter_shards;
  if (gpus % R != 0)
    throw Error("--parameter-shards " + std::to_string(R) + " does not divide --gpus " + std::to_string(gpus));
  // K as the memory allows: the widest pass up to 16 that fits 90% of a GPU.
  if (!o.directions_given)
    while (K > 1 && sharded_memory(c, o.batch, Tc, K, R, o.epoch_tokens).total() > 0.9 * f.memory) K /= 2;
  const ShardedMemory mem = sharded_memory(c, o.batch, Tc, K, R, o.epoch_tokens);
  const Predictions p = predict_passes(o, c, Tc, K, ceilings, batches);
  std::string line;
  const std::string sj = sharded_json(o, c, K, mem, p, f, gpus, batches, line);
  std::printf("%s%s}\n%s", p.json.c_str(), sj.c_str(), line.c_str());
}

// The team scratch the plan's fused attention kernels request for this
// model's heads (cmake/check-cuda-resources.py adds their static shared
// memory and checks the sum per block); heads wider than the fused kernels
// take the batched path, which requests none. Nothing is allocated.
void scratch(const Options& o) {
  index_t Tc = o.context;
  const std::string spec = o.synthetic.empty() ? "reference" : o.synthetic;
  const ModelConfig cfg = synthetic_config(spec, Tc, o.family);
  const index_t hs = cfg.head_size();
  const bool fused = hs <= kernels::kFusedWidth;
  std::printf("{\"model\": \"%s\", \"family\": \"%s\", \"head_size\": %ld, \"fused\": %s, \"requests\": [",
              spec.c_str(), o.family.c_str(), long(hs), fused ? "true" : "false");
  if (fused) {
    const std::pair<const char*, std::size_t> r[] = {
        {"FusedForward", std::max(kernels::attention_fused_scratch_bytes(hs, false, false),
                                  kernels::attention_fused_scratch_bytes(hs, true, false))},
        {"FusedSecond", kernels::attention_fused_scratch_bytes(hs, true, true)},
        {"FusedReverseQueries", kernels::attention_fused_reverse_scratch_bytes(hs)},
        {"FusedReverseKeys", kernels::attention_fused_reverse_scratch_bytes(hs)}};
    for (std::size_t i = 0; i < std::size(r); ++i)
      std::printf("%s{\"functor\": \"%s\", \"bytes\": %zu}", i ? ", " : "", r[i].first, r[i].second);
  }
  std::printf("]}\n");
}

// The workspace each pass's engine plans, counted without allocating it or
// the model (a 7B shape plans on a laptop).
template <class T>
void plan(const Options& o) {
  index_t Tc = o.context;
  const ModelConfig cfg = synthetic_config(o.synthetic.empty() ? "small" : o.synthetic, Tc, o.family);
  std::printf("{\"model\": \"%s\", \"batch\": %ld, \"seq_len\": %ld, \"workspace_bytes\": {", o.synthetic.c_str(),
              long(o.batch), long(Tc));
  auto one = [&](const std::string& name, const Shape& s, bool comma) {
    std::printf("%s\"%s\": %zu", comma ? ", " : "", name.c_str(), Gpt<T>::planned_bytes(cfg, s));
  };
  one("forward", shape_of(o, Tc, false), false);
  one("gradient", shape_of(o, Tc, true), true);
  for (int K : o.K)
    for (const std::string& method : o.methods) {
      const bool fwd_over_rev = method == "forward-over-reverse";
      one(method + " K=" + std::to_string(K), shape_of(o, Tc, fwd_over_rev, K, !fwd_over_rev), true);
    }
  std::printf("}}\n");
}

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string x; std::getline(ss, x, ',');)
    if (!x.empty()) out.push_back(x);
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  Kokkos::ScopeGuard kokkos(argc, argv);
  perf::MemoryWatch::install();
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
      else if (a == "--precision") o.precision = next(), o.precision_given = true;
      else if (a == "--predict") o.predict = next();
      else if (a == "--attention-sequences") o.attention_sequences = std::stol(next());
      else if (a == "--attention-blocks") o.attention_blocks = std::stol(next());
      else if (a == "--predict-scale") o.predict_scale = std::stoi(next());
      else if (a == "--epoch-tokens") o.epoch_tokens = std::stod(next());
      else if (a == "--parameter-shards") o.parameter_shards = std::stoi(next());
      else if (a == "--gpus") o.gpus = std::stoi(next());
      else if (a == "--synthetic") o.synthetic = next();
      else if (a == "--family") o.family = next();
      else if (a == "--validation") o.validation = true;
      else if (a == "--plan-only") o.plan_only = true;
      else if (a == "--scratch") o.scratch = true;
      else if (a == "--profile") o.profile = true;
      else if (a == "--gpu-shaped") o.gpu_shaped = true;
      else if (a == "--no-probe") o.probe = false;
      else if (a == "--dump") o.dump = next();
      else if (a == "--dump-batch") o.dump_batch = std::stol(next());
      else if (a == "--adjoint-cuts") {
        const std::string v = next();
        if (v != "auto" && v != "0" && v != "1") throw std::runtime_error("--adjoint-cuts: expected auto, 0 or 1");
        o.adjoint_cuts = v == "auto" ? -1 : std::stoi(v);
      } else if (a == "--head-tile") {
        const std::vector<std::string> rv = split(next());
        if (rv.size() != 2) throw std::runtime_error("--head-tile: expected ROWS,VOCAB");
        o.head_rows = std::stol(rv[0]);
        o.head_vocab = std::stol(rv[1]);
      } else if (a == "--inject-slowdown") g_inject_slowdown = std::stod(next());
      else if (a == "--methods") o.methods = split(next());
      else if (a == "--passes") o.passes = split(next());
      else if (a == "--directions") {
        o.directions_given = true;
        o.K.clear();
        for (const std::string& k : split(next())) o.K.push_back(std::stoi(k));
      } else pos.push_back(a);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "bench_engine: %s\n", e.what());
      return 2;
    }
  }
  if (const auto p = precision_named(o.precision)) {
    o.policy = *p;
  } else {
    std::fprintf(stderr, "bench_engine: --precision: unknown policy '%s'\n", o.precision.c_str());
    return 2;
  }
  for (const std::string& m : o.methods)
    if (!curvature_method_named(m)) {
      std::fprintf(stderr, "bench_engine: --methods: unknown method '%s'\n", m.c_str());
      return 2;
    }
  if (o.K.empty() || o.repeats < 0 || (o.synthetic.empty() && pos.size() != 2) ||
      (!o.synthetic.empty() && !pos.empty())) {
    std::fprintf(stderr,
                 "usage: bench_engine (CKPT.h5 TOKENS.bin | --synthetic PRESET) --context T --batch B "
                 "[--directions 1,4,16] [--methods M,M] [--passes P,P] [--repeats R] "
                 "[--precision fp32|tf32|bf16-amp|fp64] [--validation]\n");
    return 2;
  }
  if (o.synthetic.empty()) {
    o.ckpt = pos[0];
    o.tokens = pos[1];
  }
  try {
    if (!o.predict.empty()) {
      predict(o);
      return 0;
    }
    if (o.scratch) {
      scratch(o);
      return 0;
    }
    if (o.plan_only) {
      if (o.policy == Precision::fp64) plan<double>(o);
      else plan<float>(o);
      return 0;
    }
    if (o.policy == Precision::fp64) run<double>(o);
    else run<float>(o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_engine: %s\n", e.what());
    return 1;
  }
  return 0;
}
