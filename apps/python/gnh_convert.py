# SPDX-License-Identifier: BSD-3-Clause
"""Convert a PyTorch GPT checkpoint into a gnh HDF5 checkpoint (SPEC section 2).

This is the implementation behind ``apps/gnh-convert``.  It needs neither
PyTorch nor a particular PyTorch version: ``gnh_ptfile`` reads torch.save's
zip and legacy formats and safetensors files with its own allow-listed
unpickler, so no pickled code is ever executed.  Accepted layouts:

* nanoGPT's ``{'model', 'optimizer', 'model_args', 'iter_num',
  'best_val_loss', 'config'}`` (``_orig_mod.`` key prefixes from
  ``torch.compile`` are dropped);
* a bare state_dict or safetensors file, with the configuration taken from
  the command line and inferred from tensor shapes (``--n-head`` is required).

Weights may be float32, float16, bfloat16 or float64.  AdamW state is written
to ``/optimizer`` when its parameter ids provably map onto the canonical
names (nanoGPT's decay/no-decay groups, or one group); otherwise it is left
out with one warning line.  Every refusal is a :class:`ConvertError` whose
message names the tensor concerned; :func:`main` prints it as one line
``gnh-convert: error: <IN>: <problem>`` and returns exit status 1.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import sys
from dataclasses import dataclass
from typing import Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple

import numpy as np

import gnh_layout
import gnh_ptfile
from gnh_layout import GPTConfig, canonical_names, canonical_shapes
from gnh_ptfile import Tensor

PROG = "gnh-convert"
_COMPILE_PREFIX = "_orig_mod."
_MASK_BUFFER = re.compile(r"^transformer\.h\.\d+\.attn\.(bias|masked_bias)$")
_LAYER_KEY = re.compile(r"^transformer\.h\.(\d+)\.")
# Configuration fields in nanoGPT's model_args, with their command-line flag.
_ARG_FIELDS = (("n_layer", "--n-layer"), ("n_head", "--n-head"),
               ("n_embd", "--n-embd"), ("block_size", "--block-size"),
               ("vocab_size", "--vocab-size"), ("bias", "--bias/--no-bias"))


class ConvertError(Exception):
    """A refusal to convert; the message is one line naming the tensor."""


# --------------------------------------------------------------------------- #
# Loading
# --------------------------------------------------------------------------- #
def _one_line(text: str, limit: int = 300) -> str:
    """Collapse whitespace so an exception message fits on one line."""
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def load_checkpoint(path: str) -> Tuple[object, str]:
    """Read ``path`` with ``gnh_ptfile``; return ``(object, sha256 of the file)``.

    The bytes are read once, so the hash is that of exactly what was loaded.
    """
    try:
        loaded = gnh_ptfile.load(path)
    except gnh_ptfile.PtFileError as exc:
        raise ConvertError(str(exc)) from None
    return loaded.obj, loaded.sha256


class Source(NamedTuple):
    """The parts of a loaded checkpoint the conversion uses."""

    state: Dict[str, Tensor]
    model_args: Optional[dict]
    iter_num: Optional[int]
    optimizer: Optional[object]


def split_checkpoint(obj: object) -> Source:
    """Split a loaded object into state_dict, model_args, iter_num, optimizer.

    Keys lose a leading ``_orig_mod.`` (left by ``torch.compile``).
    """
    if not isinstance(obj, dict):
        raise ConvertError(f"top-level object is a {type(obj).__name__}, not a "
                           f"nanoGPT checkpoint dict or a state_dict")
    model_args = None
    iter_num = None
    optimizer = None
    if "model" in obj and isinstance(obj["model"], dict):
        state = obj["model"]
        model_args = obj.get("model_args")
        if model_args is not None and not isinstance(model_args, dict):
            raise ConvertError(f"'model_args' is a {type(model_args).__name__}, "
                               f"not a dict")
        it = obj.get("iter_num")
        if isinstance(it, Tensor) and it.array.size == 1 and not it.is_floating:
            it = int(it.array.reshape(-1)[0])
        if isinstance(it, int) and not isinstance(it, bool):
            iter_num = it
        optimizer = obj.get("optimizer")
    else:
        state = obj
    out: Dict[str, Tensor] = {}
    for key, value in state.items():
        if not isinstance(key, str):
            raise ConvertError(f"state_dict key {key!r} is not a string")
        name = key[len(_COMPILE_PREFIX):] if key.startswith(_COMPILE_PREFIX) else key
        if name in out:
            raise ConvertError(f"tensor {name} appears twice (with and without "
                               f"the {_COMPILE_PREFIX} prefix)")
        if not isinstance(value, Tensor):
            raise ConvertError(f"state_dict entry {name} is a "
                               f"{type(value).__name__}, not a tensor")
        out[name] = value
    if not out:
        raise ConvertError("the state_dict holds no tensors")
    return Source(out, model_args, iter_num, optimizer)


# --------------------------------------------------------------------------- #
# Configuration
# --------------------------------------------------------------------------- #
def _bitwise_equal(a: Tensor, b: Tensor) -> bool:
    """True if two tensors have the same dtype, shape and bytes."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    return a.array.tobytes() == b.array.tobytes()


