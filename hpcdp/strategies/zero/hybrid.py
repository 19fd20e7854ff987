"""Hybrid sharding (``parallel.zero.shard = "node"``): ZeRO's state sharded over the
ranks of one node and replicated across nodes (FSDP's HYBRID_SHARD, DeepSpeed's
MiCS with one node per group), so the slow inter-node link carries only an
allreduce of one node's shard.

With ``M`` nodes of ``L`` ranks, local rank ``l`` on node ``m`` (nodes found as the
hierarchical allreduce finds them, :mod:`hpcdp.comm.hierarchical`: the ranks that
share memory, ``MPI.COMM_TYPE_SHARED``, or consecutive blocks of
``HPCDP_RANKS_PER_NODE`` ranks):

- a rank owns ``shard_range(size_g, L, l)`` of every group g (the ZeRO shard rule
  with the node as the world), so per-rank state divides by ``L`` instead of ``N``;
- a group's gradient is reduce-scattered over the node's ``L`` ranks (ring, intra-node
  links), then chunk ``l`` is allreduced over the ``M`` ranks with local rank ``l``,
  one per node (one communicator per local index; the inter-node links): every
  replica of shard ``l`` ends with the sum over all ``N`` ranks;
- parameter all-gathers (stages 1-2 after the update, stage 3 per unit) run over the
  node's ranks only.

Bytes per rank and group of ``S`` bytes: reduce-scatter ``(L-1)/L S`` intra, the
shard's allreduce ``2(M-1)/M S/L`` inter, each all-gather ``(L-1)/L S`` intra
(:func:`hybrid_step_bytes`). The ledger records them by link kind:
``reduce_scatter.intra``, ``reduce_scatter.inter`` (the shard's cross-node allreduce,
part of the gradient reduction) and ``all_gather.intra``.

Several gradient reductions may be in flight (the bucket engine). Their first phase
starts in launch order (the same on every rank), but a rank starts the cross-node
phase when its own node reduce-scatter completes, which can happen in a different
order on different ranks; so every reduction takes a ticket when it is created and
starts its cross-node allreduce only when the earlier tickets have started theirs
(driving a request drives the earlier ones first, so none waits on one nobody polls),
as :class:`hpcdp.comm.hierarchical.Hierarchy` orders its phases.
"""

from __future__ import annotations

from hpcdp.config_error import ConfigError

SHARD_CHOICES = ("world", "node")


def node_groups(cfg, comm, timeout):
    """The node communicators for ``shard = "node"`` (None for "world", or without MPI)."""
    if getattr(cfg, "shard", "world") != "node" or comm is None:
        return None
    return NodeGroups(comm, timeout)


def shard_layout(groups, world) -> tuple[int, int]:
    """(ranks the state is sharded over, this rank's index among them)."""
    if groups is None:
        return world.size, world.rank
    return groups.per_node, groups.local_rank


def state_ranks(cfg, world) -> int:
    """Ranks the state is sharded over, known before setup: the world, or for hybrid
    sharding ``HPCDP_RANKS_PER_NODE`` (else the ranks sharing this node's memory)."""
    if getattr(cfg, "shard", "world") != "node":
        return world.size
    from hpcdp.comm.core.settings import settings
    per = settings().ranks_per_node or None
    return per if per is not None else max(1, int(getattr(world, "local_size", 1)))


