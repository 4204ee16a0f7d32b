#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
"""Parallel runs and fault tolerance of `gnh run`:
- 1, 2 and 3 ranks, and ranks_per_checkpoint = 2 (on 2 and 4 ranks), give
  bitwise-identical datasets and statistics;
- a run killed with SIGKILL mid-way and rerun ends with a file identical to an
  uninterrupted run's, recomputing only the unfinished groups, even where the
  rerun's own host GEMM probe would choose the other kernel (the campaign's
  recorded choice wins);
- SIGTERM finishes the current batch, records progress, exits with 143, and
  the rerun completes;
- a group whose loss is not finite fails alone: the other groups are written;
- --dry-run validates and plans without computing."""
import csv
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import unittest

import gnhtest
import h5py
import numpy as np

# Attributes that legitimately differ between runs (wall-clock times are in
# the `timings` datasets, also excluded).
VOLATILE = {"timings"}


def snapshot(path):
    """Every dataset and attribute under /groups, as comparable Python values."""
    out = {}
    with h5py.File(path, "r") as f:
        def visit(name, obj):
            if any(part in VOLATILE for part in name.split("/")):
                return
            for k, v in obj.attrs.items():
                a = np.asarray(v)
                if a.dtype.kind in "OSU":  # strings: compare the text, not object pointers
                    out[f"{name}@{k}"] = tuple(x.decode() if isinstance(x, bytes) else str(x) for x in a.reshape(-1))
                else:
                    out[f"{name}@{k}"] = a.tobytes()
            if isinstance(obj, h5py.Dataset):
                a = obj[()]
                if a.dtype.kind in "OSU":  # variable-length strings (block names): the text
                    out[name] = tuple(x.decode() if isinstance(x, bytes) else str(x) for x in a.reshape(-1))
                else:
                    out[name] = a.tobytes()
        f["groups"].visititems(visit)
    return out


