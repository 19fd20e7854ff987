"""``failure.on_rank_loss = "continue"``: the survivors of a lost rank repair the job with
MPI's fault-tolerance interface (ULFM) and keep training (docs/fault-tolerance.md).

One repair, on every survivor (:func:`repair`), once a step's collective failed
(``MPIError``: ``MPI_ERR_PROC_FAILED`` on a rank that waited on the dead one,
``MPI_ERR_REVOKED`` on the others, or hpcdp's deadline):

1. **revoke**: hpcdp's duplicates of every communicator in use (hpcdp.comm.abort with
   ``revoke``) and the communicators themselves (``MPI_Comm_revoke``), so no survivor
   stays blocked in a collective that can no longer complete;
2. **shrink**: ``MPI_Comm_shrink`` of the world communicator: the survivors, in their
   old order; the lost world ranks are read off the two groups;
3. **agree** on the last committed step: a rank applies a step's update once its
   gradient allreduce completed, so survivors may stand one step apart; every survivor
   takes the highest committed step, the lowest rank that holds it is the source;
   they also agree on the step at which the loss was seen (the lowest step any
   survivor was in: a rank that noticed it a step later names the same step);
4. **heal**: that rank's parameters, optimizer state and step count go to every
   survivor (broadcast), and an allgathered hash checks that the replicas are
   bit-identical; the caller then rebuilds the communicator state and the data split
   and redoes the next step.

Hybrid ZeRO (``parallel.zero.shard = "node"``) repairs by whole nodes (``domain``):
a node holds one copy of the sharded state, split over its ranks, and every other node
holds the same shards. After the shrink, a node that lost any rank is lost as a whole:
its surviving ranks leave (:attr:`Repaired.leaving`; they hold only a part of a copy)
and the other nodes split off a communicator of their own; in step 4 each shard comes
from one of its replicas (the ranks with the same local rank, one per node) and the
hash is compared within each shard's replicas.

A rank lost during the repair itself fails that round on every survivor (an agreement,
``MPI_Comm_agree``, after each round: its result is the same everywhere): they revoke
what the round made and repair again on this round's survivors. A rank whose state a
broadcast cut short is no longer a source; when no whole state survives, the job ends.

**Ending together.** A rank that fails for any other reason (a bug, a non-finite loss, a
deadline that passed) cannot end the job with ``MPI_Abort``: under ``--with-ft ulfm``
that ends only the caller, and the others would repair around it as if it were lost.
Instead it starts the same repair with its error line (``ending``): the revoke stops
every peer's collective, the peers enter their repair, all shrink (nobody is lost) and
the first agreement carries the line: every rank raises :class:`Ending` with the shrunk
communicator and they end together (hpcdp.failure.ranks.end_together): the lowest
failing rank prints its line once, every rank exits with its status.

ULFM is there only where the MPI library implements it at run time:
:func:`check_available` accepts Open MPI 5 started with ``mpirun --with-ft ulfm``
(it exports ``OMPI_MCA_mpi_ft_enable=1`` to the ranks) and refuses anything else
with one line (MPICH 5.0.2 exports the MPIX_ symbols, but its implementation
failed assertions when tried).
"""

from __future__ import annotations

import hashlib
import os
import time
from dataclasses import dataclass

import numpy as np

from hpcdp.comm import CommError
from hpcdp.config_error import ConfigError

from . import inject


def check_available(mpi) -> None:
    """Raise a ConfigError (one line) unless this MPI runs with ULFM enabled."""
    lib = mpi.Get_library_version().strip().splitlines()[0].split(",")[0].strip()
    has_calls = all(hasattr(mpi.Comm, n) for n in ("Revoke", "Shrink", "Agree"))
    enabled = lib.startswith("Open MPI") and os.environ.get("OMPI_MCA_mpi_ft_enable", "").lower() in ("1", "true")
    if not (has_calls and enabled):
        raise ConfigError(
            f"failure.on_rank_loss: 'continue' needs MPI's fault-tolerance interface (ULFM) at run "
            f"time; this job runs {lib}{' without it enabled' if lib.startswith('Open MPI') else ''}. "
            "Launch with Open MPI 5 as `mpirun --with-ft ulfm ...` (docs/fault-tolerance.md), "
            "or set failure.on_rank_loss = 'stop'")


class Ending(CommError):
    """A rank failed in continue mode (not a lost rank): raised on every live rank by the
    repair's first agreement, so that the job ends together (module docstring). ``line``
    and ``exit_status``: those of the failing rank (the lowest, if several failed);
    ``ending_comm``: the shrunk communicator of every live rank; ``ending_reporter``:
    that rank's rank in it. Its message is the failure's own description."""

    def __init__(self, why: str, line: str, status: int, comm, reporter: int, step=None):
        super().__init__(why)
        self.line, self.exit_status = line, status
        self.ending_comm, self.ending_reporter = comm, reporter
        if step is not None:
            self._hpcdp_step = int(step)  # hpcdp.failure.policy.step_of


class NoReplica(RuntimeError):
    """Hybrid ZeRO: no surviving replica of some shard stands at the agreed step (the
    step committed on some ranks only): the job ends as with "stop"."""


