#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
"""Tests of the Python half of gnh: apps/python/gnh_model.py and gnh-convert.

Run as a plain script (exit status non-zero on failure):

    /usr/bin/python3 tests/integration/test_convert.py [-v]

* ModelTests: the reference GPT against an independent loop-by-loop float64
  implementation, nanoGPT key names, tying, causality, ignored targets,
  double backward and the SPEC section 3 epoch loss.
* ConvertTests: every option combination (bias x tied x gelu) in nanoGPT and
  bare-state_dict layouts is converted; the HDF5 layout, attributes,
  canonical order and bitwise values are checked.
* ConvertErrorTests: every refusal exits 1 with one line on stderr naming the
  file and tensor, without a traceback and without leaving an output file.
* CommandLineTests: the real executable in a subprocess (fewer cases: each
  start imports torch).
"""

import contextlib
import hashlib
import io
import math
import os
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # before torch is imported
os.environ.setdefault("OMP_NUM_THREADS", "1")

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "apps" / "python"))

import h5py  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

import gnh_convert  # noqa: E402
import gnh_model as gm  # noqa: E402

torch.set_num_threads(1)

CONVERT = REPO / "apps" / "gnh-convert"
PYTHON = "/usr/bin/python3"
TORCH_MAJOR = int(torch.__version__.split(".")[0])


def small_config(**kw) -> gm.GPTConfig:
    """n_head 3 with n_embd 12: head size 4, not a power-of-two head count."""
    base = dict(n_layer=2, n_head=3, n_embd=12, block_size=8, vocab_size=17)
    base.update(kw)
    return gm.GPTConfig(**base)


def model_args(cfg: gm.GPTConfig) -> dict:
    """nanoGPT's model_args; dropout as int 0 (no floats, see gnh_convert)."""
    return dict(n_layer=cfg.n_layer, n_head=cfg.n_head, n_embd=cfg.n_embd,
                block_size=cfg.block_size, bias=cfg.bias,
                vocab_size=cfg.vocab_size, dropout=0)


