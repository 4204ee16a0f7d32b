#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
"""`gnh run` end to end against an independent PyTorch double-backward
computation (stats_reference.py) of every per-sample statistic of SPEC §4, on
a generated campaign: three epochs plus final/latest aliases of the last.

Bars: 1e-10 relative in double (fp64 policy), 1e-4 in float (fp32), the
derivative oracle's (test_derivative_oracle.py: rounding of the same sums in
different orders, amplified in float by the curvature's depth and
cancellation); quadratic forms relative to max(|q|, sum of absolute
per-batch contributions), since a Rademacher or noise form can nearly cancel."""
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

import torch

HERE = os.path.dirname(os.path.realpath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "integration"))
sys.path.insert(0, HERE)
import gnhtest  # noqa: E402
import h5py  # noqa: E402
import numpy as np  # noqa: E402
import stats_reference  # noqa: E402

ANALYSIS = dict(grad_microbatch=4, hvp_batch=3, noise_samples=3, noise_batch=4, directions=3,
                directions_per_pass=4, seed=77)


def groups_by_alias(f):
    """Every group of a results file, by each of its checkpoint aliases."""
    groups = {}
    for g in f["groups"].values():
        for a in g.attrs["aliases"]:
            groups[a.decode() if isinstance(a, bytes) else a] = g
    return groups


