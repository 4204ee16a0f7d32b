#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""PyTorch beside gnh in the device check (perf/device/run.sh), on the case
bench_engine --dump wrote (model.json, params.f32, tokens.i32, dirs.i8).

  torch_seed.py ceilings OUT.json [--size N] [--copy-bytes BYTES]
      this device's ceilings: an N^3 GEMM in bf16, TF32 and fp32 (torch.matmul:
      cuBLAS on a GPU), and a device-to-device copy (bytes read + written);
      medians of 10 after 3 warm-ups, on random data
  torch_seed.py seed CASE_DIR OUT.json --batch B --repeats R
                [--check-fp32 GNH.json --check-batch VB] [--check-bf16 GNH.json]
      the seed's method on the first B sequences of CASE_DIR, timed (a warm-up,
      then the median of R, with its spread):
        gradient          eager loss.backward() in fp32 with TF32 matmuls
        hvp-compiled      torch.func.jvp over torch.func.grad, torch.compile,
                          bf16 autocast with fp32 weights and TF32, one
                          direction per call (compile time reported apart)
        double-backward   eager grad(grad(loss, create_graph) . v), the same
                          precision settings
      and checked against gnh's values of direction 0 (bench_engine
      --validation): on the first VB sequences, loss, |G|^2 and v^T H v in
      fp32 (TF32 off) to 1e-4 relative (v^T H v relative to |v||Hv|); on the
      B timed sequences, the HVP's v^T H v against gnh's bf16-amp to 5% of
      |v||Hv|.

