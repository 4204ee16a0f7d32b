#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
"""The whole-model epoch loss of `gnh run` against PyTorch (Debian's torch) on
generated checkpoints covering every model option: bias on/off, tied/untied
head, GELU erf/tanh, 3 heads, a context that is not a power of two, a padded
last microbatch, two LayerNorm eps.

Bars: relative error <= 1e-5 in float (fp32 policy), <= 1e-12 in double
(fp64 policy), against PyTorch evaluated in float64. They allow about 170
units of float roundoff (6e-8) and 9000 of double (1.1e-16), for a loss made
of dot products at most 4C = 48 long, two LayerNorms a layer, a 41-way
log-sum-exp per token and the epoch's sum, each side in its own order; a
wrong term moves the loss by far more."""
import itertools
import os
import shutil
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.realpath(__file__)), "..", "integration"))
import gnhtest  # noqa: E402
import torch  # noqa: E402


class LossOracle(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="gnh-oracle-")

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def test_every_model_option(self):
        context, vocab = 13, 41
        for i, (bias, tied, gelu) in enumerate(itertools.product((True, False), (True, False),
                                                                  ("erf", "tanh"))):
            cfg = gnhtest.gnh_model.GPTConfig(n_layer=2, n_head=3, n_embd=12, block_size=16,
                                              vocab_size=vocab, bias=bias, tie_embeddings=tied,
                                              gelu=gelu, ln_eps=1e-5 if i % 2 else 1e-6)
            d = os.path.join(self.tmp, f"case{i}")
            os.makedirs(d)
            model = gnhtest.make_model(cfg, seed=100 + i, scale=0.4)
            gnhtest.save_checkpoint(model, d, "model")
            ids = gnhtest.write_tokens(os.path.join(d, "tokens.bin"), context * 9 + 5, vocab, i)
            gnhtest.write_deck(os.path.join(d, "deck.toml"), "out.h5", ["model.h5"], context,
                               "tokens.bin", analysis=dict(grad_microbatch=4))
            want, tokens = gnhtest.gnh_model.epoch_loss(model, ids, context, 16, torch.float64)
            for policy, rel in (("fp32", 1e-5), ("fp64", 1e-12)):
                with self.subTest(bias=bias, tied=tied, gelu=gelu, policy=policy):
                    r = gnhtest.run_gnh(os.path.join(d, "deck.toml"), 1, [f"precision.policy={policy}"])
                    self.assertEqual(r.returncode, 0, r.stderr)
                    got, got_tokens = gnhtest.read_results(os.path.join(d, "out.h5"))["model.h5"]["seen"]
                    self.assertEqual(got_tokens, tokens)
                    self.assertLessEqual(abs(got - want), rel * abs(want), (got, want))


if __name__ == "__main__":
    unittest.main()
