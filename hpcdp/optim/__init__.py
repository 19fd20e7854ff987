"""Optimizers on flat (possibly sharded) buffers, the learning-rate schedule, and
gradient-norm clipping (clip.py; applied by the strategies on the reduced gradient)."""

from __future__ import annotations

import math

from .adamw import AdamW
from .decay import DEFAULT_NO_DECAY, decay_ranges, local_runs
from .sgd import SGD


def build_optimizer(optim_cfg, *, size=None, layout=None, dtype="float32", device="cpu"):
    """SGD or AdamW from an :class:`hpcdp.config.OptimConfig`; state sized on first step
    unless ``size`` is given. With the model's ``layout``, weight decay applies only to
    the parameters no ``optim.no_decay`` rule matches (:mod:`.decay`)."""
    c = optim_cfg
    if c.kind == "sgd":
        opt = SGD(size, lr=c.lr, momentum=c.momentum, weight_decay=c.weight_decay,
                  nesterov=c.nesterov, dtype=dtype, device=device)
    elif c.kind == "adamw":
        opt = AdamW(size, lr=c.lr, betas=tuple(c.betas), eps=c.eps,
                    weight_decay=c.weight_decay, dtype=dtype, device=device)
    else:
        raise ValueError(f"optim.kind: {c.kind!r} is not allowed; choose one of 'sgd', 'adamw'")
    opt.clip_grad_norm = float(getattr(c, "clip_grad_norm", 0.0))
    if layout is not None:
        opt.set_decay_ranges(decay_ranges(layout, c.no_decay))
    return opt


def lr_at(optim_cfg, step: int, total_steps: int) -> float:
    """Learning rate of 1-based optimizer step ``step`` out of ``total_steps``.

    Linear warmup over ``warmup_steps`` (step k gets lr * k / warmup_steps), then
    ``constant`` lr, or ``cosine`` decay from lr (first step after warmup) to
    ``min_lr`` (last step).
    """
    c = optim_cfg
    if step <= c.warmup_steps:
        return c.lr * step / c.warmup_steps
    if c.schedule == "constant":
        return c.lr
    span = max(total_steps - c.warmup_steps - 1, 1)
    frac = min((step - c.warmup_steps - 1) / span, 1.0)
    return c.min_lr + 0.5 * (c.lr - c.min_lr) * (1.0 + math.cos(math.pi * frac))


__all__ = ["AdamW", "SGD", "build_optimizer", "lr_at", "decay_ranges", "local_runs", "DEFAULT_NO_DECAY"]
