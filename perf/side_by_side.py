#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
"""Side-by-side benchmark: gnh's engine (bench_engine) against the PyTorch
reference (bench_torch) on the same generated checkpoint, data, batch and
thread count (one core: OPENBLAS_NUM_THREADS=1, torch.set_num_threads(1)), in
one process tree. Prints a table and writes JSON with the ratios.

gnh multiplies with its own host sgemm where the CPU has AVX2 or AVX-512
(kernels/host_gemm.hpp); the sgemm rate of both that and the vendor BLAS torch
uses are measured in the same run and printed. PyTorch runs at its fastest
setting on this CPU, chosen by measurement before the run
(perf/torch_setting.py: OpenBLAS's kernels, glibc's allocator, ATen's
kernels; --torch-setting as-is keeps the environment as it is). The
environment applies to both sides: GNH_HOST_GEMM=vendor puts gnh on torch's
BLAS too, and OPENBLAS_CORETYPE picks OpenBLAS's kernels for both.

Both sides run in interleaved rounds (--rounds, default 3), each giving its
own ratios; the table and the JSON's "ratios" are the medians over the
rounds, "ratio_ranges" their least and greatest, and "rounds" every round's
results. Within a round (--pairing pass, the default) each of gnh's passes
(forward and gradient; the curvature at each K) is followed at once by the
PyTorch passes it is compared with, so that the two sides of a ratio are
measured seconds apart, not a minute; each round's "segments" records when
each side of each pass ran. (--pairing round: all of gnh's passes, then all
of PyTorch's, the two sides of a ratio a minute apart.) A slow stretch of a
shared machine then falls on both sides of a ratio instead of on one side's
whole run.

  perf/side_by_side.py [--preset small|medium|reference] [--family nanogpt|llama|gpt-neox] [--directions 1,16]
                       [--repeats 3] [--rounds 3] [--pairing pass|round] [--json OUT.json]
                       [--bench build/bin/bench_engine] [--torch-setting fastest|as-is]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

os.environ["OPENBLAS_NUM_THREADS"] = os.environ.get("GNH_BENCH_THREADS", "1")
os.environ["OMP_NUM_THREADS"] = os.environ["OPENBLAS_NUM_THREADS"]

HERE = os.path.dirname(os.path.realpath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "apps", "python"))
sys.path.insert(0, HERE)

import numpy as np  # noqa: E402
import torch  # noqa: E402

import bench_torch  # noqa: E402
import torch_setting  # noqa: E402
import gnh_model  # noqa: E402

PRESETS = {
    # name: (n_layer, n_head, n_embd, vocab, context, batch)
    "tiny": (1, 2, 16, 64, 16, 2),
    "small": (2, 4, 128, 1024, 128, 4),
    "medium": (4, 4, 256, 4096, 256, 4),
    "reference": (8, 5, 320, 32000, 1024, 64),
}


def family_config(family, preset):
    """A preset's sizes in a SPEC section 11 family: Llama with grouped-query
    attention (n_head/2 key/value heads, n_head/2 rounded up to 1) and SwiGLU
    of width 8d/3 rounded to 16 (its parameters those of a 4d GELU MLP);
    GPT-NeoX as Pythia (parallel residual, rotary_pct 0.25, untied, biases)."""
    from gnh_layout import HFConfig
    nl, nh, ne, vocab, T, _ = PRESETS[preset]
    if family == "llama":
        return HFConfig(family="llama", vocab_size=vocab, hidden_size=ne, intermediate_size=(8 * ne // 3 + 15) // 16 * 16,
                        num_hidden_layers=nl, num_attention_heads=nh, num_key_value_heads=max(1, nh // 2),
                        max_position_embeddings=T, tie_word_embeddings=True)
    return HFConfig(family="gpt-neox", vocab_size=vocab, hidden_size=ne, intermediate_size=4 * ne, num_hidden_layers=nl,
                    num_attention_heads=nh, max_position_embeddings=T, rotary_pct=0.25, use_parallel_residual=True,
                    hidden_act="gelu", qkv_bias=True, norm_eps=1e-5)


def per_dir(results, method, K):
    return next(c["seconds_per_direction"] for c in results["curvature"] if c["method"] == method and c["K"] == K)


def ratios_of(ours, theirs, Ks):
    """One round's ratios: throughput gnh / torch, and per direction torch / gnh's faster method."""
    ratios = {"gradient_throughput_vs_eager": ours["gradient"]["tokens_per_s"] / theirs["gradient"]["tokens_per_s"],
              "forward_throughput_vs_eager": ours["forward"]["tokens_per_s"] / theirs["forward"]["tokens_per_s"]}
    for K in Ks:
        best = min(per_dir(ours, "forward-over-reverse", K), per_dir(ours, "second-order-forward", K))
        for m in ("eager-double-backward", "functorch-forward-over-reverse"):
            try:
                ratios[f"{m}_K{K}_vs_best"] = per_dir(theirs, m, K) / best
            except StopIteration:
                continue
    return ratios


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="small", choices=sorted(PRESETS))
    ap.add_argument("--family", default="nanogpt", choices=("nanogpt", "llama", "gpt-neox"),
                    help="the model family at the preset's sizes (family_config)")
    ap.add_argument("--directions", default="1,16")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds of both sides (ratios: their median)")
    ap.add_argument("--pairing", default="pass", choices=("pass", "round"),
                    help="pass: each of gnh's passes followed at once by the PyTorch passes it is compared with; "
                         "round: all of gnh's passes, then all of PyTorch's")
    ap.add_argument("--json", default=None)
    ap.add_argument("--bench", default=os.path.join(ROOT, "build", "bin", "bench_engine"))
    ap.add_argument("--no-functorch", action="store_true")
    ap.add_argument("--torch-setting", default="fastest", choices=("fastest", "as-is"),
                    help="fastest: choose PyTorch's BLAS kernels, allocator and ATen kernels by measurement "
                         "(perf/torch_setting.py) and rerun under them; as-is: the environment as it is")
    args = ap.parse_args()
    chosen = os.environ.get("GNH_TORCH_SETTING")
    if args.torch_setting == "fastest" and chosen is None:
        # The settings act when torch is loaded: choose, then start again under them.
        setting, table = torch_setting.choose(args.preset)
        torch_setting.apply(setting)
        os.environ["GNH_TORCH_SETTING"] = json.dumps({"chosen_by": "measurement", "setting": setting, "table": table})
        sys.stdout.flush()
        os.execv(sys.executable, [sys.executable, os.path.realpath(__file__)] + sys.argv[1:])
    setting = json.loads(chosen) if chosen else {
        "chosen_by": "environment", "setting": {k: os.environ.get(k) for k in torch_setting.KEYS}}
    setting["cpu_capability"] = torch_setting.cpu_capability(torch)
    nl, nh, ne, vocab, T, B = PRESETS[args.preset]
    Ks = [int(k) for k in args.directions.split(",")]
    if args.family == "nanogpt":
        cfg = gnh_model.GPTConfig(n_layer=nl, n_head=nh, n_embd=ne, block_size=T, vocab_size=vocab,
                                  bias=False, tie_embeddings=True)
    else:
        cfg = family_config(args.family, args.preset)
    with tempfile.TemporaryDirectory(prefix="gnh-bench-") as d:
        make = bench_torch.synthetic_case if args.family == "nanogpt" else bench_torch.family_synthetic_case
        h5, tok, ids, state, names = make(cfg, d, B * T + 1)
        idx = torch.from_numpy(ids[:B * T].astype(np.int64)).view(B, T)
        tgt = torch.from_numpy(ids[1:B * T + 1].astype(np.int64)).view(B, T)
        if args.no_functorch:
            bench_torch.functorch = None
        def engine(extra):
            r = subprocess.run([args.bench, h5, tok, "--context", str(T), "--batch", str(B), "--repeats",
                                str(args.repeats)] + extra, capture_output=True, text=True)
            if r.returncode != 0:
                sys.exit(f"side_by_side: bench_engine failed: {r.stderr}")
            return json.loads(r.stdout)

        # A round's segments: each of gnh's passes and then, at once, the
        # PyTorch passes it is compared with (--pairing pass), or all of gnh's
        # passes and then all of PyTorch's (--pairing round).
        if args.pairing == "pass":
            segments = [(("forward", "gradient"), [])] + [(("curvature",), [K]) for K in Ks]
        else:
            segments = [(("forward", "gradient", "curvature"), Ks)]
        rounds = []
        for _ in range(max(1, args.rounds)):
            ours, theirs, times = None, None, []
            for seg_passes, seg_Ks in segments:
                passes, dirs = ",".join(seg_passes), ",".join(str(K) for K in seg_Ks) or "1"
                t0 = time.time()
                o = engine(["--passes", passes, "--directions", dirs])
                t1 = time.time()
                t = bench_torch.bench(cfg, state, names, idx, tgt, seg_Ks, args.repeats, passes=seg_passes)
                times.append({"passes": passes, "directions": dirs, "gnh": [t0, t1], "torch": [t1, time.time()]})
                if ours is None:
                    ours, theirs = o, t
                else:
                    ours["curvature"] += o["curvature"]
                    theirs["curvature"] += t["curvature"]
            rounds.append({"gnh": ours, "torch": theirs, "ratios": ratios_of(ours, theirs, Ks), "segments": times})

    ratios = {k: statistics.median(r["ratios"][k] for r in rounds) for k in rounds[0]["ratios"]}
    ranges = {k: [min(r["ratios"][k] for r in rounds), max(r["ratios"][k] for r in rounds)] for k in ratios}

    def med(side, get):
        return statistics.median(get(r[side]) for r in rounds)

    def shown(k):
        lo, hi = ranges[k]
        return f"{ratios[k]:8.2f}  ({lo:.2f}-{hi:.2f})" if len(rounds) > 1 else f"{ratios[k]:8.2f}"

    ours = rounds[0]["gnh"]
    print(f"preset {args.preset} ({args.family}): {ours['context']['n_params']} parameters, batch {B} x {T} tokens, one thread; "
          f"{len(rounds)} interleaved round(s), medians (ratio range over rounds)")
    print("torch setting (" + setting["chosen_by"] + "): " + ", ".join(
        f"{k}={v if v is not None else '(unset)'}" for k, v in setting["setting"].items()) +
        f"; ATen {setting['cpu_capability']}")
    sgs = [r["gnh"].get("sgemm_gflops", {}) for r in rounds]
    print(f"sgemm 512^3 in this run: gnh's GEMM ({ours['context'].get('host_gemm', '?')}) "
          f"{statistics.median(g.get('gnh', 0) for g in sgs):.1f} GFLOP/s, the vendor BLAS torch also uses "
          f"{statistics.median(g.get('vendor', 0) for g in sgs):.1f} GFLOP/s")
    print(f"{'pass':38s} {'gnh':>12s} {'torch':>12s} {'ratio':>8s}")
    for pas in ("forward", "gradient"):
        print(f"{pas + ' tokens/s':38s} {med('gnh', lambda x: x[pas]['tokens_per_s']):12.0f} "
              f"{med('torch', lambda x: x[pas]['tokens_per_s']):12.0f} {shown(pas + '_throughput_vs_eager')}")
    for K in Ks:
        for m in ("forward-over-reverse", "second-order-forward"):
            print(f"{'gnh ' + m + f' K={K} s/dir':38s} {med('gnh', lambda x: per_dir(x, m, K)):12.4f}")
        for m in ("eager-double-backward", "functorch-forward-over-reverse"):
            key = f"{m}_K{K}_vs_best"
            if key not in ratios:
                continue
            print(f"{'torch ' + m + f' K={K} s/dir':38s} {'':12s} {med('torch', lambda x: per_dir(x, m, K)):12.4f} "
                  f"{shown(key)}")
    out = {"preset": args.preset, "family": args.family, "gnh": rounds[0]["gnh"], "torch": rounds[0]["torch"], "torch_setting": setting,
           "ratios": ratios, "ratio_ranges": ranges, "rounds": rounds}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)
    return out


if __name__ == "__main__":
    main()
