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

A run that skips every update is not training: ``train.max_consecutive_skips``
(default 5) steps in a row whose update was skipped (updates, on a dedicated
parameter server, which runs no steps) stop the run with :class:`NonFiniteError`.

The 16-bit wire (``comm_dtype`` of ``[parallel.ddp]`` / ``[parallel.zero]``): the
guard is told the key and its value (``wire``). A non-finite gradient under a
float16 wire names it in the remedy (float16's largest value is 65504: bfloat16 has
float32's range). Float16 also flushes values below about 3e-8 to zero: with a full
gradient (DDP) the guard checks each parameter's reduced gradient, and a parameter
whose gradient is zero at every one of ``FLUSH_STEPS`` steps in a row gets one
warning line (rank 0, once per run) naming it and the key. Values flushed in part of
a tensor are not detected.

Cost: one pass over the gradient (a BLAS dot product) per optimizer step;
docs/results.md records it. With a float16 wire and a full gradient, one more pass
(the per-parameter zero test).
"""

from __future__ import annotations

import math

import numpy as np

MODES = ("stop", "skip")
MAX_CONSECUTIVE_SKIPS = 5   # train.max_consecutive_skips's default
FLUSH_STEPS = 3             # steps in a row a parameter's gradient is all zero before the warning
FLOAT16_MAX, FLOAT16_TINY = 65504.0, 3e-8  # float16: largest finite value; below TINY rounds to 0


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

    def __init__(self, mode: str = "stop", rank: int = 0, *, wire=None,
                 max_skips: int = MAX_CONSECUTIVE_SKIPS, layout=None, say=None):
        if mode not in MODES:
            raise ValueError(f"train.on_nonfinite: {mode!r} is not allowed; choose one of 'stop', 'skip'")
        self.mode, self.rank = mode, rank
        self.step = 0
        self.skipped = 0     # optimizer updates skipped since the last stats()
        self.total_skipped = 0
        # (key, dtype) of a 16-bit gradient wire, e.g. ("parallel.ddp.comm_dtype", "float16"); None: float32
        self.wire = tuple(wire) if wire and wire[1] != "float32" else None
        self.max_skips = int(max_skips)
        self.consecutive = 0          # steps (updates on a server) skipped in a row
        self._last_skip_step = None
        self.layout = list(layout) if layout is not None and self.wire and self.wire[1] == "float16" else None
        self._zero_run = None         # per parameter: steps in a row its gradient was all zero
        self.flushed_warned = False
        if say is None:
            from .ranks import say
        self._say = say

    def remedy(self) -> str:
        """What to change: the float16 wire first where one carried the gradient."""
        if self.wire and self.wire[1] == "float16":
            key = self.wire[0]
            return (f"the gradient was summed over a float16 wire ({key} = \"float16\"), whose largest value is "
                    f"{FLOAT16_MAX:g}: set {key} = \"bfloat16\" (float32's range) or \"float32\"; else lower "
                    "optim.lr, check the data")
        return "lower optim.lr, check the data"

    def _where(self) -> str:
        return (f"at step {self.step} on rank {self.rank}" if self.step
                else f"on rank {self.rank} (parameter server)")

    def check_loss(self, step: int, loss: float) -> None:
        self.step = step
        if not math.isfinite(loss) and self.mode == "stop":
            raise NonFiniteError(
                f"non-finite loss ({loss}) {self._where()}; {self.remedy()}, "
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
                        f'{self.remedy()}, or set train.on_nonfinite = "skip"')
                self._skip()
                return None
            self.consecutive = 0
            if self.layout is not None and not self.flushed_warned:
                self._check_flushed(grad, backend)
            return inner(param, grad, *args, **kwargs)

        optimizer.step = step

    def _skip(self) -> None:
        """Count a skipped update; ``max_skips`` steps in a row end the run."""
        self.skipped += 1
        self.total_skipped += 1
        if self.step and self.step == self._last_skip_step:
            return  # another update of the same step (e.g. a second parameter-server shard)
        self._last_skip_step = self.step
        self.consecutive += 1
        if self.consecutive >= self.max_skips:
            what = "steps" if self.step else "updates"
            raise NonFiniteError(
                f"{self.consecutive} {what} in a row had a non-finite gradient norm and were skipped "
                f"(train.on_nonfinite = \"skip\", train.max_consecutive_skips = {self.max_skips}) "
                f"{self._where()}: the run is not training; {self.remedy()}")

    def _check_flushed(self, grad, backend) -> None:
        """A float16 wire and a full gradient: warn once when a parameter's reduced
        gradient has been exactly zero for ``FLUSH_STEPS`` steps in a row (its values
        were below float16's smallest and flushed to zero: it does not train)."""
        n = self.layout[-1].offset + self.layout[-1].size if self.layout else 0
        if int(grad.shape[0]) != n:
            self.layout = None  # a shard (ZeRO), not the full gradient: not checked
            return
        host = grad if isinstance(grad, np.ndarray) else backend.to_numpy(grad)
        zero = np.array([not host[p.offset:p.offset + p.size].any() for p in self.layout])
        run = self._zero_run if self._zero_run is not None else np.zeros(len(self.layout), np.int64)
        self._zero_run = run = (run + 1) * zero
        hit = [p.name for p, r in zip(self.layout, run) if r >= FLUSH_STEPS]
        if not hit:
            return
        self.flushed_warned = True
        if self.rank != 0:
            return  # every rank holds the same gradient: one line
        key = self.wire[0]
        more = f" (and {len(hit) - 1} more)" if len(hit) > 1 else ""
        self._say(f"hpcdp: warning: at step {self.step} the gradient of {hit[0]}{more} has been exactly zero "
                  f"for {FLUSH_STEPS} steps after the float16 wire ({key} = \"float16\"): values below "
                  f"{FLOAT16_TINY:g} flush to zero, so it does not train; set {key} = \"bfloat16\" (float32's "
                  "range) or \"float32\"")

    def stats(self) -> dict:
        """Per-step metrics ("skip" mode only): optimizer updates this rank skipped
        since the last call."""
        if self.mode != "skip":
            return {}
        out = {"nonfinite_skipped": float(self.skipped)}
        self.skipped = 0
        return out


__all__ = ["NonFiniteError", "NonFiniteGuard", "grad_sq_norm", "MODES", "MAX_CONSECUTIVE_SKIPS",
           "FLUSH_STEPS"]
