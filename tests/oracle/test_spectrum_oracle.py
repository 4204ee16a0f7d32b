#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
"""The Hessian spectrum (doc/statistics.md, "The spectrum") end to end: `gnh
run` with Lanczos chains against the float64 PyTorch oracle's dense Hessian of
the same checkpoint and epoch (formed row by row with double backward), on a
model small enough to form it.

Bars, all in the fp64 policy:
- the top five eigenvalues match numpy's dense eigenvalues to 1e-6 relative
  once the chains have converged to the deck's tolerance (1e-10 of the
  operator's norm: a residual r bounds the eigenvalue error by r, so
  1e-10 |H| leaves four orders of margin), for H and for P^1/2 H P^1/2;
- per chain the quadrature identities sum w theta = v^T H v and
  sum w theta^2 = |H v|^2 hold to 1e-10 (double arithmetic on m x m
  matrices), and v^T H v and |H v|^2 of each unit start vector match the dense
  H to 1e-10 (the same sums in two orders);
- the density integrates to one and its first two moments are the chain means
  of v^T H v and |H v|^2 (+ sigma^2 for the second: the Gaussian broadening)
  to 1e-9 relative: the trapezoid rule on Gaussians sampled at sigma / 9 is
  exact to far below that, and the grid's 8-sigma margins lose < 1e-15;
- [landscape] lines and plane against PyTorch's float64 loss at the same
  points (test_landscapes_against_pytorch states its bars);
- on a model of over two chunks of the chains' dot products (3 chunks), 1, 2
  and 3 ranks give bitwise-identical files (landscapes and the
  variance-reduced traces included), and a run SIGKILLed between
  Lanczos steps, rerun, resumes after its last saved step and writes the
  same file as an uninterrupted run."""
import csv
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest

import torch

HERE = os.path.dirname(os.path.realpath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "integration"))
sys.path.insert(0, HERE)
import gnhtest  # noqa: E402
import h5py  # noqa: E402
import numpy as np  # noqa: E402
import stats_reference  # noqa: E402
from test_parallel import snapshot  # noqa: E402

ANALYSIS = dict(grad_microbatch=4, hvp_batch=3, noise_samples=2, noise_batch=3, directions=2, directions_per_pass=2,
                seed=31, curvature_method="forward-over-reverse")
CONTEXT = 8


def spectrum_deck(path, output, checkpoints, steps, chains, operator="H", tolerance=1e-10, analysis=None,
                  unseen=None, curvature_operator="hessian", extra=""):
    gnhtest.write_deck(path, output, checkpoints, CONTEXT, "train.bin", unseen,
                       analysis=dict(ANALYSIS, **(analysis or {})))
    with open(path, "a") as f:
        f.write(f'\n[curvature]\nlanczos_steps = {steps}\nlanczos_chains = {chains}\n'
                f'lanczos_operator = "{operator}"\nlanczos_tolerance = {tolerance}\ntop_eigenvalues = 5\n'
                f'operator = "{curvature_operator}"\n{extra}')


def spectrum_of(path, group="spectrum"):
    with h5py.File(path, "r") as f:
        (g,) = f["groups"].values()
        c = g["seen"]
        s = c[group]
        out = {k: s[k][()] for k in s}
        out.update({k: s.attrs[k] for k in s.attrs})
        out["chain_stop"] = [gnhtest.text(x) for x in out["chain_stop"]]
        out["vHv"] = c["vHv"][()]
        out["identity"] = (float(c.attrs[f"identity_{group}_quadrature_deviation"]),
                           float(c.attrs[f"identity_{group}_quadrature_tolerance"]))
        out["groups"] = sorted(k for k in c if k.startswith("spectrum"))
        if f"identity_{group}_nonnegative_deviation" in c.attrs:
            out["nonnegative"] = (float(c.attrs[f"identity_{group}_nonnegative_deviation"]),
                                  float(c.attrs[f"identity_{group}_nonnegative_tolerance"]))
    return out


def dense_gauss_newton(ref):
    """The dense epoch Gauss-Newton matrix GGN = sum_t J_t^T H_z,t J_t / count
    (J_t the Jacobian of token t's logits, H_z,t = diag(p) - p p^T), J's rows
    by backward from each logit, batched over the identity's rows."""
    P = ref.P
    GGN = torch.zeros(P, P, dtype=torch.float64)
    count = 0
    for idx, tgt in ref._chunks(range(ref.n)):
        z = ref.model(idx)
        V = z.shape[-1]
        eye = torch.eye(z.numel(), dtype=torch.float64).view(-1, *z.shape)
        rows = torch.autograd.grad(z, ref.params, grad_outputs=eye, is_grads_batched=True)
        J = torch.cat([r.reshape(eye.shape[0], -1) for r in rows], 1).view(-1, V, P)
        p = torch.softmax(z.detach().reshape(-1, V), dim=-1)
        Hz = torch.diag_embed(p) - p[:, :, None] * p[:, None, :]
        GGN += torch.einsum("nvp,nvw,nwq->pq", J, Hz, J)
        count += tgt.numel()
    return (GGN / count).numpy()


def filter_normalised(ref, seed, j):
    """random:j of [landscape] (doc/statistics.md): a Gaussian draw by
    Box-Muller on splitmix64 words, each matrix row scaled to theta's row
    norm (sums in index order, as gnh takes them), vectors left at zero."""
    M = stats_reference.MASK64
    key = stats_reference.splitmix64(stats_reference.splitmix64((seed & M) ^ stats_reference.splitmix64(j))
                                     ^ 0x6C616E6473636170)

    def z(i):
        u1 = ((stats_reference.splitmix64(key ^ (2 * i)) >> 11) + 1) * 2.0 ** -53
        u2 = (stats_reference.splitmix64(key ^ (2 * i + 1)) >> 11) * 2.0 ** -53
        return math.sqrt(-2.0 * math.log(u1)) * math.cos(6.283185307179586 * u2)

    theta = ref.flat_params().numpy()
    out = np.zeros(ref.P)
    off = 0
    for p in ref.params:
        n = p.numel()
        if p.dim() >= 2:
            cols = n // p.shape[0]
            for r in range(p.shape[0]):
                a = off + r * cols
                draw = [z(i) for i in range(a, a + cols)]
                ts = ds = 0.0
                for i in range(cols):
                    ts += theta[a + i] * theta[a + i]
                    ds += draw[i] * draw[i]
                scale = math.sqrt(ts / ds)
                out[a:a + cols] = [x * scale for x in draw]
        off += n
    return out


