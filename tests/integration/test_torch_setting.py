#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
"""perf/torch_setting.py: the candidates follow the CPU's flags and the
inherited environment, and choose() returns what it measured fastest.

The chosen setting gives PyTorch its fastest kernels and allocator in the
side-by-side runs (perf/side_by_side.py); a candidate list that missed
SkylakeX on an AVX-512 CPU, or a choice that was not the fastest probe, would
understate PyTorch (measured on an AMD EPYC Zen 5: sgemm 100 against 200
GFLOP/s, the gradient 40-170 ms against 26-35 ms)."""
import os
import sys
import unittest

import gnhtest

sys.path.insert(0, os.path.join(gnhtest.ROOT, "perf"))
import torch_setting  # noqa: E402

AVX512 = {"fma", "avx2", "avx512f", "avx512bw", "avx512vl", "avx512dq"}


class TorchSetting(unittest.TestCase):
    def test_options_follow_the_cpu_and_keep_the_inherited_first(self):
        cores, atens, mallocs = torch_setting.options(AVX512, {"OPENBLAS_CORETYPE": "Zen"})
        self.assertEqual(cores, ["Zen", "Haswell", "SkylakeX"])
        self.assertEqual(atens, [None, "avx2", "avx512"])
        self.assertEqual(mallocs[0], {k: None for k in torch_setting.TUNED_MALLOC})
        self.assertEqual(mallocs[1], torch_setting.TUNED_MALLOC)
        cores, atens, _ = torch_setting.options({"fma", "avx2"}, {"OPENBLAS_CORETYPE": "Haswell"})
        self.assertEqual(cores, ["Haswell"])  # no duplicate, no AVX-512 kernels
        self.assertEqual(atens, [None, "avx2"])
        cores, atens, mallocs = torch_setting.options(set(), dict(torch_setting.TUNED_MALLOC))
        self.assertEqual((cores, atens, len(mallocs)), ([None], [None], 1))  # an Arm CPU: nothing to pick

    def test_choose_returns_the_fastest_probe(self):
        setting, table = torch_setting.choose("tiny", repeats=3, log=None)
        ok = [row for row in table if "seconds" in row]
        self.assertTrue(ok, table)
        for row in ok:
            self.assertGreater(row["sgemm_gflops"], 0)
            self.assertGreater(row["seconds"], 0)
        chosen = next(row for row in ok if row["setting"] == setting)
        # The last stage (ATen's kernels) compares rows that differ only in
        # ATEN_CPU_CAPABILITY; the choice is the fastest of them.
        stage = [row for row in ok if {k: v for k, v in row["setting"].items() if k != "ATEN_CPU_CAPABILITY"} ==
                 {k: v for k, v in setting.items() if k != "ATEN_CPU_CAPABILITY"}]
        self.assertEqual(chosen["seconds"], min(row["seconds"] for row in stage))
        # The OpenBLAS kernels are those of the highest sgemm rate among the first stage's rows.
        first = [row for row in ok if row["setting"]["ATEN_CPU_CAPABILITY"] == os.environ.get("ATEN_CPU_CAPABILITY")
                 and all(row["setting"][k] == v for k, v in torch_setting.TUNED_MALLOC.items())]
        if first:
            self.assertEqual(setting["OPENBLAS_CORETYPE"],
                             max(first, key=lambda row: row["sgemm_gflops"])["setting"]["OPENBLAS_CORETYPE"])


if __name__ == "__main__":
    unittest.main()