def run_main(*argv):
    """Run gnh_convert.main in-process; return (status, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = gnh_convert.main([str(a) for a in argv])
    return status, out.getvalue(), err.getvalue()


def as_bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


# --------------------------------------------------------------------------- #
# An independent, deliberately naive float64 forward pass
# --------------------------------------------------------------------------- #
def reference_logits(cfg: gm.GPTConfig, state: dict, idx: list) -> torch.Tensor:
    """Logits (T, V) computed position by position and head by head."""
    P = {k: v.detach().double() for k, v in state.items()}

    def layer_norm(x, prefix):
        mu = x.mean()
        var = ((x - mu) ** 2).mean()
        y = (x - mu) / math.sqrt(var.item() + cfg.ln_eps) * P[prefix + ".weight"]
        return y + P[prefix + ".bias"] if cfg.bias else y

    def linear(x, prefix):
        y = P[prefix + ".weight"] @ x
        return y + P[prefix + ".bias"] if cfg.bias else y

    def gelu(x):
        if cfg.gelu == "erf":
            return 0.5 * x * (1 + torch.erf(x / math.sqrt(2)))
        return 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))

    d, hs = cfg.n_embd, cfg.head_size
    xs = [P["transformer.wte.weight"][t] + P["transformer.wpe.weight"][p]
          for p, t in enumerate(idx)]
    for i in range(cfg.n_layer):
        pre = f"transformer.h.{i}."
        qkv = [linear(layer_norm(x, pre + "ln_1"), pre + "attn.c_attn") for x in xs]
        new = []
        for t, x in enumerate(xs):
            heads = []
            for h in range(cfg.n_head):
                sl = slice(h * hs, (h + 1) * hs)
                q = qkv[t][0:d][sl]
                scores = torch.stack([q @ qkv[s][d:2 * d][sl] for s in range(t + 1)])
                w = torch.softmax(scores / math.sqrt(hs), dim=0)
                heads.append(sum(w[s] * qkv[s][2 * d:][sl] for s in range(t + 1)))
            new.append(x + linear(torch.cat(heads), pre + "attn.c_proj"))
        xs = [x + linear(gelu(linear(layer_norm(x, pre + "ln_2"), pre + "mlp.c_fc")),
                         pre + "mlp.c_proj") for x in new]
    head = P["transformer.wte.weight" if cfg.tie_embeddings else "lm_head.weight"]
    return torch.stack([head @ layer_norm(x, "transformer.ln_f") for x in xs])


def all_configs():
    for bias in (True, False):
        for tie in (True, False):
            for gelu in ("erf", "tanh"):
                yield small_config(bias=bias, tie_embeddings=tie, gelu=gelu)


class ModelTests(unittest.TestCase):

    def test_matches_independent_reference(self):
        idx = [3, 16, 0, 7, 7, 1]
        for k, cfg in enumerate(all_configs()):
            with self.subTest(cfg=cfg):
                model = gm.init_random(gm.GPT(cfg), seed=10 + k).double()
                got = model(torch.tensor([idx]))[0]
                want = reference_logits(cfg, gm.canonical_state_dict(model), idx)
                self.assertTrue(torch.allclose(got, want, rtol=1e-10, atol=1e-10),
                                float((got - want).abs().max()))

    def test_state_dict_names_and_tying(self):
        for cfg in all_configs():
            with self.subTest(cfg=cfg):
                model = gm.GPT(cfg)
                names = gm.canonical_names(cfg)
                keys = list(model.state_dict())
                # nanoGPT lists lm_head.weight even when tied.
                self.assertEqual(keys, names if not cfg.tie_embeddings
                                 else names + ["lm_head.weight"])
                self.assertEqual(len(set(names)), len(names))
                shapes = gm.canonical_shapes(cfg)
                self.assertEqual(list(shapes), names)
                for name, t in model.state_dict().items():
                    self.assertEqual(tuple(t.shape), shapes.get(name, shapes[
                        "transformer.wte.weight"]), name)
                tied = model.lm_head.weight is model.transformer.wte.weight
                self.assertEqual(tied, cfg.tie_embeddings)
                n_unique = sum(p.numel() for p in model.parameters())
                self.assertEqual(n_unique, sum(math.prod(s) for s in shapes.values()))
                self.assertEqual(gm.flat_parameters(model).numel(), n_unique)

    def test_reference_model_size(self):
        """SPEC 1: the reference run has 20,403,520 unique parameters."""
        cfg = gm.GPTConfig(n_layer=8, n_head=5, n_embd=320, block_size=1024,
                           vocab_size=32000, bias=False, tie_embeddings=True)
        self.assertEqual(sum(math.prod(s) for s in gm.canonical_shapes(cfg).values()),
                         20_403_520)

    def test_every_option_changes_the_output(self):
        idx = torch.tensor([[1, 2, 3, 4, 5]])
        base = small_config(bias=True, tie_embeddings=False)
        model = gm.init_random(gm.GPT(base), seed=3)
        ref = model(idx)
        for change in (dict(gelu="tanh"), dict(ln_eps=1e-2)):
            other = gm.GPT(gm.GPTConfig(**{**base.__dict__, **change}))
            other.load_state_dict(model.state_dict())
            self.assertFalse(torch.equal(other(idx), ref), change)

    def test_causal_and_ignored_targets(self):
        model = gm.init_random(gm.GPT(small_config()), seed=5)
        a = torch.tensor([[1, 2, 3, 4, 5, 6]])
        b = a.clone()
        b[0, 4] = 9
        la, lb = model(a), model(b)
        self.assertTrue(torch.equal(la[0, :4], lb[0, :4]))
        self.assertFalse(torch.equal(la[0, 4:], lb[0, 4:]))
        targets = torch.tensor([[2, -1, 4, -7, 6, 7]])
        _, loss = model(a, targets)
        logp = torch.log_softmax(la[0], dim=-1)
        keep = [0, 2, 4, 5]
        manual = -torch.stack([logp[t, targets[0, t]] for t in keep]).mean()
        self.assertAlmostEqual(loss.item(), manual.item(), places=6)

    def test_double_backward(self):
        """Explicit attention supports Hessian-vector products."""
        model = gm.init_random(gm.GPT(small_config(gelu="tanh")), seed=6).double()
        idx = torch.tensor([[1, 2, 3, 4]])
        params = list(model.parameters())
        _, loss = model(idx, torch.tensor([[2, 3, 4, 5]]))
        grads = torch.autograd.grad(loss, params, create_graph=True)
        v = [torch.ones_like(p) for p in params]
        hv = torch.autograd.grad(sum((g * u).sum() for g, u in zip(grads, v)), params)
        self.assertTrue(all(torch.isfinite(h).all() for h in hv))
        self.assertGreater(sum(h.abs().sum() for h in hv).item(), 0.0)

    def test_epoch_loss(self):
        cfg = small_config()
        model = gm.init_random(gm.GPT(cfg), seed=8)
        rng = np.random.default_rng(0)
        tokens = rng.integers(0, cfg.vocab_size, size=47).astype(np.uint16)
        T = 6
        n = (len(tokens) - 1) // T  # 7 blocks
        total, count = 0.0, 0
        for b in range(n):
            x = torch.from_numpy(tokens[b * T:b * T + T].astype(np.int64))[None]
            y = torch.from_numpy(tokens[b * T + 1:b * T + T + 1].astype(np.int64))[None]
            _, loss = model(x, y)
            total += loss.item() * T
            count += T
        for batch in (1, 3, 7, 100):
            loss, ntok = gm.epoch_loss(model, tokens, T, batch, torch.float32)
            self.assertEqual(ntok, n * T)
            self.assertAlmostEqual(loss, total / count, places=5)
        loss64, _ = gm.epoch_loss(model, tokens, T, 4, torch.float64)
        self.assertAlmostEqual(loss64, total / count, places=5)
        self.assertEqual(next(model.parameters()).dtype, torch.float32)
        capped, ntok = gm.epoch_loss(model, tokens, T, 4, torch.float32, max_blocks=2)
        self.assertEqual(ntok, 2 * T)
        bad = tokens.copy()
        bad[13] = cfg.vocab_size
        with self.assertRaisesRegex(ValueError, "offset 13"):
            gm.epoch_loss(model, bad, T, 4)


# --------------------------------------------------------------------------- #
# Conversion
# --------------------------------------------------------------------------- #
class TempDirCase(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls._tmp = tempfile.TemporaryDirectory(prefix="gnh-test-convert-")
        cls.tmp = Path(cls._tmp.name)

    @classmethod
    def tearDownClass(cls):
        cls._tmp.cleanup()

    def path(self, name: str) -> Path:
        return self.tmp / name


class ConvertTests(TempDirCase):

    def check_h5(self, h5_path: Path, pt_path: Path, cfg: gm.GPTConfig,
                 state: dict, iter_num=None):
        """Verify the SPEC 2 layout and bitwise values against ``state``."""
        with h5py.File(h5_path, "r") as f:
            self.assertEqual(set(f.keys()), {"config", "params"})
            a = f.attrs
            self.assertEqual(a["format"], "gnh-checkpoint")
            self.assertTrue(np.issubdtype(np.asarray(a["format_version"]).dtype,
                                          np.integer))
            self.assertEqual(int(a["format_version"]), 1)
            self.assertEqual(a["source_file"], pt_path.name)
            self.assertEqual(a["source_sha256"],
                             hashlib.sha256(pt_path.read_bytes()).hexdigest())
            if iter_num is None:
                self.assertNotIn("iter_num", a)
            else:
                self.assertEqual(int(a["iter_num"]), iter_num)
            c = f["config"].attrs
            for key in ("n_layer", "n_head", "n_embd", "block_size", "vocab_size"):
                self.assertTrue(np.issubdtype(np.asarray(c[key]).dtype, np.integer))
                self.assertEqual(int(c[key]), getattr(cfg, key), key)
            self.assertEqual(int(c["bias"]), int(cfg.bias))
            self.assertEqual(int(c["tie_embeddings"]), int(cfg.tie_embeddings))
            self.assertEqual(c["gelu"], cfg.gelu)
            self.assertEqual(np.asarray(c["ln_eps"]).dtype, np.float64)
            self.assertEqual(float(c["ln_eps"]), cfg.ln_eps)
            names = gm.canonical_names(cfg)
            self.assertEqual(list(f["params"].keys()), names)  # canonical order
            for name in names:
                ds = f["params"][name]
                self.assertEqual(ds.dtype, np.dtype("<f4"), name)
                self.assertIsNone(ds.chunks, name)
                self.assertIsNone(ds.compression, name)
                want = state[name].detach().to(torch.float32).numpy()
                self.assertEqual(ds.shape, want.shape, name)
                self.assertTrue(np.array_equal(as_bits(ds[()]), as_bits(want)), name)
        self.assertFalse(Path(str(h5_path) + ".tmp").exists())

    def test_all_option_combinations(self):
        for k, cfg in enumerate(all_configs()):
            for layout in ("nanogpt", "bare"):
                with self.subTest(cfg=cfg, layout=layout):
                    if layout == "bare" and not cfg.bias:
                        cfg = gm.GPTConfig(**{**cfg.__dict__, "ln_eps": 1e-6})
                    model = gm.init_random(gm.GPT(cfg), seed=100 + k)
                    sd = model.state_dict()
                    stem = f"m{k}_{layout}"
                    pt, h5 = self.path(stem + ".pt"), self.path(stem + ".h5")
                    flags = ["--gelu", cfg.gelu]
                    if cfg.ln_eps != 1e-5:
                        flags += ["--ln-eps", repr(cfg.ln_eps)]
                    if layout == "nanogpt":
                        torch.save({"model": sd, "model_args": model_args(cfg),
                                    "iter_num": 1000 + k}, pt)
                        iter_num = 1000 + k
                    else:
                        if cfg.tie_embeddings:
                            sd = {n: t for n, t in sd.items() if n != "lm_head.weight"}
                        torch.save(sd, pt)
                        flags += ["--n-head", "3"]
                        iter_num = None
                    status, out, err = run_main(pt, h5, *flags)
                    self.assertEqual(status, 0, err)
                    n = sum(math.prod(s) for s in gm.canonical_shapes(cfg).values())
                    sha = hashlib.sha256(pt.read_bytes()).hexdigest()
                    self.assertEqual(out, f"gnh-convert: {pt} -> {h5} ({n} parameters,"
                                          f" sha256 {sha})\n")
                    self.check_h5(h5, pt, cfg, sd, iter_num)
                    # Round trip through load_gnh_h5 gives the same model.
                    cfg2, state = gm.load_gnh_h5(str(h5))
                    self.assertEqual(cfg2, cfg)
                    model2 = gm.GPT(cfg2)
                    gm.load_canonical_state(model2, state)
                    idx = torch.tensor([[0, 5, 16, 2]])
                    self.assertTrue(torch.equal(model2(idx), model(idx)))

    def test_low_and_high_precision_inputs(self):
        cfg = small_config(bias=True, tie_embeddings=False)
        model = gm.init_random(gm.GPT(cfg), seed=7)
        for dtype in (torch.float16, torch.bfloat16, torch.float64):
            with self.subTest(dtype=dtype):
                sd = {n: t.detach().to(dtype) for n, t in model.state_dict().items()}
                pt, h5 = self.path(f"prec_{dtype}.pt"), self.path(f"prec_{dtype}.h5")
                torch.save(sd, pt)
                status, _, err = run_main(pt, h5, "--n-head", "3")
                self.assertEqual(status, 0, err)
                self.check_h5(h5, pt, cfg, sd)

    def test_orig_mod_prefix_and_mask_buffers(self):
        for bias in (True, False):
            with self.subTest(bias=bias):
                cfg = small_config(bias=bias)
                sd = gm.init_random(gm.GPT(cfg), seed=9).state_dict()
                full = dict(sd)
                for i in range(cfg.n_layer):  # nanoGPT's causal-mask buffers
                    full[f"transformer.h.{i}.attn.bias"] = torch.ones(1, 1, 8, 8).tril()
                full["transformer.h.0.attn.masked_bias"] = torch.ones(1, 1, 8, 8)
                compiled = {"_orig_mod." + n: t for n, t in full.items()}
                pt, h5 = self.path(f"compiled{bias}.pt"), self.path(f"compiled{bias}.h5")
                torch.save({"model": compiled, "model_args": model_args(cfg),
                            "iter_num": 3}, pt)
                status, _, err = run_main(pt, h5)
                self.assertEqual(status, 0, err)
                self.check_h5(h5, pt, cfg, sd, iter_num=3)
        # Without biases even a non-4-D attn.bias is taken as a mask buffer.
        cfg = small_config(bias=False)
        sd = dict(gm.init_random(gm.GPT(cfg), seed=9).state_dict())
        sd["transformer.h.1.attn.bias"] = torch.ones(8, 8)
        pt, h5 = self.path("mask2d_nobias.pt"), self.path("mask2d_nobias.h5")
        torch.save(sd, pt)
        self.assertEqual(run_main(pt, h5, "--n-head", "3")[0], 0)

    def test_tie_overrides(self):
        cfg = small_config(tie_embeddings=True)
        model = gm.init_random(gm.GPT(cfg), seed=11)
        pt = self.path("tied.pt")
        torch.save({"model": model.state_dict(), "model_args": model_args(cfg)}, pt)
        h5 = self.path("untied.h5")
        status, _, err = run_main(pt, h5, "--untie")
        self.assertEqual(status, 0, err)
        untied = gm.GPTConfig(**{**cfg.__dict__, "tie_embeddings": False})
        sd = dict(model.state_dict())
        self.check_h5(h5, pt, untied, sd)
        # An explicitly untied head that differs cannot be forced tied.
        cfg_u = small_config(tie_embeddings=False)
        pt2 = self.path("untied.pt")
        torch.save(gm.init_random(gm.GPT(cfg_u), seed=12).state_dict(), pt2)
        status, _, err = run_main(pt2, self.path("x.h5"), "--n-head", "3", "--tie")
        self.assertEqual(status, 1)
        self.assertIn("lm_head.weight", err)

    def test_float_metadata(self):
        """model_args['dropout'] = 0.0 (a pickled float), as nanoGPT writes."""
        cfg = small_config()
        pt, h5 = self.path("floatmeta.pt"), self.path("floatmeta.h5")
        torch.save({"model": gm.GPT(cfg).state_dict(),
                    "model_args": {**model_args(cfg), "dropout": 0.0}}, pt)
        status, _, err = run_main(pt, h5)
        if TORCH_MAJOR >= 2:
            self.assertEqual(status, 0, err)
        else:  # PyTorch 1.x's weights-only unpickler lacks BINFLOAT
            self.assertEqual(status, 1)
            self.assertIn("BINFLOAT", err)
            self.assertEqual(err.count("\n"), 1)


class Evil:
    """Unpickling this would run a shell command."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


