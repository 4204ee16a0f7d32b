# SPDX-License-Identifier: BSD-3-Clause
"""Independent PyTorch reference for every per-case statistic of SPEC §4.

For one checkpoint (gnh HDF5, SPEC §2) and one token file (SPEC §3) this
module computes, in float64 PyTorch with double backward and without any of
gnh's C++ code, the epoch loss L, G = ∇L, GᵀHG, the per-noise-sample
quantities (|g_j|², |ξ_j|², G·ξ_j, ξ_jᵀHξ_j), the Rademacher vᵀHv of SPEC §4's
generator and the derived quantities (tr Σ, B_simple, tr HΣ, B_noise, tr H,
GᵀHG/|G|², ε*), each with its standard error.

Public API::

    splitmix64(x) -> int
    rademacher(seed, k, n) -> np.ndarray            # SPEC §4 direction v_k
    noise_batches(n_blocks, noise_batch, noise_samples, seed) -> list[list[int]]
    reference_statistics(ckpt_h5, tokens_path, context, noise_samples,
                         noise_batch, directions, seed, dtype="uint16",
                         max_blocks=0) -> dict
    load_reference(ckpt_h5, tokens_path, context, dtype="uint16", max_blocks=0)
        -> EpochReference                         # loss, gradient, H v, v^T H v
    statistics_of(ref, noise_samples, noise_batch, directions, seed) -> dict
    derived_statistics(n_blocks, noise_batch, G_sqnorm, GHG, xi_sqnorm, xiHxi, vHv)

Conventions (SPEC §3-§4): block b has inputs tokens[bT .. bT+T-1] and targets
tokens[bT+1 .. bT+T]; the epoch is blocks 0 .. n-1, n = floor((N-1)/T) capped
by ``max_blocks`` when > 0. Every gradient and Hessian is that of a *mean*
token loss: the per-batch summed losses (and their derivatives) are added up
and divided by the true target count at the end. H is always the Hessian of
the epoch-mean loss over all n blocks; it is applied by Hessian-vector
products (Pearlmutter, double backward) batch by batch.
"""

import math
import os
import re
import sys

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

_HERE = os.path.dirname(os.path.realpath(__file__))
_PY = os.path.join(os.path.dirname(os.path.dirname(_HERE)), "apps", "python")
if _PY not in sys.path:
    sys.path.insert(0, _PY)

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import gnh_families  # noqa: E402
import gnh_model  # noqa: E402

torch.set_num_threads(1)

__all__ = ["MASK64", "NOISE_SALT", "splitmix64", "rademacher", "noise_batches",
           "reference_statistics", "EpochReference", "load_reference", "statistics_of",
           "derived_statistics", "partitions", "block_statistics", "adam_preconditioner",
           "preconditioned_statistics", "update_statistics"]

MASK64 = (1 << 64) - 1
#: Salt of the noise-batch key ("noise" in ASCII, left-aligned).
NOISE_SALT = 0x6E6F697365000000


# --------------------------------------------------------------------------- #
# SPEC §4 generators
# --------------------------------------------------------------------------- #
def splitmix64(x: int) -> int:
    """SPEC §4's splitmix64 of one 64-bit word (Python ints, masked mod 2^64)."""
    x = (int(x) + 0x9E3779B97F4A7C15) & MASK64
    z = x
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)


def rademacher(seed: int, k: int, n: int) -> np.ndarray:
    """v_k of SPEC §4 (length n, entries ±1.0, float64).

    key_k = splitmix64(s ^ splitmix64(k)); v_k[i] = +1 if the top bit of
    splitmix64(key_k ^ i) is 0, else -1. Vectorised with numpy's wrapping
    uint64 arithmetic.
    """
    key = splitmix64((int(seed) & MASK64) ^ splitmix64(int(k) & MASK64))
    with np.errstate(over="ignore"):
        x = np.uint64(key) ^ np.arange(n, dtype=np.uint64)
        x = x + np.uint64(0x9E3779B97F4A7C15)
        z = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    return np.where((z >> np.uint64(63)) == 0, 1.0, -1.0)


