#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
"""`gnh compare`: the precision comparison (doc/precision.md).
- fp64 against fp32 on a tiny campaign: every requested statistic agrees to
  1e-4 (float's bar), cosines of G and the noise vectors are ~1, the output
  files have their documented content;
- a tolerance below the achievable error is reported as FAIL, not hidden;
- the demo campaign (apps/gnh-demo-campaign): bf16-amp against fp32, every
  requested statistic within 5% (the default tolerance, doc/precision.md) or
  reported failing."""
import csv
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

import gnhtest
import h5py
import numpy as np

REQUESTED = ["loss", "G_sqnorm", "GHG", "trace_sigma", "trace_HSigma", "trace_H", "B_simple", "B_noise"]


def run_compare(deck, np_, policies, tolerance=None, sets=()):
    cmd = [gnhtest.MPIEXEC, "-np", str(np_), gnhtest.GNH, "compare", deck, "--policies", policies, "--quiet"]
    if tolerance is not None:
        cmd += ["--tolerance", str(tolerance)]
    for s in sets:
        cmd += ["--set", s]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=gnhtest.mpi_env())


class Compare(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="gnh-cmp-")
        cfg = gnhtest.gnh_model.GPTConfig(n_layer=2, n_head=2, n_embd=16, block_size=16, vocab_size=37)
        os.makedirs(os.path.join(cls.tmp, "ckpt"))
        for i in range(2):
            gnhtest.save_checkpoint(gnhtest.make_model(cfg, seed=i, scale=0.3), os.path.join(cls.tmp, "ckpt"), f"c{i}")
        gnhtest.write_tokens(os.path.join(cls.tmp, "train.bin"), 10 * 30 + 1, 37, 1)
        gnhtest.write_tokens(os.path.join(cls.tmp, "val.bin"), 10 * 12 + 1, 37, 2)
        cls.deck = os.path.join(cls.tmp, "deck.toml")
        gnhtest.write_deck(cls.deck, "out/run.h5", ["ckpt/*.h5"], 10, "train.bin", "val.bin",
                           analysis=dict(noise_samples=3, noise_batch=4, directions=3, directions_per_pass=7))

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def test_fp64_against_fp32(self):
        r = run_compare(self.deck, 2, "fp64,fp32")
        self.assertEqual(r.returncode, 0, r.stderr)
        with h5py.File(os.path.join(self.tmp, "out", "run.compare.h5"), "r") as f:
            self.assertEqual(f.attrs["format"], "gnh-compare")
            self.assertEqual(f.attrs["reference_policy"], "fp64")
            cases = [g[c] for g in f["groups"].values() for c in g]
            self.assertEqual(len(cases), 4)
            for c in cases:
                for s in REQUESTED:
                    self.assertLessEqual(c.attrs["rel_err_" + s], 1e-4, s)
                    self.assertEqual(c.attrs["sign_agree_" + s], 1.0)
                self.assertGreater(c.attrs["G_cosine"], 1 - 1e-8)
                self.assertTrue(np.all(c["xi_cosine"][()] > 1 - 1e-6))
                self.assertEqual(c["xiHxi_cand_on_ref_xi"].shape, (3,))
                self.assertLessEqual(c.attrs["rel_err_max_xiHxi_cand_on_ref_xi"], 1e-3)
                self.assertEqual(c.attrs["pass"], 1.0)
                self.assertGreater(c.attrs["time_s_ref"], 0)
                self.assertGreater(c.attrs["peak_memory_bytes_cand"], 0)
        with open(os.path.join(self.tmp, "out", "run.compare.csv")) as f:
            rows = list(csv.DictReader(f))
        self.assertEqual(len(rows), 4)
        self.assertEqual({r["checkpoint"] for r in rows}, {"c0.h5", "c1.h5"})

    def test_unachievable_tolerance_is_reported(self):
        r = run_compare(self.deck, 1, "fp32,bf16-amp", tolerance=1e-9)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("FAIL", r.stdout)
        with h5py.File(os.path.join(self.tmp, "out", "run.compare.h5"), "r") as f:
            for g in f["groups"].values():
                for c in g.values():
                    self.assertEqual(c.attrs["pass"], 0.0)
                    self.assertGreater(c.attrs["max_rel_err_requested"], 1e-9)

    def test_bad_policy(self):
        r = run_compare(self.deck, 2, "fp32,fp8")
        self.assertNotEqual(r.returncode, 0)
        self.assertIn('unknown policy "fp8"', r.stderr)

    def test_demo_campaign_bf16_within_five_percent(self):
        demo = os.path.join(self.tmp, "demo")
        subprocess.run([sys.executable if sys.executable.startswith("/usr/bin") else "/usr/bin/python3",
                        os.path.join(gnhtest.ROOT, "apps", "gnh-demo-campaign"), demo],
                       check=True, capture_output=True, env=gnhtest.mpi_env(), timeout=600)
        # A second call finds its stamp and does nothing.
        again = subprocess.run([sys.executable if sys.executable.startswith("/usr/bin") else "/usr/bin/python3",
                                os.path.join(gnhtest.ROOT, "apps", "gnh-demo-campaign"), demo],
                               check=True, capture_output=True, text=True, env=gnhtest.mpi_env(), timeout=600)
        self.assertIn("is up to date", again.stdout)
        deck = os.path.join(demo, "demo.toml")
        with open(os.path.join(gnhtest.ROOT, "inputs", "demo.toml")) as f:
            text = f.read().replace("../build/demo/", "").replace("max_blocks = 256", "max_blocks = 64")
        with open(deck, "w") as f:
            f.write(text)
        r = run_compare(deck, 2, "fp32,bf16-amp")
        self.assertEqual(r.returncode, 0, r.stderr)
        gnhtest.check_bf16_compare(self, os.path.join(demo, "results", "demo.compare.h5"), 6)
        print(r.stdout[-1200:])


if __name__ == "__main__":
    unittest.main()
