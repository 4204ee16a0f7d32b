# SPDX-License-Identifier: BSD-3-Clause
"""PyTorch reference implementation of the gnh model family (SPEC sections 1-3).

This module is the Python side's single source of truth for

* the nanoGPT-compatible GPT (:class:`GPTConfig`, :class:`GPT`), with the exact
  nanoGPT ``state_dict`` key names so that nanoGPT checkpoints load unchanged;
* the canonical parameter order of SPEC section 1 (:func:`canonical_names`,
  :func:`canonical_shapes` and :class:`GPTConfig`, re-exported from the
  torch-free ``gnh_layout``; :func:`canonical_state_dict`,
  :func:`load_canonical_state`, :func:`flat_parameters`);
* the HDF5 checkpoint format of SPEC section 2 (:func:`load_gnh_h5`);
* token files and the epoch loss of SPEC section 3 (:func:`load_tokens`,
  :func:`epoch_loss`).

It is used by ``apps/gnh-convert``, ``apps/gnh-demo-campaign`` and by tests
that compare the C++ kernels against PyTorch.  Attention is written out
explicitly (matmul, masked_fill, softmax) rather than with
``scaled_dot_product_attention`` so that double backward and functorch
transforms (jvp, hessian-vector products) work on every PyTorch version.
"""

from __future__ import annotations

import copy
import math
from typing import Dict, Optional, Tuple

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from gnh_layout import (GELU_KINDS, H5_FORMAT, H5_FORMAT_VERSION, GPTConfig,
                        canonical_names, canonical_shapes)

__all__ = [
    "GPTConfig",
    "GPT",
    "canonical_names",
    "canonical_shapes",
    "canonical_state_dict",
    "load_canonical_state",
    "flat_parameters",
    "init_random",
    "init_standard",
    "load_gnh_h5",
    "load_tokens",
    "epoch_loss",
    "GELU_KINDS",
    "H5_FORMAT",
    "H5_FORMAT_VERSION",
]


# --------------------------------------------------------------------------- #
# Model
# --------------------------------------------------------------------------- #
class LayerNorm(nn.Module):
    """LayerNorm over the last dimension with an optional bias.

    ``torch.nn.LayerNorm`` only gained ``bias=False`` in PyTorch 2.1; this
    module keeps the same parameter names (``weight``, ``bias``) on older
    versions.
    """

    def __init__(self, n: int, bias: bool, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))
        self.bias = nn.Parameter(torch.zeros(n)) if bias else None
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, self.weight.shape, self.weight, self.bias, self.eps)


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention, written out explicitly."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        d = cfg.n_embd
        self.n_head = cfg.n_head
        self.c_attn = nn.Linear(d, 3 * d, bias=cfg.bias)
        self.c_proj = nn.Linear(d, d, bias=cfg.bias)
        # True strictly above the diagonal: the future positions to hide.
        # Not persistent, so the state_dict keys stay those of nanoGPT's
        # parameters only.
        future = torch.ones(cfg.block_size, cfg.block_size, dtype=torch.bool).triu(1)
        self.register_buffer("future", future, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, d = x.shape
        h = self.n_head
        q, k, v = self.c_attn(x).split(d, dim=2)
        # (B, T, d) -> (B, h, T, d/h)
        q = q.view(B, T, h, d // h).transpose(1, 2)
        k = k.view(B, T, h, d // h).transpose(1, 2)
        v = v.view(B, T, h, d // h).transpose(1, 2)
        scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(d // h))
        scores = scores.masked_fill(self.future[:T, :T], float("-inf"))
        y = torch.softmax(scores, dim=-1) @ v
        y = y.transpose(1, 2).contiguous().view(B, T, d)
        return self.c_proj(y)


class MLP(nn.Module):
    """Position-wise feed-forward network d -> 4d -> GELU -> d."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        d = cfg.n_embd
        self.c_fc = nn.Linear(d, 4 * d, bias=cfg.bias)
        self.c_proj = nn.Linear(4 * d, d, bias=cfg.bias)
        self.approximate = "tanh" if cfg.gelu == "tanh" else "none"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c_proj(F.gelu(self.c_fc(x), approximate=self.approximate))


class Block(nn.Module):
    """Pre-norm transformer block."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.ln_1 = LayerNorm(cfg.n_embd, cfg.bias, cfg.ln_eps)
        self.attn = CausalSelfAttention(cfg)
        self.ln_2 = LayerNorm(cfg.n_embd, cfg.bias, cfg.ln_eps)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """nanoGPT-compatible GPT without dropout.

    ``state_dict()`` has exactly nanoGPT's keys.  With tied embeddings
    ``lm_head.weight`` *is* ``transformer.wte.weight`` (one Parameter under two
    names, so the state_dict lists both, as nanoGPT's does).
    """

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.config = cfg
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(cfg.vocab_size, cfg.n_embd),
            wpe=nn.Embedding(cfg.block_size, cfg.n_embd),
            h=nn.ModuleList([Block(cfg) for _ in range(cfg.n_layer)]),
            ln_f=LayerNorm(cfg.n_embd, cfg.bias, cfg.ln_eps),
        ))
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.transformer.wte.weight

    def forward(self, idx: torch.Tensor, targets: Optional[torch.Tensor] = None):
        """Return ``logits`` (B, T, V), or ``(logits, loss)`` if ``targets``.

        ``loss`` is the mean cross-entropy over targets >= 0; negative targets
        are ignored.  (If every target is ignored the mean is NaN.)
        """
        B, T = idx.shape
        if T > self.config.block_size:
            raise ValueError(
                f"sequence length {T} exceeds block_size {self.config.block_size}")
        pos = torch.arange(T, device=idx.device)
        x = self.transformer.wte(idx) + self.transformer.wpe(pos)
        for block in self.transformer.h:
            x = block(x)
        x = self.transformer.ln_f(x)
        logits = x @ self.lm_head.weight.t()
        if targets is None:
            return logits
        targets = torch.where(targets < 0, torch.full_like(targets, -1), targets)
        loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)),
                               targets.reshape(-1), ignore_index=-1)
        return logits, loss


