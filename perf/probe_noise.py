#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
"""The host GEMM probe's own noise: the start-up probe (kernels/gemm_probe.hpp)
run N times on one machine, and the spread of the ratio of its two totals
(gnh's kernel's time over the vendor BLAS's). The tie rule's margin
(kProbeMargin) must cover that spread, so that two probes of one machine
whose kernels are within it of each other choose alike.

    perf/probe_noise.py [--runs 30] [--shape small] [--busy]

--busy keeps one core spinning beside the probes (another job on the node).
Prints JSON: each run's ratio, their median, and the largest relative
distance of a run's ratio from the median."""
import argparse
import json
import multiprocessing
import os
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def spin(stop):
    x = 0
    while not stop.is_set():
        x = (x * 1103515245 + 12345) % 2147483648


def probe(bench, shape):
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1")
    env.pop("GNH_HOST_GEMM", None)
    out = subprocess.run([bench, "--shape", shape, "--op", "none", "--repeats", "1"], capture_output=True,
                         text=True, check=True, env=env).stdout
    p = json.loads(out)["context"]["host_gemm_probe"]
    if not p["probed"]:
        sys.exit(f"probe_noise: nothing probed here ({p['reason']})")
    flops = [2 * s["m"] * s["n"] * s["k"] for s in p["shapes"]]
    native = sum(f / s["native_gflops"] for f, s in zip(flops, p["shapes"]))
    vendor = sum(f / s["vendor_gflops"] for f, s in zip(flops, p["shapes"]))
    return native / vendor, p["native"]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--shape", default="small")
    ap.add_argument("--busy", action="store_true")
    ap.add_argument("--bench", default=os.path.join(ROOT, "build", "bin", "bench_kernels"))
    a = ap.parse_args()
    stop = multiprocessing.Event()
    neighbour = multiprocessing.Process(target=spin, args=(stop,)) if a.busy else None
    if neighbour:
        neighbour.start()
    try:
        runs = [probe(a.bench, a.shape) for _ in range(a.runs)]
    finally:
        if neighbour:
            stop.set()
            neighbour.join()
    ratios = [r for r, _ in runs]
    median = statistics.median(ratios)
    print(json.dumps({"native": runs[0][1], "shape": a.shape, "busy": a.busy, "runs": len(ratios),
                      "native_over_vendor": ratios, "median": median,
                      "largest_relative_distance": max(abs(r / median - 1) for r in ratios)}, indent=1))


if __name__ == "__main__":
    main()
