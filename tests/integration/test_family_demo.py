#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
"""The README's demos of the Llama and GPT-NeoX families, as a user types
them: `apps/gnh-demo-campaign OUT --family F` (three epochs saved in Hugging
Face layout and converted; a second call finds the stamp and does nothing),
then `gnh run` on `inputs/demo-F.toml` (its paths moved to the test's
directory) on two ranks: every state and case
analysed, the loss falling over the epochs, the note that converted Hugging
Face checkpoints carry no AdamW state; then `gnh compare` of bf16-amp
against fp32 on the same deck (64 blocks an epoch): every requested statistic within the 5%
default or reported failing, and G's direction kept."""
import glob
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

import gnhtest
import h5py
import numpy as np

PYTHON = sys.executable if sys.executable.startswith("/usr/bin") else "/usr/bin/python3"
DEMO = os.path.join(gnhtest.ROOT, "apps", "gnh-demo-campaign")


class FamilyDemo(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="gnh-family-demo-")

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def campaign(self, family):
        out = os.path.join(self.tmp, f"demo-{family}")
        for attempt in range(2):
            r = subprocess.run([PYTHON, DEMO, out, "--family", family], capture_output=True, text=True,
                               env=gnhtest.mpi_env(), timeout=600)
            self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("is up to date", r.stdout)
        steps = sorted(os.listdir(os.path.join(out, "hf")), key=lambda s: int(s[4:]))
        self.assertEqual(len(steps), 3)
        for s in steps:
            self.assertEqual(sorted(os.listdir(os.path.join(out, "hf", s))), ["config.json", "model.safetensors"])
        h5s = sorted(os.path.basename(p) for p in glob.glob(os.path.join(out, "h5", "*.h5")))
        self.assertEqual(h5s, sorted(s + ".h5" for s in steps))
        return steps

    def deck(self, family):
        with open(os.path.join(gnhtest.ROOT, "inputs", f"demo-{family}.toml")) as f:
            text = f.read()
        self.assertIn(f"../build/demo-{family}/", text)
        self.assertIn("max_blocks = 256", text)
        text = text.replace(f"../build/demo-{family}/", f"demo-{family}/")
        deck = os.path.join(self.tmp, f"demo-{family}.toml")
        with open(deck, "w") as f:
            f.write(text)
        return deck

    def check_run(self, family, deck, steps):
        r = subprocess.run([gnhtest.MPIEXEC, "-np", "2", gnhtest.GNH, "run", deck, "--quiet", "--set",
                            "curvature.preconditioned=true"], capture_output=True, text=True, timeout=600,
                           env=gnhtest.mpi_env())
        self.assertEqual(r.returncode, 0, r.stderr + r.stdout)
        self.assertIn(f"model family={family}", r.stdout)
        results = os.path.join(self.tmp, f"demo-{family}", "results", f"demo-{family}.h5")
        loss = {}
        with h5py.File(results, "r") as f:
            self.assertEqual(int(f.attrs["identities_ok"]), 1)
            self.assertEqual(len(f["groups"]), 3)
            for g in f["groups"].values():
                for case in g.values():
                    # A statistical check, not an identity: a p-value beside
                    # the campaign-wide threshold, none of identities_ok's business.
                    self.assertNotIn("identity_noise_estimators_deviation", case.attrs)
                    self.assertGreater(case.attrs["consistency_noise_estimators_p_value"], 0.0)
                    self.assertEqual(case.attrs["consistency_noise_estimators_threshold"], 0.01 / 6)
            for g in f["groups"].values():
                alias = gnhtest.text(g.attrs["aliases"][0])
                self.assertIn("none: no AdamW state", gnhtest.text(g.attrs["preconditioner"]))
                self.assertEqual(sorted(g), ["seen", "unseen"])
                for case in g.values():
                    for name in ("loss", "G_sqnorm", "GHG", "B_simple", "B_noise", "trace_H"):
                        self.assertTrue(np.isfinite(case.attrs[name]), (alias, name))
                    self.assertNotIn("B_simple_P", case.attrs)
                loss[alias] = float(g["seen"].attrs["loss"])
        # Three epochs of training lower the loss on the text it trained on.
        order = [loss[s + ".h5"] for s in steps]
        self.assertLess(order[2], order[1])
        self.assertLess(order[1], order[0])

    def check_compare(self, family, deck):
        r = subprocess.run([gnhtest.MPIEXEC, "-np", "2", gnhtest.GNH, "compare", deck, "--policies", "fp32,bf16-amp",
                            "--quiet", "--set", "data.max_blocks=64"], capture_output=True, text=True, timeout=900,
                           env=gnhtest.mpi_env())
        self.assertEqual(r.returncode, 0, r.stderr)
        path = os.path.join(self.tmp, f"demo-{family}", "results", f"demo-{family}.compare.h5")
        gnhtest.check_bf16_compare(self, path, 6)
        print(family, r.stdout[-800:])

    def test_llama(self):
        steps = self.campaign("llama")
        deck = self.deck("llama")
        self.check_run("llama", deck, steps)
        self.check_compare("llama", deck)

    def test_gpt_neox(self):
        steps = self.campaign("gpt-neox")
        deck = self.deck("gpt-neox")
        self.check_run("gpt-neox", deck, steps)
        self.check_compare("gpt-neox", deck)


if __name__ == "__main__":
    unittest.main()
