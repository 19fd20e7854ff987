"""Hybrid sharding (``parallel.zero.shard = "node"``): ZeRO's state sharded over the
ranks of one node and replicated across nodes (FSDP's HYBRID_SHARD, DeepSpeed's
MiCS with one node per group), so the slow inter-node link carries only an
allreduce of one node's shard.

With ``M`` nodes of ``L`` ranks, local rank ``l`` on node ``m`` (nodes as
:func:`hpcdp.comm.topology` finds them: the ranks that share memory,
``MPI.COMM_TYPE_SHARED``, or consecutive blocks of ``[comm] ranks_per_node`` /
``HPCDP_RANKS_PER_NODE`` ranks):

- a rank owns ``shard_range(size_g, L, l)`` of every group g (the ZeRO shard rule
  with the node as the world), so per-rank state divides by ``L`` instead of ``N``;
- a group's gradient is reduced by comm's two-level request
  (:meth:`hpcdp.comm.TwoLevel.ireduce_scatter`, the one the hierarchical allreduce
  runs): reduce-scattered over the node's ``L`` ranks (intra-node links), then chunk
  ``l`` allreduced over the ``M`` ranks with local rank ``l``, one per node (the
  inter-node links): every replica of shard ``l`` ends with the sum over all ``N`` ranks;
- parameter all-gathers (stages 1-2 after the update, stage 3 per unit) run over the
  node's ranks only (:meth:`hpcdp.comm.TwoLevel.iall_gather`).

Bytes per rank and group of ``S`` bytes: reduce-scatter ``(L-1)/L S`` intra, the
shard's allreduce ``2(M-1)/M S/L`` inter, each all-gather ``(L-1)/L S`` intra
(:func:`hybrid_step_bytes`). The ledger records them by link kind:
``reduce_scatter.intra``, ``reduce_scatter.inter`` (the shard's cross-node allreduce,
part of the gradient reduction) and ``all_gather.intra``.

This module is ZeRO's policy only: which ranks the state is sharded over, and the
configuration errors (worded from hpcdp.comm.TopologyError's fields); the requests,
their phase order (tickets, so reductions in flight start their cross-node phase in
the same order on every rank) and the ledger's link kinds are comm's.
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
    from hpcdp.comm import ranks_per_node
    per = ranks_per_node()
    return per if per is not None else max(1, int(getattr(world, "local_size", 1)))


class NodeGroups:
    """The node channels of hybrid sharding (built collectively at setup): ZeRO's
    policy on hpcdp.comm's two-level channels (:func:`hpcdp.comm.two_level`, duplicates
    of the node layout's sub-communicators, so nothing else ever matches these
    collectives' messages): ``node_comm`` (this node's ranks, by rank: reduce-scatters
    and all-gathers) and ``cross_comm`` (the ranks with this local rank, one per node,
    by node)."""

    def __init__(self, comm, timeout: float | None):
        from hpcdp.comm import TopologyError, get_context, ranks_per_node, two_level
        from hpcdp.comm.core.settings import RANKS_PER_NODE_ENV

        size = comm.Get_size()
        per = ranks_per_node()
        if per is not None and size % per:
            raise ConfigError(
                f'parallel.zero.shard = "node": {RANKS_PER_NODE_ENV}={per} does not divide the {size} '
                f"ranks into whole nodes; set {RANKS_PER_NODE_ENV} to a divisor of {size}, or use "
                'parallel.zero.shard = "world"')
        ctx = get_context(comm, timeout)
        try:
            self.lv = two_level(ctx, timeout=timeout, what='parallel.zero.shard = "node" setup')
        except TopologyError as err:  # uneven nodes: every rank raises it (an allreduce decided)
            raise ConfigError(
                f'parallel.zero.shard = "node" needs the same number of ranks on every node (nodes have '
                f"between {err.smallest} and {err.largest} ranks ({err.source})): place ranks evenly, "
                f'set {RANKS_PER_NODE_ENV}, or use parallel.zero.shard = "world"') from None
        lv = self.lv
        self.nodes, self.per_node = lv.nodes, lv.per_node
        self.node, self.local_rank, self.source = lv.node, lv.local_rank, lv.source
        self.node_comm, self.cross_comm = lv.local, lv.cross

    def describe(self) -> str:
        return self.lv.describe()

    def reduce_scatter(self, buf, *, ledger, algorithm, timeout, wire=None):
        """A group's gradient reduction: the node reduce-scatter, then this rank's chunk
        allreduced across nodes (hpcdp.comm.TwoLevel.ireduce_scatter)."""
        return self.lv.ireduce_scatter(buf, ledger=ledger, algorithm=algorithm, timeout=timeout,
                                       wire=wire)

    def all_gather(self, buf, *, ledger, algorithm, timeout, wire=None):
        return self.lv.iall_gather(buf, ledger=ledger, algorithm=algorithm, timeout=timeout, wire=wire)

    def free(self) -> None:
        self.lv.free()
        self.node_comm = self.cross_comm = None


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


__all__ = ["SHARD_CHOICES", "node_groups", "shard_layout", "state_ranks", "link_kind_bytes", "NodeGroups",
           "hybrid_step_bytes"]
