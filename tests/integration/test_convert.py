#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
"""Tests of the Python half of gnh: apps/python/gnh_model.py and gnh-convert.

Run as a plain script (exit status non-zero on failure):

    /usr/bin/python3 tests/integration/test_convert.py [-v]

PyTorch is needed here to make checkpoints, never by the converter: every
command-line run hides it (a ``torch`` package on PYTHONPATH that raises
ImportError and records any attempt to import it).

* ModelTests: the reference GPT against an independent loop-by-loop float64
  implementation, nanoGPT key names, tying, causality, ignored targets,
  double backward and the SPEC section 3 epoch loss.
* ConvertTests: every option combination (bias x tied x gelu) in nanoGPT and
  bare-state_dict layouts is converted; the HDF5 layout, attributes,
  canonical order and bitwise values are checked.
* RealCheckpointTests: nanoGPT training checkpoints as train.py writes them
  (AdamW after real steps, ``_orig_mod.`` keys, float metadata) in float32,
  float16 and bfloat16, tied and untied, zip and legacy formats, plus bare
  state_dicts, safetensors, strided views and big-endian archives; weights
  and AdamW moments bit for bit.
* OptimizerMappingTests: optimizer state whose mapping cannot be proven is
  left out with one warning line, the parameters still converted.
* ConvertErrorTests: every refusal exits 1 with one line on stderr naming the
  file and tensor, without a traceback and without leaving an output file.
* HostileFileTests: code in every pickle form, in zip and legacy files, is
  refused by name and never runs; malformed archives and safetensors.
* ResourceLimitTests: files built to crash or exhaust the reader (too many
  dimensions, deep nesting, huge memo indices, broadcast views, zip bombs,
  configurations that would loop, long paths) are refused quickly in a
  subprocess under a 2 GiB address-space limit.
* ReaderContractTests: gnh_ptfile.load raises only PtFileError; names from
  the file cannot break a message's line; the scratch file is created
  exclusively; iter_num and optimizer settings are range-checked.
* CommandLineTests: the real executable in a torch-less subprocess.
* DemoCampaignTests: checkpoints as apps/gnh-demo-campaign writes them.
"""

import collections
import contextlib
import hashlib
import importlib.machinery
import importlib.util
import io
import json
import math
import os
import pickle
import pickletools
import re
import resource
import struct
import subprocess
import sys
import tempfile
import unittest
import zipfile
import zlib
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
import gnh_ptfile  # noqa: E402
import gnhtest  # noqa: E402

torch.set_num_threads(1)

CONVERT = REPO / "apps" / "gnh-convert"
DEMO = REPO / "apps" / "gnh-demo-campaign"
PYTHON = "/usr/bin/python3"
LEGACY_MAGIC = 0x1950a86a20f9469cfc6c


def small_config(**kw) -> gm.GPTConfig:
    """n_head 3 with n_embd 12: head size 4, not a power-of-two head count."""
    base = dict(n_layer=2, n_head=3, n_embd=12, block_size=8, vocab_size=17)
    base.update(kw)
    return gm.GPTConfig(**base)


def model_args(cfg: gm.GPTConfig) -> dict:
    """nanoGPT's model_args, dropout a float as train.py writes it."""
    return dict(n_layer=cfg.n_layer, n_head=cfg.n_head, n_embd=cfg.n_embd,
                block_size=cfg.block_size, bias=cfg.bias,
                vocab_size=cfg.vocab_size, dropout=0.0)


def nanogpt_config(cfg: gm.GPTConfig) -> dict:
    """train.py's 'config': floats, ints, strings, bools, None, tuples, nesting."""
    return dict(out_dir="out", eval_interval=2000, log_interval=1, eval_iters=200,
                eval_only=False, always_save_checkpoint=True, init_from="scratch",
                wandb_log=False, wandb_project="owt", wandb_run_name="gpt2",
                dataset="openwebtext", gradient_accumulation_steps=5 * 8,
                batch_size=12, block_size=cfg.block_size, n_layer=cfg.n_layer,
                n_head=cfg.n_head, n_embd=cfg.n_embd, dropout=0.0, bias=cfg.bias,
                learning_rate=6e-4, max_iters=600000, weight_decay=1e-1, beta1=0.9,
                beta2=0.95, grad_clip=1.0, decay_lr=True, warmup_iters=2000,
                lr_decay_iters=600000, min_lr=6e-5, backend="nccl", device="cpu",
                dtype="bfloat16", compile=True, resume_from=None,
                betas=(0.9, 0.95), extra={"nested": {"scale": [1, 2.5, -0.0]},
                                          "inf": float("inf")})


def run_main(*argv):
    """Run gnh_convert.main in-process; return (status, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = gnh_convert.main([str(a) for a in argv])
    return status, out.getvalue(), err.getvalue()


def scratch_files(out: Path) -> list:
    """Temporary files the converter may have left next to ``out``: its
    ``mkstemp`` names (``OUT.<8 chars>.tmp``) and the old ``OUT.tmp``."""
    pattern = re.compile(re.escape(out.name) + r"(\.[A-Za-z0-9_]{8})?\.tmp")
    return sorted(p.name for p in out.parent.iterdir() if pattern.fullmatch(p.name))


def as_bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


def torch_bits(t: torch.Tensor) -> np.ndarray:
    """float32 bits of a tensor, float16/bfloat16 widened exactly by torch."""
    return t.detach().to(torch.float32).contiguous().numpy().view(np.uint32)


# --------------------------------------------------------------------------- #
# The converter's command line, with PyTorch hidden
# --------------------------------------------------------------------------- #
_HIDDEN_TORCH = """import os
probe = os.environ.get("GNH_TORCH_PROBE")
if probe:
    with open(probe, "a") as fh:
        fh.write("import torch\\n")
raise ImportError("torch is hidden by test_convert.py")
"""
# Proves torch is hidden, then runs the script as `python3 SCRIPT ARGS` would.
_DRIVER = """import os, runpy, sys
probe = os.environ.pop("GNH_TORCH_PROBE")
try:
    import torch
except ImportError as exc:
    assert "hidden by test_convert.py" in str(exc), exc
else:
    sys.exit("torch is importable: " + torch.__file__)
os.environ["GNH_TORCH_PROBE"] = probe
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def run_without_torch(tmp: Path, *argv) -> subprocess.CompletedProcess:
    """Run apps/gnh-convert ARGV where ``import torch`` fails; check it never tried."""
    stub = tmp / "hidden-torch"
    if not (stub / "torch" / "__init__.py").exists():
        (stub / "torch").mkdir(parents=True, exist_ok=True)
        (stub / "torch" / "__init__.py").write_text(_HIDDEN_TORCH)
    probe = tmp / "torch-import-attempts"
    env = dict(os.environ, PYTHONPATH=str(stub), GNH_TORCH_PROBE=str(probe))
    r = subprocess.run([PYTHON, "-c", _DRIVER, str(CONVERT), *map(str, argv)],
                       capture_output=True, text=True, env=env, timeout=120)
    if probe.exists():
        raise AssertionError("the converter tried to import torch")
    if "torch is importable" in r.stderr:
        raise AssertionError(r.stderr)
    return r


# --------------------------------------------------------------------------- #
# Checkpoints as nanoGPT's train.py writes them
# --------------------------------------------------------------------------- #
class Compiled(torch.nn.Module):
    """Like torch.compile's OptimizedModule: the model as ``_orig_mod``."""

    def __init__(self, mod: torch.nn.Module):
        super().__init__()
        self._orig_mod = mod