def noise_batches(n_blocks: int, noise_batch: int, noise_samples: int, seed: int):
    """The noise batches gnh draws: ``m`` sorted, pairwise disjoint lists of
    ``noise_batch`` block indices in [0, n_blocks).

    m = min(noise_samples, n_blocks // noise_batch); key =
    splitmix64(seed ^ 0x6E6F697365000000); a Fisher-Yates shuffle of
    0 .. n_blocks-1 that, for i = n_blocks-1 down to 1, swaps perm[i] with
    perm[splitmix64(key ^ i) % (i + 1)]; batch j is
    sorted(perm[j*B:(j+1)*B]).
    """
    n_blocks, B, samples = int(n_blocks), int(noise_batch), int(noise_samples)
    if n_blocks < 0:
        raise ValueError(f"n_blocks must be >= 0, got {n_blocks}")
    if B < 1:
        raise ValueError(f"noise_batch must be >= 1, got {B}")
    if samples < 0:
        raise ValueError(f"noise_samples must be >= 0, got {samples}")
    m = min(samples, n_blocks // B)
    key = splitmix64((int(seed) & MASK64) ^ NOISE_SALT)
    perm = list(range(n_blocks))
    for i in range(n_blocks - 1, 0, -1):
        j = splitmix64(key ^ i) % (i + 1)
        perm[i], perm[j] = perm[j], perm[i]
    return [sorted(perm[j * B:(j + 1) * B]) for j in range(m)]


# --------------------------------------------------------------------------- #
# Every model family (SPEC sections 1 and 11)
# --------------------------------------------------------------------------- #
def load_model(ckpt_h5):
    """The float64 PyTorch model of a gnh checkpoint of any family."""
    import h5py
    with h5py.File(ckpt_h5, "r") as f:
        family = f["config"].attrs.get("family", "nanogpt")
    family = family.decode() if isinstance(family, bytes) else str(family)
    if family == "nanogpt":
        cfg, state = gnh_model.load_gnh_h5(ckpt_h5)
        model = gnh_model.GPT(cfg).double()
        gnh_model.load_canonical_state(model, {k: v.double() for k, v in state.items()})
        return model
    cfg, state = gnh_families.load_h5(ckpt_h5)
    model = gnh_families.CausalLM(cfg).double()
    gnh_families.load_state(model, state)
    return model


def canonical_named(model):
    """Canonical name -> live parameter, in SPEC's canonical order."""
    if isinstance(model, gnh_families.CausalLM):
        return gnh_families.canonical_named(model)
    return gnh_model.canonical_state_dict(model)


# --------------------------------------------------------------------------- #
# Double-backward building blocks
# --------------------------------------------------------------------------- #
class EpochReference:
    """Float64 loss, gradients and Hessian quadratic forms over token blocks.

    ``model`` is a :class:`gnh_model.GPT` (converted to float64 in place of a
    copy); ``ids`` the flat token ids. ``params`` are the unique parameters in
    canonical order, so a flat vector here is laid out as SPEC §1's flat
    parameter vector.
    """

    def __init__(self, model, ids, context: int, max_blocks: int = 0, batch: int = 4):
        cfg = model.config
        T = int(context)
        if not 1 <= T <= cfg.block_size:
            raise ValueError(f"context {T} must be in 1..block_size={cfg.block_size}")
        ids = np.asarray(ids).reshape(-1)
        N = ids.shape[0]
        n = (N - 1) // T if N > 0 else 0
        if max_blocks and max_blocks > 0:
            n = min(n, int(max_blocks))
        if n <= 0:
            raise ValueError(f"{N} tokens hold no block of context {T}")
        used = ids[: n * T + 1].astype(np.int64)
        over = np.flatnonzero((used >= cfg.vocab_size) | (used < 0))
        if over.size:
            i = int(over[0])
            raise ValueError(f"token id {int(used[i])} at offset {i} is outside "
                             f"0..vocab_size-1 (vocab_size {cfg.vocab_size})")
        self.model = model.double()
        self.model.eval()
        self.params = list(canonical_named(self.model).values())
        self.P = sum(p.numel() for p in self.params)
        self.ids = torch.from_numpy(used)
        self.T = T
        self.n = n
        self.batch = int(batch)

    # -- plumbing ---------------------------------------------------------- #
    def _chunks(self, blocks, size=None):
        size = self.batch if size is None else int(size)
        blocks = [int(b) for b in blocks]
        T = self.T
        for i in range(0, len(blocks), size):
            part = blocks[i:i + size]
            idx = torch.stack([self.ids[b * T:(b + 1) * T] for b in part])
            tgt = torch.stack([self.ids[b * T + 1:(b + 1) * T + 1] for b in part])
            yield idx, tgt

    def _loss_sum(self, idx, tgt):
        logits = self.model(idx)
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)), tgt.reshape(-1),
                               reduction="sum")

    @staticmethod
    def _flat(ts):
        return torch.cat([t.reshape(-1) for t in ts])

    def flat_params(self) -> torch.Tensor:
        return self._flat([p.detach() for p in self.params]).clone()

    def set_flat_params(self, theta: torch.Tensor) -> None:
        with torch.no_grad():
            off = 0
            for p in self.params:
                p.copy_(theta[off:off + p.numel()].view_as(p))
                off += p.numel()

    # -- first order ------------------------------------------------------- #
    def loss(self, blocks=None) -> float:
        """Mean token loss over ``blocks`` (default: the whole epoch)."""
        blocks = range(self.n) if blocks is None else blocks
        total, count = 0.0, 0
        with torch.no_grad():
            for idx, tgt in self._chunks(blocks):
                total += float(self._loss_sum(idx, tgt))
                count += tgt.numel()
        return total / count

    def gradient(self, blocks=None):
        """(mean token loss, its flat gradient) over ``blocks`` (default: epoch)."""
        blocks = range(self.n) if blocks is None else blocks
        g = torch.zeros(self.P, dtype=torch.float64)
        total, count = 0.0, 0
        for idx, tgt in self._chunks(blocks):
            ls = self._loss_sum(idx, tgt)
            g += self._flat(torch.autograd.grad(ls, self.params))
            total += float(ls.detach())
            count += tgt.numel()
        return total / count, g / count

    # -- second order ------------------------------------------------------ #
    def _hvps(self, g, V, batched):
        """H_b V for the rows of V (K, P), g = ∇ of a batch's summed loss
        with its graph kept."""
        if batched:
            try:
                hv = torch.autograd.grad(g, self.params, grad_outputs=V,
                                         is_grads_batched=True, retain_graph=True)
                return torch.cat([h.reshape(V.shape[0], -1) for h in hv], 1)
            except RuntimeError:  # no batching rule on this torch: loop instead
                pass
        rows = [self._flat(torch.autograd.grad(g, self.params, grad_outputs=v,
                                               retain_graph=True)) for v in V]
        return torch.stack(rows)

    def quad_forms(self, V, batched=True, hvp_batch=None, chunk=64):
        """vᵀHv of the epoch-mean loss for each row v of V (K, P).

        Returns (q, abs_sum): q[k] = Σ_b v_kᵀH_b v_k / count and
        abs_sum[k] = Σ_b |v_kᵀH_b v_k| / count, H_b the Hessian of batch b's
        summed token loss, over the epoch's batches of ``hvp_batch`` blocks.
        One forward/backward with create_graph per batch serves all K rows.
        """
        V = torch.as_tensor(V, dtype=torch.float64)
        if V.dim() == 1:
            V = V.unsqueeze(0)
        K = V.shape[0]
        q = torch.zeros(K, dtype=torch.float64)
        a = torch.zeros(K, dtype=torch.float64)
        count = 0
        if K == 0:
            return q.numpy(), a.numpy()
        for idx, tgt in self._chunks(range(self.n), hvp_batch):
            ls = self._loss_sum(idx, tgt)
            g = self._flat(torch.autograd.grad(ls, self.params, create_graph=True))
            for c in range(0, K, chunk):
                Vc = V[c:c + chunk]
                qb = (self._hvps(g, Vc, batched).detach() * Vc).sum(1)
                q[c:c + chunk] += qb
                a[c:c + chunk] += qb.abs()
            count += tgt.numel()
            del g, ls
        return (q / count).numpy(), (a / count).numpy()

    def gauss_newton_forms(self, V):
        """vᵀGGNv of the epoch-mean loss for each row v of V, from the
        definition GGN = Jᵀ H_z J: J v by double backward (J v = d/du (Jᵀu · v)),
        then per token (J v)ᵀ(diag(p) − p pᵀ)(J v), summed over the epoch."""
        V = torch.as_tensor(V, dtype=torch.float64)
        q = torch.zeros(V.shape[0], dtype=torch.float64)
        count = 0
        for idx, tgt in self._chunks(range(self.n)):
            logits = self.model(idx)
            u = torch.zeros_like(logits, requires_grad=True)
            jtu = self._flat(torch.autograd.grad(logits, self.params, u, create_graph=True))
            p = torch.softmax(logits.detach(), dim=-1)
            for k, v in enumerate(V):
                jv = torch.autograd.grad(jtu @ v, u, retain_graph=True)[0]
                q[k] += float(((p * jv * jv).sum(-1) - (p * jv).sum(-1) ** 2).sum())
            count += tgt.numel()
        return (q / count).numpy()

    def gauss_newton_product(self, v):
        """GGN v of the epoch-mean loss from the definition: J v by double
        backward, H_z = diag(p) - p p^T per token, then J^T by backward."""
        v = torch.as_tensor(v, dtype=torch.float64)
        out = torch.zeros(self.P, dtype=torch.float64)
        count = 0
        for idx, tgt in self._chunks(range(self.n)):
            logits = self.model(idx)
            u = torch.zeros_like(logits, requires_grad=True)
            jtu = self._flat(torch.autograd.grad(logits, self.params, u, create_graph=True))
            jv = torch.autograd.grad(jtu @ v, u)[0]
            p = torch.softmax(logits.detach(), dim=-1)
            hz = p * jv - p * (p * jv).sum(-1, keepdim=True)
            out += self._flat(torch.autograd.grad(logits, self.params, hz))
            count += tgt.numel()
        return out / count

    def hvp(self, v, hvp_batch=None):
        """H v of the epoch-mean loss (flat, float64 tensor)."""
        v = torch.as_tensor(v, dtype=torch.float64)
        hv = torch.zeros(self.P, dtype=torch.float64)
        count = 0
        for idx, tgt in self._chunks(range(self.n), hvp_batch):
            ls = self._loss_sum(idx, tgt)
            g = self._flat(torch.autograd.grad(ls, self.params, create_graph=True))
            hv += self._flat(torch.autograd.grad(g, self.params, grad_outputs=v))
            count += tgt.numel()
        return hv / count


