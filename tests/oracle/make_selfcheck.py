#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
"""Writes the device self-check's files (jobscripts/selfcheck/): a tiny
checkpoint of each model family converted by gnh-convert (model.h5, nanoGPT;
llama.h5 with grouped-query attention and SwiGLU; gpt-neox.h5 with the
parallel residual and partial rotary embedding, from Hugging Face
directories), their token file, and the float64 PyTorch values of SPEC §4 on
them (stats_reference.py, double backward), which `gnh self-check` and `gnh
run --self-check` compare this build's engines against. tests/oracle/
test_selfcheck.py recomputes the values and requires the shipped ones to
match.

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


def reference(directory, model_file="model.h5"):
    """The shipped values, recomputed from the files in ``directory``. Each
    quadratic form d^T H d comes with the Cauchy-Schwarz scale |d| |H d|, the
    size of the terms it is a difference of: the tolerance's scale where it
    cancels (G^T H G of a trained-looking model is a small difference)."""
    model, tokens = os.path.join(directory, model_file), os.path.join(directory, "tokens.bin")
    r = stats_reference.reference_statistics(model, tokens, CONTEXT, 0, 1, DIRECTIONS, SEED)
    ref = stats_reference.load_reference(model, tokens, CONTEXT)
    G = torch.as_tensor(r["G"], dtype=torch.float64)
    scales = [float(G.norm() * ref.hvp(G).norm())]
    for k in range(DIRECTIONS):
        v = torch.as_tensor(stats_reference.rademacher(SEED, k, ref.P), dtype=torch.float64)
        scales.append(float(v.norm() * ref.hvp(v).norm()))
    return {"loss": r["loss"], "G_sqnorm": r["G_sqnorm"], "GHG": r["GHG"], "GHG_scale": scales[0],
            "vHv": [float(x) for x in r["vHv"]], "vHv_scale": scales[1:]}


# The families' tiny models (SPEC section 11), vocabulary 31 like model.h5's.
FAMILIES = {
    "llama.h5": dict(family="llama", vocab_size=31, hidden_size=16, intermediate_size=24, num_hidden_layers=1,
                     num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=CONTEXT, norm_eps=1e-5,
                     rope_theta=10.0, hidden_act="silu", qkv_bias=True),
    "gpt-neox.h5": dict(family="gpt-neox", vocab_size=31, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                        num_attention_heads=2, max_position_embeddings=CONTEXT, norm_eps=1e-5, rope_theta=10.0,
                        rotary_pct=0.5, use_parallel_residual=True, hidden_act="gelu", qkv_bias=True),
}


def write_family(out, name, kw, seed):
    import shutil
    import gnh_families
    import gnh_hf
    import numpy as np
    from gnh_layout import HFConfig
    cfg = HFConfig(**kw)
    model = gnh_families.init_random(gnh_families.CausalLM(cfg).double(), seed, 0.2)
    hf = os.path.join(out, name + ".hf")
    gnh_hf.save_dir(hf, cfg, {n: t.numpy().astype(np.float32) for n, t in gnh_families.canonical_state(model).items()})
    gnhtest.gnh_convert.convert(hf, os.path.join(out, name), gnhtest.gnh_convert.default_options())
    shutil.rmtree(hf)


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(gnhtest.ROOT, "jobscripts", "selfcheck")
    os.makedirs(out, exist_ok=True)
    cfg = gnhtest.gnh_model.GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=CONTEXT, vocab_size=31, bias=True,
                                      tie_embeddings=False, gelu="tanh")
    h5 = gnhtest.save_checkpoint(gnhtest.make_model(cfg, seed=11, scale=0.2), out, "model")
    os.remove(os.path.join(out, "model.pt"))
    assert h5 == os.path.join(out, "model.h5")
    for i, (name, kw) in enumerate(FAMILIES.items()):
        write_family(out, name, kw, 12 + i)
    gnhtest.write_tokens(os.path.join(out, "tokens.bin"), CONTEXT * BLOCKS + 1, 31, 5)
    models = [dict(file=f, family=fam, **reference(out, f))
              for f, fam in (("model.h5", "nanogpt"), ("llama.h5", "llama"), ("gpt-neox.h5", "gpt-neox"))]
    doc = {"about": "gnh's device self-check (gnh self-check, gnh run --self-check): each model on tokens.bin, "
                    "every block, no noise samples; float64 PyTorch double backward (tests/oracle/make_selfcheck.py)",
           "context": CONTEXT, "dtype": "uint16", "directions": DIRECTIONS, "seed": SEED,
           "tolerance_relative": {"fp64": 1e-10, "fp32": 1e-4, "tf32": 1e-2, "bf16-amp": 5e-2},
           "tolerance_reason": "fp64: the oracles' bar; fp32: the project's float criterion (a few hundred float "
                               "eps through the graph); tf32 (10-bit mantissas in the GEMMs on a GPU, fp32 on a "
                               "host): 1e-2; bf16-amp (8-bit): the seed's 5%. Quadratic forms d^T H d relative to "
                               "max(|q|, |d| |H d|), the size of what they are differences of; the host's "
                               "bf16-amp emulation is within 5e-3 of it on these models.",
           "models": models}
    with open(os.path.join(out, "reference.json"), "w") as f:
        json.dump(doc, f, indent=2)
        f.write("\n")
    for m in models:
        print(f"make_selfcheck: {out}/{m['file']}: loss {m['loss']:.6f}")


if __name__ == "__main__":
    main()