def nanogpt_optimizer(model: torch.nn.Module, weight_decay=0.1, lr=6e-4,
                      betas=(0.9, 0.95)):
    """nanoGPT's configure_optimizers; returns (AdamW, names in id order)."""
    param_dict = {pn: p for pn, p in model.named_parameters() if p.requires_grad}
    decay = [(n, p) for n, p in param_dict.items() if p.dim() >= 2]
    nodecay = [(n, p) for n, p in param_dict.items() if p.dim() < 2]
    groups = [{"params": [p for _, p in decay], "weight_decay": weight_decay},
              {"params": [p for _, p in nodecay], "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=lr, betas=betas)
    return opt, [n for n, _ in decay] + [n for n, _ in nodecay]


def train_steps(model: gm.GPT, opt, steps: int, seed: int) -> float:
    return gnhtest.train_steps(model, opt, steps, seed, batch=3)


def nanogpt_checkpoint(cfg: gm.GPTConfig, dtype=torch.float32, steps=3, seed=0,
                       compiled=True):
    """Train ``steps`` AdamW steps; return (checkpoint dict, model, names in id order).

    float16/bfloat16 checkpoints are exported after float32 training, the
    AdamW moments cast to the same dtype by load_state_dict.
    """
    model = gm.init_random(gm.GPT(cfg), seed=seed)
    opt, names = nanogpt_optimizer(model)
    best_val_loss = train_steps(model, opt, steps, seed)
    if dtype != torch.float32:
        model.to(dtype)
        opt.load_state_dict(opt.state_dict())
    raw_model = Compiled(model) if compiled else model
    ckpt = {"model": raw_model.state_dict(), "optimizer": opt.state_dict(),
            "model_args": model_args(cfg), "iter_num": 1000 + steps,
            "best_val_loss": best_val_loss, "config": nanogpt_config(cfg)}
    return ckpt, model, names


def save_pt(obj, path: Path, legacy: bool = False) -> Path:
    torch.save(obj, path, _use_new_zipfile_serialization=not legacy)
    return path


def rewrite_zip(src: Path, dst: Path, replace: dict) -> Path:
    """Copy a zip archive; members named by their path after the prefix
    (``data.pkl``, ``data/0``) are replaced by bytes or by f(old bytes), or
    added if absent."""
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", zipfile.ZIP_STORED) as zout:
        prefix = zin.namelist()[0].split("/", 1)[0]
        for info in zin.infolist():
            suffix = info.filename.split("/", 1)[1]
            data = zin.read(info.filename)
            if suffix in replace:
                value = replace[suffix]
                data = value(data) if callable(value) else value
            zout.writestr(info.filename, data)
        for suffix, value in replace.items():
            if f"{prefix}/{suffix}" not in zin.namelist():
                zout.writestr(f"{prefix}/{suffix}", value)
    return dst


def legacy_stream(main: bytes, keys=(), storages=b"") -> bytes:
    """torch.save's legacy layout around a main pickle ``main``."""
    sys_info = dict(protocol_version=1001, little_endian=True,
                    type_sizes=dict(short=2, int=4, long=4))
    return (pickle.dumps(LEGACY_MAGIC, protocol=2) + pickle.dumps(1001, protocol=2)
            + pickle.dumps(sys_info, protocol=2) + main
            + pickle.dumps(list(keys), protocol=2) + storages)


def write_safetensors(path: Path, tensors: dict, metadata=None, pad=True) -> Path:
    """A safetensors file by the format's definition (the package is not installed)."""
    names = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
             torch.float64: "F64", torch.int64: "I64", torch.int32: "I32"}
    header, blobs, offset = {}, [], 0
    if metadata is not None:
        header["__metadata__"] = metadata
    for name, t in tensors.items():
        t = t.detach().contiguous()
        raw = t.view(torch.int16).numpy().tobytes() if t.dtype == torch.bfloat16 \
            else t.numpy().tobytes()
        header[name] = {"dtype": names[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    text = json.dumps(header).encode()
    if pad:
        text += b" " * (-len(text) % 8)
    path.write_bytes(struct.pack("<Q", len(text)) + text + b"".join(blobs))
    return path


# --------------------------------------------------------------------------- #
# Hand-made pickles: torch's layout with chosen geometry, and code payloads
# --------------------------------------------------------------------------- #
class FakeStorage:
    """A float32 storage for TorchLikePickler: key and elements."""

    def __init__(self, key: str, values: torch.Tensor):
        self.key = key
        self.data = values.detach().to(torch.float32).contiguous().numpy().tobytes()
        self.numel = len(self.data) // 4


class RawTensor:
    """Pickles as torch does (_rebuild_tensor_v2), with any geometry and state."""

    def __init__(self, storage, offset, size, stride, state=None):
        self.args = (storage, offset, size, stride, False, collections.OrderedDict())
        self.state = state

    def __reduce__(self):
        fn = torch._utils._rebuild_tensor_v2
        return (fn, self.args) if self.state is None else (fn, self.args, self.state)


class TorchLikePickler(pickle.Pickler):
    def __init__(self, file, legacy: bool):
        super().__init__(file, protocol=2)
        self.legacy = legacy

    def persistent_id(self, obj):
        if not isinstance(obj, FakeStorage):
            return None
        pid = ("storage", torch.FloatStorage, obj.key, "cpu", obj.numel)
        return pid + (None,) if self.legacy else pid


def torch_like_file(path: Path, obj, storages, legacy: bool = False) -> Path:
    """Write ``obj`` (with RawTensor/FakeStorage leaves) in torch.save's layout."""
    buf = io.BytesIO()
    TorchLikePickler(buf, legacy).dump(obj)
    if legacy:
        data = b"".join(struct.pack("<q", s.numel) + s.data for s in storages)
        path.write_bytes(legacy_stream(buf.getvalue(), [s.key for s in storages], data))
        return path
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        z.writestr("archive/data.pkl", buf.getvalue())
        for st in storages:
            z.writestr(f"archive/data/{st.key}", st.data)
        z.writestr("archive/version", b"3\n")
    return path


def fake_state(sd: dict):
    """``sd`` as RawTensors, each on its own FakeStorage; (state, storages)."""
    state, storages = {}, []
    for i, (name, t) in enumerate(sd.items()):
        storages.append(FakeStorage(str(i), t.reshape(-1)))
        stride = tuple(int(np.prod(t.shape[d + 1:])) for d in range(t.dim()))
        state[name] = RawTensor(storages[-1], 0, tuple(t.shape), stride)
    return state, storages


def torch_like_zip(path: Path, obj, storages) -> Path:
    return torch_like_file(path, obj, storages, legacy=False)


class Evil:
    """Unpickling this would run a shell command."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


class ExecEvil(Evil):
    """Unpickling this would run Python code through builtins.exec."""

    def __reduce__(self):
        return (exec, (f"open({self.marker!r}, 'w').close()",))


class Plain:
    """An arbitrary class instance: not weights."""

    def __init__(self):
        self.x = 1


# Extension codes and what a registry that knew them would run.
EXT_TARGETS = {"EXT1": (0x5a, os.system.__module__, "system"),
               "EXT2": (0x5a5a, "os", "system"),
               "EXT4": (0x5a5a5a5a, "subprocess", "getoutput")}


def code_payloads(marker: str) -> dict:
    """{form: (pickle, global or opcode the refusal names, opcode, runs when
    unpickled)}: a shell command or exec in every pickle form."""
    cmd = f"touch {marker}".encode()
    system = f"{os.system.__module__}.system"
    args = pickle.dumps((["touch", marker],), protocol=2)[2:-1]
    reduce = b"(S'" + cmd + b"'\ntR."
    out = {f"reduce-protocol-{p}": (pickle.dumps({"model": Evil(marker)}, protocol=p),
                                    system, "GLOBAL" if p < 4 else "STACK_GLOBAL", True)
           for p in (0, 1, 2, 4, 5)}
    # Protocols < 3 write Python 2 names; find_class sees them unmapped.
    out["exec-protocol-2"] = (pickle.dumps({"model": ExecEvil(marker)}, protocol=2),
                              "__builtin__.exec", "GLOBAL", True)
    out["exec-protocol-4"] = (pickle.dumps({"model": ExecEvil(marker)}, protocol=4),
                              "builtins.exec", "STACK_GLOBAL", True)
    out["inst"] = (b"(S'" + cmd + b"'\nios\nsystem\n.", "os.system", "INST", True)
    out["obj"] = (b"(cos\nsystem\nS'" + cmd + b"'\no.", "os.system", "OBJ", True)
    # NEWOBJ and NEWOBJ_EX call cls.__new__ only (Popen's starts nothing), but
    # their class is refused by name all the same.
    out["newobj"] = (b"\x80\x02csubprocess\nPopen\n" + args + b"\x81.",
                     "subprocess.Popen", "NEWOBJ", False)
    out["newobj-ex"] = (b"\x80\x04\x8c\nsubprocess\x8c\x05Popen\x93" + args
                        + b"}\x92.", "subprocess.Popen", "NEWOBJ_EX", False)
    for op, size, byte in (("EXT1", 1, b"\x82"), ("EXT2", 2, b"\x83"),
                           ("EXT4", 4, b"\x84")):
        code = EXT_TARGETS[op][0].to_bytes(size, "little")
        out[op.lower()] = (b"\x80\x02" + byte + code + reduce, op, op, True)
    return out


# Runs each pickle with the standard unpickler, as torch.load(weights_only=False)
# would: proof that the payloads are live.
_CONTROL = """import copyreg, os, pickle, sys
for code, module, name in %r:
    copyreg.add_extension(module, name, code)
for path in sys.argv[1:]:
    with open(path, "rb") as fh:
        pickle.load(fh)
"""


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
        self.assertEqual(scratch_files(h5_path), [])

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
        """Python floats, None, tuples and nesting in the metadata (BINFLOAT
        and friends, which PyTorch 1.x's weights-only loader refused)."""
        cfg = small_config()
        pt, h5 = self.path("floatmeta.pt"), self.path("floatmeta.h5")
        sd = gm.init_random(gm.GPT(cfg), seed=4).state_dict()
        torch.save({"model": sd, "model_args": model_args(cfg), "iter_num": 5,
                    "best_val_loss": 2.75, "config": nanogpt_config(cfg)}, pt)
        with zipfile.ZipFile(pt) as z:
            pkl = z.read(next(n for n in z.namelist() if n.endswith("/data.pkl")))
        ops = {op.name for op, _, _ in pickletools.genops(pkl)}
        self.assertIn("BINFLOAT", ops)  # the floats really are pickled as floats
        status, _, err = run_main(pt, h5)
        self.assertEqual((status, err), (0, ""))
        self.check_h5(h5, pt, cfg, sd, iter_num=5)


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
        self.assertEqual(scratch_files(h5), [])
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
        empty = self.path("empty.pt")
        empty.write_bytes(b"")
        self.refuse(empty, "empty file")

    def test_truncated_legacy_file(self):
        full = self.save("whole_legacy")
        torch.save({"model": self.sd, "model_args": model_args(self.cfg)}, full,
                   _use_new_zipfile_serialization=False)
        pt = self.path("truncated_legacy.pt")
        pt.write_bytes(full.read_bytes()[:-100])
        self.refuse(pt, "truncated or corrupt file: storage", "bytes")

    def test_missing_file(self):
        self.refuse(self.path("does_not_exist.pt"), "cannot read file")

    def test_pickled_object_is_refused(self):
        pt = self.path("plain_object.pt")
        torch.save({"model": Plain()}, pt)
        self.refuse(pt, "refusing global __main__.Plain in data.pkl")

    def test_pickled_code_is_never_run(self):
        marker = self.path("pwned")
        pt = self.path("evil.pt")
        torch.save({"model": self.sd, "hook": Evil(str(marker))}, pt)
        self.refuse(pt, f"refusing global {os.system.__module__}.system in data.pkl")
        self.assertFalse(marker.exists())

    def test_storage_shorter_than_its_tensor(self):
        """A record cut short, and a tensor reaching past its storage."""
        good = self.save("short_src")
        cut = rewrite_zip(good, self.path("short_record.pt"),
                          {"data/3": lambda b: b[:-4]})
        self.refuse(cut, "storage 3 holds", "data.pkl declares")
        sd, storages = fake_state(self.sd)
        storage = FakeStorage("short", torch.ones(100))
        sd["transformer.h.0.attn.c_proj.weight"] = RawTensor(storage, 0, (12, 12), (12, 1))
        pt = torch_like_zip(self.path("overreach.pt"), {"model": sd,
                            "model_args": model_args(self.cfg)}, storages + [storage])
        self.refuse(pt, "tensor model/transformer.h.0.attn.c_proj.weight of shape "
                        "(12, 12)", "addresses 144 float32 elements", "holds 100")

    def test_same_file_is_never_overwritten(self):
        pt = self.save("selfish")
        before = pt.read_bytes()
        alias = self.path("alias_link.pt")
        alias.symlink_to(pt)
        hard = self.path("hard_link.pt")
        os.link(pt, hard)
        for out in (pt, Path(f"{self.tmp}/../{self.tmp.name}/selfish.pt"), alias, hard):
            with self.subTest(out=str(out)):
                status, out_text, err = run_main(pt, out)
                self.assertEqual((status, out_text), (1, ""))
                self.assertEqual(err.count("\n"), 1, err)
                self.assertIn("is the input file; refusing to overwrite it", err)
                self.assertEqual(pt.read_bytes(), before)
        # An input named like a scratch file is left alone: the scratch file
        # is always a new one.
        tmp_named = self.path("x.h5.tmp")
        tmp_named.write_bytes(before)
        status, _, err = run_main(tmp_named, self.path("x.h5"))
        self.assertEqual((status, err), (0, ""))
        self.assertEqual(tmp_named.read_bytes(), before)
        self.assertTrue(h5py.is_hdf5(self.path("x.h5")))

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


    def test_malformed_safetensors(self):
        tensors = {n: t for n, t in self.sd.items()}
        good = write_safetensors(self.path("good.safetensors"), tensors)
        raw = good.read_bytes()
        n = struct.unpack("<Q", raw[:8])[0]
        header = json.loads(raw[8:8 + n])
        body = raw[8 + n:]

        def variant(stem, change, data=None):
            h = json.loads(json.dumps(header))
            change(h)
            text = json.dumps(h).encode()
            pt = self.path(stem + ".safetensors")
            pt.write_bytes(struct.pack("<Q", len(text)) + text + (body if data is None else data))
            return pt

        name = "transformer.h.0.mlp.c_fc.weight"
        first = next(iter(header))
        end = len(body)

        def set_offsets(h, offsets):
            h[name]["data_offsets"] = offsets

        cases = [
            ("past_end", lambda h: set_offsets(h, [end - 8, end + 2296]), None,
             [f"safetensors tensor {name}", "outside the"]),
            ("overlap", lambda h: set_offsets(h, [h[first]["data_offsets"][0],
                                                  h[first]["data_offsets"][0] + 2304]),
             None, ["overlap or hole"]),
            ("short_span", lambda h: set_offsets(h, [h[name]["data_offsets"][0],
                                                     h[name]["data_offsets"][1] - 4]),
             None, [name, "span 2300 bytes", "needs 2304"]),
            ("negative", lambda h: set_offsets(h, [-4, 2300]), None, ["data_offsets"]),
            ("bad_dtype", lambda h: h[name].update(dtype="F8_E4M3"), None,
             ["unsupported dtype F8_E4M3"]),
            ("extra_data", lambda h: None, body + b"\0" * 4, ["holds", "header describes"]),
            ("cut_data", lambda h: None, body[:-4], ["outside the"]),
        ]
        for stem, change, data, needles in cases:
            with self.subTest(case=stem):
                self.refuse(variant(stem, change, data), *needles)
        too_long = self.path("header_length.safetensors")
        too_long.write_bytes(struct.pack("<Q", n + len(body) + 1) + raw[8:])
        self.refuse(too_long, "truncated or corrupt safetensors file", "header length")
        dup = self.path("dup.safetensors")
        text = b'{"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}, ' \
               b'"a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}'
        dup.write_bytes(struct.pack("<Q", len(text)) + text + b"\0" * 8)
        self.refuse(dup, "key a appears twice")


class CommandLineTests(TempDirCase):
    """The installed script, torch hidden: exit status and stream contents."""

    def test_success_and_refusals(self):
        self.assertTrue(os.access(CONVERT, os.X_OK))
        self.assertTrue(CONVERT.read_text().startswith("#!/usr/bin/python3\n"))
        cfg = small_config(bias=False)
        sd = dict(gm.init_random(gm.GPT(cfg), seed=31).state_dict())
        good = self.path("good.pt")
        torch.save({"model": sd, "model_args": model_args(cfg), "iter_num": 9}, good)
        r = run_without_torch(self.tmp, good, self.path("good.h5"))
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stderr, "")
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
        for argv, needle in (((truncated, self.path("cut.h5")), "truncated"),
                             ((nan, self.path("nan.h5")),
                              "transformer.h.0.mlp.c_proj.weight"),
                             ((evil, self.path("evil.h5")), "__main__.Plain"),
                             ((good, good), "is the input file")):
            pt = argv[0]
            with self.subTest(pt=pt.name, needle=needle):
                r = run_without_torch(self.tmp, *argv)
                self.assertEqual(r.returncode, 1)
                self.assertEqual(r.stdout, "")
                self.assertEqual(r.stderr.count("\n"), 1, r.stderr)
                self.assertTrue(r.stderr.startswith(f"gnh-convert: error: {pt}: "))
                self.assertIn(needle, r.stderr)
                self.assertNotIn("Traceback", r.stderr)
        self.assertTrue(good.read_bytes().startswith(b"PK"))


class CheckpointAsserts:
    """Bitwise checks of a converted file against its torch source (a mixin
    for TestCase classes)."""

    def check_params(self, f, cfg: gm.GPTConfig, tensors: dict):
        """/params against ``tensors`` (canonical name -> torch tensor), bitwise."""
        names = gm.canonical_names(cfg)
        self.assertEqual(list(f["params"]), names)
        for name in names:
            ds = f["params"][name]
            self.assertEqual(ds.dtype, np.dtype("<f4"), name)
            self.assertEqual(ds.shape, tuple(tensors[name].shape), name)
            self.assertTrue(np.array_equal(ds[()].view(np.uint32),
                                           torch_bits(tensors[name])), name)

    def check_optimizer(self, f, cfg: gm.GPTConfig, opt_sd: dict, names: list,
                        steps: int, weight_decay: float):
        """/optimizer against the optimizer's state_dict, ids mapped by ``names``."""
        self.assertEqual(sorted(names), sorted(gm.canonical_names(cfg)))
        o = f["optimizer"]
        self.assertTrue(any(np.any(ds[()] != 0) for ds in o["exp_avg"].values()))
        for key in ("exp_avg", "exp_avg_sq"):
            self.assertEqual(list(o[key]), gm.canonical_names(cfg))
            for pid, name in enumerate(names):
                ds = o[key][name]
                want = opt_sd["state"][pid][key]
                self.assertEqual(ds.dtype, np.dtype("<f4"))
                self.assertEqual(ds.shape, tuple(want.shape), name)
                self.assertTrue(np.array_equal(ds[()].view(np.uint32), torch_bits(want)),
                                f"{key} {name}")
        group = opt_sd["param_groups"][0]
        self.assertEqual(o.attrs["step"].dtype, np.int64)
        self.assertEqual(int(o.attrs["step"]), steps)
        self.assertEqual(int(opt_sd["state"][0]["step"]), steps)
        for key, want in (("beta1", group["betas"][0]), ("beta2", group["betas"][1]),
                          ("eps", group["eps"]), ("lr", group["lr"]),
                          ("weight_decay", weight_decay)):
            self.assertEqual(o.attrs[key].dtype, np.float64, key)
            self.assertEqual(float(o.attrs[key]), want, key)


class RealCheckpointTests(TempDirCase, CheckpointAsserts):
    """nanoGPT checkpoints as train.py saves them, converted without torch."""

    def convert_cli(self, pt: Path, *flags) -> Path:
        h5 = pt.with_suffix(".h5")
        r = run_without_torch(self.tmp, pt, h5, *flags)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stderr, "")
        self.assertTrue(r.stdout.startswith(f"gnh-convert: {pt} -> {h5} ("), r.stdout)
        self.assertEqual(scratch_files(h5), [])
        return h5

    def test_nanogpt_training_checkpoints(self):
        """float32/float16/bfloat16 x tied/untied x zip/legacy, AdamW after 3 steps."""
        k = 0
        for dtype in (torch.float32, torch.float16, torch.bfloat16):
            for tied in (True, False):
                k += 1
                cfg = small_config(bias=k % 2 == 0, tie_embeddings=tied)
                ckpt, model, names = nanogpt_checkpoint(cfg, dtype, steps=3, seed=k)
                sd = ckpt["model"]
                self.assertTrue(all(n.startswith("_orig_mod.") for n in sd))
                wte, head = sd["_orig_mod.transformer.wte.weight"], sd["_orig_mod.lm_head.weight"]
                self.assertEqual(wte.dtype, dtype)
                self.assertEqual(ckpt["optimizer"]["state"][0]["exp_avg"].dtype, dtype)
                self.assertEqual(wte.data_ptr() == head.data_ptr(), tied)  # one storage
                for legacy in (False, True):
                    with self.subTest(dtype=dtype, tied=tied, legacy=legacy):
                        stem = f"ckpt_{str(dtype)[6:]}_{'tied' if tied else 'untied'}"
                        pt = save_pt(ckpt, self.path(stem + ("_legacy.pt" if legacy
                                                             else ".pt")), legacy)
                        self.assertEqual(zipfile.is_zipfile(pt), not legacy)
                        loaded = gnh_ptfile.load(str(pt))
                        self.assertEqual(loaded.kind, "legacy" if legacy else "zip")
                        self.assertEqual(loaded.obj["model"]["_orig_mod.lm_head.weight"]
                                         .dtype, str(dtype)[len("torch."):])
                        self.assertIsInstance(loaded.obj["config"]["learning_rate"], float)
                        h5 = self.convert_cli(pt)
                        with h5py.File(h5, "r") as f:
                            self.assertEqual(set(f), {"config", "params", "optimizer"})
                            self.assertEqual(int(f.attrs["iter_num"]), 1003)
                            self.assertEqual(int(f["config"].attrs["tie_embeddings"]),
                                             int(tied))
                            self.assertEqual(int(f["config"].attrs["bias"]), int(cfg.bias))
                            self.check_params(f, cfg, gm.canonical_state_dict(model))
                            self.check_optimizer(f, cfg, ckpt["optimizer"], names,
                                                 steps=3, weight_decay=0.1)
                        cfg2, state = gm.load_gnh_h5(str(h5))
                        self.assertEqual(cfg2, cfg)

    def test_single_group_and_bare_state_dict(self):
        cfg = small_config(bias=True, tie_embeddings=False)
        model = gm.init_random(gm.GPT(cfg), seed=41)
        opt = torch.optim.AdamW(model.parameters(), lr=2e-3, betas=(0.8, 0.9),
                                eps=1e-6, weight_decay=0.05)
        train_steps(model, opt, 2, seed=41)
        names = [n for n, _ in model.named_parameters()]
        pt = save_pt({"model": model.state_dict(), "optimizer": opt.state_dict(),
                      "model_args": model_args(cfg), "iter_num": 2}, self.path("one.pt"))
        with h5py.File(self.convert_cli(pt), "r") as f:
            self.check_params(f, cfg, gm.canonical_state_dict(model))
            self.check_optimizer(f, cfg, opt.state_dict(), names, steps=2,
                                 weight_decay=0.05)
        model.to(torch.bfloat16)
        for legacy in (False, True):
            with self.subTest(legacy=legacy):
                pt = save_pt(model.state_dict(),
                             self.path(f"bare_bf16_{legacy}.pt"), legacy)
                with h5py.File(self.convert_cli(pt, "--n-head", "3"), "r") as f:
                    self.assertEqual(set(f), {"config", "params"})
                    self.assertNotIn("iter_num", f.attrs)
                    self.check_params(f, cfg, gm.canonical_state_dict(model))

    def test_safetensors(self):
        cfg = small_config(bias=True, tie_embeddings=True)
        model = gm.init_random(gm.GPT(cfg), seed=43)
        dtypes = (torch.bfloat16, torch.float16, torch.float32, torch.float64)
        tensors = {n: t.detach().to(dtypes[i % 4]) for i, (n, t) in
                   enumerate(gm.canonical_state_dict(model).items())}
        self.assertEqual(tensors["transformer.wte.weight"].dtype, torch.bfloat16)
        for pad, meta in ((True, {"format": "pt"}), (False, None)):
            with self.subTest(pad=pad):
                pt = write_safetensors(self.path(f"model_{pad}.safetensors"),
                                       dict(reversed(tensors.items())), meta, pad)
                loaded = gnh_ptfile.load(str(pt))
                self.assertEqual(loaded.kind, "safetensors")
                self.assertEqual({n: t.dtype for n, t in loaded.obj.items()},
                                 {n: str(t.dtype)[len("torch."):] for n, t in tensors.items()})
                with h5py.File(self.convert_cli(pt, "--n-head", "3"), "r") as f:
                    self.check_params(f, cfg, tensors)
                    self.assertEqual(int(f["config"].attrs["tie_embeddings"]), 1)

    def test_strided_views_and_storage_offsets(self):
        """Non-contiguous tensors and views into a larger, shared storage."""
        cfg = small_config(bias=False, tie_embeddings=True)
        sd = dict(gm.init_random(gm.GPT(cfg), seed=44).state_dict())
        name = "transformer.h.1.attn.c_proj.weight"
        sd[name] = sd[name].t().contiguous().t()  # stride (1, 12)
        big = torch.randn(3 * 12 + 500, generator=torch.Generator().manual_seed(1))
        sd["transformer.h.0.ln_1.weight"] = big[5:17]            # offset 5
        sd["transformer.h.1.ln_2.weight"] = big[20:44:2]         # offset 20, stride 2
        self.assertEqual(sd[name].stride(), (1, 12))
        for legacy in (False, True):
            with self.subTest(legacy=legacy):
                pt = save_pt({"model": sd, "model_args": model_args(cfg)},
                             self.path(f"views_{legacy}.pt"), legacy)
                status, _, err = run_main(pt, self.path(f"views_{legacy}.h5"))
                self.assertEqual((status, err), (0, ""))
                with h5py.File(self.path(f"views_{legacy}.h5"), "r") as f:
                    self.check_params(f, cfg, sd)

    def test_big_endian_archive(self):
        """A zip with byteorder 'big' converts to the same bits."""
        cfg = small_config()
        ckpt, model, names = nanogpt_checkpoint(cfg, torch.float32, steps=2, seed=45)
        little = save_pt(ckpt, self.path("little.pt"))
        with zipfile.ZipFile(little) as z:
            keys = [i.filename.split("/", 1)[1] for i in z.infolist()
                    if "/data/" in i.filename]
        swap = {k: (lambda b: np.frombuffer(b, "<f4").astype(">f4").tobytes())
                for k in keys}  # every storage here is float32
        big = rewrite_zip(little, self.path("big.pt"), {**swap, "byteorder": b"big"})
        with zipfile.ZipFile(big) as z:
            self.assertEqual(z.read("little/byteorder"), b"big")
        outs = []
        for pt in (little, big):
            status, _, err = run_main(pt, pt.with_suffix(".h5"))
            self.assertEqual((status, err), (0, ""))
            outs.append(pt.with_suffix(".h5"))
        with h5py.File(outs[0], "r") as a, h5py.File(outs[1], "r") as b:
            self.check_params(b, cfg, gm.canonical_state_dict(model))
            self.check_optimizer(b, cfg, ckpt["optimizer"], names, 2, 0.1)
            for group in ("params", "optimizer/exp_avg", "optimizer/exp_avg_sq"):
                for name in a[group]:
                    self.assertTrue(np.array_equal(a[group][name][()].view(np.uint32),
                                                   b[group][name][()].view(np.uint32)))


class OptimizerMappingTests(TempDirCase):
    """Optimizer state whose mapping cannot be proven: parameters, one warning."""

    def setUp(self):
        self.cfg = small_config(bias=True, tie_embeddings=True)
        self.ckpt, self.model, self.names = nanogpt_checkpoint(self.cfg, steps=2, seed=51)

    def left_out(self, ckpt: dict, stem: str, reason: str, flags=(), model=None):
        model = self.model if model is None else model
        pt = save_pt(ckpt, self.path(stem + ".pt"))
        h5 = self.path(stem + ".h5")
        status, out, err = run_main(pt, h5, *flags)
        self.assertEqual(status, 0, err)
        self.assertTrue(out.startswith(f"gnh-convert: {pt} -> {h5} ("))
        self.assertEqual(err.count("\n"), 1, err)
        self.assertTrue(err.startswith(f"gnh-convert: warning: {pt}: optimizer state "
                                       f"left out: "), err)
        self.assertIn(reason, err)
        with h5py.File(h5, "r") as f:
            self.assertEqual(set(f), {"config", "params"})
            if not flags:
                for name, t in gm.canonical_state_dict(model).items():
                    self.assertTrue(np.array_equal(f["params"][name][()].view(np.uint32),
                                                   torch_bits(t)), name)

    def variant(self, change) -> dict:
        opt = {"state": {i: dict(v) for i, v in self.ckpt["optimizer"]["state"].items()},
               "param_groups": [dict(g) for g in self.ckpt["optimizer"]["param_groups"]]}
        change(opt)
        return {**self.ckpt, "optimizer": opt}

    def test_the_unchanged_checkpoint_maps(self):
        pt = save_pt(self.ckpt, self.path("maps.pt"))
        status, _, err = run_main(pt, self.path("maps.h5"))
        self.assertEqual((status, err), (0, ""))
        with h5py.File(self.path("maps.h5"), "r") as f:
            self.assertIn("optimizer", f)

    def test_empty_state(self):
        opt, _ = nanogpt_optimizer(self.model)
        self.left_out({**self.ckpt, "optimizer": opt.state_dict()}, "empty",
                      "the optimizer state is empty")

    def test_three_groups(self):
        def split(opt):
            g0, g1 = opt["param_groups"]
            opt["param_groups"] = [g0, {**g1, "params": g1["params"][:3]},
                                   {**g1, "params": g1["params"][3:]}]
        self.left_out(self.variant(split), "three", "3 parameter groups")

    def test_groups_in_the_other_order(self):
        def swap(opt):
            g0, g1 = opt["param_groups"]
            n1 = len(g1["params"])
            opt["param_groups"] = [{**g1, "params": list(range(n1))},
                                   {**g0, "params": list(range(n1, n1 + len(g0["params"])))}]
        self.left_out(self.variant(swap), "swapped", "not nanoGPT's decay/no-decay split")

    def test_shape_mismatch(self):
        def one_group_reversed(opt):
            state = opt["state"]
            n = len(state)
            opt["state"] = {i: state[n - 1 - i] for i in range(n)}
            opt["param_groups"] = [{**opt["param_groups"][0], "params": list(range(n))}]
        self.left_out(self.variant(one_group_reversed), "reversed", "has shape")

    def test_ids_not_in_order(self):
        def shuffle(opt):
            p = opt["param_groups"][0]["params"]
            opt["param_groups"][0]["params"] = [p[1], p[0]] + p[2:]
        self.left_out(self.variant(shuffle), "ids", "not 0..n-1 in group order")

    def test_missing_state_and_different_steps(self):
        self.left_out(self.variant(lambda o: o["state"].pop(5)), "missing",
                      f"parameter 5 ({self.names[5]}) has no state")

        def step(opt):
            opt["state"][4]["step"] = torch.tensor(7.0)
        self.left_out(self.variant(step), "steps", "different steps (2 for")

    def test_not_adamw(self):
        model = gm.init_random(gm.GPT(self.cfg), seed=52)
        sgd = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        train_steps(model, sgd, 1, seed=52)
        self.left_out({**self.ckpt, "optimizer": sgd.state_dict()}, "sgd", "not Adam-like")
        adam = torch.optim.AdamW(model.parameters(), amsgrad=True)
        train_steps(model, adam, 1, seed=52)
        self.left_out({**self.ckpt, "optimizer": adam.state_dict()}, "amsgrad",
                      "amsgrad=True")
        self.left_out({**self.ckpt, "optimizer": "adamw"}, "string",
                      "not a torch optimizer state_dict")

    def test_other_adam_family_optimizers(self):
        """RAdam keeps Adam's very state entries and NAdam and Adamax its
        hyper-parameters; none has amsgrad, so none is taken for AdamW."""
        for k, cls in enumerate((torch.optim.RAdam, torch.optim.NAdam,
                                 torch.optim.Adamax)):
            with self.subTest(optimizer=cls.__name__):
                model = gm.init_random(gm.GPT(self.cfg), seed=53 + k)
                params = list(model.parameters())
                opt = cls([{"params": [p for p in params if p.dim() >= 2],
                            "weight_decay": 0.1},
                           {"params": [p for p in params if p.dim() < 2],
                            "weight_decay": 0.0}], lr=1e-3)
                train_steps(model, opt, 1, seed=53 + k)
                ckpt = {"model": model.state_dict(), "optimizer": opt.state_dict(),
                        "model_args": model_args(self.cfg), "iter_num": 1}
                self.left_out(ckpt, f"family_{cls.__name__}", "parameter group 0 "
                              "has no amsgrad entry: not Adam or AdamW", model=model)

    def test_decoupled_weight_decay_entry(self):
        """Later torch marks Adam's L2 penalty decoupled_weight_decay=False."""
        def coupled(value):
            def change(opt):
                for group in opt["param_groups"]:
                    group["decoupled_weight_decay"] = value
            return change
        self.left_out(self.variant(coupled(False)), "coupled",
                      "parameter group 0 has decoupled_weight_decay=False and "
                      "weight_decay=0.1")
        for stem, change in (("decoupled", coupled(True)), ("no_decay", lambda o: (
                coupled(False)(o), o["param_groups"][0].update(weight_decay=0.0)))):
            pt = save_pt(self.variant(change), self.path(stem + ".pt"))
            status, _, err = run_main(pt, self.path(stem + ".h5"))
            self.assertEqual((status, err), (0, ""))
            with h5py.File(self.path(stem + ".h5"), "r") as f:
                self.assertIn("optimizer", f)

    def test_settings_out_of_range(self):
        """Non-finite or out-of-range settings and steps are not carried over."""
        def group(key, value):
            def change(opt):
                opt["param_groups"][0][key] = value
            return change

        def step(value):
            def change(opt):
                for entry in opt["state"].values():
                    entry["step"] = value
            return change
        cases = [("lr_nan", group("lr", float("nan")), "lr=nan"),
                 ("beta", group("betas", (1.5, 0.95)), "beta1=1.5, outside 0 <= beta1 < 1"),
                 ("eps", group("eps", -1e-8), "eps=-1e-08, outside eps >= 0"),
                 ("wd_inf", group("weight_decay", float("inf")), "weight_decay=inf"),
                 ("lr_int", group("lr", 10**400), "lacks a numeric"),
                 ("step_neg", step(torch.tensor(-1.0)), "not an integer in [0, 2^63)"),
                 ("step_big", step(2**70), "not an integer in [0, 2^63)")]
        for stem, change, reason in cases:
            with self.subTest(case=stem):
                self.left_out(self.variant(change), stem, reason)

    def test_hyperparameters_that_differ_between_groups(self):
        def decay_no_decay(opt):
            opt["param_groups"][1]["weight_decay"] = 0.01
        self.left_out(self.variant(decay_no_decay), "wd", "the no-decay group has "
                                                          "weight_decay=0.01")

        def lr(opt):
            opt["param_groups"][1]["lr"] = 1e-3
        self.left_out(self.variant(lr), "lr", "different lr")

    def test_forced_untie_changes_the_parameter_count(self):
        n = len(self.names)
        self.left_out(self.ckpt, "untie", f"the optimizer has {n} parameters, the "
                                          f"model {n + 1}", flags=("--untie",))


class HostileFileTests(TempDirCase):
    """Pickled code in every form, in zip and legacy files: refused, never run."""

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cfg = small_config()
        ckpt, _, _ = nanogpt_checkpoint(cfg, steps=1, seed=61)
        cls.base_zip = save_pt(ckpt, cls.tmp / "base.pt")

    def refuse_cli(self, pt: Path, *needles):
        h5 = pt.with_suffix(".h5")
        r = run_without_torch(self.tmp, pt, h5)
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
        self.assertEqual(r.stdout, "")
        self.assertEqual(r.stderr.count("\n"), 1, r.stderr)
        self.assertTrue(r.stderr.startswith(f"gnh-convert: error: {pt}: "), r.stderr)
        self.assertNotIn("Traceback", r.stderr)
        for needle in needles:
            self.assertIn(needle, r.stderr)
        self.assertFalse(h5.exists())
        self.assertEqual(scratch_files(h5), [])
        return r.stderr

    def test_the_payloads_are_live(self):
        """The standard unpickler runs each payload that calls something."""
        control = self.path("control")
        control.mkdir()
        files = []
        for form, (_, _, opcode, live) in code_payloads("x").items():
            data = code_payloads(str(control / form))[form][0]
            ops = {op.name for op, _, _ in pickletools.genops(data)}
            self.assertIn(opcode, ops, form)
            if live:
                files.append(self.path(f"control_{form}.pkl"))
                files[-1].write_bytes(data)
        r = subprocess.run([PYTHON, "-c", _CONTROL % (list(EXT_TARGETS.values()),),
                            *map(str, files)], capture_output=True, text=True, timeout=60)
        self.assertEqual(r.returncode, 0, r.stderr)
        made = sorted(p.name for p in control.iterdir())
        self.assertEqual(made, sorted(f.stem[len("control_"):] for f in files))

    def test_code_in_every_pickle_form(self):
        marker = self.path("PWNED")
        for form, (data, needle, _, _) in code_payloads(str(marker)).items():
            for container in ("zip", "legacy"):
                with self.subTest(form=form, container=container):
                    pt = self.path(f"evil_{form}_{container}.pt")
                    if container == "zip":
                        rewrite_zip(self.base_zip, pt, {"data.pkl": data})
                        where = "in data.pkl"
                    else:
                        pt.write_bytes(legacy_stream(data))
                        where = "in the legacy main pickle"
                    what = ("refusing extension-registry opcode " if needle.startswith("EXT")
                            else "refusing global ") + needle
                    self.refuse_cli(pt, what, where)
                    self.assertFalse(marker.exists())

    def test_a_plain_pickle(self):
        marker = self.path("PWNED_plain")
        for protocol in (2, 5):
            pt = self.path(f"plain_{protocol}.pkl")
            pt.write_bytes(pickle.dumps({"model": Evil(str(marker))}, protocol=protocol))
            self.refuse_cli(pt, "a plain pickle, not a torch.save checkpoint (zip or "
                                "legacy format) or safetensors file")
        self.assertFalse(marker.exists())

    def test_unknown_globals(self):
        sd = gm.GPT(small_config()).state_dict()
        for legacy in (False, True):
            for extra, name in ((np.zeros(3), "numpy.core.multiarray._reconstruct"),
                                (torch.nn.Linear(2, 2), "torch.nn.modules.linear.Linear")):
                with self.subTest(legacy=legacy, name=name):
                    pt = save_pt({"model": sd, "extra": extra},
                                 self.path(f"unknown_{name}_{legacy}.pt"), legacy)
                    self.refuse_cli(pt, f"refusing global {name} in ",
                                    "(not a tensor, storage or plain container)")

    def test_build_on_allow_listed_objects(self):
        """BUILD may set an OrderedDict's attributes (torch's _metadata) only."""
        t = torch.arange(6, dtype=torch.float32)
        storage = FakeStorage("0", t)
        for legacy in (False, True):
            with self.subTest(legacy=legacy):
                pt = torch_like_file(self.path(f"build_tensor_{legacy}.pt"),
                                     {"model": {"w": RawTensor(storage, 0, (2, 3), (3, 1),
                                                               state={"grad": 1})}},
                                     [storage], legacy)
                self.refuse_cli(pt, "refusing BUILD on a tensor")
        pt = self.path("build_function.pt")
        rewrite_zip(self.base_zip, pt, {"data.pkl": b"\x80\x02ctorch._utils\n"
                                        b"_rebuild_tensor_v2\n}X\x01\x00\x00\x00xK\x01sb."})
        self.refuse_cli(pt, "refusing BUILD on torch._utils._rebuild_tensor_v2")
        # An OrderedDict with attributes is what every torch state_dict is.
        with zipfile.ZipFile(self.base_zip) as z:
            pkl = z.read("base/data.pkl")
        ops = [op.name for op, _, _ in pickletools.genops(pkl)]
        self.assertIn("BUILD", ops)
        self.assertEqual(run_main(self.base_zip, self.path("base.h5"))[0], 0)

    def test_build_on_an_ordered_dict(self):
        """torch's BUILD sets an OrderedDict's _metadata (a dict); a BUILD that
        sets anything else (``items`` would stop tensors being read) is refused."""
        with zipfile.ZipFile(self.base_zip) as z:
            pkl = z.read("base/data.pkl")
        ops = [(op.name, arg) for op, arg, _ in pickletools.genops(pkl)]
        self.assertIn(("BUILD", None), ops)  # with the state {'_metadata': ...}
        self.assertIn(("BINUNICODE", "_metadata"), ops)
        w = p_str("w") + p_tensor("0", 6, (2, 3), (3, 1))
        states = {
            "items": (b"}" + p_str("items") + OD + b"s", "with attributes items"),
            "extra": (b"}" + p_str("_metadata") + b"}s" + p_str("get") + b"Ns",
                      "with attributes _metadata, get"),
            "not_a_dict": (b"}" + p_str("_metadata") + b"K\x05s", "with _metadata 5"),
            "tuple": (b"}" + p_str("_metadata") + b"}s" + b"N\x86",
                      "with state a tuple of 2 items"),
        }
        for stem, (state, needle) in states.items():
            with self.subTest(state=stem):
                pt = pickle_zip(self.path(f"od_{stem}.pt"), P2 + OD + b")R(" + w + b"u"
                                + state + b"b.", {"0": bytes(24)})
                with self.assertRaisesRegex(gnh_ptfile.PtFileError,
                                            "refusing BUILD on an OrderedDict " + needle):
                    gnh_ptfile.load(str(pt))
        pt = pickle_zip(self.path("od_metadata.pt"), P2 + OD + b")R(" + w + b"u}"
                        + p_str("_metadata") + OD + b")R" + p_str("") + b"}"
                        + p_str("version") + b"K\x01sss" + b"b.", {"0": bytes(24)})
        obj = gnh_ptfile.load(str(pt)).obj
        self.assertEqual(obj._metadata, {"": {"version": 1}})
        self.assertEqual(obj["w"].shape, (2, 3))

    def test_truncated_zip(self):
        raw = self.base_zip.read_bytes()
        for cut in (len(raw) // 2, len(raw) - 30):
            with self.subTest(cut=cut):
                pt = self.path(f"cut_{cut}.pt")
                pt.write_bytes(raw[:cut])
                self.refuse_cli(pt, "truncated or corrupt zip archive")

    def test_corrupt_storage_record(self):
        """A flipped bit in a record is found by its CRC-32 when the record is
        read (as the output is written): refused, no output left."""
        raw = bytearray(self.base_zip.read_bytes())
        with zipfile.ZipFile(self.base_zip) as z:
            info = next(i for i in z.infolist() if "/data/" in i.filename and i.file_size > 64)
        name_len, extra_len = struct.unpack("<HH", raw[info.header_offset + 26:info.header_offset + 30])
        start = info.header_offset + 30 + name_len + extra_len
        raw[start + info.file_size // 8 * 4] ^= 0x01  # the lowest mantissa bit of a float32
        pt = self.path("flipped.pt")
        pt.write_bytes(bytes(raw))
        self.refuse_cli(pt, "corrupt zip archive: storage record", "fails its CRC-32 check")


# --------------------------------------------------------------------------- #
# Files built to crash or exhaust the reader
# --------------------------------------------------------------------------- #
P2 = b"\x80\x02"                            # PROTO 2
OD = b"ccollections\nOrderedDict\n"         # GLOBAL collections.OrderedDict


def p_str(text: str) -> bytes:
    """BINUNICODE ``text``."""
    raw = text.encode()
    return b"X" + struct.pack("<I", len(raw)) + raw


def p_int(n: int) -> bytes:
    """BININT, or LONG1 beyond 32 bits."""
    if -2**31 <= n < 2**31:
        return b"J" + struct.pack("<i", n)
    raw = n.to_bytes((n.bit_length() + 8) // 8, "little", signed=True)
    return b"\x8a" + bytes([len(raw)]) + raw


def p_tuple(*items: bytes) -> bytes:
    return b"(" + b"".join(items) + b"t"


def p_tensor(key: str, numel: int, size, stride) -> bytes:
    """A float32 tensor as torch pickles it, on storage ``key`` of ``numel``
    elements."""
    pid = p_tuple(p_str("storage"), b"ctorch\nFloatStorage\n", p_str(key),
                  p_str("cpu"), p_int(numel)) + b"Q"
    return (b"ctorch._utils\n_rebuild_tensor_v2\n"
            + p_tuple(pid, p_int(0), p_tuple(*map(p_int, size)),
                      p_tuple(*map(p_int, stride)), b"\x89", OD + b")R") + b"R")


def pickle_zip(path: Path, pkl: bytes, storages=None) -> Path:
    """A torch.save-like archive around a hand-made data.pkl."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        z.writestr("archive/data.pkl", pkl)
        for key, data in (storages or {}).items():
            z.writestr(f"archive/data/{key}", data)
    return path


def raw_zip(path: Path, members) -> Path:
    """A zip archive written byte by byte from ``(name, method, data, size,
    crc)``: ``data`` already compressed by ``method``, ``size`` the declared
    uncompressed size (zipfile checks a CRC only after inflating)."""
    local, central, offset = [], [], 0
    for name, method, data, size, crc in members:
        n = name.encode()
        local.append(struct.pack("<4s5H3I2H", b"PK\x03\x04", 20, 0, method, 0, 0x21,
                                 crc, len(data), size, len(n), 0) + n + data)
        central.append(struct.pack("<4s6H3I5H2I", b"PK\x01\x02", 20, 20, 0, method, 0,
                                   0x21, crc, len(data), size, len(n), 0, 0, 0, 0, 0,
                                   offset) + n)
        offset += len(local[-1])
    cd = b"".join(central)
    end = struct.pack("<4s4H2IH", b"PK\x05\x06", 0, 0, len(members), len(members),
                      len(cd), offset, 0)
    path.write_bytes(b"".join(local) + cd + end)
    return path


def deflated_zeros(nbytes: int) -> bytes:
    """A raw deflate stream of ``nbytes`` zero bytes (a multiple of 16 MiB),
    made without compressing them all: one fully flushed 16 MiB block
    repeated, then an empty final block."""
    chunk = 16 << 20
    assert nbytes % chunk == 0
    c = zlib.compressobj(9, zlib.DEFLATED, -15)
    block = c.compress(bytes(chunk)) + c.flush(zlib.Z_FULL_FLUSH)
    return block * (nbytes // chunk) + zlib.compressobj(9, zlib.DEFLATED, -15).flush()


MEMORY_LIMIT = 2 << 30
# gnh_convert.main once per argument list, each result a JSON line.
_LIMITED = """import contextlib, io, json, sys
sys.path.insert(0, sys.argv[1])
import gnh_convert
for argv in json.loads(sys.argv[2]):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = gnh_convert.main(argv)
    print(json.dumps([status, out.getvalue(), err.getvalue()]), flush=True)
"""


def _limit_memory():
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))


def run_limited(*runs, timeout=60):
    """Run ``gnh_convert.main(argv)`` for each argv in ``runs``, in one
    subprocess under a 2 GiB address-space limit and ``timeout`` seconds;
    return [(status, stdout, stderr)].  A crash (stack smashing, segfault) or
    a timeout raises, failing the test rather than the test run."""
    argvs = json.dumps([[str(a) for a in argv] for argv in runs])
    r = subprocess.run([PYTHON, "-c", _LIMITED, str(REPO / "apps" / "python"), argvs],
                       capture_output=True, text=True, timeout=timeout,
                       preexec_fn=_limit_memory)
    if r.returncode != 0:
        raise AssertionError(f"the converter process died (status {r.returncode}): "
                             f"{r.stderr[-2000:]}")
    results = [tuple(json.loads(line)) for line in r.stdout.splitlines()]
    if len(results) != len(runs):
        raise AssertionError(f"{len(results)} results for {len(runs)} runs: {r.stdout}")
    return results


class ResourceLimitTests(TempDirCase):
    """Files built to crash or exhaust the reader: refused with one line.

    Each test converts its files in one subprocess under a 2 GiB
    address-space limit and a timeout, so that a crash, a runaway allocation
    or an endless loop fails the test, not the test run."""

    def refused(self, result, pt: Path, *needles):
        status, out, err = result
        self.assertEqual((status, out), (1, ""), err)
        self.assertEqual(err.count("\n"), 1, err)
        self.assertTrue(err.startswith(f"gnh-convert: error: {pt}: "), err)
        self.assertNotIn("unexpected", err)
        for needle in needles:
            self.assertIn(needle, err)
        self.assertFalse(pt.with_suffix(".h5").exists())
        self.assertEqual(scratch_files(pt.with_suffix(".h5")), [])

    def refuse_all(self, *cases):
        """``cases``: (file, [needles], flags), converted in one subprocess."""
        results = run_limited(*[(pt, pt.with_suffix(".h5"), *flags)
                                for pt, _, flags in cases])
        for (pt, needles, _), result in zip(cases, results):
            with self.subTest(file=pt.name):
                self.refused(result, pt, *needles)

    def test_too_many_dimensions(self):
        """numpy smashes its stack beyond 64 dimensions and refuses 33 to 64;
        the reader stops at 16 before numpy sees the tensor."""
        one = FakeStorage("0", torch.ones(1))

        def tensor_file(name: str, ndim: int, legacy: bool = False) -> Path:
            return torch_like_file(self.path(name), {"w": RawTensor(
                one, 0, (1,) * ndim, (0,) * ndim)}, [one], legacy)

        header = json.dumps({"w": {"dtype": "F32", "shape": [1] * 100,
                                   "data_offsets": [0, 4]}}).encode()
        st = self.path("dims100.safetensors")
        st.write_bytes(struct.pack("<Q", len(header)) + header + bytes(4))
        self.refuse_all(
            (tensor_file("dims66.pt", 66), ["size has 66 dimensions, more than the 16"], ()),
            (tensor_file("dims66_legacy.pt", 66, True), ["size has 66 dimensions"], ()),
            (tensor_file("dims40.pt", 40), ["size has 40 dimensions"], ()),
            (tensor_file("dims17.pt", 17), ["size has 17 dimensions"], ()),
            (st, ["safetensors tensor w: shape has 100 dimensions"], ()))
        loaded = gnh_ptfile.load(str(tensor_file("dims16.pt", 16)))
        self.assertEqual(loaded.obj["w"].shape, (1,) * 16)

    def test_deep_nesting(self):
        """A dict key a million tuples deep overflows CPython's C stack when
        hashed; every form of nesting beyond 100 levels is refused unrun."""
        nested = "containers nested more than 100 deep"
        cases = [
            ("hash.pt", P2 + b"}N" + b"\x85" * 10**6 + b"K\x01s.", nested),
            ("deep_value.pt", P2 + b"}" + p_str("w") + b"N" + b"\x85" * 10**4 + b"s.",
             nested),
            ("deep_lists.pt", P2 + b"(" * 200 + b"N" + b"l" * 200 + b".", nested),
            ("deep_dicts.pt", P2 + (b"}" + p_str("k")) * 200 + b"N" + b"s" * 200 + b".",
             nested),
            # list A, list B, A.append(B), then B.append(None): B is modified
            # after it was nested, which would hide its depth from the count.
            ("late_append.pt", P2 + b"]q\x00]q\x01a" + b"h\x01Na0.",
             "APPEND modifies an object already placed in another"),
        ]
        self.refuse_all(*[(pickle_zip(self.path(name), pkl), [needle], ())
                          for name, pkl, needle in cases])
        for levels in (99, 100):  # in {'w': ...}: 100 and 101 levels in all
            pt = pickle_zip(self.path(f"levels{levels}.pt"), P2 + b"}" + p_str("w")
                            + b"N" + b"\x85" * levels + b"s.")
            if levels == 100:
                with self.assertRaisesRegex(gnh_ptfile.PtFileError, nested):
                    gnh_ptfile.load(str(pt))
                continue
            t, depth = gnh_ptfile.load(str(pt)).obj["w"], 0
            while isinstance(t, tuple):
                t, depth = t[0], depth + 1
            self.assertEqual(depth, levels)

    def test_memo_indices(self):
        """One LONG_BINPUT of index 2^28 made the unpickler allocate a 4 GiB memo."""
        huge = pickle_zip(self.path("memo_put.pt"),
                          P2 + b"}r" + struct.pack("<I", 1 << 28) + b".")
        skip = pickle_zip(self.path("memo_skip.pt"), P2 + b"}q\x01.")
        get = pickle_zip(self.path("memo_get.pt"), P2 + b"}q\x00h\x05.")
        self.refuse_all(
            (huge, ["LONG_BINPUT 268435456 is not the next memo index 0"], ()),
            (skip, ["BINPUT 1 is not the next memo index 0"], ()),
            (get, ["BINGET 5 of a memo index never put"], ()))

    def test_broadcast_and_repeated_views(self):
        """A stride-0 view of one element would be copied out to 8 GiB; 600
        views of one 4 MiB storage to 2.4 GiB."""
        one = FakeStorage("0", torch.ones(1))
        bcast = torch_like_zip(self.path("bcast.pt"), {"w": RawTensor(
            one, 0, (1 << 16, 1 << 15), (0, 0))}, [one])
        big = FakeStorage("0", torch.zeros(1 << 20))
        views = torch_like_zip(self.path("views.pt"), {
            f"w{i}": RawTensor(big, 0, (1 << 20,), (1,)) for i in range(600)}, [big])
        self.refuse_all(
            (bcast, ["tensor w of shape (65536, 32768)", "has 2147483648 elements, "
                     "more than the 1 its storage 0 holds"], ()),
            (views, ["tensors past", "twice the file's size"], ()))

    def test_zip_bombs(self):
        """2 GiB of zeros deflated into 2 MB, as a storage and as data.pkl:
        refused from the archive's directory, before anything is inflated."""
        n = 1 << 29  # float32 elements, 2 GiB
        bomb = deflated_zeros(4 * n)
        pkl = P2 + b"}" + p_str("w") + p_tensor("0", n, (n,), (1,)) + b"s."
        storage_bomb = raw_zip(self.path("storage_bomb.pt"), [
            ("archive/data.pkl", zipfile.ZIP_STORED, pkl, len(pkl), zlib.crc32(pkl)),
            ("archive/data/0", zipfile.ZIP_DEFLATED, bomb, 4 * n, 0)])
        pickle_bomb = raw_zip(self.path("pickle_bomb.pt"), [
            ("archive/data.pkl", zipfile.ZIP_DEFLATED, bomb, 4 * n, 0)])
        self.assertLess(storage_bomb.stat().st_size, 4 << 20)
        self.refuse_all(
            (storage_bomb, ["storage record archive/data/0 is compressed"], ()),
            (pickle_bomb, ["zip member archive/data.pkl is 2147483648 bytes, more "
                           "than the 67108864 accepted"], ()))
        # torch.save itself stores every record uncompressed.
        with zipfile.ZipFile(save_pt({"w": torch.ones(3)}, self.path("stored.pt"))) as z:
            self.assertEqual({i.compress_type for i in z.infolist()}, {zipfile.ZIP_STORED})

    def test_configurations_that_would_loop(self):
        """n_layer=10**9 (from model_args, a flag or a tensor name) made the
        canonical names a billion blocks long."""
        wte = {"transformer.wte.weight": torch.zeros(1, 1)}
        args = dict(n_layer=10**9, n_head=1, n_embd=1, block_size=1, vocab_size=1,
                    bias=False)
        huge = save_pt({"model": wte, "model_args": args}, self.path("args_huge.pt"))
        named = save_pt({**wte, "transformer.h.999999999.ln_1.weight": torch.zeros(1)},
                        self.path("name_huge.pt"))
        cfg = small_config()
        sd = gm.GPT(cfg).state_dict()
        fewer = save_pt({"model": sd, "model_args": {**model_args(cfg), "n_layer": 5000}},
                        self.path("args_5000.pt"))
        bare = save_pt(sd, self.path("flag_huge.pt"))
        self.refuse_all(
            (huge, ["model_args n_layer=1000000000 is out of range (1..10000)"], ()),
            (named, ["the tensors give n_layer=1000000000 is out of range"],
             ("--n-head", "1", "--block-size", "1")),
            (fewer, ["missing tensor transformer.h.2.* (model_args n_layer=5000)"], ()),
            (bare, ["--n-layer n_layer=1000000000 is out of range"],
             ("--n-head", "3", "--n-layer", str(10**9))))

    def test_one_tensor_behind_many_names(self):
        """A 3 MiB file whose 40 blocks all name the same few tensors would
        be written out as 120 MiB of float32."""
        cfg = small_config(n_layer=40, n_head=4, n_embd=256, bias=False)
        shared = {}
        sd = {name: shared.setdefault(shape, torch.ones(shape))
              for name, shape in gm.canonical_shapes(cfg).items()}
        pt = save_pt({"model": sd, "model_args": model_args(cfg)}, self.path("shared.pt"))
        self.assertLess(pt.stat().st_size, 4 << 20)
        nbytes = 4 * sum(math.prod(s) for s in gm.canonical_shapes(cfg).values())
        self.refuse_all((pt, [f"the parameters would take {nbytes} bytes of float32, "
                              f"more than the", "allowed for this file"], ()))

    def test_long_paths_are_built_only_for_messages(self):
        """100,000 tensors' paths 90 long keys deep took 2.9 GB of strings;
        now a path is built for the one tensor a message names."""
        key = "\x01" * 80  # escaped in a path: 322 characters a level
        short = FakeStorage("short", torch.ones(100))
        chain = [None] * 100_000 + [RawTensor(short, 0, (12, 12), (12, 1))]
        for _ in range(90):
            chain = {key: chain}
        pt = torch_like_zip(self.path("long_paths.pt"), {"model": chain}, [short])
        [result] = run_limited((pt, pt.with_suffix(".h5")))
        self.refused(result, pt, "addresses 144 float32 elements", " ... ",
                     r"'\x01\x01", "[100000] of shape (12, 12)")


class ReaderContractTests(TempDirCase, CheckpointAsserts):
    """What the reader and converter promise beyond refusing bad files."""

    def test_load_raises_only_pt_file_error(self):
        """numpy's and json's errors come back as PtFileError naming the tensor."""
        def safetensors(name: str, header: bytes, body: bytes = b"") -> Path:
            path = self.path(name)
            path.write_bytes(struct.pack("<Q", len(header)) + header + body)
            return path

        deep = safetensors("deep.safetensors",
                           b'{"a": ' + b"[" * 100_000 + b"]" * 100_000 + b"}")
        empty_but_huge = safetensors("huge_empty.safetensors", json.dumps(
            {"a": {"dtype": "F32", "shape": [0, 2**62, 2**62],
                   "data_offsets": [0, 0]}}).encode())
        one = FakeStorage("0", torch.ones(1))
        empty_pickled = torch_like_zip(self.path("huge_empty.pt"), {"w": RawTensor(
            one, 0, (0, 2**62, 2**62), (1, 1, 1))}, [one])
        for path, needle in ((deep, "JSON nested too deeply"),
                             (empty_but_huge, "safetensors tensor a of shape (0, "),
                             (empty_pickled, "tensor w of shape (0, ")):
            with self.subTest(file=path.name):
                with self.assertRaises(gnh_ptfile.PtFileError) as caught:
                    gnh_ptfile.load(str(path))
                self.assertIn(needle, str(caught.exception))
                self.assertNotIn("\n", str(caught.exception))

    def test_names_from_the_file_stay_on_one_line(self):
        """Newlines, terminal escapes and bidi controls in names are escaped."""
        cfg = small_config()
        ckpt, _, _ = nanogpt_checkpoint(cfg, steps=1, seed=71)
        evil = "x\n\x1b[2Kgnh-convert: ok\u202e"
        cases = {
            "name": ({**ckpt, "model": {**ckpt["model"], evil: torch.zeros(1)}},
                     r"unknown tensor 'x\n\x1b[2Kgnh-convert: ok\u202e'"),
            "bias": ({**ckpt, "model_args": {**ckpt["model_args"], "bias": "yes\nno"}},
                     r"model_args bias='yes\nno' is not a boolean"),
        }
        for stem, (obj, needle) in cases.items():
            with self.subTest(case=stem):
                pt = save_pt(obj, self.path(f"evil_{stem}.pt"))
                status, out, err = run_main(pt, self.path(f"evil_{stem}.h5"))
                self.assertEqual((status, out), (1, ""))
                self.assertEqual(err.count("\n"), 1, err)
                self.assertTrue(err.isascii() and err[:-1].isprintable(), repr(err))
                self.assertIn(needle, err)
        # A warning names the file's keys the same way.
        opt = ckpt["optimizer"]
        state = {i: dict(v) for i, v in opt["state"].items()}
        state[0][evil] = 1
        pt = save_pt({**ckpt, "optimizer": {**opt, "state": state}}, self.path("evil_opt.pt"))
        status, _, err = run_main(pt, self.path("evil_opt.h5"))
        self.assertEqual(status, 0)
        self.assertEqual(err.count("\n"), 1, err)
        self.assertTrue(err[:-1].isprintable(), repr(err))
        self.assertIn(r"'x\n\x1b[2Kgnh-convert: ok\u202e'", err)
        # The backstop in main.
        self.assertEqual(gnh_convert._one_line("a\nb\x1b[0m\u2028"), r"a\nb\x1b[0m\u2028")

    def test_scratch_file_is_created_exclusively(self):
        """A planted OUT.tmp symlink is neither followed nor removed; a
        symlink at OUT is replaced, its target untouched."""
        cfg = small_config()
        model = gm.init_random(gm.GPT(cfg), seed=73)
        pt = save_pt({"model": model.state_dict(), "model_args": model_args(cfg)},
                     self.path("good.pt"))
        victim = self.path("victim.txt")
        victim.write_bytes(b"precious\n")
        h5 = self.path("out.h5")
        planted = Path(str(h5) + ".tmp")
        planted.symlink_to(victim)
        link_out = self.path("link_out.h5")
        link_out.symlink_to(victim)
        umask = os.umask(0)
        os.umask(umask)
        for out in (h5, link_out):
            with self.subTest(out=out.name):
                status, _, err = run_main(pt, out)
                self.assertEqual((status, err), (0, ""))
                self.assertEqual(victim.read_bytes(), b"precious\n")
                self.assertFalse(out.is_symlink())
                self.assertEqual(out.stat().st_mode & 0o777, 0o666 & ~umask)
                with h5py.File(out, "r") as f:
                    self.check_params(f, cfg, gm.canonical_state_dict(model))
        self.assertTrue(planted.is_symlink())
        self.assertEqual(scratch_files(h5), [planted.name])
        # A failed write removes its own scratch file and nothing else.
        blocked = self.path("blocked.h5")
        blocked.mkdir()
        status, _, err = run_main(pt, blocked)
        self.assertEqual(status, 1)
        self.assertIn(f"cannot write {blocked}", err)
        self.assertEqual(scratch_files(blocked), [])

    def test_iter_num_range(self):
        cfg = small_config()
        sd = gm.init_random(gm.GPT(cfg), seed=74).state_dict()
        base = {"model": sd, "model_args": model_args(cfg)}
        for k, bad in enumerate((2**70, 2**63, -5, 5.0, True, "7", None)):
            with self.subTest(iter_num=bad):
                pt = save_pt({**base, "iter_num": bad}, self.path(f"iter_{k}.pt"))
                status, out, err = run_main(pt, self.path(f"iter_{k}.h5"))
                self.assertEqual((status, out), (1, ""))
                self.assertEqual(err.count("\n"), 1, err)
                self.assertIn("iter_num is ", err)
                self.assertIn("not an integer in [0, 2^63)", err)
        for k, good in enumerate((0, 2**63 - 1, torch.tensor(12))):
            pt = save_pt({**base, "iter_num": good}, self.path(f"iter_ok{k}.pt"))
            status, _, err = run_main(pt, self.path(f"iter_ok{k}.h5"))
            self.assertEqual((status, err), (0, ""))
            with h5py.File(self.path(f"iter_ok{k}.h5"), "r") as f:
                self.assertEqual(int(f.attrs["iter_num"]), int(good))


class DemoCampaignTests(TempDirCase, CheckpointAsserts):
    """apps/gnh-demo-campaign's checkpoints convert with their AdamW state."""

    def test_demo_checkpoint(self):
        loader = importlib.machinery.SourceFileLoader("gnh_demo_campaign", str(DEMO))
        demo = importlib.util.module_from_spec(
            importlib.util.spec_from_loader(loader.name, loader))
        loader.exec_module(demo)
        demo.SETTINGS.update(epochs=1, max_steps_per_epoch=3, batch_blocks=4,
                             eval_batch_blocks=8)
        T = demo.SETTINGS["model"]["block_size"]
        rng = np.random.default_rng(7)
        train_tokens = rng.integers(0, 256, 40 * T).astype("<u2")
        val_tokens = rng.integers(0, 256, 9 * T).astype("<u2")
        os.makedirs(self.tmp / "ckpt")
        with contextlib.redirect_stdout(io.StringIO()):
            demo.train(str(self.tmp), train_tokens, val_tokens)
        pt = self.tmp / "ckpt" / "ckpt_epoch1.pt"
        ckpt = torch.load(pt)
        self.assertEqual(set(ckpt), {"model", "optimizer", "model_args", "iter_num",
                                     "best_val_loss", "config", "epoch"})
        self.assertIsInstance(ckpt["model_args"]["dropout"], float)
        self.assertIsInstance(ckpt["config"]["lr"], float)
        cfg = gm.GPTConfig(**demo.SETTINGS["model"])
        model = gm.GPT(cfg)
        model.load_state_dict(ckpt["model"])
        _, names = nanogpt_optimizer(model)
        h5 = self.tmp / "demo.h5"
        r = run_without_torch(self.tmp, pt, h5)
        self.assertEqual((r.returncode, r.stderr), (0, ""))
        with h5py.File(h5, "r") as f:
            self.check_params(f, cfg, gm.canonical_state_dict(model))
            self.check_optimizer(f, cfg, ckpt["optimizer"], names, steps=3,
                                 weight_decay=demo.SETTINGS["weight_decay"])
            self.assertEqual(int(f.attrs["iter_num"]), 3)


if __name__ == "__main__":
    unittest.main()