class NodeGroups:
    """The node communicators of hybrid sharding (built collectively at setup):
    ``node_comm`` (this node's ranks, by rank: reduce-scatters and all-gathers) and
    ``cross_comm`` (the ranks with this local rank, one per node, by node)."""

    def __init__(self, comm, timeout: float | None):
        from hpcdp.comm import get_context
        from hpcdp.comm.core.settings import settings
        from hpcdp.comm.nodes import RANKS_PER_NODE_ENV, duplicate, topology

        size = comm.Get_size()
        per = settings().ranks_per_node or None
        if per is not None and size % per:
            raise ConfigError(
                f'parallel.zero.shard = "node": {RANKS_PER_NODE_ENV}={per} does not divide the {size} '
                f"ranks into whole nodes; set {RANKS_PER_NODE_ENV} to a divisor of {size}, or use "
                'parallel.zero.shard = "world"')
        ctx = get_context(comm, timeout)
        try:
            h = topology(ctx, timeout=timeout)
        except ValueError as err:  # uneven nodes: every rank raises it (an allreduce decided)
            detail = str(err).removeprefix("hpcdp.comm topology: ").split("; it needs")[0]
            raise ConfigError(
                f'parallel.zero.shard = "node" needs the same number of ranks on every node ({detail}): '
                f'place ranks evenly, set {RANKS_PER_NODE_ENV}, or use parallel.zero.shard = "world"') from None
        self.nodes, self.per_node = h.nodes, h.per_node
        self.node, self.local_rank, self.source = h.node, h.local_rank, h.source
        # Own duplicates: nothing else (a hierarchical allreduce on ZeRO's communicator)
        # ever matches these collectives' messages.
        limit = ctx.timeout if timeout is None else timeout
        self.node_comm = duplicate(ctx, h.local, limit, 'parallel.zero.shard = "node" setup')
        self.cross_comm = duplicate(ctx, h.cross, limit, 'parallel.zero.shard = "node" setup')
        self.tickets = self.turn = 0
        self.active: list = []

    def describe(self) -> str:
        return f"{self.nodes} node(s) x {self.per_node} rank(s) ({self.source})"

    def reduce_scatter(self, buf, *, ledger, algorithm, timeout, wire=None):
        return HybridReduce(self, buf, ledger=ledger, algorithm=algorithm, timeout=timeout, wire=wire)

    def all_gather(self, buf, *, ledger, algorithm, timeout, wire=None):
        from hpcdp.comm import iall_gather
        return iall_gather(buf, comm=self.node_comm, ledger=_kind(ledger, "all_gather.intra"),
                           algorithm=algorithm, timeout=timeout, wire=wire)

    def free(self) -> None:
        for c in (self.node_comm, self.cross_comm):
            c.Free()
        self.node_comm = self.cross_comm = None


class _LinkKind:
    """A ledger view that files every record under one link-kind name
    (``reduce_scatter.intra``, ...), whatever the collective calls itself; any request
    (hpcdp's rings, MPI's own through the lean path) records through it."""

    def __init__(self, ledger, name: str):
        self.ledger, self.name = ledger, name

    def record(self, _name, *counts, **kw) -> None:
        self.ledger.record(self.name, *counts, **kw)


def _kind(ledger, name):
    return None if ledger is None else _LinkKind(ledger, name)


