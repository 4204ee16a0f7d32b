#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
"""Compare two bench_engine results (JSON) and flag regressions.

  perf/compare.py BASELINE.json CURRENT.json [--min-threshold 0.05]

Every timed pass (forward, gradient, each curvature method and K) carries the
seconds of each repeat. The noise of a pass is the larger relative spread
(max - min) / median of its repeats in the two runs; a pass regresses when the
current median is slower than the baseline's by more than max(2 x noise,
min-threshold), the noise being the range of the repeats without the fastest
and slowest when there are five or more. Exit status 1 when anything regressed.
"""
import argparse
import json
import sys


def passes(bench):
    out = {"forward": bench["forward"], "gradient": bench["gradient"]}
    for c in bench.get("curvature", []):
        out[f"curvature {c['method']} K={c['K']}"] = c
    return out


def spread(p):
    """Relative range of the repeats, without the fastest and slowest when there
    are five or more (one stray sample should not hide a regression)."""
    s = sorted(p.get("samples", [p["seconds"]]))
    med = s[len(s) // 2]
    if len(s) >= 5:
        s = s[1:-1]
    return (s[-1] - s[0]) / med if med > 0 else 0.0


def compare(base, cur, min_threshold):
    rows, regressed = [], []
    pb, pc = passes(base), passes(cur)
    for name in pb:
        if name not in pc:
            continue
        b, c = pb[name]["seconds"], pc[name]["seconds"]
        noise = max(spread(pb[name]), spread(pc[name]))
        threshold = max(2 * noise, min_threshold)
        change = c / b - 1
        bad = change > threshold
        rows.append((name, b, c, change, threshold, bad))
        if bad:
            regressed.append(name)
    return rows, regressed


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("baseline")
    ap.add_argument("current")
    ap.add_argument("--min-threshold", type=float, default=0.05)
    args = ap.parse_args()
    with open(args.baseline) as f:
        base = json.load(f)
    with open(args.current) as f:
        cur = json.load(f)
    # side_by_side.py results hold the engine's under "gnh".
    base, cur = base.get("gnh", base), cur.get("gnh", cur)
    for key in ("n_params", "batch", "seq_len", "precision"):
        if base["context"].get(key) != cur["context"].get(key):
            sys.exit(f"compare: the runs differ in {key} ({base['context'].get(key)} vs {cur['context'].get(key)})")
    # The GPU-shaped path on a host (bench_engine --gpu-shaped) is another program's time.
    if base["context"].get("gpu_shaped", False) != cur["context"].get("gpu_shaped", False):
        sys.exit("compare: one run is GPU-shaped (bench_engine --gpu-shaped) and the other is not")
    rows, regressed = compare(base, cur, args.min_threshold)
    print(f"{'pass':44s} {'baseline s':>11s} {'current s':>11s} {'change':>8s} {'threshold':>9s}")
    for name, b, c, change, thr, bad in rows:
        print(f"{name:44s} {b:11.5f} {c:11.5f} {change:+8.1%} {thr:9.1%}{'  REGRESSION' if bad else ''}")
    if regressed:
        print(f"compare: {len(regressed)} regression(s): {', '.join(regressed)}")
        return 1
    print("compare: no regression beyond the measured noise")
    return 0


if __name__ == "__main__":
    sys.exit(main())
