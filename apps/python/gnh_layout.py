# SPDX-License-Identifier: BSD-3-Clause
"""The gnh model family's configuration and canonical parameter order, without PyTorch.

:class:`GPTConfig`, :func:`canonical_names` and :func:`canonical_shapes`
(SPEC section 1) and the HDF5 format tags (SPEC section 2), shared by
``gnh_model`` (which re-exports them) and the converter, which must run
where PyTorch is not installed.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from typing import Dict, List, Tuple

import numpy as np

__all__ = ["GPTConfig", "canonical_names", "canonical_shapes", "GELU_KINDS",
           "H5_FORMAT", "H5_FORMAT_VERSION"]

#: Accepted values of :attr:`GPTConfig.gelu`.
GELU_KINDS = ("erf", "tanh")
#: Value of the root ``format`` attribute of a gnh checkpoint (SPEC section 2).
H5_FORMAT = "gnh-checkpoint"
#: Value of the root ``format_version`` attribute this module reads and writes.
H5_FORMAT_VERSION = 1


# --------------------------------------------------------------------------- #
# Configuration
# --------------------------------------------------------------------------- #
@dataclass
class GPTConfig:
    """Hyper-parameters of one GPT of the model family (SPEC section 1).

    ``bias`` switches the biases of every Linear and LayerNorm on or off;
    ``tie_embeddings`` makes the output head share ``transformer.wte.weight``;
    ``gelu`` is ``"erf"`` (exact, nanoGPT's default) or ``"tanh"``;
    ``ln_eps`` is the LayerNorm epsilon.
    """

    n_layer: int
    n_head: int
    n_embd: int
    block_size: int
    vocab_size: int
    bias: bool = True
    tie_embeddings: bool = True
    gelu: str = "erf"
    ln_eps: float = 1e-5

    def __post_init__(self) -> None:
        for name in ("n_layer", "n_head", "n_embd", "block_size", "vocab_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
                raise ValueError(f"{name} must be an integer, got {value!r}")
            if value < 1:
                raise ValueError(f"{name} must be positive, got {value}")
            setattr(self, name, int(value))
        if self.n_embd % self.n_head != 0:
            raise ValueError(
                f"n_head={self.n_head} does not divide n_embd={self.n_embd}")
        if self.gelu not in GELU_KINDS:
            raise ValueError(f"gelu must be one of {GELU_KINDS}, got {self.gelu!r}")
        eps = float(self.ln_eps)
        if not (math.isfinite(eps) and eps > 0.0):
            raise ValueError(f"ln_eps must be positive and finite, got {self.ln_eps!r}")
        self.ln_eps = eps
        self.bias = bool(self.bias)
        self.tie_embeddings = bool(self.tie_embeddings)

    @property
    def head_size(self) -> int:
        """Width d/h of one attention head."""
        return self.n_embd // self.n_head


# --------------------------------------------------------------------------- #
# Canonical parameter order
# --------------------------------------------------------------------------- #
def canonical_names(cfg: GPTConfig) -> List[str]:
    """Names of the unique parameter tensors in the canonical order of SPEC 1.

    This is nanoGPT's ``state_dict`` order with the tied ``lm_head.weight``
    left out; bias names appear only when ``cfg.bias`` is true.
    """
    names = ["transformer.wte.weight", "transformer.wpe.weight"]

    def add(prefix: str, has_bias: bool) -> None:
        names.append(prefix + ".weight")
        if has_bias:
            names.append(prefix + ".bias")

    for i in range(cfg.n_layer):
        p = f"transformer.h.{i}."
        for sub in ("ln_1", "attn.c_attn", "attn.c_proj", "ln_2",
                    "mlp.c_fc", "mlp.c_proj"):
            add(p + sub, cfg.bias)
    add("transformer.ln_f", cfg.bias)
    if not cfg.tie_embeddings:
        names.append("lm_head.weight")
    return names


def param_sha256(cfg: GPTConfig, params: Dict[str, np.ndarray]) -> str:
    """The content hash gnh groups identical states by: SHA-256 of the flat
    float32 little-endian parameter vector in canonical order (what the C++
    reader computes from the values it reads, and checks against the
    checkpoint's ``param_sha256`` attribute)."""
    h = hashlib.sha256()
    for name in canonical_names(cfg):
        h.update(np.ascontiguousarray(params[name], dtype="<f4").tobytes())
    return h.hexdigest()


def canonical_shapes(cfg: GPTConfig) -> Dict[str, Tuple[int, ...]]:
    """Map every canonical name to its PyTorch shape (Linear: (out, in))."""
    d, V, T = cfg.n_embd, cfg.vocab_size, cfg.block_size
    shapes: Dict[str, Tuple[int, ...]] = {}
    for name in canonical_names(cfg):
        if name == "transformer.wte.weight" or name == "lm_head.weight":
            shape: Tuple[int, ...] = (V, d)
        elif name == "transformer.wpe.weight":
            shape = (T, d)
        elif ".ln_" in name:  # ln_1, ln_2, ln_f weight and bias
            shape = (d,)
        else:
            layer, kind = name.rsplit(".", 1)
            out_in = {
                "attn.c_attn": (3 * d, d),
                "attn.c_proj": (d, d),
                "mlp.c_fc": (4 * d, d),
                "mlp.c_proj": (d, 4 * d),
            }[layer.split(".", 3)[3]]
            shape = out_in if kind == "weight" else (out_in[0],)
        shapes[name] = shape
    return shapes
