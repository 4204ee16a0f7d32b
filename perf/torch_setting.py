#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
"""PyTorch at its fastest setting on this CPU, chosen by measurement.

Three things decide how fast Debian's torch 1.13 runs on one core, and all
must be in the environment before torch is imported:

  OPENBLAS_CORETYPE    OpenBLAS's kernels. Version 0.3.21 does not know every
                       CPU: on an AMD EPYC Zen 5 it takes Haswell (AVX2)
                       kernels, 100 GFLOP/s sgemm against SkylakeX's 200.
  glibc's allocator    torch frees and reallocates its tensors on every pass;
                       with glibc's defaults, memory above the mmap threshold
                       goes back to the kernel and comes back as page faults
                       (on a VM: the gradient of preset small 40-170 ms, run
                       to run). MALLOC_MMAP_THRESHOLD_ = 32 MiB (glibc's
                       largest) and a trim threshold of 16 GiB keep it in the
                       heap: 26-35 ms, steady.
  ATEN_CPU_CAPABILITY  ATen's vectorised elementwise kernels (AVX2 by default
                       even where the CPU has AVX-512).

choose() decides them in that order, each by measurement in a fresh
interpreter: the OpenBLAS kernels with the highest sgemm 512^3 rate, then the
allocator and then the ATen kernels by the time of the PyTorch reference's
forward and gradient on the preset's model (bench_torch). It returns the
choice and the table of what it measured. The environment then applies to
both sides of a side-by-side run: gnh's vendor-BLAS fallback gets the same
OpenBLAS kernels and allocator (gnh allocates its workspace once).

  perf/torch_setting.py [--preset small]    prints the table and the choice
"""
import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.realpath(__file__))
ROOT = os.path.dirname(HERE)

# The allocator setting that keeps torch's tensors in the heap.
TUNED_MALLOC = {"MALLOC_MMAP_THRESHOLD_": "33554432", "MALLOC_TRIM_THRESHOLD_": "17179869184"}
KEYS = ("OPENBLAS_CORETYPE", "ATEN_CPU_CAPABILITY") + tuple(TUNED_MALLOC)


def cpu_flags():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags") or line.startswith("Features"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def options(flags=None, env=None):
    """The values tried for each choice, the inherited one first (None: unset)."""
    flags = cpu_flags() if flags is None else flags
    env = os.environ if env is None else env
    cores, atens = [env.get("OPENBLAS_CORETYPE")], [env.get("ATEN_CPU_CAPABILITY")]
    if {"avx2", "fma"} <= flags:
        cores.append("Haswell")
        atens.append("avx2")
    if {"avx512f", "avx512bw", "avx512vl", "avx512dq"} <= flags:
        cores.append("SkylakeX")
        atens.append("avx512")
    inherited_malloc = {k: env.get(k) for k in TUNED_MALLOC}
    mallocs = [inherited_malloc] + ([dict(TUNED_MALLOC)] if inherited_malloc != TUNED_MALLOC else [])
    dedupe = lambda xs: [x for i, x in enumerate(xs) if x not in xs[:i]]  # noqa: E731
    return dedupe(cores), dedupe(atens), mallocs


def _env_for(setting):
    env = dict(os.environ)
    for k, v in setting.items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = v
    env.setdefault("OPENBLAS_NUM_THREADS", "1")
    env.setdefault("OMP_NUM_THREADS", env["OPENBLAS_NUM_THREADS"])
    return env


def cpu_capability(torch):
    """The ATen kernels the loaded torch uses ("AVX2", "AVX512", ...)."""
    return torch.__config__.show().split("CPU capability usage: ")[-1].split("\n")[0]


def probe_here(preset, repeats):
    """In this interpreter (the environment already set): seconds of the
    reference's forward and gradient on the preset's model, and sgemm 512^3."""
    sys.path.insert(0, os.path.join(ROOT, "apps", "python"))
    sys.path.insert(0, HERE)
    import time

    import numpy as np
    import torch

    import bench_torch
    import gnh_model
    from side_by_side import PRESETS

    nl, nh, ne, vocab, T, B = PRESETS[preset]
    cfg = gnh_model.GPTConfig(n_layer=nl, n_head=nh, n_embd=ne, block_size=T, vocab_size=vocab, bias=False,
                              tie_embeddings=True)
    model = gnh_model.init_standard(gnh_model.GPT(cfg), 0)
    state = gnh_model.canonical_state_dict(model)
    ids = np.random.default_rng(0).integers(0, vocab, size=B * T + 1)
    idx = torch.from_numpy(ids[:B * T]).view(B, T)
    tgt = torch.from_numpy(ids[1:]).view(B, T)
    r = bench_torch.bench(cfg, state, gnh_model.canonical_names(cfg), idx, tgt, [], repeats)
    torch.set_num_threads(1)
    a, b = torch.randn(512, 512), torch.randn(512, 512)
    a @ b
    best = float("inf")
    for _ in range(10):
        t0 = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - t0)
    return {"forward_s": r["forward"]["seconds"], "gradient_s": r["gradient"]["seconds"],
            "sgemm_gflops": 2 * 512**3 / best / 1e9, "cpu_capability": cpu_capability(torch)}


def choose(preset="small", repeats=7, log=sys.stderr):
    """The fastest setting ({variable: value or None}) and the table of probes."""
    table = []

    def probe(setting):
        for row in table:
            if row["setting"] == setting:
                return row
        r = subprocess.run([sys.executable, os.path.realpath(__file__), "--probe", preset, "--repeats", str(repeats)],
                           env=_env_for(setting), capture_output=True, text=True)
        row = {"setting": dict(setting)}
        if r.returncode != 0:
            row["error"] = (r.stderr.strip().splitlines() or ["failed"])[-1]
        else:
            row.update(json.loads(r.stdout.strip().splitlines()[-1]))
            row["seconds"] = row["forward_s"] + row["gradient_s"]
        table.append(row)
        if log:
            desc = ", ".join(f"{k}={v if v is not None else '(unset)'}" for k, v in setting.items())
            what = (f"forward + gradient {row['seconds'] * 1e3:.1f} ms, sgemm {row['sgemm_gflops']:.0f} GFLOP/s, "
                    f"ATen {row['cpu_capability']}") if "seconds" in row else f"failed: {row['error']}"
            print(f"torch setting: {desc}: {what}", file=log)
        return row

    def best(settings, key):
        rows = [probe(s) for s in settings]
        ok = [(s, row) for s, row in zip(settings, rows) if "seconds" in row]
        if not ok:
            raise RuntimeError("torch_setting: every candidate setting failed to run the PyTorch reference")
        return min(ok, key=lambda sr: key(sr[1]))[0]

    cores, atens, mallocs = options()
    base = {"ATEN_CPU_CAPABILITY": atens[0], **mallocs[-1]}
    setting = best([{"OPENBLAS_CORETYPE": c, **base} for c in cores], lambda row: -row["sgemm_gflops"])
    setting = best([{**setting, **m} for m in mallocs], lambda row: row["seconds"])
    setting = best([{**setting, "ATEN_CPU_CAPABILITY": a} for a in atens], lambda row: row["seconds"])
    return setting, table


def apply(setting, env=None):
    env = os.environ if env is None else env
    for k, v in setting.items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = v


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="small")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--probe", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.probe:
        print(json.dumps(probe_here(args.probe, args.repeats)))
        return
    choice, table = choose(args.preset, args.repeats)
    print(json.dumps({"choice": choice, "table": table}, indent=2))


if __name__ == "__main__":
    main()
