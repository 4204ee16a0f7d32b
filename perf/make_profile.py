#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
"""Measure a timing profile for `gnh plan` on this machine.

  perf/make_profile.py DECK --name NAME [--out jobscripts/profiles] [--repeats 3] [--target cpu|gh200]

A profile is keyed by the target it was measured on (cpu, or gh200 for a
GPU build; detected from bench_engine's build unless given) and the deck's
recipe (model, context, precision, curvature method, batch sizes, directions
per pass, ranks per checkpoint; printed by `gnh plan DECK --print-recipe`),
and holds the measured costs the planner adds up:

  seconds_per_gradient_microbatch      one gradient microbatch (grad_microbatch x context)
  seconds_per_hvp_batch_per_direction  one HVP batch (hvp_batch x context) per direction, at
                                       K = directions_per_pass, by the deck's curvature method
  seconds_per_group_startup            reading a checkpoint and planning an engine
  seconds_per_shard_startup            a whole `gnh run --dry-run` (MPI, deck, hashing, data)

The engine timings come from bench_engine in the deck's precision policy
(tf32 is timed as tf32: on a GPU it is not fp32) on every distinct checkpoint
state and every data case of the deck; each cost is the maximum over them, so
that an estimate covers the slowest (`sources` lists them all). A profile is
valid for the machine it was measured on.
"""
import argparse
import datetime
import glob
import json
import os
import platform
import subprocess
import sys
import time
import tomllib

import h5py

HERE = os.path.dirname(os.path.realpath(__file__))
ROOT = os.path.dirname(HERE)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("deck")
    ap.add_argument("--name", required=True)
    ap.add_argument("--out", default=os.path.join(ROOT, "jobscripts", "profiles"))
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--target", choices=("cpu", "gh200"), help="default: gh200 for a CUDA build, else cpu")
    ap.add_argument("--gnh", default=os.path.join(ROOT, "build", "bin", "gnh"))
    ap.add_argument("--bench", default=os.path.join(ROOT, "build", "bin", "bench_engine"))
    args = ap.parse_args()
    deck_dir = os.path.dirname(os.path.abspath(args.deck))
    with open(args.deck, "rb") as f:
        deck = tomllib.load(f)
    recipe = json.loads(subprocess.run([args.gnh, "plan", args.deck, "--jobs", "1", "--print-recipe"],
                                       check=True, capture_output=True, text=True).stdout.strip().splitlines()[-1])
    ckpts = sorted(p for pat in deck["checkpoints"]["paths"] for p in glob.glob(os.path.join(deck_dir, pat)))
    if not ckpts:
        sys.exit(f"make_profile: {args.deck}: no checkpoints")
    cases = [(name, os.path.join(deck_dir, deck["data"][name]["path"])) for name in ("seen", "unseen")
             if name in deck["data"]]
    a = deck.get("analysis", {})
    gmb, hvp, K = a.get("grad_microbatch", 32), a.get("hvp_batch", 64), a.get("directions_per_pass", 8)
    method = a.get("curvature_method", "second-order-forward")
    precision = deck.get("precision", {}).get("policy", "fp32")

    # Only the passes and the curvature method the deck runs: timing the other
    # method too made a profile cost three times as much.
    def bench(ckpt, tokens, batch, passes):
        r = subprocess.run([args.bench, ckpt, tokens, "--context", str(deck["data"]["context"]), "--batch",
                            str(batch), "--directions", str(K), "--methods", method, "--passes", ",".join(passes),
                            "--repeats", str(args.repeats), "--precision", precision],
                           check=True, capture_output=True, text=True)
        return json.loads(r.stdout)

    # Every distinct state (aliases hash alike) and every case; the maximum of each cost.
    states = {}
    for c in ckpts:
        with h5py.File(c, "r") as f:
            states.setdefault(str(f.attrs.get("param_sha256", c)), c)
    sources = []
    for ckpt in states.values():
        for name, tokens in cases:
            g = bench(ckpt, tokens, gmb, ["gradient", "curvature"] if hvp == gmb else ["gradient"])
            c = g if hvp == gmb else bench(ckpt, tokens, hvp, ["curvature"])
            sources.append({"checkpoint": os.path.basename(ckpt), "case": name,
                            "seconds_per_gradient_microbatch": g["gradient"]["seconds"],
                            "seconds_per_hvp_batch_per_direction": next(
                                x["seconds_per_direction"] for x in c["curvature"] if x["method"] == method and
                                x["K"] == K),
                            "seconds_per_group_startup": g["setup_seconds"]})
    worst = {k: max(s[k] for s in sources) for k in ("seconds_per_gradient_microbatch",
                                                     "seconds_per_hvp_batch_per_direction",
                                                     "seconds_per_group_startup")}
    per_dir = worst["seconds_per_hvp_batch_per_direction"]
    target = args.target or ("gh200" if "Cuda" in g["context"]["build"] else "cpu")
    t0 = time.perf_counter()
    subprocess.run([args.gnh, "run", args.deck, "--dry-run", "--quiet"], check=True, capture_output=True)
    shard_startup = time.perf_counter() - t0
    profile = {
        "name": args.name,
        "machine": platform.node(),
        "processor": platform.processor() or platform.machine(),
        "measured": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "gnh_commit": g["context"]["git_commit"],
        "build": g["context"]["build"],
        "threads": {"OPENBLAS_NUM_THREADS": os.environ.get("OPENBLAS_NUM_THREADS"),
                    "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS")},
        "target": target,
        "recipe": recipe,
        "seconds_per_gradient_microbatch": worst["seconds_per_gradient_microbatch"],
        "seconds_per_hvp_batch_per_direction": per_dir,
        "seconds_per_group_startup": worst["seconds_per_group_startup"],
        "seconds_per_shard_startup": shard_startup,
        "rule": "each cost is the maximum over the sources (every distinct state x case)",
        "sources": sources,
    }
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, args.name + ".json")
    with open(path, "w") as f:
        json.dump(profile, f, indent=2)
        f.write("\n")
    print(f"make_profile: {path} ({target}, {len(sources)} state x case source(s)): gradient microbatch {profile['seconds_per_gradient_microbatch']:.4f} s, "
          f"HVP batch per direction {per_dir:.4f} s, group start-up {profile['seconds_per_group_startup']:.3f} s, "
          f"shard start-up {shard_startup:.2f} s")


if __name__ == "__main__":
    main()
