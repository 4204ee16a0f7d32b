#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
"""The device check's rehearsal (perf/device/run.sh --rehearse): every step of
the GPU check on the host build at the tiny preset, under the rules of the
GPU machine: at most 8 files come back from $OUT, the summary is the last
thing printed, and a step that fails, or a binary that cannot load, still
leaves a summary that names the step and its error."""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

import gnhtest

BENCH = os.environ.get("GNH_BENCH", os.path.join(gnhtest.ROOT, "build", "bin", "bench_engine"))
RUN = os.path.join(gnhtest.ROOT, "perf", "device", "run.sh")
SUMMARIZE = os.path.join(gnhtest.ROOT, "perf", "device", "summarize.py")
MAX_FILES = 8  # what one call of the GPU machine brings back from $OUT


def files_under(path):
    return [os.path.join(d, f) for d, _, fs in os.walk(path) for f in fs]


def rehearse(out, *args, env=None):
    e = dict(env or gnhtest.mpi_env())
    e["OUT"] = out
    return subprocess.run(["bash", RUN, "--rehearse", "--bench", BENCH, "--python", sys.executable, *args],
                          capture_output=True, text=True, env=e)


class DeviceCheck(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="gnh-device-")

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def assert_summary_last(self, r, out):
        text = open(os.path.join(out, "summary.txt")).read()
        self.assertTrue(r.stdout.rstrip().endswith(text.rstrip()), r.stdout[-2000:])
        self.assertLessEqual(len(files_under(out)), MAX_FILES, files_under(out))
        return text

    def test_rehearsal_validates_times_and_compares_with_pytorch(self):
        out = os.path.join(self.tmp, "ok")
        r = rehearse(out)
        self.assertEqual(r.returncode, 0, r.stdout[-4000:] + r.stderr)
        text = self.assert_summary_last(r, out)
        self.assertEqual(sorted(os.listdir(out)), ["raw.tar.gz", "run.log", "summary.json", "summary.txt"])
        self.assertTrue(text.rstrip().endswith("RESULT: PASS"), text)
        s = json.load(open(os.path.join(out, "summary.json")))
        self.assertEqual([st["step"] for st in s["steps"]],
                         ["machine", "ceilings", "validate", "predict", "time-bf16-amp", "torch", "time-tf32",
                          "time-fp32"])
        self.assertTrue(all(st["status"] == "ok" for st in s["steps"]), s["steps"])
        # The cost model's prediction of the timed passes, set beside their
        # profiles label by label, so that a GPU's first run corrects it.
        self.assertEqual(s["predicted"]["batch"], 4)
        self.assertEqual(s["predicted"]["second_order"]["K"], 16)
        self.assertIn("measured against predicted", text)
        self.assertIn("tf32 gradient K=0: pass", text)
        self.assertIn("bf16-amp second-order-forward K=16: pass", text)
        self.assertIn("gnh::gemm_mapped", text.split("measured against predicted")[1])
        self.assertIn("bench_engine", s["machine"])
        self.assertGreater(s["ceilings"]["gemm_fp32_tflops"], 0)
        self.assertGreater(s["ceilings"]["copy_tb_per_s"], 0)
        # Validation: every precision, the identity between the engines included.
        for p in ("fp32", "tf32", "bf16-amp"):
            self.assertTrue(s["validation"][p]["pass"], s["validation"][p])
            # loss, |G|^2, 16 directions by two methods, and their identity
            self.assertEqual(s["validation"][p]["checked"], 2 + 3 * 16)
        # What is timed is what was validated: the validation ran the second
        # order with adjoint cuts and a head of several tiles.
        raw = os.path.join(self.tmp, "raw")
        os.makedirs(raw, exist_ok=True)
        subprocess.run(["tar", "xzf", os.path.join(out, "raw.tar.gz"), "-C", raw], check=True)
        v = json.load(open(os.path.join(raw, "validate_fp32.json")))
        sof = [c for c in v["curvature"] if c["method"] == "second-order-forward"]
        self.assertTrue(sof and all(c["adjoint_cuts"] for c in sof))
        rows, vocab = sof[0]["head_tile"]
        self.assertLess(rows * vocab, v["context"]["batch"] * v["context"]["seq_len"] * v["context"]["vocab_size"])
        # Timings: 6 passes (the gradient with per-sequence norms among them)
        # in each of 3 precisions, medians of at least 5, the measured memory
        # and a profile by label.
        self.assertEqual(len(s["passes"]), 18)
        self.assertEqual(sum(r["pass"] == "gradient-per-sequence" for r in s["passes"]), 3)
        for row in s["passes"]:
            self.assertGreaterEqual(row["repeats"], 5, row)
            self.assertLessEqual(row["min_seconds"], row["seconds_per_batch"])
            self.assertLessEqual(row["seconds_per_batch"], row["max_seconds"])
            self.assertGreater(row["measured_peak_bytes"], 0, row)
            labels = row["profile"]["labels"]
            self.assertTrue(labels and all(lab["label"] for lab in labels))
            self.assertEqual(len({lab["label"] for lab in labels}), len(labels))  # every label once
            share = sum(lab["seconds"] for lab in labels) / row["profile"]["seconds"]
            # Exclusive times of the labels and the time outside them partition
            # the fenced pass; each is printed to 6 significant digits
            # (relative rounding 5e-6), the pass's total too.
            self.assertAlmostEqual(share, 1.0, delta=5e-6 * (len(labels) + 1))
        # PyTorch on the same case, its values checked, ratios formed.
        self.assertTrue(s["torch"]["checks"] and all(c["ok"] for c in s["torch"]["checks"]), s["torch"]["checks"])
        for key in ("gradient_torch_over_gnh", "direction_torch_hvp_over_gnh_k16",
                    "direction_torch_double_backward_over_gnh_k16"):
            self.assertGreater(s["ratios"][key], 0, key)

    def test_a_failing_step_still_yields_the_summary_naming_it(self):
        out = os.path.join(self.tmp, "forced")
        r = rehearse(out, "--fail-step", "validate")
        self.assertEqual(r.returncode, 1, r.stdout[-4000:])
        text = self.assert_summary_last(r, out)
        self.assertTrue(text.rstrip().endswith("RESULT: FAIL"), text)
        s = json.load(open(os.path.join(out, "summary.json")))
        steps = {st["step"]: st for st in s["steps"]}
        self.assertEqual(steps["validate"]["status"], "failed")
        self.assertIn("forced failure", steps["validate"]["error"])
        self.assertIn("validate", text)
        self.assertIn("forced failure", text)
        # The steps after it ran: the timings do not depend on the validation.
        self.assertEqual(steps["time-fp32"]["status"], "ok")
        # The torch step needs the case the validation writes: it says so.
        self.assertEqual(steps["torch"]["status"], "failed")
        self.assertIn("validate step did not dump", steps["torch"]["error"])

    def test_no_time_left_skips_steps_and_still_summarises(self):
        out = os.path.join(self.tmp, "deadline")
        # 15 s are kept for the summary and a step needs 5: 19 s leave every
        # step less, whatever this machine's speed (a window a fast machine
        # could finish its steps in would make the test depend on timing).
        r = rehearse(out, "--deadline", "19")
        self.assertEqual(r.returncode, 1)
        self.assert_summary_last(r, out)
        s = json.load(open(os.path.join(out, "summary.json")))
        self.assertEqual(s["steps"][-1]["status"], "skipped", s["steps"])
        self.assertIn("no time left", s["steps"][-1]["error"])

    def test_a_binary_that_cannot_load_is_named_and_found_in_the_cuda_wheels(self):
        # An executable linking libgnh_gone.so, removed after the link.
        d = os.path.join(self.tmp, "lib")
        os.makedirs(d, exist_ok=True)
        src, lib, exe = (os.path.join(d, n) for n in ("gone.c", "libgnh_gone.so", "bench_engine"))
        open(src, "w").write("int gnh_gone(void) { return 0; }\n")
        subprocess.run(["cc", "-shared", "-fPIC", "-o", lib, src], check=True)
        open(src, "w").write("int gnh_gone(void);\nint main(void) { return gnh_gone(); }\n")
        subprocess.run(["cc", "-o", exe, src, "-L" + d, "-lgnh_gone"], check=True)
        home = os.path.join(self.tmp, "home")
        os.makedirs(home, exist_ok=True)
        env = gnhtest.mpi_env()
        env["HOME"] = home  # the user site-packages, without the library for now
        env.pop("LD_LIBRARY_PATH", None)
        shutil.move(lib, os.path.join(self.tmp, "libgnh_gone.so"))

        out = os.path.join(self.tmp, "missing")
        r = subprocess.run(["bash", RUN, "--rehearse", "--bench", exe, "--python", sys.executable],
                           capture_output=True, text=True, env=dict(env, OUT=out))
        self.assertEqual(r.returncode, 1)
        text = self.assert_summary_last(r, out)
        s = json.load(open(os.path.join(out, "summary.json")))
        steps = {st["step"]: st for st in s["steps"]}
        self.assertEqual(steps["machine"]["status"], "failed")
        self.assertIn("libgnh_gone.so", steps["machine"]["error"])
        self.assertEqual(steps["validate"]["status"], "skipped")
        self.assertIn("cannot run here", steps["validate"]["error"])
        self.assertIn("libgnh_gone.so", text)

        # The same library in a Python CUDA wheel's folder (nvidia/*/lib under
        # the interpreter's site-packages): found, used, and said so.
        site = subprocess.run([sys.executable, "-c", "import site; print(site.getusersitepackages())"],
                              capture_output=True, text=True, env=env, check=True).stdout.strip()
        wheel = os.path.join(site, "nvidia", "gone", "lib")
        os.makedirs(wheel, exist_ok=True)
        shutil.copy(os.path.join(self.tmp, "libgnh_gone.so"), wheel)
        out = os.path.join(self.tmp, "wheels")
        r = subprocess.run(["bash", RUN, "--rehearse", "--bench", exe, "--python", sys.executable,
                            "--deadline", "60"], capture_output=True, text=True, env=dict(env, OUT=out))
        self.assert_summary_last(r, out)
        s = json.load(open(os.path.join(out, "summary.json")))
        steps = {st["step"]: st for st in s["steps"]}
        self.assertEqual(steps["machine"]["status"], "ok", steps["machine"])
        self.assertIn("taken from the Python CUDA wheels", s["machine"])
        self.assertIn(wheel, s["machine"])

    def test_validation_fails_on_a_wrong_curvature(self):
        # One v^T H v off by 1e-3 of its scale |v||Hv| fails the fp32 bar (1e-4).
        ref = os.path.join(self.tmp, "ref.json")
        run = os.path.join(self.tmp, "run.json")
        subprocess.run([BENCH, "--synthetic", "tiny", "--batch", "2", "--directions", "4", "--precision", "fp64",
                        "--repeats", "0", "--validation", "--no-probe"], stdout=open(ref, "w"), check=True,
                       env=gnhtest.mpi_env())
        subprocess.run([BENCH, "--synthetic", "tiny", "--batch", "2", "--directions", "4", "--repeats", "0",
                        "--validation", "--no-probe"], stdout=open(run, "w"), check=True, env=gnhtest.mpi_env())
        ok = subprocess.run([sys.executable, SUMMARIZE, "validate", ref, run, "--precision", "fp32"],
                            capture_output=True, text=True)
        self.assertEqual(ok.returncode, 0, ok.stdout)
        with open(ref) as f:
            r = json.load(f)
        scale = r["v_norm"][0] * r["Hv_norm forward-over-reverse"][2]
        with open(run) as f:
            d = json.load(f)
        d["vHv_sum second-order-forward"][2] += 1e-3 * scale
        with open(run, "w") as f:
            json.dump(d, f)
        bad = subprocess.run([sys.executable, SUMMARIZE, "validate", ref, run, "--precision", "fp32"],
                             capture_output=True, text=True)
        self.assertEqual(bad.returncode, 1, bad.stdout)
        self.assertIn("FAIL", bad.stdout)
        # The engines' identity is checked too: the same error shows there.
        self.assertIn("identity", [l for l in bad.stdout.splitlines() if "FAIL" in l and "[2]" in l][-1])


if __name__ == "__main__":
    unittest.main()
