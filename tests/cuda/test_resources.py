#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
"""cmake/check-cuda-resources.py on given ptxas reports:
- a gnh kernel made to spill (tests/cuda/spill_kernel.cu with its registers
  capped; reports from tests/cuda/make-reports.sh) fails, naming it; the
  same kernel uncapped passes;
- a fused attention kernel whose static shared memory, team scratch and
  Kokkos's share exceed a block's 48 KB fails, and one within passes (a
  report written here, in ptxas's format, under a hand-mangled name);
- fewer resident warps than the cost model assumes fail."""
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
SCRIPT = os.path.join(ROOT, "cmake", "check-cuda-resources.py")
spec = importlib.util.spec_from_file_location("check_cuda_resources", SCRIPT)
resources = importlib.util.module_from_spec(spec)
spec.loader.exec_module(resources)

# gnh::kernels::FusedSecond::run(): a name of the fused second order's shape.
FUSED = "_ZN3gnh7kernels11FusedSecond3runEv"


def fused_report(registers, smem):
    return (f"ptxas info    : Compiling entry function '{FUSED}' for 'sm_90'\n"
            f"ptxas info    : Function properties for {FUSED}\n"
            "    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n"
            f"ptxas info    : Used {registers} registers, used 1 barriers, {smem} bytes smem, 400 bytes cmem[0]\n")


class Resources(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="gnh-res-")

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def run_check(self, reports, *extra):
        return subprocess.run([sys.executable, SCRIPT, reports, *extra], capture_output=True, text=True)

    def test_a_kernel_made_to_spill_fails(self):
        r = self.run_check(os.path.join(HERE, "reports", "spilled"))
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
        self.assertIn("gnh::made_to_spill: 2072 bytes of spill stores and 2220 of spill loads", r.stderr)
        r = self.run_check(os.path.join(HERE, "reports", "clean"))
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("| gnh::made_to_spill | 1 | 156 | 0 / 0 | 256 | 0 |", r.stdout)

    def scratch(self, nbytes):
        path = os.path.join(self.tmp, f"scratch-{nbytes}.json")
        with open(path, "w") as f:
            json.dump({"model": "reference", "family": "nanogpt", "head_size": 64, "fused": True,
                       "requests": [{"functor": "FusedSecond", "bytes": nbytes}]}, f)
        return path

    def test_shared_memory_a_block(self):
        with open(os.path.join(self.tmp, "fused.o.ptxas"), "w") as f:
            f.write(fused_report(234, 8))
        # 8 static + 45,440 of scratch + (2 + 2) doubles = 45,480 <= 49,152.
        r = self.run_check(self.tmp, "--scratch", self.scratch(45440))
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("| gnh::kernels::FusedSecond::run | 1 | 234 | 0 / 0 | 0 | 8 | 45440 (reference) | 8 |",
                      r.stdout)
        # 49,120 + 8 + 32 = 49,160 > 49,152.
        r = self.run_check(self.tmp, "--scratch", self.scratch(49120))
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
        self.assertIn("gnh::kernels::FusedSecond::run: 49160 bytes of shared memory a block", r.stderr)

    def test_occupancy_below_the_cost_model(self):
        kernels = resources.parse_reports([self.write("occ.o.ptxas", fused_report(234, 8))])
        names = resources.demangle(list(kernels))
        scratch = [{"model": "reference", "requests": [{"functor": "FusedSecond", "bytes": 45440}]}]
        # 240 registers (in units of 8) x 64 threads: 4 teams by registers, 5 by
        # shared memory (233,472 / (45,480 + 1,024)): 8 warps.
        findings, rows = resources.check(kernels, names, scratch, 8)
        self.assertEqual(findings, [])
        self.assertEqual(rows[0][-1], "8")
        findings, _ = resources.check(kernels, names, scratch, 9)
        self.assertEqual(len(findings), 1)
        self.assertIn("8 warps resident a multiprocessor", findings[0])
        self.assertGreaterEqual(resources.assumed_min_warps(), 1)  # read from perf/cost_model.hpp

    def write(self, name, text):
        path = os.path.join(self.tmp, name)
        with open(path, "w") as f:
            f.write(text)
        return path


if __name__ == "__main__":
    unittest.main()
