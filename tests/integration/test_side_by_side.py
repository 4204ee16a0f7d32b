#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
"""perf/side_by_side.py on the tiny preset, two interleaved rounds: every
round holds both sides' results and its own ratios, each reported ratio is the
median of the rounds' and lies within the reported range, and a round's ratio
is its sides' times divided as the table says (torch / gnh per direction,
gnh / torch in tokens per second). Within a round each of gnh's passes is
followed at once by PyTorch's same pass (forward and gradient, then the
curvature at each K): the segments' times interleave. The benchmark cannot
rot, and a ratio taken from one side of one round and the other side of
another, or a round that ran all of one side first, would fail."""
import json
import os
import statistics
import subprocess
import sys
import tempfile
import unittest

import gnhtest


class SideBySide(unittest.TestCase):
    def test_rounds_and_their_median(self):
        bench = os.environ["GNH_BENCH"]
        with tempfile.TemporaryDirectory(prefix="gnh-sbs-") as d:
            out = os.path.join(d, "tiny.json")
            r = subprocess.run([sys.executable, os.path.join(gnhtest.ROOT, "perf", "side_by_side.py"), "--preset",
                                "tiny", "--repeats", "1", "--rounds", "2", "--torch-setting", "as-is", "--bench", bench,
                                "--json", out], capture_output=True, text=True)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertIn("2 interleaved round(s)", r.stdout)
            with open(out) as f:
                res = json.load(f)
        rounds = res["rounds"]
        self.assertEqual(len(rounds), 2)
        keys = set(res["ratios"])
        self.assertIn("gradient_throughput_vs_eager", keys)
        self.assertIn("functorch-forward-over-reverse_K16_vs_best", keys)
        for k in keys:
            per_round = [rd["ratios"][k] for rd in rounds]
            self.assertEqual(res["ratios"][k], statistics.median(per_round), k)
            self.assertEqual(res["ratio_ranges"][k], [min(per_round), max(per_round)], k)
        for rd in rounds:
            g, t = rd["gnh"], rd["torch"]
            self.assertAlmostEqual(rd["ratios"]["gradient_throughput_vs_eager"],
                                   g["gradient"]["tokens_per_s"] / t["gradient"]["tokens_per_s"], places=12)
            best = min(c["seconds_per_direction"] for c in g["curvature"] if c["K"] == 16)
            fr = next(c for c in t["curvature"] if c["K"] == 16 and c["method"] == "functorch-forward-over-reverse")
            self.assertAlmostEqual(rd["ratios"]["functorch-forward-over-reverse_K16_vs_best"],
                                   fr["seconds_per_direction"] / best, places=12)
            # Pairs by pass, in order: gnh's forward and gradient, torch's; gnh's
            # K = 1, torch's; gnh's K = 16, torch's.
            segs = rd["segments"]
            self.assertEqual([(sg["passes"], sg["directions"]) for sg in segs],
                             [("forward,gradient", "1"), ("curvature", "1"), ("curvature", "16")])
            order = [x for sg in segs for x in (sg["gnh"], sg["torch"])]
            for a, b in zip(order, order[1:]):
                self.assertLessEqual(a[0], a[1])
                self.assertLessEqual(a[1], b[0])
            self.assertEqual(sorted({c["K"] for c in g["curvature"]}), [1, 16])
            self.assertEqual(sorted({c["K"] for c in t["curvature"]}), [1, 16])
        self.assertEqual(res["gnh"], rounds[0]["gnh"])  # perf/compare.py reads the engine's results here

    def test_families(self):
        """--family llama and gpt-neox: both sides on the family's model, and
        the PyTorch side's functional loss (elementary ops, for functorch) is
        the published model's: float64, 1e-12 relative (the same sums in
        another order)."""
        sys.path.insert(0, os.path.join(gnhtest.ROOT, "perf"))
        import bench_torch
        import gnh_families
        import side_by_side
        import torch
        bench = os.environ["GNH_BENCH"]
        for family in ("llama", "gpt-neox"):
            with self.subTest(family=family):
                cfg = side_by_side.family_config(family, "tiny")
                model = gnh_families.init_random(gnh_families.CausalLM(cfg).double(), 5, 0.3)
                idx = torch.randint(0, cfg.vocab_size, (2, 16), generator=torch.Generator().manual_seed(1))
                tgt = idx.roll(-1, dims=1)
                named = gnh_families.canonical_named(model)
                want = torch.nn.functional.cross_entropy(model(idx).reshape(-1, cfg.vocab_size), tgt.reshape(-1),
                                                         reduction="sum")
                got = bench_torch.family_loss_sum(list(named.values()), list(named), cfg, idx, tgt)
                self.assertLessEqual(abs(float(got) - float(want)), 1e-12 * abs(float(want)))
                with tempfile.TemporaryDirectory(prefix="gnh-sbs-") as d:
                    out = os.path.join(d, "tiny.json")
                    r = subprocess.run([sys.executable, os.path.join(gnhtest.ROOT, "perf", "side_by_side.py"),
                                        "--preset", "tiny", "--family", family, "--repeats", "1", "--rounds", "1",
                                        "--torch-setting", "as-is", "--bench", bench, "--json", out],
                                       capture_output=True, text=True)
                    self.assertEqual(r.returncode, 0, r.stderr)
                    with open(out) as f:
                        res = json.load(f)
                self.assertEqual(res["family"], family)
                self.assertEqual(res["gnh"]["context"]["n_params"], res["torch"]["context"]["n_params"])
                self.assertIn("functorch-forward-over-reverse_K16_vs_best", res["ratios"])


if __name__ == "__main__":
    unittest.main()
