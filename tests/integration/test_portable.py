#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
"""One x86-64 binary for every node: the default build's gnh runs the demo
campaign (cut to one checkpoint, 8 blocks and microbatches of 4, so that
emulation takes minutes: about 12 of them for the Haswell run on an Intel
Xeon host, whose qemu-user emulates AVX2 several times slower than the AMD
EPYC hosts' did) under qemu-user on CPU models without AVX-512 (Haswell: AVX2) and
without AVX2 (Nehalem: SSE4.2), choosing its GEMM kernel and vector loops
from the emulated CPU's features, and gets the statistics of the native run.

Tolerance 1e-4 relative: the runs multiply in fp32 (unit roundoff 6e-8) with
other kernels (gnh's AVX-512 or AVX2 kernel, or the vendor BLAS's SSE
kernels) and so other summation orders, ~1e-6 relative per product of up to
4C = 256 terms; the estimators that subtract nearly equal sums (tr Sigma,
the standard errors) amplify that about tenfold. Measured: at most 2e-6.
The identities' deviations are rounding residues themselves and are not
compared."""
import json
import os
import shutil
import subprocess
import tempfile
import unittest

import gnhtest
import h5py

QEMU = shutil.which("qemu-x86_64")
SETTINGS = ["--set", "data.max_blocks=8", "--set", "analysis.noise_samples=2", "--set", "analysis.noise_batch=2",
            "--set", "analysis.directions=2", "--set", "analysis.directions_per_pass=5",
            "--set", "analysis.grad_microbatch=4", "--set", "analysis.hvp_batch=4"]
RTOL = 1e-4


def statistics(path):
    out = {}
    with h5py.File(path, "r") as f:
        for h, g in f["groups"].items():
            for c in g:
                for k, v in g[c].attrs.items():
                    if k.startswith("identity_"):
                        continue
                    try:
                        out[(h, c, k)] = float(v)
                    except (TypeError, ValueError):
                        pass
    return out


class Portable(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        assert QEMU, "qemu-x86_64 is missing: cmake/install-deps.sh installs qemu-user"
        cls.tmp = tempfile.mkdtemp(prefix="gnh-portable-")
        campaign = os.path.join(cls.tmp, "campaign")
        subprocess.run([os.path.join(gnhtest.ROOT, "apps", "gnh-demo-campaign"), campaign], check=True,
                       capture_output=True)
        with open(os.path.join(gnhtest.ROOT, "inputs", "demo.toml")) as f:
            deck = f.read().replace("../build/demo", campaign)
        deck = deck.replace('paths = ["' + campaign + '/h5/*.h5"]', 'paths = ["' + campaign + '/h5/ckpt_epoch1.h5"]')
        cls.decks = {}
        for name in ("native", "Haswell", "Nehalem"):
            path = os.path.join(cls.tmp, name + ".toml")
            with open(path, "w") as f:
                f.write(deck.replace(f"{campaign}/results/demo.h5", os.path.join(cls.tmp, name, "demo.h5")))
            cls.decks[name] = path
        cls.native = cls.run_gnh("native")

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    @classmethod
    def run_gnh(cls, cpu):
        env = gnhtest.mpi_env()
        env.pop("GNH_HOST_GEMM", None)  # the kernel the CPU allows, as a user's run picks it
        env.pop("OPENBLAS_CORETYPE", None)  # OpenBLAS too: its own choice for the CPU it sees
        cmd = [gnhtest.GNH, "run", cls.decks[cpu], *SETTINGS]
        if cpu != "native":
            cmd = [QEMU, "-cpu", cpu] + cmd
        r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1200)
        assert r.returncode == 0, f"{cpu}: {r.stdout[-2000:]}{r.stderr[-2000:]}"
        return r.stdout, statistics(os.path.join(cls.tmp, cpu, "demo.h5"))

    def check(self, cpu, native, isa):
        """native: the GEMM kernel the emulated CPU's features offer. Where
        that is one of gnh's, the probe times it against the vendor BLAS and
        takes the faster; under emulation that race is a coin toss (on an
        AMD EPYC Zen 3 host both ran at 0.1 GFLOP/s), so the choice is
        checked to be one of the two and to be the one the run reports, not
        which."""
        out, got = self.run_gnh(cpu)
        line = next(l for l in out.splitlines() if "host sgemm:" in l)
        self.assertIn(f"vector loops: {isa}", line)
        with h5py.File(os.path.join(self.tmp, cpu, "demo.h5"), "r") as f:
            probe = json.loads(f.attrs["host_gemm_probe"])
        self.assertEqual(probe["host_isa"], isa)
        self.assertEqual(probe["native"], native)
        self.assertIn(probe["chosen"], {native, "vendor"})
        self.assertIn(f"host sgemm: {probe['chosen']} ", line)
        want = self.native[1]
        self.assertEqual(set(got), set(want))
        self.assertGreater(len(want), 40)
        for key, x in want.items():
            y = got[key]
            if x != x:
                self.assertNotEqual(y, y, key)
                continue
            self.assertLessEqual(abs(y - x), RTOL * abs(x) + 1e-300, (key, x, y))

    def test_native_run_uses_this_cpus_best(self):
        line = next(l for l in self.native[0].splitlines() if "host sgemm:" in l)
        self.assertIn("vector loops: x86-64-v", line)

    def test_haswell_avx2_without_avx512(self):
        self.check("Haswell", "avx2", "x86-64-v3")

    def test_nehalem_without_avx2(self):
        self.check("Nehalem", "vendor", "x86-64-v2")


if __name__ == "__main__":
    unittest.main()
