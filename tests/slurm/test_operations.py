#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
"""The Slurm path against a real single-node Slurm (Debian's slurmctld, slurmd,
munge; started by this test, no mocks):
- doc/operations.md's walkthrough, every `sh` block in order: demo campaign,
  profile, `gnh plan --jobs 2 --submit` (2 shards + an afterok merge job), wait,
  merge and report;
- the merged file equals a single `gnh run` of the same deck;
- the planner's estimate is within a factor of 2 of each shard's measured time;
- the report has every figure, non-empty, one panel per statistic;
- a shard cancelled with scancel and resubmitted resumes, and the merge succeeds;
- a merge with a missing or mismatched shard fails naming it;
- `gnh watch` follows `gnh plan --submit` through a shard that fails once (its
  output held by another process) and, with --resubmit, to a resubmission,
  the merge and the report: the merged file equals a single run;
- a recipe without a profile is refused unless --time is given."""
import fcntl
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import unittest

HERE = os.path.dirname(os.path.realpath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "integration"))
import gnhtest  # noqa: E402
from test_parallel import snapshot  # noqa: E402

ROOT = gnhtest.ROOT
GNH = gnhtest.GNH


def sh_blocks(path):
    with open(path) as f:
        text = f.read()
    return re.findall(r"```sh\n(.*?)```", text, flags=re.S)


def seconds(hms):
    parts = [int(p) for p in re.split(r"[:-]", hms)]
    while len(parts) < 3:
        parts.insert(0, 0)
    return parts[-3] * 3600 + parts[-2] * 60 + parts[-1]


