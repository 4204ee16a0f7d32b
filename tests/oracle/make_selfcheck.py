#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
"""Writes the device self-check's files (jobscripts/selfcheck/): a tiny
checkpoint converted by gnh-convert, its token file, and the float64 PyTorch
values of SPEC §4 on them (stats_reference.py, double backward), which
`gnh self-check` and `gnh run --self-check` compare this build's engines
against. tests/oracle/test_selfcheck.py recomputes the values and requires
the shipped ones to match.

  tests/oracle/make_selfcheck.py [OUT_DIR]"""
import json
import os
import sys

HERE = os.path.dirname(os.path.realpath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "integration"))
sys.path.insert(0, HERE)
import gnhtest  # noqa: E402
import stats_reference  # noqa: E402
import torch  # noqa: E402

CONTEXT, BLOCKS, DIRECTIONS, SEED = 8, 6, 2, 7


def reference(directory):
    """The shipped values, recomputed from the files in ``directory``. Each
    quadratic form d^T H d comes with the Cauchy-Schwarz scale |d| |H d|, the
    size of the terms it is a difference of: the tolerance's scale where it
    cancels (G^T H G of a trained-looking model is a small difference)."""
    model, tokens = os.path.join(directory, "model.h5"), os.path.join(directory, "tokens.bin")
    r = stats_reference.reference_statistics(model, tokens, CONTEXT, 0, 1, DIRECTIONS, SEED)
    ref = stats_reference.load_reference(model, tokens, CONTEXT)
    G = torch.as_tensor(r["G"], dtype=torch.float64)
    scales = [float(G.norm() * ref.hvp(G).norm())]
    for k in range(DIRECTIONS):
        v = torch.as_tensor(stats_reference.rademacher(SEED, k, ref.P), dtype=torch.float64)
        scales.append(float(v.norm() * ref.hvp(v).norm()))
    return {"loss": r["loss"], "G_sqnorm": r["G_sqnorm"], "GHG": r["GHG"], "GHG_scale": scales[0],
            "vHv": [float(x) for x in r["vHv"]], "vHv_scale": scales[1:]}


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(gnhtest.ROOT, "jobscripts", "selfcheck")
    os.makedirs(out, exist_ok=True)
    cfg = gnhtest.gnh_model.GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=CONTEXT, vocab_size=31, bias=True,
                                      tie_embeddings=False, gelu="tanh")
    h5 = gnhtest.save_checkpoint(gnhtest.make_model(cfg, seed=11, scale=0.2), out, "model")
    os.remove(os.path.join(out, "model.pt"))
    assert h5 == os.path.join(out, "model.h5")
    gnhtest.write_tokens(os.path.join(out, "tokens.bin"), CONTEXT * BLOCKS + 1, 31, 5)
    values = reference(out)
    doc = {"about": "gnh's device self-check (gnh self-check, gnh run --self-check): model.h5 on tokens.bin, "
                    "every block, no noise samples; float64 PyTorch double backward (tests/oracle/make_selfcheck.py)",
           "context": CONTEXT, "dtype": "uint16", "directions": DIRECTIONS, "seed": SEED,
           "tolerance_relative": {"fp64": 1e-10, "fp32": 1e-4, "tf32": 1e-2, "bf16-amp": 5e-2},
           "tolerance_reason": "fp64: the oracles' bar; fp32: the project's float criterion (a few hundred float "
                               "eps through the graph); tf32 (10-bit mantissas in the GEMMs on a GPU, fp32 on a "
                               "host): 1e-2; bf16-amp (8-bit): the seed's 5%. Quadratic forms d^T H d relative to "
                               "max(|q|, |d| |H d|), the size of what they are differences of; the host's "
                               "bf16-amp emulation is within 5e-3 of it on this model.",
           **values}
    with open(os.path.join(out, "reference.json"), "w") as f:
        json.dump(doc, f, indent=2)
        f.write("\n")
    print(f"make_selfcheck: {out}: loss {values['loss']:.6f}")


if __name__ == "__main__":
    main()