@dataclass
class Repaired:
    comm: object          # the survivors' world communicator (errors returned); None when leaving
    lost: list            # world ranks (of the communicator before) that were lost or left
    size_before: int
    step: int             # the agreed last committed step: training goes on after it
    source: int           # the rank (of ``comm``) whose state every survivor took
    repair_s: float       # from the start of the repair to the replicas checked
    weights_hash: str     # the hash every replica holds afterwards (hex)
    dead: list = None     # world ranks whose process failed (``lost`` less the ranks that left)
    left: list = None     # world ranks that left with their node (hybrid ZeRO), alive
    leaving: bool = False  # this rank is one of ``left``: it ends itself (no comm)
    domains_lost: list = None  # the failure domains (nodes) lost, by their index before
    at_step: int = None   # the step at which the loss was seen: the lowest any survivor was in
    alive: object = None  # the shrunk communicator of every live rank (the leaving ones too)
    rounds: int = 1       # rounds of the repair: one more for each rank lost during it


def _lost_ranks(old, new) -> list[int]:
    from mpi4py import MPI

    kept = MPI.Group.Translate_ranks(new.Get_group(), list(range(new.Get_size())), old.Get_group())
    return sorted(set(range(old.Get_size())) - set(kept))


def replica_hash(arrays) -> str:
    h = hashlib.blake2b(digest_size=16)
    for a in arrays:
        h.update(np.ascontiguousarray(a).view(np.uint8).tobytes())
    return h.hexdigest()


def repair(world_comm, others, committed: int, arrays: list, scalars: dict, *, reason: str,
           timeout: float = 300.0, domain: tuple | None = None, step: int | None = None,
           ending: tuple | None = None) -> Repaired:
    """The repair of the module docstring, on every survivor. ``others``: further
    communicators in use (revoked, then left to the caller to forget); ``arrays``: the
    state every replica must hold (numpy, written in place on the receivers);
    ``scalars``: name -> int (e.g. the optimizer's step count), the source's values
    returned in place of the dict's. Returns what the caller rebuilds from.
    ``domain``: hybrid ZeRO's ``(node, local rank, ranks per node)`` of this rank
    (module docstring); None: every rank holds the whole state (DDP). Raises
    :class:`NoReplica` when a shard has no replica at the agreed step (its ``comm``: the
    ranks that raise it; ``at_step``: as below). ``step``: the step this rank was in when
    it saw the loss (default ``committed + 1``); every survivor takes the lowest
    (:attr:`Repaired.at_step`). ``ending``: ``(why, line, status)`` of this rank's own
    failure: the job ends together (module docstring); then, and whenever any rank of the
    agreement brings one, this raises :class:`Ending` on every rank.

    The shrink waits for every rank that is alive: one that is stuck (alive, never
    answering) would hold it forever, so it runs under a timer: after ``timeout``
    seconds this rank prints why and ends itself (status 1)."""
    from mpi4py import MPI

    from hpcdp import comm as hcomm

    t0 = time.monotonic()
    for c in [world_comm, *others]:
        hcomm.abort(c, reason, revoke=True)  # hpcdp's duplicates: peers in its collectives fail too
        try:
            c.Revoke()
        except MPI.Exception:
            pass  # already revoked by a peer
    from .ranks import exit_unless_done

    stuck = (f"hpcdp: error: rank {world_comm.Get_rank()}: the repair after a lost rank did not complete "
             f"within {timeout:g}s (comm.timeout): a rank is alive but not answering; ending this rank with "
             "status 1", 1)
    if ending is not None:  # this rank's own line first: nobody else knows it yet
        stuck = (f"{ending[1]} (ending the job together: a rank is alive but did not answer within "
                 f"{timeout:g}s; ending this rank with status {ending[2]})", ending[2])
    mine = committed + 1 if step is None else int(step)
    held = committed  # -1 once a broadcast into this rank's state was cut short
    comm = world_comm
    rounds = 0
    while True:  # one round per failure: a rank lost during a round makes every survivor redo it
        rounds += 1
        with exit_unless_done(timeout, *stuck):
            new = comm.Shrink()
        new.Set_errhandler(MPI.ERRORS_RETURN)
        seen = {"made": [new], "kept": new, "held": held}
        try:
            rep = _round(world_comm, new, seen, held, committed, mine, arrays, scalars, domain, ending, t0)
            ok = 1
        except MPI.Exception:
            rep, ok = None, 0
            for c in seen["made"]:  # every survivor of this round leaves its collectives
                try:
                    c.Revoke()
                except MPI.Exception:
                    pass
        held = seen["held"]  # -1: a broadcast into this rank's state was cut short
        if rep is not None and rep.leaving:
            return rep
        try:  # uniform: a rank lost during the round fails the agreement on every survivor
            ok = seen["kept"].Agree(ok)
        except MPI.Exception:
            ok = 0
        if ok:
            rep.rounds = rounds
            return rep
        comm = seen["kept"]  # this round's survivors, less the newly lost: shrink it again


