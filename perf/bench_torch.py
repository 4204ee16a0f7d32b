# SPDX-License-Identifier: BSD-3-Clause
"""The PyTorch reference a user would otherwise run, timed on the same
checkpoint, data, batch and thread count as bench_engine:

  eager gradient            loss.backward() of the batch's summed loss
  eager double backward     g = grad(loss, create_graph=True), then grad(g.v) per direction
  functorch fwd-over-rev    jvp(grad(loss), (theta,), (v,)) per direction

torch 1.13's functorch forward mode fails on the built-in layer_norm, softmax
and cross_entropy, so the functional model below writes those three out with
elementary ops (used for every path, so all three time the same graph).
"""
import os
import statistics
import time

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402

try:
    import functorch  # noqa: E402
except ImportError:  # pragma: no cover - Debian's torch ships it
    functorch = None


def layer_norm(x, w, b, eps):
    mu = x.mean(-1, keepdim=True)
    var = ((x - mu) ** 2).mean(-1, keepdim=True)
    y = (x - mu) / torch.sqrt(var + eps) * w
    return y + b if b is not None else y


def gelu(x, kind):
    if kind == "erf":
        return 0.5 * x * (1.0 + torch.erf(x * 0.7071067811865476))
    return 0.5 * x * (1.0 + torch.tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)))


def loss_sum(params, names, cfg, idx, tgt):
    """Summed token cross-entropy of the GPT of SPEC §1, functional in params."""
    p = dict(zip(names, params))
    B, T = idx.shape
    C, H = cfg.n_embd, cfg.n_head
    hs = C // H
    x = p["transformer.wte.weight"][idx] + p["transformer.wpe.weight"][:T]
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    for i in range(cfg.n_layer):
        q = f"transformer.h.{i}."
        def bias(n):
            return p.get(q + n)
        h = layer_norm(x, p[q + "ln_1.weight"], bias("ln_1.bias"), cfg.ln_eps)
        qkv = h @ p[q + "attn.c_attn.weight"].t()
        if cfg.bias:
            qkv = qkv + p[q + "attn.c_attn.bias"]
        qq, kk, vv = qkv.split(C, dim=2)
        qq = qq.view(B, T, H, hs).transpose(1, 2)
        kk = kk.view(B, T, H, hs).transpose(1, 2)
        vv = vv.view(B, T, H, hs).transpose(1, 2)
        s = (qq @ kk.transpose(-2, -1)) * (1.0 / hs ** 0.5)
        s = s.masked_fill(~mask, float("-inf"))
        s = s - s.max(-1, keepdim=True).values.detach()
        e = torch.exp(s)
        a = (e / e.sum(-1, keepdim=True)) @ vv
        a = a.transpose(1, 2).reshape(B, T, C) @ p[q + "attn.c_proj.weight"].t()
        if cfg.bias:
            a = a + p[q + "attn.c_proj.bias"]
        x = x + a
        h = layer_norm(x, p[q + "ln_2.weight"], bias("ln_2.bias"), cfg.ln_eps)
        f = h @ p[q + "mlp.c_fc.weight"].t()
        if cfg.bias:
            f = f + p[q + "mlp.c_fc.bias"]
        f = gelu(f, cfg.gelu) @ p[q + "mlp.c_proj.weight"].t()
        if cfg.bias:
            f = f + p[q + "mlp.c_proj.bias"]
        x = x + f
    x = layer_norm(x, p["transformer.ln_f.weight"], p.get("transformer.ln_f.bias"), cfg.ln_eps)
    w = p["transformer.wte.weight"] if cfg.tie_embeddings else p["lm_head.weight"]
    z = x @ w.t()
    m = z.max(-1, keepdim=True).values.detach()
    lse = torch.log(torch.exp(z - m).sum(-1)) + m.squeeze(-1)
    picked = z.gather(-1, tgt.unsqueeze(-1)).squeeze(-1)
    return (lse - picked).sum()


def _softmax_rows(s):
    s = s - s.max(-1, keepdim=True).values.detach()
    e = torch.exp(s)
    return e / e.sum(-1, keepdim=True)


def _rotate(x, cos, sin):
    h = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., h:], x[..., :h]), dim=-1) * sin