class StatisticsOracle(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="gnh-soracle-")
        cfg = gnhtest.gnh_model.GPTConfig(n_layer=2, n_head=3, n_embd=12, block_size=16, vocab_size=31,
                                          bias=True, tie_embeddings=False, gelu="tanh")
        ck = os.path.join(cls.tmp, "ckpt")
        os.makedirs(ck)
        for e in (1, 2, 3):
            gnhtest.save_checkpoint(gnhtest.make_model(cfg, seed=e, scale=0.3), ck, f"epoch{e}", iter_num=10 * e)
        for alias in ("final", "latest"):
            shutil.copy(os.path.join(ck, "epoch3.h5"), os.path.join(ck, alias + ".h5"))
        cls.context = 9  # not a power of two
        gnhtest.write_tokens(os.path.join(cls.tmp, "train.bin"), cls.context * 14 + 5, 31, 1)
        gnhtest.write_tokens(os.path.join(cls.tmp, "val.bin"), cls.context * 13 + 1, 31, 2)
        cls.deck = os.path.join(cls.tmp, "deck.toml")
        gnhtest.write_deck(cls.deck, "out/stats.h5", ["ckpt/*.h5"], cls.context, "train.bin", "val.bin",
                           analysis=ANALYSIS)
        cls.refs = {}
        for e in (1, 2, 3):
            for case, tok in (("seen", "train.bin"), ("unseen", "val.bin")):
                cls.refs[(e, case)] = stats_reference.reference_statistics(
                    os.path.join(ck, f"epoch{e}.h5"), os.path.join(cls.tmp, tok), cls.context,
                    ANALYSIS["noise_samples"], ANALYSIS["noise_batch"], ANALYSIS["directions"], ANALYSIS["seed"])

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def check_policy(self, policy, rel, method):
        r = gnhtest.run_gnh(self.deck, 2, [f"precision.policy={policy}", f"analysis.curvature_method={method}"])
        self.assertEqual(r.returncode, 0, r.stderr + r.stdout)
        with h5py.File(os.path.join(self.tmp, "out", "stats.h5"), "r") as f:
            self.assertEqual(f.attrs["format"], "gnh-results")
            self.assertEqual(int(f.attrs["identities_ok"]), 1)
            by_alias = {}
            for h, g in f["groups"].items():
                for a in g.attrs["aliases"]:
                    by_alias[a.decode() if isinstance(a, bytes) else a] = g
            self.assertEqual(sorted(by_alias), ["epoch1.h5", "epoch2.h5", "epoch3.h5", "final.h5", "latest.h5"])
            self.assertEqual(by_alias["final.h5"].name, by_alias["epoch3.h5"].name)
            for e in (1, 2, 3):
                g = by_alias[f"epoch{e}.h5"]
                self.assertEqual(int(g.attrs["iter_num"]), 10 * e)
                for case in ("seen", "unseen"):
                    ref, c = self.refs[(e, case)], g[case]
                    with self.subTest(epoch=e, case=case, policy=policy, method=method):
                        self.assertEqual(int(c.attrs["tokens"]), ref["tokens"])
                        self.assertEqual(c["noise_blocks"][()].tolist(), ref["noise_blocks"])
                        close = lambda got, want, scale=None: self.assertLessEqual(  # noqa: E731
                            abs(got - want), rel * (scale if scale is not None else abs(want)), (got, want))
                        close(c.attrs["loss"], ref["loss"])
                        close(c.attrs["G_sqnorm"], ref["G_sqnorm"])
                        close(c.attrs["GHG"], ref["GHG"], max(abs(ref["GHG"]), ref["GHG_abs"]))
                        for name in ("gB_sqnorm", "xi_sqnorm"):
                            np.testing.assert_allclose(c[name][()], ref[name], rtol=rel)
                        # G.xi cancels (xi averages to ~0): scale by |G||xi|.
                        scale = np.sqrt(ref["G_sqnorm"] * np.asarray(ref["xi_sqnorm"]))
                        self.assertTrue(np.all(np.abs(c["G_dot_xi"][()] - ref["G_dot_xi"]) <= rel * scale))
                        qs = np.maximum(np.abs(ref["xiHxi"]), ref["xiHxi_abs"])
                        self.assertTrue(np.all(np.abs(c["xiHxi"][()] - ref["xiHxi"]) <= rel * qs))
                        vs = np.maximum(np.abs(ref["vHv"]), ref["vHv_abs"])
                        self.assertTrue(np.all(np.abs(c["vHv"][()] - ref["vHv"]) <= rel * vs))
                        self.assertAlmostEqual(c.attrs["fpc"], ref["fpc"], places=12)
                        for name in ("trace_sigma", "B_simple", "trace_HSigma", "B_noise", "trace_H"):
                            # Derived from the per-sample values: a few times their bar.
                            got, want = c.attrs[name], ref[name]
                            se = max(ref[name + "_se"], abs(want))
                            self.assertLessEqual(abs(got - want), 10 * rel * se, (name, got, want))
                        self.assertEqual(int(c.attrs["identities_ok"]), 1)
                        stages = [s.decode() if isinstance(s, bytes) else s for s in c["timings"].attrs["stages"]]
                        self.assertEqual(stages, ["gradient", "noise", "curvature", "checks", "total"])
                        self.assertGreater(int(c.attrs["peak_memory_bytes"]), 0)

    def check_gauss_newton(self, method, operator):
        """SPEC §10's Gauss-Newton statistics (curvature.operator) against
        GGN = J^T H_z J built from its definition in float64
        (stats_reference.gauss_newton_statistics), fp64 policy: 1e-10 of each
        form (GGN is positive semi-definite, its forms do not cancel), a few
        times that for the derived means and ratios; the residual share is a
        difference of two curvatures, so relative to GHG's scale."""
        r = gnhtest.run_gnh(self.deck, 2, ["precision.policy=fp64", f"analysis.curvature_method={method}",
                                           f"curvature.operator={operator}"])
        self.assertEqual(r.returncode, 0, r.stderr + r.stdout)
        rel = 1e-10
        with h5py.File(os.path.join(self.tmp, "out", "stats.h5"), "r") as f:
            self.assertEqual(int(f.attrs["identities_ok"]), 1)
            groups = groups_by_alias(f)
            for e, case, tok in ((1, "seen", "train.bin"), (3, "unseen", "val.bin")):
                ref = stats_reference.load_reference(os.path.join(self.tmp, "ckpt", f"epoch{e}.h5"),
                                                     os.path.join(self.tmp, tok), self.context)
                want = stats_reference.gauss_newton_statistics(ref, self.refs[(e, case)], ANALYSIS["directions"],
                                                               ANALYSIS["seed"])
                c = groups[f"epoch{e}.h5"][case]
                with self.subTest(epoch=e, case=case, method=method, operator=operator):
                    self.assertLessEqual(abs(c.attrs["GHG_ggn"] - want["GHG_ggn"]), rel * want["GHG_ggn"])
                    np.testing.assert_allclose(c["xiGGNxi"][()], want["xiGGNxi"], rtol=rel)
                    np.testing.assert_allclose(c["vGGNv"][()], want["vGGNv"], rtol=rel)
                    for name in ("xiHxi_ggn", "trace_ggn", "B_noise_ggn"):
                        self.assertLessEqual(abs(c.attrs[name] - want[name]), 10 * rel * abs(want[name]), name)
                        self.assertLessEqual(abs(c.attrs[name + "_se"] - want[name + "_se"]),
                                             10 * rel * abs(want[name]), name)
                    self.assertTrue(min(want["vGGNv"]) >= 0 and min(want["xiGGNxi"]) >= 0)
                    if operator == "both":
                        ghg = self.refs[(e, case)]
                        scale = max(abs(ghg["GHG"]), ghg["GHG_abs"]) / abs(ghg["GHG"])
                        self.assertLessEqual(abs(c.attrs["residual_share"] - want["residual_share"]),
                                             10 * rel * scale)
                    else:
                        self.assertNotIn("residual_share", c.attrs)
                    for name in ("ggn_symmetry", "ggn_paths", "ggn_nonnegative"):
                        self.assertLessEqual(c.attrs[f"identity_{name}_deviation"],
                                             c.attrs[f"identity_{name}_tolerance"], name)

    def test_gauss_newton_second_order_forward(self):
        self.check_gauss_newton("second-order-forward", "both")

    def test_gauss_newton_forward_over_reverse(self):
        self.check_gauss_newton("forward-over-reverse", "ggn")

    def test_fp64_second_order_forward(self):
        self.check_policy("fp64", 1e-10, "second-order-forward")

    def test_fp64_forward_over_reverse(self):
        self.check_policy("fp64", 1e-10, "forward-over-reverse")

    def test_fp32(self):
        self.check_policy("fp32", 1e-4, "second-order-forward")

    def check_blocks(self, policy, rel):
        """SPEC §10 per-block statistics, tr(H^2), the effective rank and the
        Hutchinson diagonal against float64 double backward (block_statistics).
        Bars: `rel` relative to the quantity, or for sums of products that can
        cancel (trace_H, GHG_contrib, xiHxi_contrib) to the sum of absolute
        products; the diagonal is stored in float32, so 2^-24 relative more."""
        sets = [f"precision.policy={policy}", "analysis.curvature_method=forward-over-reverse", "curvature.blocks=true",
                "curvature.diagonal=true"]
        for e, case, ref, c in self.states_and_cases(sets):
            st = stats_reference.statistics_of(ref, ANALYSIS["noise_samples"], ANALYSIS["noise_batch"],
                                               ANALYSIS["directions"], ANALYSIS["seed"])
            want = stats_reference.block_statistics(ref, st, ANALYSIS["directions"], ANALYSIS["seed"])
            with self.subTest(epoch=e, case=case, policy=policy):
                self.assertLessEqual(c.attrs["identity_block_sums_deviation"],
                                     c.attrs["identity_block_sums_tolerance"])
                for name in ("frob_H", "effective_rank"):
                    self.assertLessEqual(abs(c.attrs[name] - want[name]), rel * abs(want[name]), name)
                self.assertLessEqual(abs(c.attrs["frob_H_se"] - want["frob_H_se"]),
                                     10 * rel * max(want["frob_H_se"], want["frob_H"]))
                d = c["hessian_diagonal"][()]
                self.assertEqual(d.dtype, np.float32)
                self.assertEqual(d.shape, (st["P"],))
                # Entries with no curvature (positions past the context) are
                # rounding noise on both sides: each entry's bar is `rel` of
                # its own scale or of the largest one, whichever is larger.
                scale = np.maximum(want["hessian_diagonal_scale"], want["hessian_diagonal_scale"].max())
                dt = np.abs(d - want["hessian_diagonal"])
                self.assertTrue(np.all(dt <= 2.0 ** -24 * np.abs(want["hessian_diagonal"]) + rel * scale),
                                dt.max())
                for part in ("tensor", "layer"):
                    b, w = c["blocks"][part], want["partitions"][part]
                    names = [n.decode() if isinstance(n, bytes) else n for n in b["names"][()]]
                    self.assertEqual(names, w["names"])
                    self.assertEqual(b["offsets"][()].tolist(), w["offsets"])
                    for q in ("G_sqnorm", "trace_sigma", "B_simple", "trace_H", "GHG_contrib",
                              "xiHxi_contrib", "frob_H"):
                        got, exp = b[q][()], w[q]
                        scale = np.maximum(np.abs(exp), w.get(q + "_scale", 0.0))
                        self.assertTrue(np.all(np.abs(got - exp) <= rel * scale), (part, q, got, exp))
                        if q + "_se" in w:
                            se_scale = np.maximum(w[q + "_se"], scale)
                            self.assertTrue(np.all(np.abs(b[q + "_se"][()] - w[q + "_se"]) <= 10 * rel * se_scale),
                                            (part, q + "_se"))
                    # The layer blocks are unions of tensor blocks.
                    if part == "layer":
                        t = c["blocks"]["tensor"]
                        self.assertAlmostEqual(float(np.sum(t["frob_H"][()])), float(np.sum(b["frob_H"][()])),
                                               delta=rel * float(np.sum(b["frob_H"][()])))

    def test_fp64_gauss_newton_blocks(self):
        """Per-block trace_ggn (operator "both" with blocks) against
        mean_k v_k,b . (GGN v_k)_b from the definition in float64, 1e-10 of
        the largest block's value (a block's v_b . (GGN v)_b need not be
        non-negative, and one with little curvature carries rounding of the
        larger ones' size) and 10 times that for the SEs; the blocks of each partition sum
        to the whole trace_ggn of the forward's forms (1e-10: the same
        quadratic forms summed in two orders)."""
        r = gnhtest.run_gnh(self.deck, 2, ["precision.policy=fp64", "analysis.curvature_method=forward-over-reverse",
                                           "curvature.blocks=true", "curvature.operator=both"])
        self.assertEqual(r.returncode, 0, r.stderr + r.stdout)
        rel = 1e-10
        with h5py.File(os.path.join(self.tmp, "out", "stats.h5"), "r") as f:
            self.assertEqual(int(f.attrs["identities_ok"]), 1)
            groups = groups_by_alias(f)
            ref = stats_reference.load_reference(os.path.join(self.tmp, "ckpt", "epoch2.h5"),
                                                 os.path.join(self.tmp, "train.bin"), self.context)
            want = stats_reference.gauss_newton_blocks(ref, ANALYSIS["directions"], ANALYSIS["seed"])
            c = groups["epoch2.h5"]["seen"]
            for part in ("tensor", "layer"):
                got, got_se = c["blocks"][part]["trace_ggn"][()], c["blocks"][part]["trace_ggn_se"][()]
                exp, exp_se = want[part]
                scale = np.maximum(np.abs(exp), np.abs(exp).max())
                self.assertTrue(np.all(np.abs(got - exp) <= rel * scale), (part, got, exp))
                self.assertTrue(np.all(np.abs(got_se - exp_se) <= 10 * rel * scale), (part, got_se, exp_se))
                self.assertLessEqual(abs(got.sum() - c.attrs["trace_ggn"]), rel * np.abs(got).sum())

    def states_and_cases(self, sets):
        """Runs the deck on two ranks with `sets` and yields (epoch, case,
        float64 reference, the case's group) for epochs 1 and 3 and both cases."""
        r = gnhtest.run_gnh(self.deck, 2, sets)
        self.assertEqual(r.returncode, 0, r.stderr + r.stdout)
        with h5py.File(os.path.join(self.tmp, "out", "stats.h5"), "r") as f:
            self.assertEqual(int(f.attrs["identities_ok"]), 1)
            groups = groups_by_alias(f)
            for e in (1, 3):
                for case, tok in (("seen", "train.bin"), ("unseen", "val.bin")):
                    ref = stats_reference.load_reference(os.path.join(self.tmp, "ckpt", f"epoch{e}.h5"),
                                                         os.path.join(self.tmp, tok), self.context)
                    yield e, case, ref, groups[f"epoch{e}.h5"][case]

    def check_per_sequence(self, policy, rel, method, *extra):
        """Every sequence's |a_i|^2, tr(Sigma) and B_simple from them, their
        SEs, the histogram and the per-block values against float64 PyTorch
        (stats_reference.sequence_statistics), for every state and case.
        |a_i|^2 and the per-block sums of squares are sums of positive terms:
        rel (fp64 1e-10, fp32 1e-4: the gradient's own rounding) of the value;
        tr(Sigma) = mean|a|^2 - |G|^2 cancels, so rel of mean|a|^2; the SEs
        are square roots of sums of squares of such differences: 10 rel of
        their scale. The edges equal the reference's to 1e-12 (exp and log of
        the same extremes) and the counts are those of the |a_i|^2 written
        (already checked) on them: the reference's own extremes may fall a
        rounding outside gnh's edges."""
        sets = [f"precision.policy={policy}", f"analysis.curvature_method={method}", "curvature.blocks=true", *extra]
        for e, case, ref, c in self.states_and_cases(sets):
            want = stats_reference.sequence_statistics(ref)
            with self.subTest(epoch=e, case=case, policy=policy, method=method):
                x = c["seq_grad_sqnorm"][()]
                np.testing.assert_allclose(x, want["seq_grad_sqnorm"], rtol=rel)
                self.assertEqual(int(c.attrs["n_sequences"]), want["n_sequences"])
                scale = float(np.mean(want["seq_grad_sqnorm"]))
                self.assertLessEqual(abs(c.attrs["trace_sigma_seq"] - want["trace_sigma_seq"]), rel * scale)
                self.assertLessEqual(abs(c.attrs["trace_sigma_seq_se"] - want["trace_sigma_seq_se"]),
                                     10 * rel * scale)
                G2 = c.attrs["G_sqnorm"]
                self.assertLessEqual(abs(c.attrs["B_simple_seq"] - want["B_simple_seq"]), 10 * rel * scale / G2)
                edges = c["seq_grad_sqnorm_edges"][()]
                np.testing.assert_allclose(edges, want["seq_grad_sqnorm_edges"], rtol=max(rel, 1e-12))
                counts, _ = np.histogram(x, bins=edges)
                self.assertEqual(c["seq_grad_sqnorm_counts"][()].tolist(), counts.tolist())
                self.assertEqual(int(np.sum(counts)), want["n_sequences"])
                for part in ("tensor", "layer"):
                    t, w = c["blocks"][part], want["blocks"][part]
                    bscale = np.maximum(np.abs(w["trace_sigma_seq"]), w["G_sqnorm"]) + scale * rel
                    for name in ("trace_sigma_seq", "trace_sigma_seq_se"):
                        np.testing.assert_array_less(np.abs(t[name][()] - w[name]), 10 * rel * bscale + 1e-300,
                                                     err_msg=f"{part} {name}")
                # The batch and the per-sequence estimators agree: their
                # statistical check passes the campaign-wide threshold.
                self.assertGreater(c.attrs["consistency_noise_estimators_p_value"],
                                   c.attrs["consistency_noise_estimators_threshold"])

    def test_fp64_per_sequence(self):
        self.check_per_sequence("fp64", 1e-10, "second-order-forward")

    def test_fp32_per_sequence(self):
        # Batches of one sequence: its gradient is the batch's, its norms taken there.
        self.check_per_sequence("fp32", 1e-4, "forward-over-reverse", "analysis.grad_microbatch=1")

    def test_per_sequence_off_writes_none(self):
        r = gnhtest.run_gnh(self.deck, 1, ["precision.policy=fp64", "analysis.per_sequence=false"])
        self.assertEqual(r.returncode, 0, r.stderr + r.stdout)
        with h5py.File(os.path.join(self.tmp, "out", "stats.h5"), "r") as f:
            for g in f["groups"].values():
                for case in ("seen", "unseen"):
                    c = g[case]
                    for name in ("n_sequences", "trace_sigma_seq", "B_simple_seq", "consistency_noise_estimators_p_value"):
                        self.assertNotIn(name, c.attrs)
                    for name in ("seq_grad_sqnorm", "seq_grad_sqnorm_edges", "seq_grad_sqnorm_counts"):
                        self.assertNotIn(name, c)

    def test_fp64_curvature_blocks(self):
        self.check_blocks("fp64", 1e-10)

    def test_fp32_curvature_blocks(self):
        self.check_blocks("fp32", 1e-4)

    def check_update(self, policy, rel, method):
        """SPEC §10 along the update between consecutive checkpoints (epoch1 ->
        epoch2 -> epoch3; final and latest are epoch3's aliases) against float64
        PyTorch. Bars: `rel` of the value, or of |Delta||H Delta| and |G||Delta|
        for the forms that can cancel."""
        r = gnhtest.run_gnh(self.deck, 2, [f"precision.policy={policy}", f"analysis.curvature_method={method}",
                                           "curvature.update=true"])
        self.assertEqual(r.returncode, 0, r.stderr + r.stdout)
        ck = os.path.join(self.tmp, "ckpt")
        with h5py.File(os.path.join(self.tmp, "out", "stats.h5"), "r") as f:
            groups = {}
            for g in f["groups"].values():
                for a in g.attrs["aliases"]:
                    groups[gnhtest.text(a)] = g
            self.assertEqual(gnhtest.text(groups["epoch3.h5"].attrs["update_partner"]), "")
            self.assertNotIn("update", groups["epoch3.h5"]["seen"])
            for e in (1, 2):
                a = groups[f"epoch{e}.h5"]
                self.assertEqual(gnhtest.text(a.attrs["update_partner"]), groups[f"epoch{e + 1}.h5"].name.split("/")[-1])
                for case, tok in (("seen", "train.bin"), ("unseen", "val.bin")):
                    ref = stats_reference.load_reference(os.path.join(ck, f"epoch{e}.h5"), os.path.join(self.tmp, tok),
                                                         self.context)
                    _, G = ref.gradient()
                    want = stats_reference.update_statistics(ref, {"G": G.numpy()}, os.path.join(ck, f"epoch{e + 1}.h5"))
                    u = a[case]["update"].attrs
                    with self.subTest(epoch=e, case=case, policy=policy, method=method):
                        self.assertEqual(gnhtest.text(u["partner"]), gnhtest.text(a.attrs["update_partner"]))
                        self.assertLessEqual(abs(u["delta_sqnorm"] - want["delta_sqnorm"]), rel * want["delta_sqnorm"])
                        self.assertLessEqual(abs(u["G_dot_delta"] - want["G_dot_delta"]), rel * want["G_dot_delta_scale"])
                        self.assertLessEqual(abs(u["dHd"] - want["dHd"]), rel * want["dHd_scale"])
                        # The losses are sums over the epoch: rel of the loss itself.
                        loss = self.refs[(e, case)]["loss"]
                        self.assertLessEqual(abs(u["measured_change"] - want["measured_change"]), 2 * rel * loss)
                        self.assertLessEqual(abs(u["predicted_change"] - want["predicted_change"]),
                                             rel * (want["G_dot_delta_scale"] + want["dHd_scale"]))
                        self.assertLessEqual(abs(u["curvature_along"] - want["curvature_along"]),
                                             2 * rel * want["dHd_scale"] / want["delta_sqnorm"])

    def test_fp64_update_forward_over_reverse(self):
        self.check_update("fp64", 1e-10, "forward-over-reverse")

    def test_fp64_update_second_order_forward(self):
        self.check_update("fp64", 1e-10, "second-order-forward")

    def test_fp32_update(self):
        self.check_update("fp32", 1e-4, "second-order-forward")

    def test_csv_has_a_row_per_file_and_case(self):
        r = gnhtest.run_gnh(self.deck, 1, ["precision.policy=fp64"])
        self.assertEqual(r.returncode, 0, r.stderr)
        with open(os.path.join(self.tmp, "out", "stats.csv")) as f:
            rows = [l.rstrip("\n").split(",") for l in f]
        header, body = rows[0], rows[1:]
        self.assertEqual(header[:4], ["checkpoint", "group", "iter_num", "case"])
        self.assertEqual(len(body), 5 * 2)
        loss = header.index("loss")
        got = {(r[0], r[3]): float(r[loss]) for r in body}
        self.assertEqual(got[("final.h5", "seen")], got[("epoch3.h5", "seen")])
        self.assertLessEqual(abs(got[("epoch2.h5", "unseen")] - self.refs[(2, "unseen")]["loss"]),
                             1e-10 * self.refs[(2, "unseen")]["loss"])