Without a GPU (the rehearsal on torch 1.13) everything runs in fp32 on the
CPU: functorch's jvp over grad stands for the compiled HVP (no compile, no
autocast), and the model writes layer norm, softmax and cross-entropy out in
elementary ops (perf/bench_torch.py; functorch 1.13's forward mode lacks them).
"""
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import torch  # noqa: E402

CUDA = torch.cuda.is_available()
DEV = torch.device("cuda" if CUDA else "cpu")
TORCH2 = int(torch.__version__.split(".")[0]) >= 2
# Tolerances: fp32 against fp32 of another summation order, relative 1e-4
# (a sum of ~1e5-1e6 terms in fp32 loses up to sqrt(n) * 6e-8 ~ 6e-5);
# bf16 operands (8 bits of mantissa, 4e-3 per product) to the seed's 5%.
TOL_FP32, TOL_BF16 = 1e-4, 0.05


def sync():
    if CUDA:
        torch.cuda.synchronize()


def timed(fn, repeats, warmup=1):
    for _ in range(warmup):
        fn()
    sync()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return {"seconds": statistics.median(times), "min_seconds": min(times), "max_seconds": max(times),
            "samples": times}


def save(res, out):
    """The results so far: a later stage that fails or runs out of time loses
    only itself."""
    with open(out, "w") as f:
        json.dump(res, f, indent=1)


def ceilings(out, size, copy_bytes):
    res = {"device": torch.cuda.get_device_name() if CUDA else "cpu", "torch": torch.__version__, "n": size}
    g = torch.Generator(device=DEV).manual_seed(0)
    for name, dtype, tf32 in (("bf16", torch.bfloat16, False), ("tf32", torch.float32, True),
                              ("fp32", torch.float32, False)):
        if name == "bf16" and not CUDA:
            continue  # bf16 GEMMs on a CPU measure nothing the device check uses
        torch.backends.cuda.matmul.allow_tf32 = tf32
        a = torch.randn(size, size, device=DEV, generator=g).to(dtype)
        b = torch.randn(size, size, device=DEV, generator=g).to(dtype)
        t = timed(lambda: torch.matmul(a, b), 10, warmup=3)
        res[f"gemm_{name}_tflops"] = 2.0 * size ** 3 / t["seconds"] * 1e-12
    torch.backends.cuda.matmul.allow_tf32 = False
    n = copy_bytes // 4
    src = torch.randn(n, device=DEV, generator=g)
    dst = torch.empty_like(src)
    t = timed(lambda: dst.copy_(src), 10, warmup=3)
    res["copy_tb_per_s"] = 2.0 * n * 4 / t["seconds"] * 1e-12
    res["copy_bytes"] = n * 4
    save(res, out)
    print(json.dumps(res))


class Config:
    def __init__(self, d):
        self.__dict__.update(d)


def load_case(case):
    import numpy as np
    cfg = Config(json.load(open(os.path.join(case, "model.json"))))
    flat = np.fromfile(os.path.join(case, "params.f32"), dtype=np.float32)
    ids = np.fromfile(os.path.join(case, "tokens.i32"), dtype=np.int32)
    dirs = np.fromfile(os.path.join(case, "dirs.i8"), dtype=np.int8).reshape(cfg.directions, cfg.n_params)
    if flat.size != cfg.n_params:
        raise SystemExit(f"torch_seed: {case}/params.f32 holds {flat.size} values, model.json says {cfg.n_params}")
    names = [t["name"] for t in cfg.tensors]

    def unflat(v, dtype):
        return [torch.from_numpy(v[t["offset"]:t["offset"] + int(np.prod(t["shape"]))].astype(np.float32))
                .reshape(t["shape"]).to(DEV, dtype) for t in cfg.tensors]

    return cfg, names, flat, ids, dirs, unflat


def loss_builtin(params, names, cfg, idx, tgt, amp):
    """Summed token cross-entropy of nanoGPT (bias-free or not), functional
    in params, with the seed's reference attention: scores and softmax in
    fp32 even under autocast."""
    import torch.nn.functional as F
    p = dict(zip(names, params))
    B, T = idx.shape
    C, H = cfg.n_embd, cfg.n_head
    hs = C // H
    mask = torch.ones(T, T, dtype=torch.bool, device=idx.device).tril()
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=amp, cache_enabled=False):
        x = p["transformer.wte.weight"][idx] + p["transformer.wpe.weight"][:T]
        for i in range(cfg.n_layer):
            q = f"transformer.h.{i}."
            h = F.layer_norm(x, (C,), p[q + "ln_1.weight"], p.get(q + "ln_1.bias"), cfg.ln_eps)
            qkv = F.linear(h, p[q + "attn.c_attn.weight"], p.get(q + "attn.c_attn.bias"))
            qq, kk, vv = (t.view(B, T, H, hs).transpose(1, 2) for t in qkv.split(C, dim=2))
            with torch.autocast("cuda", enabled=False):
                s = (qq.float() @ kk.float().transpose(-2, -1)) * (1.0 / hs ** 0.5)
                a = torch.softmax(s.masked_fill(~mask, float("-inf")), dim=-1)
            y = (a @ vv.float() if not amp else a.to(vv.dtype) @ vv).transpose(1, 2).reshape(B, T, C)
            x = x + F.linear(y, p[q + "attn.c_proj.weight"], p.get(q + "attn.c_proj.bias"))
            h = F.layer_norm(x, (C,), p[q + "ln_2.weight"], p.get(q + "ln_2.bias"), cfg.ln_eps)
            f = F.gelu(F.linear(h, p[q + "mlp.c_fc.weight"], p.get(q + "mlp.c_fc.bias")),
                       approximate="none" if cfg.gelu == "erf" else "tanh")
            x = x + F.linear(f, p[q + "mlp.c_proj.weight"], p.get(q + "mlp.c_proj.bias"))
        x = F.layer_norm(x, (C,), p["transformer.ln_f.weight"], p.get("transformer.ln_f.bias"), cfg.ln_eps)
        w = p["transformer.wte.weight"] if cfg.tie_embeddings else p["lm_head.weight"]
        z = F.linear(x, w)
    return F.cross_entropy(z.float().view(-1, z.size(-1)), tgt.reshape(-1), reduction="sum")


def seed(case, out, batch, repeats, check_fp32, check_batch, check_bf16):
    import bench_torch
    cfg, names, flat, ids, dirs, unflat = load_case(case)
    T = cfg.seq_len
    check_batch = check_batch or batch
    if (ids.size - 1) // T < max(batch, check_batch):
        raise SystemExit(f"torch_seed: {case}/tokens.i32 holds {(ids.size - 1) // T} sequences, --batch {batch}")
    all_ids = torch.from_numpy(ids.astype("int64")).to(DEV)

    def sequences(n):
        return all_ids[:n * T].view(n, T), all_ids[1:n * T + 1].view(n, T)

    idx, tgt = sequences(check_batch)
    params = unflat(flat, torch.float32)
    v0 = unflat(dirs[0].astype("float32"), torch.float32)
    res = {"context": {"tool": "torch", "version": torch.__version__, "device": str(DEV), "batch": batch,
                       "seq_len": T, "n_params": cfg.n_params, "threads": torch.get_num_threads()},
           "checks": []}

    def loss(ps, amp=False):
        if TORCH2 and CUDA:
            return loss_builtin(ps, names, cfg, idx, tgt, amp)
        return bench_torch.loss_sum(ps, names, cfg, idx, tgt)

    def check(name, got, want, scale, tol):
        rel = abs(got - want) / max(abs(scale), 1e-300)
        ok = rel <= tol and rel == rel
        res["checks"].append({"name": name, "torch": got, "gnh": want, "relative": rel, "tolerance": tol, "ok": ok})
        print(f"torch_seed: check {name}: torch {got:.10g} gnh {want:.10g} relative {rel:.2e} "
              f"{'ok' if ok else 'FAIL'} (tolerance {tol:g})", flush=True)

    def hv_of(ps, v, amp):
        leaves = [p.detach().requires_grad_(True) for p in ps]
        g = torch.autograd.grad(loss(leaves, amp), leaves, create_graph=True)
        return torch.autograd.grad(g, leaves, grad_outputs=v)

    # Values first (fp32, TF32 off), on the check's sequences: a wrong model
    # must not be timed.
    if CUDA:
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    v_norm = cfg.n_params ** 0.5

    def values():
        leaves = [p.clone().requires_grad_(True) for p in params]
        L = loss(leaves)
        grads = torch.autograd.grad(L, leaves)
        hv = hv_of(params, v0, False)
        return {"loss_mean": float(L) / idx.numel(),
                "gradient_sum_norm2": float(sum((g.double() ** 2).sum() for g in grads)),
                "vHv_sum": float(sum((a.double() * b.double()).sum() for a, b in zip(hv, v0))),
                "Hv_norm": float(torch.sqrt(sum((a.double() ** 2).sum() for a in hv)))}

    res["values_fp32"] = values()
    vhv, hv_norm = res["values_fp32"]["vHv_sum"], res["values_fp32"]["Hv_norm"]
    if check_fp32:
        ref = json.load(open(check_fp32))
        check("loss_mean fp32", res["values_fp32"]["loss_mean"], ref["loss_mean"][0], ref["loss_mean"][0], TOL_FP32)
        check("gradient_sum_norm2 fp32", res["values_fp32"]["gradient_sum_norm2"], ref["gradient_sum_norm2"][0],
              ref["gradient_sum_norm2"][0], TOL_FP32)
        check("vHv_sum fp32 (of |v||Hv|)", vhv, ref["vHv_sum second-order-forward"][0], v_norm * hv_norm, TOL_FP32)

    # The timed sequences: the scale of their v^T H v check, then timings in
    # the seed's settings.
    idx, tgt = sequences(batch)
    try:
        res["values_fp32_timed_batch"] = values()
        hv_norm = res["values_fp32_timed_batch"]["Hv_norm"]
    except torch.cuda.OutOfMemoryError if CUDA else MemoryError as exc:
        # The eager fp32 double backward of the whole timed batch may not fit:
        # |Hv| of the summed loss grows with the batch, so the checked
        # sequences' |Hv| scaled by the batch ratio stands in (said so).
        torch.cuda.empty_cache()
        hv_norm *= batch / check_batch
        res["values_fp32_timed_batch"] = {"error": f"out of memory ({exc.__class__.__name__}); |Hv| scaled from "
                                                   f"{check_batch} sequences", "Hv_norm": hv_norm}
    save(res, out)
    amp = CUDA
    if CUDA:
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True

    def gradient():
        ls = [p.detach().requires_grad_(True) for p in params]
        loss(ls).backward()

    res["gradient"] = timed(gradient, repeats)
    save(res, out)
    print(f"torch_seed: gradient {res['gradient']['seconds']:.4g} s per batch", flush=True)

    def hvp_dot(ps, v):
        if TORCH2:
            import torch.func as tf
            gfun = tf.grad(lambda p: loss(list(p), amp))
            _, h = tf.jvp(gfun, (tuple(ps),), (tuple(v),))
        else:
            import functorch
            gfun = functorch.grad(lambda *p: loss(list(p), amp), argnums=tuple(range(len(ps))))
            _, h = functorch.jvp(gfun, tuple(ps), tuple(v))
        return sum((a * b).sum() for a, b in zip(h, v))

    fn = hvp_dot
    if TORCH2 and CUDA:
        fn = torch.compile(hvp_dot)
    t0 = time.perf_counter()
    first = fn(params, v0)
    sync()
    res["compile_seconds"] = time.perf_counter() - t0 if fn is not hvp_dot else 0.0
    res["hvp_compiled" if fn is not hvp_dot else "hvp_functorch"] = timed(lambda: fn(params, v0), repeats)
    key = "hvp_compiled" if fn is not hvp_dot else "hvp_functorch"
    print(f"torch_seed: {key} {res[key]['seconds']:.4g} s per direction and batch "
          f"(compile {res['compile_seconds']:.1f} s)", flush=True)
    res["hvp_method"] = ("torch.func.jvp over grad, torch.compile, bf16 autocast, TF32" if fn is not hvp_dot
                         else "functorch.jvp over grad, fp32, eager")
    res["values_hvp"] = {"vHv_sum": float(first)}
    if check_bf16:
        ref = json.load(open(check_bf16))
        check(f"vHv_sum {key} vs gnh bf16-amp (of |v||Hv|)", float(first), ref["vHv_sum second-order-forward"][0],
              v_norm * hv_norm, TOL_BF16)
    save(res, out)
    try:
        res["double_backward"] = timed(lambda: hv_of(params, v0, amp), repeats)
        print(f"torch_seed: double_backward {res['double_backward']['seconds']:.4g} s per direction and batch",
              flush=True)
    except torch.cuda.OutOfMemoryError if CUDA else MemoryError as exc:
        torch.cuda.empty_cache()
        res["double_backward"] = {"error": f"out of memory at batch {batch} ({exc.__class__.__name__})"}
        print(f"torch_seed: double_backward: {res['double_backward']['error']}", flush=True)
    if CUDA:
        res["peak_memory_bytes"] = torch.cuda.max_memory_allocated()
    save(res, out)
    bad = [c["name"] for c in res["checks"] if not c["ok"]]
    if bad:
        print("torch_seed: values disagree with gnh: " + ", ".join(bad), file=sys.stderr)
        return 1
    return 0


def main(argv):
    import argparse
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("ceilings")
    c.add_argument("out")
    c.add_argument("--size", type=int, default=8192)
    c.add_argument("--copy-bytes", type=int, default=4 << 30)
    s = sub.add_parser("seed")
    s.add_argument("case")
    s.add_argument("out")
    s.add_argument("--batch", type=int, required=True)
    s.add_argument("--repeats", type=int, default=5)
    s.add_argument("--check-fp32")
    s.add_argument("--check-batch", type=int)
    s.add_argument("--check-bf16")
    a = ap.parse_args(argv)
    if a.cmd == "ceilings":
        ceilings(a.out, a.size, a.copy_bytes)
        return 0
    return seed(a.case, a.out, a.batch, a.repeats, a.check_fp32, a.check_batch, a.check_bf16)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