class Parallel(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="gnh-par-")
        cfg = gnhtest.gnh_model.GPTConfig(n_layer=2, n_head=2, n_embd=16, block_size=16, vocab_size=41,
                                          bias=False, tie_embeddings=True, gelu="erf")
        ck = os.path.join(cls.tmp, "ckpt")
        os.makedirs(ck)
        for i in range(5):
            model = gnhtest.make_model(cfg, seed=i, scale=0.3)
            # Two states carry AdamW state (nanoGPT files after real steps), for [curvature] preconditioned.
            opt = gnhtest.train_adamw(model, steps=2, seed=i) if i in (1, 3) else None
            gnhtest.save_checkpoint(model, ck, f"ckpt_{i}", iter_num=i, optimizer=opt)
        shutil.copy(os.path.join(ck, "ckpt_4.h5"), os.path.join(ck, "final.h5"))
        gnhtest.write_tokens(os.path.join(cls.tmp, "train.bin"), 12 * 40 + 7, 41, 1)
        gnhtest.write_tokens(os.path.join(cls.tmp, "val.bin"), 12 * 15 + 1, 41, 2)
        cls.cfg = cfg

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def deck(self, name, output, checkpoints="ckpt/*.h5", analysis=None, curvature=False):
        """curvature: forward-over-reverse with SPEC §10's blocks and diagonal, and
        the Gauss-Newton operator beside the Hessian."""
        path = os.path.join(self.tmp, name)
        analysis = dict(dict(noise_samples=3, noise_batch=5, directions=3, directions_per_pass=3), **(analysis or {}))
        if curvature:
            analysis["curvature_method"] = "forward-over-reverse"
        gnhtest.write_deck(path, output, [checkpoints], 12, "train.bin", "val.bin", analysis=analysis)
        if curvature:
            with open(path, "a") as f:
                f.write("\n[curvature]\nblocks = true\ndiagonal = true\nupdate = true\npreconditioned = true\n"
                        'operator = "both"\n')
        return path

    def run_ok(self, deck, np_, sets=(), env=None, quiet=True):
        r = gnhtest.run_gnh(deck, np_, sets, env=env, quiet=quiet)
        self.assertEqual(r.returncode, 0, r.stderr + r.stdout)
        return r

    def test_rank_counts_and_layouts_are_bitwise_identical(self):
        self.check_layouts(False)

    def test_curvature_blocks_and_diagonal_are_bitwise_identical_across_layouts(self):
        self.check_layouts(True)

    def check_layouts(self, curvature):
        snaps = {}
        tag = "curv" if curvature else "plain"
        # The last layout computes the noise vectors again in the curvature
        # passes (each on the team member that computed it first, then shared
        # with the other) instead of keeping them: the same bits.
        for np_, rpc, noise in ((1, 1, "keep"), (2, 1, "keep"), (3, 1, "keep"), (2, 2, "keep"), (4, 2, "recompute")):
            out = f"out/layout_{tag}_{np_}_{rpc}_{noise}.h5"
            deck = self.deck(f"layout_{tag}_{np_}_{rpc}_{noise}.toml", out, analysis=dict(seed=5),
                             curvature=curvature)
            r = self.run_ok(deck, np_, [f"parallel.ranks_per_checkpoint={rpc}", f'parallel.noise_vectors="{noise}"'],
                            quiet=False)
            self.assertIn(f"the noise vectors {'kept' if noise == 'keep' else 'recomputed'}", r.stdout)
            snaps[(np_, rpc, noise)] = snapshot(os.path.join(self.tmp, out))
        base = snaps[(1, 1, "keep")]
        self.assertGreater(len(base), 50)
        if curvature:  # the SPEC §10 outputs are among the compared objects
            for name in ("seen/blocks/layer/trace_H", "seen/blocks/tensor/frob_H", "seen/hessian_diagonal",
                         "seen/Hv_sqnorm", "seen/update@dHd", "seen/update@measured_change", "seen/xiPxi",
                         "seen@B_noise_P", "seen/blocks/layer/trace_ggn", "seen/vGGNv", "seen@trace_ggn",
                         "seen@residual_share", "seen/blocks/layer/B_simple_seq_se", "seen/seq_grad_sqnorm",
                         "seen/seq_grad_sqnorm_counts", "seen@trace_sigma_seq_se",
                         "seen@consistency_noise_estimators_p_value"):
                self.assertTrue(any(k.endswith(name) for k in base), name)
            # The report's block table and per-layer figure (doc/outputs.md).
            rep = os.path.join(self.tmp, "report-curv")
            r, manifest = gnhtest.report(os.path.join(self.tmp, "out/layout_curv_1_1_keep.h5"), rep)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertEqual(manifest["figures"]["layers"]["panels"],
                             ["B_simple", "B_simple_seq", "trace_H", "trace_ggn"])
            self.assertEqual(manifest["figures"]["sequences"]["panels"], ["seq_grad_sqnorm", "B_simple_seq"])
            self.assertIn("effective_rank", manifest["figures"])
            self.assertEqual(manifest["figures"]["update"]["panels"], ["curvature_along", "change"])
            with open(os.path.join(rep, "blocks.csv")) as f:
                rows = list(csv.DictReader(f))
            # 5 states (final is an alias) x 2 cases x (n_layer + 2 layer blocks + the tensors).
            n_tensors = 2 + 6 * self.cfg.n_layer + 1  # no bias, tied: wte, wpe, 6 weights per layer, ln_f
            self.assertEqual(len(rows), 5 * 2 * ((self.cfg.n_layer + 2) + n_tensors))
            with h5py.File(os.path.join(self.tmp, "out/layout_curv_1_1_keep.h5"), "r") as f:
                g = next(iter(f["groups"].values()))
                want = g["seen/blocks/layer/trace_H"][()]
                hash_ = next(iter(f["groups"]))
            got = [float(r["trace_H"]) for r in rows if r["group"] == hash_ and r["case"] == "seen" and
                   r["partition"] == "layer"]
            self.assertEqual(got, want.tolist())
        for key, snap in snaps.items():
            with self.subTest(ranks=key[0], ranks_per_checkpoint=key[1], noise_vectors=key[2]):
                self.assertEqual(sorted(snap), sorted(base))
                diff = [k for k in base if snap[k] != base[k]]
                # The planned memory is all that recomputing may change (no
                # kept noise vectors, an exact sum and a batch gradient while
                # a pass is filled: which is more depends on the largest stage).
                planned = [k for k in diff if k.endswith("@peak_memory_bytes")] if key[2] == "recompute" else []
                self.assertEqual(sorted(set(diff) - set(planned)), [])

    def test_rerun_is_identical_and_skips_everything(self):
        deck = self.deck("rerun.toml", "out/rerun.h5")
        self.run_ok(deck, 2)
        first = snapshot(os.path.join(self.tmp, "out", "rerun.h5"))
        r = self.run_ok(deck, 2, ["run.name=rerun"])
        self.assertIn("computed 0, reused 5", r.stdout)
        self.assertEqual(snapshot(os.path.join(self.tmp, "out", "rerun.h5")), first)

    def _start_and_kill(self, deck, sig, after_groups, env=None):
        cmd = [gnhtest.MPIEXEC, "-np", "1", gnhtest.GNH, "run", deck, "--quiet"]
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env=env or gnhtest.mpi_env(), start_new_session=True)
        groups = os.path.join(self.tmp, "out", os.path.basename(deck).replace(".toml", ".groups"))
        deadline = time.time() + 120
        while time.time() < deadline:
            done = [f for f in os.listdir(groups) if f.endswith(".h5")] if os.path.isdir(groups) else []
            if len(done) >= after_groups:
                break
            time.sleep(0.05)
        # The signal reaches the rank itself (as Slurm delivers it); after
        # SIGKILL, mpirun goes too, so nothing runs on.
        name = "-KILL" if sig == signal.SIGKILL else "-TERM"
        subprocess.run(["pkill", name, "-f", f"^{gnhtest.GNH} run {deck}"], check=False)
        if sig == signal.SIGKILL:
            os.killpg(p.pid, signal.SIGKILL)
        out, err = p.communicate(timeout=120)
        return p.returncode, out, err, groups

    def test_sigkill_then_rerun(self):
        deck = self.deck("killed.toml", "out/killed.h5", analysis=dict(directions=6), curvature=True)
        ref_deck = self.deck("uninterrupted.toml", "out/uninterrupted.h5", analysis=dict(directions=6), curvature=True)
        pinned = gnhtest.mpi_env()
        pinned["GNH_HOST_GEMM"] = "vendor"
        self.run_ok(ref_deck, 1, env=pinned)
        # The killed run's probe chooses the vendor BLAS, the rerun's would
        # choose gnh's kernel: the rerun takes the campaign's recorded choice.
        rc, _, _, groups = self._start_and_kill(deck, signal.SIGKILL, 2, env=gnhtest.probe_env("vendor"))
        self.assertNotEqual(rc, 0)
        kept = sorted(f for f in os.listdir(groups) if f.endswith(".h5"))
        self.assertGreaterEqual(len(kept), 2)
        self.assertLess(len(kept), 5, "the run finished before it could be killed; make the campaign longer")
        self.assertFalse(os.path.exists(os.path.join(self.tmp, "out", "killed.h5")))
        r = self.run_ok(deck, 1, env=gnhtest.probe_env("native"), quiet=False)
        self.assertIn(f"computed {5 - len(kept)}, reused {len(kept)}", r.stdout)
        self.assertIn("gnh: host sgemm: vendor (recorded for this campaign on ", r.stdout)
        with open(os.path.join(self.tmp, "out", "killed.host-gemm.json")) as f:
            (record,) = json.load(f)["classes"].values()
        self.assertEqual((record["kernel"], record["recorded_by"], record["source"]), ("vendor", "gnh run", "probe"))
        self.assertEqual(record["probe"]["forced_by_test"], "vendor")
        self.assertEqual(snapshot(os.path.join(self.tmp, "out", "killed.h5")),
                         snapshot(os.path.join(self.tmp, "out", "uninterrupted.h5")))

    def test_sigterm_records_progress_and_resumes(self):
        deck = self.deck("termed.toml", "out/termed.h5", analysis=dict(directions=6))
        rc, _, err, groups = self._start_and_kill(deck, signal.SIGTERM, 1)
        self.assertEqual(rc, 143, err)
        self.assertIn("interrupted by SIGTERM", err)
        self.assertIn("run the same command again to resume", err)
        self.assertNotIn("Traceback", err)
        kept = [f for f in os.listdir(groups) if f.endswith(".h5")]
        self.assertLess(len(kept), 5)
        r = self.run_ok(deck, 1)
        self.assertIn(f"computed {5 - len(kept)}, reused {len(kept)}", r.stdout)
        self.assertTrue(os.path.exists(os.path.join(self.tmp, "out", "termed.h5")))

    def test_non_finite_loss_fails_one_group_only(self):
        d = os.path.join(self.tmp, "withbad")
        os.makedirs(d, exist_ok=True)
        for i in (0, 1):
            shutil.copy(os.path.join(self.tmp, "ckpt", f"ckpt_{i}.h5"), d)
        bad = gnhtest.make_model(self.cfg, seed=9)
        with gnhtest.torch.no_grad():
            # Finite weights whose logits overflow float: the loss is inf - inf.
            bad.transformer.ln_f.weight.fill_(3e38)
        gnhtest.save_checkpoint(bad, d, "ckpt_bad")
        deck = self.deck("withbad.toml", "out/withbad.h5", checkpoints="withbad/*.h5")
        r = gnhtest.run_gnh(deck, 2)
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
        self.assertIn("not finite", r.stderr)
        self.assertIn("ckpt_bad.h5", r.stderr)
        self.assertNotIn("MPI_ABORT", r.stderr)
        with h5py.File(os.path.join(self.tmp, "out", "withbad.h5"), "r") as f:
            aliases = sorted(a.decode() if isinstance(a, bytes) else a
                             for g in f["groups"].values() for a in g.attrs["aliases"])
            self.assertEqual(int(f.attrs["complete"]), 0)
            self.assertEqual([gnhtest.text(a) for a in f.attrs["missing_checkpoints"]], ["ckpt_bad.h5"])
        self.assertEqual(aliases, ["ckpt_0.h5", "ckpt_1.h5"])

    def test_no_samples_no_directions_writes_no_nan(self):
        deck = self.deck("bare.toml", "out/bare.h5", analysis=dict(noise_samples=0, directions=0))
        self.run_ok(deck, 1)
        with h5py.File(os.path.join(self.tmp, "out", "bare.h5"), "r") as f:
            for g in f["groups"].values():
                for c in g.values():
                    for k, v in c.attrs.items():
                        if np.asarray(v).dtype.kind == "f":
                            self.assertTrue(np.all(np.isfinite(v)), k)
                    # Absent estimates have absent standard errors, not 0.
                    for name in ("trace_H", "B_simple", "B_noise", "trace_sigma", "trace_HSigma"):
                        self.assertNotIn(name, c.attrs)
                        self.assertNotIn(name + "_se", c.attrs)
                    self.assertIn("eps_star", c.attrs)
                    self.assertEqual(c["vHv"].shape, (0,))
                    self.assertEqual(c["noise_blocks"].shape[0], 0)

    def test_balanced_passes_give_the_same_quadratic_forms(self):
        # 1 + 3 + 5 = 9 directions: one pass of 9, passes of 5 + 4 (at most 8;
        # before, 8 + 1 padded to 8), 3 + 3 + 3, and nine of 1. Each direction's
        # arithmetic is independent of the others in its pass (GEMM rows are
        # computed alike whatever rows surround them; per-plane reductions), so
        # the forms are equal bit for bit. The second-order forward's adjoint
        # cuts (chosen by the pass width unless GNH_ADJOINT_CUTS pins them)
        # regroup its sums: bitwise within each setting, to rounding across.
        forms = {}
        for method, cuts in (("second-order-forward", "0"), ("second-order-forward", "1"),
                             ("forward-over-reverse", None)):
            forms[cuts] = {}
            old = os.environ.pop("GNH_ADJOINT_CUTS", None)
            if cuts is not None:
                os.environ["GNH_ADJOINT_CUTS"] = cuts
            try:
                for k in (9, 8, 3, 1):
                    out = f"out/k{k}-{method}-{cuts}.h5"
                    deck = self.deck(f"k{k}.toml", out,
                                     analysis=dict(noise_samples=3, directions=5, directions_per_pass=k,
                                                   curvature_method=method))
                    self.run_ok(deck, 1)
                    if k == 8:
                        dry = subprocess.run([gnhtest.MPIEXEC, "-np", "1", gnhtest.GNH, "run", deck, "--dry-run"],
                                             capture_output=True, text=True, env=gnhtest.mpi_env(), timeout=120)
                        self.assertIn("9 curvature directions in 2 epoch pass(es) (1x5 + 1x4 directions)", dry.stdout)
                    with h5py.File(os.path.join(self.tmp, out), "r") as f:
                        forms[cuts][k] = {(h, c): (f["groups"][h][c].attrs["GHG"],
                                                   f["groups"][h][c]["xiHxi"][()].tobytes(),
                                                   f["groups"][h][c]["vHv"][()].tobytes())
                                          for h in f["groups"] for c in f["groups"][h]}
            finally:
                os.environ.pop("GNH_ADJOINT_CUTS", None)
                if old is not None:
                    os.environ["GNH_ADJOINT_CUTS"] = old
            for k in (8, 3, 1):
                self.assertEqual(forms[cuts][k], forms[cuts][9], (method, cuts, k))
        # With and without cuts: the same forms to float rounding (the
        # float-against-double bar of the derivative oracle, 1e-4), and not
        # the same bits (the cuts ran).
        plain, cut = forms["0"][9], forms["1"][9]
        self.assertEqual(plain.keys(), cut.keys())
        differ = 0
        for key in plain:
            a = np.frombuffer(plain[key][2], dtype=np.float64)
            b = np.frombuffer(cut[key][2], dtype=np.float64)
            # Relative to the largest form of the case: a Rademacher form can nearly cancel.
            np.testing.assert_allclose(b, a, rtol=0, atol=1e-4 * np.abs(a).max(), err_msg=str(key))
            self.assertLessEqual(abs(cut[key][0] - plain[key][0]), 1e-4 * abs(plain[key][0]), key)
            differ += plain[key][2] != cut[key][2]
        self.assertGreater(differ, 0)

    def test_one_sample_has_no_standard_error(self):
        deck = self.deck("single.toml", "out/single.h5", analysis=dict(noise_samples=1, directions=1))
        self.run_ok(deck, 1)
        with h5py.File(os.path.join(self.tmp, "out", "single.h5"), "r") as f:
            self.assertEqual(int(f.attrs["complete"]), 1)
            self.assertEqual(len(f.attrs["missing_checkpoints"]), 0)
            for g in f["groups"].values():
                for c in g.values():
                    for name in ("trace_H", "B_simple", "B_noise"):
                        self.assertTrue(np.isfinite(c.attrs[name]), name)
                        self.assertNotIn(name + "_se", c.attrs)

    def test_dry_run_plans_without_computing(self):
        deck = self.deck("dry.toml", "out/dry.h5")
        self.run_ok(deck, 2)
        cmd = [gnhtest.MPIEXEC, "-np", "2", gnhtest.GNH, "run", deck, "--dry-run"]
        os.remove(os.path.join(self.tmp, "out", "dry.h5"))
        shutil.rmtree(os.path.join(self.tmp, "out", "dry.groups"))
        r = subprocess.run(cmd, capture_output=True, text=True, env=gnhtest.mpi_env(), timeout=120)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("plan: 5 group(s)", r.stdout)
        self.assertIn("3 noise batches of 5", r.stdout)
        self.assertIn("dry run", r.stdout)
        self.assertFalse(os.path.exists(os.path.join(self.tmp, "out", "dry.h5")))
        self.assertFalse(os.path.exists(os.path.join(self.tmp, "out", "dry.groups")))

    def test_too_few_blocks_for_noise_batches(self):
        deck = self.deck("short.toml", "out/short.h5", analysis=dict(noise_batch=15))
        r = gnhtest.run_gnh(deck, 2)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("val.bin", r.stderr)
        self.assertIn("too few for noise batches of 15", r.stderr)


