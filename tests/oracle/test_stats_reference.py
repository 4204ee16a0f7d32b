#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
"""Checks of tests/oracle/stats_reference.py itself (no gnh C++ involved).

* splitmix64 against Vigna's published vectors; noise_batches: disjoint,
  sorted, of the right size, capped, reproducible, seed-dependent, equal to
  an independent numpy-uint64 implementation and to a pinned literal;
* G.v, G^T H G, xi^T H xi and v^T H v against float64 central differences of
  the loss and of the gradient, for two model configurations;
* |g|^2 = |G|^2 + 2 G.xi + |xi|^2 per sample; partitioning noise batches
  average to G; the finite-population correction is exact over all subsets;
* the derived quantities from the raw ones; the stacked (vmap) HVPs equal
  one-at-a-time HVPs and do not depend on the HVP batch size; H is symmetric.
"""
import itertools
import math
import os
import shutil
import sys
import tempfile
import unittest

os.environ["OPENBLAS_NUM_THREADS"] = "1"
os.environ["OMP_NUM_THREADS"] = "1"

HERE = os.path.dirname(os.path.realpath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "integration"))
import gnhtest  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

import stats_reference as sr  # noqa: E402

torch.set_num_threads(1)
gm = gnhtest.gnh_model

CONTEXT = 7
VOCAB = 32
N_BLOCKS = 60
SEED = 1234


