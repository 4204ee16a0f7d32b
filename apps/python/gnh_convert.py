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
  the command line and inferred from tensor shapes (``--n-head`` is required);
* a Hugging Face checkpoint directory of the Llama or GPT-NeoX family (SPEC
  section 11: config.json, model.safetensors or pytorch_model.bin, either
  possibly sharded with its index JSON), read by ``gnh_hf``.

Weights may be float32, float16, bfloat16 or float64.  AdamW state is written
to ``/optimizer`` when its parameter ids provably map onto the canonical
names (nanoGPT's decay/no-decay groups, or one group) and its groups are
provably Adam-family with decoupled decay (see :func:`collect_optimizer`);
otherwise it is left out with one warning line.  Every refusal is a
:class:`ConvertError` whose message names the tensor concerned; :func:`main`
prints it as one line ``gnh-convert: error: <IN>: <problem>`` and returns exit
status 1.

Everything taken from the file is checked before it is used to size work:
the configuration's n_layer must match the ``transformer.h.<i>.`` tensors
present (0..n_layer-1, at most :data:`MAX_LAYERS`) before names are built,
every configuration integer is at most :data:`MAX_CONFIG_INT`, iter_num must
be an integer in [0, 2^63), and optimizer hyper-parameters must be finite and
in torch's own ranges.  Names from the file reach messages only through
``gnh_ptfile.printable``/``describe``, and :func:`main` escapes anything
non-printable that is left, so each message is exactly one line.  The output
is written to a temporary file created exclusively next to OUT (never a
pre-existing path, never through a symlink), then renamed over OUT.
"""

from __future__ import annotations

import argparse
import hashlib
import math
import os
import re
import sys
import tempfile
from dataclasses import dataclass
from typing import Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple

import numpy as np

import gnh_hf
import gnh_layout
import gnh_ptfile
from gnh_layout import GPTConfig, canonical_names, canonical_shapes
from gnh_ptfile import Tensor, describe, printable

PROG = "gnh-convert"
#: Most transformer blocks accepted (GPT-3 175B has 96).
MAX_LAYERS = 10_000
#: Largest n_head, n_embd, block_size or vocab_size accepted (a C int).
MAX_CONFIG_INT = 2**31 - 1
_INT64_LIMIT = 2**63
_COMPILE_PREFIX = "_orig_mod."
# ASCII digits, no leading zeros, at most 9 of them: int() of the match is
# cheap and names a layer canonical_names can produce.
_LAYER_INDEX = r"(0|[1-9][0-9]{0,8})"
_MASK_BUFFER = re.compile(r"^transformer\.h\." + _LAYER_INDEX
                          + r"\.attn\.(bias|masked_bias)$")
_LAYER_KEY = re.compile(r"^transformer\.h\." + _LAYER_INDEX + r"\.")
# Configuration fields in nanoGPT's model_args, with their command-line flag.
_ARG_FIELDS = (("n_layer", "--n-layer"), ("n_head", "--n-head"),
               ("n_embd", "--n-embd"), ("block_size", "--block-size"),
               ("vocab_size", "--vocab-size"), ("bias", "--bias/--no-bias"))


class ConvertError(Exception):
    """A refusal to convert; the message is one line naming the tensor."""


# --------------------------------------------------------------------------- #
# Loading
# --------------------------------------------------------------------------- #
def _one_line(text: object, limit: int = 2000) -> str:
    """``text`` as one printable line: anything non-printable (newlines,
    terminal escapes, bidi controls) backslash-escaped, cut at ``limit``.

    Messages already name file-derived strings through ``printable``; this
    is the backstop that keeps every line on stderr a single line.
    """
    text = str(text)
    if not text.isprintable():
        text = "".join(c if c.isprintable()
                       else c.encode("unicode_escape").decode("ascii") for c in text)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def load_checkpoint(path: str) -> gnh_ptfile.Loaded:
    """Read ``path`` with ``gnh_ptfile``: the object, the sha256 and the size
    of the file.  The bytes are read once, so the hash is that of exactly
    what was loaded."""
    try:
        return gnh_ptfile.load(path)
    except gnh_ptfile.PtFileError as exc:
        raise ConvertError(str(exc)) from None


def output_limit(file_size: int) -> int:
    """Most float32 bytes the output may hold for an input of ``file_size``.

    Real checkpoints give at most about twice their size (float16/bfloat16
    widened), four times with a forced untied head on a small model;
    several names backed by one shared tensor can give any multiple.
    """
    return 4 * file_size + gnh_ptfile.MATERIALISE_SLACK


class Source(NamedTuple):
    """The parts of a loaded checkpoint the conversion uses."""

    state: Dict[str, Tensor]
    model_args: Optional[dict]
    iter_num: Optional[int]
    optimizer: Optional[object]


def _iter_num(value: object) -> int:
    """nanoGPT's iter_num: an integer, or a one-element integer tensor, in
    [0, 2^63) (it is written as an int64 attribute)."""
    it = value
    if isinstance(it, Tensor) and math.prod(it.shape) == 1 and not it.is_floating \
            and it.dtype != "bool":
        it = int(it.array.reshape(-1)[0])
    if isinstance(it, bool) or not isinstance(it, int) or not 0 <= it < _INT64_LIMIT:
        raise ConvertError(f"iter_num is {describe(value)}, not an integer in "
                           f"[0, 2^63)")
    return it


def split_checkpoint(obj: object) -> Source:
    """Split a loaded object into state_dict, model_args, iter_num, optimizer.

    Keys lose a leading ``_orig_mod.`` (left by ``torch.compile``).  Lookups
    go through ``dict``'s own methods, never an attribute of the object.
    """
    if not isinstance(obj, dict):
        raise ConvertError(f"top-level object is {describe(obj)}, not a "
                           f"nanoGPT checkpoint dict or a state_dict")
    model_args = None
    iter_num = None
    optimizer = None
    if isinstance(dict.get(obj, "model"), dict):
        state = dict.get(obj, "model")
        model_args = dict.get(obj, "model_args")
        if model_args is not None and not isinstance(model_args, dict):
            raise ConvertError(f"'model_args' is {describe(model_args)}, not a dict")
        if "iter_num" in obj:
            iter_num = _iter_num(dict.get(obj, "iter_num"))
        optimizer = dict.get(obj, "optimizer")
    else:
        state = obj
    out: Dict[str, Tensor] = {}
    for key, value in dict.items(state):
        if not isinstance(key, str):
            raise ConvertError(f"state_dict key {describe(key)} is not a string")
        name = key[len(_COMPILE_PREFIX):] if key.startswith(_COMPILE_PREFIX) else key
        if name in out:
            raise ConvertError(f"tensor {printable(name)} appears twice (with and "
                               f"without the {_COMPILE_PREFIX} prefix)")
        if not isinstance(value, Tensor):
            raise ConvertError(f"state_dict entry {printable(name)} is "
                               f"{describe(value)}, not a tensor")
        out[name] = value
    if not out:
        raise ConvertError("the state_dict holds no tensors")
    return Source(out, model_args, iter_num, optimizer)


# --------------------------------------------------------------------------- #
# Configuration
# --------------------------------------------------------------------------- #
def _bitwise_equal(a: Tensor, b: Tensor) -> bool:
    """True if two tensors have the same dtype, shape and bytes."""
    return a.dtype == b.dtype and gnh_ptfile.equal(a, b, bitwise=True)


def _layers_present(state: Dict[str, Tensor]) -> set:
    """The indices i of the ``transformer.h.<i>.`` tensors in ``state``."""
    return {int(m.group(1)) for m in map(_LAYER_KEY.match, state) if m}


def _check_config_values(values: Dict[str, object], origin: Dict[str, str],
                         state: Dict[str, Tensor]) -> None:
    """Bound the configuration integers and match n_layer to the tensors.

    Run before any name is built from the configuration, so that a file's
    ``n_layer=10**9`` costs nothing: the blocks 0..n_layer-1 must all have
    tensors and no block beyond may have any.  The other sizes are checked
    against the tensors' shapes by :func:`collect_params`.
    """
    for name in ("n_layer", "n_head", "n_embd", "block_size", "vocab_size"):
        value = values[name]
        top = MAX_LAYERS if name == "n_layer" else MAX_CONFIG_INT
        if not 1 <= value <= top:
            raise ConvertError(f"{origin[name]} {name}={describe(value)} is out of "
                               f"range (1..{top})")
    n_layer = values["n_layer"]
    present = _layers_present(state)
    for i in range(n_layer):
        if i not in present:
            raise ConvertError(f"missing tensor transformer.h.{i}.* "
                               f"({origin['n_layer']} n_layer={n_layer})")
    beyond = sorted(i for i in present if i >= n_layer)
    if beyond:
        raise ConvertError(f"unknown tensor transformer.h.{beyond[0]}.* "
                           f"({origin['n_layer']} n_layer={n_layer})")


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
    layers = _layers_present(state)
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
    origin: Dict[str, str] = {}
    if model_args is not None:
        for name, flag in _ARG_FIELDS:
            if name not in model_args:
                continue
            value = dict.get(model_args, name)
            if name == "bias":
                if not isinstance(value, (bool, int)) or value not in (0, 1):
                    raise ConvertError(f"model_args bias={describe(value)} is not a "
                                       f"boolean")
                value = bool(value)
            elif isinstance(value, bool) or not isinstance(value, int):
                raise ConvertError(f"model_args {name}={describe(value)} is not an "
                                   f"integer")
            if flags[name] is not None and flags[name] != value:
                given = (("--bias" if flags[name] else "--no-bias")
                         if name == "bias" else f"{flag} {flags[name]}")
                raise ConvertError(f"{given} disagrees with model_args "
                                   f"{name}={describe(value)}")
            values[name], origin[name] = value, "model_args"
    for name, flag in _ARG_FIELDS:
        if name not in values and flags[name] is not None:
            values[name], origin[name] = flags[name], flag
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
            values[name], origin[name] = inferred[name], "the tensors give"
    _check_config_values(values, origin, state)

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
class BadValues(Exception):
    """A tensor holds values gnh cannot take; the message says which."""


def float32_blocks(t: Tensor):
    """A floating tensor's values as contiguous float32 blocks of leading
    rows (:meth:`Tensor.blocks`), so that no tensor is held whole.

    Raises :class:`BadValues` once the tensor has been read to its end if any
    value is NaN or Inf, or else overflows float32; no block is handed out
    after the first bad one.
    """
    counts, firsts, seen = [0, 0], [None, None], 0
    for block in t.blocks():
        flat = block.reshape(-1)
        with np.errstate(over="ignore"):
            arr = np.ascontiguousarray(block, dtype="<f4")
        for k, mask in enumerate((~np.isfinite(flat), ~np.isfinite(arr.reshape(-1)))):
            hits = np.flatnonzero(mask)
            if hits.size:
                counts[k] += int(hits.size)
                firsts[k] = seen + int(hits[0]) if firsts[k] is None else firsts[k]
        seen += flat.size
        if not any(counts):
            yield arr
    for k, what in enumerate(("holds NaN/Inf", "overflows float32")):
        if counts[k]:
            raise BadValues(f"{what}: {counts[k]} value(s), first at flat index {firsts[k]}")


def check_values(t: Tensor) -> Optional[str]:
    """Why ``t``'s values cannot be written (:func:`float32_blocks`), or None."""
    try:
        for _ in float32_blocks(t):
            pass
    except BadValues as why:
        return str(why)
    return None


def collect_params(state: Dict[str, Tensor], cfg: GPTConfig,
                   limit: Optional[int] = None) -> Dict[str, Tensor]:
    """Validate ``state`` against ``cfg``; return the canonical tensors.

    Checks, in this order: mask buffers are skipped, every canonical tensor
    is present, no unknown tensor remains, then per tensor (canonical order)
    floating dtype and shape, then the output's size against ``limit``
    (bytes, see :func:`output_limit`).  The values (finite, in float32's
    range) are checked as they are written (:func:`write_h5`).
    """
    shapes = canonical_shapes(cfg)
    kept: Dict[str, Tensor] = {}
    for name, tensor in dict.items(state):
        if _MASK_BUFFER.match(name) and (not cfg.bias or len(tensor.shape) == 4):
            continue  # nanoGPT's causal-mask buffer / HF's masked_bias
        kept[name] = tensor
    for name in shapes:
        if name not in kept:
            raise ConvertError(f"missing tensor {name}")
    for name in kept:
        if name not in shapes and not (cfg.tie_embeddings and name == "lm_head.weight"):
            raise ConvertError(f"unknown tensor {printable(name)}")

    for name, shape in shapes.items():
        t = kept[name]
        if not t.is_floating:
            raise ConvertError(f"tensor {name} has non-floating dtype {t.dtype}")
        if t.shape != shape:
            raise ConvertError(f"tensor {name} has shape {t.shape}, expected {shape}")
    nbytes = 4 * sum(math.prod(shape) for shape in shapes.values())
    if limit is not None and nbytes > limit:
        raise ConvertError(f"the parameters would take {nbytes} bytes of float32, "
                           f"more than the {limit} allowed for this file (four "
                           f"times its size plus {gnh_ptfile.MATERIALISE_SLACK >> 20} "
                           f"MiB): one tensor behind many names?")
    if cfg.tie_embeddings and "lm_head.weight" in kept:
        head = kept["lm_head.weight"]
        if head.shape != shapes["transformer.wte.weight"]:
            raise ConvertError(f"tensor lm_head.weight has shape {head.shape}, "
                               f"expected {shapes['transformer.wte.weight']}")
    return {name: kept[name] for name in shapes}


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
    exp_avg: Dict[str, Tensor]
    exp_avg_sq: Dict[str, Tensor]


class _LeftOut(Exception):
    """The optimizer state cannot be carried over; the message says why."""


def _key(key: object) -> str:
    """A dict key from the file, for a message."""
    return printable(key) if isinstance(key, str) else describe(key)


def _real(value: object) -> Optional[float]:
    """A Python int/float or a one-element tensor as float; None otherwise
    (also for an integer too large for a float)."""
    try:
        if isinstance(value, Tensor) and math.prod(value.shape) == 1 and value.dtype != "bool":
            return float(value.array.reshape(-1)[0])
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    except OverflowError:
        pass
    return None


# torch's own checks on Adam/AdamW arguments, plus finiteness.
_RANGES = {"beta1": (0.0, 1.0, "0 <= beta1 < 1"), "beta2": (0.0, 1.0, "0 <= beta2 < 1"),
           "eps": (0.0, math.inf, "eps >= 0"), "lr": (0.0, math.inf, "lr >= 0"),
           "weight_decay": (0.0, math.inf, "weight_decay >= 0")}


def _group_settings(groups: List[dict]) -> Tuple[float, float, float, float, float]:
    """(beta1, beta2, eps, lr, weight_decay) shared by every group.

    Every group must be Adam or AdamW's: torch 1.13's RAdam, NAdam and Adamax
    keep the same ``betas``/``eps``/``lr``/``weight_decay`` and (RAdam) the
    same per-parameter state, but no ``amsgrad`` entry, so one is required;
    where a ``decoupled_weight_decay`` entry exists (later torch), it must be
    True, or weight_decay 0 (Adam's L2 penalty is then zero too).  A torch
    1.13 state_dict of plain Adam with weight_decay != 0 (an L2 penalty on
    the gradient) cannot be told from AdamW's (decoupled decay): both store
    the same entries, so such state is carried over as AdamW's.
    """
    seen = []
    for g, group in enumerate(groups):
        betas = dict.get(group, "betas")
        if not (isinstance(betas, (tuple, list)) and len(betas) == 2):
            raise _LeftOut(f"parameter group {g} has no betas pair (not Adam-like)")
        values = [_real(betas[0]), _real(betas[1])] + [
            _real(dict.get(group, k)) for k in ("eps", "lr", "weight_decay")]
        if None in values:
            raise _LeftOut(f"parameter group {g} lacks a numeric beta, eps, lr or "
                           f"weight_decay")
        for key, value in zip(("beta1", "beta2", "eps", "lr", "weight_decay"), values):
            low, high, rule = _RANGES[key]
            if not (math.isfinite(value) and low <= value < high):
                raise _LeftOut(f"parameter group {g} has {key}={value!r}, outside "
                               f"{rule} (finite)")
        if "amsgrad" not in group:
            raise _LeftOut(f"parameter group {g} has no amsgrad entry: not Adam or "
                           f"AdamW (RAdam, NAdam and Adamax keep moments that "
                           f"/optimizer cannot describe)")
        for flag in ("amsgrad", "maximize"):
            if dict.get(group, flag):
                raise _LeftOut(f"parameter group {g} has {flag}=True, which "
                               f"/optimizer cannot describe")
        if "decoupled_weight_decay" in group and values[4] != 0.0 \
                and dict.get(group, "decoupled_weight_decay") is not True:
            raise _LeftOut(f"parameter group {g} has decoupled_weight_decay="
                           f"{describe(dict.get(group, 'decoupled_weight_decay'))} "
                           f"and weight_decay={values[4]!r} (Adam's L2 penalty, "
                           f"not AdamW's decay)")
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
        params = dict.get(group, "params")
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
    sizes = (len(dict.get(groups[0], "params")), len(dict.get(groups[1], "params")))
    if sizes != (len(decay), len(no_decay)):
        raise _LeftOut(f"parameter groups of {sizes[0]} and {sizes[1]} tensors are "
                       f"not nanoGPT's decay/no-decay split ({len(decay)} and "
                       f"{len(no_decay)})")
    return decay + no_decay


def collect_optimizer(optimizer: object, cfg: GPTConfig,
                      limit: Optional[int] = None) -> OptimizerState:
    """Map a torch AdamW state_dict onto canonical names, proving each step.

    Raises :class:`_LeftOut` with the reason when the mapping cannot be
    proven: ids 0..n-1 in order, counts, every moment's shape equal to its
    parameter's, state for all parameters, one step in [0, 2^63), shared
    hyper-parameters, finite and in torch's ranges, of Adam or AdamW (see
    :func:`_group_settings`, which also says what cannot be told apart).
    """
    if not (isinstance(optimizer, dict)
            and isinstance(dict.get(optimizer, "state"), dict)
            and isinstance(dict.get(optimizer, "param_groups"), list)
            and dict.get(optimizer, "param_groups")
            and all(isinstance(g, dict) for g in dict.get(optimizer, "param_groups"))):
        raise _LeftOut("not a torch optimizer state_dict ('state' and "
                       "'param_groups')")
    state, groups = dict.get(optimizer, "state"), dict.get(optimizer, "param_groups")
    if not state:
        raise _LeftOut("the optimizer state is empty (saved before the first step)")
    order = _param_order(groups, cfg)
    beta1, beta2, eps, lr, weight_decay = _group_settings(groups)
    shapes = canonical_shapes(cfg)
    nbytes = 3 * 4 * sum(math.prod(shape) for shape in shapes.values())
    if limit is not None and nbytes > limit:
        raise _LeftOut(f"parameters and moments would take {nbytes} bytes of "
                       f"float32, more than the {limit} allowed for this file")
    moments: Dict[str, Dict[str, Tensor]] = {"exp_avg": {}, "exp_avg_sq": {}}
    steps: Dict[int, str] = {}
    for pid, name in enumerate(order):
        entry = dict.get(state, pid)
        if entry is None:
            raise _LeftOut(f"parameter {pid} ({name}) has no state")
        if not (isinstance(entry, dict) and set(entry) == {"step", "exp_avg", "exp_avg_sq"}):
            what = (", ".join(sorted(_key(k) for k in entry)[:6])
                    if isinstance(entry, dict) else describe(entry))
            raise _LeftOut(f"the state of parameter {pid} ({name}) has {what}, not "
                           f"Adam's step, exp_avg and exp_avg_sq")
        for key, out in moments.items():
            t = dict.get(entry, key)
            if not (isinstance(t, Tensor) and t.is_floating):
                raise _LeftOut(f"{key} of parameter {pid} ({name}) is not a "
                               f"floating tensor")
            if t.shape != shapes[name]:
                raise _LeftOut(f"{key} of parameter {pid} has shape {t.shape}, but "
                               f"the parameter it maps to, {name}, has "
                               f"{shapes[name]}")
            out[name] = t
        step = _real(dict.get(entry, "step"))
        if step is None or not (0 <= step < _INT64_LIMIT and step == int(step)):
            raise _LeftOut(f"the step of parameter {pid} ({name}) is not an "
                           f"integer in [0, 2^63)")
        steps.setdefault(int(step), name)
    extra = set(state) - set(range(len(order)))
    if extra:
        raise _LeftOut(f"state for unknown parameter id "
                       f"{sorted(_key(k) for k in extra)[0]}")
    if len(steps) != 1:
        raise _LeftOut("the parameters have different steps (" + ", ".join(
            f"{s} for {n}" for s, n in sorted(steps.items())) + ")")
    # The moments' values are read here, a block at a time, so that state
    # that cannot be carried over is left out before anything is written.
    for name in order:
        for key, out in moments.items():
            problem = check_values(out[name])
            if problem is not None:
                raise _LeftOut(f"{key} of {name} ({out[name].dtype}) {problem}")
    return OptimizerState(next(iter(steps)), beta1, beta2, eps, weight_decay, lr,
                          moments["exp_avg"], moments["exp_avg_sq"])


# --------------------------------------------------------------------------- #
# Writing
# --------------------------------------------------------------------------- #
class _Guarded:
    """The temporary output file as HDF5 writes it (h5py's file-object
    driver): the first failed write (a full disk, a quota) is kept and every
    later write skipped while reporting success, so that HDF5 closes cleanly;
    :meth:`check` raises the failure.  (HDF5 told of a failed write keeps a
    file it cannot flush, and the process crashes when it is released.)"""

    def __init__(self, fh) -> None:
        self._fh, self.error = fh, None

    def check(self) -> None:
        if self.error is not None:
            raise self.error

    def _guard(self, op, *args):
        if self.error is None:
            try:
                return op(*args)
            except OSError as exc:
                self.error = exc
        return None

    def seek(self, *args):
        return self._fh.seek(*args)

    def tell(self):
        return self._fh.tell()

    def read(self, n=-1):
        return self._fh.read(n)

    def readinto(self, buf):
        return self._fh.readinto(buf)

    def write(self, buf):
        self._guard(self._fh.write, buf)
        return len(buf)

    def truncate(self, size):
        self._guard(self._fh.truncate, size)
        return size

    def flush(self):
        self._guard(self._fh.flush)


def _bad_value(name: str, t: Tensor, problem: str) -> str:
    """The refusal of a tensor whose values cannot be written."""
    return f"tensor {name} ({t.dtype}) {problem}"


def _write_values(group, name: str, t: Tensor, sink: _Guarded, digest,
                  bad: Callable[[str, Tensor, str], str]) -> None:
    """``t`` as the float32 dataset ``group/name`` (contiguous, no filters),
    a block of rows at a time; ``digest`` (if any) takes its bytes."""
    dset = group.create_dataset(name, shape=t.shape, dtype="<f4")
    row = 0
    try:
        for arr in float32_blocks(t):
            if dset.ndim == 0:
                dset[()] = arr
            else:
                dset[row:row + len(arr)] = arr
                row += len(arr)
            if digest is not None:
                digest.update(arr)
            sink.check()
    except BadValues as why:
        raise ConvertError(bad(name, t, str(why))) from None


def _write_tree(f, sink: _Guarded, cfg: GPTConfig, params: Dict[str, Tensor], source_file: str,
                source_sha256: str, iter_num: Optional[int],
                optimizer: Optional[OptimizerState], bad) -> None:
    """The SPEC section 2 layout, into the open h5py file ``f``."""
    f.attrs["format"] = gnh_layout.H5_FORMAT
    f.attrs["format_version"] = np.int64(gnh_layout.H5_FORMAT_VERSION)
    f.attrs["source_file"] = source_file
    f.attrs["source_sha256"] = source_sha256
    if iter_num is not None:
        f.attrs["iter_num"] = np.int64(iter_num)
    c = f.create_group("config")
    if isinstance(cfg, gnh_layout.HFConfig):
        cfg.write_attrs(c.attrs)
    else:
        for key in ("n_layer", "n_head", "n_embd", "block_size", "vocab_size"):
            c.attrs[key] = np.int64(getattr(cfg, key))
        c.attrs["bias"] = np.int64(int(cfg.bias))
        c.attrs["tie_embeddings"] = np.int64(int(cfg.tie_embeddings))
        c.attrs["gelu"] = cfg.gelu
        c.attrs["ln_eps"] = np.float64(cfg.ln_eps)
    # track_order keeps the canonical (creation) order on iteration.
    p = f.create_group("params", track_order=True)
    # param_sha256, the SHA-256 of the flat float32 little-endian vector in
    # canonical order (what the C++ reader computes from the values it reads),
    # taken as the values are written:
    # gnh plans a campaign from it (grouping without reading the values) and
    # checks it against the values whenever it reads them.
    digest = hashlib.sha256()
    for name in gnh_layout.names_of(cfg):
        _write_values(p, name, params[name], sink, digest, bad)
    f.attrs["param_sha256"] = digest.hexdigest()
    if optimizer is not None:
        o = f.create_group("optimizer")
        o.attrs["step"] = np.int64(optimizer.step)
        for key in ("beta1", "beta2", "eps", "weight_decay", "lr"):
            o.attrs[key] = np.float64(getattr(optimizer, key))
        for key in ("exp_avg", "exp_avg_sq"):
            g = o.create_group(key, track_order=True)
            for name in gnh_layout.names_of(cfg):
                _write_values(g, name, getattr(optimizer, key)[name], sink, None,
                              lambda n, t, why, key=key: f"{key} of {n} ({t.dtype}) {why}")


def write_h5(out_path: str, cfg: GPTConfig, params: Dict[str, Tensor],
             source_file: str, source_sha256: str, iter_num: Optional[int],
             optimizer: Optional[OptimizerState] = None,
             bad: Callable[[str, Tensor, str], str] = _bad_value) -> None:
    """Write the checkpoint atomically: a new temporary file, fsync, rename.

    Tensors are read, checked (:func:`float32_blocks`; a bad one is refused
    with ``bad(name, tensor, problem)``) and written a block of rows at a
    time, so that the memory taken is a few blocks whatever the model's size.

    The temporary file is created exclusively (``mkstemp``: a fresh name
    ``<basename(OUT)>.<random>.tmp`` in OUT's directory, O_EXCL, so neither
    an existing file nor a planted symlink is ever opened) and HDF5 writes
    through that very descriptor (h5py's file-object driver); it gets the
    mode a new file would get (0666 less the umask).  ``os.replace`` then
    puts it in OUT's place (a symlink at OUT is replaced, not followed).  On
    any failure only that temporary file is removed.  A full disk or a quota
    fails as an ``OSError`` naming the reason (see :class:`_Guarded`).
    """
    import h5py

    out_dir = os.path.dirname(os.path.abspath(out_path))
    # The name is cut so that the random part and suffix fit in NAME_MAX.
    fd, tmp = tempfile.mkstemp(dir=out_dir, suffix=".tmp",
                               prefix=os.path.basename(out_path)[:200] + ".")
    try:
        with os.fdopen(fd, "w+b", buffering=0) as fh:
            umask = os.umask(0)
            os.umask(umask)
            os.fchmod(fh.fileno(), 0o666 & ~umask)
            sink = _Guarded(fh)
            with h5py.File(sink, "w") as f:
                _write_tree(f, sink, cfg, params, source_file, source_sha256, iter_num,
                            optimizer, bad)
            sink.check()
            os.fsync(fh.fileno())
        os.replace(tmp, out_path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    try:
        dfd = os.open(out_dir, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    except OSError:
        pass  # directory fsync is best effort (not all filesystems allow it)


def _check_not_input(in_path: str, out_path: str) -> None:
    """Refuse an output path that is the input file (by path or by inode)."""
    same = os.path.realpath(out_path) == os.path.realpath(in_path)
    if not same and os.path.exists(out_path) and os.path.exists(in_path):
        try:
            same = os.path.samefile(out_path, in_path)
        except OSError:
            same = False
    if same:
        raise ConvertError(f"the output {out_path} is the input file; refusing "
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
    if os.path.isdir(in_path):
        return convert_hf(in_path, out_path)
    loaded = load_checkpoint(in_path)
    digest, limit = loaded.sha256, output_limit(loaded.size)
    src = split_checkpoint(loaded.obj)
    cfg = resolve_config(src.state, src.model_args, opts)
    params = collect_params(src.state, cfg, limit)
    optimizer, left_out = None, None
    if src.optimizer is not None:
        try:
            optimizer = collect_optimizer(src.optimizer, cfg, limit)
        except _LeftOut as why:
            left_out = f"optimizer state left out: {why}"
    _write(out_path, cfg, params, os.path.basename(in_path), digest, src.iter_num, optimizer)
    if left_out is not None:  # after writing, so that a failure stays one line
        if warn is None:
            print(_one_line(f"{PROG}: warning: {in_path}: {left_out}"), file=sys.stderr)
        else:
            warn(left_out)
    return cfg, _count(params), digest


def _count(params: Dict[str, Tensor]) -> int:
    return int(sum(math.prod(t.shape) for t in params.values()))


def _write(out_path: str, *args, **kwargs) -> None:
    """:func:`write_h5`, its failures as :class:`ConvertError`."""
    try:
        write_h5(out_path, *args, **kwargs)
    except gnh_ptfile.PtFileError as exc:  # a record read while writing
        raise ConvertError(str(exc)) from None
    except OSError as exc:
        raise ConvertError(f"cannot write {out_path}: {exc.strerror or exc}") from None


def convert_hf(in_dir: str, out_path: str) -> Tuple[gnh_layout.HFConfig, int, str]:
    """A Hugging Face checkpoint directory of the Llama or GPT-NeoX family
    (SPEC section 11; gnh_hf) to ``out_path``.  Published checkpoints carry
    no optimizer state: none is written."""
    try:
        cfg = gnh_hf.read_config(in_dir)
        iter_num = gnh_hf.iter_num_of(in_dir)
        state, digest = gnh_hf.read_weights(in_dir)
        params = gnh_hf.collect(state, cfg)
    except gnh_hf.HFError as exc:
        raise ConvertError(str(exc)) from None
    _write(out_path, cfg, params, os.path.basename(os.path.normpath(in_dir)), digest, iter_num, None,
           bad=lambda name, t, why: f"tensor {name} {why}")
    return cfg, _count(params), digest


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
    p.add_argument("input", metavar="IN.pt",
                   help="a nanoGPT checkpoint or state_dict file, or a Hugging Face checkpoint directory "
                        "(Llama or GPT-NeoX family)")
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
        print(_one_line(f"{PROG}: error: {opts.input}: {exc}"), file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        raise
    except Exception as exc:  # never show a traceback to the user
        print(_one_line(f"{PROG}: error: {opts.input}: unexpected "
                        f"{type(exc).__name__}: {exc}"), file=sys.stderr)
        return 1
    print(_one_line(f"{PROG}: {opts.input} -> {opts.output} ({n_params} parameters, "
                    f"sha256 {digest})"))
    return 0
