#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
"""The derivative engine against PyTorch (Debian's torch 1.13, double backward)
on generated checkpoints covering every model option and a context that is not
a power of two: loss, G, G^T H G, xi^T H xi (xi = g_B - G for one noise batch)
and v^T H v for Rademacher v from SPEC §4's generator, by both curvature paths
(the second-order forward with and without adjoint cuts); and the Gauss-Newton
part GGN = J^T H_z J (J the Jacobian of the logits, H_z = diag(p) - p p^T per
token): its products GGN v by forward-over-reverse and its forms v^T GGN v by
every path, against PyTorch's GGN built from its definition (J v by autograd,
H_z applied per token, then J^T), which is itself checked against J v by
float64 central differences of the logits.

Bars: 1e-10 relative in double, 1e-4 in float; relative to the quantity, or
to the sum of absolute per-batch contributions where the quantity nearly
cancels (a Rademacher v^T H v can). Both sides sum the same second
derivatives in different orders: in double the difference is rounding,
eps (1.1e-16) times the few thousand terms of a parameter-length dot product
and the depth of the network, far below 1e-10; in float the 6e-8 roundoff
of the parameters and activations is amplified by the curvature's depth and
cancellation, and 1e-4 (some 1700 units of roundoff) bounds it. A wrong
term is an O(1) relative error either way."""
import itertools
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.realpath(__file__)), "..", "integration"))
sys.path.insert(0, os.path.dirname(os.path.realpath(__file__)))
import gnhtest  # noqa: E402
import h5py  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from stats_reference import rademacher  # noqa: E402  (SPEC §4, one implementation for the oracles)

PROBE = os.environ.get("GNH_ENGINE_PROBE", os.path.join(gnhtest.ROOT, "build", "bin", "engine_probe"))
class Reference:
    """Double-precision PyTorch: mean loss, gradients and per-batch H v."""

    def __init__(self, h5path, ids, context):
        cfg, state = gnhtest.gnh_model.load_gnh_h5(h5path)
        self.model = gnhtest.gnh_model.GPT(cfg).double()
        gnhtest.gnh_model.load_canonical_state(self.model, {k: v.double() for k, v in state.items()})
        self.params = list(gnhtest.gnh_model.canonical_state_dict(self.model).values())
        self.ids = torch.from_numpy(ids.astype(np.int64))
        self.T = context
        self.n = (len(ids) - 1) // context

    def batches(self, blocks, size):
        for i in range(0, len(blocks), size):
            b = torch.tensor(blocks[i:i + size])
            idx = torch.stack([self.ids[j * self.T:(j + 1) * self.T] for j in b])
            tgt = torch.stack([self.ids[j * self.T + 1:(j + 1) * self.T + 1] for j in b])
            yield idx, tgt

    def loss_sum(self, idx, tgt):
        logits = self.model(idx)
        return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), tgt.reshape(-1),
                                                 reduction="sum")

    def flat(self, ts):
        return torch.cat([t.reshape(-1) for t in ts])

    def gradient(self, blocks):
        g = None
        count = 0
        total = 0.0
        for idx, tgt in self.batches(blocks, 4):
            ls = self.loss_sum(idx, tgt)
            gi = self.flat(torch.autograd.grad(ls, self.params))
            g = gi if g is None else g + gi
            count += tgt.numel()
            total += float(ls)
        return total / count, g / count

    def quad_forms(self, vs):
        """v^T H v of the epoch-mean loss and the per-batch absolute sum."""
        quads = np.zeros(len(vs))
        abs_sum = np.zeros(len(vs))
        count = 0
        for idx, tgt in self.batches(list(range(self.n)), 4):
            ls = self.loss_sum(idx, tgt)
            g = self.flat(torch.autograd.grad(ls, self.params, create_graph=True))
            count += tgt.numel()
            for k, v in enumerate(vs):
                hv = self.flat(torch.autograd.grad(g @ v, self.params, retain_graph=True))
                q = float(v @ hv)
                quads[k] += q
                abs_sum[k] += abs(q)
        return quads / count, abs_sum / count

    def logits_jvp(self, idx, v):
        """The logits and J v (double backward: J v = d/du (J^T u . v))."""
        logits = self.model(idx)
        u = torch.zeros_like(logits, requires_grad=True)
        jtu = self.flat(torch.autograd.grad(logits, self.params, u, create_graph=True))
        jv = torch.autograd.grad(jtu @ v, u)[0]
        return logits, jv

    def logits_at(self, idx, v, h):
        """The logits at params + h v (for central differences of J v)."""
        with torch.no_grad():
            off = 0
            for p in self.params:
                p.add_(h * v[off:off + p.numel()].view_as(p))
                off += p.numel()
            z = self.model(idx).detach()
            off = 0
            for p in self.params:
                p.sub_(h * v[off:off + p.numel()].view_as(p))
                off += p.numel()
        return z

    def ggn_products(self, vs, h=1e-5):
        """GGN v of the epoch-mean loss for each v, by autograd's J v, and by J v
        from central differences of the logits (a step of length h): both then H_z per
        token and J^T by autograd."""
        out = [torch.zeros_like(v) for v in vs]
        out_fd = [torch.zeros_like(v) for v in vs]
        count = 0
        for idx, tgt in self.batches(list(range(self.n)), 4):
            count += tgt.numel()
            for k, v in enumerate(vs):
                # The differences first: they move the parameters in place,
                # which the graph of the autograd products must not see.
                # A step of length h along v whatever its norm (a Rademacher
                # v has norm sqrt(P)).
                t = h / float(v.norm())
                jv_fd = (self.logits_at(idx, v, t) - self.logits_at(idx, v, -t)) / (2 * t)
                logits, jv = self.logits_jvp(idx, v)
                p = torch.softmax(logits.detach(), dim=-1)
                for acc, j in ((out[k], jv), (out_fd[k], jv_fd)):
                    hz = p * j - p * (p * j).sum(-1, keepdim=True)
                    acc += self.flat(torch.autograd.grad(logits, self.params, hz, retain_graph=True))
        return [o / count for o in out], [o / count for o in out_fd]


