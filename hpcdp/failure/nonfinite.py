"""Non-finite values during training (``train.on_nonfinite = "stop" | "skip"``).

Two checks per step on every rank, both local (no extra message):

- the loss: this rank's part of the step's loss, after backward. Non-finite names
  the rank that produced it (the others have finite losses).
- the gradient, at the optimizer: the optimizer's ``step(param, grad)`` is wrapped
  (:meth:`NonFiniteGuard.guard`) so the squared norm of the gradient it is about to
  apply is checked first. This is the one place every strategy goes through with
  the gradient it really applies: DDP's reduced gradient (identical on every
  rank), a parameter server's aggregated shard (on the server, which decides for
  every worker), or the aggregated gradient a worker applies itself (identical on
  every worker).

``"stop"`` (default) raises :class:`NonFiniteError` naming the step and the rank.
``"skip"`` leaves the parameters and the optimizer state untouched for that update
and counts it (``nonfinite_skipped`` in the step's per-rank metrics). Because the
decision is taken on a gradient every rank holds identically (or by the one server
that owns the shard), every rank drops the same step without agreeing by message.
A strategy whose ranks hold different parts of the gradient (sharded optimizer
state) must agree on the flag (one small allreduce) before skipping.

Cost: one pass over the gradient (a BLAS dot product) per optimizer step;
docs/results.md records it.
"""

from __future__ import annotations

import math

import numpy as np

MODES = ("stop", "skip")


class NonFiniteError(ArithmeticError):
    """A non-finite loss or gradient norm with ``train.on_nonfinite = "stop"``."""


def grad_sq_norm(grad, backend=None) -> float:
    """Squared L2 norm of a flat gradient (NaN/inf if any element is, or if it overflows
    the gradient's dtype: a gradient that large is as unusable)."""
    if isinstance(grad, np.ndarray):
        with np.errstate(over="ignore", invalid="ignore"):  # inf/NaN is the answer, not a warning
            return float(np.dot(grad, grad))
    be = backend
    return float(np.asarray(be.to_numpy(be.sum(be.mul(grad, grad)))))


class NonFiniteGuard:
    """The two checks above for one rank. ``step`` is the current training step (set
    by :meth:`check_loss`; 0 on a dedicated server, which runs no steps)."""

    def __init__(self, mode: str = "stop", rank: int = 0):
        if mode not in MODES:
            raise ValueError(f"train.on_nonfinite: {mode!r} is not allowed; choose one of 'stop', 'skip'")
        self.mode, self.rank = mode, rank
        self.step = 0
        self.skipped = 0     # optimizer updates skipped since the last stats()
        self.total_skipped = 0

    def _where(self) -> str:
        return (f"at step {self.step} on rank {self.rank}" if self.step
                else f"on rank {self.rank} (parameter server)")

    def check_loss(self, step: int, loss: float) -> None:
        self.step = step
        if not math.isfinite(loss) and self.mode == "stop":
            raise NonFiniteError(
                f"non-finite loss ({loss}) {self._where()}; lower optim.lr, check the data, "
                'or set train.on_nonfinite = "skip" to drop such steps')

    def guard(self, optimizer) -> None:
        """Wrap ``optimizer.step`` (this instance only) with the gradient check."""
        inner = optimizer.step
        backend = getattr(optimizer, "backend", None)

        def step(param, grad, *args, **kwargs):
            sq = grad_sq_norm(grad, backend)
            if not math.isfinite(sq):
                if self.mode == "stop":
                    raise NonFiniteError(
                        f"non-finite gradient norm ({math.sqrt(sq) if sq >= 0 else sq}) {self._where()}; "
                        'lower optim.lr, check the data, or set train.on_nonfinite = "skip"')
                self.skipped += 1
                self.total_skipped += 1
                return None
            return inner(param, grad, *args, **kwargs)

        optimizer.step = step

    def stats(self) -> dict:
        """Per-step metrics ("skip" mode only): optimizer updates this rank skipped
        since the last call."""
        if self.mode != "skip":
            return {}
        out = {"nonfinite_skipped": float(self.skipped)}
        self.skipped = 0
        return out


__all__ = ["NonFiniteError", "NonFiniteGuard", "grad_sq_norm", "MODES"]
