# SPDX-License-Identifier: BSD-3-Clause
"""Hugging Face checkpoint directories of the Llama and GPT-NeoX families
(SPEC section 11), without PyTorch or ``transformers``.

:func:`read_config` turns ``config.json`` into an :class:`HFConfig`, refusing
with their names what gnh does not compute (rope_scaling, sliding windows,
mlp_bias, other activations and architectures).  :func:`read_weights` reads
``model.safetensors`` or ``pytorch_model.bin``, either possibly sharded with
its index JSON, through ``gnh_ptfile`` (the allow-listed unpickler: no code
from the file runs), and :func:`convert_dir` writes the gnh checkpoint.
:func:`save_dir` writes such a directory (config.json and safetensors), as
the demo campaign's trainer and the tests do.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from typing import Dict, List, Optional, Tuple

import numpy as np

import gnh_ptfile
from gnh_layout import HFConfig, hf_canonical_shapes
from gnh_ptfile import Tensor, describe, printable

#: config.json architectures and the family they belong to.
ARCHITECTURES = {"LlamaForCausalLM": "llama", "MistralForCausalLM": "llama", "Qwen2ForCausalLM": "llama",
                 "GPTNeoXForCausalLM": "gpt-neox"}
#: Tensors of the reference implementation that are buffers, not parameters.
_BUFFERS = re.compile(r"(^|\.)(rotary_emb\.inv_freq|attention\.bias|attention\.masked_bias)$")
#: Largest config.json or index JSON read (real ones are a few kB to a few MB).
MAX_JSON_BYTES = 64 << 20
_WEIGHT_FILES = (("model.safetensors.index.json", "model.safetensors"),
                 ("pytorch_model.bin.index.json", "pytorch_model.bin"))


class HFError(Exception):
    """A refusal; the message is one line and names the file, key or tensor."""


def _json(path: str) -> dict:
    try:
        if os.path.getsize(path) > MAX_JSON_BYTES:
            raise HFError(f"{os.path.basename(path)}: larger than {MAX_JSON_BYTES} bytes")
        with open(path, "rb") as fh:
            obj = json.loads(fh.read().decode("utf-8"))
    except OSError as exc:
        raise HFError(f"cannot read {os.path.basename(path)}: {exc.strerror or exc}") from None
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise HFError(f"{os.path.basename(path)}: not valid JSON ({printable(exc, 120)})") from None
    if not isinstance(obj, dict):
        raise HFError(f"{os.path.basename(path)}: not a JSON object")
    return obj


def _int(c: dict, key: str, default=None) -> int:
    v = c.get(key, default)
    if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v < 2**31:
        raise HFError(f"config.json: {key} = {describe(v)} is not a positive integer")
    return v


def _real(c: dict, key: str, default) -> float:
    v = c.get(key, default)
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise HFError(f"config.json: {key} = {describe(v)} is not a number")
    return float(v)


def _flag(c: dict, key: str, default: bool) -> bool:
    v = c.get(key, default)
    if not isinstance(v, bool):
        raise HFError(f"config.json: {key} = {describe(v)} is not true or false")
    return v


def _refusals(c: dict, arch: str) -> None:
    """What gnh does not compute, refused by name."""
    if c.get("rope_scaling") is not None:
        raise HFError(f"config.json: rope_scaling = {describe(c['rope_scaling'])} is not supported "
                      f"(only the plain rotary embedding)")
    if arch == "Qwen2ForCausalLM" and c.get("use_sliding_window", False):
        raise HFError("config.json: use_sliding_window = true is not supported (full causal attention only)")
    if arch == "MistralForCausalLM" and c.get("sliding_window") is not None:
        raise HFError(f"config.json: sliding_window = {describe(c['sliding_window'])} is not supported "
                      f"(full causal attention only)")
    if c.get("mlp_bias", False):
        raise HFError("config.json: mlp_bias = true is not supported")


def config_from_json(c: dict) -> HFConfig:
    """The family's hyperparameters from a parsed config.json (defaults as
    ``transformers`` has them)."""
    archs = c.get("architectures")
    if not (isinstance(archs, list) and len(archs) == 1 and isinstance(archs[0], str)):
        raise HFError(f"config.json: architectures = {describe(archs)} (expected one of "
                      f"{', '.join(sorted(ARCHITECTURES))})")
    arch = archs[0]
    if arch not in ARCHITECTURES:
        raise HFError(f"config.json: architecture {printable(arch)} is not supported (expected one of "
                      f"{', '.join(sorted(ARCHITECTURES))})")
    _refusals(c, arch)
    family = ARCHITECTURES[arch]
    heads = _int(c, "num_attention_heads")
    common = dict(family=family, vocab_size=_int(c, "vocab_size"), hidden_size=_int(c, "hidden_size"),
                  intermediate_size=_int(c, "intermediate_size"),
                  num_hidden_layers=_int(c, "num_hidden_layers"), num_attention_heads=heads,
                  max_position_embeddings=_int(c, "max_position_embeddings", 2048))
    if family == "llama":
        act = c.get("hidden_act", "silu")
        attention_bias = _flag(c, "attention_bias", arch == "Qwen2ForCausalLM")
        # Qwen2 has q, k, v biases and none on o_proj; llama's attention_bias is both.
        qkv_bias = True if arch == "Qwen2ForCausalLM" else attention_bias
        o_bias = False if arch == "Qwen2ForCausalLM" else attention_bias
        head_dim = c.get("head_dim")
        cfg = dict(common, num_key_value_heads=_int(c, "num_key_value_heads", heads),
                   head_dim=_int(c, "head_dim") if head_dim is not None else 0,
                   norm_eps=_real(c, "rms_norm_eps", 1e-6), rope_theta=_real(c, "rope_theta", 10000.0),
                   hidden_act=act, tie_word_embeddings=_flag(c, "tie_word_embeddings", False),
                   qkv_bias=qkv_bias, o_bias=o_bias)
    else:
        act = c.get("hidden_act", "gelu")
        cfg = dict(common, rotary_pct=_real(c, "rotary_pct", c.get("partial_rotary_factor", 0.25)),
                   rope_theta=_real(c, "rotary_emb_base", c.get("rope_theta", 10000.0)),
                   norm_eps=_real(c, "layer_norm_eps", 1e-5),
                   use_parallel_residual=_flag(c, "use_parallel_residual", True), hidden_act=act,
                   tie_word_embeddings=_flag(c, "tie_word_embeddings", False),
                   qkv_bias=_flag(c, "attention_bias", True))
    if not isinstance(act, str):
        raise HFError(f"config.json: hidden_act = {describe(act)} is not a name")
    try:
        return HFConfig(**cfg)
    except ValueError as exc:
        raise HFError(f"config.json: {exc}") from None


def read_config(directory: str) -> HFConfig:
    return config_from_json(_json(os.path.join(directory, "config.json")))


def _shard_files(directory: str) -> List[str]:
    """The weight files of the directory: the index's shards, or the single file."""
    for index, single in _WEIGHT_FILES:
        ipath = os.path.join(directory, index)
        if os.path.exists(ipath):
            wm = _json(ipath).get("weight_map")
            if not isinstance(wm, dict) or not wm:
                raise HFError(f"{index}: weight_map is missing or empty")
            files = []
            for name, f in wm.items():
                if not isinstance(f, str) or os.path.basename(f) != f or f in ("", ".", ".."):
                    raise HFError(f"{index}: tensor {printable(name)} maps to {describe(f)}, not a file "
                                  f"of this directory")
                if f not in files:
                    files.append(f)
            return files
        if os.path.exists(os.path.join(directory, single)):
            return [single]
    raise HFError("no model.safetensors or pytorch_model.bin (nor a sharded index) in the directory")


