# SPDX-License-Identifier: BSD-3-Clause
"""Shared helpers of gnh's Python-driven integration and oracle tests.

CTest passes GNH_BIN (the gnh executable) and GNH_MPIEXEC (mpirun); the
models come from apps/python/gnh_model.py and go through the real converter.
"""
import os
import subprocess
import sys

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

HERE = os.path.dirname(os.path.realpath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "apps", "python"))

import h5py  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

import gnh_convert  # noqa: E402
import gnh_model  # noqa: E402

torch.set_num_threads(1)

GNH = os.environ.get("GNH_BIN", os.path.join(ROOT, "build", "bin", "gnh"))
MPIEXEC = os.environ.get("GNH_MPIEXEC", "mpirun")


def mpi_env():
    env = dict(os.environ)
    if os.geteuid() == 0:
        env["OMPI_ALLOW_RUN_AS_ROOT"] = "1"
        env["OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"] = "1"
    env["OMPI_MCA_rmaps_base_oversubscribe"] = "1"
    # Tests compare separate runs bit for bit: pin the dense GEMM to gnh's
    # kernel instead of letting each run's start-up probe choose (the probe is
    # tested on its own: test_host_gemm, test_reliability).
    env.setdefault("GNH_HOST_GEMM", "native")
    return env


def make_model(cfg, seed, scale=0.3):
    model = gnh_model.GPT(cfg)
    gnh_model.init_random(model, seed, scale)
    return model


