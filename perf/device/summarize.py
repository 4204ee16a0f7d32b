#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""The device check's validation and summary (perf/device/run.sh). Standard
library only: the GPU machine may have nothing else.

  summarize.py validate REFERENCE.json RUN.json --precision fp32|tf32|bf16-amp
      exit 1 unless RUN (bench_engine --validation) agrees with REFERENCE
      (float64, the same model, batch and directions) and with itself:
        loss and |G|^2: relative to the reference's value;
        v^T H v of each direction and method: relative to |v||Hv| (Cauchy-
          Schwarz bounds |v^T H v| by it, so cancellation in the sum over
          tokens cannot inflate the error), |Hv| from the reference's
          forward-over-reverse;
        second-order forward against forward-over-reverse in RUN (the same
          quantity by two derivative engines), on the same scale.
      fp32: 1e-4 (a sum of ~1e6 fp32 terms of one sign loses up to about
      sqrt(n) * 6e-8 = 6e-5 relative); tf32 and bf16-amp: 5% (operands with
      10 and 8 bits of mantissa; the seed's criterion for reduced precision).
  summarize.py summary WORK OUT [--rehearse 0|1]
      summary.json and summary.txt in OUT from the step records and results
      in WORK; the last line of summary.txt is "RESULT: PASS" or "RESULT: FAIL".
"""
import json
import math
import os
import sys

TOLERANCE = {"fp32": 1e-4, "tf32": 0.05, "bf16-amp": 0.05, "fp64": 1e-9}
EPOCH_BLOCKS = 9963  # the seed's reference epoch (blocks of 1024 tokens)
# The seed on GH200 (its report) and the targets on one H200.
SEED = {"gradient_epoch_s": 28.7, "direction_epoch_s_bf16": 32.73, "direction_epoch_s_tf32": 50.99}
TARGETS = {"direction_epoch_s_bf16_k16": 5.0, "gradient_epoch_s": 6.0, "sof_k1_batch_bytes": 8e9}


def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def compare(ref, run, precision):
    """(name, got, want, relative error, tolerance) of every checked value."""
    tol = TOLERANCE[precision]
    rows = []
    for key in ("loss_mean", "gradient_sum_norm2"):
        if key in ref:
            want, got = ref[key][0], (run.get(key) or [float("nan")])[0]
            rows.append((key, got, want, abs(got - want) / abs(want), tol))
    hv = ref.get("Hv_norm forward-over-reverse")
    vn = ref.get("v_norm", [float("nan")])[0]
    for method in ("second-order-forward", "forward-over-reverse"):
        key = "vHv_sum " + method
        if key not in ref:
            continue
        got_all = run.get(key) or []
        for i, want in enumerate(ref[key]):
            got = got_all[i] if i < len(got_all) else float("nan")
            scale = vn * hv[i] if hv else abs(want)
            rows.append((f"{key}[{i}]", got, want, abs(got - want) / scale, tol))
    a, b = run.get("vHv_sum second-order-forward"), run.get("vHv_sum forward-over-reverse")
    if a and b and hv:
        for i, (x, y) in enumerate(zip(a, b)):
            rows.append((f"identity: second-order forward - forward-over-reverse [{i}]", x, y,
                         abs(x - y) / (vn * hv[i]), tol))
    return rows


def validate(ref_path, run_path, precision):
    ref, run = load(ref_path), load(run_path)
    if ref is None or run is None:
        print(f"validate: cannot read {ref_path if ref is None else run_path}")
        return 1
    bad = 0
    for name, got, want, rel, tol in compare(ref, run, precision):
        ok = rel <= tol  # False for NaN
        bad += not ok
        print(f"validate {precision}: {name} reference {want:.10g} got {got:.10g} relative {rel:.2e} "
              f"{'ok' if ok else 'FAIL'} (tolerance {tol:g})")
    cuts = [c.get("adjoint_cuts") for c in run.get("curvature", []) if c["method"] == "second-order-forward"]
    tiles = [c.get("head_tile") for c in run.get("curvature", [])]
    print(f"validate {precision}: adjoint cuts {cuts}, head tiles {tiles}")
    print(f"validate {precision}: {'PASS' if bad == 0 else 'FAIL'} ({bad} outside tolerance)")
    return 0 if bad == 0 else 1


def fmt_bytes(b):
    if b is None:
        return "-"
    return f"{b / 1e9:.2f} GB" if b >= 1e8 else f"{b / 1e6:.2f} MB"


def pass_rows(run, ceilings, precision):
    """One row per timed pass of a bench_engine result."""
    rows = []
    if not run:
        return rows
    B = run["context"]["batch"]
    scale = EPOCH_BLOCKS / B
    ceiling = None
    if ceilings:
        ceiling = ceilings.get({"bf16-amp": "gemm_bf16_tflops", "tf32": "gemm_tf32_tflops"}.get(
            precision, "gemm_fp32_tflops"))
    passes = []
    if "gradient" in run:
        passes.append(("gradient", 0, run["gradient"]))
    if "gradient_per_sequence" in run:
        passes.append(("gradient-per-sequence", 0, run["gradient_per_sequence"]))
    for c in run.get("curvature", []):
        passes.append((c["method"], c["K"], c))
    for name, K, p in passes:
        per = p["seconds"] / max(K, 1)
        tflops = p["flops"] / p["seconds"] * 1e-12 if "flops" in p else None
        prof = p.get("profile") or {}
        rows.append({
            "precision": precision, "pass": name, "K": K, "batch": B, "seconds_per_batch": p["seconds"],
            "min_seconds": p.get("min_seconds"), "max_seconds": p.get("max_seconds"),
            "repeats": len(p.get("samples", [])),
            "epoch_seconds" + ("" if K == 0 else "_per_direction"): per * scale,
            "tflops": tflops, "fraction_of_gemm_ceiling": tflops / ceiling if tflops and ceiling else None,
            "plan_bytes": p.get("workspace_bytes"), "measured_peak_bytes": p.get("measured_peak_bytes"),
            "sampled_device_peak_bytes": prof.get("sampled_device_peak_bytes"),
            "adjoint_cuts": p.get("adjoint_cuts"), "profile": prof})
    return rows


def load_prediction(path):
    """bench_engine --predict's JSON (every line but its last), or None."""
    try:
        text = open(path).read().rstrip("\n")
        return json.loads(text.rsplit("\n", 1)[0])
    except (OSError, ValueError, IndexError):
        return None


def measured_against_predicted(s, best):
    """Lines of the profiled passes' time per label beside the cost model's
    prediction of it (ms a batch; Kokkos's fills as one label)."""
    pred = s.get("predicted")
    if not pred:
        return []
    L = ["", "measured against predicted (perf/cost_model.hpp), ms a batch, label: measured / predicted:"]
    for key, name in ((("bf16-amp", "gradient", 0), "gradient"),
                      (("bf16-amp", "gradient-per-sequence", 0), "per_sequence"),
                      (("tf32", "gradient", 0), "gradient_tf32"),
                      (("bf16-amp", "second-order-forward", 16), "second_order")):
        r, p = best.get(key), pred.get(name, {}).get("prediction")
        if not r or not p or not r["profile"].get("labels"):
            continue
        measured = {}
        for l in r["profile"]["labels"]:
            label = "Kokkos::ViewFill" if l["label"].startswith("Kokkos::ViewFill") else l["label"]
            measured[label] = measured.get(label, 0.0) + l["seconds"]
        L.append(f"  {key[0]} {key[1]} K={key[2]}: pass {1e3 * r['seconds_per_batch']:.4g} / "
                 f"{1e3 * p['seconds_per_batch']:.4g}")
        for l in p["labels"][:12]:
            L.append(f"    {l['label']:45s} {1e3 * measured.get(l['label'], 0.0):9.4g} / {1e3 * l['seconds']:9.4g}"
                     f"  ({l['launches']} launches)")
    return L


def summary(work, out, rehearse):
    steps = []
    for line in open(os.path.join(work, "steps.jsonl")):
        if line.strip():
            steps.append(json.loads(line))
    ceilings = load(os.path.join(work, "ceilings.json"))
    ref = load(os.path.join(work, "reference_fp64.json"))
    s = {"rehearsal": rehearse, "steps": steps, "ceilings": ceilings, "validation": {}, "passes": [],
         "torch": load(os.path.join(work, "torch.json")), "targets": TARGETS, "seed": SEED}
    machine = ""
    if os.path.exists(os.path.join(work, "machine.txt")):
        machine = open(os.path.join(work, "machine.txt"), errors="replace").read()
    s["machine"] = machine
    ok = all(st["status"] == "ok" for st in steps)
    for p in ("fp32", "tf32", "bf16-amp"):
        run = load(os.path.join(work, f"validate_{p}.json"))
        if ref and run:
            rows = compare(ref, run, p)
            worst = max(rows, key=lambda r: r[3] if r[3] == r[3] else math.inf)
            passed = all(r[3] <= r[4] for r in rows)
            ok &= passed
            s["validation"][p] = {"pass": passed, "checked": len(rows), "worst": worst[0],
                                  "worst_relative": worst[3], "tolerance": worst[4]}
    s["predicted"] = load_prediction(os.path.join(work, "predict.txt"))
    for p in ("bf16-amp", "tf32", "fp32"):
        for kind in ("sof", "for"):
            s["passes"] += pass_rows(load(os.path.join(work, f"time_{kind}_{p}.json")), ceilings, p)
    # gnh against the seed's method on this device.
    t = s["torch"]
    ratios = {}
    if t:
        B = t["context"]["batch"]
        scale = EPOCH_BLOCKS / B
        if "seconds" in t.get("gradient", {}):
            ratios["torch_gradient_epoch_s"] = t["gradient"]["seconds"] * scale
        hvp = t.get("hvp_compiled") or t.get("hvp_functorch")
        if hvp:
            ratios["torch_hvp_epoch_s_per_direction"] = hvp["seconds"] * scale
        if "seconds" in t.get("double_backward", {}):
            ratios["torch_double_backward_epoch_s_per_direction"] = t["double_backward"]["seconds"] * scale
        ok &= all(c["ok"] for c in t.get("checks", []))
    best = {}
    for r in s["passes"]:
        best[(r["precision"], r["pass"], r["K"])] = r
    gpu_amp = "bf16-amp" if not rehearse else "fp32"  # the rehearsal's torch runs fp32
    g = best.get(("tf32" if not rehearse else "fp32", "gradient", 0))
    d = best.get((gpu_amp, "second-order-forward", 16))
    if g and "torch_gradient_epoch_s" in ratios:
        ratios["gradient_torch_over_gnh"] = ratios["torch_gradient_epoch_s"] / g["epoch_seconds"]
    if d and "torch_hvp_epoch_s_per_direction" in ratios:
        ratios["direction_torch_hvp_over_gnh_k16"] = (ratios["torch_hvp_epoch_s_per_direction"]
                                                      / d["epoch_seconds_per_direction"])
    if d and "torch_double_backward_epoch_s_per_direction" in ratios:
        ratios["direction_torch_double_backward_over_gnh_k16"] = (
            ratios["torch_double_backward_epoch_s_per_direction"] / d["epoch_seconds_per_direction"])
    s["ratios"] = ratios
    s["result"] = "PASS" if ok else "FAIL"
    with open(os.path.join(out, "summary.json"), "w") as f:
        json.dump(s, f, indent=1)
    text = render(s, best)
    with open(os.path.join(out, "summary.txt"), "w") as f:
        f.write(text)
    print(text, end="")
    return 0


def render(s, best):
    L = []
    head = [l for l in s["machine"].splitlines() if l.strip()]
    gpu = next((l.strip() for l in head if "NVIDIA H" in l or "GeForce" in l or "Tesla" in l), None)
    L.append("gnh device check" + (" (rehearsal on the host, tiny preset)" if s["rehearsal"] else ""))
    if gpu:
        L.append(f"device: {gpu}")
    L.append("")
    L.append("steps:")
    for st in s["steps"]:
        err = f"  {st['error']}" if st.get("error") else ""
        L.append(f"  {st['step']:14s} {st['status']:8s} {st.get('seconds', 0):4d} s of {st.get('limit', 0):4d}{err}")
    c = s["ceilings"]
    if c:
        parts = [f"{k[5:-7]} {v:.1f} TFLOP/s" for k, v in c.items() if k.startswith("gemm_")]
        L.append(f"ceilings: GEMM {c['n']}^3 " + ", ".join(parts) + f"; copy {c['copy_tb_per_s']:.3f} TB/s")
    for p, v in s["validation"].items():
        L.append(f"validation {p}: {'pass' if v['pass'] else 'FAIL'} ({v['checked']} values; worst "
                 f"{v['worst']} {v['worst_relative']:.2e}, tolerance {v['tolerance']:g})")
    for ch in (s["torch"] or {}).get("checks", []):
        L.append(f"torch check {ch['name']}: {'pass' if ch['ok'] else 'FAIL'} ({ch['relative']:.2e}, "
                 f"tolerance {ch['tolerance']:g})")
    if s["passes"]:
        L.append("")
        L.append("where the time goes (one profiled run; label: share of the pass, launches):")
        for r in s["passes"]:
            prof = r["profile"]
            if not prof or not prof.get("labels"):
                continue
            top = ", ".join(f"{l['label']} {100 * l['seconds'] / prof['seconds']:.0f}% x{l['launches']}"
                            for l in prof["labels"][:5])
            L.append(f"  {r['precision']:8s} {r['pass']:20s} K={r['K']:<2d} {prof['launches']} launches: {top}")
        L.append("")
        L.append(f"{'precision':9s} {'pass':21s} {'K':>2s} {'B':>3s} {'s/batch':>9s} {'spread':>15s} "
                 f"{'epoch s':>9s} {'TFLOP/s':>8s} {'of GEMM':>7s} {'plan':>9s} {'measured':>9s}")
        for r in s["passes"]:
            e = r.get("epoch_seconds", r.get("epoch_seconds_per_direction"))
            spread = f"{r['min_seconds']:.4g}-{r['max_seconds']:.4g}" if r.get("min_seconds") is not None else "-"
            frac = f"{r['fraction_of_gemm_ceiling']:.2f}" if r.get("fraction_of_gemm_ceiling") else "-"
            L.append(f"{r['precision']:9s} {r['pass']:21s} {r['K']:2d} {r['batch']:3d} {r['seconds_per_batch']:9.4g} "
                     f"{spread:>15s} {e:9.3g} {r['tflops'] or 0:8.3g} {frac:>7s} "
                     f"{fmt_bytes(r['plan_bytes']):>9s} {fmt_bytes(r['measured_peak_bytes']):>9s}")
        L.append("(epoch s: the gradient per epoch, a curvature pass per direction and epoch, "
                 f"{EPOCH_BLOCKS} blocks)")
    L += measured_against_predicted(s, best)
    rt = s["ratios"]
    if rt:
        L.append("")
        L.append("gnh beside PyTorch on this device, per epoch:")
        for k, v in rt.items():
            L.append(f"  {k}: {v:.3g}")
    if not s["rehearsal"]:
        L.append("")
        tg = s["targets"]
        d = best.get(("bf16-amp", "second-order-forward", 16))
        g = best.get(("tf32", "gradient", 0)) or best.get(("fp32", "gradient", 0))
        k1 = best.get(("bf16-amp", "second-order-forward", 1))

        def verdict(v, bar):
            return "-" if v is None else ("met" if v <= bar else "not met")
        dv = d["epoch_seconds_per_direction"] if d else None
        gv = g["epoch_seconds"] if g else None
        mv = k1["measured_peak_bytes"] if k1 else None
        L.append(f"targets: direction bf16-amp K=16 {dv if dv is None else round(dv, 2)} s "
                 f"(<= {tg['direction_epoch_s_bf16_k16']}: {verdict(dv, tg['direction_epoch_s_bf16_k16'])}); "
                 f"gradient {gv if gv is None else round(gv, 2)} s (<= {tg['gradient_epoch_s']}: "
                 f"{verdict(gv, tg['gradient_epoch_s'])}); second-order K=1 memory {fmt_bytes(mv)} "
                 f"(<= 8 GB: {verdict(mv, tg['sof_k1_batch_bytes'])})")
    L.append(f"RESULT: {s['result']}")
    return "\n".join(L) + "\n"


def main(argv):
    if len(argv) >= 3 and argv[0] == "validate":
        precision = "fp32"
        if "--precision" in argv:
            precision = argv[argv.index("--precision") + 1]
        return validate(argv[1], argv[2], precision)
    if len(argv) >= 3 and argv[0] == "summary":
        rehearse = "--rehearse" in argv and argv[argv.index("--rehearse") + 1] == "1"
        return summary(argv[1], argv[2], rehearse)
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
