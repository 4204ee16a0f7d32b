#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
"""The derivative engine on the Llama and GPT-NeoX families (SPEC section 11)
against float64 PyTorch models written from the published definitions
(apps/python/gnh_families.py), on Hugging Face checkpoint directories that go
through the real converter: loss, G, a noise batch's gradient, the quadratic
forms of G, xi and Rademacher directions by every curvature path (forward-
over-reverse, the second-order forward), and the Gauss-Newton products and
forms, as test_derivative_oracle.py checks nanoGPT.

The configurations are awkward on purpose: an odd vocabulary, one key/value
head and n_head/2 of them, head_dim other than hidden_size/n_head, rotary_pct
0.25 (2 of 8 dims rotated), tied and untied heads, with and without biases,
parallel and sequential residuals, gelu and gelu_new; and `gnh run` under
bf16-amp on the same configurations, within 5% of fp32.

Bars, and their reasons, as in test_derivative_oracle.py: 1e-10 relative in
double (rounding of a few thousand terms), 1e-4 in float (float roundoff
amplified by the curvature's depth and cancellation); relative to the
quantity or to the sum of absolute per-batch contributions where it nearly
cancels."""
import os
import shutil
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.realpath(__file__)), "..", "integration"))
sys.path.insert(0, os.path.dirname(os.path.realpath(__file__)))
import gnhtest  # noqa: E402
import h5py  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from stats_reference import rademacher  # noqa: E402
import test_derivative_oracle as nanogpt_oracle  # noqa: E402

import gnh_families  # noqa: E402
import gnh_hf  # noqa: E402
from gnh_layout import HFConfig  # noqa: E402


class FamilyReference(nanogpt_oracle.Reference):
    """Reference's sums on a family model loaded from the converted file."""

    def __init__(self, h5path, ids, context):
        cfg, state = gnh_families.load_h5(h5path)
        self.model = gnh_families.CausalLM(cfg).double()
        gnh_families.load_state(self.model, {k: v.double() for k, v in state.items()})
        self.params = gnh_families.canonical_params(self.model)
        self.ids = torch.from_numpy(ids.astype(np.int64))
        self.T = context
        self.n = (len(ids) - 1) // context


def llama(**kw):
    base = dict(family="llama", vocab_size=23, hidden_size=16, intermediate_size=10, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=16, norm_eps=1e-5,
                rope_theta=10.0, hidden_act="silu")
    base.update(kw)
    return HFConfig(**base)


def neox(**kw):
    base = dict(family="gpt-neox", vocab_size=23, hidden_size=16, intermediate_size=20, num_hidden_layers=2,
                num_attention_heads=2, max_position_embeddings=16, norm_eps=1e-5, rope_theta=10.0,
                rotary_pct=0.25, use_parallel_residual=True, hidden_act="gelu", qkv_bias=True)
    base.update(kw)
    return HFConfig(**base)


CASES = {
    # n_head/2 key/value heads, tied, no biases.
    "llama-gqa-tied": llama(tie_word_embeddings=True),
    # One key/value head, head_dim 6 (not 16/4), untied, Qwen2's q/k/v biases.
    "llama-mqa-hd6-qkvbias": llama(num_key_value_heads=1, head_dim=6, qkv_bias=True),
    # Llama's attention_bias (q, k, v and o), multi-head.
    "llama-mha-bias": llama(num_key_value_heads=4, qkv_bias=True, o_bias=True, tie_word_embeddings=True),
    # Pythia's shape: parallel residual, rotary_pct 0.25 of 8 dims, biases, untied.
    "neox-parallel": neox(),
    # Sequential residual, gelu_new, no attention biases, tied, full rotation.
    "neox-sequential": neox(use_parallel_residual=False, hidden_act="gelu_new", qkv_bias=False,
                            tie_word_embeddings=True, rotary_pct=1.0),
}


def random_state(cfg, seed, scale=0.4):
    model = gnh_families.init_random(gnh_families.CausalLM(cfg).double(), seed, scale)
    return {n: p.numpy().astype(np.float32) for n, p in gnh_families.canonical_state(model).items()}