# --------------------------------------------------------------------------- #
# Canonical state access
# --------------------------------------------------------------------------- #
def canonical_state_dict(model: GPT) -> "Dict[str, torch.Tensor]":
    """The model's unique tensors keyed by canonical name, in canonical order.

    The tensors are the live parameters (not copies); ``.detach()`` them
    before modifying.
    """
    sd = model.state_dict(keep_vars=True)
    return {name: sd[name] for name in canonical_names(model.config)}


def load_canonical_state(model: GPT, state: "Dict[str, torch.Tensor]") -> None:
    """Copy a canonical state (as from :func:`load_gnh_h5`) into ``model``.

    Every canonical name must be present with the canonical shape, and no
    other name may appear (a tied ``lm_head.weight`` is tolerated only if it
    equals ``transformer.wte.weight``).
    """
    cfg = model.config
    shapes = canonical_shapes(cfg)
    extra = set(state) - set(shapes)
    if cfg.tie_embeddings and "lm_head.weight" in extra:
        if not torch.equal(state["lm_head.weight"], state["transformer.wte.weight"]):
            raise ValueError("lm_head.weight differs from transformer.wte.weight "
                             "but the model ties them")
        extra.discard("lm_head.weight")
    if extra:
        raise ValueError(f"unknown tensor {sorted(extra)[0]}")
    params = model.state_dict(keep_vars=True)
    with torch.no_grad():
        for name, shape in shapes.items():
            if name not in state:
                raise ValueError(f"missing tensor {name}")
            src = state[name]
            if tuple(src.shape) != shape:
                raise ValueError(f"tensor {name} has shape {tuple(src.shape)}, "
                                 f"expected {shape}")
            params[name].copy_(src)


def flat_parameters(model: GPT) -> torch.Tensor:
    """All unique parameters concatenated in canonical order (a copy)."""
    return torch.cat([t.detach().reshape(-1)
                      for t in canonical_state_dict(model).values()])


