#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
"""perf/compare.py's rules on given timings (no clock involved): a pass
regresses when its median is slower than the baseline's by more than
max(2 x noise, --min-threshold), the noise being the relative range of the
repeats without the fastest and slowest from five repeats on; runs of
different models or precisions are refused. perf_compare (label bench) runs
it on this machine's own timings."""
import json
import os
import subprocess
import sys
import tempfile
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.realpath(__file__))))
COMPARE = os.path.join(ROOT, "perf", "compare.py")


def bench(samples, precision="fp32"):
    """A bench_engine result whose passes all have these repeats."""
    def p(scale):
        s = [x * scale for x in samples]
        return {"seconds": sorted(s)[len(s) // 2], "samples": s}
    return {"context": {"n_params": 1000, "batch": 4, "seq_len": 64, "precision": precision},
            "forward": p(1.0), "gradient": p(3.0),
            "curvature": [dict(p(10.0), method="second-order-forward", K=4)]}


class CompareRules(unittest.TestCase):
    def run_compare(self, base, cur, *extra):
        with tempfile.TemporaryDirectory() as d:
            a, b = os.path.join(d, "a.json"), os.path.join(d, "b.json")
            json.dump(base, open(a, "w"))
            json.dump(cur, open(b, "w"))
            return subprocess.run([sys.executable, COMPARE, a, b, *extra], capture_output=True, text=True)

    def test_a_slowdown_beyond_twice_the_noise_is_flagged(self):
        quiet = [1.00, 1.01, 1.02, 1.03, 1.04]  # noise without the extremes: (1.03 - 1.01) / 1.02 = 2%
        r = self.run_compare(bench(quiet), bench([x * 1.10 for x in quiet]))
        self.assertEqual(r.returncode, 1, r.stdout)  # +10% > max(2 x 2%, 5%)
        self.assertEqual(r.stdout.count("REGRESSION"), 3, r.stdout)

    def test_a_change_within_the_threshold_is_not(self):
        quiet = [1.00, 1.01, 1.02, 1.03, 1.04]
        r = self.run_compare(bench(quiet), bench([x * 1.04 for x in quiet]))
        self.assertEqual(r.returncode, 0, r.stdout)  # +4% < 5%
        self.assertIn("no regression", r.stdout)

    def test_the_threshold_follows_the_measured_noise(self):
        # A 30% range (without the extremes) lets a 40% slowdown pass (< 2 x 30%)...
        noisy = [0.5, 0.85, 1.0, 1.15, 2.0]
        r = self.run_compare(bench(noisy), bench([x * 1.4 for x in noisy]))
        self.assertEqual(r.returncode, 0, r.stdout)
        # ...but one stray sample does not widen it: the extremes are dropped.
        stray = [1.00, 1.01, 1.02, 1.03, 3.0]
        r = self.run_compare(bench(stray), bench([x * 1.10 for x in stray]))
        self.assertEqual(r.returncode, 1, r.stdout)

    def test_different_runs_are_refused(self):
        r = self.run_compare(bench([1.0] * 5), bench([1.0] * 5, precision="bf16-amp"))
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("differ in precision", r.stderr)


if __name__ == "__main__":
    unittest.main()
