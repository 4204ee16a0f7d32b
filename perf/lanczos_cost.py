#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
"""What a Lanczos step of the spectrum (doc/statistics.md) costs beside a
plain forward-over-reverse epoch pass of the same K, from `gnh run`'s own
timings.

  perf/lanczos_cost.py [--preset small] [--blocks 32] [--steps 100] [--chains 4]
  perf/lanczos_cost.py --demo [--steps 30]      # the demo campaign's epoch-3 state

One deck, one rank, fp32, forward-over-reverse with K = chains: the §4
curvature stage is exactly one epoch pass of K directions (G and chains - 1
Rademacher directions, no noise samples), and the spectrum then runs
`--steps` Lanczos steps with no early stop (tolerance 0), each one epoch pass
of K = chains plus the Lanczos arithmetic (dot products,
reorthogonalisation, Ritz pairs). Prints the plain pass, the spectrum's pass
per step, its arithmetic per step, and the arithmetic as a share of the pass
(the reorthogonalisation's overhead; it grows linearly with the step, so the
mean over m steps is that of step m/2).
"""
import argparse
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.realpath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tests", "integration"))
import gnhtest  # noqa: E402
import h5py  # noqa: E402
import numpy as np  # noqa: E402
from side_by_side import PRESETS  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="small", choices=sorted(PRESETS))
    ap.add_argument("--demo", action="store_true", help="the demo campaign's ckpt_epoch3 and its first 256 blocks")
    ap.add_argument("--blocks", type=int, default=32, help="blocks of the epoch (preset)")
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--chains", type=int, default=4)
    ap.add_argument("--gnh", default=gnhtest.GNH)
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="gnh-lanczos-cost-")
    if args.demo:
        ckpt = os.path.join(ROOT, "build", "demo", "h5", "ckpt_epoch3.h5")
        tokens = os.path.join(ROOT, "build", "demo", "data", "train.bin")
        if not os.path.exists(ckpt):
            sys.exit("lanczos_cost: no demo campaign: run cmake/demo.sh first")
        context, batch, blocks, label = 64, 64, 256, "demo (ckpt_epoch3, 256 blocks of 64)"
    else:
        nl, nh, ne, vocab, context, batch = PRESETS[args.preset]
        cfg = gnhtest.gnh_model.GPTConfig(n_layer=nl, n_head=nh, n_embd=ne, block_size=context, vocab_size=vocab,
                                          bias=False, tie_embeddings=True)
        ckpt = gnhtest.save_checkpoint(gnhtest.make_model(cfg, seed=1, scale=0.3), tmp, "preset")
        tokens = os.path.join(tmp, "train.bin")
        gnhtest.write_tokens(tokens, context * args.blocks + 1, vocab, 1)
        blocks, label = args.blocks, f"preset {args.preset} ({args.blocks} blocks of {context})"
    deck = os.path.join(tmp, "deck.toml")
    gnhtest.write_deck(deck, "out.h5", [ckpt], context, tokens,
                       analysis=dict(grad_microbatch=batch, hvp_batch=batch, noise_samples=0, noise_batch=1,
                                     directions=args.chains - 1, directions_per_pass=args.chains, seed=1,
                                     curvature_method="forward-over-reverse"))
    with open(deck, "a") as f:
        f.write(f"[precision]\npolicy = \"fp32\"\n[curvature]\nlanczos_steps = {args.steps}\n"
                f"lanczos_chains = {args.chains}\nlanczos_tolerance = 0\n")
    sets = ["data.max_blocks=%d" % blocks] if args.demo else []
    cmd = [gnhtest.MPIEXEC, "-np", "1", args.gnh, "run", deck, "--quiet"]
    for s in sets:
        cmd += ["--set", s]
    r = subprocess.run(cmd, capture_output=True, text=True, env=gnhtest.mpi_env())
    if r.returncode != 0:
        sys.exit(r.stderr + r.stdout)
    with h5py.File(os.path.join(tmp, "out.h5"), "r") as f:
        (g,) = f["groups"].values()
        t = g["seen/timings"]
        stages = [gnhtest.text(s) for s in t.attrs["stages"]]
        sec = dict(zip(stages, t[()]))
        steps = int(g["seen/spectrum/chain_steps"][0])
        n_params = int(g.attrs["n_params"])
    plain = sec["curvature"]
    per_pass = sec["spectrum_passes"] / steps
    per_arith = sec["spectrum_arithmetic"] / steps
    print(f"{label}: {n_params} parameters, K = {args.chains} chains, {steps} steps, fp32, 1 rank")
    print(f"| plain forward-over-reverse pass (K = {args.chains}) | {plain:.3f} s |")
    print(f"| spectrum: epoch pass per step | {per_pass:.3f} s ({per_pass / plain:.3f} of the plain pass) |")
    print(f"| spectrum: Lanczos arithmetic per step (mean over {steps}) | {per_arith * 1e3:.1f} ms "
          f"({100 * per_arith / per_pass:.2f}% of the step's pass) |")
    print(f"| spectrum: whole step / plain pass | {(per_pass + per_arith) / plain:.3f} |")


if __name__ == "__main__":
    main()
