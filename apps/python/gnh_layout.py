# SPDX-License-Identifier: BSD-3-Clause
"""The gnh model family's configuration and canonical parameter order, without PyTorch.

:class:`GPTConfig`, :func:`canonical_names` and :func:`canonical_shapes`
(SPEC section 1) and the HDF5 format tags (SPEC section 2), shared by
``gnh_model`` (which re-exports them) and the converter, which must run
where PyTorch is not installed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Dict, List, Tuple

import numpy as np

__all__ = ["GPTConfig", "canonical_names", "canonical_shapes", "GELU_KINDS",
           "H5_FORMAT", "H5_FORMAT_VERSION", "HFConfig", "HF_FAMILIES", "hf_canonical_shapes", "names_of"]

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


# --------------------------------------------------------------------------- #
# The Llama and GPT-NeoX families (SPEC section 11)
# --------------------------------------------------------------------------- #
#: The families of SPEC section 11 (``/config`` attribute ``family``).
HF_FAMILIES = ("llama", "gpt-neox")


@dataclass
class HFConfig:
    """Hyper-parameters of a Llama or GPT-NeoX model (SPEC section 11), under
    Hugging Face's names.  ``qkv_bias``/``o_bias`` are the biases of the
    llama projections the converter derives (``attention_bias`` for llama,
    q/k/v only for Qwen2); for gpt-neox ``qkv_bias`` is ``attention_bias``
    (query_key_value and dense).  ``norm_eps`` is rms_norm_eps (llama) or
    layer_norm_eps (gpt-neox); ``rope_theta`` is rotary_emb_base for
    gpt-neox."""

    family: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    max_position_embeddings: int
    num_key_value_heads: int = 0
    head_dim: int = 0
    norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rotary_pct: float = 1.0
    use_parallel_residual: bool = False
    hidden_act: str = "silu"
    tie_word_embeddings: bool = False
    qkv_bias: bool = False
    o_bias: bool = False

    def __post_init__(self) -> None:
        if self.family not in HF_FAMILIES:
            raise ValueError(f"family must be one of {HF_FAMILIES}, got {self.family!r}")
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                     "num_attention_heads", "max_position_embeddings"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
            setattr(self, name, int(value))
        if not self.num_key_value_heads:
            self.num_key_value_heads = self.num_attention_heads
        if not self.head_dim:
            if self.hidden_size % self.num_attention_heads:
                raise ValueError(f"num_attention_heads={self.num_attention_heads} does not divide "
                                 f"hidden_size={self.hidden_size}")
            self.head_dim = self.hidden_size // self.num_attention_heads
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(f"num_key_value_heads={self.num_key_value_heads} does not divide "
                             f"num_attention_heads={self.num_attention_heads}")
        if self.family == "gpt-neox":
            if self.num_key_value_heads != self.num_attention_heads:
                raise ValueError("gpt-neox has as many key/value heads as heads")
            if self.hidden_act not in ("gelu", "gelu_new"):
                raise ValueError(f"hidden_act={self.hidden_act!r} (gpt-neox: gelu or gelu_new)")
        elif self.hidden_act != "silu":
            raise ValueError(f"hidden_act={self.hidden_act!r} (llama: silu)")
        if self.rotary_dims % 2:
            raise ValueError(f"{self.rotary_dims} of head_dim={self.head_dim} dims rotate, an odd "
                             f"number (rotate-half pairs them)")
        for name in ("norm_eps", "rope_theta"):
            value = float(getattr(self, name))
            if not (math.isfinite(value) and value > 0.0):
                raise ValueError(f"{name} must be positive and finite, got {value!r}")
            setattr(self, name, value)
        if not 0.0 <= float(self.rotary_pct) <= 1.0:
            raise ValueError(f"rotary_pct={self.rotary_pct} is not in [0, 1]")
        self.rotary_pct = float(self.rotary_pct)
        for name in ("use_parallel_residual", "tie_word_embeddings", "qkv_bias", "o_bias"):
            setattr(self, name, bool(getattr(self, name)))

    @property
    def block_size(self) -> int:
        """The longest context analysed (nanoGPT's name for it)."""
        return self.max_position_embeddings

    @property
    def rotary_dims(self) -> int:
        """Dims of each head that rotate (HF: all for llama, int(head_dim rotary_pct) for gpt-neox)."""
        if self.family == "llama":
            return self.head_dim
        return int(self.head_dim * self.rotary_pct)

    def write_attrs(self, attrs) -> None:
        """The ``/config`` attributes of SPEC section 11 into an h5py attribute set."""
        attrs["family"] = self.family
        for key in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                    "num_attention_heads", "max_position_embeddings"):
            attrs[key] = np.int64(getattr(self, key))
        attrs["tie_word_embeddings"] = np.int64(int(self.tie_word_embeddings))
        if self.family == "llama":
            attrs["num_key_value_heads"] = np.int64(self.num_key_value_heads)
            attrs["head_dim"] = np.int64(self.head_dim)
            attrs["rms_norm_eps"] = np.float64(self.norm_eps)
            attrs["rope_theta"] = np.float64(self.rope_theta)
            attrs["qkv_bias"] = np.int64(int(self.qkv_bias))
            attrs["o_bias"] = np.int64(int(self.o_bias))
        else:
            attrs["rotary_pct"] = np.float64(self.rotary_pct)
            attrs["rotary_emb_base"] = np.float64(self.rope_theta)
            attrs["layer_norm_eps"] = np.float64(self.norm_eps)
            attrs["use_parallel_residual"] = np.int64(int(self.use_parallel_residual))
            attrs["hidden_act"] = self.hidden_act
            attrs["attention_bias"] = np.int64(int(self.qkv_bias))

    @classmethod
    def from_attrs(cls, attrs) -> "HFConfig":
        """The inverse of :meth:`write_attrs`."""
        def get(key):
            v = attrs[key]
            return v.decode() if isinstance(v, bytes) else v
        family = get("family")
        common = dict(family=family, vocab_size=int(get("vocab_size")), hidden_size=int(get("hidden_size")),
                      intermediate_size=int(get("intermediate_size")),
                      num_hidden_layers=int(get("num_hidden_layers")),
                      num_attention_heads=int(get("num_attention_heads")),
                      max_position_embeddings=int(get("max_position_embeddings")),
                      tie_word_embeddings=bool(get("tie_word_embeddings")))
        if family == "llama":
            return cls(**common, num_key_value_heads=int(get("num_key_value_heads")),
                       head_dim=int(get("head_dim")), norm_eps=float(get("rms_norm_eps")),
                       rope_theta=float(get("rope_theta")), qkv_bias=bool(get("qkv_bias")),
                       o_bias=bool(get("o_bias")))
        return cls(**common, rotary_pct=float(get("rotary_pct")), rope_theta=float(get("rotary_emb_base")),
                   norm_eps=float(get("layer_norm_eps")),
                   use_parallel_residual=bool(get("use_parallel_residual")), hidden_act=str(get("hidden_act")),
                   qkv_bias=bool(get("attention_bias")))


