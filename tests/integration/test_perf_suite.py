#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
"""The perf suite runs, seconds long, so it cannot rot: bench_kernels covers
every op in every mode; bench_engine reports its context (commit, build,
execution space, host GEMM), both sgemm rates, each pass's rates and memory,
and each curvature run's peak memory and time per direction; and
perf/device/run.sh (host mode) validates and extrapolates, and catches a wrong
curvature."""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

import gnhtest

BIN = os.path.dirname(os.environ.get("GNH_BENCH", os.path.join(gnhtest.ROOT, "build", "bin", "bench_engine")))
DEVICE = os.path.join(gnhtest.ROOT, "perf", "device")


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

    def test_device_script_validates_and_extrapolates_on_the_host(self):
        out = os.path.join(self.tmp, "device")
        r = subprocess.run(["bash", os.path.join(DEVICE, "run.sh"), "--cpu", "--bench", os.path.join(BIN, "bench_engine"),
                            "--config", "tiny", "--batch", "2", "--out", out], capture_output=True, text=True,
                           env=gnhtest.mpi_env())
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("validate: PASS", r.stdout)
        epoch = json.load(open(os.path.join(out, "device_epoch.json")))
        rows = {(p["pass"], p["K"]): p for p in epoch["passes"]}
        self.assertEqual(set(rows), {("gradient", 0), ("second-order-forward", 1), ("second-order-forward", 16),
                                     ("forward-over-reverse", 1), ("forward-over-reverse", 4)})
        g = rows[("gradient", 0)]
        self.assertAlmostEqual(g["epoch_seconds"], g["seconds_per_batch"] * 9963 / 2, places=6)

        # A curvature value off by 1e-3 relative must fail the validation.
        ref = json.load(open(os.path.join(DEVICE, "validation_small.json")))
        ref["values"]["vHv_sum second-order-forward"][2] *= 1.001
        bad = os.path.join(self.tmp, "bad_reference.json")
        json.dump(ref, open(bad, "w"))
        r = subprocess.run([sys.executable, os.path.join(DEVICE, "summarize.py"), "validate", bad,
                            os.path.join(out, "device_validation.json")], capture_output=True, text=True)
        self.assertEqual(r.returncode, 1, r.stdout)
        self.assertIn("FAIL", r.stdout)


    def test_device_script_stops_before_running_a_binary_it_cannot_load(self):
        # The GPU machine runs a bench_engine built elsewhere (perf/device/prepare.sh):
        # a missing binary, or one linking a library that machine lacks, stops the
        # script with the reason before anything is written.
        out = os.path.join(self.tmp, "device_refused")
        script = os.path.join(DEVICE, "run.sh")
        r = subprocess.run(["bash", script, "--bench", os.path.join(self.tmp, "absent"), "--out", out],
                           capture_output=True, text=True)
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
        self.assertIn("is not an executable", r.stderr)
        # An executable linking libgnh_gone.so, removed after the link.
        src, lib, exe = (os.path.join(self.tmp, n) for n in ("gone.c", "libgnh_gone.so", "bench_engine"))
        open(src, "w").write("int gnh_gone(void) { return 0; }\n")
        subprocess.run(["cc", "-shared", "-fPIC", "-o", lib, src], check=True)
        open(src, "w").write("int gnh_gone(void);\nint main(void) { return gnh_gone(); }\n")
        subprocess.run(["cc", "-o", exe, src, "-L" + self.tmp, "-lgnh_gone"], check=True)
        os.remove(lib)
        r = subprocess.run(["bash", script, "--bench", exe, "--out", out], capture_output=True, text=True)
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
        self.assertIn("needs libraries this machine lacks: libgnh_gone.so", r.stderr)
        self.assertFalse(os.path.exists(out))

if __name__ == "__main__":
    unittest.main()
