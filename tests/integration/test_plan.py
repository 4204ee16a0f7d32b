#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
"""Planning without Slurm (doc/operations.md, sections 2 and 3):
- perf/make_profile.py records the target it measured on and, for each cost,
  the maximum over every distinct state and data case (listed as sources);
- gnh plan takes only a profile of its --target: a profile measured for the
  recipe on another target is refused, by search and by name;
- gnh plan prints each shard's request in node-hours and the campaign's
  total, and records them in the receipt; its shard scripts run the device
  self-check before the analysis."""
import json
import os
import shutil
import subprocess
import tempfile
import unittest

import gnhtest

BENCH = os.environ.get("GNH_BENCH", os.path.join(gnhtest.ROOT, "build", "bin", "bench_engine"))


class Plan(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="gnh-plan-")
        ck = os.path.join(cls.tmp, "ckpt")
        os.makedirs(ck)
        cfg = gnhtest.gnh_model.GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=8, vocab_size=29, bias=False,
                                          tie_embeddings=True, gelu="erf")
        for i in (1, 2, 3):
            gnhtest.save_checkpoint(gnhtest.make_model(cfg, seed=i), ck, f"c{i}", iter_num=i)
        shutil.copy(os.path.join(ck, "c3.h5"), os.path.join(ck, "final.h5"))
        gnhtest.write_tokens(os.path.join(cls.tmp, "train.bin"), 8 * 20 + 1, 29, 1)
        gnhtest.write_tokens(os.path.join(cls.tmp, "val.bin"), 8 * 9 + 1, 29, 2)
        cls.deck = os.path.join(cls.tmp, "deck.toml")
        gnhtest.write_deck(cls.deck, "out/p.h5", ["ckpt/*.h5"], 8, "train.bin", "val.bin")
        cls.profiles = os.path.join(cls.tmp, "profiles")
        r = subprocess.run(["/usr/bin/python3", os.path.join(gnhtest.ROOT, "perf", "make_profile.py"), cls.deck,
                            "--name", "cpu-here", "--out", cls.profiles, "--repeats", "1", "--gnh", gnhtest.GNH,
                            "--bench", BENCH], capture_output=True, text=True, env=gnhtest.mpi_env())
        if r.returncode != 0:
            raise RuntimeError(r.stdout + r.stderr)
        with open(os.path.join(cls.profiles, "cpu-here.json")) as f:
            cls.profile = json.load(f)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def plan(self, profiles, *args):
        env = dict(gnhtest.mpi_env(), GNH_PROFILE_DIR=profiles)
        return subprocess.run([gnhtest.GNH, "plan", self.deck, *args], capture_output=True, text=True, env=env)

    def test_profile_is_the_maximum_over_states_and_cases(self):
        p = self.profile
        self.assertEqual(p["target"], "cpu")
        # 3 distinct states (final is an alias) x 2 cases.
        self.assertEqual(len(p["sources"]), 6)
        self.assertEqual({(s["checkpoint"], s["case"]) for s in p["sources"]} >= {("c1.h5", "unseen")}, True)
        for k in ("seconds_per_gradient_microbatch", "seconds_per_hvp_batch_per_direction",
                  "seconds_per_group_startup"):
            self.assertEqual(p[k], max(s[k] for s in p["sources"]), k)

    def test_a_profile_of_another_target_is_refused(self):
        gh = os.path.join(self.tmp, "gh200-only")
        os.makedirs(gh, exist_ok=True)
        other = dict(self.profile, target="gh200", name="gh200-here")
        path = os.path.join(gh, "gh200-here.json")
        with open(path, "w") as f:
            json.dump(other, f)
        r = self.plan(gh, "--jobs", "2", "--out", os.path.join(self.tmp, "p0"))
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("no timing profile of this recipe for --target cpu", r.stderr)
        self.assertIn(f"{path} (gh200)", r.stderr)
        r = self.plan(gh, "--jobs", "2", "--target", "gh200", "--out", os.path.join(self.tmp, "p1"))
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn(f"profile {path}", r.stdout)
        r = self.plan(gh, "--jobs", "2", "--profile", os.path.join(self.profiles, "cpu-here.json"), "--target",
                      "gh200", "--out", os.path.join(self.tmp, "p2"))
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("measured on target cpu, not --target gh200", r.stderr)

    def test_node_hours_and_the_self_check_in_every_shard(self):
        out = os.path.join(self.tmp, "p3")
        r = self.plan(self.profiles, "--jobs", "2", "--out", out)
        self.assertEqual(r.returncode, 0, r.stderr)
        with open(os.path.join(out, "receipt.json")) as f:
            receipt = json.load(f)
        total = 0
        for s in receipt["shards"]:
            h, m, sec = (int(x) for x in s["time_request"].split(":"))
            self.assertEqual(s["nodes"], 1)
            self.assertAlmostEqual(s["node_hours_requested"], (h * 3600 + m * 60 + sec) / 3600)
            self.assertIn(f"= {s['node_hours_requested']:.2f} node-hours", r.stdout)
            total += s["node_hours_requested"]
            with open(s["script"]) as f:
                self.assertIn("--self-check", f.read())
        self.assertAlmostEqual(receipt["node_hours_requested"], total)
        self.assertIn(f"campaign: {total:.2f} node-hours requested", r.stdout)


if __name__ == "__main__":
    unittest.main(verbosity=2)
