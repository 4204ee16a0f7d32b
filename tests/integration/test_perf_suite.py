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


def run_json(cmd):
    r = subprocess.run(cmd, capture_output=True, text=True, env=gnhtest.mpi_env())
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

    def test_plan_only_reports_workspace_without_running(self):
        d = run_json([os.path.join(BIN, "bench_engine"), "--synthetic", "small", "--batch", "2", "--directions", "1",
                      "--plan-only"])
        w = d["workspace_bytes"]
        # Forward-over-reverse keeps every layer for two planes; the forward one layer for one.
        self.assertGreater(w["forward-over-reverse K=1"], w["gradient"])
        self.assertGreater(w["gradient"], w["forward"])


if __name__ == "__main__":
    unittest.main()
