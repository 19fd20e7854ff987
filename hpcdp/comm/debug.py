"""Arrival tokens, fingerprints and timeouts: no collective hangs silently.

Every collective call, in every mode, sends a small fingerprint (sequence number,
collective, dtype, length, root, algorithm, op) to every peer on the control
communicator and posts receives for theirs: 2(N-1) messages of 56 bytes per rank,
not counted in the ledger. Normally nobody waits for them; they are the
out-of-band record of who arrived. When a collective times out, the fingerprints
that never came name the ranks that never arrived.

In debug mode (``HPCDP_DEBUG=1`` or :func:`hpcdp.comm.set_debug`) each rank first
waits for all fingerprints and compares them: every rank sees the same set, so
every rank raises the same :class:`CollectiveMismatch` naming the disagreeing
ranks. This is a synchronisation point (an all-to-all of tokens) before each
collective: its cost is latency, which is why it is opt-in.
"""

from __future__ import annotations

import os
import time
import zlib

import numpy as np
from mpi4py import MPI

from hpcdp.comm.errors import CollectiveMismatch, CollectiveTimeout

FIELDS = ("seq", "collective", "dtype", "length", "root", "algorithm", "op")
_NAMES: dict[int, str] = {}


_CODES: dict[str, int] = {}


def code(text: str) -> int:
    """A stable integer for a name (collective, dtype, algorithm, op)."""
    value = _CODES.get(text)
    if value is None:
        value = _CODES[text] = zlib.crc32(text.encode())
        _NAMES[value] = text
    return value


def describe(fp) -> str:
    parts = []
    for field, value in zip(FIELDS, (int(v) for v in fp)):
        if field in ("collective", "dtype", "algorithm", "op"):
            value = _NAMES.get(value, value)
        parts.append(f"{field}={value}")
    return "(" + ", ".join(parts) + ")"


def fingerprint(seq, name, dtype, length, root=-1, algorithm="", op="") -> np.ndarray:
    return np.array([seq, code(name), code(np.dtype(dtype).str), length, root,
                     code(str(algorithm)), code(str(op))], dtype=np.int64)


class Arrival:
    """This rank's tokens for one collective: sent to, and expected from, every peer."""

    def __init__(self, ctx, fp: np.ndarray):
        self.ctx, self.fp = ctx, fp
        self.seq = int(fp[0])
        self.peers = [p for p in range(ctx.size) if p != ctx.rank]
        self.theirs = np.zeros((len(self.peers), len(FIELDS)), dtype=np.int64)
        tag = ctx.ctrl_tag(self.seq)
        self.sends = [ctx.ctrl.Isend([fp, MPI.INT64_T], p, tag) for p in self.peers]
        self.recvs = [ctx.ctrl.Irecv([self.theirs[i], MPI.INT64_T], p, tag)
                      for i, p in enumerate(self.peers)]
        _reap(ctx)

    def missing(self) -> list[int]:
        """Peers whose token for this collective has not arrived (yet)."""
        return [p for p, r in zip(self.peers, self.recvs) if not r.Test()]

    def check(self, name: str, timeout: float) -> None:
        """Debug mode: wait for every fingerprint and compare; raise on mismatch."""
        deadline = time.monotonic() + timeout
        idle = 0
        while not MPI.Request.Testall(self.recvs):
            if time.monotonic() > deadline:
                raise timeout_error(self.ctx, name, self.seq, self.missing(), [], timeout)
            idle = _idle(idle)
        self.compare()

    def compare(self) -> None:
        groups: dict[tuple, list[int]] = {tuple(int(v) for v in self.fp): [self.ctx.rank]}
        for p, row in zip(self.peers, self.theirs):
            groups.setdefault(tuple(int(v) for v in row), []).append(p)
        if len(groups) == 1:
            return
        ordered = sorted(groups.items(), key=lambda kv: (-len(kv[1]), min(kv[1])))
        majority = ordered[0][1] if len(ordered[0][1]) > len(ordered[1][1]) else []
        disagreeing = sorted(r for _, ranks in ordered for r in ranks if r not in majority)
        readable = {describe(fp): sorted(ranks) for fp, ranks in ordered}
        lines = "; ".join(f"ranks {ranks} called {fp}" for fp, ranks in readable.items())
        raise CollectiveMismatch(
            f"collective mismatch at sequence number {self.seq} (seen on rank {self.ctx.rank}): "
            f"ranks {disagreeing} disagree: {lines}",
            seq=self.seq, groups=readable, disagreeing=disagreeing)

    def finish(self) -> None:
        """Collective done: leave unfinished token requests to be reaped later."""
        self.ctx.pending_tokens.append((self.sends + self.recvs, self.fp, self.theirs))


def _reap(ctx) -> None:
    """Complete token requests of earlier collectives (cheap Testall)."""
    if ctx.pending_tokens:
        ctx.pending_tokens = [p for p in ctx.pending_tokens if not MPI.Request.Testall(p[0])]


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


def timeout_error(ctx, name, seq, missing, waiting_on, timeout) -> CollectiveTimeout:
    if missing:
        msg = (f"collective {name!r} (sequence number {seq}) timed out after {timeout:g}s on "
               f"rank {ctx.rank}: ranks {missing} never arrived")
    else:
        msg = (f"collective {name!r} (sequence number {seq}) timed out after {timeout:g}s on "
               f"rank {ctx.rank}: every rank arrived but it did not complete; still waiting "
               f"for data from ranks {waiting_on} (a rank died, or ranks disagree on the "
               "collective: rerun with HPCDP_DEBUG=1)")
    return CollectiveTimeout(msg, seq=seq, name=name, missing=missing, waiting_on=waiting_on)