def init_random(model: GPT, seed: int, scale: float = 0.1) -> GPT:
    """Fill every parameter reproducibly with nontrivial values.

    Meant for tests, where every option (biases, LayerNorm gains, an untied
    head) must influence the result: matrices and embeddings get
    N(0, scale²), LayerNorm weights 1 + N(0, scale²) and biases
    N(0, (scale/2)²).  The values depend only on ``seed``, ``scale`` and the
    configuration (tensors are drawn in canonical order from one CPU
    generator).  Returns ``model``.
    """
    gen = torch.Generator().manual_seed(int(seed))
    with torch.no_grad():
        for name, param in canonical_state_dict(model).items():
            z = torch.randn(param.shape, generator=gen, dtype=torch.float64)
            if name.endswith(".bias"):
                value = 0.5 * scale * z
            elif ".ln_" in name:
                value = 1.0 + scale * z
            else:
                value = scale * z
            param.copy_(value.to(param.dtype))
    return model


def init_standard(model: GPT, seed: int) -> GPT:
    """GPT-2 style initialisation for training, seeded.

    Matrices and embeddings N(0, 0.02²), the residual output projections
    (``attn.c_proj``, ``mlp.c_proj``) N(0, (0.02/sqrt(2 n_layer))²), biases
    zero, LayerNorm weights one.  Returns ``model``.
    """
    gen = torch.Generator().manual_seed(int(seed))
    residual_std = 0.02 / math.sqrt(2 * model.config.n_layer)
    with torch.no_grad():
        for name, param in canonical_state_dict(model).items():
            if name.endswith(".bias"):
                param.zero_()
            elif ".ln_" in name:
                param.fill_(1.0)
            else:
                std = residual_std if name.endswith("c_proj.weight") else 0.02
                param.copy_(torch.randn(param.shape, generator=gen) * std)
    return model


# --------------------------------------------------------------------------- #
# HDF5 checkpoints (SPEC section 2)
# --------------------------------------------------------------------------- #
def _attr_str(value) -> str:
    """Decode an HDF5 string attribute (fixed- or variable-length)."""
    if isinstance(value, np.ndarray) and value.shape == ():
        value = value[()]
    if isinstance(value, (bytes, np.bytes_)):
        return value.decode("utf-8").rstrip("\x00")
    return str(value)


def _attr_int(attrs, key: str, path: str) -> int:
    if key not in attrs:
        raise ValueError(f"{path}: /config lacks attribute {key}")
    value = np.asarray(attrs[key])
    if value.shape != () or not np.issubdtype(value.dtype, np.integer):
        raise ValueError(f"{path}: /config attribute {key} is not an integer scalar")
    return int(value)


def load_gnh_h5(path: str) -> "Tuple[GPTConfig, Dict[str, torch.Tensor]]":
    """Read a gnh HDF5 checkpoint (SPEC section 2).

    Returns ``(config, state)`` where ``state`` maps the canonical names, in
    canonical order, to float32 CPU tensors.  Raises ``ValueError`` with a
    message naming the file (and the tensor) if the file is not a valid
    checkpoint: wrong format, missing/unknown/misshapen tensor, non-float32
    data or NaN/Inf values.
    """
    import h5py  # imported here so the model itself needs no h5py

    with h5py.File(path, "r") as f:
        fmt = _attr_str(f.attrs.get("format", ""))
        if fmt != H5_FORMAT:
            raise ValueError(f"{path}: format attribute is {fmt!r}, "
                             f"expected {H5_FORMAT!r}")
        version = int(np.asarray(f.attrs.get("format_version", -1)))
        if version != H5_FORMAT_VERSION:
            raise ValueError(f"{path}: unsupported format_version {version}")
        if "config" not in f or "params" not in f:
            raise ValueError(f"{path}: missing /config or /params group")
        a = f["config"].attrs
        cfg = GPTConfig(
            n_layer=_attr_int(a, "n_layer", path),
            n_head=_attr_int(a, "n_head", path),
            n_embd=_attr_int(a, "n_embd", path),
            block_size=_attr_int(a, "block_size", path),
            vocab_size=_attr_int(a, "vocab_size", path),
            bias=bool(_attr_int(a, "bias", path)),
            tie_embeddings=bool(_attr_int(a, "tie_embeddings", path)),
            gelu=_attr_str(a.get("gelu", "erf")),
            ln_eps=float(np.asarray(a.get("ln_eps", 1e-5))),
        )
        shapes = canonical_shapes(cfg)
        group = f["params"]
        unknown = sorted(set(group.keys()) - set(shapes))
        if unknown:
            raise ValueError(f"{path}: unknown tensor /params/{unknown[0]}")
        state: Dict[str, torch.Tensor] = {}
        for name, shape in shapes.items():
            if name not in group:
                raise ValueError(f"{path}: missing tensor /params/{name}")
            ds = group[name]
            if ds.shape != shape:
                raise ValueError(f"{path}: tensor {name} has shape {ds.shape}, "
                                 f"expected {shape}")
            if ds.dtype != np.dtype("<f4"):
                raise ValueError(f"{path}: tensor {name} has dtype {ds.dtype}, "
                                 f"expected float32")
            arr = ds[()]
            bad = ~np.isfinite(arr)
            if bad.any():
                raise ValueError(f"{path}: tensor {name} holds {int(bad.sum())} "
                                 f"NaN/Inf values (first at flat index "
                                 f"{int(np.flatnonzero(bad)[0])})")
            state[name] = torch.from_numpy(np.ascontiguousarray(arr))
    return cfg, state


