"""The calls the training loop makes into the failure policy, kept to a few lines there.

::

    checks = StepChecks(cfg.train.on_nonfinite, world.rank, optimizer)  # wraps optimizer.step
    checks.setup()                                    # HPCDP_FAULT at step 0
    for step ...:
        train_step(..., checks=checks.at(step))       # calls checks.after_backward(loss, flat)
        stats.update(checks.stats())
    except BaseException as e: release(strategy, e, step)
"""

from __future__ import annotations

from .inject import Faults
from .nonfinite import NonFiniteGuard
from .policy import note_step
from .watch import note_step as note_watched_step


class StepChecks:
    """Per-rank checks of one run: the fault-injection hook and the non-finite guard."""

    def __init__(self, on_nonfinite: str, rank: int, optimizer, *, wire=None, max_skips=None, layout=None):
        """``wire``: ``(key, dtype)`` of the gradient's wire (``comm_dtype``); ``max_skips``:
        ``train.max_consecutive_skips``; ``layout``: the model's parameter layout (the
        float16 wire's flush check). See hpcdp.failure.nonfinite."""
        kw = {} if max_skips is None else {"max_skips": max_skips}
        self.guard = NonFiniteGuard(on_nonfinite, rank, wire=wire, layout=layout, **kw)
        self.guard.guard(optimizer)
        self.faults = Faults(rank)
        self.step = 0

    def at(self, step: int) -> "StepChecks":
        """The training step about to run (its number goes into messages, and to the
        watcher that names this rank if it is killed); returns self."""
        self.step = step
        note_watched_step(step)
        return self

    def setup(self) -> None:
        """During setup (before any collective): faults injected at step 0."""
        self.faults.fire(0)

    def loss_weight(self, weight: float) -> float:
        """The weight of a micro-batch's loss in backward: NaN where a ``nan`` fault is
        injected this step, so the gradient is poisoned before any reduction."""
        return weight * float("nan") if self.faults.poisons(self.step) else weight

    def after_backward(self, loss: float, flat=None) -> None:
        """Mid-step (DDP's allreduces in flight): injected faults, then the loss check."""
        self.faults.fire(self.step)
        self.guard.check_loss(self.step, loss)

    def stats(self) -> dict:
        return self.guard.stats()


def release(strategy, e: BaseException, step) -> None:
    """The run is failing: note where, and let the strategy drop its requests without
    waiting for any peer (``Strategy.abandon``), so the failure reaches the caller
    now, not after another timeout."""
    if step is not None:
        note_step(e, step)
    if strategy is not None:
        abandon = getattr(strategy, "abandon", None)
        if abandon is not None:
            abandon()


__all__ = ["StepChecks", "release"]