class LargeVocabulary(unittest.TestCase):
    """A vocabulary above 65,535: uint32 token files, ids across the whole
    range, an untied head of 70,003 rows, end to end against float64 PyTorch
    (1e-10: the bars of StatisticsOracle), on one rank and two, with the
    memory plan of `--dry-run` counting the head; and a Llama file with a
    tied head of as many rows, converted from bfloat16 safetensors."""

    def uint32_deck(self, tmp, ck, V, context, seed):
        """tmp/deck.toml on ck over uint32 tokens in tmp/train.bin with ids
        above 65,535."""
        ids = gnhtest.write_tokens(os.path.join(tmp, "train.bin"), context * 12 + 1, V, seed, dtype=np.uint32)
        self.assertGreater(int(ids.max()), 65535)
        deck = os.path.join(tmp, "deck.toml")
        gnhtest.write_deck(deck, "out/v.h5", [ck], context, "train.bin", analysis=ANALYSIS)
        with open(deck) as f:
            text = f.read().replace('dtype = "uint16"', 'dtype = "uint32"')
        with open(deck, "w") as f:
            f.write(text)
        return deck

    def test_uint32_tokens_and_a_head_of_70003_rows(self):
        tmp = tempfile.mkdtemp(prefix="gnh-vocab-")
        self.addCleanup(shutil.rmtree, tmp, True)
        V, context = 70003, 8
        cfg = gnhtest.gnh_model.GPTConfig(n_layer=1, n_head=2, n_embd=8, block_size=context, vocab_size=V,
                                          bias=True, tie_embeddings=False, gelu="tanh")
        ck = gnhtest.save_checkpoint(gnhtest.make_model(cfg, seed=3, scale=0.3), tmp, "big_vocab", iter_num=1)
        deck = self.uint32_deck(tmp, ck, V, context, 5)
        dry = subprocess.run([gnhtest.MPIEXEC, "-np", "1", gnhtest.GNH, "run", deck, "--dry-run"], capture_output=True,
                             text=True, timeout=300, env=gnhtest.mpi_env())
        self.assertEqual(dry.returncode, 0, dry.stderr + dry.stdout)
        self.assertIn("vocab_size=70003", dry.stdout)
        ref = stats_reference.load_reference(ck, os.path.join(tmp, "train.bin"), context, dtype="uint32")
        want = stats_reference.statistics_of(ref, ANALYSIS["noise_samples"], ANALYSIS["noise_batch"],
                                             ANALYSIS["directions"], ANALYSIS["seed"])
        seq = stats_reference.sequence_statistics(ref)
        snaps = []
        for np_ in (1, 2):
            r = gnhtest.run_gnh(deck, np_, ["precision.policy=fp64"])
            self.assertEqual(r.returncode, 0, r.stderr + r.stdout)
            with h5py.File(os.path.join(tmp, "out", "v.h5"), "r") as f:
                self.assertEqual(int(f.attrs["identities_ok"]), 1)
                (g,) = f["groups"].values()
                c = g["seen"]
                rel = 1e-10
                self.assertEqual(int(c.attrs["tokens"]), want["tokens"])
                self.assertLessEqual(abs(c.attrs["loss"] - want["loss"]), rel * want["loss"])
                self.assertLessEqual(abs(c.attrs["G_sqnorm"] - want["G_sqnorm"]), rel * want["G_sqnorm"])
                self.assertLessEqual(abs(c.attrs["GHG"] - want["GHG"]), rel * max(abs(want["GHG"]), want["GHG_abs"]))
                np.testing.assert_allclose(c["xi_sqnorm"][()], want["xi_sqnorm"], rtol=rel)
                np.testing.assert_allclose(c["seq_grad_sqnorm"][()], seq["seq_grad_sqnorm"], rtol=rel)
                snaps.append({k: c.attrs[k] for k in ("loss", "G_sqnorm", "GHG", "trace_sigma_seq")})
        self.assertEqual(snaps[0], snaps[1])


    def test_llama_uint32_tokens_and_a_tied_head_of_70003_rows(self):
        # The same on a Llama file converted from a Hugging Face directory:
        # one key/value head, a tied head of 70,003 rows; fp64 against float64
        # PyTorch on two ranks, fp32 within float's 1e-4 of it.
        import gnh_families
        import gnh_hf
        from gnh_layout import HFConfig
        tmp = tempfile.mkdtemp(prefix="gnh-vocab-llama-")
        self.addCleanup(shutil.rmtree, tmp, True)
        V, context = 70003, 8
        cfg = HFConfig(family="llama", vocab_size=V, hidden_size=8, intermediate_size=12, num_hidden_layers=1,
                       num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=context, norm_eps=1e-5,
                       rope_theta=100.0, hidden_act="silu", tie_word_embeddings=True)
        model = gnh_families.init_random(gnh_families.CausalLM(cfg).double(), 6, 0.3)
        state = {n: p.numpy().astype(np.float32) for n, p in gnh_families.canonical_state(model).items()}
        gnh_hf.save_dir(os.path.join(tmp, "hf"), cfg, state, dtype="BF16")
        ck = os.path.join(tmp, "llama.h5")
        gnhtest.gnh_convert.convert(os.path.join(tmp, "hf"), ck, gnhtest.gnh_convert.default_options())
        deck = self.uint32_deck(tmp, ck, V, context, 7)
        ref = stats_reference.load_reference(ck, os.path.join(tmp, "train.bin"), context, dtype="uint32")
        want = stats_reference.statistics_of(ref, ANALYSIS["noise_samples"], ANALYSIS["noise_batch"],
                                             ANALYSIS["directions"], ANALYSIS["seed"])
        got = {}
        for policy, np_ in (("fp64", 2), ("fp32", 1)):
            r = gnhtest.run_gnh(deck, np_, [f"precision.policy={policy}"])
            self.assertEqual(r.returncode, 0, r.stderr + r.stdout)
            self.assertIn("vocab_size=70003", r.stdout)
            with h5py.File(os.path.join(tmp, "out", "v.h5"), "r") as f:
                self.assertEqual(int(f.attrs["identities_ok"]), 1)
                (g,) = f["groups"].values()
                got[policy] = {k: g["seen"].attrs[k] for k in ("tokens", "loss", "G_sqnorm", "GHG")}
                got[policy]["xi_sqnorm"] = g["seen"]["xi_sqnorm"][()]
        g, rel = got["fp64"], 1e-10
        self.assertEqual(int(g["tokens"]), want["tokens"])
        self.assertLessEqual(abs(g["loss"] - want["loss"]), rel * want["loss"])
        self.assertLessEqual(abs(g["G_sqnorm"] - want["G_sqnorm"]), rel * want["G_sqnorm"])
        self.assertLessEqual(abs(g["GHG"] - want["GHG"]), rel * max(abs(want["GHG"]), want["GHG_abs"]))
        np.testing.assert_allclose(g["xi_sqnorm"], want["xi_sqnorm"], rtol=rel)
        for k in ("loss", "G_sqnorm"):
            self.assertLessEqual(abs(got["fp32"][k] - g[k]), 1e-4 * abs(g[k]), k)


