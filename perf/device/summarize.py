#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""Validation and epoch extrapolation for perf/device/run.sh (standard library
only: the device machine may have nothing else).

  summarize.py validate REFERENCE.json RUN.json
      exit 1 unless every value of REFERENCE's "values" is within its relative
      tolerance in RUN (a bench_engine --validation result)
  summarize.py epoch OUT.json RUN.json [RUN.json ...] [--blocks 9963] [--device TEXT]
      per-batch times of bench_engine results, extrapolated to an epoch of
      BLOCKS sequences, written to OUT.json and printed as a table
"""
import json
import sys


def validate(ref_path, run_path):
    ref = json.load(open(ref_path))
    run = json.load(open(run_path))
    tol = float(ref["tolerance_relative"])
    bad = 0
    for key, want in ref["values"].items():
        got = run.get(key)
        if got is None or len(got) != len(want):
            print(f"validate: {key}: missing or wrong length in {run_path}")
            bad += 1
            continue
        for i, (w, g) in enumerate(zip(want, got)):
            rel = abs(g - w) / max(abs(w), 1e-300)
            ok = rel <= tol
            bad += not ok
            print(f"validate: {key}[{i}] reference {w:.10g} got {g:.10g} relative error {rel:.2e} "
                  f"{'ok' if ok else 'FAIL'} (tolerance {tol:g})")
    print(f"validate: {'PASS' if bad == 0 else 'FAIL'} ({bad} outside tolerance)")
    return 0 if bad == 0 else 1


def epoch(out_path, runs, blocks, device):
    rows = []
    context = None
    for path in runs:
        r = json.load(open(path))
        context = context or r["context"]
        seqs = r["context"]["batch"]
        scale = blocks / seqs  # batches per epoch (the last one partial)
        if "gradient" in r:
            g = r["gradient"]
            rows.append({"pass": "gradient", "K": 0, "seconds_per_batch": g["seconds"],
                         "epoch_seconds": g["seconds"] * scale, "gflops": g.get("gflops"),
                         "workspace_bytes": g.get("workspace_bytes")})
        for c in r.get("curvature", []):
            rows.append({"pass": c["method"], "K": c["K"], "seconds_per_batch": c["seconds"],
                         "seconds_per_direction_per_batch": c["seconds_per_direction"],
                         "epoch_seconds_per_direction": c["seconds_per_direction"] * scale, "gflops": c.get("gflops"),
                         "workspace_bytes": c.get("workspace_bytes")})
    out = {"device": device, "blocks_per_epoch": blocks, "context": context, "passes": rows}
    with open(out_path, "w") as f:
        json.dump(out, f, indent=2)
    print(f"{'pass':24s} {'K':>3s} {'s/batch':>10s} {'epoch s (per direction)':>24s} {'GFLOP/s':>9s}")
    for row in rows:
        e = row.get("epoch_seconds", row.get("epoch_seconds_per_direction"))
        print(f"{row['pass']:24s} {row['K']:3d} {row['seconds_per_batch']:10.4f} {e:24.2f} {row['gflops'] or 0:9.1f}")
    return 0


def main(argv):
    if len(argv) >= 3 and argv[0] == "validate":
        return validate(argv[1], argv[2])
    if len(argv) >= 3 and argv[0] == "epoch":
        blocks, device, runs = 9963, "", []
        it = iter(argv[2:])
        for a in it:
            if a == "--blocks":
                blocks = int(next(it))
            elif a == "--device":
                device = next(it)
            else:
                runs.append(a)
        return epoch(argv[1], runs, blocks, device)
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
