#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
"""A full disk or a reached quota at every writer: each test runs its command
with the file it writes on a small tmpfs, mounted in a private mount
namespace (unshare) and filled to the point where that writer's write fails.
Every one must end with one line naming the path and the OS's reason, a
non-zero exit, no segfault, traceback or MPI abort, and no temporary left
behind; a rerun with space reuses what was finished. A killed run's
temporaries are removed by the next run."""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

import gnhtest

REASON = "No space left on device"
PAGE = 4096  # tmpfs allocates whole pages
FILL = """
import os, sys
disk, free = sys.argv[1], int(sys.argv[2])
st = os.statvfs(disk)
have = st.f_bavail * st.f_frsize
with open(os.path.join(disk, "filler"), "ab") as f:
    f.write(b"x" * max(0, have - free))
st = os.statvfs(disk)
assert st.f_bavail * st.f_frsize == free, (st.f_bavail * st.f_frsize, free)
"""


class DiskFull(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="gnh-diskfull-")
        ck = gnhtest.small_campaign(cls.tmp)
        cls.disk = os.path.join(cls.tmp, "disk")
        os.makedirs(cls.disk)
        cls.fill = os.path.join(cls.tmp, "fill.py")
        with open(cls.fill, "w") as f:
            f.write(FILL)
        cls.deck = os.path.join(cls.tmp, "deck.toml")
        gnhtest.write_deck(cls.deck, os.path.join(cls.disk, "out", "r.h5"), [os.path.join(ck, "*.h5")], 8,
                           "train.bin", "val.bin")
        cls.spectrum_deck = os.path.join(cls.tmp, "spectrum.toml")
        gnhtest.write_deck(cls.spectrum_deck, os.path.join(cls.disk, "out", "s.h5"), [os.path.join(ck, "*.h5")], 8,
                           "train.bin", "val.bin", analysis={"curvature_method": "forward-over-reverse"},
                           extra='\n[curvature]\nlanczos_steps = 4\nlanczos_chains = 1\ntop_eigenvalues = 2\n')

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def gnh(self, *args, np_=2):
        return (f"{gnhtest.MPIEXEC} -np {np_} {gnhtest.GNH} " + " ".join(str(a) for a in args))

    def on_small_disk(self, script, size="2m"):
        """Runs the shell script with a fresh tmpfs of `size` at self.disk; the
        script's output, then a listing of the disk (marked '== files')."""
        full = (f"mount -t tmpfs -o size={size} tmpfs {self.disk} && cd {self.tmp} && ( {script} ) ; "
                f"echo \"== status $?\"; echo '== files'; find {self.disk} -type f | sort")
        r = subprocess.run(["unshare", "--mount", "--propagation", "private", "bash", "-c", full],
                           capture_output=True, text=True, env=gnhtest.mpi_env(), timeout=600)
        out = r.stdout
        files = out.split("== files\n", 1)[1].split() if "== files\n" in out else []
        status = int(out.split("== status ")[1].split()[0]) if "== status " in out else None
        return status, out, r.stderr, files

    def fill_to(self, free_bytes):
        return f"/usr/bin/python3 {self.fill} {self.disk} {free_bytes}"

    def assert_clean_failure(self, status, stdout, stderr, files, *expect):
        text = stdout + stderr
        self.assertIsNotNone(status, text)
        self.assertNotEqual(status, 0, text[-3000:])
        self.assertNotIn(status, (134, 136, 139), text[-3000:])  # abort, FPE, segfault
        for bad in ("Segmentation", "Traceback", "MPI_ABORT", "core dumped", "signal 11"):
            self.assertNotIn(bad, text)
        lines = [l for l in text.splitlines() if REASON in l]
        self.assertTrue(lines, text[-3000:])
        for e in expect:
            self.assertTrue(any(e in l for l in lines), (e, lines))
        self.assertEqual([f for f in files if ".tmp." in f or f.endswith(".tmp")], [], files)
        return lines

    def recorded(self, deck, output):
        """Shell: the campaign's host GEMM record made first (gnh plan makes
        it), so that a later writer is the first to meet the full disk."""
        plan = self.gnh("plan", deck, "--jobs", "1", "--time", "00:10:00", np_=1)
        return f"mkdir -p {self.disk}/out && {plan} > /dev/null && rm -r {self.disk}/out/{output}.plan"

    def test_group_files(self):
        # One page: the run's probe of the output directory and its lock file
        # fit (in turn); the campaign's host GEMM record does not.
        status, out, err, files = self.on_small_disk(
            f"mkdir -p {self.disk}/out/r.groups && {self.fill_to(PAGE)} && {self.gnh('run', self.deck, '--quiet')}")
        self.assert_clean_failure(status, out, err, files, "r.host-gemm.json", "cannot write")
        # With the record made first, a group file does not fit.
        status, out, err, files = self.on_small_disk(
            f"{self.recorded(self.deck, 'r')} && mkdir -p {self.disk}/out/r.groups && {self.fill_to(PAGE)} && "
            f"{self.gnh('run', self.deck, '--quiet')}")
        self.assert_clean_failure(status, out, err, files, "r.groups/", "cannot write")

    def test_results_assembly_and_csv_and_a_rerun_with_space(self):
        # A run with space; then the same run with the group files finished and
        # room for all but the results file, then for all but the CSV.
        first = f"{self.gnh('run', self.deck, '--quiet')} && stat -c '%s %n' {self.disk}/out/r.h5 {self.disk}/out/r.csv"
        status, out, err, files = self.on_small_disk(first)
        self.assertEqual(status, 0, out + err)
        sizes = {os.path.basename(l.split()[1]): int(l.split()[0]) for l in out.splitlines()
                 if l.split() and l.split()[0].isdigit() and len(l.split()) == 2}
        pages = (sizes["r.h5"] + PAGE - 1) // PAGE * PAGE
        # The lock file holds a page while the run lasts (the holder's name).
        for free, failing in ((pages, "r.h5.tmp."), (pages + PAGE, "r.csv.tmp.")):
            script = (f"{first} && rm {self.disk}/out/r.h5 {self.disk}/out/r.csv && {self.fill_to(free)} && "
                      f"{self.gnh('run', self.deck, '--quiet')}; s=$?; rm {self.disk}/filler; "
                      f"{self.gnh('run', self.deck, '--quiet')} && echo RERUN-OK; exit $s")
            status, out, err, files = self.on_small_disk(script)
            self.assert_clean_failure(status, out, err, files, failing)
            self.assertIn("RERUN-OK", out)
            # The rerun reused every finished group and wrote the results.
            self.assertIn("reused 2", out.split("RERUN-OK")[0].rsplit("groups:", 1)[1])
            self.assertIn(f"{self.disk}/out/r.h5", files)
            self.assertIn(f"{self.disk}/out/r.csv", files)

    def test_lanczos_state(self):
        status, out, err, files = self.on_small_disk(
            f"{self.recorded(self.spectrum_deck, 's')} && mkdir -p {self.disk}/out/s.groups && {self.fill_to(PAGE)} && "
            f"{self.gnh('run', self.spectrum_deck, '--quiet')}")
        lines = self.assert_clean_failure(status, out, err, files, "s.groups/")
        self.assertTrue(any("spectrum" in l for l in lines), lines)

    def test_report(self):
        results = os.path.join(self.tmp, "report-input")
        deck = os.path.join(self.tmp, "report.toml")
        shutil.copy(self.deck, deck)
        r = subprocess.run([gnhtest.MPIEXEC, "-np", "1", gnhtest.GNH, "run", deck, "--quiet", "--set",
                            f'run.output="{results}/r.h5"'], capture_output=True, text=True, env=gnhtest.mpi_env())
        self.assertEqual(r.returncode, 0, r.stderr)
        # Room for a few figures, not all.
        status, out, err, files = self.on_small_disk(
            f"{gnhtest.GNH} report {results}/r.h5 --out {self.disk}/report", size="120k")
        self.assert_clean_failure(status, out, err, files, f"{self.disk}/report/", "cannot write")
        self.assertNotIn(f"{self.disk}/report/manifest.json", files)

    def test_converter(self):
        src = os.path.join(self.tmp, "ckpt.pt")
        model = gnhtest.make_model(gnhtest.gnh_model.GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=16,
                                                               vocab_size=64), seed=3)
        gnhtest.torch.save({"model": model.state_dict(), "model_args": dict(
            n_layer=2, n_head=2, n_embd=32, block_size=16, bias=True, vocab_size=64, dropout=0)}, src)
        convert = os.path.join(gnhtest.ROOT, "apps", "gnh-convert")
        status, out, err, files = self.on_small_disk(f"{convert} {src} {self.disk}/m.h5", size="16k")
        self.assert_clean_failure(status, out, err, files, f"{self.disk}/m.h5")
        self.assertEqual(len([l for l in err.splitlines() if l.strip()]), 1, err)

    def test_plan_scripts_receipt_and_watch_log(self):
        plan = self.gnh("plan", self.deck, "--jobs", "2", "--time", "00:10:00", np_=1)
        plan_dir = f"{self.disk}/out/r.plan"
        # The first shard script.
        status, out, err, files = self.on_small_disk(
            f"{self.recorded(self.deck, 'r')} && {self.fill_to(0)} && {plan}")
        self.assert_clean_failure(status, out, err, files, "shard-0.sbatch", "cannot write")
        # The receipt: room for the three scripts only.
        first = f"{plan} && stat -c '%s %n' {plan_dir}/*.sbatch"
        status, out, err, files = self.on_small_disk(first)
        self.assertEqual(status, 0, out + err)
        scripts = [int(l.split()[0]) for l in out.splitlines() if l.endswith(".sbatch") and l.split()[0].isdigit()]
        self.assertEqual(len(scripts), 3, out)
        room = sum((s + PAGE - 1) // PAGE * PAGE for s in scripts)
        status, out, err, files = self.on_small_disk(
            f"{first} && rm -r {plan_dir} && mkdir -p {plan_dir} && {self.fill_to(room)} && {plan}")
        self.assert_clean_failure(status, out, err, files, "receipt.json")
        # The watch log: a planned campaign (nothing submitted) on a full disk.
        status, out, err, files = self.on_small_disk(
            f"{first} && {self.fill_to(0)} && {self.gnh('watch', plan_dir + '/receipt.json', np_=1)}")
        self.assert_clean_failure(status, out, err, files, "watch.log")

    def test_a_killed_runs_temporaries_are_removed(self):
        status, out, err, files = self.on_small_disk(
            f"mkdir -p {self.disk}/out/r.groups && touch {self.disk}/out/r.h5.tmp.4242 {self.disk}/out/r.csv.tmp.4242 "
            f"{self.disk}/out/r.groups/0123456789abcdef.h5.tmp.77 {self.disk}/out/other.h5.tmp.1 && "
            f"{self.gnh('run', self.deck, '--quiet')}")
        self.assertEqual(status, 0, out + err)
        self.assertIn("removed 3 temporary file(s)", out)
        # Another output's temporary is not this run's to remove.
        self.assertIn(f"{self.disk}/out/other.h5.tmp.1", files)
        self.assertEqual([f for f in files if ".tmp." in f], [f"{self.disk}/out/other.h5.tmp.1"])


if __name__ == "__main__":
    unittest.main()
