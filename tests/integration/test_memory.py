#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
"""Measured time and memory in every output, and memory-fit planning
(doc/outputs.md, doc/deck.md "Memory"):
- every stage's batch-time spread (median, p10, p90), per-direction times
  for the passes with directions, and the host high-water mark per stage are
  attributes of each case's `timings`; the high-water mark covers the planned
  buffers, which the run allocates and touches, and every stage's Kokkos
  allocations stay within the plan (both curvature methods);
- a plan over 90% of the memory budget is refused before anything is
  computed, naming the deck keys to lower;
- --fit-memory picks the largest directions_per_pass, then hvp_batch, that
  fit: one block more per HVP batch is refused under the same budget;
- analysis.per_sequence takes one sequence apart a reverse on a host and the
  microbatch's sequences in one reverse on the GPU's path, and plans so."""
import os
import re
import shutil
import subprocess
import tempfile
import unittest

import gnhtest
import h5py

STAGES = ("gradient", "noise", "curvature", "update", "spectrum")


class Memory(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="gnh-memory-")
        cfg = gnhtest.gnh_model.GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=16, vocab_size=101, bias=False,
                                          tie_embeddings=True, gelu="erf")
        ck = os.path.join(cls.tmp, "ckpt")
        os.makedirs(ck)
        for i in (1, 2):
            gnhtest.save_checkpoint(gnhtest.make_model(cfg, seed=i), ck, f"c{i}", iter_num=i)
        gnhtest.write_tokens(os.path.join(cls.tmp, "train.bin"), 16 * 30 + 1, 101, 1)
        cls.deck = os.path.join(cls.tmp, "deck.toml")
        gnhtest.write_deck(cls.deck, "out/m.h5", ["ckpt/*.h5"], 16, "train.bin",
                           analysis=dict(curvature_method="forward-over-reverse", directions=3, noise_samples=3,
                                         noise_batch=4, hvp_batch=4, directions_per_pass=3),
                           extra="[curvature]\nupdate = true\nlanczos_steps = 3\nlanczos_chains = 2\n")

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def gnh(self, *args, np_=1, gpu_shaped=None):
        env = gnhtest.mpi_env()
        if gpu_shaped is not None:  # the GPU's path on this host, or not
            env["GNH_GPU_SHAPED"] = "1" if gpu_shaped else "0"
        return subprocess.run([gnhtest.MPIEXEC, "-np", str(np_), gnhtest.GNH, "run", self.deck, "--quiet", *args],
                              capture_output=True, text=True, env=env, timeout=300)

    def test_every_stage_is_measured(self):
        # With landscapes: their stage's allocations within the plan too.
        r = self.gnh("--set", 'landscape.directions=["gradient", "update", "random:1"]', "--set", "landscape.points=3",
                     "--set", 'landscape.plane=["gradient", "random:2"]', "--set", "landscape.plane_points=3", np_=2)
        self.assertEqual(r.returncode, 0, r.stderr)
        with h5py.File(os.path.join(self.tmp, "out", "m.h5"), "r") as f:
            g = f["groups"][sorted(f["groups"], key=lambda h: int(f["groups"][h].attrs["iter_num"]))[0]]
            c = g["seen"]
            t = c["timings"].attrs
            blocks = int(c.attrs["n_blocks"])
            for stage in STAGES:
                with self.subTest(stage=stage):
                    self.assertGreater(t[f"{stage}_batches"], 0)
                    med, p10, p90 = (t[f"{stage}_batch_seconds_{q}"] for q in ("median", "p10", "p90"))
                    self.assertTrue(0 < p10 <= med <= p90, (p10, med, p90))
                    # The resident high-water mark over the stage holds at
                    # least the planned engines and vectors, all touched.
                    self.assertGreaterEqual(t[f"{stage}_peak_host_bytes"], c.attrs["peak_memory_bytes"])
            self.plan_holds_the_allocations(f)
            self.assertIn("landscape_peak_allocated_bytes", t)
            # The random directions' curvature pass, then three lines and a
            # plane, each staging every batch once for all its points.
            self.assertEqual(t["landscape_batches"], 5 * -(-blocks // 4))
            # Batches counted over the whole team: the epoch's microbatches.
            self.assertEqual(t["gradient_batches"], -(-blocks // 4))
            self.assertEqual(t["noise_batches"], 3)
            # One pass of G, 3 noise vectors, 3 directions and Delta: 8 directions in 3 passes of <= 3.
            self.assertEqual(t["curvature_batches"], 3 * -(-blocks // 4))
            self.assertIn("curvature_direction_seconds_median", t)
            self.assertIn("spectrum_direction_seconds_median", t)
            self.assertEqual(t["spectrum_batches"], 3 * -(-blocks // 4))

    def plan_holds_the_allocations(self, f):
        # What every stage allocated through Kokkos (engines, vectors,
        # staging, scratch: counted by Kokkos's allocation callbacks, exact
        # byte counts) stays within the plan of its stage's case.
        for h, g in f["groups"].items():
            for cname, c in g.items():
                t = c["timings"].attrs
                stages = [k for k in t if k.endswith("_peak_allocated_bytes")]
                self.assertIn("checks_peak_allocated_bytes", stages)
                for k in stages:
                    self.assertLessEqual(t[k], c.attrs["peak_memory_bytes"], (h, cname, k))

    def test_second_order_plan_with_recomputed_noise_holds_its_allocations(self):
        # The other path: the second-order forward, noise vectors recomputed
        # in the curvature passes (an exact sum and a batch gradient more there).
        r = self.gnh("--set", 'analysis.curvature_method="second-order-forward"', "--set",
                     'parallel.noise_vectors="recompute"', "--set", "curvature.lanczos_steps=0", "--set",
                     "curvature.update=false", "--set", "analysis.noise_samples=7", "--set",
                     "analysis.directions_per_pass=5", "--set", 'run.output="out/sof.h5"')
        self.assertEqual(r.returncode, 0, r.stderr)
        with h5py.File(os.path.join(self.tmp, "out", "sof.h5"), "r") as f:
            self.plan_holds_the_allocations(f)

    def test_the_gradient_and_curvature_engines_are_never_held_together(self):
        # Whole-epoch batches (30 blocks) make the engines outweigh the
        # vectors: the curvature stage, which starts with the gradient engine
        # of the noise batches, allocates less than the two engines' planned
        # bytes together, and the plan, which counts the larger, holds it.
        sets = ["--set", "curvature.lanczos_steps=0", "--set", "curvature.update=false", "--set",
                'curvature.trace_estimator="hutchinson"', "--set", "analysis.directions=1", "--set",
                "analysis.directions_per_pass=1", "--set", "analysis.grad_microbatch=30", "--set",
                "analysis.hvp_batch=30", "--set", "analysis.noise_samples=1", "--set", "analysis.noise_batch=1",
                "--set", 'run.output="out/engines.h5"']
        r = self.gnh("--dry-run", *sets)
        self.assertEqual(r.returncode, 0, r.stderr)
        m = re.search(r"gradient engine ([0-9.e+-]+) GiB, curvature engine \(K = 1\) ([0-9.e+-]+) GiB", r.stdout)
        self.assertIsNotNone(m, r.stdout)
        # Printed to 3 significant digits: 0.5% each.
        both = (float(m.group(1)) + float(m.group(2))) * 2 ** 30 * 0.995
        r = self.gnh(*sets)
        self.assertEqual(r.returncode, 0, r.stderr)
        with h5py.File(os.path.join(self.tmp, "out", "engines.h5"), "r") as f:
            self.plan_holds_the_allocations(f)
            for g in f["groups"].values():
                self.assertLess(g["seen"]["timings"].attrs["curvature_peak_allocated_bytes"], both)

    def test_a_plan_over_the_budget_is_refused_naming_the_keys(self):
        r = self.gnh("--dry-run", "--set", "analysis.hvp_batch=100000000")
        self.assertNotEqual(r.returncode, 0)
        self.assertNotIn("Traceback", r.stderr)
        for key in ("analysis.hvp_batch (now 100000000)", "analysis.directions_per_pass (now 3)",
                    "analysis.grad_microbatch", "--fit-memory", "90% of the host's",
                    # the largest item: the deck's spectrum, which runs beside the
                    # curvature engine of 10^8 blocks a batch
                    "its largest stage, the spectrum: engines "):
            self.assertIn(key, r.stderr)
        self.assertFalse(os.path.exists(os.path.join(self.tmp, "out", "m.groups", "x")))

    def test_fit_memory_picks_the_largest_that_fits(self):
        budget = "12MB"
        r = self.gnh("--dry-run", "--memory-budget", budget, "--fit-memory")
        self.assertEqual(r.returncode, 0, r.stderr)
        m = re.search(r"directions_per_pass = (\d+), analysis.hvp_batch = (\d+)", r.stdout)
        self.assertIsNotNone(m, r.stdout)
        K, B = int(m.group(1)), int(m.group(2))
        self.assertGreaterEqual(K, 1)
        self.assertLess(B, 30, "the budget should bind the batch")
        # The fitted plan passes the check; one block more per batch does not.
        r = self.gnh("--dry-run", "--memory-budget", budget, "--set", f"analysis.directions_per_pass={K}",
                     "--set", f"analysis.hvp_batch={B}")
        self.assertEqual(r.returncode, 0, r.stderr)
        r = self.gnh("--dry-run", "--memory-budget", budget, "--set", f"analysis.directions_per_pass={K}",
                     "--set", f"analysis.hvp_batch={B + 1}")
        self.assertNotEqual(r.returncode, 0)
        self.assertIn(f"analysis.hvp_batch (now {B + 1})", r.stderr)
        r = self.gnh("--memory-budget", "1kB", "--fit-memory")
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("even one direction per pass, one block per HVP batch and per gradient microbatch", r.stderr)

    def test_fit_memory_chooses_the_fewest_parameter_shards(self):
        # Where the vectors set the peak (no spectrum or Hutch++ sketch), on a
        # team of two: a budget between the plans of one and two shards at one direction a pass and one block a
        # batch is refused at one shard, naming two, and --fit-memory takes two
        # (and the deck's grad_microbatch).
        sets = ["--set", "curvature.lanczos_steps=0", "--set", 'curvature.trace_estimator="hutchinson"', "--set",
                "parallel.ranks_per_checkpoint=2", "--set", "analysis.grad_microbatch=4", "--set",
                'parallel.noise_vectors="keep"', "--set", "analysis.directions_per_pass=1", "--set",
                "analysis.hvp_batch=1"]
        planned = {}  # what the refusal of a tiny budget says each needs
        for R in (1, 2):
            r = self.gnh("--dry-run", *sets, "--set", f"parallel.parameter_shards={R}", "--memory-budget", "1kB",
                         np_=2)
            planned[R] = float(re.search(r"the plan needs ([0-9.e+-]+) GiB per rank", r.stderr).group(1))
        self.assertLess(planned[2], 0.95 * planned[1], planned)
        # 90% of the budget, shared by the node's two ranks, halfway between.
        budget = str(int((planned[1] + planned[2]) / 2 * 2 ** 30 * 2 / 0.9))
        r = self.gnh("--dry-run", *sets, "--memory-budget", budget, np_=2)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("set parallel.parameter_shards = 2 (each rank then holds a slice", r.stderr)
        r = self.gnh("--dry-run", *sets, "--memory-budget", budget, "--fit-memory", np_=2)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("analysis.grad_microbatch = 4, parallel.parameter_shards = 2", r.stdout)

    def test_vector_count_is_fixed_when_noise_vectors_are_recomputed(self):
        # The plan's parameter-sized vectors at its largest stage: recomputed
        # noise vectors, the count stays as noise_samples (3 -> 7,
        # the most 30 blocks give batches of 4) and directions (3 -> 40) grow.
        def count(noise, samples, directions, *sets):
            r = self.gnh("--dry-run", "--set", f'parallel.noise_vectors="{noise}"', "--set",
                         f"analysis.noise_samples={samples}", "--set", f"analysis.directions={directions}", *sets)
            self.assertEqual(r.returncode, 0, r.stderr)
            m = re.findall(r"vectors [0-9.e+-]+ GiB \((\d+) parameter-sized, the noise vectors (\w+):", r.stdout)
            self.assertTrue(m, r.stdout)
            self.assertEqual({w for _, w in m}, {"kept" if noise == "keep" else "recomputed"})
            return {int(n) for n, _ in m}
        fixed = count("recompute", 3, 3)
        self.assertEqual(len(fixed), 1)
        # Hutch++'s sketch (the default here) too: at most a pass wide.
        self.assertEqual(count("recompute", 7, 40), fixed)
        # Without Hutch++, recomputed: fixed too; kept, each noise sample adds
        # its vector (at the curvature passes, the largest stage so).
        plain = ("--set", 'curvature.trace_estimator="hutchinson"')
        fixed = count("recompute", 3, 3, *plain)
        self.assertEqual(count("recompute", 7, 40, *plain), fixed)
        self.assertEqual(count("keep", 7, 3, *plain), {n + 7 - 3 for n in count("keep", 3, 3, *plain)})

    def test_advice_names_only_settings_above_their_least(self):
        # Every batch setting at 1 (and the noise vectors already recomputed):
        # nothing of them to lower, and the refusal says so.
        r = self.gnh("--dry-run", "--memory-budget", "1kB", "--fit-memory", "--set", "analysis.grad_microbatch=1")
        self.assertNotEqual(r.returncode, 0)
        self.assertNotIn("grad_microbatch (now 1)", r.stderr)
        self.assertIn("every batch setting is at 1", r.stderr)
        self.assertNotIn("noise_vectors", r.stderr)
        # Kept noise vectors, one block a batch: only the noise vectors and
        # the Lanczos chains are named; the noise vectors where recomputing
        # them plans less. A recomputed noise vector's exact sum and batch
        # gradient live while a pass's directions are filled by the gradient
        # engine, not in the pass: recomputing frees the 7 kept vectors at the
        # spectrum (the largest stage, one direction a pass). With the second
        # order's passes of 6 directions, no spectrum and one noise sample, the
        # filling (6 directions, the sum and the batch gradient) outweighs the
        # one kept vector, and recomputing is not advised.
        one = ("--set", "analysis.directions_per_pass=1")
        wide = ("--set", "analysis.directions_per_pass=9", "--set", 'analysis.curvature_method="second-order-forward"',
                "--set", "curvature.lanczos_steps=0", "--set", 'curvature.trace_estimator="hutchinson"')
        for samples, sets, advised in ((7, one, True), (1, wide, False)):
            r = self.gnh("--dry-run", "--memory-budget", "1kB", "--set", 'parallel.noise_vectors="keep"', "--set",
                         "analysis.grad_microbatch=1", "--set", "analysis.hvp_batch=1", *sets, "--set",
                         f"analysis.noise_samples={samples}")
            self.assertNotEqual(r.returncode, 0)
            self.assertNotIn("(now 1)", r.stderr)
            self.assertEqual('set parallel.noise_vectors = "recompute"' in r.stderr, advised, r.stderr)
            if advised:
                self.assertIn("lower curvature.lanczos_chains (now 2) or curvature.lanczos_steps (now 3)", r.stderr)
                self.assertNotIn("--fit-memory", r.stderr)

    def test_per_sequence_grouping_follows_the_path(self):
        # The dry run names the sequences whose gradients one reverse takes
        # apart: an engine of one sequence on a host build; on the GPU's path
        # (GNH_GPU_SHAPED=1 runs it here) the gradient engine itself, the
        # whole microbatch of 4 at once, its 4 gradients planned.
        found = {}
        for shaped in ("0", "1"):
            r = self.gnh("--dry-run", "--set", "analysis.grad_microbatch=4", gpu_shaped=shaped == "1")
            self.assertEqual(r.returncode, 0, r.stderr)
            m = re.findall(r"per-sequence norms [0-9.]+ \S+ \((\d+) sequences a reverse\)", r.stdout)
            self.assertTrue(m, r.stdout)
            found[shaped] = {int(x) for x in m}
        self.assertEqual(found, {"0": {1}, "1": {4}})

    def test_per_sequence_on_the_gpu_path_runs_in_the_gradient_engine(self):
        # The same deck through the GPU's path gives every sequence's norm as
        # the host's engine of one sequence does, to float rounding: the two
        # group the same terms differently only in the head's tiles (1e-5 of
        # values that are sums of positive squares in float32).
        got = {}
        for shaped in ("0", "1"):
            r = self.gnh("--set", "precision.policy=fp32", "--set", "analysis.grad_microbatch=4", "--set",
                         f"run.output=out/seq{shaped}.h5", gpu_shaped=shaped == "1")
            self.assertEqual(r.returncode, 0, r.stderr)
            with h5py.File(os.path.join(self.tmp, "out", f"seq{shaped}.h5"), "r") as f:
                got[shaped] = {h: f["groups"][h]["seen"]["seq_grad_sqnorm"][()] for h in f["groups"]}
        self.assertEqual(sorted(got["0"]), sorted(got["1"]))
        for h, x in got["0"].items():
            self.assertEqual(len(x), 30)
            self.assertTrue((x > 0).all())
            for a, b in zip(x, got["1"][h]):
                self.assertLessEqual(abs(a - b), 1e-5 * a)


if __name__ == "__main__":
    unittest.main(verbosity=2)