def hf_canonical_shapes(cfg: HFConfig) -> Dict[str, Tuple[int, ...]]:
    """Every canonical name of SPEC section 11, in canonical order, with its shape."""
    d, V, F = cfg.hidden_size, cfg.vocab_size, cfg.intermediate_size
    A, Akv = cfg.num_attention_heads * cfg.head_dim, cfg.num_key_value_heads * cfg.head_dim
    s: Dict[str, Tuple[int, ...]] = {}
    if cfg.family == "llama":
        s["model.embed_tokens.weight"] = (V, d)
        for i in range(cfg.num_hidden_layers):
            p = f"model.layers.{i}."
            for name, out, has_bias in (("q_proj", A, cfg.qkv_bias), ("k_proj", Akv, cfg.qkv_bias),
                                        ("v_proj", Akv, cfg.qkv_bias)):
                s[p + f"self_attn.{name}.weight"] = (out, d)
                if has_bias:
                    s[p + f"self_attn.{name}.bias"] = (out,)
            s[p + "self_attn.o_proj.weight"] = (d, A)
            if cfg.o_bias:
                s[p + "self_attn.o_proj.bias"] = (d,)
            s[p + "mlp.gate_proj.weight"] = (F, d)
            s[p + "mlp.up_proj.weight"] = (F, d)
            s[p + "mlp.down_proj.weight"] = (d, F)
            s[p + "input_layernorm.weight"] = (d,)
            s[p + "post_attention_layernorm.weight"] = (d,)
        s["model.norm.weight"] = (d,)
        if not cfg.tie_word_embeddings:
            s["lm_head.weight"] = (V, d)
        return s
    s["gpt_neox.embed_in.weight"] = (V, d)
    for i in range(cfg.num_hidden_layers):
        p = f"gpt_neox.layers.{i}."
        for ln in ("input_layernorm", "post_attention_layernorm"):
            s[p + ln + ".weight"] = (d,)
            s[p + ln + ".bias"] = (d,)
        s[p + "attention.query_key_value.weight"] = (3 * A, d)
        if cfg.qkv_bias:
            s[p + "attention.query_key_value.bias"] = (3 * A,)
        s[p + "attention.dense.weight"] = (d, A)
        if cfg.qkv_bias:
            s[p + "attention.dense.bias"] = (d,)
        s[p + "mlp.dense_h_to_4h.weight"] = (F, d)
        s[p + "mlp.dense_h_to_4h.bias"] = (F,)
        s[p + "mlp.dense_4h_to_h.weight"] = (d, F)
        s[p + "mlp.dense_4h_to_h.bias"] = (d,)
    s["gpt_neox.final_layer_norm.weight"] = (d,)
    s["gpt_neox.final_layer_norm.bias"] = (d,)
    if not cfg.tie_word_embeddings:
        s["embed_out.weight"] = (V, d)
    return s


def names_of(cfg) -> List[str]:
    """The canonical names of any family's configuration."""
    return list(hf_canonical_shapes(cfg)) if isinstance(cfg, HFConfig) else canonical_names(cfg)