class FamilyOracle(unittest.TestCase):
    setUpClass = classmethod(nanogpt_oracle.DerivativeOracle.setUpClass.__func__)
    tearDownClass = classmethod(nanogpt_oracle.DerivativeOracle.tearDownClass.__func__)
    run_probe = nanogpt_oracle.DerivativeOracle.run_probe
    check_gauss_newton = nanogpt_oracle.DerivativeOracle.check_gauss_newton

    def test_families(self):
        context, K, seed = 7, 2, 1234
        noise = [4, 1, 6]
        for i, (name, cfg) in enumerate(CASES.items()):
            d = os.path.join(self.tmp, name)
            hf = os.path.join(d, "hf")
            gnh_hf.save_dir(hf, cfg, random_state(cfg, 300 + i))
            h5 = os.path.join(d, "model.h5")
            gnhtest.gnh_convert.convert(hf, h5, gnhtest.gnh_convert.default_options())
            ids = gnhtest.write_tokens(os.path.join(d, "tokens.bin"), context * 9 + 3, cfg.vocab_size, 50 + i)
            ref = FamilyReference(h5, ids, context)
            loss, G = ref.gradient(list(range(ref.n)))
            _, gB = ref.gradient(noise)
            xi = gB - G
            vs = [G, xi] + [torch.from_numpy(rademacher(seed, k, G.numel())) for k in range(K)]
            quads, abs_sums = ref.quad_forms(vs)
            ggn, ggn_fd = ref.ggn_products(vs)
            for policy, rel in (("fp64", 1e-10), ("fp32", 1e-4)):
                got = self.run_probe(h5, os.path.join(d, "tokens.bin"), context, policy, K, seed, noise,
                                     os.path.join(d, f"probe_{policy}.h5"))
                with self.subTest(case=name, policy=policy):
                    self.assertLessEqual(abs(got["loss"] - loss), rel * loss)
                    self.assertLessEqual(np.linalg.norm(got["G"] - G.numpy()), rel * np.linalg.norm(G.numpy()))
                    self.assertLessEqual(np.linalg.norm(got["gB"] - gB.numpy()), rel * np.linalg.norm(gB.numpy()))
                    for tag in ("for", "sof", "sof_cut"):
                        for k in range(len(vs)):
                            scale = max(abs(quads[k]), abs_sums[k])
                            self.assertLessEqual(abs(got["quad_" + tag][k] - quads[k]), rel * scale,
                                                 (tag, k, got["quad_" + tag][k], quads[k]))
                    self.check_gauss_newton(got, ggn, ggn_fd, vs, rel)

    def test_bf16_amp_within_five_percent_of_fp32(self):
        # `gnh run` under bf16-amp against fp32 on the same awkward files:
        # bfloat16 operands carry 8 bits (2^-8 relative a product), so the
        # loss and |G|^2 stay within the policy's 5% (doc/precision.md).
        context = 7
        for i, (name, cfg) in enumerate(CASES.items()):
            d = os.path.join(self.tmp, "bf16-" + name)
            gnh_hf.save_dir(os.path.join(d, "hf"), cfg, random_state(cfg, 400 + i))
            h5 = os.path.join(d, "model.h5")
            gnhtest.gnh_convert.convert(os.path.join(d, "hf"), h5, gnhtest.gnh_convert.default_options())
            gnhtest.write_tokens(os.path.join(d, "tokens.bin"), context * 9 + 3, cfg.vocab_size, 70 + i)
            deck = os.path.join(d, "deck.toml")
            gnhtest.write_deck(deck, "out/r.h5", [h5], context, "tokens.bin",
                               analysis=dict(noise_samples=2, noise_batch=3, directions=2, directions_per_pass=5))
            got = {}
            for policy in ("fp32", "bf16-amp"):
                r = gnhtest.run_gnh(deck, 1, [f"precision.policy={policy}"])
                self.assertEqual(r.returncode, 0, r.stderr + r.stdout)
                with h5py.File(os.path.join(d, "out", "r.h5"), "r") as f:
                    (g,) = f["groups"].values()
                    got[policy] = {k: float(g["seen"].attrs[k]) for k in ("loss", "G_sqnorm")}
            with self.subTest(case=name):
                for k in ("loss", "G_sqnorm"):
                    self.assertLessEqual(abs(got["bf16-amp"][k] - got["fp32"][k]), 5e-2 * abs(got["fp32"][k]), k)
                # And not the same numbers: the policy reached the engine.
                self.assertNotEqual(got["bf16-amp"]["G_sqnorm"], got["fp32"]["G_sqnorm"])


if __name__ == "__main__":
    unittest.main()
