#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
"""The elementwise and row ops of SPEC §11's families (RMSNorm, the rotary
embedding, the SwiGLU gate; test_family_oracle.py checks them, and
grouped-query attention, inside the models), each alone in float64 against PyTorch
float64 written from the published definitions: the forward, its tangent and
second-order plane (functorch's nested jvp), the reverse (vjp) and its
tangent (jvp of the vjp), through tests/support/op_probe.

Bar: 1e-11 of the largest magnitude of each compared array. Both sides are
float64 with a handful of operations per element (RMSNorm's mean over at
most 37 channels): their roundings differ by a few 1e-16, and the bar leaves
room for the cancellations of a tangent of a reverse."""
import json
import os
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.realpath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "integration"))
import gnhtest  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from functorch import jvp, vjp  # noqa: E402

PROBE = os.environ.get("GNH_OP_PROBE", os.path.join(gnhtest.ROOT, "build", "bin", "op_probe"))
torch.set_default_dtype(torch.float64)


def rmsnorm(args):
    C, bias = args["C"], args["bias"]

    def f(x, p):
        x = x.view(-1, C)
        y = x * torch.rsqrt((x * x).mean(-1, keepdim=True) + 1e-6) * p[:C]
        return (y + p[C:] if bias else y).reshape(-1)

    return f, C, C, C * (2 if bias else 1)


def rotary(args):
    T, H, D, r, base = args["T"], args["H"], args["D"], args["r"], args["base"]

    def f(x, p):
        x = x.view(-1, H, D)
        t = (torch.arange(x.shape[0]) % T).double()
        inv = 1.0 / (base ** (torch.arange(0, r, 2).double() / r))
        freqs = t[:, None] * inv[None, :]
        emb = torch.cat([freqs, freqs], -1)[:, None, :]
        rot, rest = x[..., :r], x[..., r:]
        half = torch.cat([-rot[..., r // 2:], rot[..., :r // 2]], -1)
        return torch.cat([rot * emb.cos() + half * emb.sin(), rest], -1).reshape(-1)

    return f, H * D, H * D, 0


def swiglu(args):
    Fw = args["F"]

    def f(x, p):
        x = x.view(-1, 2 * Fw)
        return (F.silu(x[:, :Fw]) * x[:, Fw:]).reshape(-1)

    return f, 2 * Fw, Fw, 0


REFERENCES = {"rmsnorm": rmsnorm, "rotary": rotary, "swiglu": swiglu}


class OpOracle(unittest.TestCase):
    def check(self, args, seed):
        f, cin, cout, P = REFERENCES[args["op"]](args)
        N = args["N"]
        g = torch.Generator().manual_seed(seed)
        rand = lambda n, s=1.0: torch.randn(n, generator=g) * s  # noqa: E731
        v = {"x": rand(N * cin, 1.5), "xd": rand(N * cin), "xdd": rand(N * cin), "p": 1.0 + rand(P, 0.3),
             "pd": rand(P), "dy": rand(N * cout), "dyd": rand(N * cout)}
        with tempfile.TemporaryDirectory(prefix="gnh-op-") as d:
            with open(os.path.join(d, "op.json"), "w") as fh:
                json.dump(args, fh)
            for k, t in v.items():
                t.numpy().astype("<f8").tofile(os.path.join(d, k))
            r = subprocess.run([PROBE, d], capture_output=True, text=True, timeout=120)
            self.assertEqual(r.returncode, 0, r.stderr)
            got = {k: np.fromfile(os.path.join(d, k), dtype="<f8")
                   for k in ("y", "yd", "ydd", "dx", "dxd", "g", "gd")}
        x, p = v["x"], v["p"]
        want = {"y": f(x, p)}
        want["yd"] = jvp(f, (x, p), (v["xd"], v["pd"]))[1]

        def along(e):  # x(e) = x + e x' + e^2/2 x'', theta(e) = theta + e theta'
            return f(x + e * v["xd"] + 0.5 * e * e * v["xdd"], p + e * v["pd"])

        zero, one = torch.tensor(0.0), torch.tensor(1.0)
        want["ydd"] = jvp(lambda e: jvp(along, (e,), (one,))[1], (zero,), (one,))[1]

        def reverse(x_, p_, dy_):
            return vjp(f, x_, p_)[1](dy_)

        (want["dx"], want["g"]), (want["dxd"], want["gd"]) = jvp(reverse, (x, p, v["dy"]), (v["xd"], v["pd"], v["dyd"]))
        for k, w in want.items():
            w = w.detach().numpy()
            with self.subTest(op=args["op"], array=k):
                self.assertEqual(got[k].shape, w.shape)
                scale = max(np.abs(w).max(initial=0.0), 1e-300)
                self.assertLessEqual(np.abs(got[k] - w).max(initial=0.0), 1e-11 * scale, (k, args))

    def test_rmsnorm(self):
        for C, bias in ((1, False), (7, True), (37, False)):
            self.check({"op": "rmsnorm", "N": 5, "C": C, "bias": bias}, seed=C)

    def test_rotary_full_partial_and_none(self):
        # llama's whole head, gpt-neox's rotary_pct 0.25 of 8 dims, none; and
        # positions up to 9 at base 10000 and at a small base (large angles).
        for T, H, D, r, base in ((5, 3, 8, 8, 10000.0), (10, 2, 8, 2, 10000.0), (4, 2, 6, 0, 10000.0),
                                 (7, 1, 6, 6, 3.0)):
            self.check({"op": "rotary", "N": 2 * T, "T": T, "H": H, "D": D, "r": r, "base": base}, seed=r + D)

    def test_swiglu(self):
        for Fw in (1, 13):
            self.check({"op": "swiglu", "N": 4, "F": Fw}, seed=Fw)


if __name__ == "__main__":
    unittest.main()
