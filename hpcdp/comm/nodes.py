"""The node layout of a communicator: which ranks share a node, and the two
sub-communicators every two-level scheme runs on.

With ``M`` nodes of ``L`` ranks, local rank ``l`` on node ``m``:

- ``local``: the ``L`` ranks of this rank's node, ordered by rank (fast links);
- ``cross``: the ``M`` ranks with this rank's local rank, one per node, ordered by node
  (the slow links; rank ``m`` there is node ``m``);
- ``table[m][l]``: the rank (in the communicator) of local rank ``l`` on node ``m``.

Nodes are the ranks that share memory (``MPI.COMM_TYPE_SHARED``), or consecutive
blocks of ``[comm] ranks_per_node`` ranks (``HPCDP_RANKS_PER_NODE`` overrides it; e.g.
``2`` to emulate 2 nodes x 2 ranks on one machine). Every node must hold the same
number of ranks (else :class:`TopologyError`, a ValueError, on every rank: an allreduce
of the node sizes decides).

Built once per communicator (collectively, on first use) and kept on its context
(hpcdp.comm.forget drops it with everything else): every rank first sends a token to
every peer and waits for theirs under the collective timeout (a rank that never comes
is named), and only then enters the blocking ``MPI_Comm_split`` calls. The node sizes
and the rank table are agreed by hpcdp collectives on the communicator (deadline,
ledger-free, MPI errors as MPIError). Both sub-communicators return MPI errors
(``MPI.ERRORS_RETURN``) and are derived from the communicator's context, so
hpcdp.comm.abort reaches collectives on them.

Users: the hierarchical collectives and the ``scope="node"`` collectives of hybrid
ZeRO (hpcdp.comm.hierarchical, hier_shard), the cost model's layout for ``auto`` with a
machine profile, and strategies that form groups by node (``from hpcdp.comm import
topology``).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

import numpy as np
from mpi4py import MPI

from hpcdp.comm.core.context import get_context, tag_upper_bound
from hpcdp.comm.core.errors import CollectiveTimeout
from hpcdp.comm.core.settings import RANKS_PER_NODE_ENV, settings


class TopologyError(ValueError):
    """The ranks do not form nodes of one size (raised on every rank: an allreduce of
    the node sizes decided, or ``[comm] ranks_per_node`` does not divide the ranks).

    Its fields let a caller word its own error: ``ranks`` (the communicator's size),
    ``source`` (how nodes were found: the setting, or shared memory), ``smallest`` and
    ``largest`` (ranks on the smallest and largest node; 0 when ``ranks_per_node`` does
    not divide ``ranks``), ``ranks_per_node`` (the setting, or None), and ``reason``
    (what is wrong, in words, without the advice)."""

    def __init__(self, message: str, *, reason: str, ranks: int, source: str, smallest: int = 0,
                 largest: int = 0, ranks_per_node: int | None = None):
        super().__init__(message)
        self.reason, self.ranks, self.source = reason, ranks, source
        self.smallest, self.largest, self.ranks_per_node = smallest, largest, ranks_per_node


@dataclass(frozen=True)
class Topology:
    """The node layout of one communicator (module docstring)."""

    nodes: int            # M
    per_node: int         # L
    node: int             # this rank's node index (its rank in ``cross``)
    local_rank: int       # its rank in ``local``
    source: str           # how the nodes were found (for messages)
    local: object         # MPI.Comm: this node's ranks, by rank
    cross: object         # MPI.Comm: the ranks with this local rank, one per node, by node
    table: tuple          # table[m][l] = rank in the communicator

    def rank_of(self, node: int, local_rank: int) -> int:
        return self.table[node][local_rank]


def ranks_per_node() -> int | None:
    """``[comm] ranks_per_node`` (``HPCDP_RANKS_PER_NODE`` overrides it), or None when 0
    (the ranks that share memory are a node). Known before any communicator exists."""
    return settings().ranks_per_node or None


def wait_for_everyone(ctx, timeout: float, what: str) -> None:
    """Tokens to and from every peer on the data communicator (tag TAG_UB, above every
    tag a collective uses there; the control communicator's TAG_UB is the diagnosis'),
    polled under ``timeout``: names the ranks missing. After it every rank is inside
    the same setup, so blocking communicator constructors cannot hang on a latecomer."""
    comm = ctx.data
    tag = tag_upper_bound(comm)
    peers = [p for p in range(ctx.size) if p != ctx.rank]
    out = np.zeros(1, dtype=np.uint8)
    inbox = np.zeros(max(len(peers), 1), dtype=np.uint8)
    sends = [comm.Isend([out, MPI.BYTE], p, tag) for p in peers]
    recvs = [comm.Irecv([inbox[i:i + 1], MPI.BYTE], p, tag) for i, p in enumerate(peers)]
    deadline = time.monotonic() + timeout
    idle = 0
    while not MPI.Request.Testall(sends + recvs):
        if ctx.failed is not None:
            raise ctx.failed
        if time.monotonic() > deadline:
            missing = [p for p, r in zip(peers, recvs) if not r.Test()]
            raise CollectiveTimeout(
                f"{what} on rank {ctx.rank}: ranks {missing} never arrived (waited "
                f"{timeout:g}s); every rank must call the same collectives in the same order",
                seq=-1, name=what, missing=missing)
        idle += 1
        if idle % 64 == 0:
            os.sched_yield()


def duplicate(ctx, comm, timeout: float, what: str):
    """``comm.Idup()`` completed within ``timeout`` (every rank of ``comm`` calls it at
    the same point), returning MPI errors, its context derived from ``ctx``."""
    new, req = comm.Idup()
    deadline = time.monotonic() + timeout
    idle = 0
    while not req.Test():
        if time.monotonic() > deadline:
            raise CollectiveTimeout(f"{what} on rank {ctx.rank}: duplicating a communicator did "
                                    f"not complete within {timeout:g}s", seq=-1, name=what)
        idle += 1
        if idle % 64 == 0:
            os.sched_yield()
    new.Set_errhandler(MPI.ERRORS_RETURN)
    ctx.derive(new)
    return new


def _agree(ctx, values: np.ndarray, op: str, timeout: float) -> None:
    """An allreduce of a few int64 on ``ctx``'s communicator through MPI's own call
    (hpcdp.comm.engines.mpi: sequence number, deadline, MPI errors), in place."""
    from hpcdp.comm.core.ops import resolve
    from hpcdp.comm.engines.mpi import allreduce

    o = resolve(op)
    call = ctx.arrive("allreduce", values.dtype, values.size, -1, "native", o.name, timeout)
    allreduce(ctx, call, values, values, values, o, None, timeout).wait()


def _build(ctx, timeout: float) -> Topology:
    what = "hpcdp.comm topology setup"
    wait_for_everyone(ctx, timeout, what)  # from here on every rank is in this setup
    comm, rank = ctx.data, ctx.rank
    per = ranks_per_node()
    if per is not None:
        source = (f"{RANKS_PER_NODE_ENV}={per}" if "ranks_per_node" in settings().overridden
                  else f"[comm] ranks_per_node = {per}")
        if ctx.size % per:
            reason = f"{source} does not divide the {ctx.size} ranks into whole nodes"
            raise TopologyError(f"{reason}; the node layout needs the same number of ranks on "
                                "every node", reason=reason, ranks=ctx.size, source=source,
                                ranks_per_node=per)
        local = comm.Split(rank // per, rank)
    else:
        local = comm.Split_type(MPI.COMM_TYPE_SHARED, key=rank)
        source = "shared-memory nodes (MPI.COMM_TYPE_SHARED)"
    local.Set_errhandler(MPI.ERRORS_RETURN)
    sizes = np.array([local.Get_size(), -local.Get_size()], dtype=np.int64)
    _agree(ctx, sizes, "max", timeout)
    if sizes[0] != -sizes[1]:
        local.Free()
        reason = f"nodes have between {-sizes[1]} and {sizes[0]} ranks ({source})"
        raise TopologyError(f"hpcdp.comm topology: {reason}; it needs the same number on every "
                            f"node: place ranks evenly or set [comm] ranks_per_node "
                            f"({RANKS_PER_NODE_ENV})", reason=reason, ranks=ctx.size, source=source,
                            smallest=int(-sizes[1]), largest=int(sizes[0]), ranks_per_node=per)
    cross = comm.Split(local.Get_rank(), rank)
    cross.Set_errhandler(MPI.ERRORS_RETURN)
    nodes, per_node = cross.Get_size(), local.Get_size()
    node, local_rank = cross.Get_rank(), local.Get_rank()
    where = np.zeros(ctx.size, dtype=np.int64)  # every rank's (node, local rank), one slot each
    where[rank] = node * per_node + local_rank + 1
    _agree(ctx, where, "sum", timeout)
    table = [[0] * per_node for _ in range(nodes)]
    for g, code in enumerate(where.tolist()):
        m, l = divmod(code - 1, per_node)
        table[m][l] = g
    for sub in (local, cross):  # hpcdp's state on each, now that all ranks are here
        ctx.derive(sub)
    return Topology(nodes=nodes, per_node=per_node, node=node, local_rank=local_rank,
                    source=source, local=local, cross=cross,
                    table=tuple(tuple(row) for row in table))


def topology(comm, *, timeout: float | None = None) -> Topology:
    """The node layout of ``comm`` (an mpi4py communicator, a World, or hpcdp's context of
    one), built collectively on first use and kept on its context."""
    ctx = comm if hasattr(comm, "derive") else get_context(comm, timeout)
    found = ctx.topology
    if found is None:
        found = ctx.topology = _build(ctx, ctx.timeout if timeout is None else float(timeout))
    return found


def auto_layout(ctx, timeout=None):
    """For ``algorithm="auto"``: ``(profile name, nodes, per_node)`` when ``[comm] profile``
    (``HPCDP_PROFILE``) names a machine profile (then the cost model picks the allreduce),
    else None (auto keeps its size rule). Every rank must see the same profile, like any
    auto setting."""
    name = settings().profile
    if not name or ctx.size == 1:
        return None
    t = topology(ctx, timeout=timeout)
    return name, t.nodes, t.per_node


__all__ = ["Topology", "TopologyError", "topology", "auto_layout", "ranks_per_node", "wait_for_everyone", "duplicate",
           "RANKS_PER_NODE_ENV"]