class Plain:
    """An arbitrary class instance: not weights."""

    def __init__(self):
        self.x = 1


class ConvertErrorTests(TempDirCase):

    def setUp(self):
        self.cfg = small_config(bias=True, tie_embeddings=False)
        self.sd = dict(gm.init_random(gm.GPT(self.cfg), seed=21).state_dict())

    def save(self, name: str, state=None, nanogpt=True) -> Path:
        pt = self.path(name + ".pt")
        state = self.sd if state is None else state
        torch.save({"model": state, "model_args": model_args(self.cfg)}
                   if nanogpt else state, pt)
        return pt

    def refuse(self, pt: Path, *needles, flags=()):
        h5 = self.path(pt.stem + ".h5")
        status, out, err = run_main(pt, h5, *flags)
        self.assertEqual(status, 1, out)
        self.assertEqual(out, "")
        self.assertEqual(err.count("\n"), 1, err)
        self.assertTrue(err.startswith(f"gnh-convert: error: {pt}: "), err)
        self.assertNotIn("Traceback", err)
        for needle in needles:
            self.assertIn(needle, err)
        self.assertFalse(h5.exists())
        self.assertFalse(Path(str(h5) + ".tmp").exists())
        return err

    def test_nan(self):
        t = self.sd["transformer.h.1.mlp.c_fc.weight"].clone()
        t.view(-1)[5] = float("nan")
        t.view(-1)[40] = float("nan")
        self.refuse(self.save("nan", {**self.sd, "transformer.h.1.mlp.c_fc.weight": t}),
                    "transformer.h.1.mlp.c_fc.weight", "NaN", "2 value",
                    "flat index 5")

    def test_inf(self):
        t = self.sd["transformer.wpe.weight"].clone().half()
        t[2, 3] = float("-inf")
        self.refuse(self.save("inf", {**self.sd, "transformer.wpe.weight": t}),
                    "transformer.wpe.weight", "Inf", "1 value",
                    f"flat index {2 * 12 + 3}")

    def test_float64_overflow(self):
        t = self.sd["lm_head.weight"].double()
        t[0, 1] = 1e300
        self.refuse(self.save("overflow", {**self.sd, "lm_head.weight": t}),
                    "lm_head.weight", "overflows float32", "flat index 1")

    def test_wrong_shape(self):
        t = self.sd["transformer.h.0.attn.c_proj.weight"][:, :11].clone()
        self.refuse(self.save("shape", {**self.sd,
                                        "transformer.h.0.attn.c_proj.weight": t}),
                    "transformer.h.0.attn.c_proj.weight", "(12, 11)", "(12, 12)")

    def test_missing_tensor(self):
        sd = {n: t for n, t in self.sd.items() if n != "transformer.h.1.ln_2.bias"}
        self.refuse(self.save("missing", sd), "missing tensor transformer.h.1.ln_2.bias")

    def test_unknown_tensor(self):
        sd = {**self.sd, "transformer.h.0.attn.rotary": torch.zeros(3)}
        self.refuse(self.save("unknown", sd), "unknown tensor transformer.h.0.attn.rotary")

    def test_mask_like_buffer_that_is_not_4d_with_bias(self):
        sd = {**self.sd, "transformer.h.0.attn.bias": torch.zeros(36)}
        self.refuse(self.save("attnbias2d", sd), "unknown tensor transformer.h.0.attn.bias")

    def test_non_floating_dtype(self):
        sd = {**self.sd, "transformer.ln_f.weight": torch.ones(12, dtype=torch.int32)}
        self.refuse(self.save("intdtype", sd), "transformer.ln_f.weight", "int32")

    def test_truncated_file(self):
        full = self.save("whole").read_bytes()
        pt = self.path("truncated.pt")
        pt.write_bytes(full[: len(full) * 2 // 3])
        self.refuse(pt, "truncated or corrupt")

    def test_garbage_file(self):
        pt = self.path("garbage.pt")
        pt.write_bytes(b"this is not a checkpoint\n" * 10)
        self.refuse(pt, "truncated or corrupt")

    def test_missing_file(self):
        self.refuse(self.path("does_not_exist.pt"), "cannot read file")

    def test_pickled_object_is_refused(self):
        pt = self.path("plain_object.pt")
        torch.save({"model": Plain()}, pt)
        self.refuse(pt, "weights-only", "Plain")

    def test_pickled_code_is_never_run(self):
        marker = self.path("pwned")
        pt = self.path("evil.pt")
        torch.save({"model": self.sd, "hook": Evil(str(marker))}, pt)
        self.refuse(pt, "weights-only")
        self.assertFalse(marker.exists())

    def test_bare_state_dict_needs_n_head(self):
        self.refuse(self.save("bare", nanogpt=False), "--n-head is required",
                    "transformer.h.0.attn.c_attn.weight")

    def test_n_head_must_divide_n_embd(self):
        self.refuse(self.save("badheads", nanogpt=False), "n_head=5",
                    "n_embd=12", flags=("--n-head", "5"))

    def test_flag_disagrees_with_model_args(self):
        self.refuse(self.save("disagree"), "--n-layer 3", "n_layer=2",
                    flags=("--n-layer", "3"))

    def test_wrong_layer_count_flag_on_bare_file(self):
        self.refuse(self.save("layers", nanogpt=False), "missing tensor transformer.h.2.",
                    flags=("--n-head", "3", "--n-layer", "3"))


class CommandLineTests(TempDirCase):
    """The installed script, in a subprocess: exit status and stream contents."""

    def run_cli(self, *argv):
        env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
        return subprocess.run([PYTHON, str(CONVERT), *map(str, argv)],
                              capture_output=True, text=True, env=env, timeout=120)

    def test_success_and_refusals(self):
        self.assertTrue(os.access(CONVERT, os.X_OK))
        self.assertTrue(CONVERT.read_text().startswith("#!/usr/bin/python3\n"))
        cfg = small_config(bias=False)
        sd = dict(gm.init_random(gm.GPT(cfg), seed=31).state_dict())
        good = self.path("good.pt")
        torch.save({"model": sd, "model_args": model_args(cfg), "iter_num": 9}, good)
        r = self.run_cli(good, self.path("good.h5"))
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertRegex(r.stdout, r"^gnh-convert: .*good\.pt -> .*good\.h5 "
                                   r"\(\d+ parameters, sha256 [0-9a-f]{64}\)\n$")

        truncated = self.path("cut.pt")
        truncated.write_bytes(good.read_bytes()[:1000])
        bad = dict(sd)
        bad["transformer.h.0.mlp.c_proj.weight"] = \
            bad["transformer.h.0.mlp.c_proj.weight"].clone().fill_(float("nan"))
        nan = self.path("nan.pt")
        torch.save({"model": bad, "model_args": model_args(cfg)}, nan)
        evil = self.path("evil.pt")
        torch.save({"model": Plain()}, evil)
        for pt, needle in ((truncated, "truncated"),
                           (nan, "transformer.h.0.mlp.c_proj.weight"),
                           (evil, "weights-only")):
            with self.subTest(pt=pt.name):
                r = self.run_cli(pt, self.path(pt.stem + ".h5"))
                self.assertEqual(r.returncode, 1)
                self.assertEqual(r.stdout, "")
                self.assertEqual(r.stderr.count("\n"), 1, r.stderr)
                self.assertTrue(r.stderr.startswith(f"gnh-convert: error: {pt}: "))
                self.assertIn(needle, r.stderr)
                self.assertNotIn("Traceback", r.stderr)


if __name__ == "__main__":
    unittest.main()
