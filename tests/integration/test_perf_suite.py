#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
"""The perf suite runs, seconds long, so it cannot rot: bench_kernels covers
every op in every mode; bench_engine reports its context (commit, build,
execution space, host GEMM), both sgemm rates, each pass's rates and memory,
and each curvature run's peak memory and time per direction (the device
check's rehearsal is tests/integration/test_device_check.py)."""
import json
import os
import shutil
import subprocess
import tempfile
import unittest

import gnhtest

BIN = os.path.dirname(os.environ.get("GNH_BENCH", os.path.join(gnhtest.ROOT, "build", "bin", "bench_engine")))


def run_json(cmd, env=None):
    r = subprocess.run(cmd, capture_output=True, text=True, env=dict(gnhtest.mpi_env(), **(env or {})))
    if r.returncode != 0:
        raise AssertionError(f"{cmd} failed: {r.stderr}")
    return json.loads(r.stdout)


class PerfSuite(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="gnh-perfsuite-")

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def test_kernel_benchmarks_cover_every_op_and_mode(self):
        # The ops are the registry's (src/kernels/ops.hpp), as bench_kernels lists them.
        r = subprocess.run([os.path.join(BIN, "bench_kernels"), "--list"], capture_output=True, text=True, check=True)
        ops = r.stdout.split()
        self.assertTrue({"linear", "layernorm", "gelu", "attention", "lm_head_xent", "embedding"} <= set(ops), ops)
        self.assertEqual(len(ops), len(set(ops)), "an op registered twice")
        d = run_json([os.path.join(BIN, "bench_kernels"), "--shape", "tiny", "--repeats", "1", "--directions", "2"])
        self.assertGreater(d["sgemm_gflops"], 0)
        modes = ("forward", "tangent", "second-order", "reverse", "tangent-reverse")
        got = [(k["op"], k["mode"]) for k in d["kernels"]]
        self.assertEqual(sorted(got), sorted((op, mode) for op in ops for mode in modes))
        for k in d["kernels"]:
            self.assertGreater(k["seconds"], 0)
            self.assertGreater(k["elements_per_s"], 0)
            if k["op"] in ("linear", "attention", "lm_head_xent"):
                self.assertGreater(k["gflops"], 0)
            # Each call's cost as recorded: on a host backend the products run
            # in FP32 (no tensor cores), and the GEMM-bound ops record exactly
            # their analytic count (integers below 2^53, printed with 17
            # digits). The attention op runs the host's tiles in the host's
            # threads, outside Kokkos and any GPU; the GPU's batched attention
            # is priced by bench_engine --predict (test_cost_model.py).
            c = k["cost"]
            self.assertEqual(c["tensor"], 0, k)
            if k["op"].startswith("attention"):
                continue
            self.assertGreaterEqual(c["device_launches"], 1, k)
            self.assertGreaterEqual(c["kernels"], 1, k)
            self.assertGreater(c["bytes"], 0, k)
            self.assertEqual(c["fp32"], c["analytic_gemm_flops"], k)
            if k["op"] in ("linear", "lm_head_xent"):
                self.assertGreater(c["fp32"], 0, k)

    def test_model_benchmark_reports_rates_memory_and_context(self):
        d = run_json([os.path.join(BIN, "bench_engine"), "--synthetic", "tiny", "--batch", "2", "--repeats", "1"])
        for key in ("git_commit", "build", "execution_space", "concurrency", "host_gemm", "n_params"):
            self.assertIn(key, d["context"])
        self.assertGreater(d["sgemm_gflops"]["gnh"], 0)
        self.assertGreater(d["sgemm_gflops"]["vendor"], 0)
        for p in ("forward", "gradient"):
            for key in ("tokens_per_s", "gflops", "fraction_of_sgemm", "peak_rss_bytes", "workspace_bytes"):
                self.assertGreater(d[p][key], 0, (p, key))
        runs = {(c["method"], c["K"]) for c in d["curvature"]}
        self.assertEqual(runs, {(m, k) for m in ("second-order-forward", "forward-over-reverse") for k in (1, 4, 16)})
        for c in d["curvature"]:
            self.assertGreater(c["peak_rss_bytes"], 0)
            # Both printed to 6 significant digits (relative rounding 5e-6 each).
            self.assertAlmostEqual(c["seconds_per_direction"] * c["K"], c["seconds"], delta=1e-5 * c["seconds"])

    def test_gpu_shaped_profile_counts_what_a_gpu_launches(self):
        # bench_engine --gpu-shaped runs the GPU's kernels on this host; its
        # profile counts each kernel and each GEMM entry point's call once
        # (device_launches), not the host loops nested in a GEMM.
        cmd = [os.path.join(BIN, "bench_engine"), "--synthetic", "tiny", "--batch", "2", "--passes",
               "gradient,curvature", "--directions", "2", "--methods", "second-order-forward", "--repeats", "0",
               "--profile", "--no-probe"]
        gpu, host = run_json(cmd + ["--gpu-shaped"]), run_json(cmd)
        self.assertTrue(gpu["context"]["gpu_shaped"])
        self.assertFalse(host["context"]["gpu_shaped"])
        L = gpu["context"]["n_layer"]

        def labels(p):
            return {x["label"]: x for x in p["profile"]["labels"]}

        g, h = labels(gpu["gradient"]), labels(host["gradient"])
        # One chunk of sequences: a softmax row kernel per layer each way.
        self.assertEqual(g["gnh::attention::batched::softmax"]["device_launches"], L)
        self.assertEqual(g["gnh::attention::batched::softmax_reverse"]["device_launches"], L)
        self.assertNotIn("gnh::attention::batched::softmax", h)
        # The embedding's rows grouped on the device, once in the reverse.
        self.assertEqual(g["gnh::embedding::count_tokens"]["device_launches"], 1)
        self.assertNotIn("gnh::embedding::count_tokens", h)
        # A flush writes the pointers of up to eight batched products.
        mapped = g["gnh::gemm_mapped"]["device_launches"]
        self.assertGreaterEqual(g["gnh::gemm_mapped::pointers"]["device_launches"] * 8, mapped)
        for run in (gpu, host):
            for p in [run["gradient"]] + run["curvature"]:
                prof = p["profile"]
                self.assertEqual(prof["device_launches"], sum(x["device_launches"] for x in prof["labels"]))
                self.assertLessEqual(prof["device_launches"], prof["launches"])
                self.assertEqual(labels(p)["gnh::gpt::forward"]["device_launches"], 0)  # a region, not a launch

    def test_profile_counts_gemm_flops_by_the_unit_a_gpu_runs_them_on(self):
        # The same products in every precision: FP32 without tensor cores,
        # all on tensor cores under tf32 and bf16-amp, the batched
        # attention's included (its bf16-amp operands go through TF32).
        # Under bf16-amp the attention's forward is fused by default
        # (kernels/attention_fused.hpp: its scores formed twice, so more
        # FLOPs); the batched GEMMs throughout do the same products.
        cmd = [os.path.join(BIN, "bench_engine"), "--synthetic", "tiny", "--batch", "2", "--passes",
               "gradient,curvature", "--directions", "2", "--methods", "second-order-forward", "--repeats", "0",
               "--profile", "--no-probe", "--gpu-shaped", "--precision"]
        runs = {p: run_json(cmd + [p], {"GNH_ATTENTION": "batched"}) for p in ("fp32", "tf32", "bf16-amp")}
        fused = run_json(cmd + ["bf16-amp"])
        # The gradient's forward fused, one launch a layer; the second order
        # at K = 2 runs without adjoint cuts (x'' nonzero), so batched.
        by = {x["label"]: x for x in fused["gradient"]["profile"]["labels"]}
        layers = by["gnh::attention::fused::forward"]["device_launches"]
        self.assertGreaterEqual(layers, 1)
        self.assertNotIn("gnh::attention::batched::softmax", by)
        for p in fused["curvature"]:
            self.assertNotIn("gnh::attention::fused::forward", {x["label"] for x in p["profile"]["labels"]})
        for precision, d in runs.items():
            for p in [d["gradient"]] + d["curvature"]:
                f = p["profile"]["gemm_flops"]
                self.assertEqual(f["fp64"], 0)
                if precision == "fp32":
                    self.assertEqual(f["tensor"], 0, precision)
                    self.assertGreater(f["fp32"], 0)
                else:
                    self.assertEqual(f["fp32"], 0, precision)
                    self.assertGreater(f["tensor"], 0)
        # Integer FLOP counts summed exactly: the same work in each precision.
        totals = {p: [sum(x["profile"]["gemm_flops"].values()) for x in [d["gradient"]] + d["curvature"]]
                  for p, d in runs.items()}
        self.assertEqual(totals["fp32"], totals["tf32"])
        self.assertEqual(totals["fp32"], totals["bf16-amp"])

    def test_gpu_shaped_plan_fits_a_gh200_at_the_reference_shape(self):
        # The engine's plan with the GPU's buffers (score planes, bf16-amp's
        # rounded operands, pointer arrays, the embedding's token work) at
        # the reference model and a 64 x 1024 batch: the second-order forward
        # at K = 16 within 80% of a 96 GB GH200, at K = 1 within 8 GB, in
        # every precision. The plan is the engine's own list of buffers.
        for precision in ("fp32", "tf32", "bf16-amp"):
            d = run_json([os.path.join(BIN, "bench_engine"), "--synthetic", "reference", "--batch", "64",
                          "--directions", "1,16", "--plan-only", "--gpu-shaped", "--no-probe", "--precision",
                          precision])
            w = d["workspace_bytes"]
            self.assertLessEqual(w["second-order-forward K=16"], 0.8 * 96e9, (precision, w))
            self.assertLessEqual(w["second-order-forward K=1"], 8e9, (precision, w))
            host = run_json([os.path.join(BIN, "bench_engine"), "--synthetic", "reference", "--batch", "64",
                             "--directions", "1,16", "--plan-only", "--no-probe", "--precision", precision])
            # The GPU's buffers are in it: more than the host-shaped plan.
            self.assertGreater(w["second-order-forward K=16"], host["workspace_bytes"]["second-order-forward K=16"])

    def test_plan_only_reports_workspace_without_running(self):
        d = run_json([os.path.join(BIN, "bench_engine"), "--synthetic", "small", "--batch", "2", "--directions", "1",
                      "--plan-only"])
        w = d["workspace_bytes"]
        # Forward-over-reverse keeps every layer for two planes; the forward one layer for one.
        self.assertGreater(w["forward-over-reverse K=1"], w["gradient"])
        self.assertGreater(w["gradient"], w["forward"])


    def test_plan_only_of_a_7b_shape_allocates_neither_model_nor_workspace(self):
        # A 7B GPT-NeoX shape (32 layers of 4096, Pythia's vocabulary) at
        # context 2048, planned within 4 GB of address space: counted, not
        # allocated (the model alone is 27 GB of float32).
        d = run_json(["prlimit", "--as=4000000000", os.path.join(BIN, "bench_engine"), "--synthetic",
                      "32,32,4096,50304", "--family", "gpt-neox", "--context", "2048", "--batch", "1",
                      "--directions", "1", "--plan-only", "--no-probe"])
        w = d["workspace_bytes"]
        self.assertGreater(w["gradient"], 4e9)
        self.assertGreater(w["forward-over-reverse K=1"], w["gradient"])


if __name__ == "__main__":
    unittest.main()