class FamilyStatistics(unittest.TestCase):
    """`gnh run` on the Llama and GPT-NeoX families (SPEC section 11), two
    checkpoints each converted from Hugging Face directories, against float64
    PyTorch models written from the published definitions: SPEC §4's
    statistics by both curvature methods, the per-block statistics of the
    layer partition (embed, h.i, head), the per-sequence noise and the update
    between the checkpoints, on two ranks and bit for bit the same on one;
    the AdamW-preconditioned statistics of a file given AdamW state, and the
    note on one without; then the float policies (fp32, tf32, bf16-amp)
    against the fp64 values.
    Bars as StatisticsOracle's; bf16-amp within 5% of fp32's loss and G (its
    operands carry 8 bits)."""

    CONFIGS = {
        "llama": dict(family="llama", vocab_size=29, hidden_size=16, intermediate_size=24, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=16, norm_eps=1e-5,
                      rope_theta=10.0, hidden_act="silu"),
        "gpt-neox": dict(family="gpt-neox", vocab_size=29, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                         num_attention_heads=2, max_position_embeddings=16, norm_eps=1e-5, rope_theta=10.0,
                         rotary_pct=0.25, use_parallel_residual=True, hidden_act="gelu", qkv_bias=True),
    }

    @classmethod
    def setUpClass(cls):
        import gnh_families
        import gnh_hf
        from gnh_layout import HFConfig
        cls.tmp = tempfile.mkdtemp(prefix="gnh-family-stats-")
        cls.context = 9
        cls.dirs = {}
        for fam, kw in cls.CONFIGS.items():
            d = os.path.join(cls.tmp, fam)
            ck = os.path.join(d, "ckpt")
            os.makedirs(ck)
            cfg = HFConfig(**kw)
            for e in (1, 2):
                model = gnh_families.init_random(gnh_families.CausalLM(cfg).double(), 10 * e, 0.3)
                state = {n: p.numpy().astype(np.float32) for n, p in gnh_families.canonical_state(model).items()}
                gnh_hf.save_dir(os.path.join(d, f"hf-step{e}"), cfg, state)
                gnhtest.gnh_convert.convert(os.path.join(d, f"hf-step{e}"), os.path.join(ck, f"epoch{e}.h5"),
                                            gnhtest.gnh_convert.default_options())
            gnhtest.write_tokens(os.path.join(d, "train.bin"), cls.context * 14 + 5, cfg.vocab_size, 1)
            gnhtest.write_deck(os.path.join(d, "deck.toml"), "out/stats.h5", ["ckpt/*.h5"], cls.context,
                               "train.bin", analysis=ANALYSIS)
            cls.dirs[fam] = d

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def run_case(self, fam, np_, sets):
        d = self.dirs[fam]
        shutil.rmtree(os.path.join(d, "out"), ignore_errors=True)
        r = gnhtest.run_gnh(os.path.join(d, "deck.toml"), np_, sets)
        self.assertEqual(r.returncode, 0, r.stderr + r.stdout)
        with h5py.File(os.path.join(d, "out", "stats.h5"), "r") as f:
            self.assertEqual(int(f.attrs["identities_ok"]), 1)
            groups = groups_by_alias(f)
            return {e: {k: (v[()] if hasattr(v, "shape") else v) for k, v in self.flatten(groups[f"epoch{e}.h5"]["seen"])}
                    for e in (1, 2)}

    @staticmethod
    def flatten(c):
        out = [(k, c.attrs[k]) for k in c.attrs]
        c.visititems(lambda name, obj: out.append((name, obj[()])) if isinstance(obj, h5py.Dataset) else None)
        out += [("update/" + k, c["update"].attrs[k]) for k in c["update"].attrs] if "update" in c else []
        out += [("blocks/layer/" + k, c["blocks"]["layer"][k][()]) for k in c["blocks"]["layer"]] \
            if "blocks" in c else []
        return out

    def test_fp64_every_statistic_both_methods(self):
        rel = 1e-10
        for fam, d in self.dirs.items():
            ck = os.path.join(d, "ckpt")
            refs = {e: stats_reference.load_reference(os.path.join(ck, f"epoch{e}.h5"), os.path.join(d, "train.bin"),
                                                      self.context) for e in (1, 2)}
            want = {e: stats_reference.statistics_of(refs[e], ANALYSIS["noise_samples"], ANALYSIS["noise_batch"],
                                                     ANALYSIS["directions"], ANALYSIS["seed"]) for e in (1, 2)}
            blocks = stats_reference.block_statistics(refs[1], want[1], ANALYSIS["directions"], ANALYSIS["seed"])
            seq = stats_reference.sequence_statistics(refs[1])
            upd = stats_reference.update_statistics(refs[1], want[1], os.path.join(ck, "epoch2.h5"))
            snaps = {}
            for method in ("second-order-forward", "forward-over-reverse"):
                sets = ["precision.policy=fp64", f"analysis.curvature_method={method}", "curvature.blocks=true",
                        "curvature.update=true"]
                got = self.run_case(fam, 2, sets)
                snaps[method] = got
                for e in (1, 2):
                    g, w = got[e], want[e]
                    with self.subTest(family=fam, method=method, epoch=e):
                        self.assertEqual(int(g["tokens"]), w["tokens"])
                        self.assertLessEqual(abs(g["loss"] - w["loss"]), rel * w["loss"])
                        self.assertLessEqual(abs(g["G_sqnorm"] - w["G_sqnorm"]), rel * w["G_sqnorm"])
                        self.assertLessEqual(abs(g["GHG"] - w["GHG"]), rel * max(abs(w["GHG"]), w["GHG_abs"]))
                        np.testing.assert_allclose(g["xi_sqnorm"], w["xi_sqnorm"], rtol=rel)
                        vs = np.maximum(np.abs(w["vHv"]), w["vHv_abs"])
                        self.assertTrue(np.all(np.abs(g["vHv"] - w["vHv"]) <= rel * vs))
                        for name in ("trace_sigma", "B_simple", "trace_HSigma", "B_noise", "trace_H"):
                            self.assertLessEqual(abs(g[name] - w[name]), 10 * rel * max(w[name + "_se"], abs(w[name])),
                                                 name)
                g = got[1]
                with self.subTest(family=fam, method=method, what="blocks, sequences, update"):
                    names = [gnhtest.text(n) for n in g["blocks/layer/names"]]
                    self.assertEqual(names, ["embed", "h.0", "h.1", "head"])
                    self.assertEqual(names, blocks["partitions"]["layer"]["names"])
                    # H v per block: forward-over-reverse only.
                    for q in ("G_sqnorm", "trace_sigma") + (("trace_H",) if method == "forward-over-reverse" else ()):
                        exp = blocks["partitions"]["layer"][q]
                        scale = np.maximum(np.abs(exp), blocks["partitions"]["layer"].get(q + "_scale", 0.0))
                        self.assertTrue(np.all(np.abs(g["blocks/layer/" + q] - exp) <= rel * scale), q)
                    np.testing.assert_allclose(g["seq_grad_sqnorm"], seq["seq_grad_sqnorm"], rtol=rel)
                    self.assertLessEqual(abs(g["update/delta_sqnorm"] - upd["delta_sqnorm"]), rel * upd["delta_sqnorm"])
                    self.assertLessEqual(abs(g["update/dHd"] - upd["dHd"]), rel * upd["dHd_scale"])
            # One rank gives the bits of two.
            one = self.run_case(fam, 1, ["precision.policy=fp64", "analysis.curvature_method=forward-over-reverse",
                                         "curvature.blocks=true", "curvature.update=true"])
            for k in ("loss", "G_sqnorm", "GHG", "trace_sigma", "trace_sigma_seq"):
                self.assertEqual(one[1][k], snaps["forward-over-reverse"][1][k], (fam, k))

    def test_float_policies(self):
        for fam in self.dirs:
            ref = self.run_case(fam, 2, ["precision.policy=fp64"])
            fp32 = None
            for policy in ("fp32", "tf32", "bf16-amp"):
                got = self.run_case(fam, 2, [f"precision.policy={policy}"])
                with self.subTest(family=fam, policy=policy):
                    rel = 5e-2 if policy == "bf16-amp" else 1e-4
                    base = fp32 if policy == "bf16-amp" else ref
                    for e in (1, 2):
                        for k in ("loss", "G_sqnorm"):
                            self.assertLessEqual(abs(got[e][k] - base[e][k]), rel * abs(base[e][k]), (k, got[e][k]))
                if policy == "fp32":
                    fp32 = got


    def adam_file(self, fam, dest):
        """epoch1.h5 with an /optimizer group as gnh-convert writes one: the
        AdamW state after three steps of training the loaded model in float64
        on random tokens (the file's weights stay those of epoch 1: what is
        checked is how the state is read, by canonical name)."""
        src = os.path.join(self.dirs[fam], "ckpt", "epoch1.h5")
        shutil.copy(src, dest)
        model = stats_reference.load_model(src)
        named = stats_reference.canonical_named(model)
        opt = torch.optim.AdamW(list(named.values()), lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
        gen = torch.Generator().manual_seed(3)
        for _ in range(3):
            idx = torch.randint(0, self.CONFIGS[fam]["vocab_size"], (2, self.context + 1), generator=gen)
            _, loss = model(idx[:, :-1], idx[:, 1:])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        with h5py.File(dest, "r+") as f:
            o = f.create_group("optimizer")
            o.attrs["step"] = np.int64(3)
            for key, value in (("beta1", 0.9), ("beta2", 0.95), ("eps", 1e-8), ("weight_decay", 0.1), ("lr", 1e-3)):
                o.attrs[key] = np.float64(value)
            for key in ("exp_avg", "exp_avg_sq"):
                g = o.create_group(key, track_order=True)
                for name, p in named.items():
                    g.create_dataset(name, data=opt.state[p][key].numpy().astype(np.float32))

    def test_preconditioned_with_adamw_state_and_the_note_without(self):
        # SPEC §10's AdamW-preconditioned statistics of a family file with
        # AdamW state against float64 double backward (PreconditionedOracle's
        # bars), beside a file without state, which gets the note and no
        # preconditioned values (converted Hugging Face checkpoints carry none).
        rel = 1e-10
        for fam, d in self.dirs.items():
            with self.subTest(family=fam):
                p = os.path.join(d, "precond")
                shutil.rmtree(p, ignore_errors=True)
                os.makedirs(p)
                adam = os.path.join(p, "adam.h5")
                self.adam_file(fam, adam)
                shutil.copy(os.path.join(d, "ckpt", "epoch2.h5"), os.path.join(p, "plain.h5"))
                ref = stats_reference.load_reference(adam, os.path.join(d, "train.bin"), self.context)
                st = stats_reference.statistics_of(ref, ANALYSIS["noise_samples"], ANALYSIS["noise_batch"],
                                                   ANALYSIS["directions"], ANALYSIS["seed"])
                w = stats_reference.preconditioned_statistics(ref, st, stats_reference.adam_preconditioner(adam))
                deck = os.path.join(d, "precond.toml")
                gnhtest.write_deck(deck, "out/precond.h5", ["precond/*.h5"], self.context, "train.bin",
                                   analysis=ANALYSIS, extra="[curvature]\npreconditioned = true\n")
                r = gnhtest.run_gnh(deck, 2, ["precision.policy=fp64", "analysis.curvature_method=forward-over-reverse"])
                self.assertEqual(r.returncode, 0, r.stderr + r.stdout)
                with h5py.File(os.path.join(d, "out", "precond.h5"), "r") as f:
                    g = groups_by_alias(f)
                    self.assertEqual(gnhtest.text(g["adam.h5"].attrs["preconditioner"]), "AdamW state of adam.h5")
                    self.assertIn("none: no AdamW state", gnhtest.text(g["plain.h5"].attrs["preconditioner"]))
                    for name in ("GPG", "PG_H_PG", "B_simple_P", "B_noise_P", "curvature_preconditioned"):
                        self.assertNotIn(name, g["plain.h5"]["seen"].attrs)
                    c = g["adam.h5"]["seen"].attrs
                    self.assertLessEqual(abs(c["GPG"] - w["GPG"]), rel * w["GPG"])
                    self.assertLessEqual(abs(c["PG_H_PG"] - w["PG_H_PG"]), rel * w["PG_H_PG_scale"])
                    # Ratios of those forms: their bar times the form's
                    # cancellation (PreconditionedOracle).
                    amp = max(1.0, abs(w["PG_H_PG_scale"] / w["PG_H_PG"]))
                    for name in ("B_simple_P", "B_noise_P", "curvature_preconditioned"):
                        scale = max(abs(w[name]), w.get(name + "_se", 0.0))
                        self.assertLessEqual(abs(c[name] - w[name]), 10 * rel * scale * amp, name)


class UpdateIdentityAndOrder(unittest.TestCase):
    """SPEC §10 along the update: on two nearby states the quadratic model
    predicts the measured loss change to third order; checkpoints that cannot
    be ordered by iter_num are refused by name when the update is asked for."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="gnh-update-")
        cls.cfg = gnhtest.gnh_model.GPTConfig(n_layer=2, n_head=2, n_embd=8, block_size=16, vocab_size=23,
                                              bias=True, tie_embeddings=False, gelu="tanh")
        cls.context = 8
        gnhtest.write_tokens(os.path.join(cls.tmp, "train.bin"), cls.context * 12 + 1, 23, 3)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def campaign(self, name, models):
        d = os.path.join(self.tmp, name)
        os.makedirs(d)
        for stem, model, it in models:
            gnhtest.save_checkpoint(model, d, stem, iter_num=it)
        deck = os.path.join(self.tmp, name + ".toml")
        gnhtest.write_deck(deck, f"out/{name}.h5", [f"{name}/*.h5"], self.context, "train.bin",
                           analysis=dict(noise_samples=0, directions=0, directions_per_pass=2),
                           extra="[curvature]\nupdate = true\n")
        return deck

    def test_quadratic_model_predicts_a_small_step(self):
        a = gnhtest.make_model(self.cfg, seed=7, scale=0.3)
        b = gnhtest.make_model(self.cfg, seed=7, scale=0.3)
        gen = torch.Generator().manual_seed(8)
        with torch.no_grad():
            for p in b.parameters():
                p.add_(1e-3 * torch.randn(p.shape, generator=gen, dtype=p.dtype))
        deck = self.campaign("near", [("a", a, 100), ("b", b, 101)])
        r = gnhtest.run_gnh(deck, 2, ["precision.policy=fp64", "analysis.curvature_method=forward-over-reverse"])
        self.assertEqual(r.returncode, 0, r.stderr + r.stdout)
        with h5py.File(os.path.join(self.tmp, "out", "near.h5"), "r") as f:
            g = {gnhtest.text(h.attrs["aliases"][0]): h for h in f["groups"].values()}
            u = g["a.h5"]["seen"]["update"].attrs
            self.assertNotIn("update", g["b.h5"]["seen"])
            measured, predicted, quad = u["measured_change"], u["predicted_change"], 0.5 * u["dHd"]
            # The model's error is the third-order term, O(|Delta|^3): far below
            # the second-order term it adds to the first, which it must resolve.
            self.assertGreater(abs(quad), 1e-3 * abs(measured))
            self.assertLessEqual(abs(measured - predicted), 0.05 * abs(quad), (measured, predicted, quad))
            self.assertGreater(abs(measured - u["G_dot_delta"]), 0.5 * abs(quad))

    def test_unordered_checkpoints_are_refused_by_name(self):
        m = [gnhtest.make_model(self.cfg, seed=s, scale=0.3) for s in (1, 2)]
        tie = self.campaign("tie", [("p", m[0], 5), ("q", m[1], 5)])
        r = gnhtest.run_gnh(tie, 1)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("same iter_num 5", r.stderr)
        self.assertIn("p.h5", r.stderr)
        self.assertIn("q.h5", r.stderr)
        self.assertNotIn("Traceback", r.stderr)
        none = self.campaign("none", [("r", m[0], 5), ("s", m[1], None)])
        r = gnhtest.run_gnh(none, 1)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("s.h5 has no iter_num", r.stderr)
        # Without the update the same campaign runs.
        r = gnhtest.run_gnh(none, 1, ["curvature.update=false"])
        self.assertEqual(r.returncode, 0, r.stderr)


class PreconditionedOracle(unittest.TestCase):
    """SPEC §10's AdamW-preconditioned noise scale against float64 double
    backward, on checkpoints converted from nanoGPT files that carry real
    AdamW state after training steps, beside one without state."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="gnh-precond-")
        cfg = gnhtest.gnh_model.GPTConfig(n_layer=2, n_head=3, n_embd=12, block_size=16, vocab_size=31,
                                          bias=True, tie_embeddings=True, gelu="erf")
        ck = os.path.join(cls.tmp, "ckpt")
        os.makedirs(ck)
        model = gnhtest.make_model(cfg, seed=4, scale=0.3)
        state = gnhtest.train_adamw(model, steps=3, seed=4)
        gnhtest.save_checkpoint(model, ck, "adam", iter_num=3, optimizer=state)
        gnhtest.save_checkpoint(gnhtest.make_model(cfg, seed=5, scale=0.3), ck, "plain", iter_num=5)
        cls.context = 9
        gnhtest.write_tokens(os.path.join(cls.tmp, "train.bin"), cls.context * 14 + 5, 31, 1)
        cls.deck = os.path.join(cls.tmp, "deck.toml")
        gnhtest.write_deck(cls.deck, "out/p.h5", ["ckpt/*.h5"], cls.context, "train.bin", analysis=ANALYSIS)
        with open(cls.deck, "a") as f:
            f.write("\n[curvature]\npreconditioned = true\n")
        cls.ref = stats_reference.load_reference(os.path.join(ck, "adam.h5"), os.path.join(cls.tmp, "train.bin"),
                                                 cls.context)
        cls.st = stats_reference.statistics_of(cls.ref, ANALYSIS["noise_samples"], ANALYSIS["noise_batch"],
                                               ANALYSIS["directions"], ANALYSIS["seed"])
        P = stats_reference.adam_preconditioner(os.path.join(ck, "adam.h5"))
        assert P is not None and stats_reference.adam_preconditioner(os.path.join(ck, "plain.h5")) is None
        cls.want = stats_reference.preconditioned_statistics(cls.ref, cls.st, P)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def check(self, policy, rel, method):
        r = gnhtest.run_gnh(self.deck, 2, [f"precision.policy={policy}", f"analysis.curvature_method={method}"])
        self.assertEqual(r.returncode, 0, r.stderr + r.stdout)
        w = self.want
        with h5py.File(os.path.join(self.tmp, "out", "p.h5"), "r") as f:
            self.assertEqual(int(f.attrs["identities_ok"]), 1)
            g = {}
            for h in f["groups"].values():
                g[gnhtest.text(h.attrs["aliases"][0])] = h
            self.assertEqual(gnhtest.text(g["adam.h5"].attrs["preconditioner"]), "AdamW state of adam.h5")
            self.assertIn("none: no AdamW state", gnhtest.text(g["plain.h5"].attrs["preconditioner"]))
            plain = g["plain.h5"]["seen"]
            for name in ("GPG", "PG_H_PG", "B_simple_P", "B_noise_P", "curvature_preconditioned"):
                self.assertNotIn(name, plain.attrs)
            self.assertNotIn("xiPxi", plain)
            c = g["adam.h5"]["seen"]
            self.assertLessEqual(abs(c.attrs["GPG"] - w["GPG"]), rel * w["GPG"])
            self.assertLessEqual(abs(c.attrs["PG_H_PG"] - w["PG_H_PG"]), rel * w["PG_H_PG_scale"])
            np.testing.assert_allclose(c["xiPxi"][()], w["xiPxi"], rtol=rel)
            self.assertTrue(np.all(np.abs(c["PxiHPxi"][()] - w["PxiHPxi"]) <= rel * w["PxiHPxi_scale"]))
            for name in ("B_simple_P", "B_noise_P", "curvature_preconditioned"):
                # Ratios of the forms above: a few times their bar, relative to the
                # value or its standard error, whichever is larger.
                scale = max(abs(w[name]), w.get(name + "_se", 0.0))
                self.assertLessEqual(abs(c.attrs[name] - w[name]), 10 * rel * scale * max(1.0, abs(w["PG_H_PG_scale"] / w["PG_H_PG"])), name)
            for name in ("B_simple_P_se", "B_noise_P_se"):
                self.assertLessEqual(abs(c.attrs[name] - w[name]), 10 * rel * max(w[name], abs(w[name[:-3]])) *
                                     max(1.0, abs(w["PG_H_PG_scale"] / w["PG_H_PG"])), name)
            b_simple_p = float(c.attrs["B_simple_P"])
        # The CSV table has the columns, empty for the state without AdamW state.
        with open(os.path.join(self.tmp, "out", "p.csv")) as f:
            rows = [l.rstrip("\n").split(",") for l in f]
        col = rows[0].index("B_simple_P")
        for name in ("B_noise_P", "curvature_preconditioned", "GPG", "PG_H_PG"):
            self.assertIn(name, rows[0])
        got = {r[0]: r[col] for r in rows[1:]}
        self.assertEqual(got["plain.h5"], "")
        self.assertEqual(float(got["adam.h5"]), b_simple_p)

    def test_fp64_forward_over_reverse(self):
        self.check("fp64", 1e-10, "forward-over-reverse")

    def test_bad_optimizer_state_fails_its_group_by_name(self):
        bad_dir = os.path.join(self.tmp, "bad")
        os.makedirs(bad_dir, exist_ok=True)
        bad = os.path.join(bad_dir, "bad.h5")
        shutil.copy(os.path.join(self.tmp, "ckpt", "adam.h5"), bad)
        name = "transformer.h.1.mlp.c_fc.weight"
        with h5py.File(bad, "r+") as f:
            d = f["optimizer/exp_avg_sq/" + name]
            v = d[()]
            v.reshape(-1)[7] = -1.0
            d[...] = v
        deck = os.path.join(self.tmp, "bad.toml")
        gnhtest.write_deck(deck, "out/bad.h5", ["bad/*.h5", "ckpt/plain.h5"], self.context, "train.bin",
                           analysis=ANALYSIS, extra="[curvature]\npreconditioned = true\n")
        r = gnhtest.run_gnh(deck, 1)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("bad.h5", r.stderr)
        self.assertIn(f"/optimizer/exp_avg_sq/{name}", r.stderr)
        self.assertIn("first at flat index 7", r.stderr)
        self.assertNotIn("Traceback", r.stderr)
        # The other group was computed and written.
        with h5py.File(os.path.join(self.tmp, "out", "bad.h5"), "r") as f:
            self.assertEqual([gnhtest.text(a) for g in f["groups"].values() for a in g.attrs["aliases"]], ["plain.h5"])

    def test_fp64_second_order_forward(self):
        self.check("fp64", 1e-10, "second-order-forward")

    def test_fp32(self):
        self.check("fp32", 1e-4, "second-order-forward")


if __name__ == "__main__":
    unittest.main()