def _round(world_comm, new, seen, held, committed, mine, arrays, scalars, domain, ending, t0) -> Repaired:
    """One round of :func:`repair` on the shrunk communicator ``new``: the agreements,
    the broadcast of the state and the replicas' check. ``seen``: the communicators it
    splits off (``made``, revoked by the caller if the round fails; ``kept``, those that
    go on) and ``held``, this rank's committed step as its state now stands. ``held``: this
    rank's committed step on entry, or -1 once a broadcast into its state was cut short (it
    can no longer be a source). Raises an MPI error when a rank is lost during the round."""
    from mpi4py import MPI

    dead = _lost_ranks(world_comm, new)
    kept, cross, gone = new, new, []
    where = new.allgather((mine, None if domain is None else (int(domain[0]), int(domain[1])), ending))
    inject.in_repair()
    at_step = min(s for s, _, _ in where)
    ends = [(r, e) for r, (_, _, e) in enumerate(where) if e is not None]
    if ends:  # a rank failed (not lost): every live rank ends with its line
        first, (why, line, status) = ends[0]
        raise Ending(why, line, status, new, first, where[first][0])
    where = [w for _, w, _ in where]
    if domain is not None:
        node, local, per = (int(v) for v in domain)
        count: dict = {}
        for n, _ in where:
            count[n] = count.get(n, 0) + 1
        gone = sorted(n for n, k in count.items() if k < per)
        if gone:  # a node short of a rank: its survivors leave, the others go on alone
            leaving = node in gone
            kept = new.Split(MPI.UNDEFINED if leaving else 0, new.Get_rank())
            if leaving:  # the caller ends this rank: nothing more is sent
                going = [r for r, (n, _) in enumerate(where) if n in gone]
                left = sorted(MPI.Group.Translate_ranks(new.Get_group(), going, world_comm.Get_group()))
                return Repaired(None, sorted(set(dead) | set(left)), world_comm.Get_size(), committed, -1,
                                time.monotonic() - t0, "", dead, left, True, gone, at_step, new)
            kept.Set_errhandler(MPI.ERRORS_RETURN)
            seen["made"].append(kept)
            seen["kept"] = kept
        if per > 1:  # the replicas of this rank's shard: one rank per node, by node
            cross = kept.Split(local, kept.Get_rank())
            cross.Set_errhandler(MPI.ERRORS_RETURN)
            seen["made"].append(cross)
    lost = _lost_ranks(world_comm, kept)
    left = sorted(set(lost) - set(dead))
    top = np.array([held], dtype=np.int64)
    kept.Allreduce(MPI.IN_PLACE, top, op=MPI.MAX)
    step = int(top[0])
    src = np.array([cross.Get_rank() if held == step and step >= 0 else cross.Get_size()], dtype=np.int64)
    cross.Allreduce(MPI.IN_PLACE, src, op=MPI.MIN)
    short = np.array([int(src[0] == cross.Get_size())], dtype=np.int64)
    if cross is not kept:  # every rank learns whether any shard lacks a replica at ``step``
        kept.Allreduce(MPI.IN_PLACE, short, op=MPI.MAX)
    if short[0]:
        err = NoReplica(f"no surviving replica of some shard holds step {step}'s update (it committed "
                        "on some ranks only)" if step >= 0 else
                        "no surviving rank holds a whole state (the ranks that sent it were lost during "
                        "the repair)")
        err.lost, err.comm, err.at_step = lost, kept, at_step
        raise err
    source = int(src[0])
    if cross.Get_rank() != source and arrays:
        seen["held"] = -1  # until the broadcast into this rank's state completes
    for a in arrays:
        cross.Bcast(a, root=source)
    names = sorted(scalars)
    vals = np.array([int(scalars[n]) for n in names], dtype=np.int64)
    if names:
        cross.Bcast(vals, root=source)
        scalars.update({n: int(v) for n, v in zip(names, vals)})
    seen["held"] = step  # this rank's state is now the source's, whole
    if cross is not kept:
        source = MPI.Group.Translate_ranks(cross.Get_group(), [source], kept.Get_group())[0]
        seen["made"].remove(cross)
        cross.Free()
    digest = replica_hash(arrays)
    shard = 0 if domain is None else int(domain[1])
    every = kept.allgather((shard, digest))
    groups: dict = {}
    for r, (sh, d) in enumerate(every):
        groups.setdefault((sh, d), []).append(r)
    if len({sh for sh, _ in groups}) != len(groups):
        raise RuntimeError("after the repair the replicas differ (weights hashes by rank: "
                           + "; ".join(f"shard {sh}, ranks {rs}: {d[:12]}" for (sh, d), rs in groups.items()) + ")")
    if domain is not None:  # one hash over the shards, in shard order
        h = hashlib.blake2b(digest_size=16)
        for _sh, d in sorted(groups):
            h.update(bytes.fromhex(d))
        digest = h.hexdigest()
    return Repaired(kept, lost, world_comm.Get_size(), step, source, time.monotonic() - t0, digest,
                    dead, left, False, gone, at_step, new)


__all__ = ["check_available", "repair", "Repaired", "replica_hash", "NoReplica", "Ending"]
