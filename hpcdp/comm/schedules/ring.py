"""The ring's schedule: which chunk each step sends and receives, the segment layout and
the dependency rules every engine that runs the ring obeys. Pure arithmetic, no MPI.

The ring itself (the algorithm, its byte counts, pipelining and 16-bit wire) is
described in hpcdp.comm.ring, whose ``RingRequest`` runs this schedule from Python; the
compiled engine (hpcdp.comm.engines.compiled.request.Plan) writes the same schedule
into the template its kernel runs. Both take it from :func:`ring_schedule`, so the two
engines cannot disagree on a step, a segment or a rule.

Rank r of N: chunk c of an n-element buffer is ``shard_bounds(n, N)[c]``, cut into
segments of ``seg`` elements.

- Reduce-scatter steps t = 0..N-2 send chunk ``(r-t-1) mod N`` and receive chunk
  ``(r-t-2) mod N`` (kind :data:`REDUCE`); all-gather steps u = 0..N-2 send chunk
  ``(r-u) mod N`` and receive chunk ``(r-u-1) mod N`` (kind :data:`COPY`).
- A segment received at step t is forwarded as the same segment of step t+1 (the
  engines' rule when a receive completes); step 0's segments are ready to send at once.
- Reduce-scatter receives land in two chunk-sized scratch slots by step parity: the
  receive of segment k at step t (t >= 2) is allowed once segment k of step t-2 was
  reduced (the engines' rule), unless step t-2's chunk has no segment k
  (:attr:`RingSchedule.open_recvs` lists the receives allowed at the start).
- An all-gather receive overwrites ``work[c]``; if a reduce-scatter send reads that
  chunk, the receive waits for that send (:attr:`RingSchedule.copy_after`), except a
  first-step send out of a separate source buffer.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from hpcdp.shard import shard_bounds

REDUCE, COPY = 0, 1  # a step's kind: reduce what is received into the chunk, or copy it in
# Posted receives per request, and sends tested per poll, in both engines. Testsome costs
# O(list length) per call, so unbounded lists make a many-segment ring quadratic.
# Receives are posted earliest step first; sends are never held back, so the
# earliest outstanding message always has both ends posted (no deadlock).
WINDOW = 32


@dataclass(frozen=True)
class RingSchedule:
    """One rank's ring for one shape (see the module docstring). Tuples only: one
    schedule serves every request of its shape."""

    N: int
    rank: int
    seg: int                 # elements per segment
    bounds: tuple            # (offset, size) of each chunk
    nseg: tuple              # segments of each chunk
    steps: tuple             # (send chunk, receive chunk, kind) per step
    last_rs: int             # the last reduce-scatter step (-1: none)
    mc: int                  # the largest chunk (a scratch slot's length)
    open_recvs: tuple        # (step, segment) receives allowed at the start
    copy_after: tuple        # ((rs send step, segment), all-gather step): the receive waits for the send
    left_recv: int           # receives in all
    left_send: int           # sends in all

    @property
    def left(self) -> int:
        return (self.rank - 1) % self.N

    @property
    def right(self) -> int:
        return (self.rank + 1) % self.N


@lru_cache(maxsize=256)
def ring_schedule(n: int, N: int, rank: int, seg: int, phases: tuple, separate_src: bool) -> RingSchedule:
    """The schedule of rank ``rank`` of ``N`` for an ``n``-element buffer cut into
    ``seg``-element segments. ``phases``: a subset of ``("rs", "ag")`` in that order;
    ``separate_src``: the reduce-scatter's first sends read a source buffer apart from
    the work buffer (out of place), so no all-gather receive waits for them."""
    bounds = tuple(shard_bounds(n, N))
    nseg = tuple(-(-size // seg) for _, size in bounds)
    steps = []
    if "rs" in phases:
        steps += [((rank - t - 1) % N, (rank - t - 2) % N, REDUCE) for t in range(N - 1)]
    if "ag" in phases:
        steps += [((rank - u) % N, (rank - u - 1) % N, COPY) for u in range(N - 1)]
    rs_send_step = {sc: t for t, (sc, _, kind) in enumerate(steps) if kind == REDUCE}
    open_recvs, copy_after = [], []
    for t, (_, rc, kind) in enumerate(steps):
        for k in range(nseg[rc]):
            if kind == REDUCE:
                if t < 2 or k >= nseg[steps[t - 2][1]]:
                    open_recvs.append((t, k))
            else:
                ts = rs_send_step.get(rc)
                if ts is None or (ts == 0 and separate_src):
                    open_recvs.append((t, k))
                else:
                    copy_after.append(((ts, k), t))
    return RingSchedule(
        N=N, rank=rank, seg=seg, bounds=bounds, nseg=nseg, steps=tuple(steps),
        last_rs=(N - 2) if "rs" in phases else -1,
        mc=max((size for _, size in bounds), default=0),
        open_recvs=tuple(open_recvs), copy_after=tuple(copy_after),
        left_recv=sum(nseg[rc] for _, rc, _ in steps), left_send=sum(nseg[sc] for sc, _, _ in steps))


__all__ = ["RingSchedule", "ring_schedule", "REDUCE", "COPY", "WINDOW"]
