"""Two-level communication on a communicator's node layout: one request type,
:class:`TwoLevelRequest`, for every scheme that runs a collective in the node and one
across nodes (the two-level scheme Horovod and NCCL use on clusters).

With ``M`` nodes of ``L`` ranks, local rank ``l`` on node ``m`` (hpcdp.comm.nodes), a
request runs up to three phases, each a collective of the front on a sub-communicator:

1. reduce-scatter of the whole buffer over the node's ``L`` ranks (fast intra-node
   links): rank ``l`` ends with chunk ``l`` (``shard_range(n, L, l)``) summed over its node;
2. allreduce of chunk ``l`` over the ``M`` ranks that have local rank ``l``, one per
   node (the slow inter-node links; every rank of a node drives its own chunk, so a node
   with several NICs uses all of them, and each moves ``1/L`` of the buffer);
3. all-gather of the buffer over the node's ranks.

Two users, one request:

- the hierarchical allreduce (``algorithm="hierarchical"``, registered in
  hpcdp.comm.algorithms): all three phases, ring on each; ``mean`` sums everywhere and
  divides the owned chunk by the world size after phase 2. Latency: ``2(L-1) + 2(M-1)``
  ring steps instead of the flat ring's ``2(N-1)``, all but ``2(M-1)`` of them on
  intra-node links. Bytes per rank (``hpcdp.comm.model.volume.hierarchical_bytes``):
  ``2(L-1)/L * S`` intra-node and ``2(M-1)/M * S / L`` inter-node, in the ledger under
  ``allreduce.intra`` and ``allreduce.inter`` (one call each per allreduce);
- a :class:`TwoLevel` of its own (``hpcdp.comm.two_level``: hybrid ZeRO's groups):
  ``ireduce_scatter`` runs phases 1-2 (every replica of chunk ``l``, one per node, ends
  with the sum over all ``N`` ranks; one node: phase 1 alone) with the caller's
  algorithm and wire, recorded as ``reduce_scatter.intra`` / ``reduce_scatter.inter``;
  ``iall_gather`` is phase 3 alone, as ``all_gather.intra``.

Several requests may be in flight (DDP's buckets, ZeRO's groups). Collectives on one
communicator must start in the same order on every rank; but a rank starts a request's
next phase when its previous one completes, which happens in different orders on
different ranks. So each phase has its own communicator (``local`` reduce-scatters,
``cross`` allreduces, ``gather`` all-gathers), each request takes a ticket when it is
created (same order everywhere) and starts phase p only when ``turn[p]`` reaches its
ticket. Driving a request drives the earlier ones first, so none waits on a request
nobody polls.

The hierarchical allreduce's channels are the topology's own sub-communicators and a
duplicate of the node's (``gather``), made on its first call; :func:`two_level` makes
its caller duplicates of both (nothing else ever matches their messages).
"""

from __future__ import annotations

import time

from mpi4py import MPI

from hpcdp.comm.core.diagnose import diagnose
from hpcdp.comm.core.ops import resolve
from hpcdp.comm.core.requests import Request
from hpcdp.comm.nodes import duplicate, topology
from hpcdp.shard import shard_range

RS, AR, AG = 0, 1, 2  # the phases: node reduce-scatter, cross-node allreduce, node all-gather


class TwoLevel:
    """The node layout of a communicator (hpcdp.comm.nodes), the channels two-level
    requests run their phases on, and the order in which those requests start them
    (module docstring)."""

    def __init__(self, ctx, t, local, cross, gather=None):
        self.ctx = ctx             # the communicator's context (hpcdp's state)
        self.local = local         # the ranks of this node, ordered by rank (phase 1)
        self.cross = cross         # the ranks with this local rank, one per node, by node (phase 2)
        self.gather = local if gather is None else gather  # phase 3
        self.nodes, self.per_node = t.nodes, t.per_node
        self.node = t.node                # this rank's node index (its rank in ``cross``)
        self.local_rank = t.local_rank    # its rank in ``local``
        self.source = t.source            # how the nodes were found (for messages)
        self.tickets = 0                  # requests created so far
        self.turn = [0, 0, 0]             # next ticket allowed per phase
        self.active: list = []            # unfinished requests, by ticket

    def describe(self) -> str:
        return f"{self.nodes} node(s) x {self.per_node} rank(s) ({self.source})"

    def chunk(self, n: int) -> tuple[int, int]:
        """``(offset, size)`` of this rank's chunk of an ``n``-element buffer."""
        return shard_range(n, self.per_node, self.local_rank)

    def ireduce_scatter(self, buf, *, ledger=None, algorithm="auto", timeout=None, wire=None):
        """Phases 1-2 on ``buf`` in place (sum): returns the request, whose result is this
        rank's chunk (:meth:`chunk`), summed over every rank of the communicator."""
        off, size = self.chunk(int(buf.shape[0]))
        phases = (RS, AR) if self.nodes > 1 else (RS,)  # one node: nothing to cross
        return TwoLevelRequest(self, self.ctx, None, timeout, work=buf, phases=phases,
                               op="sum", kw=dict(algorithm=algorithm, timeout=timeout, wire=wire),
                               ledger=ledger, name="reduce_scatter",
                               result=buf[off:off + size])

    def iall_gather(self, buf, *, ledger=None, algorithm="auto", timeout=None, wire=None):
        """Phase 3 alone: this node's all-gather of ``buf`` (``all_gather.intra``)."""
        return _FRONT[AG](buf, comm=self.gather, ledger=_kind(ledger, "all_gather.intra"),
                           algorithm=algorithm, timeout=timeout, wire=wire)

    def free(self) -> None:
        """Free the channels :func:`two_level` made (never the topology's own)."""
        for c in {id(c): c for c in (self.local, self.cross, self.gather)}.values():
            c.Free()
        self.local = self.cross = self.gather = None


