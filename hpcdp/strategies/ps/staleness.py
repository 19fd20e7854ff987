"""Staleness bookkeeping of the parameter server: pure logic, no MPI, no arrays math.

Definitions (docs/parameter-server.md states the same, with pictures):

- Steps are numbered from 0. Every worker computes one gradient per step.
- **Update t** of a server is the aggregate of all W workers' gradients of step t
  (for that server's shard). A server applies its updates in step order, each as soon
  as the last of its W gradients has arrived.
- The **version** of a server's shard is the number of updates it has applied: the
  initial weights are version 0, applying update t makes version t + 1.
- A worker computes its step-t gradient from weights of version ``v`` (per server
  shard). The **staleness** of that gradient is ``t - v``: how many updates the weights
  lacked, counting the worker's own step t - 1 and earlier. Update t is applied when
  the server is at version ``u = t``, so this is also ``u - v``.
- **Bound k**: a worker may start step t only once every server's version is
  ``>= t - k``, i.e. before it starts step ``t + k + 1`` the updates of steps ``<= t``
  are applied. So every applied gradient has ``0 <= staleness <= k``.
  ``k = 0`` is the synchronous schedule (version t before step t: the result equals
  synchronous training exactly); ``k = None`` never waits (staleness unbounded).
"""

from __future__ import annotations

from dataclasses import dataclass, field

# The option checks live with the options (plain data, parsed without this package).
from hpcdp.config_parallel import (  # noqa: F401  (re-exported)
    STALE_LR_RULES, UNBOUNDED_SPELLINGS, check_stale_lr, parse_staleness,
)

HISTORY = 1024  # per-update / per-step records kept for inspection: the most recent 1024 .. 2047


class StalenessError(RuntimeError):
    """A gradient arrived that violates the protocol (order, version or bound)."""


def stale_factors(staleness, rule: str):
    """Per-gradient learning-rate factors of one update, or None for "all exactly 1".

    ``staleness`` lists the update's W gradients' staleness ``s`` (worker order).
    Every rule starts from the staleness-aware learning rate of Zhang, Gupta, Lian and
    Liu (2016), ``1 / max(1, s)``; ``s`` counts the worker's own previous step, so 0
    (synchronous) and 1 (one step pipelined) keep the full rate.

    - ``"inverse"``: exactly that: gradient i enters with ``1 / max(1, s_i)`` of the lr.
    - ``"relative"``: the same shares, normalized to mean 1 over the update: stale
      gradients are damped relative to the fresh ones of the same update, the update
      keeps the step's learning rate. (Why this is the default: docs/parameter-server.md.)
    - ``"none"``: no damping.

    None (no arithmetic at all) when every factor would be 1: k = 0, k = 1, and
    "relative" with equal staleness, so k = 0 stays bit-identical to synchronous PS.
    """
    s = [max(1, int(x)) for x in staleness]
    if rule == "none" or max(s) == 1 or (rule == "relative" and min(s) == max(s)):
        return None
    inv = [1.0 / x for x in s]
    if rule == "inverse":
        return inv
    mean = sum(inv) / len(inv)
    return [v / mean for v in inv]


def damp_stale(grads, staleness, rule: str) -> None:
    """In place: scale gradient i by :func:`stale_factors` ``[i]`` (before aggregation).

    Scaling the gradient is scaling its learning rate for plain SGD; with momentum it
    scales the gradient's entry into the momentum buffer, so an old gradient is damped
    for as long as it echoes."""
    factors = stale_factors(staleness, rule)
    if factors is None:
        return
    for g, c in zip(grads, factors):
        if c != 1.0:
            g *= c


@dataclass(frozen=True)
class StalenessBound:
    """The worker-side rule: which version must be in before a step may start."""

    k: int | None

    def __post_init__(self):
        parse_staleness(self.k)

    def min_version(self, step: int) -> int:
        """Smallest shard version a worker needs before computing ``step``."""
        if self.k is None:
            return 0
        return max(0, step - self.k)

    def may_start(self, step: int, version: int) -> bool:
        return version >= self.min_version(step)

    def allows(self, staleness: int) -> bool:
        return staleness >= 0 and (self.k is None or staleness <= self.k)