# --------------------------------------------------------------------------- #
# Derived statistics
# --------------------------------------------------------------------------- #
def _mean_se(x):
    """(mean, sd(ddof=1)/sqrt(len)); mean NaN when empty, SE NaN (not
    estimable) when len < 2."""
    x = np.asarray(x, dtype=np.float64)
    if x.size == 0:
        return float("nan"), float("nan")
    mean = float(x.mean())
    if x.size < 2:
        return mean, float("nan")
    return mean, float(x.std(ddof=1) / math.sqrt(x.size))


def derived_statistics(n_blocks, noise_batch, G_sqnorm, GHG, xi_sqnorm, xiHxi, vHv):
    """The derived quantities of SPEC §4 from the raw ones.

    B = noise_batch, f = (n-1)/(n-B) (NaN when n <= B), m = len(xi_sqnorm),
    SE = sd(ddof=1)/sqrt(count), NaN when count < 2: trace_sigma =
    B f mean|xi|^2, B_simple = trace_sigma/|G|^2, trace_HSigma =
    B f mean xi^T H xi, B_noise = trace_HSigma/G^T H G (SE over |G^T H G|),
    trace_H = mean v^T H v, GHG_over_G_sqnorm, eps_star = |G|^2/G^T H G.
    With no noise sample the four noise quantities and their SEs are NaN; with
    no direction trace_H and its SE are NaN.
    """
    n, B = int(n_blocks), int(noise_batch)
    # Finite-population correction for B of n blocks drawn without replacement;
    # undefined (NaN) when n <= B (one batch would be the whole epoch).
    f = (n - 1) / (n - B) if n > B else float("nan")
    xs_mean, xs_se = _mean_se(xi_sqnorm)
    xh_mean, xh_se = _mean_se(xiHxi)
    vh_mean, vh_se = _mean_se(vHv)
    out = {}
    out["fpc"] = f
    out["trace_sigma"] = B * f * xs_mean
    out["trace_sigma_se"] = B * f * xs_se
    out["B_simple"] = out["trace_sigma"] / G_sqnorm
    out["B_simple_se"] = out["trace_sigma_se"] / G_sqnorm
    out["trace_HSigma"] = B * f * xh_mean
    out["trace_HSigma_se"] = B * f * xh_se
    out["B_noise"] = out["trace_HSigma"] / GHG
    out["B_noise_se"] = out["trace_HSigma_se"] / abs(GHG)
    if len(xi_sqnorm) == 0:  # no noise sample: values and SEs NaN
        for k in ("trace_sigma", "B_simple", "trace_HSigma", "B_noise"):
            out[k], out[k + "_se"] = float("nan"), float("nan")
    out["trace_H"] = vh_mean
    out["trace_H_se"] = vh_se
    out["GHG_over_G_sqnorm"] = GHG / G_sqnorm
    out["eps_star"] = G_sqnorm / GHG
    return out