class Operations(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="gnh-ops-")
        cls.state = os.path.join(cls.tmp, "slurm")
        r = subprocess.run([os.path.join(HERE, "start-slurm.sh"), cls.state], capture_output=True, text=True,
                           timeout=120)
        if r.returncode != 0:
            raise RuntimeError(f"could not start Slurm: {r.stderr}")
        # The host GEMM probed, its decision forced to the vendor BLAS (a
        # test-only variable): `gnh plan` records it for the campaign.
        cls.env = gnhtest.probe_env("vendor")
        cls.env["SLURM_CONF"] = r.stdout.strip().splitlines()[-1]
        cls.env["WORK"] = os.path.join(cls.tmp, "work")
        os.makedirs(cls.env["WORK"])
        cls.work = cls.env["WORK"]

    @classmethod
    def tearDownClass(cls):
        subprocess.run(["scancel", "--full", "--user", "root"], env=cls.env, capture_output=True)
        subprocess.run([os.path.join(HERE, "stop-slurm.sh"), cls.state], capture_output=True)
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def sh(self, script, check=True, timeout=900):
        r = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=ROOT, env=self.env, capture_output=True,
                           text=True, timeout=timeout)
        if check:
            self.assertEqual(r.returncode, 0, f"{script}\n--- stdout\n{r.stdout}\n--- stderr\n{r.stderr}")
        return r

    def wait_queue(self, timeout=600):
        deadline = time.time() + timeout
        while time.time() < deadline:
            if not self.sh("squeue -h -o %i").stdout.strip():
                return
            time.sleep(1)
        self.fail("Slurm queue did not drain")

    def job_seconds(self, job):
        out = self.sh(f"scontrol show job {job}").stdout
        return seconds(re.search(r"RunTime=(\S+)", out).group(1)), re.search(r"JobState=(\S+)", out).group(1)

    def test_operations(self):
        # 1. The documented walkthrough, verbatim.
        blocks = sh_blocks(os.path.join(ROOT, "doc", "operations.md"))
        self.assertGreaterEqual(len(blocks), 4)
        for b in blocks:
            self.sh(b)
        results = os.path.join(self.work, "demo", "results")
        plan = os.path.join(results, "demo.plan")
        with open(os.path.join(plan, "receipt.json")) as f:
            receipt = json.load(f)
        self.assertEqual(len(receipt["shards"]), 2)
        self.assertIn("job_id", receipt["merge"])
        # Every shard and the merge completed; estimates within a factor of 2.
        for s in receipt["shards"]:
            run_s, state = self.job_seconds(s["job_id"])
            self.assertEqual(state, "COMPLETED")
            est = s["estimate_seconds"]
            self.assertLessEqual(run_s, 2 * est + 1, (s["index"], run_s, est))
            self.assertGreaterEqual(run_s + 1, est / 2, (s["index"], run_s, est))
            # Requested: twice the estimate plus 30 minutes, rounded up to the hour.
            self.assertEqual(seconds(s["time_request"]) % 3600, 0)
            self.assertGreaterEqual(seconds(s["time_request"]), 2 * est + 1800)
        self.assertEqual(self.job_seconds(receipt["merge"]["job_id"])[1], "COMPLETED")
        # 2. The merged file equals a single run of the same deck.
        single = os.path.join(self.work, "single.h5")
        self.sh(f'GNH_HOST_GEMM=vendor {GNH} run "$WORK/demo.toml" --quiet --set run.output={single}')
        merged = os.path.join(results, "demo.h5")
        self.assertEqual(snapshot(merged), snapshot(single))
        # 3. The report.
        rep = os.path.join(results, "demo.report")
        with open(os.path.join(rep, "manifest.json")) as f:
            manifest = json.load(f)
        # The ten statistics of SPEC §4 and the two from every sequence (analysis.per_sequence).
        self.assertEqual(len(manifest["figures"]["summary"]["panels"]), 12)
        self.assertEqual(manifest["figures"]["summary"]["axes"], 12)
        self.assertIn("sequences", manifest["figures"])
        for fig in manifest["figures"].values():
            for p in fig["files"]:
                self.assertGreater(os.path.getsize(p), 1000, p)
        self.assertGreater(os.path.getsize(os.path.join(rep, "statistics.csv")), 100)

        with open(os.path.join(results, "demo.host-gemm.json")) as f:
            (record,) = json.load(f)["classes"].values()
        self.assertEqual((record["kernel"], record["recorded_by"]), ("vendor", "gnh plan"))

        # 4. scancel a shard mid-way, resubmit it, merge again. Its probe would
        # now choose gnh's kernel: the shard takes the campaign's recorded one.
        shard0 = receipt["shards"][0]
        out0 = shard0["output"]
        groups0 = out0[:-3] + ".groups"
        os.remove(out0)
        shutil.rmtree(groups0)
        job = self.sh(f"GNH_TEST_ONLY_PROBE_WINNER=native sbatch --parsable {shard0['script']}").stdout.strip()
        deadline = time.time() + 300
        while time.time() < deadline and not (os.path.isdir(groups0) and os.listdir(groups0)):
            time.sleep(0.2)
        self.sh(f"scancel {job}")
        self.wait_queue()
        self.assertFalse(os.path.exists(out0), "the cancelled shard finished before scancel")
        kept = [f for f in os.listdir(groups0) if f.endswith(".h5")]
        self.assertGreaterEqual(len(kept), 1)
        job = self.sh(f"GNH_TEST_ONLY_PROBE_WINNER=native sbatch --parsable {shard0['script']}").stdout.strip()
        self.wait_queue()
        self.assertEqual(self.job_seconds(job)[1], "COMPLETED")
        with open(os.path.join(plan, f"shard-0-{job}.out")) as f:
            log = f.read()
        self.assertIn(f"reused {len(kept)}", log)
        self.assertIn("gnh: host sgemm: vendor (recorded for this campaign on ", log)
        remerged = os.path.join(self.work, "remerged.h5")
        self.sh(f"{GNH} merge {remerged} {out0} {receipt['shards'][1]['output']}")
        self.assertEqual(snapshot(remerged), snapshot(single))

        # 5. A merge with a missing or a mismatched shard fails, naming it.
        r = self.sh(f"{GNH} merge {self.work}/bad.h5 {out0}", check=False)
        self.assertNotEqual(r.returncode, 0)
        missing = sorted(receipt["shards"][1]["checkpoints"])
        for name in missing:
            self.assertIn(name, r.stderr)
        self.assertFalse(os.path.exists(f"{self.work}/bad.h5"))
        self.sh(f'{GNH} run "$WORK/demo.toml" --quiet --shard 1/2 --set analysis.seed=99 '
                f'--set run.output={self.work}/other.h5')
        other = f"{self.work}/other.shard-1-of-2.h5"
        r = self.sh(f"{GNH} merge {self.work}/bad.h5 {out0} {other}", check=False)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("settings fingerprint", r.stderr)
        self.assertIn("other.shard-1-of-2.h5", r.stderr)

        # 6. No profile for the recipe: refused without --time, planned with it.
        empty = os.path.join(self.work, "no-profiles")
        os.makedirs(empty)
        cmd = f'GNH_PROFILE_DIR={empty} {GNH} plan "$WORK/demo.toml" --jobs 2 --set analysis.hvp_batch=17'
        r = self.sh(cmd, check=False)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("no measured timing profile", r.stderr)
        r = self.sh(cmd + " --time 02:00:00 --out $WORK/plan-by-hand")
        self.assertIn("request 02:00:00", r.stdout)

        # 7. gnh watch: shard 1 fails on its first submission (another process
        # holds its output's lock, as a second run would), then is resubmitted.
        watched = os.path.join(self.work, "watched.h5")
        wplan = os.path.join(self.work, "watched.plan")
        lock = open(os.path.join(self.work, "watched.shard-1-of-2.h5.lock"), "w")
        fcntl.flock(lock, fcntl.LOCK_EX)
        self.sh(f'GNH_PROFILE_DIR="$WORK/profiles" {GNH} plan "$WORK/demo.toml" --jobs 2 --submit '
                f'--set run.output={watched} --out {wplan}')
        receipt_path = os.path.join(wplan, "receipt.json")
        with open(receipt_path) as f:
            first = json.load(f)
        shard_jobs = [s["job_id"] for s in first["shards"]]
        deadline = time.time() + 600
        while time.time() < deadline and any(self.job_seconds(j)[1] in ("PENDING", "RUNNING", "COMPLETING")
                                             for j in shard_jobs):
            time.sleep(1)
        self.assertEqual(self.job_seconds(shard_jobs[1])[1], "FAILED")
        self.assertEqual(self.job_seconds(shard_jobs[0])[1], "COMPLETED")
        # One look, no resubmission: it says what failed and exits 1.
        r = self.sh(f"{GNH} watch {receipt_path}", check=False)
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
        self.assertIn(f"shard 1: job {shard_jobs[1]} FAILED, groups 0/", r.stdout)
        self.assertIn("--resubmit", r.stdout)
        self.assertRegex(r.stdout, r"shard 0: job \d+ COMPLETED, groups (\d+)/\1, attempts 1, complete")
        fcntl.flock(lock, fcntl.LOCK_UN)
        lock.close()
        r = self.sh(f"{GNH} watch {receipt_path} --resubmit --follow --interval 1", timeout=900)
        self.assertIn("resubmitted as job", r.stdout)
        self.assertIn("cancelled, gnh watch merges instead", r.stdout)
        self.assertIn("merged", r.stdout)
        with open(receipt_path) as f:
            after = json.load(f)
        (attempt,) = after["shards"][1]["attempts"]
        self.assertEqual(attempt["replaces"], shard_jobs[1])
        self.assertEqual(attempt["reason"], "FAILED")
        self.assertEqual(self.job_seconds(attempt["job_id"])[1], "COMPLETED")
        self.assertEqual(self.job_seconds(first["merge"]["job_id"])[1], "CANCELLED")
        self.assertIn("merged_by_watch", after["merge"])
        with open(os.path.join(wplan, "watch.log")) as f:
            logged = f.read()
        for what in ("resubmitted as job", "cancelled", "merged"):
            self.assertIn(what, logged)
        self.assertEqual(snapshot(watched), snapshot(single))
        self.assertTrue(os.path.exists(os.path.join(self.work, "watched.report", "manifest.json")))
        # Done: another look changes nothing and says so.
        r = self.sh(f"{GNH} watch {receipt_path} --resubmit")
        self.assertIn("merge: complete", r.stdout)


if __name__ == "__main__":
    unittest.main()