def _infer_from_tensors(state: Dict[str, Tensor]) -> Dict[str, object]:
    """Configuration values that the tensor shapes determine."""
    inferred: Dict[str, object] = {}
    wte = state.get("transformer.wte.weight")
    if wte is not None and len(wte.shape) == 2:
        inferred["vocab_size"] = int(wte.shape[0])
        inferred["n_embd"] = int(wte.shape[1])
    wpe = state.get("transformer.wpe.weight")
    if wpe is not None and len(wpe.shape) == 2:
        inferred["block_size"] = int(wpe.shape[0])
    layers = [int(m.group(1)) for m in map(_LAYER_KEY.match, state) if m]
    if layers:
        inferred["n_layer"] = max(layers) + 1
    bias_keys = [k for k in state if k.endswith(".bias") and not _MASK_BUFFER.match(k)]
    inferred["bias"] = bool(bias_keys)
    return inferred


def resolve_config(state: Dict[str, Tensor], model_args: Optional[dict],
                   opts: argparse.Namespace) -> GPTConfig:
    """Combine model_args, command-line flags and tensor shapes into a config.

    For a nanoGPT file model_args rules and a flag that disagrees with it is
    an error; fields it lacks come from flags, then from the tensors.  For a
    bare state_dict flags rule, then the tensors; ``--n-head`` is required.
    """
    flags = {name: getattr(opts, name) for name, _ in _ARG_FIELDS}
    inferred = _infer_from_tensors(state)
    values: Dict[str, object] = {}
    if model_args is not None:
        for name, flag in _ARG_FIELDS:
            if name not in model_args:
                continue
            value = model_args[name]
            if name == "bias":
                if not isinstance(value, (bool, int)) or value not in (0, 1):
                    raise ConvertError(f"model_args bias={value!r} is not a boolean")
                value = bool(value)
            elif isinstance(value, bool) or not isinstance(value, int):
                raise ConvertError(f"model_args {name}={value!r} is not an integer")
            if flags[name] is not None and flags[name] != value:
                given = (("--bias" if flags[name] else "--no-bias")
                         if name == "bias" else f"{flag} {flags[name]}")
                raise ConvertError(f"{given} disagrees with model_args "
                                   f"{name}={value}")
            values[name] = value
    for name, _ in _ARG_FIELDS:
        if name not in values and flags[name] is not None:
            values[name] = flags[name]
    if "n_head" not in values:
        raise ConvertError("--n-head is required for a bare state_dict "
                           "(transformer.h.0.attn.c_attn.weight does not "
                           "determine the head count)")
    for name, flag in _ARG_FIELDS:
        if name not in values:
            if name not in inferred:
                source = {"n_layer": "no transformer.h.<i>.* tensor",
                          "n_embd": "transformer.wte.weight is missing or not 2-D",
                          "vocab_size": "transformer.wte.weight is missing or not 2-D",
                          "block_size": "transformer.wpe.weight is missing or not 2-D",
                          }[name]
                raise ConvertError(f"cannot infer {name} ({source}); give {flag}")
            values[name] = inferred[name]

    # Tied or untied head.
    wte = state.get("transformer.wte.weight")
    head = state.get("lm_head.weight")
    if opts.tie is not None:
        tie = opts.tie
        if tie and head is not None and wte is not None \
                and not _bitwise_equal(head, wte):
            raise ConvertError("--tie given but lm_head.weight differs from "
                               "transformer.wte.weight")
    else:
        tie = head is None or (wte is not None and _bitwise_equal(head, wte))

    n_embd, n_head = values["n_embd"], values["n_head"]
    for name in ("n_layer", "n_head", "n_embd", "block_size", "vocab_size"):
        if values[name] < 1:
            raise ConvertError(f"{name}={values[name]} must be positive")
    if n_embd % n_head:
        raise ConvertError(f"n_head={n_head} does not divide n_embd={n_embd} "
                           f"(transformer.wte.weight)")
    if not (math.isfinite(opts.ln_eps) and opts.ln_eps > 0):
        raise ConvertError(f"--ln-eps {opts.ln_eps} must be positive and finite")
    try:
        return GPTConfig(n_layer=values["n_layer"], n_head=n_head, n_embd=n_embd,
                         block_size=values["block_size"],
                         vocab_size=values["vocab_size"], bias=values["bias"],
                         tie_embeddings=tie, gelu=opts.gelu, ln_eps=opts.ln_eps)
    except ValueError as exc:
        raise ConvertError(str(exc)) from None