class HybridReduce:
    """One group's gradient reduction: node reduce-scatter, then this rank's chunk
    allreduced across nodes (in ticket order); ``test()`` drives it."""

    def __init__(self, groups: NodeGroups, buf, *, ledger, algorithm, timeout, wire=None):
        from hpcdp.comm import ireduce_scatter
        from hpcdp.shard import shard_range

        self.g, self.buf, self.ledger = groups, buf, ledger
        self.algorithm, self.timeout_arg, self.wire = algorithm, timeout, wire
        self.off, self.size = shard_range(int(buf.shape[0]), groups.per_node, groups.local_rank)
        self.sub = ireduce_scatter(buf, comm=groups.node_comm, op="sum",
                                   ledger=_kind(ledger, "reduce_scatter.intra"),
                                   algorithm=algorithm, timeout=timeout, wire=wire)
        self.timeout = self.sub.timeout
        self.phase, self.finished = 0, False
        self.ticket, groups.tickets = groups.tickets, groups.tickets + 1
        groups.active.append(self)
        self.result = None

    def _advance(self) -> None:
        g = self.g
        while not self.finished:
            if self.sub is None:  # phase 1 waits for its turn on the cross communicator
                if g.turn != self.ticket:
                    return
                g.turn += 1
                from hpcdp.comm import iallreduce
                chunk = self.buf[self.off:self.off + self.size]
                self.sub = iallreduce(chunk, comm=g.cross_comm, op="sum",
                                      ledger=_kind(self.ledger, "reduce_scatter.inter"),
                                      algorithm=self.algorithm, timeout=self.timeout_arg, wire=self.wire)
            if not self.sub.test():
                return
            if self.phase == 1 or g.nodes == 1:
                if self.phase == 0:
                    g.turn += 1  # the cross phase of a one-node world is empty
                self.finished = True
                g.active.remove(self)
                self.result = self.buf[self.off:self.off + self.size]
            else:
                self.phase, self.sub = 1, None

    def test(self) -> bool:
        if self.finished:
            return True
        for req in list(self.g.active):  # earlier tickets first, then this one
            req._advance()
            if req is self:
                break
        return self.finished

    def wait(self, timeout: float | None = None):
        import time
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        while not self.test():
            if time.monotonic() > deadline:
                self.expire()
        return self.result

    def expire(self):
        """The running phase's diagnosis (or the earliest unfinished reduction's)."""
        sub = self.sub
        if sub is None:
            earlier = [r for r in self.g.active if r.ticket < self.ticket and r.sub is not None]
            sub = earlier[0].sub if earlier else None
        if sub is None:
            raise RuntimeError("hybrid ZeRO: a gradient reduction waited for its turn with none running")
        sub.expire()


def link_kind_bytes(delta: dict) -> dict:
    """``intra_bytes_sent`` / ``inter_bytes_sent`` of a ledger delta (names ending in
    ``.intra`` / ``.inter``): a step's figures (metrics.jsonl)."""
    out = {"intra_bytes_sent": 0.0, "inter_bytes_sent": 0.0}
    for name, d in delta.items():
        kind = name.rpartition(".")[2]
        if kind in ("intra", "inter"):
            out[f"{kind}_bytes_sent"] += float(d["sent_bytes"])
    return out


def hybrid_step_bytes(stage: int, group_sizes, nodes: int, per_node: int, node: int,
                      local_rank: int, itemsize: int, micro_batches: int = 1) -> dict[str, tuple[int, int]]:
    """Per link kind, ``(sent, received)`` bytes of one hybrid ZeRO step on this rank
    (ring algorithm): per group the node reduce-scatter and the all-gathers (two at
    stage 3) over the node's ``L`` ranks, and the cross-node ring allreduce of this
    rank's chunk over the ``M`` nodes (this rank is number ``node`` there). Stages 2-3
    reduce every micro-batch, stage 3 gathers every micro-batch (as the flat stages:
    :func:`hpcdp.comm.model.volume.zero_step_bytes`)."""
    from hpcdp.comm.model.volume import ring_bytes
    from hpcdp.shard import shard_range

    out = {"intra": [0, 0], "inter": [0, 0]}
    reduces = micro_batches if stage >= 2 else 1
    gathers = (2 * micro_batches) if stage == 3 else 1
    for s in group_sizes:
        chunk = shard_range(s, per_node, local_rank)[1]
        parts = (("intra", reduces, ring_bytes(s, per_node, local_rank, itemsize, ("rs",))),
                 ("intra", gathers, ring_bytes(s, per_node, local_rank, itemsize, ("ag",))),
                 ("inter", reduces, ring_bytes(chunk, nodes, node, itemsize, ("rs", "ag"))))
        for kind, times, (sent, recv) in parts:
            out[kind][0] += times * sent
            out[kind][1] += times * recv
    return {k: (v[0], v[1]) for k, v in out.items()}


__all__ = ["SHARD_CHOICES", "node_groups", "shard_layout", "state_ranks", "link_kind_bytes", "NodeGroups", "HybridReduce", "hybrid_step_bytes"]
