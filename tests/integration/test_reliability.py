#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
"""What `gnh run` and `gnh report` do when the file system, the command line or
another run gets in the way:
- an output that cannot be written stops the run (and --dry-run) before any
  computation, with one line naming run.output;
- a results file records whether it is complete; the report warns about and
  marks a partial file, and turns a malformed one into one line;
- one writer per output: a second run stops at once naming the first, and a
  killed run leaves nothing held;
- --set errors blame the --set, broken TOML in a --set is an error, a dataset
  without dtype "hdf5" and a data path that is a directory are errors;
- GNH_ADJOINT_CUTS is recorded in the outputs and the log, and groups
  computed with and without adjoint cuts are never mixed: a resumed run
  recomputes them, a merge refuses them in one line; likewise groups of
  another host thread count (a host build's dot products are summed per
  thread);
- groups computed with different host GEMM kernels are listed by kind in the
  merge, the output and the report, and run.strict_kernels makes the merge
  refuse them;
- statistical consistency checks never block a merge: a campaign with two
  noise samples merges without flags, and a check below the campaign-wide
  threshold is a note, listed in the output;
- --help prints gnh's help, never Kokkos' banner."""
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

REPORT = os.path.join(gnhtest.ROOT, "apps", "gnh-report")


class Reliability(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="gnh-rel-")
        os.chmod(cls.tmp, 0o755)  # the unprivileged-user test reads it
        gnhtest.small_campaign(cls.tmp)
        for root, dirs, files in os.walk(cls.tmp):
            for name in dirs + files:
                os.chmod(os.path.join(root, name), 0o755)
        cls.deck = cls.make_deck("deck.toml", "out/results.h5")

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    @classmethod
    def make_deck(cls, name, output, analysis=None):
        path = os.path.join(cls.tmp, name)
        gnhtest.write_deck(path, output, ["ckpt/*.h5"], 8, "train.bin", "val.bin", analysis=analysis)
        return path

    def gnh(self, *args, np_=1, timeout=120, prefix=()):
        cmd = list(prefix) + [gnhtest.MPIEXEC, "-np", str(np_), gnhtest.GNH] + [str(a) for a in args]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=gnhtest.mpi_env())

    def one_error(self, r, *expect):
        """The run failed with exactly one error line containing every expected text."""
        self.assertNotEqual(r.returncode, 0, r.stdout)
        errors = [l for l in r.stderr.splitlines() if l.startswith("gnh: error:")]
        self.assertEqual(len(errors), 1, r.stderr)
        for e in expect:
            self.assertIn(e, errors[0])
        for bad in ("Traceback", "MPI_ABORT", "internal error"):
            self.assertNotIn(bad, r.stderr)
        self.assertNotIn("gradient", r.stdout)  # no progress line: nothing was computed
        return errors[0]

    # ------------------------------------------------------------------ output
    def test_output_that_is_a_directory(self):
        os.makedirs(os.path.join(self.tmp, "isdir.h5"), exist_ok=True)
        for extra in ([], ["--dry-run"]):
            r = self.gnh("run", self.deck, "--quiet", "--set", 'run.output="isdir.h5"', *extra, np_=2)
            self.one_error(r, "run.output", "isdir.h5", "is an existing directory")

    def test_output_under_a_file(self):
        blocker = os.path.join(self.tmp, "blocker")
        with open(blocker, "w") as f:
            f.write("a file, not a directory\n")
        for extra in ([], ["--dry-run"]):
            r = self.gnh("run", self.deck, "--quiet", "--set", 'run.output="blocker/sub/out.h5"', *extra, np_=2)
            self.one_error(r, "run.output", "blocker", "is a file, not a directory")
        self.assertTrue(os.path.isfile(blocker))

    def test_group_directory_that_is_a_file(self):
        os.makedirs(os.path.join(self.tmp, "g"), exist_ok=True)
        with open(os.path.join(self.tmp, "g", "run.groups"), "w") as f:
            f.write("x")
        r = self.gnh("run", self.deck, "--quiet", "--set", 'run.output="g/run.h5"')
        self.one_error(r, "run.output", "run.groups", "exists and is not a directory")

    def test_unwritable_directory(self):
        locked = os.path.join(self.tmp, "readonly")
        os.makedirs(locked, exist_ok=True)
        os.chmod(locked, 0o555)
        # Root writes through permission bits: run as an unprivileged user.
        prefix = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"] if os.geteuid() == 0 else []
        for extra in ([], ["--dry-run"]):
            r = self.gnh("run", self.deck, "--quiet", "--set", 'run.output="readonly/out/run.h5"', *extra,
                         prefix=prefix)
            self.one_error(r, "run.output", "readonly", "Permission denied")
        self.assertEqual(os.listdir(locked), [])

    # ------------------------------------------------------------ host GEMM
    def test_host_gemm_probe_is_logged_and_recorded(self):
        env = gnhtest.mpi_env()
        del env["GNH_HOST_GEMM"]  # the default: probed at start-up
        deck = self.make_deck("probe.toml", "out/probe.h5")
        r = subprocess.run([gnhtest.MPIEXEC, "-np", "2", gnhtest.GNH, "run", deck], capture_output=True, text=True,
                           timeout=300, env=env)
        self.assertEqual(r.returncode, 0, r.stderr)
        logged = [l for l in r.stdout.splitlines() if l.startswith("gnh: host sgemm: ")]
        self.assertEqual(len(logged), 1, r.stdout)  # rank 0 probes, once
        with h5py.File(os.path.join(self.tmp, "out", "probe.h5"), "r") as f:
            chosen = gnhtest.text(f.attrs["host_gemm"])
            probe = json.loads(gnhtest.text(f.attrs["host_gemm_probe"]))
        self.assertIn(chosen, ("avx2", "avx512", "vendor"))
        self.assertEqual(probe["chosen"], chosen)
        self.assertTrue(logged[0].startswith(f"gnh: host sgemm: {chosen} "))
        if probe["probed"]:
            self.assertEqual(len(probe["shapes"]), 15)
            native = sum(2 * s["m"] * s["n"] * s["k"] / s["native_gflops"] for s in probe["shapes"])
            vendor = sum(2 * s["m"] * s["n"] * s["k"] / s["vendor_gflops"] for s in probe["shapes"])
            # The tie rule: the vendor BLAS only when faster by more than the margin.
            self.assertEqual(probe["margin"], 0.15)
            self.assertEqual(chosen == "vendor", native > (1 + probe["margin"]) * vendor)
        record_path = os.path.join(self.tmp, "out", "probe.host-gemm.json")
        with open(record_path) as f:
            record = json.load(f)
        (cls,) = record["classes"]
        self.assertIn(f"recorded for this campaign on {cls} in {record_path}", logged[0])
        # A node of another CPU class probes for itself and adds its class:
        # here the record names only another class.
        record["classes"] = {"Another CPU (family 1 model 2, x86-64-v2)": record["classes"][cls]}
        with open(record_path, "w") as f:
            json.dump(record, f)
        r = subprocess.run([gnhtest.MPIEXEC, "-np", "1", gnhtest.GNH, "run", deck, "--set", "analysis.seed=5"],
                           capture_output=True, text=True, timeout=300, env=env)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn(f"; recorded for this campaign on {cls} in {record_path}", r.stdout)
        with open(record_path) as f:
            self.assertEqual(sorted(json.load(f)["classes"]), sorted([cls, "Another CPU (family 1 model 2, x86-64-v2)"]))
        # Pinned: no probe, the pinned kernel recorded.
        env["GNH_HOST_GEMM"] = "vendor"
        r = subprocess.run([gnhtest.MPIEXEC, "-np", "1", gnhtest.GNH, "run", deck, "--set", "analysis.seed=7"],
                           capture_output=True, text=True, timeout=300, env=env)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("gnh: host sgemm: vendor (pinned by GNH_HOST_GEMM)", r.stdout)

    # ---------------------------------------------------- completeness, report
    def test_complete_attribute_and_report_of_a_partial_file(self):
        r = self.gnh("run", self.deck, "--quiet")
        self.assertEqual(r.returncode, 0, r.stderr)
        out = os.path.join(self.tmp, "out", "results.h5")
        with h5py.File(out, "r") as f:
            self.assertEqual(int(f.attrs["complete"]), 1)
            self.assertEqual(len(f.attrs["missing_checkpoints"]), 0)
        rep = subprocess.run([gnhtest.GNH, "report", out, "--out", os.path.join(self.tmp, "rep-full")],
                             capture_output=True, text=True, env=gnhtest.mpi_env(), timeout=300)
        self.assertEqual(rep.returncode, 0, rep.stderr)
        self.assertNotIn("incomplete", rep.stderr)
        with open(os.path.join(self.tmp, "rep-full", "manifest.json")) as f:
            self.assertTrue(json.load(f)["complete"])

        # A copy that lost a checkpoint: as `gnh run` writes it when a group fails.
        partial = os.path.join(self.tmp, "partial.h5")
        shutil.copy(out, partial)
        with h5py.File(partial, "r+") as f:
            f.attrs["complete"] = 0
            f.attrs["missing_checkpoints"] = ["ckpt_9.h5"]
        rep = subprocess.run([REPORT, partial, "--out", os.path.join(self.tmp, "rep-part")],
                             capture_output=True, text=True, timeout=300)
        self.assertEqual(rep.returncode, 0, rep.stderr)
        self.assertIn("WARNING", rep.stderr)
        self.assertIn("incomplete", rep.stderr)
        self.assertIn("ckpt_9.h5", rep.stderr)
        with open(os.path.join(self.tmp, "rep-part", "manifest.json")) as f:
            manifest = json.load(f)
        self.assertFalse(manifest["complete"])
        self.assertEqual(manifest["missing_checkpoints"], ["ckpt_9.h5"])
        for name, fig in manifest["figures"].items():
            self.assertIn("INCOMPLETE", fig["title"], name)

    def test_report_of_malformed_files_is_one_line(self):
        out = os.path.join(self.tmp, "malformed")
        os.makedirs(out, exist_ok=True)
        no_groups = os.path.join(out, "no_groups.h5")
        with h5py.File(no_groups, "w") as f:
            f.attrs["format"] = "gnh-results"
        no_aliases = os.path.join(out, "no_aliases.h5")
        with h5py.File(no_aliases, "w") as f:
            f.attrs["format"] = "gnh-results"
            f.create_group("groups/0123456789abcdef/seen").attrs["tokens"] = 5
        garbage = os.path.join(out, "garbage.h5")
        with open(garbage, "wb") as f:
            f.write(b"not hdf5 at all")
        for path, expect in ((no_groups, "no /groups"), (no_aliases, "'aliases'"), (garbage, "not a readable")):
            rep = subprocess.run([REPORT, path, "--out", os.path.join(out, "figs")], capture_output=True, text=True,
                                 timeout=300)
            self.assertEqual(rep.returncode, 1, rep.stderr)
            self.assertNotIn("Traceback", rep.stderr)
            lines = rep.stderr.strip().splitlines()
            self.assertEqual(len(lines), 1, rep.stderr)
            self.assertIn(path, lines[0])
            self.assertIn(expect, lines[0])

    # ------------------------------------------------------------- one writer
    def wait_for_holder(self, lock, proc, timeout=120):
        """The pid in OUTPUT.lock once the first run holds it."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            if proc.poll() is not None:
                self.fail("the first run ended before taking its lock: " + proc.stderr.read())
            if os.path.exists(lock):
                with open(lock) as f:
                    text = f.read()
                if text.startswith("pid "):
                    return int(text.split()[1])
            time.sleep(0.05)
        self.fail("no lock holder recorded")

    def start_holder(self, name):
        """A run on out/NAME.h5 in the background, once it holds the output's
        lock: (deck, lock file, the mpirun process, the pid holding the lock)."""
        deck = self.make_deck(f"{name}.toml", f"out/{name}.h5", analysis=dict(directions=60))
        lock = os.path.join(self.tmp, "out", f"{name}.h5.lock")
        proc = subprocess.Popen([gnhtest.MPIEXEC, "-np", "1", gnhtest.GNH, "run", deck, "--quiet"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=gnhtest.mpi_env(),
                                start_new_session=True)
        return deck, lock, proc, self.wait_for_holder(lock, proc)

    def test_second_run_on_the_same_output_stops_at_once(self):
        deck, lock, first, pid = self.start_holder("lock")
        try:
            # Held still, whatever the machine's speed: the first run is stopped
            # while the second one tries.
            os.kill(pid, signal.SIGSTOP)
            second = self.gnh("run", deck, "--quiet", np_=2)
            msg = self.one_error(second, "lock.h5", "another gnh run is writing this output", f"pid {pid}")
            self.assertIn("lock.toml", msg)  # the holder's command
            dry = self.gnh("run", deck, "--dry-run")
            self.assertEqual(dry.returncode, 0, dry.stderr)
            self.assertIn(f"another gnh run is writing", dry.stdout)
            os.kill(pid, signal.SIGCONT)
            out, err = first.communicate(timeout=600)
            self.assertEqual(first.returncode, 0, err)
        finally:
            if first.poll() is None:
                os.killpg(first.pid, signal.SIGKILL)
                first.communicate()
        # Released: the same command runs (and reuses every group).
        again = self.gnh("run", deck)
        self.assertEqual(again.returncode, 0, again.stderr)
        self.assertIn("reused 2", again.stdout)

    def test_killed_run_leaves_no_lock_held(self):
        deck, lock, first, pid = self.start_holder("killed")
        os.kill(pid, signal.SIGKILL)
        os.killpg(first.pid, signal.SIGKILL)
        first.communicate()
        self.assertTrue(os.path.exists(lock))  # the file stays; the lock does not
        r = self.gnh("run", deck, "--quiet", "--set", "analysis.directions=1")
        self.assertEqual(r.returncode, 0, r.stderr)

    # -------------------------------------------------------------- the deck
    def test_set_errors_blame_the_set(self):
        r = self.gnh("run", self.deck, "--dry-run", "--set", "foo.bar=1")
        self.one_error(r, "--set foo.bar=1", "unknown key 'foo'")
        r = self.gnh("run", self.deck, "--dry-run", "--set", "analysis.nosuch.deep=1")
        self.one_error(r, "--set analysis.nosuch.deep=1", "unknown key 'analysis.nosuch'")

    def test_set_value_that_is_broken_toml(self):
        for value in ('["a",', '{ path = "x"', '"unterminated'):
            r = self.gnh("run", self.deck, "--dry-run", "--set", f"checkpoints.paths={value}")
            self.one_error(r, f"--set checkpoints.paths={value}", "not valid TOML")
        # A bare word is still a string.
        r = self.gnh("run", self.deck, "--dry-run", "--set", "precision.policy=fp64")
        self.assertEqual(r.returncode, 0, r.stderr)

    def test_dataset_needs_hdf5_dtype(self):
        r = self.gnh("run", self.deck, "--dry-run", "--set",
                     'data.seen={ path = "train.bin", dtype = "uint16", dataset = "tokens" }')
        self.one_error(r, "data.seen.dataset", 'needs dtype = "hdf5"')

    def test_data_path_that_is_a_directory(self):
        r = self.gnh("run", self.deck, "--dry-run", "--set", 'data.unseen.path="ckpt"', np_=2)
        self.one_error(r, "ckpt", "is a directory")
        r = self.gnh("run", self.deck, "--dry-run", "--set",
                     'data.unseen={ path = "ckpt", dtype = "hdf5", dataset = "t" }')
        self.one_error(r, "ckpt", "is a directory")

    # --------------------------------------------------------------- --help
    # -------------------------------------------------------------- strict merges
    def shards(self, name, analysis=None, kernels=None, sets=()):
        """Both shards of a 2-shard campaign; returns their paths. kernels:
        each shard's GNH_HOST_GEMM (default: the tests' pin)."""
        deck = self.make_deck(name + ".toml", f"out/{name}.h5", analysis=analysis)
        for i in range(2):
            env = gnhtest.mpi_env()
            if kernels:
                env["GNH_HOST_GEMM"] = kernels[i]
            cmd = [gnhtest.MPIEXEC, "-np", "1", gnhtest.GNH, "run", deck, "--shard", f"{i}/2", "--quiet"]
            for s in sets:
                cmd += ["--set", s]
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
            self.assertEqual(r.returncode, 0, r.stderr)
        return [os.path.join(self.tmp, "out", f"{name}.shard-{i}-of-2.h5") for i in range(2)]

    def test_mixed_kernels_are_listed_and_refused_when_strict(self):
        shards = self.shards("mixed", kernels=("vendor", "native"))
        kinds = set()
        for path in shards:
            with h5py.File(path, "r") as f:
                kinds |= {gnhtest.text(g.attrs["host_gemm"]) for g in f["groups"].values()}
        self.assertEqual(len(kinds), 2, kinds)
        self.assertIn("vendor", kinds)
        out = os.path.join(self.tmp, "out", "mixed-merged.h5")
        r = self.gnh("merge", out, *shards)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("holds groups computed in 2 ways", r.stdout)
        with h5py.File(out, "r") as f:
            listed = [gnhtest.text(k) for k in f.attrs["kernel_kinds"]]
            by_kind = {gnhtest.text(g.attrs["host_gemm"]) for g in f["groups"].values()}
        self.assertEqual(by_kind, kinds)
        self.assertEqual(sorted(k.split(",")[0] for k in listed), sorted(f"host_gemm {k}" for k in kinds))
        for line in listed:
            self.assertIn(line, r.stdout)
        r, manifest = gnhtest.report(out, os.path.join(self.tmp, "mixed-report"))
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(manifest["kernel_kinds"], listed)
        self.assertIn("were computed in 2 ways", r.stdout)
        # The strict switch: the same mix refused, in one line naming both kinds.
        strict = self.shards("strictmix", kernels=("vendor", "native"), sets=["run.strict_kernels=true"])
        bad = os.path.join(self.tmp, "out", "strictmix-merged.h5")
        r = self.gnh("merge", bad, *strict)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("cannot merge: run.strict_kernels = true", r.stderr)
        for k in kinds:
            self.assertIn(f"host_gemm {k},", r.stderr)
        self.assertNotIn("Traceback", r.stderr)
        self.assertFalse(os.path.exists(bad))

    def test_consistency_checks_never_block_a_merge(self):
        # Two noise samples: the batch side's spread rests on two values.
        shards = self.shards("twosamples", analysis=dict(noise_samples=2))
        out = os.path.join(self.tmp, "out", "twosamples-merged.h5")
        r = self.gnh("merge", out, *shards)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertNotIn("consistency", r.stdout)
        with h5py.File(out, "r") as f:
            self.assertEqual(int(f.attrs["identities_ok"]), 1)
            self.assertEqual(len(f.attrs["consistency_alarms"]), 0)
            family = int(f.attrs["consistency_family"])
            cases = [c for g in f["groups"].values() for c in g.values()]
            self.assertEqual(family, len(cases))
            for c in cases:
                self.assertNotIn("identity_noise_estimators_deviation", c.attrs)
                self.assertAlmostEqual(c.attrs["consistency_noise_estimators_threshold"], 0.01 / family, delta=0)
                self.assertGreater(c.attrs["consistency_noise_estimators_p_value"], 0.0)
        # A check far below the threshold is a note, and the merge goes on.
        with h5py.File(shards[0], "r+") as f:
            g = next(iter(f["groups"].values()))
            g["seen"].attrs["consistency_noise_estimators_p_value"] = 1e-30
            flagged = f"group {g.name.split('/')[-1]} case seen noise_estimators: p = 1e-30"
        r = self.gnh("merge", out, *shards)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("1 statistical consistency check(s)", r.stdout)
        self.assertIn(flagged, r.stdout)
        with h5py.File(out, "r") as f:
            self.assertEqual(int(f.attrs["identities_ok"]), 1)
            self.assertEqual([gnhtest.text(a) for a in f.attrs["consistency_alarms"]][0].split(",")[0], flagged)

    def test_merge_refuses_a_failed_identity_unless_accepted_and_recorded(self):
        shards = self.shards("strict")
        with h5py.File(shards[1], "r+") as f:
            g = next(iter(f["groups"].values()))
            c = g["seen"]
            c.attrs["identity_hessian_symmetry_deviation"] = 10 * float(c.attrs["identity_hessian_symmetry_tolerance"])
            c.attrs["identities_ok"] = 0
            bad = f"{shards[1]}: group {g.name.split('/')[-1]} case seen: identity_hessian_symmetry"
        out = os.path.join(self.tmp, "out", "strict-merged.h5")
        r = self.gnh("merge", out, *shards)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("cannot merge: 1 recorded identity check(s) failed", r.stderr)
        self.assertIn(bad, r.stderr)
        self.assertIn("--accept-failed-identities", r.stderr)
        self.assertFalse(os.path.exists(out))
        r = self.gnh("merge", out, *shards, "--accept-failed-identities")
        self.assertEqual(r.returncode, 0, r.stderr)
        with h5py.File(out, "r") as f:
            self.assertEqual(int(f.attrs["identities_ok"]), 0)
            accepted = [gnhtest.text(a) for a in f.attrs["accepted_failed_identities"]]
        self.assertEqual(len(accepted), 1)
        self.assertIn(bad, accepted[0])

    def test_merge_of_a_campaign_without_directions_or_noise(self):
        shards = self.shards("bare", analysis=dict(directions=0, noise_samples=0))
        out = os.path.join(self.tmp, "out", "bare-merged.h5")
        r = self.gnh("merge", out, *shards)
        self.assertEqual(r.returncode, 0, r.stderr)
        with h5py.File(out, "r") as f:
            self.assertEqual(int(f.attrs["complete"]), 1)
            self.assertNotIn("accepted_failed_identities", f.attrs)
            for g in f["groups"].values():
                self.assertNotIn("trace_H", g["seen"].attrs)
                self.assertIn("GHG", g["seen"].attrs)

    # ------------------------------------------------------------ adjoint cuts
    def run_with_cuts(self, cuts, *args):
        env = gnhtest.mpi_env()
        env["GNH_ADJOINT_CUTS"] = cuts
        cmd = [gnhtest.MPIEXEC, "-np", "1", gnhtest.GNH] + [str(a) for a in args]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)

    def root_attrs(self, path, *names):
        with h5py.File(path, "r") as f:
            return [gnhtest.text(f.attrs[n]) for n in names]

    def test_adjoint_cuts_are_recorded_and_never_mixed(self):
        # Adjoint cuts regroup the sums of every v^T H v (the identity checks'
        # second-order engine cuts too at GNH_ADJOINT_CUTS=1): runs with 0 and
        # 1 differ in rounding, so their groups must not be reused or merged
        # as one campaign's.
        deck = self.make_deck("cuts.toml", "out/cuts.h5")
        out = os.path.join(self.tmp, "out", "cuts.h5")
        r = self.run_with_cuts("0", "run", deck)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("gnh: adjoint cuts (GNH_ADJOINT_CUTS=0): identity checks K=2: off; curvature K=5: off; "
                      "1 host thread(s) per rank", r.stdout)
        setting, engines, plain = self.root_attrs(out, "adjoint_cuts", "adjoint_cuts_engines", "settings_fingerprint")
        self.assertEqual((setting, engines), ("0", "identity checks K=2: off; curvature K=5: off"))
        # The same command with cuts: nothing of the first run is reused.
        r = self.run_with_cuts("1", "run", deck, "--quiet")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("gnh: groups: computed 2, reused 0 ", r.stdout)
        setting, engines, cut = self.root_attrs(out, "adjoint_cuts", "adjoint_cuts_engines", "settings_fingerprint")
        self.assertEqual((setting, engines), ("1", "identity checks K=2: on; curvature K=5: on"))
        self.assertNotEqual(cut, plain)
        with h5py.File(out, "r") as f:
            self.assertEqual(int(f.attrs["host_threads"]), 1)
        # With cuts again: resumed, every group reused.
        r = self.run_with_cuts("1", "run", deck, "--quiet")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("gnh: groups: computed 0, reused 2 ", r.stdout)
        # Shards run with different settings: the merge refuses, in one line.
        shards = []
        for i, cuts in enumerate(("0", "1")):
            r = self.run_with_cuts(cuts, "run", deck, "--shard", f"{i}/2", "--quiet")
            self.assertEqual(r.returncode, 0, r.stderr)
            shards.append(os.path.join(self.tmp, "out", f"cuts.shard-{i}-of-2.h5"))
        merged = os.path.join(self.tmp, "out", "cuts-merged.h5")
        self.one_error(self.gnh("merge", merged, *shards), "settings fingerprint", "adjoint cuts",
                       "GNH_ADJOINT_CUTS=1, against", "GNH_ADJOINT_CUTS=0;")
        self.assertFalse(os.path.exists(merged))
        # The same, for a shard and a group computed with another host thread count.
        r = self.run_with_cuts("1", "run", deck, "--shard", "0/2", "--quiet")
        self.assertEqual(r.returncode, 0, r.stderr)
        with h5py.File(shards[1], "r+") as f:
            f.attrs["host_threads"] = 2
        self.one_error(self.gnh("merge", merged, *shards), "2 host thread(s)", "OMP_NUM_THREADS")
        with h5py.File(shards[1], "r+") as f:
            f.attrs["host_threads"] = 1
        self.assertEqual(self.gnh("merge", merged, *shards).returncode, 0)
        groups = os.path.join(self.tmp, "out", "cuts.groups")
        group = os.path.join(groups, sorted(g for g in os.listdir(groups) if g.endswith(".h5"))[0])
        with h5py.File(group, "r+") as f:
            f.attrs["host_threads"] = 2
        r = self.run_with_cuts("1", "run", deck, "--quiet")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("gnh: groups: computed 1, reused 1 ", r.stdout)
        # Anything but 0 or 1 is an error before any work.
        self.one_error(self.run_with_cuts("yes", "run", deck, "--dry-run"), "GNH_ADJOINT_CUTS", "'yes'")

    def test_help_is_gnhs(self):
        for args in (["--help"], ["run", "--help"], ["compare", "--help"], ["merge", "--help"], ["plan", "--help"],
                     ["report", "--help"]):
            r = self.gnh(*args)
            self.assertEqual(r.returncode, 0, args)
            self.assertIn("Usage:", r.stdout, args)
            self.assertNotIn("Kokkos", r.stdout + r.stderr, args)
        r = self.gnh("run", "--help")
        self.assertIn("--dry-run", r.stdout)
        r = self.gnh("--kokkos-help")
        self.assertEqual(r.returncode, 0)
        self.assertIn("kokkos", (r.stdout + r.stderr).lower())
        self.assertNotIn("Usage:", r.stdout)


if __name__ == "__main__":
    unittest.main()
