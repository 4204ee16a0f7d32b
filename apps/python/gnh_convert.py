# SPDX-License-Identifier: BSD-3-Clause
"""Convert a PyTorch GPT checkpoint (.pt) into a gnh HDF5 checkpoint.

This is the implementation behind ``apps/gnh-convert`` (SPEC section 2).  The
input is loaded with ``torch.load(..., weights_only=True)``, so no pickled
code is ever executed.  Two layouts are accepted:

* nanoGPT's ``{'model': state_dict, 'model_args': {...}, 'iter_num': ...}``;
* a bare state_dict, with the configuration taken from the command line and
  inferred from tensor shapes where possible (``--n-head`` is required).

Every problem is reported as a :class:`ConvertError` whose message names the
tensor concerned; :func:`main` prints it as one line
``gnh-convert: error: <IN>: <problem>`` and returns exit status 1.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import math
import os
import re
import sys
from typing import Dict, Optional, Sequence, Tuple

import numpy as np

import gnh_model
from gnh_model import GPTConfig, canonical_names, canonical_shapes

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


def _opcode_name(code: int) -> str:
    """Name of the pickle opcode with byte value ``code`` (e.g. BINFLOAT)."""
    import pickletools

    for op in pickletools.opcodes:
        if ord(op.code) == code:
            return op.name
    return str(code)


def load_checkpoint(path: str) -> Tuple[object, str]:
    """Read ``path`` and unpickle it with ``weights_only=True``.

    Returns ``(object, sha256 hex of the file's bytes)``.  The bytes are
    read once, so the hash is that of exactly what was loaded.
    """
    import torch

    try:
        with open(path, "rb") as fh:
            data = fh.read()
    except OSError as exc:
        raise ConvertError(f"cannot read file: {exc.strerror or exc}") from None
    digest = hashlib.sha256(data).hexdigest()
    try:
        obj = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises many types for corrupt input
        msg = _one_line(exc)
        opcode = re.search(r"Unsupported operand (\d+)", msg)
        if opcode:
            # PyTorch < 2.0's weights-only unpickler lacks some plain opcodes,
            # notably BINFLOAT: any Python float in the pickle (nanoGPT's
            # model_args['dropout'], its 'config' and optimizer settings).
            raise ConvertError(
                f"PyTorch {torch.__version__}'s weights-only loader cannot "
                f"unpickle opcode {_opcode_name(int(opcode.group(1)))} (Python "
                f"floats in the checkpoint's metadata, e.g. model_args "
                f"'dropout' or optimizer settings); convert with PyTorch >= 2.0 "
                f"or re-save the checkpoint without float metadata") from None
        if "weights only" in msg.lower() or "weightsunpickler" in msg.lower():
            raise ConvertError("refused by the weights-only loader (the file "
                               "pickles objects other than tensors and plain "
                               "containers): " + msg) from None
        raise ConvertError(f"cannot load (truncated or corrupt file?): "
                           f"{type(exc).__name__}: {msg}") from None
    return obj, digest


def split_checkpoint(obj) -> Tuple[Dict[str, object], Optional[dict], Optional[int]]:
    """Split a loaded object into (state_dict, model_args or None, iter_num).

    Keys lose a leading ``_orig_mod.`` (left by ``torch.compile``).
    """
    import torch

    if not isinstance(obj, dict):
        raise ConvertError(f"top-level object is a {type(obj).__name__}, not a "
                           f"nanoGPT checkpoint dict or a state_dict")
    model_args = None
    iter_num = None
    if "model" in obj and isinstance(obj["model"], dict):
        state = obj["model"]
        model_args = obj.get("model_args")
        if model_args is not None and not isinstance(model_args, dict):
            raise ConvertError(f"'model_args' is a {type(model_args).__name__}, "
                               f"not a dict")
        it = obj.get("iter_num")
        if isinstance(it, torch.Tensor) and it.numel() == 1 \
                and not it.is_floating_point():
            it = int(it.item())
        if isinstance(it, int) and not isinstance(it, bool):
            iter_num = it
    else:
        state = obj
    out: Dict[str, object] = {}
    for key, value in state.items():
        if not isinstance(key, str):
            raise ConvertError(f"state_dict key {key!r} is not a string")
        name = key[len(_COMPILE_PREFIX):] if key.startswith(_COMPILE_PREFIX) else key
        if name in out:
            raise ConvertError(f"tensor {name} appears twice (with and without "
                               f"the {_COMPILE_PREFIX} prefix)")
        if not isinstance(value, torch.Tensor):
            raise ConvertError(f"state_dict entry {name} is a "
                               f"{type(value).__name__}, not a tensor")
        out[name] = value
    if not out:
        raise ConvertError("the state_dict holds no tensors")
    return out, model_args, iter_num


# --------------------------------------------------------------------------- #
# Configuration
# --------------------------------------------------------------------------- #
def _bitwise_equal(a, b) -> bool:
    """True if two tensors have the same dtype, shape and bytes."""
    import torch

    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.is_floating_point():
        as_int = {2: torch.int16, 4: torch.int32, 8: torch.int64}.get(a.element_size())
        if as_int is None:
            return False
        return torch.equal(a.contiguous().view(as_int), b.contiguous().view(as_int))
    return torch.equal(a, b)


def _infer_from_tensors(state: Dict[str, object]) -> Dict[str, object]:
    """Configuration values that the tensor shapes determine."""
    inferred: Dict[str, object] = {}
    wte = state.get("transformer.wte.weight")
    if wte is not None and wte.dim() == 2:
        inferred["vocab_size"] = int(wte.shape[0])
        inferred["n_embd"] = int(wte.shape[1])
    wpe = state.get("transformer.wpe.weight")
    if wpe is not None and wpe.dim() == 2:
        inferred["block_size"] = int(wpe.shape[0])
    layers = [int(m.group(1)) for m in map(_LAYER_KEY.match, state) if m]
    if layers:
        inferred["n_layer"] = max(layers) + 1
    bias_keys = [k for k in state if k.endswith(".bias") and not _MASK_BUFFER.match(k)]
    inferred["bias"] = bool(bias_keys)
    return inferred


def resolve_config(state: Dict[str, object], model_args: Optional[dict],
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


def collect_params(state: Dict[str, object], cfg: GPTConfig
                   ) -> Dict[str, np.ndarray]:
    """Validate ``state`` against ``cfg``; return canonical float32 arrays.

    Checks, in this order: mask buffers are skipped, every canonical tensor
    is present, no unknown tensor remains, then per tensor (canonical order)
    layout, floating dtype, shape, finiteness and float32 range.
    """
    import torch

    shapes = canonical_shapes(cfg)
    names = list(state)
    kept: Dict[str, object] = {}
    for name in names:
        tensor = state[name]
        if _MASK_BUFFER.match(name) and (not cfg.bias or tensor.dim() == 4):
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
        if t.layout != torch.strided:
            raise ConvertError(f"tensor {name} has layout {t.layout}, "
                               f"expected a dense (strided) tensor")
        if not t.is_floating_point():
            raise ConvertError(f"tensor {name} has non-floating dtype "
                               f"{str(t.dtype).replace('torch.', '')}")
        if tuple(t.shape) != shape:
            raise ConvertError(f"tensor {name} has shape {tuple(t.shape)}, "
                               f"expected {shape}")
        wide = t.detach().to(torch.float64).contiguous().numpy()
        bad = ~np.isfinite(wide)
        if bad.any():
            raise ConvertError(f"tensor {name} holds NaN/Inf: {_describe_bad(bad)}")
        arr = t.detach().to(torch.float32).contiguous().numpy()
        overflow = ~np.isfinite(arr)
        if overflow.any():
            raise ConvertError(f"tensor {name} overflows float32: "
                               f"{_describe_bad(overflow)}")
        out[name] = np.ascontiguousarray(arr, dtype="<f4")
    if cfg.tie_embeddings and "lm_head.weight" in kept:
        head = kept["lm_head.weight"]
        if tuple(head.shape) != shapes["transformer.wte.weight"]:
            raise ConvertError(f"tensor lm_head.weight has shape "
                               f"{tuple(head.shape)}, expected "
                               f"{shapes['transformer.wte.weight']}")
    return out


# --------------------------------------------------------------------------- #
# Writing
# --------------------------------------------------------------------------- #
def write_h5(out_path: str, cfg: GPTConfig, params: Dict[str, np.ndarray],
             source_file: str, source_sha256: str,
             iter_num: Optional[int]) -> None:
    """Write the checkpoint atomically: OUT.tmp, fsync, rename to OUT."""
    import h5py

    tmp = out_path + ".tmp"
    try:
        with h5py.File(tmp, "w") as f:
            f.attrs["format"] = gnh_model.H5_FORMAT
            f.attrs["format_version"] = np.int64(gnh_model.H5_FORMAT_VERSION)
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


def convert(in_path: str, out_path: str, opts: argparse.Namespace
            ) -> Tuple[GPTConfig, int, str]:
    """Convert ``in_path`` to ``out_path``; return (config, n_params, sha256).

    ``opts`` is a namespace as produced by :func:`build_parser` (see
    :func:`default_options`).  Raises :class:`ConvertError` on any refusal.
    """
    obj, digest = load_checkpoint(in_path)
    state, model_args, iter_num = split_checkpoint(obj)
    cfg = resolve_config(state, model_args, opts)
    params = collect_params(state, cfg)
    try:
        write_h5(out_path, cfg, params, os.path.basename(in_path), digest, iter_num)
    except OSError as exc:
        raise ConvertError(f"cannot write {out_path}: {exc.strerror or exc}") from None
    n_params = int(sum(a.size for a in params.values()))
    return cfg, n_params, digest


# --------------------------------------------------------------------------- #
# Command line
# --------------------------------------------------------------------------- #
def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=PROG,
        description="Convert a PyTorch GPT checkpoint (nanoGPT layout or bare "
                    "state_dict) into a gnh HDF5 checkpoint (SPEC section 2).")
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
    p.add_argument("--gelu", choices=gnh_model.GELU_KINDS, default="erf",
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
