#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
"""Each checkpoint is read once, and a stored hash is never trusted blindly.

gnh-convert stores param_sha256 (the hash gnh groups identical states by) in
every checkpoint. `gnh run` plans from it without reading any values, reads
each file once to analyse it, and checks that the values it read hash to it:
- with 1 and 2 ranks and with teams of 2, every checkpoint file is read
  exactly once (the log names every read), aliases included;
- a file whose values were changed after conversion fails its group (also
  when sharded ranks read it by slices), naming
  the file and param_sha256, while the other groups are written;
- a file that claims another file's state (a copied attribute) fails that
  group instead of being reported as the other state;
- files from an older converter (no param_sha256) are hashed while planning,
  grouped the same, with a note; the results are identical bit for bit;
- --dry-run reads every value, so it catches a changed file before any run.
"""
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
import unittest

import gnhtest
import h5py
import numpy as np

READ = re.compile(r"^gnh: \[rank (\d+)\] read (\S+): (\d+) parameters")


class CheckpointReads(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="gnh-reads-")
        cfg = gnhtest.gnh_model.GPTConfig(n_layer=1, n_head=2, n_embd=8, block_size=8, vocab_size=19,
                                          bias=True, tie_embeddings=True)
        cls.ck = os.path.join(cls.tmp, "ckpt")
        os.makedirs(cls.ck)
        for i in range(3):
            gnhtest.save_checkpoint(gnhtest.make_model(cfg, seed=i), cls.ck, f"ckpt_{i}", iter_num=i)
        shutil.copy(os.path.join(cls.ck, "ckpt_2.h5"), os.path.join(cls.ck, "final.h5"))  # an alias
        gnhtest.write_tokens(os.path.join(cls.tmp, "train.bin"), 8 * 20 + 1, 19, 1)
        gnhtest.write_tokens(os.path.join(cls.tmp, "val.bin"), 8 * 10 + 1, 19, 2)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def deck(self, name, ckdir):
        path = os.path.join(self.tmp, name + ".toml")
        gnhtest.write_deck(path, f"out/{name}.h5", [f"{ckdir}/*.h5"], 8, "train.bin", "val.bin")
        return path

    def run_deck(self, deck, np_=1, sets=(), extra=()):
        cmd = [gnhtest.MPIEXEC, "-np", str(np_), gnhtest.GNH, "run", deck, *extra]
        for s in sets:
            cmd += ["--set", s]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=gnhtest.mpi_env())

    def reads(self, r):
        return sorted(m.group(2) for m in (READ.match(l) for l in r.stdout.splitlines()) if m)

    def copy_dir(self, name):
        d = os.path.join(self.tmp, name)
        shutil.rmtree(d, ignore_errors=True)
        shutil.copytree(self.ck, d)
        return d

    def test_stored_hash_is_the_hash_of_the_values(self):
        # SHA-256 of the float32 little-endian values in canonical order (the
        # creation order of /params), computed here independently.
        for name in ("ckpt_0.h5", "final.h5"):
            with h5py.File(os.path.join(self.ck, name), "r") as f:
                h = hashlib.sha256()
                for n in f["params"]:
                    h.update(np.ascontiguousarray(f["params"][n][()], dtype="<f4").tobytes())
                self.assertEqual(gnhtest.text(f.attrs["param_sha256"]), h.hexdigest())

    def test_each_checkpoint_read_once(self):
        files = sorted(os.listdir(self.ck))
        files = [f for f in files if f.endswith(".h5")]
        for np_, rpc in ((1, 1), (2, 1), (2, 2)):
            with self.subTest(ranks=np_, ranks_per_checkpoint=rpc):
                deck = self.deck(f"once_{np_}_{rpc}", "ckpt")
                r = self.run_deck(deck, np_, [f"parallel.ranks_per_checkpoint={rpc}"])
                self.assertEqual(r.returncode, 0, r.stderr)
                # Three states: ckpt_2 and its alias final are one group, and
                # each of the four files is read exactly once.
                self.assertEqual(self.reads(r), files, r.stdout)
                self.assertNotIn("carry no param_sha256", r.stdout)
                res = gnhtest.read_results(os.path.join(self.tmp, "out", f"once_{np_}_{rpc}.h5"))
                self.assertEqual(res["final.h5"]["group"], res["ckpt_2.h5"]["group"])
                self.assertEqual(len({v["group"] for v in res.values()}), 3)

    def test_changed_values_fail_their_group_only(self):
        d = self.copy_dir("changed")
        with h5py.File(os.path.join(d, "ckpt_1.h5"), "r+") as f:
            f["params/transformer.wpe.weight"][0, 0] += 1.0
        deck = self.deck("changed", "changed")
        r = self.run_deck(deck, 2, extra=["--quiet"])
        self.assertEqual(r.returncode, 1, r.stderr)
        self.assertIn("ckpt_1.h5", r.stderr)
        self.assertIn("param_sha256", r.stderr)
        self.assertNotIn("Traceback", r.stderr)
        self.assertNotIn("MPI_ABORT", r.stderr)
        res = gnhtest.read_results(os.path.join(self.tmp, "out", "changed.h5"))
        self.assertEqual(sorted(res), ["ckpt_0.h5", "ckpt_2.h5", "final.h5"])
        # Sharded, each rank reads its slice and the leader hashes the file in
        # blocks: the same group fails, named, and the others are written.
        r = self.run_deck(deck, 2, ["parallel.ranks_per_checkpoint=2", "parallel.parameter_shards=2",
                                    "run.output=out/changed_sharded.h5"], extra=["--quiet"])
        self.assertEqual(r.returncode, 1, r.stderr)
        self.assertIn("ckpt_1.h5: the parameters read hash to", r.stderr)
        self.assertNotIn("Traceback", r.stderr)
        self.assertNotIn("MPI_ABORT", r.stderr)
        res = gnhtest.read_results(os.path.join(self.tmp, "out", "changed_sharded.h5"))
        self.assertEqual(sorted(res), ["ckpt_0.h5", "ckpt_2.h5", "final.h5"])
        # The dry run reads every value: it finds the change before any computation.
        dry = self.run_deck(deck, 2, extra=["--dry-run"])
        self.assertNotEqual(dry.returncode, 0)
        errors = [l for l in dry.stderr.splitlines() if l.startswith("gnh: error:")]
        self.assertEqual(len(errors), 1, dry.stderr)
        self.assertIn("ckpt_1.h5", errors[0])
        self.assertIn("param_sha256", errors[0])

    def test_a_copied_hash_does_not_make_an_alias(self):
        d = self.copy_dir("impostor")
        with h5py.File(os.path.join(d, "ckpt_2.h5"), "r") as f:
            claim = gnhtest.text(f.attrs["param_sha256"])
        with h5py.File(os.path.join(d, "ckpt_0.h5"), "r+") as f:
            f.attrs["param_sha256"] = claim  # ckpt_0 now claims to be ckpt_2's state
        deck = self.deck("impostor", "impostor")
        r = self.run_deck(deck, 2, extra=["--quiet"])
        self.assertEqual(r.returncode, 1, r.stderr)
        self.assertIn("ckpt_0.h5", r.stderr)
        self.assertIn("param_sha256", r.stderr)
        res = gnhtest.read_results(os.path.join(self.tmp, "out", "impostor.h5"))
        self.assertEqual(sorted(res), ["ckpt_1.h5"])  # the group of ckpt_0, ckpt_2 and final failed

    def test_files_without_a_stored_hash(self):
        d = self.copy_dir("legacy")
        for name in (n for n in os.listdir(d) if n.endswith(".h5")):
            with h5py.File(os.path.join(d, name), "r+") as f:
                del f.attrs["param_sha256"]
        r = self.run_deck(self.deck("legacy", "legacy"), 2)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("4 checkpoint file(s) carry no param_sha256", r.stdout)
        ref = self.run_deck(self.deck("legacy_ref", "ckpt"), 2)
        self.assertEqual(ref.returncode, 0, ref.stderr)
        with h5py.File(os.path.join(self.tmp, "out", "legacy.h5"), "r") as a, \
                h5py.File(os.path.join(self.tmp, "out", "legacy_ref.h5"), "r") as b:
            self.assertEqual(sorted(a["groups"]), sorted(b["groups"]))
            for g in a["groups"]:
                for c in a["groups"][g]:
                    for k in ("loss", "G_sqnorm", "GHG", "B_simple", "trace_H"):
                        self.assertEqual(a["groups"][g][c].attrs[k], b["groups"][g][c].attrs[k], (g, c, k))
                    for k in ("gB_sqnorm", "xiHxi", "vHv"):
                        self.assertEqual(a["groups"][g][c][k][()].tobytes(), b["groups"][g][c][k][()].tobytes())


if __name__ == "__main__":
    unittest.main(verbosity=2)