def read_weights(directory: str) -> Tuple[Dict[str, Tensor], str]:
    """Every tensor of the checkpoint's weight files (buffers left out) and a
    digest of config.json and the files' contents."""
    digest = hashlib.sha256()
    with open(os.path.join(directory, "config.json"), "rb") as fh:
        digest.update(hashlib.sha256(fh.read()).digest())
    state: Dict[str, Tensor] = {}
    for f in _shard_files(directory):
        try:
            loaded = gnh_ptfile.load(os.path.join(directory, f))
        except gnh_ptfile.PtFileError as exc:
            raise HFError(f"{f}: {exc}") from None
        digest.update(bytes.fromhex(loaded.sha256))
        obj = loaded.obj
        if isinstance(obj, dict) and "state_dict" in obj and isinstance(obj["state_dict"], dict):
            obj = obj["state_dict"]
        if not isinstance(obj, dict):
            raise HFError(f"{f}: not a mapping of tensor names to tensors")
        for name, t in obj.items():
            if not isinstance(name, str) or not isinstance(t, Tensor):
                raise HFError(f"{f}: entry {describe(name)} is not a named tensor")
            if _BUFFERS.search(name):
                continue
            if name in state:
                raise HFError(f"{f}: tensor {printable(name)} appears in two weight files")
            state[name] = t
    return state, digest.hexdigest()


def collect(state: Dict[str, Tensor], cfg: HFConfig) -> Dict[str, Tensor]:
    """The canonical tensors, each of a floating dtype and its shape (the
    values are checked as they are written); a tied head present in the file
    must equal the embedding."""
    shapes = hf_canonical_shapes(cfg)
    head = "lm_head.weight" if cfg.family == "llama" else "embed_out.weight"
    emb = "model.embed_tokens.weight" if cfg.family == "llama" else "gpt_neox.embed_in.weight"
    extra = dict(state)
    if cfg.tie_word_embeddings and head in extra:
        h, e = extra.pop(head), state.get(emb)
        if e is None or not gnh_ptfile.equal(h, e):
            raise HFError(f"tensor {head} differs from {emb} although tie_word_embeddings is true")
    for name in shapes:
        if name not in extra:
            raise HFError(f"missing tensor {name} (config.json: {cfg.family}, "
                          f"{cfg.num_hidden_layers} layers)")
    unknown = sorted(n for n in extra if n not in shapes)
    if unknown:
        raise HFError(f"unknown tensor {printable(unknown[0])} for the {cfg.family} configuration of "
                      f"config.json" + (f" (and {len(unknown) - 1} more)" if len(unknown) > 1 else ""))
    out: Dict[str, Tensor] = {}
    for name, shape in shapes.items():
        t = extra[name]
        if t.dtype not in ("float32", "float16", "bfloat16", "float64"):
            raise HFError(f"tensor {name}: dtype {t.dtype} is not floating point")
        if tuple(t.shape) != shape:
            raise HFError(f"tensor {name} has shape {tuple(t.shape)}, config.json gives {shape}")
        out[name] = t
    return out


