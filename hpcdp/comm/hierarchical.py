"""Hierarchical allreduce: reduce-scatter in the node, allreduce across nodes, all-gather
in the node (the two-level scheme Horovod and NCCL use on clusters).

With ``M`` nodes of ``L`` ranks, local rank ``l`` on node ``m``:

1. ring reduce-scatter of the whole buffer over the node's ``L`` ranks (fast intra-node
   links): rank ``l`` ends with chunk ``l`` (``shard_range(n, L, l)``) summed over its node;
2. ring allreduce of chunk ``l`` over the ``M`` ranks that have local rank ``l``, one per
   node (the slow inter-node links; every rank of a node drives its own chunk, so a node
   with several NICs uses all of them, and each moves ``1/L`` of the buffer);
3. ring all-gather of the buffer over the node's ranks.

Latency: ``2(L-1) + 2(M-1)`` ring steps instead of the flat ring's ``2(N-1)``, all but
``2(M-1)`` of them on intra-node links. Bytes per rank (``hpcdp.comm.model.volume.
hierarchical_bytes``): ``2(L-1)/L * S`` intra-node and ``2(M-1)/M * S / L`` inter-node.
The ledger records the two link kinds under ``allreduce.intra`` and ``allreduce.inter``.

Nodes are the ranks that share memory (``MPI.COMM_TYPE_SHARED``), or consecutive blocks of
``HPCDP_RANKS_PER_NODE`` ranks (e.g. ``2`` to emulate 2 nodes x 2 ranks on one machine).
Every node must have the same number of ranks. The two sub-communicators are built once
per communicator, on the first hierarchical (or profile-driven "auto") allreduce: every
rank first sends a token to every peer and waits for theirs under the collective timeout
(a rank that never comes is named), and only then enters the blocking ``MPI_Comm_split``.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

import numpy as np
from mpi4py import MPI

from hpcdp.comm.core.diagnose import diagnose
from hpcdp.comm.core.errors import CollectiveTimeout
from hpcdp.comm.core.ops import resolve
from hpcdp.comm.core.requests import Request
from hpcdp.shard import shard_range

RANKS_PER_NODE_ENV = "HPCDP_RANKS_PER_NODE"
PROFILE_ENV = "HPCDP_PROFILE"
_KEYVAL = None


@dataclass
class Hierarchy:
    """The node layout of a communicator, its sub-communicators, and the order in which
    hierarchical requests start their phases.

    Several hierarchical allreduces may be in flight (DDP's buckets). A phase is an hpcdp
    collective on a sub-communicator, and collectives on one communicator must start in
    the same order on every rank; but a rank starts a request's second phase when its
    first completes, which happens in different orders on different ranks. So each phase
    has its own communicator (``local`` reduce-scatters, ``cross`` allreduces, ``gather``
    all-gathers: a duplicate of ``local``), and each request takes a ticket when it is
    created (same order everywhere) and starts phase p only when ``turn[p]`` reaches its
    ticket. Driving a request drives the earlier ones first, so none waits on a request
    nobody polls.
    """

    local: MPI.Comm      # the ranks of this node, ordered by rank (phase 1)
    cross: MPI.Comm      # the ranks with this local rank, one per node, ordered by node (phase 2)
    gather: MPI.Comm     # a duplicate of ``local`` (phase 3)
    nodes: int
    per_node: int
    node: int            # this rank's node index (its rank in ``cross``)
    local_rank: int      # its rank in ``local``
    source: str          # how the nodes were found (for messages)
    tickets: int = 0     # requests created so far
    turn: list = field(default_factory=lambda: [0, 0, 0])  # next ticket allowed per phase
    active: list = field(default_factory=list)             # unfinished requests, by ticket


def ranks_per_node_override() -> int | None:
    """``HPCDP_RANKS_PER_NODE`` as an integer >= 1, or None when unset."""
    raw = os.environ.get(RANKS_PER_NODE_ENV, "").strip()
    if not raw:
        return None
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value < 1:
        raise ValueError(f"{RANKS_PER_NODE_ENV} must be a whole number >= 1, got {raw!r}")
    return value


def _wait_for_everyone(ctx, timeout: float) -> None:
    """Tokens to and from every peer on the data communicator (tag TAG_UB, above every
    tag a collective uses there; the control communicator's TAG_UB is the diagnosis'),
    polled under ``timeout``: names the ranks missing."""
    from hpcdp.comm.core.context import tag_upper_bound

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
        if time.monotonic() > deadline:
            missing = [p for p, r in zip(peers, recvs) if not r.Test()]
            raise CollectiveTimeout(
                f"hierarchical allreduce setup on rank {ctx.rank}: ranks {missing} never "
                f"arrived (waited {timeout:g}s); every rank must call the same collectives "
                "in the same order", seq=-1, name="hierarchical setup", missing=missing)
        idle += 1
        if idle % 64 == 0:
            os.sched_yield()


def _build(ctx, timeout: float) -> Hierarchy:
    _wait_for_everyone(ctx, timeout)  # from here on every rank is in this setup
    comm, rank = ctx.data, ctx.rank
    per = ranks_per_node_override()
    if per is not None:
        if ctx.size % per:
            raise ValueError(f"{RANKS_PER_NODE_ENV}={per} does not divide the {ctx.size} ranks "
                             "into whole nodes; the hierarchical allreduce needs the same number "
                             "of ranks on every node")
        local = comm.Split(rank // per, rank)
        source = f"{RANKS_PER_NODE_ENV}={per}"
    else:
        local = comm.Split_type(MPI.COMM_TYPE_SHARED, key=rank)
        source = "shared-memory nodes (MPI.COMM_TYPE_SHARED)"
    sizes = np.array([local.Get_size(), -local.Get_size()], dtype=np.int64)
    comm.Allreduce(MPI.IN_PLACE, sizes, op=MPI.MAX)
    if sizes[0] != -sizes[1]:
        local.Free()
        raise ValueError(f"hierarchical allreduce: nodes have between {-sizes[1]} and {sizes[0]} "
                         f"ranks ({source}); it needs the same number on every node: place "
                         f"ranks evenly or set {RANKS_PER_NODE_ENV}")
    cross = comm.Split(local.Get_rank(), rank)
    gather = local.Dup()
    from hpcdp.comm.core.context import get_context
    for sub in (local, cross, gather):  # hpcdp's state on each, now that all ranks are here
        get_context(sub, timeout)
    return Hierarchy(local=local, cross=cross, gather=gather, nodes=cross.Get_size(),
                     per_node=local.Get_size(), node=cross.Get_rank(),
                     local_rank=local.Get_rank(), source=source)


def hierarchy(ctx, timeout: float | None = None) -> Hierarchy:
    """The node layout of ``ctx``'s communicator, built (collectively) on first use and
    kept as an attribute of the communicator, like hpcdp's other per-communicator state."""
    global _KEYVAL
    if _KEYVAL is None:
        _KEYVAL = MPI.Comm.Create_keyval()
    found = ctx.parent.Get_attr(_KEYVAL)
    if found is None:
        found = _build(ctx, ctx.timeout if timeout is None else timeout)
        ctx.parent.Set_attr(_KEYVAL, found)
    return found


def auto_layout(ctx, timeout=None):
    """For ``algorithm="auto"``: ``(profile name, nodes, per_node)`` when ``HPCDP_PROFILE``
    names a machine profile (then the cost model picks the allreduce), else None (auto
    keeps its size rule). Every rank must see the same profile, like any auto setting."""
    name = os.environ.get(PROFILE_ENV, "").strip()
    if not name or ctx.size == 1:
        return None
    h = hierarchy(ctx, timeout)
    return name, h.nodes, h.per_node


class HierarchicalRequest(Request):
    """The three phases above as one request; each phase is an hpcdp ring request on a
    sub-communicator, started when the previous one completes and its turn has come
    (see :class:`Hierarchy`); ``test()`` drives it."""

    def __init__(self, ctx, call, ledger, timeout, *, work, src, op, segment_bytes,
                 max_message_bytes=None, result=None):
        super().__init__(ctx, "allreduce", call, None, timeout, max_message_bytes)
        self.kind_ledger = ledger
        self.h = h = hierarchy(ctx, self.timeout)
        self.work, self.op, self.result = work, op, result
        # "mean" = sum everywhere, one division by the world size on the owned chunk.
        self.sub_op = resolve("sum") if op.is_mean else op
        self.kw = dict(algorithm="ring", ledger=None, segment_bytes=segment_bytes,
                       timeout=timeout, max_message_bytes=max_message_bytes)
        self.off, self.size = shard_range(work.size, h.per_node, h.local_rank)
        self.counts = {"intra": [0, 0, 0, 0], "inter": [0, 0, 0, 0]}
        self.finished = False
        if src is not work:
            work[...] = src
        self.ticket, h.tickets = h.tickets, h.tickets + 1
        h.active.append(self)
        self.phase, self.sub = 0, None
        self._advance()

    def _start(self):
        from hpcdp.comm.collectives import iall_gather, iallreduce, ireduce_scatter
        h = self.h
        if self.phase == 0:
            return ireduce_scatter(self.work, comm=h.local, op=self.sub_op, **self.kw)
        if self.phase == 1:
            chunk = self.work[self.off:self.off + self.size]
            return iallreduce(chunk, comm=h.cross, op=self.sub_op, **self.kw)
        return iall_gather(self.work, comm=h.gather, **self.kw)

    def _advance(self) -> None:
        """Start phases whose turn has come and progress the running one."""
        h = self.h
        while not self.finished:
            if self.sub is None:
                if h.turn[self.phase] != self.ticket:
                    return  # an earlier request has not started this phase yet
                h.turn[self.phase] += 1
                self.sub = self._start()
            if not self.sub.test():
                return
            c = self.counts["inter" if self.phase == 1 else "intra"]
            for i, v in enumerate((self.sub.sent_bytes, self.sub.recv_bytes,
                                   self.sub.sent_msgs, self.sub.recv_msgs)):
                c[i] += v
            if self.phase == 1 and self.op.is_mean:
                self.op.finalize(self.work[self.off:self.off + self.size], self.ctx.size)
            if self.phase == 2:
                self.finished = True
                h.active.remove(self)
                self.sent_bytes = self.counts["intra"][0] + self.counts["inter"][0]
                self.recv_bytes = self.counts["intra"][1] + self.counts["inter"][1]
            else:
                self.phase, self.sub = self.phase + 1, None

    def _progress(self) -> bool:
        for req in list(self.h.active):  # earlier tickets first, then this one
            req._advance()
            if req is self:
                break
        return self.finished

    def _complete(self) -> None:
        super()._complete()
        if self.kind_ledger is not None:
            for kind, (s, r, sm, rm) in self.counts.items():
                self.kind_ledger.record(f"allreduce.{kind}", s, r, sm, rm, calls=1)

    def _timeout(self, limit, joined=False):
        """The diagnosis on the whole communicator, naming as waited-for the ranks the
        running phase still waits for (translated from the sub-communicator's numbering)."""
        sub = self.sub
        if sub is None:  # waiting for an earlier request's turn: that one is stuck
            earlier = [r for r in self.h.active if r.ticket < self.ticket and r.sub is not None]
            sub = earlier[0].sub if earlier else None
        waiting = []
        if sub is not None:
            waiting = sorted({src for req, src in sub._recv_src.values() if not req.Test()})
        if waiting:
            group, parent = sub.ctx.parent.Get_group(), self.ctx.parent.Get_group()
            try:
                waiting = [int(r) for r in MPI.Group.Translate_ranks(group, waiting, parent)]
            finally:
                group.Free()
                parent.Free()
        return diagnose(self.ctx, self.call, time.monotonic() - self.started, limit, waiting,
                        joined=joined)


def expected_bytes(n: int, nodes: int, per_node: int, node: int, local_rank: int,
                   itemsize: int) -> dict[str, tuple[int, int]]:
    """Per link kind (sent, received): :func:`hpcdp.comm.model.volume.hierarchical_bytes`."""
    from hpcdp.comm.model.volume import hierarchical_bytes

    return hierarchical_bytes(n, nodes, per_node, node, local_rank, itemsize)



def start_allreduce(ctx, call, ledger, timeout, *, src, work, result, op, segment_bytes, max_message_bytes):
    """The registered start of the hierarchical allreduce (hpcdp.comm.algorithms)."""
    return HierarchicalRequest(ctx, call, ledger, timeout, work=work, src=src, op=op,
                               segment_bytes=segment_bytes, max_message_bytes=max_message_bytes,
                               result=result)
