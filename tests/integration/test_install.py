#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
"""`cmake --install` (doc/install.md): the installed tree, moved elsewhere
after installing, works on its own files: gnh-convert with its Python helpers,
gnh run, gnh report, gnh plan finding a timing profile that exists only in the
tree and writing shard scripts that source the tree's jobscripts, and the
hand-written jobscripts finding the tree's gnh from GNH_HOME. And with the
source tree hidden (an empty tmpfs mounted over it in a private mount
namespace, so that no file of it can be read), the tree makes the demo
campaign and runs the demo deck on 2 ranks and its report."""
import json
import os
import shutil
import subprocess
import tempfile
import unittest

import gnhtest
import torch

BUILD = os.path.dirname(os.path.dirname(os.path.realpath(gnhtest.GNH)))


class Install(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="gnh-install-")
        staged = os.path.join(cls.tmp, "staged")
        r = subprocess.run(["cmake", "--install", BUILD, "--prefix", staged], capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(r.stdout + r.stderr)
        # Relocated: the prefix it was installed to no longer exists.
        cls.tree = os.path.join(cls.tmp, "modules", "gnh-0.1")
        os.makedirs(os.path.dirname(cls.tree))
        shutil.move(staged, cls.tree)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def path(self, *parts):
        return os.path.join(self.tree, *parts)

    def test_layout(self):
        for rel in ("bin/gnh", "bin/gnh-report", "bin/gnh-convert", "bin/gnh-demo-campaign", "bin/bench_engine",
                    "share/gnh/python/gnh_convert.py", "share/gnh/python/gnh_model.py",
                    "share/gnh/jobscripts/gnh-shard-body.sh", "share/gnh/jobscripts/cpu-shard.sbatch",
                    "share/gnh/jobscripts/profiles/demo-cpu-devbox.json", "share/doc/gnh/README.md",
                    "share/doc/gnh/operations.md"):
            self.assertTrue(os.path.exists(self.path(rel)), rel)
        for rel in ("bin/gnh", "bin/gnh-report", "bin/gnh-convert"):
            self.assertTrue(os.access(self.path(rel), os.X_OK), rel)

    def test_the_demo_deck_with_the_source_tree_hidden(self):
        work = os.path.join(self.tmp, "demo")
        os.makedirs(work)
        campaign = os.path.join(work, "campaign")
        with open(os.path.join(gnhtest.ROOT, "inputs", "demo.toml")) as f:
            deck = f.read().replace("../build/demo", campaign)
        with open(os.path.join(work, "demo.toml"), "w") as f:
            f.write(deck)
        bin_ = self.path("bin")
        script = (f"mount -t tmpfs tmpfs {gnhtest.ROOT} && test -z \"$(ls -A {gnhtest.ROOT})\" && "
                  f"{bin_}/gnh-demo-campaign {campaign} && "
                  f"{gnhtest.MPIEXEC} -np 2 {bin_}/gnh run {work}/demo.toml --quiet --set data.max_blocks=32 && "
                  f"{bin_}/gnh report {campaign}/results/demo.h5 --out {work}/report")
        r = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
                           capture_output=True, text=True, env=gnhtest.mpi_env(), timeout=900)
        self.assertEqual(r.returncode, 0, r.stdout[-3000:] + r.stderr[-3000:])
        self.assertTrue(os.listdir(gnhtest.ROOT), "the source tree is back outside the namespace")
        results = gnhtest.read_results(os.path.join(campaign, "results", "demo.h5"))
        self.assertEqual(set(results), {"ckpt_epoch1.h5", "ckpt_epoch2.h5", "ckpt_epoch3.h5", "final.h5",
                                        "latest.h5"})
        self.assertTrue(os.path.exists(os.path.join(work, "report", "summary.pdf")))

    def test_the_moved_tree_runs_on_its_own_files(self):
        work = os.path.join(self.tmp, "work")
        os.makedirs(work)
        cfg = gnhtest.gnh_model.GPTConfig(n_layer=1, n_head=2, n_embd=8, block_size=8, vocab_size=17, bias=False,
                                          tie_embeddings=True, gelu="erf")
        model = gnhtest.make_model(cfg, seed=1)
        pt = os.path.join(work, "ckpt.pt")
        torch.save({"model": model.state_dict(),
                    "model_args": dict(n_layer=1, n_head=2, n_embd=8, block_size=8, bias=False, vocab_size=17,
                                       dropout=0)}, pt)
        env = gnhtest.mpi_env()
        r = subprocess.run([self.path("bin", "gnh-convert"), pt, os.path.join(work, "ckpt.h5")], capture_output=True,
                           text=True, env=env)
        self.assertEqual(r.returncode, 0, r.stderr)
        gnhtest.write_tokens(os.path.join(work, "train.bin"), 8 * 12 + 1, 17, 1)
        deck = os.path.join(work, "deck.toml")
        gnhtest.write_deck(deck, "out/res.h5", ["ckpt.h5"], 8, "train.bin")
        gnh = self.path("bin", "gnh")
        r = subprocess.run([gnhtest.MPIEXEC, "-np", "1", gnh, "run", deck, "--quiet"], capture_output=True, text=True,
                           env=env)
        self.assertEqual(r.returncode, 0, r.stderr + r.stdout)
        r = subprocess.run([gnh, "report", os.path.join(work, "out", "res.h5"), "--out", os.path.join(work, "rep")],
                           capture_output=True, text=True, env=env)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertTrue(os.path.exists(os.path.join(work, "rep", "summary.png")))
        # A profile for this recipe exists only in the tree: plan finds it there.
        r = subprocess.run([gnh, "plan", deck, "--jobs", "1", "--print-recipe"], capture_output=True, text=True,
                           env=env)
        self.assertEqual(r.returncode, 0, r.stderr)
        recipe = json.loads(r.stdout.strip().splitlines()[-1])  # after the deck echo
        with open(self.path("share/gnh/jobscripts/profiles/demo-cpu-devbox.json")) as f:
            profile = json.load(f)
        profile["recipe"] = recipe
        mine = self.path("share/gnh/jobscripts/profiles/installed-only.json")
        with open(mine, "w") as f:
            json.dump(profile, f)
        env.pop("GNH_PROFILE_DIR", None)
        r = subprocess.run([gnh, "plan", deck, "--jobs", "1", "--out", os.path.join(work, "plan")], capture_output=True,
                           text=True, env=env)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn(f"profile {mine}", r.stdout)
        with open(os.path.join(work, "plan", "shard-0.sbatch")) as f:
            script = f.read()
        self.assertIn(f"source '{self.path('share/gnh/jobscripts/gnh-shard-body.sh')}'", script)
        self.assertNotIn(gnhtest.ROOT + "/", script)
        # The hand-written jobscripts find the tree's gnh from GNH_HOME.
        r = subprocess.run(["bash", "-c", 'source "$GNH_HOME/share/gnh/jobscripts/gnh-shard-body.sh" && '
                            'gnh_binary build'], capture_output=True, text=True,
                           env=dict(env, GNH_HOME=self.tree))
        self.assertEqual(r.stdout.strip(), gnh)


if __name__ == "__main__":
    unittest.main(verbosity=2)