# --------------------------------------------------------------------------- #
# Everything for one checkpoint and one token file
# --------------------------------------------------------------------------- #
def load_reference(ckpt_h5, tokens_path, context, dtype="uint16", max_blocks=0, batch=4):
    """An :class:`EpochReference` for a gnh HDF5 checkpoint and a token file."""
    model = load_model(ckpt_h5)
    ids = np.asarray(gnh_model.load_tokens(tokens_path, dtype))
    try:
        return EpochReference(model, ids, context, max_blocks, batch)
    except ValueError as e:
        raise ValueError(f"{tokens_path}: {e}") from None


def statistics_of(ref, noise_samples, noise_batch, directions, seed, batched=True):
    """:func:`reference_statistics` on a ready :class:`EpochReference`."""
    n = ref.n
    blocks = noise_batches(n, noise_batch, noise_samples, seed)
    m = len(blocks)
    K = int(directions)
    if K < 0:
        raise ValueError(f"directions must be >= 0, got {K}")

    loss, G = ref.gradient()
    gs = [ref.gradient(b)[1] for b in blocks]
    xis = [g - G for g in gs]
    vs = [torch.from_numpy(rademacher(seed, k, ref.P)) for k in range(K)]

    V = torch.stack([G] + xis + vs)
    q, a = ref.quad_forms(V, batched=batched)

    Gn = G.numpy().copy()
    out = {
        "n_blocks": n,
        "tokens": n * ref.T,
        "P": ref.P,
        "loss": loss,
        "G": Gn,
        "G_sqnorm": float(G @ G),
        "GHG": float(q[0]),
        "GHG_abs": float(a[0]),
        "noise_blocks": blocks,
        "noise_batch": int(noise_batch),
        "gB": (torch.stack(gs).numpy().copy() if m else np.zeros((0, ref.P))),
        "gB_sqnorm": np.array([float(g @ g) for g in gs]),
        "xi_sqnorm": np.array([float(x @ x) for x in xis]),
        "G_dot_xi": np.array([float(G @ x) for x in xis]),
        "xiHxi": q[1:1 + m].copy(),
        "xiHxi_abs": a[1:1 + m].copy(),
        "vHv": q[1 + m:].copy(),
        "vHv_abs": a[1 + m:].copy(),
    }
    out.update(derived_statistics(n, noise_batch, out["G_sqnorm"], out["GHG"],
                                  out["xi_sqnorm"], out["xiHxi"], out["vHv"]))
    # Batch sizes in tokens as well as sequences (SPEC §4).
    for k in ("B_simple", "B_noise"):
        out[k + "_tokens"] = out[k] * ref.T
        out[k + "_tokens_se"] = out[k + "_se"] * ref.T
    return out


