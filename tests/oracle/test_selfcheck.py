#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
"""The device self-check (doc/operations.md): the values shipped in
jobscripts/selfcheck/ are PyTorch's float64 values of the shipped models (one
of each family) and tokens (recomputed here, 1e-12 relative: the same double-backward sums);
`gnh self-check` passes in every precision and curvature method, on one rank
and two; a copy of the installed tree whose stored loss is off by 0.1% fails
it with a message naming the value, the rank and the host, and `gnh run
--self-check` then stops before computing anything."""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.realpath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "integration"))
sys.path.insert(0, HERE)
import gnhtest  # noqa: E402
import make_selfcheck  # noqa: E402

SHIPPED = os.path.join(gnhtest.ROOT, "jobscripts", "selfcheck")
BUILD = os.path.dirname(os.path.dirname(os.path.realpath(gnhtest.GNH)))


class SelfCheck(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="gnh-selfcheck-")

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def run_gnh(self, gnh, args, np_=1):
        return subprocess.run([gnhtest.MPIEXEC, "-np", str(np_), gnh, *args], capture_output=True, text=True,
                              env=gnhtest.mpi_env(), timeout=300)

    def test_shipped_values_are_the_oracles(self):
        with open(os.path.join(SHIPPED, "reference.json")) as f:
            shipped = json.load(f)
        self.assertEqual([(m["file"], m["family"]) for m in shipped["models"]],
                         [("model.h5", "nanogpt"), ("llama.h5", "llama"), ("gpt-neox.h5", "gpt-neox")])
        for m in shipped["models"]:
            fresh = make_selfcheck.reference(SHIPPED, m["file"])
            for key in ("loss", "G_sqnorm", "GHG", "GHG_scale"):
                self.assertAlmostEqual(m[key], fresh[key], delta=1e-12 * abs(fresh[key]), msg=(m["file"], key))
            for key in ("vHv", "vHv_scale"):
                for a, b in zip(m[key], fresh[key]):
                    self.assertAlmostEqual(a, b, delta=1e-12 * abs(b), msg=(m["file"], key))

    def test_passes_in_every_precision_and_method(self):
        for precision in ("fp64", "fp32", "tf32", "bf16-amp"):
            for method in ("second-order-forward", "forward-over-reverse"):
                with self.subTest(precision=precision, method=method):
                    r = self.run_gnh(gnhtest.GNH, ["self-check", "--precision", precision, "--curvature-method",
                                                   method])
                    self.assertEqual(r.returncode, 0, r.stderr)
                    self.assertIn("self-check passed on 1 rank(s)", r.stdout)
        r = self.run_gnh(gnhtest.GNH, ["self-check"], np_=2)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("self-check passed on 2 rank(s)", r.stdout)

    def test_a_wrong_value_fails_before_any_analysis(self):
        tree = os.path.join(self.tmp, "tree")
        subprocess.run(["cmake", "--install", BUILD, "--prefix", tree], check=True, capture_output=True)
        ref = os.path.join(tree, "share", "gnh", "jobscripts", "selfcheck", "reference.json")
        with open(ref) as f:
            doc = json.load(f)
        doc["models"][1]["loss"] *= 1.001  # the llama model's
        with open(ref, "w") as f:
            json.dump(doc, f)
        gnh = os.path.join(tree, "bin", "gnh")
        r = self.run_gnh(gnh, ["self-check", "--precision", "fp32"])
        self.assertNotEqual(r.returncode, 0)
        self.assertNotIn("Traceback", r.stderr)
        for part in ("self-check failed on rank 0", "host ", "llama.h5", "loss ", "(relative 9.99e-04 > 1e-04)"):
            self.assertIn(part, r.stderr)
        self.assertNotIn("|G|^2", r.stderr)
        # gnh run --self-check stops before computing: no group file.
        work = os.path.join(self.tmp, "work")
        os.makedirs(work)
        cfg = gnhtest.gnh_model.GPTConfig(n_layer=1, n_head=2, n_embd=8, block_size=8, vocab_size=17, bias=False,
                                          tie_embeddings=True, gelu="erf")
        gnhtest.save_checkpoint(gnhtest.make_model(cfg, seed=1), work, "c")
        gnhtest.write_tokens(os.path.join(work, "t.bin"), 8 * 10 + 1, 17, 1)
        deck = os.path.join(work, "d.toml")
        gnhtest.write_deck(deck, "out/r.h5", ["c.h5"], 8, "t.bin")
        r = self.run_gnh(gnh, ["run", deck, "--quiet", "--self-check"])
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("no analysis was started", r.stderr)
        groups = os.path.join(work, "out", "r.groups")
        self.assertFalse(os.path.isdir(groups) and any(f.endswith(".h5") for f in os.listdir(groups)))
        r = self.run_gnh(gnhtest.GNH, ["run", deck, "--quiet", "--self-check"])
        self.assertEqual(r.returncode, 0, r.stderr)


if __name__ == "__main__":
    unittest.main(verbosity=2)
