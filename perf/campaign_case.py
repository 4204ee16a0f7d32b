#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
"""One campaign case end to end: `gnh run` against the same statistics in
PyTorch eager, on one thread each, in interleaved rounds.

The case is shaped like one group of a campaign: a synthetic GPT of 4
layers, 4 heads, d 128, vocabulary 1024, context 128 (bias-free, tied), one
data case ("seen") of 64 blocks, and the statistics L, G = grad L, G^T H G
and v^T H v for 8 Rademacher directions (no noise samples), the default
curvature method with 8 directions a pass (G and the 8 run as passes of 5
and 4). gnh's time is the wall time of the whole `gnh run` process: start-up,
the GEMM probe, reading the checkpoint and tokens, the analysis (its epoch
gradient, its curvature passes and the identity checks it records) and the
output's atomic write, in a fresh process each round. PyTorch's is the same
mathematics and nothing else, after one untimed warm-up pass in its process:
the epoch gradient in microbatches of grad_microbatch blocks, then per hvp
batch one create_graph gradient and one double backward for each of the 9
directions (the graph shared over directions), on the tensors already in
memory. So the ratio understates gnh's.

Both sides must agree: the script checks L, |G|^2 and G^T H G from gnh's
output against PyTorch's (the Rademacher directions are not reproduced on
the PyTorch side; their forms are timed, not compared). Tolerances: float32
sums of 8192 token losses and of 0.8 M gradient entries, each side in its own
order: 1e-5 relative on L and |G|^2; G^T H G is a second derivative through
the same float32 network, 1e-3 relative.

  perf/campaign_case.py [--blocks 64] [--rounds 3] [--gnh build/bin/gnh] [--json OUT.json]

The environment applies to both sides (OPENBLAS_CORETYPE,
ATEN_CPU_CAPABILITY, the allocator; GNH_HOST_GEMM for gnh): see
perf/torch_setting.py, and set them as side_by_side.py's AVX2 runs do.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.realpath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "apps", "python"))
sys.path.insert(0, HERE)

import h5py  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

import bench_torch  # noqa: E402
import gnh_model  # noqa: E402

SHAPE = dict(n_layer=4, n_head=4, n_embd=128, vocab_size=1024, block_size=128)
GRAD_MICROBATCH, HVP_BATCH, DIRECTIONS, PER_PASS = 32, 64, 8, 8


def deck_text(h5, tok, out, blocks):
    return f"""[run]