def reference_statistics(ckpt_h5: str, tokens_path: str, context: int, noise_samples: int,
                         noise_batch: int, directions: int, seed: int, dtype="uint16",
                         max_blocks=0) -> dict:
    """Every per-case statistic of SPEC §4, in float64 PyTorch.

    Keys: ``n_blocks``, ``tokens``, ``P``, ``loss``, ``G`` (flat, canonical
    order), ``G_sqnorm``, ``GHG``, ``GHG_abs``; ``noise_blocks`` (the batches
    of :func:`noise_batches`), ``gB`` (m, P: the g_j) and, per sample,
    arrays ``gB_sqnorm``,
    ``xi_sqnorm``, ``G_dot_xi``, ``xiHxi``, ``xiHxi_abs``; per direction
    ``vHv``, ``vHv_abs``; derived ``fpc``, ``trace_sigma``(``_se``),
    ``B_simple``(``_se``), ``trace_HSigma``(``_se``), ``B_noise``(``_se``),
    ``trace_H``(``_se``), ``GHG_over_G_sqnorm``, ``eps_star``,
    ``B_simple_tokens``(``_se``), ``B_noise_tokens``(``_se``) (batch sizes
    in tokens: the sequence values times the context). The ``*_abs`` entries are
    Σ_batches |per-batch contribution| / tokens, a tolerance scale for
    quadratic forms that nearly cancel.
    """
    ref = load_reference(ckpt_h5, tokens_path, context, dtype, max_blocks)
    return statistics_of(ref, noise_samples, noise_batch, directions, seed)