def two_level(comm, *, timeout: float | None = None, what: str = "two-level setup") -> TwoLevel:
    """Channels of the caller's own on ``comm``'s node layout: duplicates of the
    topology's node and cross-node sub-communicators (collective: every rank calls it,
    outside any step). ``what`` names the setup in a timeout's message. Raises
    hpcdp.comm.TopologyError on uneven nodes."""
    from hpcdp.comm.core.context import get_context

    ctx = comm if hasattr(comm, "derive") else get_context(comm, timeout)
    t = topology(ctx, timeout=timeout)
    limit = ctx.timeout if timeout is None else float(timeout)
    return TwoLevel(ctx, t, duplicate(ctx, t.local, limit, what), duplicate(ctx, t.cross, limit, what))


def hierarchy(ctx, timeout: float | None = None) -> TwoLevel:
    """The hierarchical allreduce's channels on ``ctx``'s communicator, built
    (collectively) on first use and kept on its context (hpcdp.comm.forget drops it)."""
    found = ctx.extra.get("hierarchy")
    if found is None:
        limit = ctx.timeout if timeout is None else float(timeout)
        t = topology(ctx, timeout=limit)
        gather = duplicate(ctx, t.local, limit, "hierarchical allreduce setup")
        found = ctx.extra["hierarchy"] = TwoLevel(ctx, t, t.local, t.cross, gather)
    return found


class _LinkKind:
    """A ledger view that files every record under one link-kind name
    (``allreduce.intra``, ...), whatever the collective calls itself; ``calls=False``
    adds its bytes without counting a call (a second phase on the same link kind)."""

    def __init__(self, ledger, name: str, calls: bool = True):
        self.ledger, self.name, self.calls = ledger, name, calls

    def record(self, _name, *counts, calls=0) -> None:
        self.ledger.record(self.name, *counts, calls=calls if self.calls else 0)

    def count_call(self, _name, *counts) -> None:
        self.record(_name, *counts, calls=1)


def _kind(ledger, name, calls=True):
    return None if ledger is None else _LinkKind(ledger, name, calls)


# The front's non-blocking collectives the phases run as, installed by hpcdp.comm.collectives
# when it is imported (:func:`use_front`; the front launches this algorithm, so it sits
# above this module): [ireduce_scatter, iallreduce, iall_gather].
_FRONT: list = []


def use_front(ireduce_scatter, iallreduce, iall_gather) -> None:
    """The collectives each phase runs as (hpcdp.comm.collectives, once, on import)."""
    _FRONT[:] = [ireduce_scatter, iallreduce, iall_gather]


