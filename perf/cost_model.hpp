// SPDX-License-Identifier: BSD-3-Clause
// The cost model of bench_engine --predict: a pass's time on a GPU from what
// the GPU-shaped path issues, label by label (kernels/gemm_ledger.hpp's work,
// kernel_profile.hpp's launches), against the GPU's ceilings.
//
// A label's time is its launches times a per-launch cost, plus
//   - for a GEMM entry point, per product shape, the longer of its FLOPs at
//     the unit's rate times the shape's efficiency and its operands' bytes at
//     the memory rate (a roofline per shape: the batched attention's T x T x
//     head-width products are memory-bound on an H200);
//   - for any other kernel, its bytes at the memory rate.
// Work recorded by a miniature s times smaller in every scalable extent
// (gemm_ledger.hpp) is scaled back: each product's m, n and k by s, bytes
// spanning d extents by s^d.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include "kernels/gemm_ledger.hpp"

namespace gnh::perf {

struct Ceilings {
  std::string name;
  double bf16 = 0;    // tensor-core FLOP/s with bfloat16 operands
  double tf32 = 0;    // tensor-core FLOP/s with 4-byte operands (TF32)
  double fp32 = 0;    // FP32 FLOP/s on the CUDA cores
  double fp64 = 0;    // FP64 FLOP/s
  double copy = 0;    // bytes/s read and written by a device-to-device copy
  double memory = 0;  // the share of `copy` a streaming kernel reaches
  double launch = 0;  // s a launch costs: issue, and a kernel's ramp and tail
  int sms = 0;        // multiprocessors
};

// One H200 (SXM) as measured on this workplace's machines where it was, the
// datasheet's ratios elsewhere:
//   - bf16: 788 TFLOP/s measured (8192^3 products on random data, PyTorch,
//     two machines: 769-798); taken as 790;
//   - tf32: half of bf16, the datasheet's ratio (495 against 990 dense);
//   - fp32 and fp64: 90% and 75% of the datasheet's 67 TFLOP/s;
//   - copy: 4.3 TB/s measured (bytes read plus written, device to device);
//     a streaming kernel reaches 80% of it;
//   - launch: 4 us a launch, kernel or library call, without CUDA graphs (the
//     issue rate of back-to-back launches on a stream, 2-3 us, plus a small
//     kernel's ramp and tail).
inline Ceilings h200() {
  Ceilings c;
  c.name = "h200";
  c.bf16 = 790e12;
  c.tf32 = 395e12;
  c.fp32 = 60e12;
  c.fp64 = 50e12;
  c.copy = 4.3e12;
  c.memory = 0.8;
  c.launch = 4e-6;
  c.sms = 132;
  return c;
}

// The Hopper GPU of a GH200 Grace Hopper superchip as the clusters of this
// project have it (96 GB of HBM3): the H100 die of the H200, 132
// multiprocessors at the same clocks, so the H200's measured compute rates
// and launch cost; its memory at the datasheets' ratio, 4.0 TB/s against the
// H200's 4.8 TB/s (copy 4.3 x 4.0 / 4.8 = 3.58 TB/s). Not measured: no GH200
// has run gnh's kernels.
inline Ceilings gh200() {
  Ceilings c = h200();
  c.name = "gh200";
  c.copy = 4.3e12 * 4.0 / 4.8;
  return c;
}

// The links of a node that a sharded run's collectives use (parameters,
// gradient and products as slices over the R GPUs of a shard group: an
// all-gather of a layer's slices before it runs, a reduce-scatter of its
// gradient after). Datasheet figures; nothing measured.
struct Fabric {
  std::string name;
  double peer = 0;       // bytes/s each way that one GPU reaches one other GPU of its node at
  double injection = 0;  // bytes/s each way that one GPU reaches all the others of its node at
  double network = 0;    // bytes/s each way that one GPU reaches other nodes at
  int gpus_per_node = 0;
  double memory = 0;  // bytes of memory a GPU
};

// A GH200 node as the clusters of this project have it (HPE Cray EX254n):
// four GH200s, every pair joined by six NVLink 4 links (150 GB/s each way),
// so 450 GB/s from one GPU to the three others together; one Slingshot-11
// NIC (200 Gb/s, 25 GB/s) a GPU between nodes; 96 GB of HBM3 a GPU.
inline Fabric gh200_node() { return {"gh200 node (4 GPUs, NVLink 4 all-to-all)", 150e9, 450e9, 25e9, 4, 96e9}; }

// An HGX H200 node: eight H200s behind NVSwitch, 450 GB/s each way from any
// GPU to any set of the others; a 400 Gb/s NIC (50 GB/s) a GPU; 141 GB of
// HBM3e a GPU.
inline Fabric h200_node() { return {"HGX H200 node (8 GPUs, NVSwitch)", 450e9, 450e9, 50e9, 8, 141e9}; }

// Seconds to all-gather a vector of `bytes` held as R equal slices, one a
// GPU (each GPU receives the R - 1 slices it lacks), or to reduce-scatter one
// (each sends them): within a node over min(R - 1 links, the GPU's
// injection), beyond it over the network. Latency is left out: a layer's
// slices are megabytes.
inline double collective_seconds(double bytes, int R, const Fabric& f) {
  if (R <= 1) return 0;
  const double moved = bytes * double(R - 1) / double(R);
  const double bandwidth = R <= f.gpus_per_node ? std::min(f.peer * double(R - 1), f.injection) : f.network;
  return moved / bandwidth;
}

// A sharded pass's batch: its compute and its collectives, the next layer's
// gather in flight while this layer computes, so that only the first layer's
// gather and any collective time beyond the compute are exposed.
struct ShardedBatch {
  double compute = 0, communication = 0;
  int layers = 1;
  double exposed() const {
    return std::max(0.0, communication - compute) + communication / double(std::max(layers, 1));
  }
  double seconds() const { return compute + exposed(); }
  double communication_share() const { return seconds() > 0 ? exposed() / seconds() : 0; }
};

// The fabric of the node that --predict's GPU comes in, or nothing.
inline std::optional<Fabric> fabric_named(const std::string& name) {
  if (name == "h200") return h200_node();
  if (name == "gh200") return gh200_node();
  return std::nullopt;
}

// The ceilings of a GPU by its --predict name, or nothing.
inline std::optional<Ceilings> ceilings_named(const std::string& name) {
  if (name == "h200") return h200();
  if (name == "gh200") return gh200();
  return std::nullopt;
}

// The share of the bfloat16 tensor-core rate that the fused attention's
// products reach (kernels/attention_fused.hpp; assumed until a GPU measures
// it): FlashAttention-2's forward, whose scores stay in registers (mma.sync),
// reaches about 35% of an H100's dense bfloat16 rate; this kernel stores its
// score and probability tiles in shared memory between WMMA products and
// runs 4 to 8 warps a multiprocessor (registers and up to 45 KB of shared
// memory a team of 2), so less: 25%. Its bytes (q, k, v read and y written
// once) are a roofline's other side.
constexpr double kFusedAttentionEfficiency = 0.25;
// The occupancy that efficiency assumes: at least this many warps of the
// fused kernels resident on a multiprocessor, as their registers and shared
// memory allow (cmake/check-cuda-resources.py checks the sm_90 build's).
constexpr int kFusedAttentionMinWarps = 4;

// The launch budget of a pass: its launches cost at most this share of its
// predicted time (at the reference shape, 64 x 1024 tokens: the gradient
// about 2%, the second-order forward at K = 16 under bf16-amp about 3%), so
// that a faster pass must launch less.
constexpr double kLaunchShare = 0.05;

// The share of a unit's rate that `count` products of (m x k) by (k x n)
// reach in one call: 85% of the rate on large shapes, times how well their
// 128 x 128 output tiles fill the multiprocessors (a library splits a deep
// contraction over more tiles: one more split per 512 of k), times the depth
// of the contraction up to 128.
inline double gemm_efficiency(double m, double n, double k, double count, int sms) {
  const double tiles = std::ceil(m / 128.0) * std::ceil(n / 128.0) * count;
  const double split = std::max(1.0, std::floor(k / 512.0));
  const double work = tiles * split;
  const double waves = std::ceil(work / double(sms));
  const double fill = work / (waves * double(sms));
  return 0.85 * fill * std::min(1.0, k / 128.0);
}

// One product shape of a GEMM label, at the full scale.
struct ShapeCost {
  double m = 0, n = 0, k = 0, count = 0, flops = 0, bytes = 0, seconds = 0;
  int unit = 0;  // kernels::GemmUnit
};

struct LabelCost {
  std::string label;
  std::vector<ShapeCost> shapes;  // a GEMM label's products by shape, longest first
  long launches = 0;
  double tensor = 0, fp32 = 0, fp64 = 0;  // GEMM FLOPs
  double bytes = 0;
  // FLOPs at their rates, bytes at the memory rate, the roofline of the two
  // (per product shape for a GEMM), the launches.
  double compute_s = 0, memory_s = 0, work_s = 0, launch_s = 0;
  double seconds() const { return work_s + launch_s; }
};

// The unit of a label's first product (a label's products share one).
inline kernels::GemmUnit GemmUnitOf(const kernels::LabelWork& w) {
  return w.products.empty() ? kernels::GemmUnit::tensor : kernels::GemmUnit(w.products.begin()->first[3]);
}

// A fused kernel's label: the longer of its products' FLOPs at
// kFusedAttentionEfficiency of the bfloat16 rate and its bytes.
inline LabelCost fused_cost(LabelCost r, const kernels::LabelWork& w, double s, const Ceilings& c) {
  for (int d = 0; d < kernels::kScaledDims; ++d) r.bytes += w.bytes[std::size_t(d)] * std::pow(s, d);
  for (const auto& [key, count] : w.products) {
    const double m = double(key[0]) * s, n = double(key[1]) * s, k = double(key[2]) * s;
    const double flops = 2.0 * m * n * k * count;
    r.tensor += flops;
    r.compute_s += flops / (c.bf16 * kFusedAttentionEfficiency);
    r.shapes.push_back({m, n, k, count, flops, 0, flops / (c.bf16 * kFusedAttentionEfficiency), int(key[3])});
  }
  r.memory_s = r.bytes / (c.copy * c.memory);
  r.work_s = std::max(r.compute_s, r.memory_s);
  return r;
}

// A label's work at scale s (the full shape from a miniature s times smaller;
// 1: as recorded) on the ceilings c.
inline LabelCost label_cost(const std::string& label, long launches, const kernels::LabelWork& w, double s,
                            const Ceilings& c) {
  LabelCost r;
  r.label = label;
  r.launches = launches;
  r.launch_s = double(launches) * c.launch;
  const double bw = c.copy * c.memory;
  if (w.products.empty()) {
    for (int d = 0; d < kernels::kScaledDims; ++d) r.bytes += w.bytes[std::size_t(d)] * std::pow(s, d);
    r.memory_s = r.work_s = r.bytes / bw;
    return r;
  }
  // A GEMM entry point: a roofline per product shape. A fused kernel's
  // products at their efficiency against its recorded bytes.
  if (GemmUnitOf(w) == kernels::GemmUnit::fused) return fused_cost(r, w, s, c);
  for (const auto& [key, count] : w.products) {
    const double m = double(key[0]) * s, n = double(key[1]) * s, k = double(key[2]) * s;
    const auto unit = kernels::GemmUnit(key[3]);
    const double ob = double(key[4]), cb = double(key[5]);
    const double flops = 2.0 * m * n * k * count;
    const double bytes = count * (ob * (m * k + k * n) + cb * m * n);
    const double rate = unit == kernels::GemmUnit::tensor ? (ob <= 2.0 ? c.bf16 : c.tf32)
                        : unit == kernels::GemmUnit::fp32 ? c.fp32
                                                          : c.fp64;
    const double tc = flops / (rate * gemm_efficiency(m, n, k, count, c.sms)), tm = bytes / bw;
    (unit == kernels::GemmUnit::tensor ? r.tensor : unit == kernels::GemmUnit::fp32 ? r.fp32 : r.fp64) += flops;
    r.bytes += bytes;
    r.compute_s += tc;
    r.memory_s += tm;
    r.work_s += std::max(tc, tm);
    r.shapes.push_back({m, n, k, count, flops, bytes, std::max(tc, tm), int(key[3])});
  }
  std::sort(r.shapes.begin(), r.shapes.end(),
            [](const ShapeCost& a, const ShapeCost& b) { return a.seconds > b.seconds; });
  return r;
}

}  // namespace gnh::perf
