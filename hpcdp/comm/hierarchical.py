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

Nodes and the two sub-communicators are the communicator's topology (hpcdp.comm.nodes:
shared memory, or blocks of ``[comm] ranks_per_node`` ranks), built on the first
hierarchical (or profile-driven "auto") allreduce; the third channel (``gather``) is a
duplicate of the node's communicator made then.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from mpi4py import MPI

from hpcdp.comm.core.diagnose import diagnose
from hpcdp.comm.core.ops import resolve
from hpcdp.comm.core.requests import Request
from hpcdp.comm.nodes import duplicate, topology
from hpcdp.shard import shard_range

@dataclass
class Hierarchy:
    """The node layout of a communicator (hpcdp.comm.nodes), the third channel its
    requests gather on, and the order in which hierarchical requests start their phases.

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


def hierarchy(ctx, timeout: float | None = None) -> Hierarchy:
    """The hierarchy of ``ctx``'s communicator, built (collectively) on first use and
    kept on its context (hpcdp.comm.forget drops it)."""
    found = ctx.extra.get("hierarchy")
    if found is None:
        limit = ctx.timeout if timeout is None else float(timeout)
        t = topology(ctx, timeout=limit)
        gather = duplicate(ctx, t.local, limit, "hierarchical allreduce setup")
        found = ctx.extra["hierarchy"] = Hierarchy(
            local=t.local, cross=t.cross, gather=gather, nodes=t.nodes, per_node=t.per_node,
            node=t.node, local_rank=t.local_rank, source=t.source)
    return found


# The front's non-blocking collectives the phases run as, installed by hpcdp.comm.collectives
# when it is imported (:func:`use_front`; the front launches this algorithm, so it sits
# above this module): [ireduce_scatter, iallreduce, iall_gather].
_FRONT: list = []


def use_front(ireduce_scatter, iallreduce, iall_gather) -> None:
    """The collectives each phase runs as (hpcdp.comm.collectives, once, on import)."""
    _FRONT[:] = [ireduce_scatter, iallreduce, iall_gather]


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
        ireduce_scatter, iallreduce, iall_gather = _FRONT
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
