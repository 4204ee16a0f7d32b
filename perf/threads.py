#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
"""Threads on one rank: bench_engine of a build with the OpenMP host backend
(cmake/check-openmp.sh builds one into build-openmp/) run at each thread count
in turn, rounds interleaved so that a slow spell of a shared machine falls on
every count alike, and the median of each pass over the rounds compared with
the first count's. Prints a table and writes JSON.

  perf/threads.py [--threads 1,2] [--rounds 3] [--bench build-openmp/bin/bench_engine]
                  [--synthetic small] [--batch 4] [--directions 1,16]
                  [--passes forward,gradient,curvature] [--json OUT.json]

For the reference configuration's gradient (SPEC §1), one short batch:
  perf/threads.py --synthetic reference --batch 1 --passes gradient --rounds 2
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.realpath(__file__))
ROOT = os.path.dirname(HERE)


def run_once(args, threads):
    env = dict(os.environ)
    env["OMP_NUM_THREADS"] = str(threads)
    env.setdefault("OMP_PROC_BIND", "false")
    cmd = [args.bench, "--synthetic", args.synthetic, "--batch", str(args.batch), "--directions", args.directions,
           "--methods", args.methods, "--passes", args.passes, "--repeats", str(args.repeats)]
    out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout
    js = json.loads(out[out.index("{"):])
    ctx = js["context"]
    if ctx.get("concurrency") != threads:
        sys.exit(f"threads.py: asked for {threads} thread(s), bench_engine ran on {ctx.get('concurrency')} "
                 f"({ctx.get('execution_space')}): is {args.bench} an OpenMP build?")
    rows = {}
    for name in ("forward", "gradient"):
        if name in js:
            rows[name] = js[name]["seconds"]
    for c in js.get("curvature", []):
        rows[f"{c['method']} K={c['K']} per direction"] = c["seconds_per_direction"]
    probe = ctx.get("host_gemm_probe") or {}
    return rows, ctx.get("host_gemm"), probe.get("reason", "")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--bench", default=os.path.join(ROOT, "build-openmp", "bin", "bench_engine"))
    ap.add_argument("--synthetic", default="small")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--directions", default="1,16")
    ap.add_argument("--methods", default="second-order-forward,forward-over-reverse")
    ap.add_argument("--passes", default="forward,gradient,curvature")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json")
    args = ap.parse_args()
    counts = [int(t) for t in args.threads.split(",")]
    samples = {t: {} for t in counts}
    gemm = {t: [] for t in counts}
    for r in range(args.rounds):
        for t in counts:
            rows, chosen, reason = run_once(args, t)
            for k, v in rows.items():
                samples[t].setdefault(k, []).append(v)
            gemm[t].append(chosen)
            print(f"round {r + 1}, {t} thread(s): sgemm {chosen}; {reason}", flush=True)
    base = counts[0]
    names = list(samples[base].keys())
    table = []
    print(f"\n{args.synthetic}, batch {args.batch}: median seconds over {args.rounds} rounds")
    print("| pass | " + " | ".join(f"{t} thread(s)" for t in counts) + " | " +
          " | ".join(f"speed-up at {t}" for t in counts[1:]) + " |")
    print("|---" * (1 + 2 * len(counts) - 1) + "|")
    for n in names:
        med = {t: statistics.median(samples[t][n]) for t in counts}
        sp = {t: med[base] / med[t] for t in counts[1:]}
        table.append({"pass": n, "median_seconds": med, "speedup": sp, "samples": {t: samples[t][n] for t in counts}})
        print(f"| {n} | " + " | ".join(f"{med[t]:.4g}" for t in counts) + " | " +
              " | ".join(f"{sp[t]:.2f}x" for t in counts[1:]) + " |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"bench": args.bench, "synthetic": args.synthetic, "batch": args.batch, "threads": counts,
                       "rounds": args.rounds, "host_gemm": gemm, "cpu": cpu_model(), "passes": table}, f, indent=1)


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


if __name__ == "__main__":
    main()
