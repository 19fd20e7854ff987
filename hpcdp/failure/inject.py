"""``HPCDP_FAULT``: a test hook that injects a fault on one rank of a real job.

The fault-injection tests (tests/faults) launch ``hpcdp train`` under ``mpiexec``
with, e.g., ``HPCDP_FAULT=1:5:raise``: rank 1 raises at step 5. Format:
``RANK:STEP:KIND`` (several separated by commas). STEP 0 means during setup
(after the data is loaded, before any collective); a step k >= 1 fires after that
step's backward, in the middle of the step (DDP's allreduces are in flight).

KIND is one of:

=========  ===========================================================
raise      ``RuntimeError("injected fault ...")``
memory     ``MemoryError`` (a rank running out of memory)
exit       ``sys.exit(0)``: the rank's Python exits cleanly, mid-training
kill       SIGKILL to itself (a rank killed by the OOM killer or a node loss)
stop       SIGSTOP to itself (a rank stuck outright; it never continues)
sigint     SIGINT to itself (Ctrl-C on one rank)
sigterm    SIGTERM to itself
nan        this rank's loss weight becomes NaN for that step's backward, so its
           gradient is NaN BEFORE the strategy reduces it (as a real overflow
           in backward would be); any strategy, any device
kill-in-repair    SIGKILL to itself in the middle of a repair of
                  ``failure.on_rank_loss = "continue"`` (after the survivors' first
                  agreement: a second rank lost during a repair); STEP is ignored
stop-at-end       SIGSTOP to itself after the run, before the final barrier (a rank
                  stuck on its way out); STEP is ignored
stop-in-finalize  SIGSTOP to itself after the final barrier, just before
                  ``MPI_Finalize``: the other ranks' ``MPI_Finalize`` never returns
                  (as it can with some MPI/PMI stacks); STEP is ignored
=========  ===========================================================

Not set (the normal case), the per-step cost is one truth test of an empty dict.
"""

from __future__ import annotations

import os
import signal
import sys

from .ranks import say

AT_END = ("stop-at-end", "stop-in-finalize")  # fired by hpcdp.failure.shutdown, not at a step
IN_REPAIR = "kill-in-repair"  # fired by hpcdp.failure.ulfm, not at a step
KINDS = ("raise", "memory", "exit", "kill", "stop", "sigint", "sigterm", "nan", IN_REPAIR) + AT_END
ENV = "HPCDP_FAULT"


def parse(spec: str) -> dict:
    """``"1:5:raise,0:0:memory"`` -> ``{(1, 5): "raise", (0, 0): "memory"}``."""
    out = {}
    for item in filter(None, (s.strip() for s in spec.split(","))):
        parts = item.split(":")
        if len(parts) != 3 or not parts[0].isdigit() or not parts[1].isdigit() or parts[2] not in KINDS:
            raise ValueError(f"{ENV}: {item!r} is not RANK:STEP:KIND with KIND one of {', '.join(KINDS)}")
        out[(int(parts[0]), int(parts[1]))] = parts[2]
    return out


class Faults:
    """The faults ``HPCDP_FAULT`` asks of ``rank`` (read once, when the run starts)."""

    def __init__(self, rank: int, spec: str | None = None):
        spec = os.environ.get(ENV, "") if spec is None else spec
        self.rank = rank
        self.at = {step: kind for (r, step), kind in parse(spec).items() if r == rank}

    def poisons(self, step: int) -> bool:
        """Whether a ``nan`` fault poisons this step's backward (see the table)."""
        return bool(self.at) and self.at.get(step) == "nan"

    def fire(self, step: int) -> None:
        if not self.at or step not in self.at or self.at[step] in AT_END + (IN_REPAIR,):
            return
        kind = self.at[step]
        what = f"injected fault ({ENV}: {kind} on rank {self.rank} at step {step})"
        say(f"hpcdp: {what}")
        if kind == "raise":
            raise RuntimeError(what)
        if kind == "memory":
            raise MemoryError(what)
        if kind == "exit":
            sys.exit(0)
        if kind == "nan":
            return  # already in the gradient: see poisons()
        sig = {"kill": signal.SIGKILL, "stop": signal.SIGSTOP, "sigint": signal.SIGINT,
               "sigterm": signal.SIGTERM}[kind]
        os.kill(os.getpid(), sig)

    def fire_at_end(self, kind: str) -> None:
        """An ``AT_END`` fault of this rank, at its point of the run's end."""
        if kind in self.at.values():
            say(f"hpcdp: injected fault ({ENV}: {kind} on rank {self.rank})")
            os.kill(os.getpid(), signal.SIGSTOP)


def in_repair() -> None:
    """The ``kill-in-repair`` fault of this rank (its rank at launch), if asked: called by
    each round of a continue-mode repair (hpcdp.failure.ulfm). Not set: one lookup."""
    spec = os.environ.get(ENV)
    if not spec or IN_REPAIR not in spec:
        return
    from mpi4py import MPI

    rank = MPI.COMM_WORLD.Get_rank()
    if IN_REPAIR in {k for (r, _), k in parse(spec).items() if r == rank}:
        say(f"hpcdp: injected fault ({ENV}: {IN_REPAIR} on rank {rank})")
        os.kill(os.getpid(), signal.SIGKILL)


__all__ = ["Faults", "parse", "in_repair", "KINDS", "ENV"]