# --------------------------------------------------------------------------- #
# SPEC §10: per-block statistics, tr(H^2) and the Hutchinson diagonal
# --------------------------------------------------------------------------- #
def partitions(ref):
    """The `tensor` and `layer` partitions of SPEC §10 as {name: (names, offsets)},
    from the canonical tensor order of the reference's model."""
    sd = canonical_named(ref.model)
    names, offsets, off = [], [], 0
    layer_names, layer_offsets = [], []
    for name, t in sd.items():
        names.append(name)
        offsets.append(off)
        layer = re.match(r"^(transformer\.h|model\.layers|gpt_neox\.layers)\.(\d+)\.", name)
        if name in ("transformer.wte.weight", "transformer.wpe.weight", "model.embed_tokens.weight",
                    "gpt_neox.embed_in.weight"):
            block = "embed"
        elif layer:
            block = "h." + layer.group(2)
        else:
            block = "head"
        if not layer_names or layer_names[-1] != block:
            layer_names.append(block)
            layer_offsets.append(off)
        off += t.numel()
    return {"tensor": (names, offsets + [off]), "layer": (layer_names, layer_offsets + [off])}


def block_statistics(ref, stats, directions, seed):
    """Per-block quantities of SPEC §10 from the epoch's H v of every direction
    (float64 double backward), given ``statistics_of``'s output ``stats``.

    Returns {"partitions": {part: {"names", "offsets", <quantity>: array,
    <quantity>_se: array, <quantity>_scale: array}}, "frob_H", "frob_H_se",
    "effective_rank", "hessian_diagonal", "hessian_diagonal_scale"}. A
    ``_scale`` is sum_i |d_i (Hd)_i| over the block (averaged like the
    quantity), the tolerance scale of a quadratic form that may cancel.
    """
    G = torch.from_numpy(stats["G"])
    xis = [torch.from_numpy(g) - G for g in stats["gB"]]
    vs = [torch.from_numpy(rademacher(seed, k, ref.P)) for k in range(int(directions))]
    HG = ref.hvp(G)
    Hxi = [ref.hvp(x) for x in xis]
    Hv = [ref.hvp(v) for v in vs]
    B, f = stats["noise_batch"], stats["fpc"]

    def mse(rows):
        a = np.asarray(rows, dtype=np.float64)
        if a.shape[0] == 0:
            return np.full(a.shape[1:], np.nan), np.full(a.shape[1:], np.nan)
        se = a.std(axis=0, ddof=1) / math.sqrt(a.shape[0]) if a.shape[0] > 1 else np.full(a.shape[1:], np.nan)
        return a.mean(axis=0), se

    out = {"partitions": {}}
    for part, (names, offsets) in partitions(ref).items():
        sl = [slice(offsets[i], offsets[i + 1]) for i in range(len(names))]
        dots = lambda a, b: [float(a[s] @ b[s]) for s in sl]  # noqa: E731
        absdots = lambda a, b: [float((a[s] * b[s]).abs().sum()) for s in sl]  # noqa: E731
        q = {"names": names, "offsets": offsets}
        q["G_sqnorm"] = np.array(dots(G, G))
        xs, xs_se = mse([dots(x, x) for x in xis])
        q["trace_sigma"], q["trace_sigma_se"] = B * f * xs, B * f * xs_se
        q["B_simple"], q["B_simple_se"] = q["trace_sigma"] / q["G_sqnorm"], q["trace_sigma_se"] / q["G_sqnorm"]
        q["trace_H"], q["trace_H_se"] = mse([dots(v, h) for v, h in zip(vs, Hv)])
        q["trace_H_scale"] = np.mean([absdots(v, h) for v, h in zip(vs, Hv)], axis=0)
        q["GHG_contrib"] = np.array(dots(G, HG))
        q["GHG_contrib_scale"] = np.array(absdots(G, HG))
        q["xiHxi_contrib"], q["xiHxi_contrib_se"] = mse([dots(x, h) for x, h in zip(xis, Hxi)])
        q["xiHxi_contrib_scale"] = np.mean([absdots(x, h) for x, h in zip(xis, Hxi)], axis=0)
        q["frob_H"], q["frob_H_se"] = mse([dots(h, h) for h in Hv])
        out["partitions"][part] = q
    out["frob_H"], out["frob_H_se"] = mse([float(h @ h) for h in Hv])
    out["effective_rank"] = stats["trace_H"] ** 2 / out["frob_H"]
    diag = torch.stack([v * h for v, h in zip(vs, Hv)])
    out["hessian_diagonal"] = diag.mean(0).numpy()
    out["hessian_diagonal_scale"] = diag.abs().mean(0).numpy()
    return out