# --------------------------------------------------------------------------- #
# Validation
# --------------------------------------------------------------------------- #
def _describe_bad(mask: np.ndarray) -> str:
    flat = np.flatnonzero(mask.reshape(-1))
    return f"{flat.size} value(s), first at flat index {int(flat[0])}"


def _float32(t: Tensor) -> Tuple[Optional[np.ndarray], str]:
    """A floating tensor's values as contiguous float32, or ``(None, problem)``."""
    bad = ~np.isfinite(t.array)
    if bad.any():
        return None, f"holds NaN/Inf: {_describe_bad(bad)}"
    with np.errstate(over="ignore"):
        arr = np.ascontiguousarray(t.array, dtype="<f4")
    overflow = ~np.isfinite(arr)
    if overflow.any():
        return None, f"overflows float32: {_describe_bad(overflow)}"
    return arr, ""


def collect_params(state: Dict[str, Tensor], cfg: GPTConfig
                   ) -> Dict[str, np.ndarray]:
    """Validate ``state`` against ``cfg``; return canonical float32 arrays.

    Checks, in this order: mask buffers are skipped, every canonical tensor
    is present, no unknown tensor remains, then per tensor (canonical order)
    floating dtype, shape, finiteness and float32 range.
    """
    shapes = canonical_shapes(cfg)
    kept: Dict[str, Tensor] = {}
    for name, tensor in state.items():
        if _MASK_BUFFER.match(name) and (not cfg.bias or len(tensor.shape) == 4):
            continue  # nanoGPT's causal-mask buffer / HF's masked_bias
        kept[name] = tensor
    for name in shapes:
        if name not in kept:
            raise ConvertError(f"missing tensor {name}")
    for name in kept:
        if name not in shapes and not (cfg.tie_embeddings and name == "lm_head.weight"):
            raise ConvertError(f"unknown tensor {name}")

    out: Dict[str, np.ndarray] = {}
    for name, shape in shapes.items():
        t = kept[name]
        if not t.is_floating:
            raise ConvertError(f"tensor {name} has non-floating dtype {t.dtype}")
        if t.shape != shape:
            raise ConvertError(f"tensor {name} has shape {t.shape}, expected {shape}")
        arr, problem = _float32(t)
        if arr is None:
            raise ConvertError(f"tensor {name} ({t.dtype}) {problem}")
        out[name] = arr
    if cfg.tie_embeddings and "lm_head.weight" in kept:
        head = kept["lm_head.weight"]
        if head.shape != shapes["transformer.wte.weight"]:
            raise ConvertError(f"tensor lm_head.weight has shape {head.shape}, "
                               f"expected {shapes['transformer.wte.weight']}")
    return out


# --------------------------------------------------------------------------- #
# Optimizer state
# --------------------------------------------------------------------------- #
@dataclass
class OptimizerState:
    """AdamW state keyed by canonical name, as written to ``/optimizer``."""

    step: int
    beta1: float
    beta2: float
    eps: float
    weight_decay: float
    lr: float
    exp_avg: Dict[str, np.ndarray]
    exp_avg_sq: Dict[str, np.ndarray]


class _LeftOut(Exception):
    """The optimizer state cannot be carried over; the message says why."""


def _real(value: object) -> Optional[float]:
    """A Python int/float or a one-element tensor as float; None otherwise."""
    if isinstance(value, Tensor) and value.array.size == 1 and value.dtype != "bool":
        return float(value.array.reshape(-1)[0])
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    return None