def _rope(T, dim, base, dtype):
    inv = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    ang = torch.outer(torch.arange(T, dtype=torch.float64), inv)
    emb = torch.cat((ang, ang), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def _causal(q, k, v, mask):
    s = (q @ k.transpose(-2, -1)) * (1.0 / q.shape[-1] ** 0.5)
    return _softmax_rows(s.masked_fill(~mask, float("-inf"))) @ v


def _xent_sum(z, tgt):
    m = z.max(-1, keepdim=True).values.detach()
    lse = torch.log(torch.exp(z - m).sum(-1)) + m.squeeze(-1)
    return (lse - z.gather(-1, tgt.unsqueeze(-1)).squeeze(-1)).sum()


def family_loss_sum(params, names, cfg, idx, tgt):
    """Summed token cross-entropy of a SPEC section 11 model (gnh_layout.HFConfig),
    functional in params and written with elementary ops (functorch's forward
    mode), as Hugging Face defines the families."""
    p = dict(zip(names, params))
    B, T = idx.shape
    H, G, hd = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    mask = torch.ones(T, T, dtype=torch.bool).tril()

    def lin(x, name, bias=True):
        y = x @ p[name + ".weight"].t()
        return y + p[name + ".bias"] if bias and name + ".bias" in p else y

    if cfg.family == "llama":
        def rms(x, w):
            return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + cfg.norm_eps) * w
        cos, sin = _rope(T, hd, cfg.rope_theta, params[0].dtype)
        x = p["model.embed_tokens.weight"][idx]
        for i in range(cfg.num_hidden_layers):
            q = f"model.layers.{i}."
            h = rms(x, p[q + "input_layernorm.weight"])
            qq = _rotate(lin(h, q + "self_attn.q_proj").view(B, T, H, hd).transpose(1, 2), cos, sin)
            kk = _rotate(lin(h, q + "self_attn.k_proj").view(B, T, G, hd).transpose(1, 2), cos, sin)
            vv = lin(h, q + "self_attn.v_proj").view(B, T, G, hd).transpose(1, 2)
            kk, vv = kk.repeat_interleave(H // G, dim=1), vv.repeat_interleave(H // G, dim=1)
            x = x + lin(_causal(qq, kk, vv, mask).transpose(1, 2).reshape(B, T, H * hd), q + "self_attn.o_proj")
            h = rms(x, p[q + "post_attention_layernorm.weight"])
            gate = lin(h, q + "mlp.gate_proj")
            x = x + lin(gate * torch.sigmoid(gate) * lin(h, q + "mlp.up_proj"), q + "mlp.down_proj")
        x = rms(x, p["model.norm.weight"])
        w = p["model.embed_tokens.weight"] if cfg.tie_word_embeddings else p["lm_head.weight"]
        return _xent_sum(x @ w.t(), tgt)
    r = cfg.rotary_dims
    cos, sin = _rope(T, r, cfg.rope_theta, params[0].dtype) if r else (None, None)
    x = p["gpt_neox.embed_in.weight"][idx]
    for i in range(cfg.num_hidden_layers):
        q = f"gpt_neox.layers.{i}."
        h = layer_norm(x, p[q + "input_layernorm.weight"], p[q + "input_layernorm.bias"], cfg.norm_eps)
        qkv = lin(h, q + "attention.query_key_value").view(B, T, H, 3 * hd).transpose(1, 2)
        qq, kk, vv = qkv[..., :hd], qkv[..., hd:2 * hd], qkv[..., 2 * hd:]
        if r:
            qq = torch.cat((_rotate(qq[..., :r], cos, sin), qq[..., r:]), dim=-1)
            kk = torch.cat((_rotate(kk[..., :r], cos, sin), kk[..., r:]), dim=-1)
        a = lin(_causal(qq, kk, vv, mask).transpose(1, 2).reshape(B, T, H * hd), q + "attention.dense")
        m_in = x if cfg.use_parallel_residual else x + a
        h = layer_norm(m_in, p[q + "post_attention_layernorm.weight"], p[q + "post_attention_layernorm.bias"],
                       cfg.norm_eps)
        f = lin(gelu(lin(h, q + "mlp.dense_h_to_4h"), "tanh" if cfg.hidden_act == "gelu_new" else "erf"),
                q + "mlp.dense_4h_to_h")
        x = x + a + f
    x = layer_norm(x, p["gpt_neox.final_layer_norm.weight"], p["gpt_neox.final_layer_norm.bias"], cfg.norm_eps)
    w = p["gpt_neox.embed_in.weight"] if cfg.tie_word_embeddings else p["embed_out.weight"]
    return _xent_sum(x @ w.t(), tgt)


def family_synthetic_case(cfg, directory, n_tokens):
    """synthetic_case for a SPEC section 11 family: a standard-initialised
    model saved as a Hugging Face directory and converted."""
    import numpy as np
    import gnh_convert
    import gnh_families
    import gnh_hf
    from gnh_layout import hf_canonical_shapes
    model = gnh_families.init_standard(gnh_families.CausalLM(cfg), 0)
    hf, h5, tok = (os.path.join(directory, n) for n in ("hf", "m.h5", "tokens.bin"))
    gnh_hf.save_dir(hf, cfg, {n: t.numpy() for n, t in gnh_families.canonical_state(model).items()})
    gnh_convert.convert(hf, h5, gnh_convert.default_options())
    ids = np.random.default_rng(0).integers(0, cfg.vocab_size, size=n_tokens).astype(np.uint16)
    ids.tofile(tok)
    _, state = gnh_families.load_h5(h5)
    return h5, tok, ids, state, list(hf_canonical_shapes(cfg))


def synthetic_case(cfg, directory, n_tokens):
    """A standard-initialised model of cfg (bias-free, tied) saved as a
    nanoGPT checkpoint and converted to gnh's HDF5 in directory, and n_tokens
    random token ids (seed 0) written beside it as uint16: the same inputs
    for both sides of a comparison. Returns (h5 path, token path, ids, the
    converted state, the canonical names). Needs apps/python on sys.path."""
    import numpy as np
    import gnh_convert
    import gnh_model
    model = gnh_model.init_standard(gnh_model.GPT(cfg), 0)
    pt, h5, tok = (os.path.join(directory, n) for n in ("m.pt", "m.h5", "tokens.bin"))
    torch.save({"model": model.state_dict(), "model_args": dict(
        n_layer=cfg.n_layer, n_head=cfg.n_head, n_embd=cfg.n_embd, block_size=cfg.block_size, bias=False,
        vocab_size=cfg.vocab_size, dropout=0)}, pt)
    gnh_convert.convert(pt, h5, gnh_convert.default_options())
    ids = np.random.default_rng(0).integers(0, cfg.vocab_size, size=n_tokens).astype(np.uint16)
    ids.tofile(tok)
    _, state = gnh_model.load_gnh_h5(h5)
    return h5, tok, ids, state, gnh_model.canonical_names(cfg)


def median_seconds(fn, repeats):
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def bench(cfg, state, names, idx, tgt, directions, repeats, dtype=torch.float32,
          passes=("forward", "gradient", "curvature")):
    """The passes named (forward, gradient, curvature at each K of directions),
    each the median of repeats after a warm-up."""
    torch.set_num_threads(1)
    loss_sum = globals()["loss_sum"] if not hasattr(cfg, "family") else family_loss_sum
    params = [state[n].to(dtype).clone().requires_grad_(True) for n in names]
    ntok = idx.numel()
    out = {"context": {"tool": "torch", "version": torch.__version__, "threads": torch.get_num_threads(),
                       "n_params": sum(t.numel() for t in params), "batch": idx.shape[0],
                       "seq_len": idx.shape[1]}}

    def fwd():
        with torch.no_grad():
            loss_sum(params, names, cfg, idx, tgt)

    if "forward" in passes:
        t = median_seconds(fwd, repeats)
        out["forward"] = {"seconds": t, "tokens_per_s": ntok / t}

    def grad():
        g = torch.autograd.grad(loss_sum(params, names, cfg, idx, tgt), params)
        return g

    if "gradient" in passes:
        t = median_seconds(grad, repeats)
        out["gradient"] = {"seconds": t, "tokens_per_s": ntok / t}

    curv = []
    gen = torch.Generator().manual_seed(0)
    for K in (directions if "curvature" in passes else []):
        vs = [[torch.randint(0, 2, t.shape, generator=gen).to(dtype) * 2 - 1 for t in params] for _ in range(K)]

        def double_backward():
            g = torch.autograd.grad(loss_sum(params, names, cfg, idx, tgt), params, create_graph=True)
            quads = []
            for v in vs:
                hv = torch.autograd.grad(g, params, grad_outputs=v, retain_graph=True)
                quads.append(sum((a * b).sum() for a, b in zip(hv, v)))
            return quads

        t = median_seconds(double_backward, repeats)
        curv.append({"method": "eager-double-backward", "K": K, "seconds": t, "seconds_per_direction": t / K})
        if functorch is not None:
            detached = [p.detach() for p in params]

            def f(*ps):
                return loss_sum(list(ps), names, cfg, idx, tgt)

            gfun = functorch.grad(f, argnums=tuple(range(len(detached))))

            def fwd_over_rev():
                quads = []
                for v in vs:
                    _, hv = functorch.jvp(gfun, tuple(detached), tuple(v))
                    quads.append(sum((a * b).sum() for a, b in zip(hv, v)))
                return quads

            t = median_seconds(fwd_over_rev, repeats)
            curv.append({"method": "functorch-forward-over-reverse", "K": K, "seconds": t,
                         "seconds_per_direction": t / K})
    out["curvature"] = curv
    return out