class ParameterShards(unittest.TestCase):
    """parallel.parameter_shards: a team's members in shard groups of R, each
    holding a slice of every vector of the analysis (doc/sharding.md), give the
    bits of R = 1: every output but the planned memory per rank, which
    shrinks; with the AdamW preconditioner read by slices, its spectrum
    (P^1/2 H P^1/2) and the Hutch++ traces."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="gnh-par-shards-")
        # 34208 parameters: 9 chunks of the dot product (4096), so that 2 and
        # 3 slices each hold several and their cuts fall inside tensors.
        cfg = gnhtest.gnh_model.GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=16, vocab_size=257,
                                          bias=True, tie_embeddings=True, gelu="erf")
        ck = os.path.join(cls.tmp, "ckpt")
        os.makedirs(ck)
        for i in range(2):  # AdamW state and a next state: the preconditioned directions and the update
            model = gnhtest.make_model(cfg, seed=i, scale=0.3)
            gnhtest.save_checkpoint(model, ck, f"ckpt_{i}", iter_num=i,
                                    optimizer=gnhtest.train_adamw(model, steps=2, seed=i))
        cls.P = sum(p.numel() for p in gnhtest.make_model(cfg, seed=0).parameters())
        gnhtest.write_tokens(os.path.join(cls.tmp, "train.bin"), 12 * 40 + 7, 257, 1)
        cls.deck = os.path.join(cls.tmp, "deck.toml")
        gnhtest.write_deck(cls.deck, "out/r.h5", ["ckpt/*.h5"], 12, "train.bin",
                           analysis=dict(noise_samples=3, noise_batch=5, directions=3, directions_per_pass=3,
                                         curvature_method="forward-over-reverse", seed=5))
        with open(cls.deck, "a") as f:
            f.write("\n[curvature]\nblocks = true\ndiagonal = true\nupdate = true\npreconditioned = true\n"
                    'operator = "both"\nlanczos_steps = 4\nlanczos_chains = 2\nlanczos_operator = "PHP"\n')

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def run_layout(self, name, np_, rpc, R, sets=()):
        out = f"out/{name}.h5"
        r = gnhtest.run_gnh(self.deck, np_, [f"parallel.ranks_per_checkpoint={rpc}", f"parallel.parameter_shards={R}",
                                             f"run.output={out}", *sets])
        self.assertEqual(r.returncode, 0, r.stderr + r.stdout)
        path = os.path.join(self.tmp, out)
        with h5py.File(path, "r") as f:
            self.assertEqual(int(f.attrs["parameter_shards"]), R)
            bounds = list(f.attrs["parameter_shard_bounds"])
        self.assertEqual(len(bounds), R + 1)
        self.assertEqual((bounds[0], bounds[-1]), (0, self.P))
        self.assertTrue(all(b % 4096 == 0 for b in bounds[1:-1]), bounds)
        snap = snapshot(path)
        memory = {k: np.frombuffer(v, dtype=np.int64)[0] for k, v in snap.items() if k.endswith("@peak_memory_bytes")}
        return {k: v for k, v in snap.items() if k not in memory}, memory

    def test_shard_groups_give_the_bits_of_whole_vectors(self):
        base, whole_memory = self.run_layout("whole", 1, 1, 1)
        for name in ("seen/blocks/layer/trace_H", "seen/blocks/tensor/frob_H", "seen/hessian_diagonal",
                     "seen/Hv_sqnorm", "seen/update@dHd", "seen/xiPxi", "seen/blocks/layer/trace_ggn",
                     "seen/seq_grad_sqnorm", "seen@B_noise_P", "seen/spectrum/ritz_values", "seen@trace_H_hutchpp",
                     "seen/blocks/layer/trace_H_hutchpp"):
            self.assertTrue(any(k.endswith(name) for k in base), name)
        # Two groups of two on four ranks (the slices' sums over the
        # replicas), three slices with the noise vectors computed again.
        for np_, rpc, R, noise in ((2, 2, 2, "keep"), (3, 3, 3, "recompute"), (4, 4, 2, "keep")):
            with self.subTest(ranks=np_, parameter_shards=R, noise_vectors=noise):
                snap, memory = self.run_layout(f"r{np_}_{R}", np_, rpc, R, [f'parallel.noise_vectors="{noise}"'])
                self.assertEqual([k for k in base if snap.get(k) != base[k]], [])
                self.assertEqual(sorted(snap), sorted(base))
                if noise == "keep":
                    self.assertTrue(all(memory[k] < whole_memory[k] for k in memory), (memory, whole_memory))
        self.killed_and_resumed(base)
        # The second-order forward in float64 (its passes scatter nothing).
        fp64 = ["precision.policy=fp64", 'analysis.curvature_method="second-order-forward"', "curvature.lanczos_steps=0"]
        base, _ = self.run_layout("whole_sof", 1, 1, 1, fp64)
        snap, _ = self.run_layout("r2_sof", 2, 2, 2, fp64)
        self.assertEqual([k for k in base if snap.get(k) != base[k]], [])

    def killed_and_resumed(self, base):
        """A sharded run killed after its first group and run again: base's bits."""
        sets = ["--set", "parallel.ranks_per_checkpoint=2", "--set", "parallel.parameter_shards=2", "--set",
                "run.output=out/killed.h5"]
        cmd = [gnhtest.MPIEXEC, "-np", "2", gnhtest.GNH, "run", self.deck, "--quiet", *sets]
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=gnhtest.mpi_env(),
                             start_new_session=True)
        groups = os.path.join(self.tmp, "out", "killed.groups")
        deadline = time.time() + 120
        while time.time() < deadline and not (os.path.isdir(groups) and
                                              any(f.endswith(".h5") for f in os.listdir(groups))):
            time.sleep(0.02)
        subprocess.run(["pkill", "-KILL", "-f", f"^{gnhtest.GNH} run {self.deck}"], check=False)
        os.killpg(p.pid, signal.SIGKILL)
        p.communicate(timeout=120)
        with h5py.File(os.path.join(self.tmp, "out", "whole.h5"), "r") as f:
            n_groups = len(f["groups"])
        done = sorted(f for f in os.listdir(groups) if f.endswith(".h5"))
        # Where the kill came after the last group (a fast machine), one group
        # file goes, so that the rerun still has a group to compute.
        if len(done) == n_groups:
            os.remove(os.path.join(groups, done[-1]))
        snap, _ = self.run_layout("killed", 2, 2, 2)
        self.assertEqual([k for k in base if snap.get(k) != base[k]], [])