# --------------------------------------------------------------------------- #
# Token data and the epoch loss (SPEC section 3)
# --------------------------------------------------------------------------- #
def load_tokens(path: str, dtype: str = "uint16") -> np.ndarray:
    """Memory-map a flat little-endian token file (``uint16`` or ``uint32``)."""
    if dtype not in ("uint16", "uint32"):
        raise ValueError(f"token dtype must be uint16 or uint32, got {dtype!r}")
    return np.memmap(path, dtype=np.dtype(dtype).newbyteorder("<"), mode="r")


def epoch_loss(model: GPT, tokens_np: np.ndarray, context: int, batch: int,
               dtype: torch.dtype = torch.float32,
               max_blocks: Optional[int] = None) -> Tuple[float, int]:
    """Mean token loss over one epoch of ``tokens_np``, as SPEC section 3.

    With T = ``context`` the epoch has n = floor((N-1)/T) blocks (at most
    ``max_blocks`` if given); block b has inputs tokens[bT .. bT+T-1] and
    targets tokens[bT+1 .. bT+T].  Blocks are evaluated ``batch`` at a time
    in precision ``dtype`` (the model is copied if its dtype differs); the
    per-token losses are summed in float64 and divided by the true target
    count.  Returns ``(loss, tokens)``.  A token id >= vocab_size raises
    ``ValueError`` naming its offset.
    """
    cfg = model.config
    T = int(context)
    if not 1 <= T <= cfg.block_size:
        raise ValueError(f"context {T} must be in 1..block_size={cfg.block_size}")
    if batch < 1:
        raise ValueError(f"batch must be positive, got {batch}")
    tokens_np = np.asarray(tokens_np).reshape(-1)
    N = tokens_np.shape[0]
    n = (N - 1) // T if N > 0 else 0
    if max_blocks is not None:
        n = min(n, int(max_blocks))
    if n <= 0:
        raise ValueError(f"{N} tokens hold no block of context {T}")
    used = tokens_np[: n * T + 1]
    over = np.flatnonzero(used >= cfg.vocab_size)
    if over.size:
        i = int(over[0])
        raise ValueError(f"token id {int(used[i])} at offset {i} is >= "
                         f"vocab_size {cfg.vocab_size}")
    used = torch.from_numpy(used.astype(np.int64))

    param_dtype = next(model.parameters()).dtype
    if param_dtype != dtype:
        model = copy.deepcopy(model).to(dtype)

    total = torch.zeros((), dtype=torch.float64)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            for b0 in range(0, n, batch):
                nb = min(batch, n - b0)
                idx = used[b0 * T: (b0 + nb) * T].view(nb, T)
                tgt = used[b0 * T + 1: (b0 + nb) * T + 1].view(nb, T)
                logits = model(idx)
                per_token = F.cross_entropy(logits.reshape(-1, logits.size(-1)),
                                            tgt.reshape(-1), reduction="none")
                total += per_token.to(torch.float64).sum()
    finally:
        model.train(was_training)
    count = n * T
    return float(total / count), count