def _group_settings(groups: List[dict]) -> Tuple[float, float, float, float, float]:
    """(beta1, beta2, eps, lr, weight_decay) shared by every group."""
    seen = []
    for g, group in enumerate(groups):
        betas = group.get("betas")
        if not (isinstance(betas, (tuple, list)) and len(betas) == 2):
            raise _LeftOut(f"parameter group {g} has no betas pair (not Adam-like)")
        values = [_real(betas[0]), _real(betas[1])] + [
            _real(group.get(k)) for k in ("eps", "lr", "weight_decay")]
        if None in values:
            raise _LeftOut(f"parameter group {g} lacks a numeric beta, eps, lr or "
                           f"weight_decay")
        for flag in ("amsgrad", "maximize"):
            if group.get(flag):
                raise _LeftOut(f"parameter group {g} has {flag}=True, which "
                               f"/optimizer cannot describe")
        seen.append(values)
    for key, i in (("betas", slice(0, 2)), ("eps", slice(2, 3)), ("lr", slice(3, 4))):
        if any(v[i] != seen[0][i] for v in seen):
            raise _LeftOut(f"the parameter groups have different {key} "
                           f"({', '.join(str(v[i]) for v in seen)})")
    if len(seen) == 2 and seen[1][4] != 0.0:
        raise _LeftOut(f"the no-decay group has weight_decay={seen[1][4]}, not 0")
    beta1, beta2, eps, lr, weight_decay = seen[0]
    return beta1, beta2, eps, lr, weight_decay


def _param_order(groups: List[dict], cfg: GPTConfig) -> List[str]:
    """Canonical names in optimizer-id order, as nanoGPT builds its groups.

    nanoGPT's ``configure_optimizers`` puts the parameters of
    ``named_parameters()`` (the canonical order, a tied head once) with
    dim >= 2 in group 0 and the rest in group 1; a single group holds all.
    """
    ids: List[object] = []
    for g, group in enumerate(groups):
        params = group.get("params")
        if not isinstance(params, list):
            raise _LeftOut(f"parameter group {g} has no params list")
        ids.extend(params)
    if any(isinstance(i, bool) for i in ids) or ids != list(range(len(ids))):
        raise _LeftOut("the parameter ids are not 0..n-1 in group order")
    names = canonical_names(cfg)
    if len(ids) != len(names):
        raise _LeftOut(f"the optimizer has {len(ids)} parameters, the model "
                       f"{len(names)}")
    if len(groups) == 1:
        return names
    if len(groups) != 2:
        raise _LeftOut(f"{len(groups)} parameter groups (expected one, or "
                       f"nanoGPT's decay and no-decay groups)")
    shapes = canonical_shapes(cfg)
    decay = [n for n in names if len(shapes[n]) >= 2]
    no_decay = [n for n in names if len(shapes[n]) < 2]
    sizes = (len(groups[0]["params"]), len(groups[1]["params"]))
    if sizes != (len(decay), len(no_decay)):
        raise _LeftOut(f"parameter groups of {sizes[0]} and {sizes[1]} tensors are "
                       f"not nanoGPT's decay/no-decay split ({len(decay)} and "
                       f"{len(no_decay)})")
    return decay + no_decay


