#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
"""`gnh run` end to end: grouping of identical states, 1 vs 2 ranks, and the
one-line errors for bad input (exit status non-zero on every rank)."""
import os
import shutil
import tempfile
import unittest

import gnhtest
import numpy as np
import torch


class Campaign:
    """Three distinct states plus an alias of the last, one shared config."""

    def __init__(self, root):
        self.root = root
        self.cfg = gnhtest.gnh_model.GPTConfig(n_layer=2, n_head=3, n_embd=12, block_size=16,
                                               vocab_size=37, bias=True, tie_embeddings=True)
        os.makedirs(os.path.join(root, "ckpt"))
        self.models = {}
        for i, stem in enumerate(["ckpt_1", "ckpt_2", "ckpt_3"]):
            m = gnhtest.make_model(self.cfg, seed=10 + i)
            self.models[stem] = m
            gnhtest.save_checkpoint(m, os.path.join(root, "ckpt"), stem, iter_num=100 * (i + 1))
        shutil.copy(os.path.join(root, "ckpt", "ckpt_3.h5"), os.path.join(root, "ckpt", "final.h5"))
        self.models["final"] = self.models["ckpt_3"]
        # 11 blocks of 13 + 3 leftover ids: a padded last microbatch at grad_microbatch 4.
        self.train = gnhtest.write_tokens(os.path.join(root, "train.bin"), 13 * 11 + 4, 37, 1)
        self.val = gnhtest.write_tokens(os.path.join(root, "val.bin"), 13 * 5 + 1, 37, 2)
        self.deck = os.path.join(root, "deck.toml")
        gnhtest.write_deck(self.deck, "out/results.h5", ["ckpt/*.h5"], 13, "train.bin", "val.bin",
                           analysis=dict(grad_microbatch=4))

    def reference(self, stem, case, dtype):
        ids = self.train if case == "seen" else self.val
        return gnhtest.gnh_model.epoch_loss(self.models[stem], ids, 13, 8, dtype)


class RunTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="gnh-run-")
        cls.c = Campaign(cls.tmp)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def run_ok(self, np_, sets=()):
        r = gnhtest.run_gnh(self.c.deck, np_, sets)
        self.assertEqual(r.returncode, 0, r.stderr + r.stdout)
        return gnhtest.read_results(os.path.join(self.tmp, "out", "results.h5"))

    def test_one_and_two_ranks_agree_and_match_pytorch(self):
        for policy, dtype, rel in (("fp32", torch.float32, 1e-5), ("fp64", torch.float64, 1e-12)):
            with self.subTest(policy=policy):
                one = self.run_ok(1, [f"precision.policy={policy}"])
                two = self.run_ok(2, [f"precision.policy={policy}"])
                self.assertEqual(sorted(one), ["ckpt_1.h5", "ckpt_2.h5", "ckpt_3.h5", "final.h5"])
                # Bitwise: same batches, same order of sums on every rank count.
                self.assertEqual(one, two)
                self.assertEqual(one["final.h5"]["group"], one["ckpt_3.h5"]["group"])
                self.assertEqual(len({v["group"] for v in one.values()}), 3)
                for alias, cases in one.items():
                    stem = alias[:-3]
                    for case in ("seen", "unseen"):
                        want, tokens = self.c.reference(stem, case, torch.float64)
                        got, got_tokens = cases[case]
                        self.assertEqual(got_tokens, tokens)
                        self.assertLessEqual(abs(got - want), rel * abs(want), (alias, case, got, want))

    def bad(self, np_, deck=None, sets=(), expect=()):
        r = gnhtest.run_gnh(deck or self.c.deck, np_, sets)
        self.assertNotEqual(r.returncode, 0)
        errors = [l for l in r.stderr.splitlines() if l.startswith("gnh: error:")]
        self.assertEqual(len(errors), 1, r.stderr)
        for e in expect:
            self.assertIn(e, errors[0])
        self.assertNotIn("Traceback", r.stderr)
        self.assertNotIn("MPI_ABORT", r.stderr)
        self.assertNotIn("internal error", r.stderr)
        return errors[0]

    def test_misspelled_key(self):
        deck = os.path.join(self.tmp, "typo.toml")
        with open(self.c.deck) as f:
            text = f.read()
        with open(deck, "w") as f:
            f.write(text.replace("grad_microbatch", "grad_microbach"))
        for np_ in (1, 2):
            msg = self.bad(np_, deck, expect=("typo.toml:", "analysis.grad_microbach",
                                              "did you mean 'grad_microbatch'"))
            self.assertRegex(msg, r"typo\.toml:\d+:")

    def test_bad_override(self):
        self.bad(2, sets=["analysis.directions=many"], expect=("--set analysis.directions=many",
                                                               "must be an integer"))

    def test_missing_checkpoint_and_data(self):
        self.bad(2, sets=['checkpoints.paths=["ckpt/nope.h5"]'], expect=("nope.h5", "does not exist"))
        self.bad(2, sets=['data.seen.path="missing.bin"'], expect=("missing.bin", "cannot open"))

    def test_token_out_of_vocab(self):
        ids = self.c.val.copy()
        ids[17] = 40
        path = os.path.join(self.tmp, "bad_tokens.bin")
        ids.tofile(path)
        self.bad(2, sets=[f'data.unseen.path="{path}"'],
                 expect=("bad_tokens.bin", "token id 40 at offset 17", "vocab_size 37"))

    def test_truncated_checkpoint(self):
        d = os.path.join(self.tmp, "trunc")
        os.makedirs(d, exist_ok=True)
        src = os.path.join(self.tmp, "ckpt", "ckpt_2.h5")
        with open(src, "rb") as f:
            data = f.read()
        with open(os.path.join(d, "ckpt_2.h5"), "wb") as f:
            f.write(data[: len(data) // 2])
        shutil.copy(os.path.join(self.tmp, "ckpt", "ckpt_1.h5"), d)
        # The truncated file is read by rank 1; every rank still exits non-zero.
        self.bad(2, sets=['checkpoints.paths=["trunc/*.h5"]'], expect=("ckpt_2.h5",))

    def test_inconsistent_configs(self):
        d = os.path.join(self.tmp, "mixed")
        os.makedirs(d, exist_ok=True)
        other = gnhtest.gnh_model.GPTConfig(n_layer=1, n_head=3, n_embd=12, block_size=16,
                                            vocab_size=37, bias=True, tie_embeddings=True)
        gnhtest.save_checkpoint(gnhtest.make_model(other, 5), d, "small")
        shutil.copy(os.path.join(self.tmp, "ckpt", "ckpt_1.h5"), d)
        self.bad(2, sets=['checkpoints.paths=["mixed/*.h5"]'],
                 expect=("inconsistent model configurations", "n_layer=1"))

    def test_context_too_long_and_short_data(self):
        self.bad(2, sets=["data.context=17"], expect=("data.context = 17", "block_size 16"))
        path = os.path.join(self.tmp, "short.bin")
        np.arange(5, dtype=np.uint16).tofile(path)
        self.bad(2, sets=[f'data.unseen.path="{path}"'], expect=("short.bin", "too few"))


if __name__ == "__main__":
    unittest.main()