def train_steps(model, opt, steps, seed, batch):
    """``steps`` optimizer steps on random (batch, block_size) token sequences
    predicting themselves shifted by one; returns the last loss."""
    gen = torch.Generator().manual_seed(seed)
    cfg = model.config
    loss = torch.zeros(())
    for _ in range(steps):
        idx = torch.randint(0, cfg.vocab_size, (batch, cfg.block_size), generator=gen)
        _, loss = model(idx, idx.roll(-1, dims=1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return loss.detach()


def train_adamw(model, steps, seed, lr=1e-3, weight_decay=0.1, betas=(0.9, 0.95)):
    """``steps`` AdamW steps on random tokens with nanoGPT's parameter groups
    (decay for >= 2-D tensors); returns the optimizer's state_dict, as a
    nanoGPT checkpoint carries it."""
    params = {n: p for n, p in model.named_parameters() if p.requires_grad}
    groups = [{"params": [p for p in params.values() if p.dim() >= 2], "weight_decay": weight_decay},
              {"params": [p for p in params.values() if p.dim() < 2], "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=lr, betas=betas)
    train_steps(model, opt, steps, seed, batch=2)
    return opt.state_dict()


def save_checkpoint(model, directory, stem, iter_num=None, optimizer=None):
    """Saves nanoGPT-layout .pt (with ``optimizer``, a torch optimizer
    state_dict, when given) and converts it; returns the .h5 path."""
    cfg = model.config
    pt = os.path.join(directory, stem + ".pt")
    h5 = os.path.join(directory, stem + ".h5")
    obj = {"model": model.state_dict(),
           "model_args": dict(n_layer=cfg.n_layer, n_head=cfg.n_head, n_embd=cfg.n_embd,
                              block_size=cfg.block_size, bias=cfg.bias,
                              vocab_size=cfg.vocab_size, dropout=0)}
    if iter_num is not None:
        obj["iter_num"] = iter_num
    if optimizer is not None:
        obj["optimizer"] = optimizer
    torch.save(obj, pt)
    opts = gnh_convert.default_options(gelu=cfg.gelu, ln_eps=cfg.ln_eps,
                                       tie=cfg.tie_embeddings)
    gnh_convert.convert(pt, h5, opts)
    return h5


def write_tokens(path, n, vocab, seed, dtype=np.uint16):
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, vocab, size=n).astype(dtype)
    ids.tofile(path)
    return ids


# Small analysis settings for tiny test models (the deck defaults are sized for
# real epochs).
TEST_ANALYSIS = dict(grad_microbatch=4, hvp_batch=3, noise_samples=2, noise_batch=3, directions=2,
                     directions_per_pass=5, seed=1234)


def small_campaign(directory):
    """Two checkpoints of a 1-layer model (vocabulary 19, context 8) in
    directory/ckpt, and seen (20 blocks) and unseen (10 blocks) tokens in
    directory/train.bin and val.bin: a campaign that runs in seconds."""
    cfg = gnh_model.GPTConfig(n_layer=1, n_head=2, n_embd=8, block_size=8, vocab_size=19, bias=True,
                              tie_embeddings=True)
    ck = os.path.join(directory, "ckpt")
    os.makedirs(ck)
    for i in range(2):
        save_checkpoint(make_model(cfg, seed=i), ck, f"ckpt_{i}", iter_num=i)
    write_tokens(os.path.join(directory, "train.bin"), 8 * 20 + 1, 19, 1)
    write_tokens(os.path.join(directory, "val.bin"), 8 * 10 + 1, 19, 2)
    return ck


def write_deck(path, output, checkpoints, context, seen, unseen=None, extra="", analysis=None):
    lines = ["[run]", f'output = "{output}"', "[checkpoints]",
             "paths = [" + ", ".join(f'"{c}"' for c in checkpoints) + "]",
             "[data]", f"context = {context}", f'seen = {{ path = "{seen}", dtype = "uint16" }}']
    if unseen:
        lines.append(f'unseen = {{ path = "{unseen}", dtype = "uint16" }}')
    lines.append("[analysis]")
    for k, v in dict(TEST_ANALYSIS, **(analysis or {})).items():
        lines.append(f'{k} = "{v}"' if isinstance(v, str) else f"{k} = {v}")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n" + extra)


def probe_env(winner):
    """mpi_env() with the host GEMM probed, not pinned, and the probe's decision
    forced to `winner` ("native" or "vendor") by the test-only variable: a
    probe that came out that way."""
    env = mpi_env()
    env.pop("GNH_HOST_GEMM", None)
    env["GNH_TEST_ONLY_PROBE_WINNER"] = winner
    return env


def run_gnh(deck, np_=1, sets=(), timeout=300, env=None, quiet=True):
    cmd = [MPIEXEC, "-np", str(np_), GNH, "run", deck] + (["--quiet"] if quiet else [])
    for s in sets:
        cmd += ["--set", s]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env or mpi_env())


def report(results, out):
    """`gnh report RESULTS --out OUT`: (the finished process, its manifest, or
    None when it wrote none)."""
    import json
    r = subprocess.run([GNH, "report", results, "--out", out], capture_output=True, text=True, env=mpi_env())
    path = os.path.join(out, "manifest.json")
    if r.returncode != 0 or not os.path.exists(path):
        return r, None
    with open(path) as f:
        return r, json.load(f)


def text(v):
    """An HDF5 string attribute element as str."""
    return v.decode() if isinstance(v, bytes) else str(v)


def read_results(path):
    """{alias: {case: (loss, tokens)}} and the group table of a results file."""
    out = {}
    with h5py.File(path, "r") as f:
        assert f.attrs["format"] == "gnh-results"
        for h, g in f["groups"].items():
            aliases = [a.decode() if isinstance(a, bytes) else a for a in g.attrs["aliases"]]
            cases = {c: (float(g[c].attrs["loss"]), int(g[c].attrs["tokens"])) for c in g}
            for a in aliases:
                out[a] = dict(cases, group=h)
    return out


COMPARED = ["loss", "G_sqnorm", "GHG", "trace_sigma", "trace_HSigma", "trace_H", "B_simple", "B_noise"]


def check_bf16_compare(tc, path, cases):
    """A `gnh compare` of bf16-amp against fp32 (its .compare.h5 at path):
    every requested statistic within the default 5% or honestly reported
    failing, G's direction kept (bfloat16 operands, 8 bits, leave a cosine of
    1 - O(2^-16) for an error of O(2^-8) a component), `cases` cases."""
    with h5py.File(path, "r") as f:
        n = 0
        for g in f["groups"].values():
            for c in g.values():
                worst = max(c.attrs["rel_err_" + s] for s in COMPARED)
                tc.assertAlmostEqual(c.attrs["max_rel_err_requested"], worst)
                tc.assertEqual(c.attrs["pass"], 1.0 if worst <= 0.05 else 0.0)
                tc.assertGreater(c.attrs["G_cosine"], 0.999)
                n += 1
        tc.assertEqual(n, cases)
