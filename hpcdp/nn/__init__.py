"""Layers and models on hpcdp.autograd; ``build_model`` makes one from a config."""

from __future__ import annotations

from collections.abc import Mapping

from .gpt import GPT
from .layers import (Block, CausalSelfAttention, Dropout, Embedding, LayerNorm, Linear,
                     MLPBlock)
from .mlp import MLP
from .module import Module
from .params import FlatParams, ParamRegistry, ParamSpec

_GPT_KEYS = ("vocab_size", "block_size", "n_layer", "n_head", "n_embd")


def _get(cfg, key, default=KeyError):
    if isinstance(cfg, Mapping):
        if key in cfg:
            return cfg[key]
    elif hasattr(cfg, key):
        return getattr(cfg, key)
    if default is KeyError:
        raise ValueError(f"model config is missing {key!r}")
    return default


def build_model(cfg, *, dtype="float32", device="cpu", seed=None, storage=("data", "grad")):
    """``cfg``: a mapping or object with ``kind`` ("mlp" | "gpt") and its sizes.

    mlp: ``sizes`` (list), ``activation`` (default "relu").
    gpt: ``vocab_size, block_size, n_layer, n_head, n_embd``, ``tied_head``
    (default True), ``dropout`` (default 0.0), ``ignore_index`` (default "none":
    targets to leave out of the loss). Both: ``gelu`` ("tanh", default, or "exact").
    ``seed`` comes from the keyword when given, else ``cfg.seed``, else 0.
    ``storage``: which full buffers to allocate now (``FlatParams.materialize``);
    ``()`` builds only the layout and init recipes (a sharded strategy's start).
    """
    kind = _get(cfg, "kind")
    if seed is None:
        seed = _get(cfg, "seed", 0)
    if int(seed) < 0:
        raise ValueError(f"model seed must be >= 0, got {seed} (a config's -1 means "
                         f"'use run.seed': resolve it before build_model)")
    if kind == "mlp":
        return MLP(_get(cfg, "sizes"), _get(cfg, "activation", "relu"), gelu=_get(cfg, "gelu", "tanh"),
                   seed=seed, dtype=dtype, device=device, storage=storage)
    if kind == "gpt":
        sizes = {k: int(_get(cfg, k)) for k in _GPT_KEYS}
        ignore = _get(cfg, "ignore_index", "none")
        return GPT(**sizes, tied_head=bool(_get(cfg, "tied_head", True)),
                   dropout=float(_get(cfg, "dropout", 0.0)), gelu=_get(cfg, "gelu", "tanh"),
                   ignore_index=None if ignore in (None, "none") else int(ignore),
                   seed=seed, dtype=dtype, device=device, storage=storage)
    raise ValueError(f"model kind must be 'mlp' or 'gpt', got {kind!r}")


__all__ = ["build_model", "MLP", "GPT", "Module", "FlatParams", "ParamSpec", "ParamRegistry",
           "Linear", "LayerNorm", "Embedding", "Dropout", "CausalSelfAttention", "MLPBlock",
           "Block"]