class FamilyLayouts(unittest.TestCase):
    """The Llama and GPT-NeoX families (SPEC section 11) through every layout:
    1 rank, 2 ranks, and ranks_per_checkpoint = 2 on 2 ranks (its vectors in
    two parameter shards) and 4 ranks give bitwise-identical results, the curvature blocks,
    the update, the spectrum with its eigenvectors and the per-layer spectra
    included; the report draws them; `gnh plan` writes the campaign's Slurm
    shards, whose runs merge into the same bits; and a run killed mid-way
    completes on rerun with the uninterrupted run's bits."""

    CONFIGS = {
        "llama": dict(family="llama", vocab_size=41, hidden_size=16, intermediate_size=24, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=1, head_dim=6, max_position_embeddings=16,
                      norm_eps=1e-5, rope_theta=100.0, hidden_act="silu", qkv_bias=True),
        "gpt-neox": dict(family="gpt-neox", vocab_size=41, hidden_size=16, intermediate_size=32,
                         num_hidden_layers=2, num_attention_heads=2, max_position_embeddings=16, norm_eps=1e-5,
                         rope_theta=100.0, rotary_pct=0.25, use_parallel_residual=False, hidden_act="gelu_new",
                         qkv_bias=True),
    }

    @classmethod
    def setUpClass(cls):
        import gnh_families
        import gnh_hf
        from gnh_layout import HFConfig
        cls.tmp = tempfile.mkdtemp(prefix="gnh-par-family-")
        for fam, kw in cls.CONFIGS.items():
            d = os.path.join(cls.tmp, fam)
            os.makedirs(os.path.join(d, "ckpt"))
            cfg = HFConfig(**kw)
            for i in range(3):
                model = gnh_families.init_random(gnh_families.CausalLM(cfg).double(), 20 + i, 0.3)
                hf = os.path.join(d, "hf", f"step{i + 1}")
                gnh_hf.save_dir(hf, cfg, {n: t.numpy().astype(np.float32)
                                          for n, t in gnh_families.canonical_state(model).items()})
                gnhtest.gnh_convert.convert(hf, os.path.join(d, "ckpt", f"step{i + 1}.h5"),
                                            gnhtest.gnh_convert.default_options())
            gnhtest.write_tokens(os.path.join(d, "train.bin"), 12 * 30 + 7, 41, 1)
            deck = os.path.join(d, "deck.toml")
            gnhtest.write_deck(deck, "out/r.h5", ["ckpt/*.h5"], 12, "train.bin",
                               analysis=dict(noise_samples=3, noise_batch=5, directions=3, directions_per_pass=3,
                                             curvature_method="forward-over-reverse", seed=5))
            with open(deck, "a") as f:
                f.write("\n[curvature]\nblocks = true\ndiagonal = true\nupdate = true\nlanczos_steps = 4\n"
                        'eigenvectors = 2\nspectrum_blocks = "layer"\noperator = "both"\n')

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def test_layouts_report_and_resume(self):
        for fam in self.CONFIGS:
            d = os.path.join(self.tmp, fam)
            deck = os.path.join(d, "deck.toml")
            snaps = {}
            # (2, 2) as one shard group of two (parallel.parameter_shards).
            for np_, rpc in ((1, 1), (2, 1), (2, 2), (4, 2)):
                out = f"out/r_{np_}_{rpc}.h5"
                shards = 2 if (np_, rpc) == (2, 2) else 1
                r = gnhtest.run_gnh(deck, np_, [f"parallel.ranks_per_checkpoint={rpc}", f"run.output={out}",
                                                f"parallel.parameter_shards={shards}"])
                self.assertEqual(r.returncode, 0, r.stderr + r.stdout)
                snaps[(np_, rpc)] = snapshot(os.path.join(d, out))
            base = snaps[(1, 1)]
            for name in ("seen/blocks/layer/trace_H", "seen/update@dHd", "seen/spectrum/eigenvectors",
                         "seen/spectrum_blocks/h.1/ritz_values", "seen/hessian_diagonal", "seen@trace_ggn"):
                self.assertTrue(any(k.endswith(name) for k in base), (fam, name))
            for key, snap in snaps.items():
                with self.subTest(family=fam, ranks=key[0], ranks_per_checkpoint=key[1]):
                    diff = [k for k in base if snap.get(k) != base[k]]
                    # The sharded layout plans less memory per rank, and computes the same bits.
                    planned = [k for k in diff if k.endswith("@peak_memory_bytes")] if key == (2, 2) else []
                    self.assertEqual(bool(planned), key == (2, 2))
                    self.assertEqual(sorted(set(diff) - set(planned)), [])
            with h5py.File(os.path.join(d, "out/r_1_1.h5"), "r") as f:
                g = next(iter(f["groups"].values()))
                names = [gnhtest.text(n) for n in g["seen/blocks/layer/names"][()]]
                self.assertEqual(names, ["embed", "h.0", "h.1", "head"])
            r, manifest = gnhtest.report(os.path.join(d, "out/r_1_1.h5"), os.path.join(d, "report"))
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertIn("layer_spectra", manifest["figures"])
            # The campaign planned as two Slurm shards, each run alone, then merged: the same bits.
            env = gnhtest.mpi_env()
            r = subprocess.run([gnhtest.GNH, "plan", deck, "--jobs", "2", "--time", "00:10:00"], capture_output=True,
                               text=True, env=env)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertTrue(os.path.exists(os.path.join(d, "out", "r.plan", "shard-1.sbatch")))
            shards = []
            for i in range(2):
                r = subprocess.run(
                    [gnhtest.MPIEXEC, "-np", "1", gnhtest.GNH, "run", deck, "--quiet", "--shard", f"{i}/2", "--set",
                     "run.output=out/sharded.h5"], capture_output=True, text=True, env=env, timeout=300)
                self.assertEqual(r.returncode, 0, r.stderr)
                shards.append(os.path.join(d, "out", f"sharded.shard-{i}-of-2.h5"))
            merged = os.path.join(d, "out", "merged.h5")
            r = subprocess.run([gnhtest.GNH, "merge", merged, *shards], capture_output=True, text=True, env=env)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertEqual(snapshot(merged), base)
            # Killed after the first group, then rerun: the uninterrupted run's bits.
            out = os.path.join(d, "out", "killed.h5")
            cmd = [gnhtest.MPIEXEC, "-np", "1", gnhtest.GNH, "run", deck, "--quiet", "--set", "run.output=out/killed.h5"]
            p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=gnhtest.mpi_env(),
                                 start_new_session=True)
            groups = os.path.join(d, "out", "killed.groups")
            deadline = time.time() + 120
            while time.time() < deadline and not (os.path.isdir(groups) and
                                                  any(f.endswith(".h5") for f in os.listdir(groups))):
                time.sleep(0.05)
            # The rank itself, as Slurm delivers the signal, then mpirun.
            subprocess.run(["pkill", "-KILL", "-f", f"^{gnhtest.GNH} run {deck}"], check=False)
            os.killpg(p.pid, signal.SIGKILL)
            p.communicate(timeout=120)
            r = gnhtest.run_gnh(deck, 2, ["run.output=out/killed.h5"])
            self.assertEqual(r.returncode, 0, r.stderr + r.stdout)
            self.assertEqual(snapshot(out), base)


if __name__ == "__main__":
    unittest.main()
