"""Layers: Linear, LayerNorm, Embedding, Dropout, causal multi-head self-attention and
the GPT MLP block. Each is a thin wrapper holding Parameters from a ParamRegistry
and calling the ops in hpcdp.autograd.functional.
"""

from __future__ import annotations

import math

from ..autograd import functional as F
from .module import Module


class Linear(Module):
    """y = act(x @ W + b), W of shape (in, out).

    ``std=None``: PyTorch's default init, U(-1/sqrt(in), 1/sqrt(in)) for W and b.
    ``std`` given: GPT-2 style, W ~ N(0, std), b = 0.
    """

    def __init__(self, reg, name, n_in, n_out, *, bias=True, std=None, activation=None, gelu="tanh"):
        if n_in < 1 or n_out < 1:
            raise ValueError(f"Linear {name}: sizes must be >= 1, got {n_in} -> {n_out}")
        if std is None:
            bound = 1.0 / math.sqrt(n_in)
            self.weight = reg.uniform(f"{name}.weight", (n_in, n_out), bound)
            self.bias = reg.uniform(f"{name}.bias", (n_out,), bound) if bias else None
        else:
            self.weight = reg.normal(f"{name}.weight", (n_in, n_out), std)
            self.bias = reg.constant(f"{name}.bias", (n_out,), 0.0) if bias else None
        self.activation, self.gelu = activation, gelu

    def forward(self, x, residual=None):
        """``residual``: returns residual + this layer's output (one graph node)."""
        return F.linear(x, self.weight, self.bias, self.activation, self.gelu, residual)


class LayerNorm(Module):
    def __init__(self, reg, name, dim, eps=1e-5):
        self.weight = reg.constant(f"{name}.weight", (dim,), 1.0)
        self.bias = reg.constant(f"{name}.bias", (dim,), 0.0)
        self.eps = eps

    def forward(self, x):
        return F.layer_norm(x, self.weight, self.bias, self.eps)


class Embedding(Module):
    def __init__(self, reg, name, num_embeddings, dim, std=0.02):
        self.weight = reg.normal(f"{name}.weight", (num_embeddings, dim), std)
        self.num_embeddings, self.name = num_embeddings, name

    def forward(self, ids, check=True):
        """Rows of the table; an id outside [0, num_embeddings) is a ValueError
        (``check=False``: ids the caller made itself, e.g. positions)."""
        return F.embedding(self.weight, ids, what=f"Embedding {self.name}", check=check)


class Dropout(Module):
    """Each element's keep/drop is keyed by (model seed, optimizer step, global sample
    index, layer): the same on any rank, any backend, and after a restart
    (hpcdp/nn/streams.py)."""

    def __init__(self, reg, p):
        if not 0.0 <= p < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {p}")
        self.p = float(p)
        self.streams = reg.streams
        self.layer = reg.next_stream()

    def key(self, batch):
        return self.streams.key(self.layer, batch, who=f"dropout (p = {self.p})")

    def forward(self, x):
        if not self.training or self.p == 0.0:
            return x
        return F.dropout(x, self.p, self.key(x.shape[0]), True)


class CausalSelfAttention(Module):
    """Multi-head self-attention with a causal mask, built from the ops:
    one QKV projection, softmax(q k^T / sqrt(d)) masked causally (one fused op from
    the projection's output to the merged heads), output projection. ``proj_std`` scales the residual projection (GPT-2)."""

    def __init__(self, reg, name, n_embd, n_head, *, proj_std, dropout=0.0):
        if n_embd % n_head:
            raise ValueError(f"n_embd ({n_embd}) must be divisible by n_head ({n_head})")
        self.n_embd, self.n_head = n_embd, n_head
        self.c_attn = Linear(reg, f"{name}.c_attn", n_embd, 3 * n_embd, std=0.02)
        self.c_proj = Linear(reg, f"{name}.c_proj", n_embd, n_embd, std=proj_std)
        self.attn_drop = Dropout(reg, dropout)
        self.resid_drop = Dropout(reg, dropout)

    def forward(self, x, residual=None):
        """``residual``: returns residual + the attention's output."""
        b, h = x.shape[0], self.n_head
        qkv = self.c_attn(x)                                      # (B, T, 3C)
        p = self.attn_drop.p if self.training else 0.0
        key = self.attn_drop.key(b) if p else None
        y = F.causal_self_attention_qkv(qkv, h, p, key, self.training)  # (B, T, C)
        return _residual(self.c_proj, y, self.resid_drop, residual)


def _residual(proj, y, drop, residual):
    """residual + drop(proj(y)): without active dropout the residual's add goes into
    the projection's node (with its bias, one pass); with it, dropout comes first."""
    if residual is None:
        return drop(proj(y))
    if not drop.training or drop.p == 0.0:
        return proj(y, residual=residual)
    return residual + drop(proj(y))


class MLPBlock(Module):
    """GPT feed-forward: Linear(C, 4C) + GELU (fused; ``gelu`` "tanh" or "exact"),
    Linear(4C, C), dropout."""

    def __init__(self, reg, name, n_embd, *, proj_std, dropout=0.0, gelu="tanh"):
        self.c_fc = Linear(reg, f"{name}.c_fc", n_embd, 4 * n_embd, std=0.02, activation="gelu", gelu=gelu)
        self.c_proj = Linear(reg, f"{name}.c_proj", 4 * n_embd, n_embd, std=proj_std)
        self.drop = Dropout(reg, dropout)

    def forward(self, x, residual=None):
        """``residual``: returns residual + the MLP's output."""
        return _residual(self.c_proj, self.c_fc(x), self.drop, residual)


class Block(Module):
    """Pre-LN transformer block: x + attn(ln1(x)), then + mlp(ln2(x))."""

    def __init__(self, reg, name, n_embd, n_head, *, proj_std, dropout=0.0, gelu="tanh"):
        self.ln_1 = LayerNorm(reg, f"{name}.ln_1", n_embd)
        self.attn = CausalSelfAttention(reg, f"{name}.attn", n_embd, n_head,
                                        proj_std=proj_std, dropout=dropout)
        self.ln_2 = LayerNorm(reg, f"{name}.ln_2", n_embd)
        self.mlp = MLPBlock(reg, f"{name}.mlp", n_embd, proj_std=proj_std, dropout=dropout, gelu=gelu)

    def forward(self, x):
        x = self.attn(self.ln_1(x), residual=x)
        return self.mlp(self.ln_2(x), residual=x)