def collect_optimizer(optimizer: object, cfg: GPTConfig) -> OptimizerState:
    """Map a torch AdamW state_dict onto canonical names, proving each step.

    Raises :class:`_LeftOut` with the reason when the mapping cannot be
    proven: ids 0..n-1 in order, counts, every moment's shape equal to its
    parameter's, state for all parameters, one step, shared hyper-parameters.
    """
    if not (isinstance(optimizer, dict) and isinstance(optimizer.get("state"), dict)
            and isinstance(optimizer.get("param_groups"), list)
            and optimizer["param_groups"]
            and all(isinstance(g, dict) for g in optimizer["param_groups"])):
        raise _LeftOut("not a torch optimizer state_dict ('state' and "
                       "'param_groups')")
    state, groups = optimizer["state"], optimizer["param_groups"]
    if not state:
        raise _LeftOut("the optimizer state is empty (saved before the first step)")
    order = _param_order(groups, cfg)
    beta1, beta2, eps, lr, weight_decay = _group_settings(groups)
    shapes = canonical_shapes(cfg)
    moments: Dict[str, Dict[str, np.ndarray]] = {"exp_avg": {}, "exp_avg_sq": {}}
    steps: Dict[int, str] = {}
    for pid, name in enumerate(order):
        entry = state.get(pid)
        if entry is None:
            raise _LeftOut(f"parameter {pid} ({name}) has no state")
        if not (isinstance(entry, dict) and set(entry) == {"step", "exp_avg", "exp_avg_sq"}):
            keys = sorted(map(str, entry)) if isinstance(entry, dict) else entry
            raise _LeftOut(f"the state of parameter {pid} ({name}) is {keys}, not "
                           f"Adam's step, exp_avg and exp_avg_sq")
        for key, out in moments.items():
            t = entry[key]
            if not (isinstance(t, Tensor) and t.is_floating):
                raise _LeftOut(f"{key} of parameter {pid} ({name}) is not a "
                               f"floating tensor")
            if t.shape != shapes[name]:
                raise _LeftOut(f"{key} of parameter {pid} has shape {t.shape}, but "
                               f"the parameter it maps to, {name}, has "
                               f"{shapes[name]}")
            arr, problem = _float32(t)
            if arr is None:
                raise _LeftOut(f"{key} of {name} ({t.dtype}) {problem}")
            out[name] = arr
        step = _real(entry["step"])
        if step is None or not (step >= 0 and step == int(step)):
            raise _LeftOut(f"the step of parameter {pid} ({name}) is not a "
                           f"non-negative integer")
        steps.setdefault(int(step), name)
    extra = set(state) - set(range(len(order)))
    if extra:
        raise _LeftOut(f"state for unknown parameter id {sorted(map(str, extra))[0]}")
    if len(steps) != 1:
        raise _LeftOut("the parameters have different steps (" + ", ".join(
            f"{s} for {n}" for s, n in sorted(steps.items())) + ")")
    return OptimizerState(next(iter(steps)), beta1, beta2, eps, weight_decay, lr,
                          moments["exp_avg"], moments["exp_avg_sq"])


# --------------------------------------------------------------------------- #
# Writing
# --------------------------------------------------------------------------- #
def write_h5(out_path: str, cfg: GPTConfig, params: Dict[str, np.ndarray],
             source_file: str, source_sha256: str, iter_num: Optional[int],
             optimizer: Optional[OptimizerState] = None) -> None:
    """Write the checkpoint atomically: OUT.tmp, fsync, rename to OUT."""
    import h5py

    tmp = out_path + ".tmp"
    try:
        with h5py.File(tmp, "w") as f:
            f.attrs["format"] = gnh_layout.H5_FORMAT
            f.attrs["format_version"] = np.int64(gnh_layout.H5_FORMAT_VERSION)
            f.attrs["source_file"] = source_file
            f.attrs["source_sha256"] = source_sha256
            if iter_num is not None:
                f.attrs["iter_num"] = np.int64(iter_num)
            c = f.create_group("config")
            for key in ("n_layer", "n_head", "n_embd", "block_size", "vocab_size"):
                c.attrs[key] = np.int64(getattr(cfg, key))
            c.attrs["bias"] = np.int64(int(cfg.bias))
            c.attrs["tie_embeddings"] = np.int64(int(cfg.tie_embeddings))
            c.attrs["gelu"] = cfg.gelu
            c.attrs["ln_eps"] = np.float64(cfg.ln_eps)
            # track_order keeps the canonical (creation) order on iteration.
            p = f.create_group("params", track_order=True)
            for name in canonical_names(cfg):
                p.create_dataset(name, data=params[name])  # contiguous, no filters
            if optimizer is not None:
                o = f.create_group("optimizer")
                o.attrs["step"] = np.int64(optimizer.step)
                for key in ("beta1", "beta2", "eps", "weight_decay", "lr"):
                    o.attrs[key] = np.float64(getattr(optimizer, key))
                for key in ("exp_avg", "exp_avg_sq"):
                    g = o.create_group(key, track_order=True)
                    for name in canonical_names(cfg):
                        g.create_dataset(name, data=getattr(optimizer, key)[name])
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, out_path)
        try:
            dfd = os.open(os.path.dirname(os.path.abspath(out_path)), os.O_RDONLY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)
        except OSError:
            pass  # directory fsync is best effort (not all filesystems allow it)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def _check_not_input(in_path: str, out_path: str) -> None:
    """Refuse an output path (or its .tmp) that is the input file."""
    for path in (out_path, out_path + ".tmp"):
        same = os.path.realpath(path) == os.path.realpath(in_path)
        if not same and os.path.exists(path) and os.path.exists(in_path):
            try:
                same = os.path.samefile(path, in_path)
            except OSError:
                same = False
        if same:
            raise ConvertError(f"the output {path} is the input file; refusing "
                               f"to overwrite it")