def numpy_noise_batches(n, B, S, seed):
    """Independent implementation with numpy's wrapping uint64 arithmetic."""
    u = np.uint64

    def mix(x):
        with np.errstate(over="ignore"):
            x = u(x) + u(0x9E3779B97F4A7C15)
            z = (x ^ (x >> u(30))) * u(0xBF58476D1CE4E5B9)
            z = (z ^ (z >> u(27))) * u(0x94D049BB133111EB)
            return z ^ (z >> u(31))

    key = mix(u(seed) ^ u(0x6E6F697365000000))
    perm = np.arange(n)
    for i in range(n - 1, 0, -1):
        j = int(mix(key ^ u(i)) % u(i + 1))
        perm[[i, j]] = perm[[j, i]]
    m = min(S, n // B)
    return [sorted(int(b) for b in perm[j * B:(j + 1) * B]) for j in range(m)]


class NoiseBatches(unittest.TestCase):
    def test_splitmix64_published_vectors(self):
        gamma = 0x9E3779B97F4A7C15
        # Vigna's splitmix64.c streams for seeds 0 and 1234567: output k is
        # splitmix64(seed + k * gamma) with our stateless form.
        for seed, expect in ((0, [0xE220A8397B1DCDAF, 0x6E789E6AA1B965F4, 0x06C45D188009454F]),
                             (1234567, [0x599ED017FB08FC85, 0x2C73F08458540FA5, 0x883EBCE5A3F27C77])):
            got = [sr.splitmix64((seed + k * gamma) & sr.MASK64) for k in range(3)]
            self.assertEqual(got, expect)

    def test_rademacher(self):
        v = sr.rademacher(SEED, 0, 1000)
        self.assertEqual(set(np.unique(v)), {-1.0, 1.0})
        self.assertTrue(np.array_equal(v, sr.rademacher(SEED, 0, 1000)))
        self.assertFalse(np.array_equal(v, sr.rademacher(SEED, 1, 1000)))
        self.assertFalse(np.array_equal(v, sr.rademacher(SEED + 1, 0, 1000)))
        # Element i by the scalar definition.
        key = sr.splitmix64(SEED ^ sr.splitmix64(0))
        for i in (0, 1, 17, 999):
            self.assertEqual(v[i], 1.0 if sr.splitmix64(key ^ i) >> 63 == 0 else -1.0)

    def test_pinned(self):
        self.assertEqual(sr.noise_batches(10, 3, 5, 1234), [[2, 5, 9], [0, 6, 8], [1, 3, 4]])

    def test_properties(self):
        for n, B, S, seed in itertools.product((1, 7, 10, 60, 61), (1, 3, 6, 64), (0, 1, 5, 100),
                                               (0, 1234, (1 << 64) - 1)):
            with self.subTest(n=n, B=B, S=S, seed=seed):
                got = sr.noise_batches(n, B, S, seed)
                self.assertEqual(len(got), min(S, n // B))
                seen = set()
                for b in got:
                    self.assertEqual(len(b), B)
                    self.assertEqual(b, sorted(b))
                    self.assertTrue(all(0 <= i < n for i in b))
                    self.assertFalse(seen & set(b))
                    seen |= set(b)
                self.assertEqual(got, sr.noise_batches(n, B, S, seed))
                self.assertEqual(got, numpy_noise_batches(n, B, S, seed))

    def test_caps_and_seed_dependence(self):
        self.assertEqual(len(sr.noise_batches(10, 3, 5, 1)), 3)
        self.assertEqual(sr.noise_batches(5, 6, 3, 1), [])
        full = sr.noise_batches(12, 1, 100, 9)
        self.assertEqual(sorted(b[0] for b in full), list(range(12)))
        self.assertNotEqual(sr.noise_batches(60, 6, 4, 1), sr.noise_batches(60, 6, 4, 2))
        # A seed is a 64-bit word.
        self.assertEqual(sr.noise_batches(60, 6, 4, -1), sr.noise_batches(60, 6, 4, (1 << 64) - 1))
        with self.assertRaises(ValueError):
            sr.noise_batches(10, 0, 1, 1)


class Statistics(unittest.TestCase):
    CONFIGS = {
        "untied_bias_tanh": dict(bias=True, tie_embeddings=False, gelu="tanh"),
        "tied_nobias_erf": dict(bias=False, tie_embeddings=True, gelu="erf"),
    }

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="gnh-statsref-")
        cls.cases = {}
        for i, (name, opts) in enumerate(cls.CONFIGS.items()):
            cfg = gm.GPTConfig(n_layer=2, n_head=3, n_embd=12, block_size=8, vocab_size=VOCAB, **opts)
            d = os.path.join(cls.tmp, name)
            os.makedirs(d)
            h5 = gnhtest.save_checkpoint(gnhtest.make_model(cfg, seed=300 + i, scale=0.4), d, "model")
            tok = os.path.join(d, "tokens.bin")
            ids = gnhtest.write_tokens(tok, CONTEXT * N_BLOCKS + 3, VOCAB, 70 + i)
            cls.cases[name] = (h5, tok, ids)
        h5, tok, _ = cls.cases["untied_bias_tanh"]
        cls.stats = sr.reference_statistics(h5, tok, CONTEXT, noise_samples=4, noise_batch=6,
                                            directions=3, seed=SEED)
        cls.ref = sr.load_reference(h5, tok, CONTEXT)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def assertClose(self, got, want, rel, scale=None, msg=None):
        scale = abs(want) if scale is None else scale
        self.assertLessEqual(abs(got - want), rel * scale, msg or (got, want))

    # -- bookkeeping ------------------------------------------------------- #
    def test_counts_and_shapes(self):
        s, ref = self.stats, self.ref
        self.assertEqual(s["n_blocks"], N_BLOCKS)
        self.assertEqual(s["tokens"], N_BLOCKS * CONTEXT)
        P = sum(math.prod(sh) for sh in gm.canonical_shapes(ref.model.config).values())
        self.assertEqual(s["P"], P)
        self.assertEqual(s["G"].shape, (P,))
        self.assertEqual(s["noise_blocks"], sr.noise_batches(N_BLOCKS, 6, 4, SEED))
        for k in ("gB_sqnorm", "xi_sqnorm", "G_dot_xi", "xiHxi", "xiHxi_abs"):
            self.assertEqual(s[k].shape, (4,), k)
        self.assertEqual(s["gB"].shape, (4, P))
        for k in ("vHv", "vHv_abs"):
            self.assertEqual(s[k].shape, (3,), k)
        capped = sr.load_reference(*self.cases["untied_bias_tanh"][:2], CONTEXT, max_blocks=13)
        self.assertEqual(capped.n, 13)

    def test_loss_matches_gnh_model_epoch_loss(self):
        h5, tok, ids = self.cases["untied_bias_tanh"]
        loss, count = gm.epoch_loss(self.ref.model, ids, CONTEXT, batch=9, dtype=torch.float64)
        self.assertEqual(count, self.stats["tokens"])
        self.assertClose(self.stats["loss"], loss, 1e-13)

    def test_gradient_is_full_batch_gradient(self):
        ref = self.ref
        idx, tgt = next(ref._chunks(range(ref.n), ref.n))
        g = ref._flat(torch.autograd.grad(ref._loss_sum(idx, tgt) / tgt.numel(), ref.params))
        self.assertLessEqual(np.linalg.norm(self.stats["G"] - g.numpy()), 1e-13 * np.linalg.norm(g.numpy()))
        self.assertClose(self.stats["G_sqnorm"], float(g @ g), 1e-13)

    def test_bad_token_names_file_and_offset(self):
        h5, _, ids = self.cases["untied_bias_tanh"]
        bad = os.path.join(self.tmp, "bad.bin")
        ids = ids.copy()
        ids[40] = VOCAB
        ids.tofile(bad)
        with self.assertRaisesRegex(ValueError, r"bad\.bin.*offset 40"):
            sr.reference_statistics(h5, bad, CONTEXT, 1, 2, 1, SEED)

    # -- finite differences ----------------------------------------------- #
    @staticmethod
    def richardson(f, h):
        """d/dt f(t) at 0 by central differences, Richardson-extrapolated
        (error O(h^4)): f is evaluated at +-h and +-h/2."""
        d1 = (f(h) - f(-h)) / (2 * h)
        d2 = (f(h / 2) - f(-h / 2)) / h
        return (4 * d2 - d1) / 3

    def fd_checks(self, ref, stats, seed, tag):
        theta = ref.flat_params()
        G = torch.from_numpy(stats["G"])
        xi0 = torch.from_numpy(stats["gB"][0]) - G
        v0 = torch.from_numpy(sr.rademacher(seed, 0, ref.P))

        def loss_at(v):
            def f(t):
                ref.set_flat_params(theta + t * v)
                return ref.loss()
            return f

        def grad_dot_at(u):
            def f(t):
                ref.set_flat_params(theta + t * u)
                return float(ref.gradient()[1] @ u)
            return f

        try:
            # G . v by central differences of the loss (v = G and v = v_0).
            for v in (G, v0):
                fd = self.richardson(loss_at(v), 1e-4 / float(v.norm()))
                self.assertClose(fd, float(G @ v), 1e-8, float(G.norm() * v.norm()), (tag, fd, float(G @ v)))
            # u^T H u by central differences of the epoch gradient along u, dotted with u.
            for u, q, a, name in ((G, stats["GHG"], stats["GHG_abs"], "GHG"),
                                  (xi0, stats["xiHxi"][0], stats["xiHxi_abs"][0], "xiHxi"),
                                  (v0, stats["vHv"][0], stats["vHv_abs"][0], "vHv")):
                fd = self.richardson(grad_dot_at(u), 1e-4 / float(u.norm()))
                self.assertClose(fd, q, 1e-7, max(abs(q), a), (tag, name, fd, q))
        finally:
            ref.set_flat_params(theta)

    def test_finite_differences(self):
        self.fd_checks(self.ref, self.stats, SEED, "untied_bias_tanh")
        h5, tok, _ = self.cases["tied_nobias_erf"]
        ref = sr.load_reference(h5, tok, CONTEXT)
        stats = sr.statistics_of(ref, noise_samples=2, noise_batch=5, directions=1, seed=99)
        self.fd_checks(ref, stats, 99, "tied_nobias_erf")

    # -- identities --------------------------------------------------------- #
    def test_norm_identity(self):
        s = self.stats
        rhs = s["G_sqnorm"] + 2 * s["G_dot_xi"] + s["xi_sqnorm"]
        np.testing.assert_allclose(s["gB_sqnorm"], rhs, rtol=1e-12)
        for j, b in enumerate(s["noise_blocks"]):
            g = self.ref.gradient(b)[1].numpy()
            self.assertLessEqual(np.linalg.norm(s["gB"][j] - g), 1e-14 * np.linalg.norm(g))

    def test_partition_mean_is_G(self):
        s = sr.statistics_of(self.ref, noise_samples=100, noise_batch=6, directions=0, seed=7)
        self.assertEqual(len(s["noise_blocks"]), N_BLOCKS // 6)
        self.assertEqual(sorted(itertools.chain(*s["noise_blocks"])), list(range(N_BLOCKS)))
        G = s["G"]
        self.assertLessEqual(np.linalg.norm(s["gB"].mean(0) - G), 1e-13 * np.linalg.norm(G))
        self.assertLessEqual(abs(s["G_dot_xi"].sum()), 1e-12 * s["G_sqnorm"] * len(s["noise_blocks"]))
        self.assertTrue(math.isnan(s["trace_H"]))
        self.assertTrue(math.isnan(s["trace_H_se"]))

    def test_fpc_exact_over_all_subsets(self):
        # B f E|xi|^2 over every B-subset equals the population trace of the
        # per-sequence gradient covariance, with f = (n-1)/(n-B).
        h5, tok, _ = self.cases["untied_bias_tanh"]
        ref = sr.load_reference(h5, tok, CONTEXT, max_blocks=6)
        n, B = ref.n, 2
        per = torch.stack([ref.gradient([b])[1] for b in range(n)])
        G = ref.gradient()[1]
        pop = float(((per - G) ** 2).sum(1).mean())
        xis = [float(((per[list(S)].mean(0) - G) ** 2).sum()) for S in itertools.combinations(range(n), B)]
        d = sr.derived_statistics(n, B, 1.0, 1.0, xis, xis, [])
        self.assertClose(d["trace_sigma"], pop, 1e-12)
        self.assertClose(d["fpc"], (n - 1) / (n - B), 0)

    def test_derived(self):
        s = self.stats
        n, B, m = N_BLOCKS, 6, 4
        f = (n - 1) / (n - B)
        self.assertEqual(s["fpc"], f)
        ts = B * f * np.mean(s["xi_sqnorm"])
        ts_se = B * f * np.std(s["xi_sqnorm"], ddof=1) / math.sqrt(m)
        th = B * f * np.mean(s["xiHxi"])
        th_se = B * f * np.std(s["xiHxi"], ddof=1) / math.sqrt(m)
        want = dict(trace_sigma=ts, trace_sigma_se=ts_se, B_simple=ts / s["G_sqnorm"],
                    B_simple_se=ts_se / s["G_sqnorm"], trace_HSigma=th, trace_HSigma_se=th_se,
                    B_noise=th / s["GHG"], B_noise_se=th_se / abs(s["GHG"]),
                    trace_H=np.mean(s["vHv"]), trace_H_se=np.std(s["vHv"], ddof=1) / math.sqrt(3),
                    GHG_over_G_sqnorm=s["GHG"] / s["G_sqnorm"], eps_star=s["G_sqnorm"] / s["GHG"],
                    B_simple_tokens=ts / s["G_sqnorm"] * CONTEXT, B_noise_tokens=th / s["GHG"] * CONTEXT,
                    B_simple_tokens_se=ts_se / s["G_sqnorm"] * CONTEXT,
                    B_noise_tokens_se=th_se / abs(s["GHG"]) * CONTEXT)
        for k, w in want.items():
            self.assertClose(s[k], float(w), 1e-13, msg=k)
        one = sr.derived_statistics(n, B, 1.0, 1.0, [2.0], [3.0], [4.0])
        for k in ("trace_sigma_se", "trace_HSigma_se", "trace_H_se"):  # one sample: not estimable
            self.assertTrue(math.isnan(one[k]), k)
        self.assertTrue(math.isnan(sr.derived_statistics(6, 6, 1.0, 1.0, [0.0], [0.0], [])["fpc"]))
        none = sr.derived_statistics(5, 6, 1.0, 1.0, [], [], [])
        for k in ("trace_sigma", "B_simple", "trace_HSigma", "B_noise", "trace_H"):
            self.assertTrue(math.isnan(none[k]), k)
            self.assertTrue(math.isnan(none[k + "_se"]), k)

    def test_stacked_hvps(self):
        ref, s = self.ref, self.stats
        G = torch.from_numpy(s["G"])
        xis = torch.from_numpy(s["gB"]) - G
        vs = torch.stack([torch.from_numpy(sr.rademacher(SEED, k, ref.P)) for k in range(3)])
        V = torch.cat([G[None], xis, vs])
        q_loop, a_loop = ref.quad_forms(V, batched=False, hvp_batch=7)
        q = np.concatenate([[s["GHG"]], s["xiHxi"], s["vHv"]])
        a = np.concatenate([[s["GHG_abs"]], s["xiHxi_abs"], s["vHv_abs"]])
        for k in range(len(q)):
            self.assertClose(q_loop[k], q[k], 1e-12, max(abs(q[k]), a[k]), k)
        # Symmetry u^T (H v) = v^T (H u) and q = v^T (H v) by explicit H v.
        Hv = ref.hvp(vs[0])
        Hu = ref.hvp(xis[0], hvp_batch=11)
        self.assertClose(float(xis[0] @ Hv), float(vs[0] @ Hu), 1e-12,
                         float(xis[0].abs() @ Hv.abs() + vs[0].abs() @ Hu.abs()))
        self.assertClose(float(vs[0] @ Hv), s["vHv"][0], 1e-12, max(abs(s["vHv"][0]), s["vHv_abs"][0]))


if __name__ == "__main__":
    unittest.main()