def iter_num_of(directory: str) -> Optional[int]:
    """The training step of a checkpoint directory: from its name, like
    ``step1000``, ``checkpoint-1000`` or ``...-step1000`` (Pythia's revisions,
    the HF Trainer's checkpoints), and from the ``global_step`` of its
    ``trainer_state.json`` (the HF Trainer's); where both say, they must agree."""
    m = re.search(r"(?:step|checkpoint-)(\d{1,18})$", os.path.basename(os.path.normpath(directory)))
    named = int(m.group(1)) if m else None
    path = os.path.join(directory, "trainer_state.json")
    if not os.path.exists(path):
        return named
    step = _json(path).get("global_step")
    if isinstance(step, bool) or not isinstance(step, int) or not 0 <= step < 2**63:
        raise HFError(f"trainer_state.json: global_step = {describe(step)} is not an integer in [0, 2^63)")
    if named is not None and named != step:
        raise HFError(f"trainer_state.json: global_step = {step}, but the directory's name says step {named}")
    return step


# --------------------------------------------------------------------------- #
# Writing (the demo campaign's trainer and the tests)
# --------------------------------------------------------------------------- #
def config_json(cfg: HFConfig) -> dict:
    """A config.json for ``cfg`` as ``transformers`` writes one."""
    c = dict(vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
             num_hidden_layers=cfg.num_hidden_layers, num_attention_heads=cfg.num_attention_heads,
             max_position_embeddings=cfg.max_position_embeddings, hidden_act=cfg.hidden_act,
             tie_word_embeddings=cfg.tie_word_embeddings, torch_dtype="float32")
    if cfg.family == "llama":
        arch = "Qwen2ForCausalLM" if cfg.qkv_bias and not cfg.o_bias else "LlamaForCausalLM"
        c.update(architectures=[arch], model_type="qwen2" if arch.startswith("Qwen2") else "llama",
                 num_key_value_heads=cfg.num_key_value_heads, head_dim=cfg.head_dim, rms_norm_eps=cfg.norm_eps,
                 rope_theta=cfg.rope_theta, rope_scaling=None, mlp_bias=False)
        if arch == "LlamaForCausalLM":
            c["attention_bias"] = cfg.qkv_bias
        else:
            c["use_sliding_window"] = False
    else:
        c.update(architectures=["GPTNeoXForCausalLM"], model_type="gpt_neox", rotary_pct=cfg.rotary_pct,
                 rotary_emb_base=cfg.rope_theta, layer_norm_eps=cfg.norm_eps,
                 use_parallel_residual=cfg.use_parallel_residual, attention_bias=cfg.qkv_bias)
    return c


def _bf16_bits(a: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bit patterns, rounded to nearest even."""
    u = np.ascontiguousarray(a, dtype="<f4").view("<u4").astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype("<u2")


def safetensors_bytes(tensors: Dict[str, np.ndarray], dtype: str = "F32") -> bytes:
    """A safetensors file of float32 arrays stored as F32, F16 or BF16."""
    header, blobs, off = {}, [], 0
    for name, a in tensors.items():
        if dtype == "BF16":
            raw = _bf16_bits(a).tobytes()
        else:
            raw = np.ascontiguousarray(a, dtype={"F32": "<f4", "F16": "<f2"}[dtype]).tobytes()
        header[name] = {"dtype": dtype, "shape": list(a.shape), "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    return len(h).to_bytes(8, "little") + h + b"".join(blobs)


def save_dir(directory: str, cfg: HFConfig, state: Dict[str, np.ndarray], dtype: str = "F32",
             shards: int = 1) -> None:
    """config.json and the weights as model.safetensors, or as ``shards``
    files with model.safetensors.index.json."""
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, "config.json"), "w") as fh:
        json.dump(config_json(cfg), fh, indent=2)
    names = list(state)
    if shards <= 1:
        with open(os.path.join(directory, "model.safetensors"), "wb") as fh:
            fh.write(safetensors_bytes(state, dtype))
        return
    weight_map = {}
    for s in range(shards):
        part = names[s::shards]
        fname = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        with open(os.path.join(directory, fname), "wb") as fh:
            fh.write(safetensors_bytes({n: state[n] for n in part}, dtype))
        weight_map.update({n: fname for n in part})
    with open(os.path.join(directory, "model.safetensors.index.json"), "w") as fh:
        json.dump({"metadata": {}, "weight_map": weight_map}, fh, indent=2)