class Recent(list):
    """A list that keeps only its most recent ``keep`` .. ``2 * keep`` items: older ones
    are dropped ``keep`` at a time (amortized O(1) per append), so per-step records
    cost bounded memory however long a run is. ``total`` counts every append."""

    def __init__(self, keep: int = HISTORY):
        super().__init__()
        self.keep, self.total = keep, 0

    def append(self, item) -> None:
        super().append(item)
        self.total += 1
        if len(self) >= 2 * self.keep:
            del self[:len(self) - self.keep]


@dataclass(slots=True)
class Applied:
    """One worker's gradient inside one applied update (what metrics record)."""

    update: int      # = the step the gradient belongs to
    worker: int      # worker index (dp_rank)
    version: int     # shard version the gradient was computed from
    staleness: int   # update - version


@dataclass
class ServerClock:
    """A server's clocks: what each worker pushed, which update is complete, staleness.

    ``push`` files worker ``w``'s step-``t`` gradient; ``pop_ready`` hands back the next
    update (step order) once all workers' gradients of that step are in, with the
    gradients in worker order (so aggregation order does not depend on arrival order:
    k = 0 reproduces synchronous training bit for bit). Cost: gradients of steps ahead
    of the slowest worker are kept until that worker catches up, up to k + 1 steps per
    worker (unbounded when k is None).
    """

    num_workers: int
    bound: StalenessBound
    version: int = 0
    clock: list = field(default_factory=list)       # next step expected from each worker
    done_at: list = field(default_factory=list)     # steps a finished worker pushed, else None
    pending: dict = field(default_factory=dict)     # step -> {worker: (version, payload)}
    applied: list = field(default_factory=Recent)   # Applied records, in apply order (recent ones)

    def __post_init__(self):
        if self.num_workers < 1:
            raise ValueError(f"ServerClock: needs at least one worker, got {self.num_workers}")
        self.clock = [0] * self.num_workers
        self.done_at = [None] * self.num_workers

    def push(self, worker: int, step: int, version: int, payload) -> None:
        if not 0 <= worker < self.num_workers:
            raise StalenessError(f"push from unknown worker {worker} (workers 0..{self.num_workers - 1})")
        if self.done_at[worker] is not None:
            raise StalenessError(f"worker {worker} pushed step {step} after it said done")
        if step != self.clock[worker]:
            raise StalenessError(f"worker {worker} pushed step {step}, expected step {self.clock[worker]}")
        if version > self.version:
            raise StalenessError(f"worker {worker} step {step}: version {version} is newer than "
                                 f"the server's {self.version}")
        if not self.bound.allows(step - version):
            raise StalenessError(f"worker {worker} step {step} computed from version {version}: "
                                 f"staleness {step - version} exceeds k = {self.bound.k}")
        self.pending.setdefault(step, {})[worker] = (version, payload)
        self.clock[worker] = step + 1

    def ready(self) -> bool:
        """Is update ``version`` (the next one) complete?"""
        return len(self.pending.get(self.version, ())) == self.num_workers

    def pop_ready(self):
        """Return ``(update, payloads in worker order)`` of the next complete update and
        advance the version; the staleness of each gradient is recorded in ``applied``."""
        if not self.ready():
            raise StalenessError(f"update {self.version} is not complete")
        update = self.version
        entries = self.pending.pop(update)
        payloads = []
        for w in range(self.num_workers):
            version, payload = entries[w]
            self.applied.append(Applied(update, w, version, update - version))
            payloads.append(payload)
        self.version += 1
        return update, payloads

    def finish(self, worker: int, steps: int) -> None:
        """Worker says it is done after pushing ``steps`` gradients."""
        if self.done_at[worker] is not None:
            raise StalenessError(f"worker {worker} said done twice")
        if steps != self.clock[worker]:
            raise StalenessError(f"worker {worker} said done after {steps} steps but pushed "
                                 f"{self.clock[worker]}")
        self.done_at[worker] = steps

    @property
    def all_done(self) -> bool:
        return all(d is not None for d in self.done_at)

    def check_finished(self) -> int:
        """After every worker is done: all took the same number of steps and every
        update was applied (no gradient left behind). Returns the number of updates."""
        if not self.all_done:
            missing = [w for w, d in enumerate(self.done_at) if d is None]
            raise StalenessError(f"workers {missing} have not finished")
        counts = set(self.done_at)
        if len(counts) != 1:
            raise StalenessError(f"workers finished after different numbers of steps: {self.done_at}")
        if self.pending:
            raise StalenessError(f"updates {sorted(self.pending)} were never completed")
        return self.version