class TwoLevelRequest(Request):
    """The phases of the module docstring as one request: each is a collective of the
    front on the layout's channel, started when the previous one completes and its turn
    has come; ``test()`` drives it.

    ``phases``: which of RS, AR, AG run, in order; ``op``: the phases' reduction (as
    given to the front); ``final``: an op whose ``finalize`` runs on the owned chunk
    after the cross-node phase (``mean``); ``kw``: the phases' other front arguments;
    ``name``: the collective it is, for the ledger (``<name>.intra`` / ``.inter``); ``call``:
    the call on ``ctx``'s communicator this request is (the hierarchical allreduce's;
    a timeout then names the ranks in that communicator's numbering), or None (a
    timeout is the running phase's own diagnosis)."""

    def __init__(self, lv: TwoLevel, ctx, call, timeout, *, work, phases, op, kw, ledger=None,
                 name="allreduce", final=None, result=None, src=None, max_message_bytes=None):
        super().__init__(ctx, name, call if call is not None else (-1, name), None, timeout,
                         max_message_bytes)
        self.own_call = call is not None
        self.lv, self.work, self.phases, self.op, self.final = lv, work, phases, op, final
        self.kw, self.result = kw, result
        intra_calls = True
        self.ledgers = []
        for p in (RS, AR, AG):  # one call per link kind and request
            kind = "inter" if p == AR else "intra"
            self.ledgers.append(_kind(ledger, f"{name}.{kind}", kind == "inter" or intra_calls))
            if kind == "intra" and p in phases:
                intra_calls = False
        self.off, self.size = lv.chunk(work.size)
        self.counts = {"intra": [0, 0, 0, 0], "inter": [0, 0, 0, 0]}
        self.finished = False
        if src is not None and src is not work:
            work[...] = src
        self.ticket, lv.tickets = lv.tickets, lv.tickets + 1
        lv.active.append(self)
        self.step, self.sub = 0, None
        self._advance()

    def _start(self, p):
        lv = self.lv
        if not _FRONT:
            raise RuntimeError("internal: the two-level phases run on hpcdp.comm's front, not "
                               "imported yet (use hpcdp.comm.two_level)")
        start = _FRONT[p]
        if p == RS:
            return start(self.work, comm=lv.local, op=self.op, ledger=self.ledgers[p], **self.kw)
        if p == AR:
            chunk = self.work[self.off:self.off + self.size]
            return start(chunk, comm=lv.cross, op=self.op, ledger=self.ledgers[p], **self.kw)
        return start(self.work, comm=lv.gather, ledger=self.ledgers[p], **self.kw)

    def _advance(self) -> None:
        """Start phases whose turn has come and progress the running one."""
        lv = self.lv
        while not self.finished:
            p = self.phases[self.step]
            if self.sub is None:
                if lv.turn[p] != self.ticket:
                    return  # an earlier request has not started this phase yet
                lv.turn[p] += 1
                self.sub = self._start(p)
            if not self.sub.test():
                return
            c = self.counts["inter" if p == AR else "intra"]
            for i, a in enumerate(("sent_bytes", "recv_bytes", "sent_msgs", "recv_msgs")):
                c[i] += getattr(self.sub, a, 0)
            if p == AR and self.final is not None and self.final.is_mean:
                self.final.finalize(self.work[self.off:self.off + self.size], self.ctx.size)
            if self.step == len(self.phases) - 1:
                self.finished = True
                lv.active.remove(self)
                self.sent_bytes = self.counts["intra"][0] + self.counts["inter"][0]
                self.recv_bytes = self.counts["intra"][1] + self.counts["inter"][1]
            else:
                self.step, self.sub = self.step + 1, None

    def _progress(self) -> bool:
        for req in list(self.lv.active):  # earlier tickets first, then this one
            req._advance()
            if req is self:
                break
        return self.finished

    def _running(self):
        """The phase request this one waits on: its own, or an earlier ticket's."""
        if self.sub is not None:
            return self.sub
        earlier = [r for r in self.lv.active if r.ticket < self.ticket and r.sub is not None]
        return earlier[0].sub if earlier else None

    def _timeout(self, limit, joined=False):
        """With a call of its own: the diagnosis on the whole communicator, naming as
        waited-for the ranks the running phase still waits for (translated from the
        sub-communicator's numbering); else the running phase's own diagnosis."""
        sub = self._running()
        if not self.own_call:
            if sub is None:
                raise RuntimeError("a two-level request waited for its turn with none running")
            return sub._timeout(limit, joined)
        waiting = []
        if sub is not None:
            waiting = sorted({src for req, src in getattr(sub, "_recv_src", {}).values()
                              if not req.Test()})
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
    lv = hierarchy(ctx, timeout)
    # "mean" = sum everywhere, one division by the world size on the owned chunk.
    sub_op = resolve("sum") if op.is_mean else op
    kw = dict(algorithm="ring", segment_bytes=segment_bytes, timeout=timeout,
              max_message_bytes=max_message_bytes)
    return TwoLevelRequest(lv, ctx, call, timeout, work=work, src=src, phases=(RS, AR, AG),
                           op=sub_op, final=op, kw=kw, ledger=ledger, result=result,
                           max_message_bytes=max_message_bytes)


__all__ = ["TwoLevel", "TwoLevelRequest", "two_level", "hierarchy", "use_front",
           "expected_bytes", "start_allreduce"]