def gauss_newton_blocks(ref, directions, seed):
    """Per block of both partitions, mean_k v_k,b . (GGN v_k)_b and its SE:
    SPEC §10's per-block trace_ggn, unbiased for tr(GGN_bb)."""
    vs = [torch.from_numpy(rademacher(seed, k, ref.P)) for k in range(int(directions))]
    Gv = [ref.gauss_newton_product(v) for v in vs]
    out = {}
    for part, (names, offsets) in partitions(ref).items():
        rows = np.array([[float(v[offsets[i]:offsets[i + 1]] @ g[offsets[i]:offsets[i + 1]])
                          for i in range(len(names))] for v, g in zip(vs, Gv)])
        out[part] = (rows.mean(0), rows.std(0, ddof=1) / math.sqrt(rows.shape[0]))
    return out


def adam_preconditioner(ckpt_h5):
    """SPEC §10's P = 1/(sqrt(v_hat) + eps), v_hat = exp_avg_sq/(1 - beta2^step),
    flat in canonical order (float64), from a gnh HDF5 checkpoint's /optimizer;
    None when it has none."""
    import h5py
    with h5py.File(ckpt_h5, "r") as f:
        if "optimizer" not in f:
            return None
        o = f["optimizer"]
        step, beta2, eps = int(o.attrs["step"]), float(o.attrs["beta2"]), float(o.attrs["eps"])
        names = list(canonical_named(load_model(ckpt_h5)).keys())
        v = np.concatenate([np.asarray(o["exp_avg_sq"][n][()], dtype=np.float64).reshape(-1) for n in names])
    return 1.0 / (np.sqrt(v / (1.0 - beta2 ** step)) + eps)


def preconditioned_statistics(ref, stats, P):
    """SPEC §10's preconditioned noise scale in float64: G^T P G, (PG)^T H (PG),
    per sample xi^T P xi and (P xi)^T H (P xi), B_simple_P, B_noise_P (with
    SEs) and the curvature along PG. ``*_scale`` entries bound |q| by
    Cauchy-Schwarz (|d| |Hd|), the tolerance scale of a form that cancels."""
    P = torch.from_numpy(np.asarray(P, dtype=np.float64))
    G = torch.from_numpy(stats["G"])
    xis = [torch.from_numpy(g) - G for g in stats["gB"]]
    B, f = stats["noise_batch"], stats["fpc"]
    PG = P * G
    HPG = ref.hvp(PG)
    out = {"GPG": float(G @ PG), "PG_H_PG": float(PG @ HPG), "PG_H_PG_scale": float(PG.norm() * HPG.norm())}
    xiPxi, PxiHPxi, scales = [], [], []
    for x in xis:
        Px = P * x
        HPx = ref.hvp(Px)
        xiPxi.append(float(x @ Px))
        PxiHPxi.append(float(Px @ HPx))
        scales.append(float(Px.norm() * HPx.norm()))
    out["xiPxi"], out["PxiHPxi"], out["PxiHPxi_scale"] = np.array(xiPxi), np.array(PxiHPxi), np.array(scales)
    m1, s1 = _mean_se(out["xiPxi"])
    m2, s2 = _mean_se(out["PxiHPxi"])
    out["B_simple_P"], out["B_simple_P_se"] = B * f * m1 / out["GPG"], B * f * s1 / out["GPG"]
    out["B_noise_P"], out["B_noise_P_se"] = B * f * m2 / out["PG_H_PG"], B * f * s2 / abs(out["PG_H_PG"])
    out["curvature_preconditioned"] = out["PG_H_PG"] / out["GPG"]
    return out


def gauss_newton_statistics(ref, stats, directions, seed):
    """SPEC §10's Gauss-Newton statistics in float64 (doc/statistics.md):
    G^T GGN G, per sample xi^T GGN xi and per direction v^T GGN v, their
    means with SEs, B_noise_ggn and the residual share against stats' GHG."""
    G = torch.from_numpy(stats["G"])
    xis = [torch.from_numpy(g) - G for g in stats["gB"]]
    vs = [torch.from_numpy(rademacher(seed, k, ref.P)) for k in range(int(directions))]
    q = ref.gauss_newton_forms(torch.stack([G] + xis + vs))
    m = len(xis)
    out = {"GHG_ggn": float(q[0]), "xiGGNxi": q[1:1 + m].copy(), "vGGNv": q[1 + m:].copy()}
    out["xiHxi_ggn"], out["xiHxi_ggn_se"] = _mean_se(out["xiGGNxi"])
    out["trace_ggn"], out["trace_ggn_se"] = _mean_se(out["vGGNv"])
    Bf = stats["noise_batch"] * stats["fpc"]
    out["B_noise_ggn"] = Bf * out["xiHxi_ggn"] / out["GHG_ggn"]
    out["B_noise_ggn_se"] = Bf * out["xiHxi_ggn_se"] / out["GHG_ggn"]
    out["residual_share"] = (stats["GHG"] - out["GHG_ggn"]) / stats["GHG"]
    return out