class DerivativeOracle(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="gnh-doracle-")

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def run_probe(self, ckpt, tokens, context, policy, K, seed, noise, out):
        cmd = [PROBE, ckpt, tokens, str(context), policy, "3", "2", str(K), str(seed),
               ",".join(map(str, noise)), out]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        self.assertEqual(r.returncode, 0, r.stderr)
        with h5py.File(out, "r") as f:
            return {k: (f[k][()] if k in f else f.attrs[k]) for k in list(f.keys()) + list(f.attrs.keys())}

    def test_every_model_option(self):
        context, vocab, K, seed = 7, 23, 2, 1234
        noise = [4, 1, 6]
        for i, (bias, tied, gelu) in enumerate(itertools.product((True, False), (True, False), ("erf", "tanh"))):
            cfg = gnhtest.gnh_model.GPTConfig(n_layer=2, n_head=3, n_embd=12, block_size=8, vocab_size=vocab,
                                              bias=bias, tie_embeddings=tied, gelu=gelu)
            d = os.path.join(self.tmp, f"case{i}")
            os.makedirs(d)
            h5 = gnhtest.save_checkpoint(gnhtest.make_model(cfg, seed=200 + i, scale=0.4), d, "model")
            ids = gnhtest.write_tokens(os.path.join(d, "tokens.bin"), context * 9 + 3, vocab, 50 + i)
            ref = Reference(h5, ids, context)
            loss, G = ref.gradient(list(range(ref.n)))
            _, gB = ref.gradient(noise)
            xi = gB - G
            P = G.numel()
            vs = [G, xi] + [torch.from_numpy(rademacher(seed, k, P)) for k in range(K)]
            quads, abs_sums = ref.quad_forms(vs)
            ggn, ggn_fd = ref.ggn_products(vs)
            for policy, rel in (("fp64", 1e-10), ("fp32", 1e-4)):
                got = self.run_probe(h5, os.path.join(d, "tokens.bin"), context, policy, K, seed, noise,
                                     os.path.join(d, f"probe_{policy}.h5"))
                with self.subTest(bias=bias, tied=tied, gelu=gelu, policy=policy):
                    self.assertLessEqual(abs(got["loss"] - loss), rel * loss)
                    Gn = G.numpy()
                    self.assertLessEqual(np.linalg.norm(got["G"] - Gn), rel * np.linalg.norm(Gn))
                    self.assertLessEqual(np.linalg.norm(got["gB"] - gB.numpy()), rel * np.linalg.norm(gB.numpy()))
                    for tag in ("for", "sof", "sof_cut"):
                        for k, name in enumerate(["GHG", "xiHxi"] + [f"vHv[{j}]" for j in range(K)]):
                            scale = max(abs(quads[k]), abs_sums[k])
                            self.assertLessEqual(abs(got["quad_" + tag][k] - quads[k]), rel * scale,
                                                 (tag, name, got["quad_" + tag][k], quads[k]))
                    self.check_gauss_newton(got, ggn, ggn_fd, vs, rel)

    def check_gauss_newton(self, got, ggn, ggn_fd, vs, rel):
        """GGN v and v^T GGN v against the reference. GGN is positive
        semi-definite: each form is a sum of per-token variances, so it is
        compared relative to itself (no cancellation)."""
        for k, v in enumerate(vs):
            ref = ggn[k].numpy()
            # The reference's J v by autograd against central differences: the
            # difference is the step's truncation, h^2 times the third
            # derivative (~1e-10 relative), and rounding eps/h (~1e-11); 1e-7
            # leaves a thousandfold margin.
            self.assertLessEqual(np.linalg.norm(ggn_fd[k].numpy() - ref), 1e-7 * np.linalg.norm(ref), k)
            self.assertLessEqual(np.linalg.norm(got["ggnv"][k] - ref), rel * np.linalg.norm(ref), k)
            form = float(v @ ggn[k])
            self.assertGreaterEqual(form, 0.0)
            for tag in ("for", "sof", "sof_cut"):
                self.assertLessEqual(abs(got["ggn_" + tag][k] - form), rel * form,
                                     (tag, k, got["ggn_" + tag][k], form))
            self.assertLessEqual(abs(got["quad_for_ggn"][k] - form), rel * form, (k, got["quad_for_ggn"][k], form))


if __name__ == "__main__":
    unittest.main()
