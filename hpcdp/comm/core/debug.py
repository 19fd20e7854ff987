"""The debug-mode check: ranks that disagree are named at once.

A fingerprint (hpcdp.comm.core.fingerprint) is what identifies one collective call.
Normally nothing is sent ahead of a collective; a deadline that passes starts the lazy
missing-rank diagnosis (hpcdp.comm.core.diagnose), which exchanges fingerprints then.

In debug mode (``HPCDP_DEBUG=1`` or :func:`hpcdp.comm.set_debug`) each rank first
sends its fingerprint to every peer on the control communicator, waits for all of
theirs and compares them: every rank sees the same set, so every rank raises the
same :class:`CollectiveMismatch` naming the disagreeing ranks. This is a
synchronisation point (an all-to-all of 56-byte messages) before each collective:
its cost is latency, which is why it is opt-in.
"""

from __future__ import annotations

import os
import time

import numpy as np
from mpi4py import MPI

from hpcdp.comm.core.errors import CollectiveMismatch
from hpcdp.comm.core.fingerprint import FIELDS, describe, fingerprint


def debug_check(ctx, call: tuple, timeout: float) -> None:
    """Debug mode: exchange fingerprints with every peer and compare; raise
    :class:`CollectiveMismatch` (same on every rank) or, past the deadline, the
    diagnosis' :class:`CollectiveTimeout`."""
    from hpcdp.comm.core.diagnose import diagnose, pending

    fp = fingerprint(*call)
    seq = call[0]
    peers = [p for p in range(ctx.size) if p != ctx.rank]
    theirs = np.zeros((len(peers), len(FIELDS)), dtype=np.int64)
    tag = ctx.ctrl_tag(seq)
    ctx.keep([ctx.ctrl.Isend([fp, MPI.INT64_T], p, tag) for p in peers])
    recvs = [ctx.ctrl.Irecv([theirs[i], MPI.INT64_T], p, tag) for i, p in enumerate(peers)]
    start = time.monotonic()
    deadline = start + timeout
    idle = 0
    while not MPI.Request.Testall(recvs):
        idle = _idle(idle)
        if idle % 64 == 0:
            joined = idle > SPIN_POLLS and pending(ctx)
            if joined or time.monotonic() > deadline:
                raise diagnose(ctx, call, time.monotonic() - start, timeout, joined=joined)
    compare(ctx, seq, fp, peers, theirs)


def compare(ctx, seq, fp, peers, theirs) -> None:
    groups: dict[tuple, list[int]] = {tuple(int(v) for v in fp): [ctx.rank]}
    for p, row in zip(peers, theirs):
        groups.setdefault(tuple(int(v) for v in row), []).append(p)
    if len(groups) == 1:
        return
    ordered = sorted(groups.items(), key=lambda kv: (-len(kv[1]), min(kv[1])))
    majority = ordered[0][1] if len(ordered[0][1]) > len(ordered[1][1]) else []
    disagreeing = sorted(r for _, ranks in ordered for r in ranks if r not in majority)
    readable = {describe(fp): sorted(ranks) for fp, ranks in ordered}
    lines = "; ".join(f"ranks {ranks} called {fp}" for fp, ranks in readable.items())
    raise CollectiveMismatch(
        f"collective mismatch at sequence number {seq} (seen on rank {ctx.rank}): "
        f"ranks {disagreeing} disagree: {lines}",
        seq=seq, groups=readable, disagreeing=disagreeing)


SPIN_POLLS = 2000


def _idle(idle: int) -> int:
    """Busy-poll like MPI does; after SPIN_POLLS fruitless polls (about a
    millisecond) give the core away every 64 polls, so oversubscribed ranks
    (more ranks than cores) let their peers run. Yielding earlier costs latency
    on a loaded machine: the yielding rank can lose the core for a time slice."""
    idle += 1
    if idle > SPIN_POLLS and idle % 64 == 0:
        os.sched_yield()
    return idle
