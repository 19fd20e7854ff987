"""Lazy missing-rank detection: who never arrived, found only once a deadline passed.

A collective sends nothing extra on its way (no arrival tokens: they cost 6-23 us
per call, docs/results.md). Only when a wait passes its deadline does the rank run
a short exchange on the control communicator (``ctx.ctrl``, a Dup of the user's):

1. **status**: it sends its state (rank, sequence number and fingerprint of the
   collective it waits in, seconds waited) to every peer and waits up to
   :func:`grace_s` seconds for theirs. A rank waiting in any hpcdp collective
   notices a status message within about a millisecond (wait loops probe for one
   once they stop spinning, ``test()`` every 1024 fruitless calls) and joins the
   exchange. A rank that is stopped, dead, or busy outside hpcdp (it never arrived)
   does not answer.
2. **views**: each rank sends the set of ranks it heard from to every peer and
   collects the views of the ranks it heard from (all of them are in the exchange
   by then: milliseconds). A rank counts as arrived only if every view holds it.
   So every rank that takes part names the same missing ranks, even a straggler
   that joins after the others concluded (their views wait in its mailbox), and a
   rank that answered one peer but not another is named on all of them.

Limit: a live rank whose own messages cannot leave is named too. With MPICH's
shared memory this happens when it has many small (eager) messages queued to the
stopped rank (a ring with segments of a few KiB): they hold its send cells, and its
answers wait behind them. Every rank still names the same set (the stopped rank
and that neighbour); with the default 1 MiB segments (rendezvous messages) only
the stopped rank is named.

The answering ranks' fingerprints also show collectives that disagree (a
mismatch without debug mode), described in the message. Cost: nothing until a
deadline passes; then at most two grace periods. The communicator is marked
failed afterwards (``ctx.failed``): every later wait on it raises the same error
at once, so a job that is ending never waits a second timeout.
"""

from __future__ import annotations

import time

import numpy as np
from mpi4py import MPI

from hpcdp.comm.core.fingerprint import FIELDS, describe, fingerprint
from hpcdp.comm.core.errors import CollectiveTimeout

STATUS, VIEW = 1, 2
HEAD = 4 + len(FIELDS)  # kind, rank, seq, waited ms, fingerprint fields


def grace_s(timeout: float) -> float:
    """How long a diagnosing rank waits for its peers' answers: a tenth of the
    timeout, at least 1 s (a loaded machine) and at most 5 s."""
    return min(5.0, max(1.0, 0.1 * float(timeout)))


def pending(ctx) -> bool:
    """True when a peer has started a diagnosis (its status message waits here)."""
    return ctx.ctrl.Iprobe(MPI.ANY_SOURCE, ctx.status_tag)


def peer_failed(ctx) -> bool:
    """This communicator already failed, or a peer started a diagnosis: stop waiting."""
    return ctx.failed is not None or pending(ctx)


def _collect(recvs: dict, grace: float) -> set:
    """Poll ``{rank: request}`` until all complete or ``grace`` s passed; the ranks done."""
    deadline = time.monotonic() + grace
    reqs = list(recvs.values())
    while reqs and not MPI.Request.Testall(reqs):
        if time.monotonic() > deadline:
            break
        time.sleep(0.0005)
    return {p for p, r in recvs.items() if r.Test()}


def diagnose(ctx, call: tuple, waited: float, timeout: float, waiting_on=(),
             joined: bool = False) -> CollectiveTimeout:
    """Run the exchange (module docstring) and return the error to raise.

    ``call`` is ``(seq, name, dtype, length, root, algorithm, op)`` of the collective
    this rank waits in; ``joined``: a peer's status message, not this rank's own
    deadline, started it.
    """
    if ctx.failed is not None:
        return ctx.failed
    N, r = ctx.size, ctx.rank
    seq, name = call[0], call[1]
    grace = grace_s(timeout)
    peers = [p for p in range(N) if p != r]
    width = HEAD + N
    mine = np.zeros(width, dtype=np.int64)
    mine[:4] = (STATUS, r, seq, int(waited * 1000))
    mine[4:HEAD] = fingerprint(*call)
    states = np.zeros((N, width), dtype=np.int64)
    ctx.keep([ctx.ctrl.Isend([mine, MPI.INT64_T], p, ctx.status_tag) for p in peers])
    recvs = {p: ctx.ctrl.Irecv([states[p], MPI.INT64_T], p, ctx.status_tag) for p in peers}
    ctx.keep(recvs.values())  # a late answer must land in a live buffer
    heard = _collect(recvs, grace) | {r}
    view = np.zeros(width, dtype=np.int64)
    view[:4] = (VIEW, r, seq, 0)
    view[[HEAD + p for p in heard]] = 1
    ctx.keep([ctx.ctrl.Isend([view, MPI.INT64_T], p, ctx.view_tag) for p in peers])
    views = np.zeros((N, width), dtype=np.int64)
    recvs = {p: ctx.ctrl.Irecv([views[p], MPI.INT64_T], p, ctx.view_tag) for p in heard if p != r}
    ctx.keep(recvs.values())
    got = _collect(recvs, grace)
    arrived = set(heard)
    for p in got:
        arrived &= {q for q in range(N) if views[p, HEAD + q]}
    states[r] = mine
    missing = sorted(set(range(N)) - arrived)
    err = _error(ctx, name, seq, timeout, waited, joined, missing, sorted(waiting_on),
                 {p: states[p] for p in sorted(arrived)}, grace)
    ctx.failed = err
    return err


def _error(ctx, name, seq, timeout, waited, joined, missing, waiting_on, states, grace):
    why = "; another rank's deadline passed first" if joined else ""
    head = (f"collective {name!r} (sequence number {seq}) timed out after {timeout:g}s on "
            f"rank {ctx.rank} (waited {waited:.1f}s{why})")
    groups: dict[tuple, list[int]] = {}
    for p, row in states.items():
        groups.setdefault(tuple(int(v) for v in row[4:HEAD]), []).append(p)
    where = "; ".join(f"ranks {ranks} wait in {describe(fp)}" for fp, ranks in groups.items())
    if missing:
        msg = (f"{head}: ranks {missing} never arrived (no answer within {grace:g}s: they are "
               f"outside hpcdp's collectives, stopped or dead, or could not send); {where}")
    elif len(groups) > 1:
        msg = (f"{head}: every rank arrived but ranks disagree on the collective: {where}")
    else:
        msg = (f"{head}: every rank arrived but it did not complete; still waiting for data "
               f"from ranks {waiting_on} (a rank died, or ranks disagree on the collective: "
               "rerun with HPCDP_DEBUG=1)")
    err = CollectiveTimeout(msg, seq=seq, name=name, missing=missing, waiting_on=waiting_on)
    err.states = {p: describe(fp) for fp, ranks in groups.items() for p in ranks}
    err.waited = waited
    err.arrived = sorted(states)  # the same on every rank that took part
    err.joined = joined
    return err