def rows_of(ref, d, theta):
    """(name, rows of d, rows of theta) per matrix; (name, None, slice) per vector."""
    off = 0
    for i, p in enumerate(ref.params):
        n = p.numel()
        if p.dim() >= 2:
            yield i, d[off:off + n].reshape(p.shape[0], -1), theta[off:off + n].reshape(p.shape[0], -1)
        else:
            yield i, None, slice(off, off + n)
        off += n


def measured_argmin(alpha, loss):
    """The documented rule: the lowest point, inside the grid refined to the
    vertex of the parabola through it and its neighbours."""
    k = int(np.argmin(loss))
    a = float(alpha[k])
    if 0 < k < len(loss) - 1:
        lo, mid, hi = float(loss[k - 1]), float(loss[k]), float(loss[k + 1])
        bend = lo - 2 * mid + hi
        if bend > 0:
            a += 0.5 * (float(alpha[k + 1]) - float(alpha[k])) * (lo - hi) / bend
    return a


def sketch_basis(A, seed, k, P):
    """Hutch++'s basis as doc/statistics.md states it: Gram-Schmidt twice
    over A v_1 .. A v_k (the first k Rademacher directions), a vector with
    nothing left of it dropped."""
    Q = []
    for i in range(k):
        y = A @ stats_reference.rademacher(seed, i, P)
        n0 = np.linalg.norm(y)
        for _ in range(2):
            for q in Q:
                y = y - (q @ y) * q
        if np.linalg.norm(y) > 1e-10 * n0:
            Q.append(y / np.linalg.norm(y))
    return np.array(Q)


def projected_trace(A, Q, seed, first, end, P):
    """(tr(Q^T A Q), the samples g^T (I - QQ^T) A (I - QQ^T) g for
    g = v_{first+1} .. v_end)."""
    rest = []
    for j in range(first, end):
        g = stats_reference.rademacher(seed, j, P)
        r = g - Q.T @ (Q @ g)
        rest.append(float(r @ A @ r))
    return float(np.trace(Q @ A @ Q.T)), rest


