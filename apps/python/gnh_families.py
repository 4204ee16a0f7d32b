# SPDX-License-Identifier: BSD-3-Clause
"""The Llama and GPT-NeoX families (SPEC section 11) in PyTorch, written from
Hugging Face ``transformers``' published definitions (LlamaForCausalLM,
GPTNeoXForCausalLM): the same modules under the same names, registered in
the same order, so that ``state_dict()`` is a Hugging Face checkpoint's and
:func:`canonical_params` is SPEC section 11's canonical order.  Used as the
float64 reference of the oracle tests and to train the demo campaign's
models; computations run in the parameters' dtype (the reference
implementation's float32 upcasts of RMSNorm and softmax are the identity in
float64 and float32).

Nothing is taken from ``transformers`` itself, which gnh does not need.
"""

from __future__ import annotations

import math
from typing import Dict, List

import torch
import torch.nn as nn
import torch.nn.functional as F

from gnh_layout import HFConfig, hf_canonical_shapes

__all__ = ["CausalLM", "canonical_params", "init_random", "load_h5", "rotate_half", "rotary_cos_sin"]


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """[x1, x2] -> [-x2, x1] over the last dimension (HF's rotate_half)."""
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def rotary_cos_sin(T: int, dim: int, base: float, dtype: torch.dtype):
    """cos and sin (T, dim) of HF's rotary embedding: inv_freq = base^(-2j/dim),
    angles t inv_freq for positions 0..T-1, each repeated twice ([c, c])."""
    inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    freqs = torch.outer(torch.arange(T, dtype=torch.float64), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def _causal_attention(q, k, v):
    """softmax(q k^T / sqrt(hd) + causal mask) v, (B, H, T, hd) each."""
    T, hd = q.shape[-2], q.shape[-1]
    s = q @ k.transpose(-1, -2) / math.sqrt(hd)
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    s = s.masked_fill(~mask, float("-inf"))
    return torch.softmax(s, dim=-1) @ v


class LlamaRMSNorm(nn.Module):
    def __init__(self, d: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.variance_epsilon = eps

    def forward(self, x):
        variance = x.pow(2).mean(-1, keepdim=True)
        return self.weight * (x * torch.rsqrt(variance + self.variance_epsilon))


class LlamaAttention(nn.Module):
    def __init__(self, cfg: HFConfig):
        super().__init__()
        self.cfg = cfg
        d, hd = cfg.hidden_size, cfg.head_dim
        self.q_proj = nn.Linear(d, cfg.num_attention_heads * hd, bias=cfg.qkv_bias)
        self.k_proj = nn.Linear(d, cfg.num_key_value_heads * hd, bias=cfg.qkv_bias)
        self.v_proj = nn.Linear(d, cfg.num_key_value_heads * hd, bias=cfg.qkv_bias)
        self.o_proj = nn.Linear(cfg.num_attention_heads * hd, d, bias=cfg.o_bias)

    def forward(self, x):
        cfg = self.cfg
        B, T, _ = x.shape
        H, G, hd = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        q = self.q_proj(x).view(B, T, H, hd).transpose(1, 2)
        k = self.k_proj(x).view(B, T, G, hd).transpose(1, 2)
        v = self.v_proj(x).view(B, T, G, hd).transpose(1, 2)
        cos, sin = rotary_cos_sin(T, hd, cfg.rope_theta, x.dtype)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        # repeat_kv: query head i reads key/value head i // (H / G).
        k = k.repeat_interleave(H // G, dim=1)
        v = v.repeat_interleave(H // G, dim=1)
        y = _causal_attention(q, k, v).transpose(1, 2).reshape(B, T, H * hd)
        return self.o_proj(y)


class LlamaMLP(nn.Module):
    def __init__(self, cfg: HFConfig):
        super().__init__()
        d, f = cfg.hidden_size, cfg.intermediate_size
        self.gate_proj = nn.Linear(d, f, bias=False)
        self.up_proj = nn.Linear(d, f, bias=False)
        self.down_proj = nn.Linear(f, d, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class LlamaDecoderLayer(nn.Module):
    def __init__(self, cfg: HFConfig):
        super().__init__()
        self.self_attn = LlamaAttention(cfg)
        self.mlp = LlamaMLP(cfg)
        self.input_layernorm = LlamaRMSNorm(cfg.hidden_size, cfg.norm_eps)
        self.post_attention_layernorm = LlamaRMSNorm(cfg.hidden_size, cfg.norm_eps)

    def forward(self, x):
        x = x + self.self_attn(self.input_layernorm(x))
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaModel(nn.Module):
    def __init__(self, cfg: HFConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(LlamaDecoderLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = LlamaRMSNorm(cfg.hidden_size, cfg.norm_eps)

    def forward(self, idx):
        x = self.embed_tokens(idx)
        for layer in self.layers:
            x = layer(x)
        return self.norm(x)


class GPTNeoXAttention(nn.Module):
    def __init__(self, cfg: HFConfig):
        super().__init__()
        self.cfg = cfg
        A = cfg.num_attention_heads * cfg.head_dim
        self.query_key_value = nn.Linear(cfg.hidden_size, 3 * A, bias=cfg.qkv_bias)
        self.dense = nn.Linear(A, cfg.hidden_size, bias=cfg.qkv_bias)

    def forward(self, x):
        cfg = self.cfg
        B, T, _ = x.shape
        H, hd, r = cfg.num_attention_heads, cfg.head_dim, cfg.rotary_dims
        # Each head's rows [q | k | v] of head_dim each.
        qkv = self.query_key_value(x).view(B, T, H, 3 * hd)
        q = qkv[..., :hd].permute(0, 2, 1, 3)
        k = qkv[..., hd:2 * hd].permute(0, 2, 1, 3)
        v = qkv[..., 2 * hd:].permute(0, 2, 1, 3)
        if r > 0:
            cos, sin = rotary_cos_sin(T, r, cfg.rope_theta, x.dtype)
            q = torch.cat((q[..., :r] * cos + rotate_half(q[..., :r]) * sin, q[..., r:]), dim=-1)
            k = torch.cat((k[..., :r] * cos + rotate_half(k[..., :r]) * sin, k[..., r:]), dim=-1)
        y = _causal_attention(q, k, v).permute(0, 2, 1, 3).reshape(B, T, H * hd)
        return self.dense(y)


class GPTNeoXMLP(nn.Module):
    def __init__(self, cfg: HFConfig):
        super().__init__()
        self.dense_h_to_4h = nn.Linear(cfg.hidden_size, cfg.intermediate_size)
        self.dense_4h_to_h = nn.Linear(cfg.intermediate_size, cfg.hidden_size)
        self.approximate = "tanh" if cfg.hidden_act == "gelu_new" else "none"

    def forward(self, x):
        return self.dense_4h_to_h(F.gelu(self.dense_h_to_4h(x), approximate=self.approximate))


class GPTNeoXLayer(nn.Module):
    def __init__(self, cfg: HFConfig):
        super().__init__()
        self.use_parallel_residual = cfg.use_parallel_residual
        self.input_layernorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.norm_eps)
        self.post_attention_layernorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.norm_eps)
        self.attention = GPTNeoXAttention(cfg)
        self.mlp = GPTNeoXMLP(cfg)

    def forward(self, x):
        attn = self.attention(self.input_layernorm(x))
        if self.use_parallel_residual:
            return x + attn + self.mlp(self.post_attention_layernorm(x))
        x = x + attn
        return x + self.mlp(self.post_attention_layernorm(x))


class GPTNeoXModel(nn.Module):
    def __init__(self, cfg: HFConfig):
        super().__init__()
        self.embed_in = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(GPTNeoXLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.final_layer_norm = nn.LayerNorm(cfg.hidden_size, eps=cfg.norm_eps)

    def forward(self, idx):
        x = self.embed_in(idx)
        for layer in self.layers:
            x = layer(x)
        return self.final_layer_norm(x)


class CausalLM(nn.Module):
    """LlamaForCausalLM or GPTNeoXForCausalLM: ``model(idx)`` gives the logits
    (B, T, V); ``model(idx, targets)`` also the mean cross-entropy."""

    def __init__(self, cfg: HFConfig):
        super().__init__()
        self.config = cfg
        if cfg.family == "llama":
            self.model = LlamaModel(cfg)
            emb = self.model.embed_tokens
            head = "lm_head"
        else:
            self.gpt_neox = GPTNeoXModel(cfg)
            emb = self.gpt_neox.embed_in
            head = "embed_out"
        self.head_name = head
        if cfg.tie_word_embeddings:
            object.__setattr__(self, "_tied", emb)  # not a submodule: no second name for the weight
        else:
            setattr(self, head, nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False))

    def head_weight(self):
        return self._tied.weight if self.config.tie_word_embeddings else getattr(self, self.head_name).weight

    def forward(self, idx, targets=None):
        body = self.model if self.config.family == "llama" else self.gpt_neox
        logits = body(idx) @ self.head_weight().t()
        if targets is None:
            return logits
        return logits, F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))


def canonical_params(model: CausalLM) -> List[torch.Tensor]:
    """The parameters in SPEC section 11's canonical order (unique tensors)."""
    named = dict(model.named_parameters())
    return [named[n] for n in hf_canonical_shapes(model.config)]


def canonical_named(model: CausalLM) -> Dict[str, torch.Tensor]:
    """Canonical name -> parameter (live, for autograd), in canonical order."""
    return dict(zip(hf_canonical_shapes(model.config), canonical_params(model)))


def canonical_state(model: CausalLM) -> Dict[str, torch.Tensor]:
    """Canonical name -> tensor (detached), Hugging Face's names."""
    return {n: p.detach() for n, p in zip(hf_canonical_shapes(model.config), canonical_params(model))}


def init_random(model: CausalLM, seed: int, scale: float = 0.3) -> CausalLM:
    """Every parameter uniform in [-scale, scale] around its default (norm
    weights around 1), so that every term of the derivatives is exercised."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in zip(hf_canonical_shapes(model.config), canonical_params(model)):
            base = 1.0 if name.endswith("layernorm.weight") or name.endswith("norm.weight") else 0.0
            p.copy_(base + scale * (2 * torch.rand(p.shape, generator=g, dtype=torch.float64) - 1))
    return model


def load_h5(path: str):
    """A gnh checkpoint of a SPEC section 11 family: (HFConfig, canonical state)."""
    import h5py
    import numpy as np

    with h5py.File(path, "r") as f:
        cfg = HFConfig.from_attrs(f["config"].attrs)
        state = {n: torch.from_numpy(np.array(f["params"][n])) for n in hf_canonical_shapes(cfg)}
    return cfg, state


def load_state(model: CausalLM, state: Dict[str, torch.Tensor]) -> None:
    """Copies a canonical state into the model (in its dtype)."""
    with torch.no_grad():
        for name, p in zip(hf_canonical_shapes(model.config), canonical_params(model)):
            p.copy_(state[name].to(p.dtype))


def init_standard(model: CausalLM, seed: int, std: float = 0.02) -> CausalLM:
    """Initialisation for training, seeded: matrices and embeddings N(0, std²),
    biases zero, norm weights one."""
    g = torch.Generator().manual_seed(int(seed))
    with torch.no_grad():
        for name, p in canonical_named(model).items():
            if name.endswith(".bias"):
                p.zero_()
            elif "norm" in name:
                p.fill_(1.0)
            else:
                p.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype) * std)
    return model
