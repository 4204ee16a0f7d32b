#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
"""perf/campaign_case.py on 4 blocks, one round: gnh run and the same
statistics in PyTorch eager agree on L, |G|^2 and G^T H G (the script's own
tolerances, checked again here from its JSON), gnh's output has a curvature
stage (a skipped group would have none), and the ratio is PyTorch's seconds
over gnh's. The end-to-end comparison cannot rot."""
import json
import os
import subprocess
import sys
import tempfile
import unittest

import gnhtest


class CampaignCase(unittest.TestCase):
    def test_one_round_agrees(self):
        with tempfile.TemporaryDirectory(prefix="gnh-case-") as d:
            out = os.path.join(d, "case.json")
            r = subprocess.run([sys.executable, os.path.join(gnhtest.ROOT, "perf", "campaign_case.py"), "--blocks", "4",
                                "--rounds", "1", "--gnh", os.environ["GNH_BIN"], "--json", out],
                               capture_output=True, text=True)
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            with open(out) as f:
                res = json.load(f)
        self.assertEqual(len(res["rounds"]), 1)
        rd = res["rounds"][0]
        self.assertEqual(rd["gnh"]["tokens"], 4 * 128)
        self.assertEqual(rd["torch"]["tokens"], 4 * 128)
        self.assertIn("curvature", rd["gnh_stages"])
        self.assertGreater(rd["gnh_stages"]["curvature"], 0)
        # Float32 sums of 512 token losses and of 0.8 M gradient entries, each
        # side in its own order: 1e-5; G^T H G, a second derivative through the
        # float32 network: 1e-3 (as in the script).
        for k, tol in (("loss", 1e-5), ("G_sqnorm", 1e-5), ("GHG", 1e-3)):
            self.assertLessEqual(abs(rd["gnh"][k] - rd["torch"][k]), tol * abs(rd["torch"][k]), k)
        self.assertAlmostEqual(rd["ratio"], rd["torch_seconds"] / rd["gnh_seconds"], places=12)
        self.assertEqual(res["ratio"], rd["ratio"])


if __name__ == "__main__":
    unittest.main()
