"""Config rules of exact mode: clear errors before training, naming the key to change.

Light on purpose (no numba, no strategy code): hpcdp/config.py calls it while
parsing.
"""

from __future__ import annotations

from hpcdp.config_parallel import ConfigError


def check_train(train) -> None:
    """``[train]`` on its own: a micro-batch size that divides the global batch, and
    no second way of cutting micro-batches."""
    m, g = train.exact_micro_batch, train.global_batch
    if m < 1:
        raise ConfigError("train.exact_micro_batch: exact mode needs the micro-batch size (samples per "
                          f"fixed micro-batch, a divisor of train.global_batch = {g}); e.g. "
                          f"--set train.exact_micro_batch={_a_divisor(g)}")
    if g % m:
        raise ConfigError(f"train.exact_micro_batch: {m} does not divide train.global_batch = {g}; exact "
                          f"mode cuts the global batch into equal micro-batches (divisors of {g}: "
                          f"{', '.join(map(str, _divisors(g)))})")
    if train.grad_accum != 1:
        raise ConfigError(f"train.grad_accum: exact mode cuts the global batch into micro-batches of "
                          f"train.exact_micro_batch samples itself (a rank runs as many as it holds); "
                          f"leave grad_accum = 1, found {train.grad_accum}")


def check_config(cfg) -> None:
    """Across sections: strategies that cannot be exact."""
    strategy = cfg.parallel.strategy
    if strategy == "zero" and getattr(cfg.optim, "clip_grad_norm", 0.0):
        raise ConfigError("optim.clip_grad_norm: under ZeRO the gradient norm is summed in floats over "
                          "the ranks' shards, which differs with the rank count; exact mode cannot clip "
                          "there yet: set optim.clip_grad_norm = 0, use parallel.strategy = 'ddp', or "
                          "train.reproducible = 'fast'")
    if strategy == "ps":
        ps = cfg.parallel.sub("ps")
        if ps is not None and getattr(ps, "mode", "sync") == "async":
            raise ConfigError("parallel.ps.mode: 'async' cannot be exact (which updates a gradient meets "
                              "depends on timing); use parallel.ps.mode = 'sync' or "
                              "train.reproducible = 'fast'")
        if ps is not None and getattr(ps, "aggregate", "sum") != "sum":
            raise ConfigError(f"parallel.ps.aggregate: exact mode sums integers on the server; "
                              f"{ps.aggregate!r} is not available in exact mode (use 'sum')")


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _a_divisor(n: int) -> int:
    """A reasonable micro-batch to suggest: the largest divisor <= n / 4 (or 1)."""
    cands = [d for d in _divisors(n) if d <= max(n // 4, 1)]
    return cands[-1]


__all__ = ["check_train", "check_config"]