def convert(in_path: str, out_path: str, opts: argparse.Namespace,
            warn: Optional[Callable[[str], None]] = None
            ) -> Tuple[GPTConfig, int, str]:
    """Convert ``in_path`` to ``out_path``; return (config, n_params, sha256).

    ``opts`` is a namespace as produced by :func:`build_parser` (see
    :func:`default_options`).  Raises :class:`ConvertError` on any refusal.
    Optimizer state that cannot be carried over is reported through
    ``warn`` (default: one ``gnh-convert: warning:`` line on stderr).
    """
    _check_not_input(in_path, out_path)
    obj, digest = load_checkpoint(in_path)
    src = split_checkpoint(obj)
    cfg = resolve_config(src.state, src.model_args, opts)
    params = collect_params(src.state, cfg)
    optimizer, left_out = None, None
    if src.optimizer is not None:
        try:
            optimizer = collect_optimizer(src.optimizer, cfg)
        except _LeftOut as why:
            left_out = f"optimizer state left out: {why}"
    try:
        write_h5(out_path, cfg, params, os.path.basename(in_path), digest,
                 src.iter_num, optimizer)
    except OSError as exc:
        raise ConvertError(f"cannot write {out_path}: {exc.strerror or exc}") from None
    if left_out is not None:  # after writing, so that a failure stays one line
        if warn is None:
            print(f"{PROG}: warning: {in_path}: {left_out}", file=sys.stderr)
        else:
            warn(left_out)
    n_params = int(sum(a.size for a in params.values()))
    return cfg, n_params, digest


# --------------------------------------------------------------------------- #
# Command line
# --------------------------------------------------------------------------- #
def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=PROG,
        description="Convert a PyTorch GPT checkpoint (torch.save zip or legacy "
                    "file, or safetensors; nanoGPT layout or bare state_dict) "
                    "into a gnh HDF5 checkpoint (SPEC section 2), without "
                    "PyTorch and without running pickled code.")
    p.add_argument("input", metavar="IN.pt")
    p.add_argument("output", metavar="OUT.h5")
    p.add_argument("--n-head", type=int, dest="n_head",
                   help="attention heads (required for a bare state_dict)")
    p.add_argument("--n-layer", type=int, dest="n_layer")
    p.add_argument("--n-embd", type=int, dest="n_embd")
    p.add_argument("--block-size", type=int, dest="block_size")
    p.add_argument("--vocab-size", type=int, dest="vocab_size")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--bias", dest="bias", action="store_const", const=True,
                   help="Linear and LayerNorm layers have biases")
    g.add_argument("--no-bias", dest="bias", action="store_const", const=False)
    t = p.add_mutually_exclusive_group()
    t.add_argument("--tie", dest="tie", action="store_const", const=True,
                   help="force a tied head (default: inferred from lm_head.weight)")
    t.add_argument("--untie", dest="tie", action="store_const", const=False,
                   help="force an untied head (lm_head.weight is written)")
    p.add_argument("--gelu", choices=gnh_layout.GELU_KINDS, default="erf",
                   help="GELU variant (default: erf)")
    p.add_argument("--ln-eps", type=float, default=1e-5, dest="ln_eps",
                   help="LayerNorm epsilon (default: 1e-5)")
    p.set_defaults(bias=None, tie=None)
    return p


def default_options(**overrides) -> argparse.Namespace:
    """Options as if no flag were given, updated with ``overrides``."""
    opts = build_parser().parse_args(["IN.pt", "OUT.h5"])
    for key, value in overrides.items():
        if not hasattr(opts, key):
            raise TypeError(f"unknown option {key}")
        setattr(opts, key, value)
    return opts


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Command-line entry point; returns the exit status."""
    opts = build_parser().parse_args(argv)
    try:
        cfg, n_params, digest = convert(opts.input, opts.output, opts)
    except ConvertError as exc:
        print(f"{PROG}: error: {opts.input}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        raise
    except Exception as exc:  # never show a traceback to the user
        print(f"{PROG}: error: {opts.input}: unexpected {type(exc).__name__}: "
              f"{_one_line(exc)}", file=sys.stderr)
        return 1
    print(f"{PROG}: {opts.input} -> {opts.output} ({n_params} parameters, "
          f"sha256 {digest})")
    return 0