def sequence_statistics(ref, bins=32):
    """SPEC §10's statistics from every sequence's own gradient, in float64
    (doc/statistics.md): a_i = the gradient of block i's mean token loss
    (every block has T targets), G = mean_i a_i; ``seq_grad_sqnorm`` |a_i|^2
    in epoch order, ``trace_sigma_seq`` = mean |a_i|^2 - |G|^2 with the SE of
    the mean of d_i = |a_i - G|^2, ``B_simple_seq`` (``_se``) over |G|^2, the
    histogram of |a_i|^2 (``bins`` logarithmic bins from the smallest to the
    largest); per block of both partitions ``trace_sigma_seq`` and
    ``B_simple_seq`` with the bounded SE (sd(|a_i,b|^2) + 2 sqrt(|G_b|^2
    tr Sigma_bb)) / sqrt(n)."""
    A = []
    for b in range(ref.n):
        _, a = ref.gradient([b])
        A.append(a)
    A = torch.stack(A)
    G = A.mean(0)
    G2 = float(G @ G)
    x = (A * A).sum(1).numpy()
    d = ((A - G) ** 2).sum(1).numpy()
    n = ref.n
    out = {"n_sequences": n, "seq_grad_sqnorm": x, "G": G.numpy()}
    out["trace_sigma_seq"] = float(x.mean()) - G2
    out["trace_sigma_seq_se"] = float(d.std(ddof=1) / math.sqrt(n))
    out["B_simple_seq"], out["B_simple_seq_se"] = out["trace_sigma_seq"] / G2, out["trace_sigma_seq_se"] / G2
    lo, hi = float(x.min()), float(x.max())
    out["seq_grad_sqnorm_edges"] = np.exp(np.linspace(math.log(lo), math.log(hi), bins + 1))
    out["blocks"] = {}
    for part, (names, offsets) in partitions(ref).items():
        q = {"trace_sigma_seq": [], "trace_sigma_seq_se": []}
        for i in range(len(names)):
            s = slice(offsets[i], offsets[i + 1])
            xb = (A[:, s] ** 2).sum(1).numpy()
            gb = float(G[s] @ G[s])
            tr = float(xb.mean()) - gb
            q["trace_sigma_seq"].append(tr)
            q["trace_sigma_seq_se"].append((xb.std(ddof=1) + 2 * math.sqrt(gb * max(tr, 0.0))) / math.sqrt(n))
            q.setdefault("G_sqnorm", []).append(gb)
        q = {k: np.array(v) for k, v in q.items()}
        q["B_simple_seq"], q["B_simple_seq_se"] = q["trace_sigma_seq"] / q["G_sqnorm"], q["trace_sigma_seq_se"] / q["G_sqnorm"]
        out["blocks"][part] = q
    return out


def update_statistics(ref_a, stats_a, ckpt_b):
    """SPEC §10 along the update Delta = theta_b - theta_a, at theta_a on the
    reference's case: |Delta|^2, G^T Delta, Delta^T H Delta (with its
    Cauchy-Schwarz scale |Delta| |H Delta|), the quadratic model's predicted
    change, the measured L(theta_b) - L(theta_a) and the curvature along."""
    theta_b = torch.cat([t.detach().reshape(-1) for t in canonical_named(load_model(ckpt_b)).values()])
    theta_a = ref_a.flat_params()
    delta = theta_b - theta_a
    G = torch.from_numpy(stats_a["G"])
    Hd = ref_a.hvp(delta)
    out = {"delta_sqnorm": float(delta @ delta), "G_dot_delta": float(G @ delta), "dHd": float(delta @ Hd),
           "dHd_scale": float(delta.norm() * Hd.norm()),
           "G_dot_delta_scale": float(G.norm() * delta.norm())}
    loss_a = ref_a.loss()
    ref_a.set_flat_params(theta_b)
    try:
        loss_b = ref_a.loss()
    finally:
        ref_a.set_flat_params(theta_a)
    out["measured_change"] = loss_b - loss_a
    out["predicted_change"] = out["G_dot_delta"] + 0.5 * out["dHd"]
    out["curvature_along"] = out["dHd"] / out["delta_sqnorm"]
    return out