class SpectrumOracle(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="gnh-spectrum-")
        ck = os.path.join(cls.tmp, "ckpt")
        os.makedirs(ck)
        # Small enough for a dense Hessian (P = 929), trained a few AdamW
        # steps so that it carries the optimizer state P^1/2 H P^1/2 needs.
        cfg = gnhtest.gnh_model.GPTConfig(n_layer=1, n_head=2, n_embd=8, block_size=CONTEXT, vocab_size=13,
                                          bias=True, tie_embeddings=True, gelu="tanh")
        model = gnhtest.make_model(cfg, seed=3, scale=0.5)
        opt = gnhtest.train_adamw(model, steps=3, seed=3)
        cls.small = gnhtest.save_checkpoint(model, ck, "small", iter_num=3, optimizer=opt)
        # Over two chunks (65536 parameters each) of the chains' dot products.
        big = gnhtest.gnh_model.GPTConfig(n_layer=2, n_head=2, n_embd=64, block_size=CONTEXT, vocab_size=700,
                                          bias=False, tie_embeddings=False, gelu="tanh")
        os.makedirs(os.path.join(cls.tmp, "big"))
        gnhtest.save_checkpoint(gnhtest.make_model(big, seed=4, scale=0.3), os.path.join(cls.tmp, "big"), "big",
                                iter_num=1)
        cls.big_params = sum(p.numel() for p in gnhtest.make_model(big, seed=4).parameters())
        gnhtest.write_tokens(os.path.join(cls.tmp, "train.bin"), CONTEXT * 10 + 1, 13, 1)
        gnhtest.write_tokens(os.path.join(cls.tmp, "val.bin"), CONTEXT * 6 + 1, 13, 2)
        gnhtest.save_checkpoint(gnhtest.make_model(cfg, seed=5, scale=0.5), ck, "other", iter_num=9)

        ref = stats_reference.load_reference(cls.small, os.path.join(cls.tmp, "train.bin"), CONTEXT)
        cls.P = ref.P
        # The dense epoch Hessian, H_ij = e_i^T H e_j: every row by double
        # backward, batched over the identity's rows.
        H = torch.zeros(ref.P, ref.P, dtype=torch.float64)
        count = 0
        eye = torch.eye(ref.P, dtype=torch.float64)
        for idx, tgt in ref._chunks(range(ref.n)):
            ls = ref._loss_sum(idx, tgt)
            g = ref._flat(torch.autograd.grad(ls, ref.params, create_graph=True))
            for c in range(0, ref.P, 256):
                H[c:c + 256] += ref._hvps(g, eye[c:c + 256], True).detach()
            count += tgt.numel()
        H /= count
        cls.H = H.numpy()
        cls.GGN = dense_gauss_newton(ref)
        cls.precond = stats_reference.adam_preconditioner(cls.small)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def run_ok(self, deck, np_=1, sets=(), quiet=True):
        cmd = [gnhtest.MPIEXEC, "-np", str(np_), gnhtest.GNH, "run", deck] + (["--quiet"] if quiet else [])
        for s in sets:
            cmd += ["--set", s]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=gnhtest.mpi_env())
        self.assertEqual(r.returncode, 0, r.stderr + r.stdout)
        return r

    def small_run(self, name, operator, steps=120, chains=3, curvature_operator="hessian", group="spectrum"):
        deck = os.path.join(self.tmp, name + ".toml")
        spectrum_deck(deck, f"out/{name}.h5", ["ckpt/small.h5"], steps, chains, operator,
                      curvature_operator=curvature_operator)
        self.run_ok(deck, 1, ["precision.policy=fp64"])
        return spectrum_of(os.path.join(self.tmp, "out", name + ".h5"), group)

    def check_against_dense(self, sp, A):
        self.assertEqual(self.H.shape[0], self.P)
        # The oracle's rows come from separate double-backward sums: symmetric
        # to float64 accumulation over the epoch's batches (~1e-9 of |H|).
        np.testing.assert_allclose(A, A.T, rtol=0, atol=1e-8 * np.abs(A).max())
        dense = np.sort(np.linalg.eigvalsh(0.5 * (A + A.T)))[::-1]
        top = sp["top_eigenvalues"]
        self.assertEqual(len(top), 5)
        # The first chain stopped on its residuals, well before the budget.
        self.assertEqual(sp["chain_stop"][0], "converged", sp["chain_stop"])
        self.assertLess(sp["chain_steps"][0], sp["steps"])
        np.testing.assert_allclose(top, dense[:5], rtol=1e-6, atol=0)
        # A residual bounds the distance to the spectrum.
        for t, r in zip(top, sp["top_residuals"]):
            self.assertLessEqual(np.abs(dense - t).min(), r + 1e-12 * np.abs(dense).max())
        # Quadrature identities per chain, recorded and recomputed here.
        dev, tol = sp["identity"]
        self.assertLessEqual(dev, tol)
        self.assertEqual(tol, 1e-10)
        for c in range(int(sp["chains"])):
            n = int(sp["chain_steps"][c])
            w, th = sp["ritz_weights"][c, :n], sp["ritz_values"][c, :n]
            self.assertTrue(np.all(sp["ritz_weights"][c, n:] == 0))
            self.assertAlmostEqual(w.sum(), 1.0, delta=1e-12)
            v = stats_reference.rademacher(ANALYSIS["seed"], c, self.P) / np.sqrt(self.P)
            Av = A @ v
            self.assertLess(abs(sp["start_vHv"][c] - v @ Av), 1e-10 * np.abs(v * Av).sum())
            self.assertLess(abs(sp["start_Hv_sqnorm"][c] - Av @ Av), 1e-10 * (Av @ Av))
            self.assertLess(abs((w * th).sum() - sp["start_vHv"][c]), 1e-10 * (w * np.abs(th)).sum())
            self.assertLess(abs((w * th * th).sum() - sp["start_Hv_sqnorm"][c]), 1e-10 * sp["start_Hv_sqnorm"][c])
        # The density: mass one, first two moments those of the chains.
        x, rho, sigma = sp["density_grid"], sp["density"], float(sp["broadening"])
        self.assertGreater(sigma, 0)
        self.assertTrue(np.all(rho >= 0) and np.all(np.isfinite(rho)))
        self.assertLess(x[1] - x[0], sigma / 8)
        mass = np.trapz(rho, x)
        self.assertAlmostEqual(mass, 1.0, delta=1e-9)
        m1 = np.trapz(x * rho, x)
        m2 = np.trapz(x * x * rho, x) - sigma ** 2
        scale1 = np.mean([(sp["ritz_weights"][c] * np.abs(sp["ritz_values"][c])).sum() for c in range(3)])
        self.assertLess(abs(m1 - sp["start_vHv"].mean()), 1e-9 * scale1)
        self.assertLess(abs(m2 - sp["start_Hv_sqnorm"].mean()), 1e-9 * sp["start_Hv_sqnorm"].mean())
        return dense

    def test_top_eigenvalues_quadrature_and_density_against_the_dense_hessian(self):
        sp = self.small_run("h", "H")
        self.assertEqual(gnhtest.text(sp["operator"]), "H")
        self.assertEqual(sp["alpha"].shape, (3, 120))
        self.check_against_dense(sp, self.H)
        # The first chain starts at the §4 direction v_0: P v^T H v / |v|^2 agrees.
        self.assertLess(abs(sp["start_vHv"][0] * self.P - sp["vHv"][0]), 1e-10 * self.P * np.abs(self.H).sum() / self.P)

    def test_preconditioned_operator_against_the_dense_matrix(self):
        self.assertIsNotNone(self.precond)
        s = np.sqrt(self.precond)
        sp = self.small_run("php", "PHP")
        self.assertEqual(gnhtest.text(sp["operator"]), "PHP")
        self.check_against_dense(sp, s[:, None] * self.H * s[None, :])

    def test_gauss_newton_spectrum_against_the_dense_matrix(self):
        """operator = "both": the Hessian's spectrum as before and, in
        spectrum_ggn, the Gauss-Newton part's against the dense J^T H_z J, with
        the same bars; GGN is positive semi-definite, so its dense eigenvalues
        are not below -1e-12 of its largest (float64 rounding of the einsum),
        and the file's recorded sign identity holds. "ggn" alone writes
        spectrum_ggn only."""
        dense = np.linalg.eigvalsh(0.5 * (self.GGN + self.GGN.T))
        self.assertGreaterEqual(dense.min(), -1e-12 * dense.max())
        both = self.small_run("both", "H", curvature_operator="both", group="spectrum_ggn")
        self.assertEqual(both["groups"], ["spectrum", "spectrum_ggn"])
        self.assertEqual(gnhtest.text(both["operator"]), "GGN")
        self.check_against_dense(both, self.GGN)
        dev, tol = both["nonnegative"]
        self.assertLessEqual(dev, tol)
        self.assertGreater(np.abs(self.H - self.GGN).max(), 1e-3 * np.abs(self.H).max())
        self.check_against_dense(spectrum_of(os.path.join(self.tmp, "out", "both.h5")), self.H)
        # The report draws each operator's spectrum and the Gauss-Newton statistics.
        rep = os.path.join(self.tmp, "report_both")
        r, manifest = gnhtest.report(os.path.join(self.tmp, "out", "both.h5"), rep)
        self.assertEqual(r.returncode, 0, r.stderr)
        for name in ("spectrum", "spectrum_ggn", "trace_ggn", "B_noise_ggn", "residual_share", "GHG_ggn"):
            self.assertIn(name, manifest["figures"])
            for p in manifest["figures"][name]["files"]:
                self.assertGreater(os.path.getsize(p), 1000)
        with open(os.path.join(rep, "spectrum.csv")) as f:
            ops = sorted({row["operator"] for row in csv.DictReader(f)})
        self.assertEqual(ops, ["GGN", "H"])
        alone = self.small_run("ggn", "H", steps=30, curvature_operator="ggn", group="spectrum_ggn")
        self.assertEqual(alone["groups"], ["spectrum_ggn"])

    def test_ritz_vectors_against_the_dense_eigenvectors(self):
        """curvature.eigenvectors = 4: the first chain's top Ritz vectors
        (float32, descending) against the dense Hessian's eigenvectors:
        |cos| >= 1 - 1e-6 wherever the eigenvalue is separated from the rest
        of the spectrum by at least 1e-3 of the largest (the angle to the
        eigenvector is at most residual/gap, and the chain converged to
        residuals of 1e-10 of the largest; float32 storage adds 1e-7);
        residuals recomputed from the dense matrix within theirs plus 1e-7 of
        |H| (float32 vectors); orthonormal (the recorded identity, and here
        to float32 rounding); G_in_topk against the oracle's G to 1e-6; and
        with the update to the next state, delta_in_topk against the files'
        own Delta (1e-6: float32 vectors); topk_overlap_prev on the later
        state."""
        deck = os.path.join(self.tmp, "vectors.toml")
        spectrum_deck(deck, "out/vectors.h5", ["ckpt/small.h5", "ckpt/other.h5"], 120, 2,
                      extra="eigenvectors = 4\nupdate = true\n")
        self.run_ok(deck, 2, ["precision.policy=fp64"])
        dense_w, dense_v = np.linalg.eigh(0.5 * (self.H + self.H.T))
        order = np.argsort(dense_w)[::-1]
        dense_w, dense_v = dense_w[order], dense_v[:, order]
        norm = np.abs(dense_w).max()
        with h5py.File(os.path.join(self.tmp, "out", "vectors.h5"), "r") as f:
            groups = {gnhtest.text(g.attrs["aliases"][0]): g for g in f["groups"].values()}
            c = groups["small.h5"]["seen"]
            sp = c["spectrum"]
            U = sp["eigenvectors"][()]
            res = sp["eigenvector_residuals"][()]
            top = sp["top_eigenvalues"][()]
            self.assertEqual(U.dtype, np.float32)
            self.assertEqual(U.shape, (4, self.P))
            self.assertLessEqual(float(c.attrs["identity_spectrum_eigenvectors_orthonormal_deviation"]), 1e-10)
            np.testing.assert_allclose(U.astype(np.float64) @ U.T.astype(np.float64), np.eye(4), atol=1e-6)
            separated = 0
            for i in range(4):
                gap = min(abs(dense_w[i] - dense_w[j]) for j in range(self.P) if j != i)
                y = U[i].astype(np.float64)
                r = np.linalg.norm(self.H @ y - top[i] * y)
                self.assertLessEqual(r, res[i] + 1e-7 * norm, (i, r, res[i]))
                if gap >= 1e-3 * norm:
                    separated += 1
                    cos = abs(y @ dense_v[:, i]) / np.linalg.norm(y)
                    self.assertGreaterEqual(cos, 1 - 1e-6, (i, cos, gap / norm))
            self.assertGreaterEqual(separated, 2)
            ref = stats_reference.load_reference(self.small, os.path.join(self.tmp, "train.bin"), CONTEXT)
            G = ref.gradient()[1].numpy()
            want = float(np.sum((U.astype(np.float64) @ G) ** 2) / (G @ G))
            self.assertAlmostEqual(float(sp.attrs["G_in_topk"]), want, delta=1e-6 * max(want, 1e-3))
            theta = {}
            for name in ("small", "other"):
                r2 = stats_reference.load_reference(os.path.join(self.tmp, "ckpt", name + ".h5"),
                                                    os.path.join(self.tmp, "train.bin"), CONTEXT)
                theta[name] = r2.flat_params().numpy()
            delta = theta["other"] - theta["small"]
            want = float(np.sum((U.astype(np.float64) @ delta) ** 2) / (delta @ delta))
            self.assertAlmostEqual(float(sp.attrs["delta_in_topk"]), want, delta=1e-6 * max(want, 1e-3))
            # The last state has no next one; the first no previous one, and
            # the second's overlap with it is |U_a^T U_b|_F^2 / k (1e-6: float32 vectors).
            later = groups["other.h5"]["seen"]["spectrum"]
            self.assertNotIn("delta_in_topk", later.attrs)
            self.assertNotIn("topk_overlap_prev", sp.attrs)
            Ub = later["eigenvectors"][()].astype(np.float64)
            want = float(np.sum((U.astype(np.float64) @ Ub.T) ** 2) / 4)
            self.assertAlmostEqual(float(later.attrs["topk_overlap_prev"]), want, delta=1e-6)
            self.assertLessEqual(want, 1 + 1e-6)
        # The report draws the three fractions against checkpoint.
        r, manifest = gnhtest.report(os.path.join(self.tmp, "out", "vectors.h5"), os.path.join(self.tmp, "rep_vec"))
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(manifest["figures"]["eigenvectors"]["panels"],
                         ["G_in_topk", "delta_in_topk", "topk_overlap_prev"])

    def test_landscapes_against_pytorch(self):
        """[landscape] on the fp64 policy: the epoch loss at every grid point
        of the gradient, update, random:1 (filter-normalised, rebuilt here
        from its generator) and eigenvector:1 lines and of the (gradient,
        random:2) plane against PyTorch's float64 loss at the same theta +
        alpha D, the quadratic model's slope D^T G and curvature D^T H D
        against the oracle's G and dense H, the model and both minima as
        the documented rules give them from the file's own numbers, and the
        update's alpha = 1 equal to the next state's loss.

        Tolerances: 1e-10 relative for losses and slopes along directions
        formed in double (the same float64 sums of ~80 token losses in other
        orders differ by ~1e-15; D itself, built from gnh's G, carries G's
        1e-13 agreement into the loss at first order); 1e-8 relative for the
        curvatures (Lanczos-free dense products against gnh's exact-sum
        passes, ~1e-13, and eps* through G^T H G); the eigenvector line's
        direction is read back in float32 (6e-8 relative), so its losses
        and slope within 1e-6."""
        deck = os.path.join(self.tmp, "landscape.toml")
        spectrum_deck(deck, "out/landscape.h5", ["ckpt/small.h5", "ckpt/other.h5"], 120, 2,
                      extra="eigenvectors = 2\nupdate = true\n")
        with open(deck, "a") as f:
            f.write('\n[landscape]\ndirections = ["gradient", "update", "random:1", "eigenvector:1"]\npoints = 5\n'
                    'range = 2\nplane = ["gradient", "random:2"]\nplane_points = 3\nseed = 7\n')
        self.run_ok(deck, 1, ["precision.policy=fp64"])
        ref = stats_reference.load_reference(self.small, os.path.join(self.tmp, "train.bin"), CONTEXT)
        theta = ref.flat_params()
        loss0, G = ref.gradient()
        G = G.numpy()
        other = stats_reference.load_reference(os.path.join(self.tmp, "ckpt", "other.h5"),
                                               os.path.join(self.tmp, "train.bin"), CONTEXT)
        delta = (other.flat_params() - theta).numpy()

        def loss_at(D):
            ref.set_flat_params(theta + torch.from_numpy(D))
            try:
                return ref.loss()
            finally:
                ref.set_flat_params(theta)

        def close(got, want, rel, what):
            self.assertLessEqual(abs(got - want), rel * max(abs(want), 1e-300), (what, got, want))

        with h5py.File(os.path.join(self.tmp, "out", "landscape.h5"), "r") as f:
            groups = {gnhtest.text(g.attrs["aliases"][0]): g for g in f["groups"].values()}
            c = groups["small.h5"]["seen"]
            ls = c["landscape"]
            self.assertEqual(sorted(ls), ["eigenvector:1", "gradient", "plane", "random:1", "update"])
            L = float(c.attrs["loss"])
            GHG = float(G @ self.H @ G)
            U = c["spectrum"]["eigenvectors"][()].astype(np.float64)
            lam = float(c["spectrum"]["top_eigenvalues"][0])
            rand = {j: filter_normalised(ref, 7, j) for j in (1, 2)}
            want_D = {"gradient": -(G @ G) / GHG * G, "update": delta, "random:1": rand[1],
                      "eigenvector:1": 2 / abs(lam) * U[0]}
            rel = {"gradient": 1e-10, "update": 1e-10, "random:1": 1e-10, "eigenvector:1": 1e-6}
            for name, D in want_D.items():
                line = ls[name]
                alpha, loss, quad = line["alpha"][()], line["loss"][()], line["quadratic"][()]
                np.testing.assert_array_equal(alpha, [-2.0, -1.0, 0.0, 1.0, 2.0])
                self.assertEqual(alpha[2], 0.0)
                for a, got in zip(alpha, loss):
                    close(got, loss_at(a * D), rel[name], (name, a))
                slope, curv = float(line.attrs["slope"]), float(line.attrs["curvature"])
                close(slope, float(D @ G), rel[name], (name, "slope"))
                close(curv, float(D @ self.H @ D), max(rel[name], 1e-8), (name, "curvature"))
                close(float(line.attrs["unit_norm"]), float(np.linalg.norm(D)), rel[name], (name, "unit_norm"))
                # The same double arithmetic (1e-14: a compiler may fuse a multiply-add).
                np.testing.assert_allclose(quad, L + alpha * slope + 0.5 * alpha ** 2 * curv, rtol=1e-14, atol=0)
                close(float(line.attrs["argmin_alpha"]), measured_argmin(alpha, loss), 1e-12, (name, "argmin"))
                if curv > 0:
                    self.assertEqual(float(line.attrs["predicted_argmin_alpha"]), -slope / curv, name)
            # The gradient's unit is the quadratic model's step: its minimum at alpha = 1.
            close(float(ls["gradient"].attrs["predicted_argmin_alpha"]), 1.0, 1e-12, "eps*")
            # alpha = 1 along the update is the next state, whose epoch loss its own group has.
            k1 = int(np.flatnonzero(ls["update"]["alpha"][()] == 1.0)[0])
            close(float(ls["update"]["loss"][k1]), float(groups["other.h5"]["seen"].attrs["loss"]), 1e-12, "next")
            # Filter normalisation: every matrix row of random:1 as long as theta's, vectors untouched.
            for name, row_d, row_t in rows_of(ref, rand[1], theta.numpy()):
                if row_d is None:
                    self.assertFalse(np.any(rand[1][row_t]), name)
                else:
                    np.testing.assert_allclose(np.linalg.norm(row_d, axis=1), np.linalg.norm(row_t, axis=1),
                                               rtol=1e-12, err_msg=name)
            plane = ls["plane"]
            self.assertEqual((gnhtest.text(plane.attrs["alpha_direction"]), gnhtest.text(plane.attrs["beta_direction"])),
                             ("gradient", "random:2"))
            grid, quad = plane["loss"][()], plane["quadratic"][()]
            self.assertEqual(grid.shape, (3, 3))
            # The plane's model: the lines' slopes and curvatures and the cross term D_x^T H D_y.
            Dx, Dy = want_D["gradient"], rand[2]
            cross = float(Dx @ self.H @ Dy)
            close(float(plane.attrs["cross_curvature"]), cross, 1e-8 * math.sqrt(abs(Dx @ self.H @ Dx * (Dy @ self.H @ Dy))),
                  "cross")
            for i, a in enumerate(plane["alpha"][()]):
                for j, b in enumerate(plane["beta"][()]):
                    D = a * Dx + b * Dy
                    close(grid[i, j], loss_at(D), 1e-10, ("plane", a, b))
                    close(quad[i, j], L + D @ G + 0.5 * D @ self.H @ D, 1e-8, ("plane model", a, b))
            # The last state has no next one: no update line there.
            self.assertNotIn("update", groups["other.h5"]["seen"]["landscape"])
        # The report draws every line and both states' planes.
        r, manifest = gnhtest.report(os.path.join(self.tmp, "out", "landscape.h5"), os.path.join(self.tmp, "rep_ls"))
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(manifest["figures"]["landscape"]["panels"],
                         ["eigenvector:1", "gradient", "random:1", "update"])
        self.assertEqual(manifest["figures"]["landscape_plane"]["panels"], ["small.h5 seen", "other.h5 seen"])

    def test_variance_reduced_traces_against_the_dense_matrices(self):
        """curvature.trace_estimator (the default with forward-over-reverse):
        tr H by Hutch++ (12 directions in passes of 2: a sketch of
        min(12 / 3, 2) = 2, its 2 products, the complement by v_3 .. v_10)
        and by deflation with the top 3 Ritz vectors (their products in
        passes of 2 and 1; the complement by all 12), and tr GGN by Hutch++,
        against the same estimators formed here from the dense H and GGN and
        the same generator: 1e-9 relative (float64 throughout; the products
        and Gram-Schmidt's dots in other orders, ~1e-14, conditioned by the
        basis), the deflated one 1e-5 (the file's Ritz vectors are float32:
        6e-8 each); their errors likewise; the variance ratio as defined; and
        with [curvature] blocks every block's Hutch++ share in both partitions,
        the shares summing to the whole.
        Then the estimators themselves, over 200 seeds here: each mean within
        three standard errors of the dense trace (unbiased). (Which spread is
        smaller depends on how fast the spectrum falls: on this model of 929
        parameters at 12 products Hutch++'s is the larger, doc/statistics.md.)"""
        deck = os.path.join(self.tmp, "traces.toml")
        spectrum_deck(deck, "out/traces.h5", ["ckpt/small.h5"], 120, 1, analysis=dict(directions=12),
                      curvature_operator="both", extra="eigenvectors = 3\nblocks = true\n")
        self.run_ok(deck, 1, ["precision.policy=fp64"])
        with h5py.File(os.path.join(self.tmp, "out", "traces.h5"), "r") as f:
            (g,) = f["groups"].values()
            c = g["seen"]
            a = {k: float(c.attrs[k]) for k in c.attrs if k.startswith("trace")}
            U = c["spectrum"]["eigenvectors"][()].astype(np.float64)
            blocks = {p: (c["blocks"][p]["offsets"][()], c["blocks"][p]["trace_H_hutchpp"][()])
                      for p in c["blocks"]}
        seed, P = ANALYSIS["seed"], self.P
        H = 0.5 * (self.H + self.H.T)
        top, rest = projected_trace(H, sketch_basis(H, seed, 2, P), seed, 2, 10, P)
        self.assertAlmostEqual(a["trace_H_hutchpp"], top + np.mean(rest), delta=1e-9 * abs(top))
        se = np.std(rest, ddof=1) / math.sqrt(len(rest))
        self.assertAlmostEqual(a["trace_H_hutchpp_se"], se, delta=1e-9 * abs(top))
        # Per block (both partitions): each block's share of every sample,
        # summing to the whole (doc/statistics.md), against the dense H.
        Q = sketch_basis(H, seed, 2, P)
        HQ = Q @ H
        for part, (offsets, got) in blocks.items():
            want = np.zeros(len(offsets) - 1)
            for j in range(2, 10):
                v = stats_reference.rademacher(seed, j, P)
                cj, Hv = Q @ v, H @ v
                for b in range(len(offsets) - 1):
                    s_ = slice(int(offsets[b]), int(offsets[b + 1]))
                    X = Q[:, s_] @ HQ[:, s_].T  # X[i, l] = (q_i)_b . (H q_l)_b
                    want[b] += (np.trace(X) + v[s_] @ Hv[s_] - 2 * cj @ (HQ[:, s_] @ v[s_]) + cj @ X @ cj) / 8
            np.testing.assert_allclose(got, want, rtol=0, atol=1e-9 * abs(top), err_msg=part)
            self.assertAlmostEqual(float(np.sum(got)), a["trace_H_hutchpp"], delta=1e-9 * abs(top))
        gtop, grest = projected_trace(self.GGN, sketch_basis(self.GGN, seed, 2, P), seed, 2, 10, P)
        self.assertAlmostEqual(a["trace_ggn_hutchpp"], gtop + np.mean(grest), delta=1e-9 * abs(gtop))
        dtop, drest = projected_trace(H, U, seed, 0, 12, P)
        self.assertAlmostEqual(a["trace_H_deflated"], dtop + np.mean(drest), delta=1e-5 * abs(dtop))
        self.assertAlmostEqual(a["trace_variance_ratio"], (a["trace_H_se"] / a["trace_H_hutchpp_se"]) ** 2,
                               delta=1e-12 * a["trace_variance_ratio"])
        # Unbiased: over 200 seeds (12 products each) every estimator's mean
        # is within three of its standard errors of the dense trace.
        exact = float(np.trace(H))
        plain, hpp, defl = [], [], []
        for s in range(200):
            v = [stats_reference.rademacher(1000 + s, j, P) for j in range(12)]
            plain.append(np.mean([x @ H @ x for x in v]))
            top, rest = projected_trace(H, sketch_basis(H, 1000 + s, 4, P), 1000 + s, 4, 8, P)
            hpp.append(top + np.mean(rest))
            top, rest = projected_trace(H, U, 1000 + s, 0, 12, P)
            defl.append(top + np.mean(rest))
        for name, x in (("hutchinson", plain), ("hutch++", hpp), ("deflated", defl)):
            self.assertLessEqual(abs(np.mean(x) - exact), 3 * np.std(x, ddof=1) / math.sqrt(len(x)), name)
        # The report draws tr H by the three estimators.
        r, manifest = gnhtest.report(os.path.join(self.tmp, "out", "traces.h5"), os.path.join(self.tmp, "rep_tr"))
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(manifest["figures"]["traces"]["panels"], ["trace_H", "trace_H_hutchpp", "trace_H_deflated"])

    def test_edge_of_stability_ratios(self):
        """sharpness_ratio = eta lambda_max / 2 on H's spectrum with the deck's
        learning rate (over the file's), sharpness_ratio_adam = eta
        lambda_max(P^1/2 H P^1/2) (1 - beta1) / (2 + 2 beta1) on the PHP
        spectrum with the rate and beta1 the checkpoint's AdamW state
        records: the same double arithmetic on the file's own numbers
        (1e-15 relative); neither without a spectrum of its operator."""
        with h5py.File(self.small, "r") as f:
            lr, beta1 = float(f["optimizer"].attrs["lr"]), float(f["optimizer"].attrs["beta1"])
        self.assertGreater(lr, 0)
        for name, operator, table in (("eos_h", "H", 'learning_rates = { "sm*" = 0.25 }\n'), ("eos_php", "PHP", "")):
            deck = os.path.join(self.tmp, name + ".toml")
            spectrum_deck(deck, f"out/{name}.h5", ["ckpt/small.h5"], 20, 1, operator)
            with open(deck) as f:
                text = f.read()
            with open(deck, "w") as f:
                f.write(text.replace("[checkpoints]\n", "[checkpoints]\n" + table, 1))
            self.run_ok(deck, 1, ["precision.policy=fp64"])
            with h5py.File(os.path.join(self.tmp, "out", name + ".h5"), "r") as f:
                (g,) = f["groups"].values()
                c = g["seen"]
                top = float(c["spectrum"]["top_eigenvalues"][0])
                a = c.attrs
                if operator == "H":
                    self.assertEqual(float(a["learning_rate"]), 0.25)
                    self.assertAlmostEqual(float(a["sharpness_ratio"]), 0.25 * top / 2, delta=1e-15 * abs(top))
                    self.assertNotIn("sharpness_ratio_adam", a)
                else:
                    self.assertEqual(float(a["learning_rate"]), lr)
                    want = lr * top * (1 - beta1) / (2 + 2 * beta1)
                    self.assertAlmostEqual(float(a["sharpness_ratio_adam"]), want, delta=1e-15 * abs(want))
                    self.assertNotIn("sharpness_ratio", a)
        # The report draws the ratio against its edge.
        r, manifest = gnhtest.report(os.path.join(self.tmp, "out", "eos_php.h5"), os.path.join(self.tmp, "rep_eos"))
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(manifest["figures"]["stability"]["panels"], ["sharpness_ratio_adam"])

    def test_layer_spectra_against_the_dense_diagonal_blocks(self):
        """curvature.spectrum_blocks = "layer": a chain per layer block on its
        diagonal block H_bb, against the dense Hessian's blocks: the top
        eigenvalues to 1e-6 relative (the chains converge to residuals of
        1e-10 of the largest), each within its residual of a dense
        eigenvalue, the quadrature identity recorded; the whole spectrum
        beside them unchanged; a block smaller than the steps stops at its
        dimension (an invariant subspace); the report's per-layer figure;
        and bitwise the same on a team of two ranks."""
        outs = {}
        for np_ in (1, 2):
            deck = os.path.join(self.tmp, f"layers{np_}.toml")
            spectrum_deck(deck, f"out/layers{np_}.h5", ["ckpt/small.h5"], 60, 2, extra='spectrum_blocks = "layer"\n')
            self.run_ok(deck, np_, ["precision.policy=fp64", f"parallel.ranks_per_checkpoint={np_}"])
            outs[np_] = os.path.join(self.tmp, "out", f"layers{np_}.h5")
        ref = stats_reference.load_reference(self.small, os.path.join(self.tmp, "train.bin"), CONTEXT)
        names, offsets = stats_reference.partitions(ref)["layer"]
        with h5py.File(outs[1], "r") as f:
            (g,) = f["groups"].values()
            c = g["seen"]
            self.assertEqual(sorted(c["spectrum_blocks"]), sorted(names))
            self.assertLessEqual(float(c.attrs["identity_spectrum_blocks_quadrature_deviation"]), 1e-10)
            self.assertIn("spectrum", c)
            for i, name in enumerate(names):
                lo, hi = offsets[i], offsets[i + 1]
                block = 0.5 * (self.H[lo:hi, lo:hi] + self.H[lo:hi, lo:hi].T)
                dense = np.sort(np.linalg.eigvalsh(block))[::-1]
                sp = c["spectrum_blocks"][name]
                top, res = sp["top_eigenvalues"][()], sp["top_residuals"][()]
                self.assertEqual(int(sp.attrs["chains"]), 1)
                np.testing.assert_allclose(top, dense[:len(top)], rtol=1e-6, atol=1e-9 * np.abs(dense).max(),
                                           err_msg=name)
                for t, r in zip(top, res):
                    self.assertLessEqual(np.abs(dense - t).min(), r + 1e-12 * np.abs(self.H).max())
                steps = int(sp["chain_steps"][0])
                self.assertLessEqual(steps, min(60, hi - lo), name)
                if hi - lo < 60:
                    self.assertIn(gnhtest.text(sp["chain_stop"][0]), ("converged", "invariant_subspace"))
        a, b = snapshot(outs[1]), snapshot(outs[2])
        keys = [k for k in a if "spectrum_blocks" in k]
        self.assertGreater(len(keys), 20)
        for k in keys:
            self.assertEqual(a[k], b[k], k)
        r, manifest = gnhtest.report(outs[1], os.path.join(self.tmp, "rep_layers"))
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(manifest["figures"]["layer_spectra"]["panels"], ["top_eigenvalue", "density"])

    def test_report_draws_the_density_and_the_top_eigenvalues(self):
        deck = os.path.join(self.tmp, "report.toml")
        spectrum_deck(deck, "out/report.h5", ["ckpt/small.h5", "ckpt/other.h5"], 12, 2, unseen="val.bin")
        self.run_ok(deck)
        rep = os.path.join(self.tmp, "report")
        r, manifest = gnhtest.report(os.path.join(self.tmp, "out/report.h5"), rep)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(manifest["figures"]["spectrum"]["panels"], ["density", "top_eigenvalues"])
        for p in manifest["figures"]["spectrum"]["files"]:
            self.assertGreater(os.path.getsize(p), 1000)
        with open(os.path.join(rep, "spectrum.csv")) as f:
            rows = list(csv.DictReader(f))
        # 2 states x 2 cases x 5 top eigenvalues, each the file's value.
        self.assertEqual(len(rows), 2 * 2 * 5)
        with h5py.File(os.path.join(self.tmp, "out/report.h5"), "r") as f:
            for h, g in f["groups"].items():
                for case in ("seen", "unseen"):
                    want = g[case]["spectrum/top_eigenvalues"][()].tolist()
                    got = [float(r["eigenvalue"]) for r in rows if r["group"] == h and r["case"] == case]
                    self.assertEqual(got, want)

    def big_deck(self, name, steps, tolerance=0.0, landscape=False):
        deck = os.path.join(self.tmp, name + ".toml")
        # With two Ritz vectors: their assembly over a sharded basis (and, on
        # resume, the first chain's rows read back) is part of what is compared.
        # With landscapes, 3 directions: Hutch++ and the deflated trace too.
        spectrum_deck(deck, f"out/{name}.h5", ["big/big.h5"], steps, 3, tolerance=tolerance, extra="eigenvectors = 2\n",
                      analysis=dict(directions=3) if landscape else None)
        if landscape:  # lines and a plane, their batches split over the team
            with open(deck, "a") as f:
                f.write('\n[landscape]\ndirections = ["gradient", "eigenvector:1", "random:1"]\npoints = 3\n'
                        'plane = ["random:1", "random:2"]\nplane_points = 3\n')
        return deck

    def test_rank_counts_are_bitwise_identical(self):
        self.assertGreater(self.big_params, 2 * 65536)
        snaps = {}
        # Teams of 2 and 3, each one shard group (parallel.parameter_shards):
        # the passes' sums in slices, the basis dealt over the team.
        for np_ in (1, 2, 3):
            deck = self.big_deck(f"ranks{np_}", 6, landscape=True)
            self.run_ok(deck, np_, [f"parallel.ranks_per_checkpoint={np_}", f"parallel.parameter_shards={np_}",
                                    "precision.policy=fp32"])
            # Everything but the planned memory per rank, which shrinks with
            # the team: the basis and the vectors are sharded over it.
            snaps[np_] = {k: v for k, v in snapshot(os.path.join(self.tmp, "out", f"ranks{np_}.h5")).items()
                          if not k.endswith("@peak_memory_bytes")}
        self.assertTrue(any(k.endswith("seen/spectrum/alpha") for k in snaps[1]))
        self.assertTrue(any(k.endswith("seen/landscape/plane/loss") for k in snaps[1]))
        self.assertTrue(any(k.endswith("seen@trace_H_hutchpp") for k in snaps[1]))
        self.assertTrue(any(k.endswith("seen@trace_H_deflated") for k in snaps[1]))
        for np_ in (2, 3):
            diff = [k for k in snaps[1] if snaps[np_].get(k) != snaps[1][k]]
            self.assertEqual(diff, [], f"{np_} ranks")

    def test_sigkill_between_steps_resumes_after_the_last_saved_step(self):
        steps = 40
        ref = self.big_deck("uninterrupted", steps)
        self.run_ok(ref, 1, ["precision.policy=fp32"])
        deck = self.big_deck("killed", steps)
        cmd = [gnhtest.MPIEXEC, "-np", "1", gnhtest.GNH, "run", deck, "--quiet", "--set", "precision.policy=fp32"]
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=gnhtest.mpi_env(),
                             start_new_session=True)
        groups = os.path.join(self.tmp, "out", "killed.groups")
        state = None
        deadline = time.time() + 300
        saves = 0
        last = None
        while time.time() < deadline and saves < 4:
            found = [f for f in os.listdir(groups) if f.endswith(".lanczos.state")] if os.path.isdir(groups) else []
            if found:
                state = os.path.join(groups, found[0])
                try:
                    m = os.stat(state).st_mtime_ns
                except FileNotFoundError:
                    continue
                if m != last:
                    saves += 1
                    last = m
            time.sleep(0.01)
        subprocess.run(["pkill", "-KILL", "-f", f"^{gnhtest.GNH} run {deck}"], check=False)
        os.killpg(p.pid, signal.SIGKILL)
        p.communicate(timeout=60)
        self.assertIsNotNone(state, "no Lanczos state was saved")
        self.assertFalse([f for f in os.listdir(groups) if f.endswith(".h5")], "the run finished before the kill")
        # Resumed by a team of two: the saved basis is laid out globally, so
        # any team size can read its own chunks of it.
        r = self.run_ok(deck, 2, ["precision.policy=fp32", "parallel.ranks_per_checkpoint=2"], quiet=False)
        resumed = [line for line in r.stdout.splitlines() if "spectrum resumed after step" in line]
        self.assertEqual(len(resumed), 1, r.stdout)
        at = int(resumed[0].split("after step ")[1].split()[0])
        self.assertTrue(1 <= at < steps, resumed[0])

        def results(name):  # the planned memory per rank differs with the team size
            return {k: v for k, v in snapshot(os.path.join(self.tmp, "out", name)).items()
                    if not k.endswith("@peak_memory_bytes")}
        self.assertEqual(results("killed.h5"), results("uninterrupted.h5"))
        # The state files go once the group file holds the result.
        self.assertEqual([f for f in os.listdir(groups) if ".lanczos" in f], [])


if __name__ == "__main__":
    unittest.main(verbosity=2)