name = "campaign-case"
output = "{out}"
[checkpoints]
paths = ["{h5}"]
[data]
context = {SHAPE['block_size']}
max_blocks = {blocks}
seen = {{ path = "{tok}", dtype = "uint16" }}
[analysis]
grad_microbatch = {GRAD_MICROBATCH}
hvp_batch = {HVP_BATCH}
noise_samples = 0
directions = {DIRECTIONS}
directions_per_pass = {PER_PASS}
seed = 1234
[precision]
policy = "fp32"
[parallel]
ranks_per_checkpoint = 1
"""


def run_gnh(gnh, deck, out):
    # A new output each round: a rerun of the same output skips finished groups.
    os.makedirs(os.path.dirname(out), exist_ok=True)
    t0 = time.perf_counter()
    r = subprocess.run([gnh, "run", deck, "--set", f"run.output={out}"], capture_output=True, text=True,
                       env=dict(os.environ, OMP_NUM_THREADS="1"))
    t = time.perf_counter() - t0
    if r.returncode != 0:
        sys.exit(f"campaign_case: gnh run failed ({r.returncode}):\n{r.stdout}\n{r.stderr}")
    with h5py.File(out, "r") as f:
        (g,) = f["groups"].values()
        c = g["seen"]
        stats = {k: float(c.attrs[k]) for k in ("loss", "G_sqnorm", "GHG")}
        stats["tokens"] = int(c.attrs["tokens"])
        timings = c["timings"]
        stages = {(n.decode() if isinstance(n, bytes) else str(n)): float(v)
                  for n, v in zip(timings.attrs["stages"], timings[()])}
    if "curvature" not in stages:
        sys.exit(f"campaign_case: {out} has no curvature stage (was the group skipped?): {stages}")
    return t, stats, stages


def run_torch(cfg, state, names, ids, blocks):
    T = SHAPE["block_size"]
    torch.set_num_threads(1)
    params = [state[n].float().clone().requires_grad_(True) for n in names]
    idx = torch.from_numpy(ids[:blocks * T].astype(np.int64)).view(blocks, T)
    tgt = torch.from_numpy(ids[1:blocks * T + 1].astype(np.int64)).view(blocks, T)
    ntok = idx.numel()
    gen = torch.Generator().manual_seed(1234)
    rad = [[torch.randint(0, 2, p.shape, generator=gen).float() * 2 - 1 for p in params] for _ in range(DIRECTIONS)]
    t0 = time.perf_counter()
    G = [torch.zeros_like(p) for p in params]
    loss = 0.0
    for b in range(0, blocks, GRAD_MICROBATCH):
        ls = bench_torch.loss_sum(params, names, cfg, idx[b:b + GRAD_MICROBATCH], tgt[b:b + GRAD_MICROBATCH])
        gs = torch.autograd.grad(ls, params)
        loss += float(ls)
        for a, g in zip(G, gs):
            a += g
    G = [g / ntok for g in G]
    t_grad = time.perf_counter() - t0
    quads = [0.0] * (1 + DIRECTIONS)
    for b in range(0, blocks, HVP_BATCH):
        ls = bench_torch.loss_sum(params, names, cfg, idx[b:b + HVP_BATCH], tgt[b:b + HVP_BATCH])
        g = torch.autograd.grad(ls, params, create_graph=True)
        for k, v in enumerate([G] + rad):
            hv = torch.autograd.grad(g, params, grad_outputs=v, retain_graph=True)
            quads[k] += float(sum((a * c).sum() for a, c in zip(hv, v)))
    t = time.perf_counter() - t0
    return t, t_grad, {"loss": loss / ntok, "G_sqnorm": float(sum((g.double() ** 2).sum() for g in G)),
                       "GHG": quads[0] / ntok, "tokens": ntok}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--blocks", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--gnh", default=os.path.join(ROOT, "build", "bin", "gnh"))
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    cfg = gnh_model.GPTConfig(bias=False, tie_embeddings=True, **SHAPE)
    rounds = []
    with tempfile.TemporaryDirectory(prefix="gnh-case-") as d:
        h5, tok, ids, state, names = bench_torch.synthetic_case(cfg, d, args.blocks * SHAPE["block_size"] + 1)
        out, deck = os.path.join(d, "out.h5"), os.path.join(d, "deck.toml")
        with open(deck, "w") as f:
            f.write(deck_text(h5, tok, out, args.blocks))
        # PyTorch's first pass in a process grows its heap (tens of seconds
        # more here): one untimed pass first, as a pipeline analysing many
        # cases in one process would have. gnh's side is a fresh process
        # each round and pays its start-up and first touch every time.
        run_torch(cfg, state, names, ids, args.blocks)
        for _ in range(max(1, args.rounds)):
            t_gnh, ours, stages = run_gnh(args.gnh, deck, os.path.join(d, f"round{len(rounds)}", "out.h5"))
            t_torch, t_torch_grad, theirs = run_torch(cfg, state, names, ids, args.blocks)
            rounds.append({"gnh_seconds": t_gnh, "gnh_stages": stages, "torch_seconds": t_torch,
                           "torch_gradient_seconds": t_torch_grad, "ratio": t_torch / t_gnh,
                           "gnh": ours, "torch": theirs})
            print(f"round {len(rounds)}: gnh run {t_gnh:.2f} s, torch {t_torch:.2f} s "
                  f"(gradient {t_torch_grad:.2f} s): {t_torch / t_gnh:.2f}x", flush=True)
    # Agreement (tolerances in the module's docstring).
    ours, theirs = rounds[0]["gnh"], rounds[0]["torch"]
    bad = []
    if ours["tokens"] != theirs["tokens"]:
        bad.append(f"tokens {ours['tokens']} vs {theirs['tokens']}")
    for k, tol in (("loss", 1e-5), ("G_sqnorm", 1e-5), ("GHG", 1e-3)):
        rel = abs(ours[k] - theirs[k]) / abs(theirs[k])
        print(f"{k:10s} gnh {ours[k]:.9g}  torch {theirs[k]:.9g}  relative difference {rel:.2e} (tolerance {tol:g})")
        if not rel <= tol:
            bad.append(k)
    ratio = statistics.median(r["ratio"] for r in rounds)
    print(f"campaign case, {args.blocks} blocks of {SHAPE['block_size']} tokens, G + {DIRECTIONS} directions at "
          f"K = {PER_PASS}: gnh {statistics.median(r['gnh_seconds'] for r in rounds):.2f} s, torch eager "
          f"{statistics.median(r['torch_seconds'] for r in rounds):.2f} s, ratio {ratio:.2f} "
          f"({min(r['ratio'] for r in rounds):.2f}-{max(r['ratio'] for r in rounds):.2f})")
    if args.json:
        env = {k: os.environ.get(k) for k in ("OPENBLAS_CORETYPE", "ATEN_CPU_CAPABILITY", "MALLOC_MMAP_THRESHOLD_",
                                              "MALLOC_TRIM_THRESHOLD_", "GNH_HOST_GEMM")}
        with open(args.json, "w") as f:
            json.dump({"shape": SHAPE, "blocks": args.blocks, "environment": env, "ratio": ratio,
                       "rounds": rounds}, f, indent=2)
    if bad:
        sys.exit("campaign_case: gnh and PyTorch disagree: " + ", ".join(bad))


if __name__ == "__main__":
    main()
