"""Replica groups: which ranks train one replica together, and the communicators.

``groups = "node"`` (default): one group per node, found as hybrid ZeRO finds nodes
(:func:`hpcdp.comm.topology`: the ranks that share memory, or blocks of ``[comm]
ranks_per_node`` / ``HPCDP_RANKS_PER_NODE``); ``groups = K``: K groups of ``N / K`` consecutive
ranks. Every group has the same number of ranks ``L``; with ``M`` groups:

- ``group_comm``: this group's ``L`` ranks, by rank (the inner strategy's world);
- ``cross_comm``: the ``M`` ranks with this rank's index ``l`` in its group, one per
  group, by group (the outer exchange: local rank ``l`` carries chunk ``l`` of every
  fragment, so each rank of a group drives ``1/L`` of the slow link's bytes, as
  hybrid ZeRO's shard allreduce does).

Both are duplicates owned here (freed by :meth:`ReplicaGroups.free`).
"""

from __future__ import annotations

from hpcdp.config_error import ConfigError


class ReplicaGroups:
    def __init__(self, comm, groups, timeout: float | None):
        from hpcdp.comm import get_context

        size, rank = comm.Get_size(), comm.Get_rank()
        limit = 300.0 if timeout is None else float(timeout)
        if groups == "node":
            self._by_node(comm, timeout)
        else:
            k = int(groups)
            if size % k:
                raise ConfigError(f"parallel.diloco.groups: {k} groups do not divide the {size} ranks; "
                                  f"choose a divisor of {size} (every group has the same number of ranks)")
            per = size // k
            from hpcdp.failure.deadline import watchdog
            with watchdog(limit, "splitting the replica groups"):
                self.group_comm = comm.Split(rank // per, rank)
                self.cross_comm = comm.Split(rank % per, rank)
            self.count, self.size = k, per
            self.index, self.local_rank = rank // per, rank % per
            self.source = f"parallel.diloco.groups = {k}"
        for sub in (self.group_comm, self.cross_comm):  # hpcdp's state on each, now
            get_context(sub, timeout)

    def _by_node(self, comm, timeout) -> None:
        """The node layout of hpcdp.comm.topology, on duplicates of its sub-communicators
        (nothing else, e.g. a hierarchical collective on the world, ever matches these
        messages)."""
        from hpcdp.comm import TopologyError, get_context, topology

        try:
            h = topology(get_context(comm, timeout), timeout=timeout)
        except TopologyError as err:  # ranks per node that do not divide, or uneven nodes: every rank
            raise ConfigError(
                f'parallel.diloco.groups = "node" needs the same number of ranks on every node ({err.reason}): '
                "place ranks evenly, set [comm] ranks_per_node (or HPCDP_RANKS_PER_NODE) to a divisor of "
                f"{comm.Get_size()}, or set parallel.diloco.groups = K") from None
        from hpcdp.failure.deadline import watchdog
        with watchdog(300.0 if timeout is None else float(timeout), "duplicating the replica groups"):
            self.group_comm, self.cross_comm = h.local.Dup(), h.cross.Dup()
        self.count, self.size = h.nodes, h.per_node
        self.index, self.local_rank = h.node, h.local_rank
        self.source = h.source

    def describe(self) -> str:
        return f"{self.count} replica group(s) x {self.size} rank(s) ({self.source})"

    def free(self) -> None:
        for c in (self.group_comm, self.cross_comm):
            if c is not None:
                c.Free()
        self.group_comm = self.cross_comm = None


def group_ranks(cfg_groups, world) -> int:
    """Ranks per group, known before setup (for the memory check): ``N / K``, or the
    ranks of a node (``[comm] ranks_per_node`` / ``HPCDP_RANKS_PER_NODE``, else those
    sharing this node's memory)."""
    if cfg_groups != "node":
        k = int(cfg_groups)
        return max(1, world.size // k) if world.size % k == 0 else 1
    from hpcdp.comm import ranks_per_node
    per = ranks_per_node()
    return per if per is not None else max(1, int(getattr(world, "local_size", 1)))


class KindLedger:
    """A view of the run's ledger that files every record of one scope under
    ``<name>.<kind>`` (``allreduce.intra``, ``outer.inter``...), and whose
    snapshots and deltas cover only its own kind: the inner strategy's step figures
    stay its own, the run's ledger holds everything by link kind."""

    def __init__(self, ledger, kind: str, name: str | None = None):
        self.ledger, self.kind, self.name = ledger, kind, name

    def _key(self, name: str) -> str:
        return f"{self.name or name}.{self.kind}"

    def record(self, name, *counts, **kw) -> None:
        self.ledger.record(self._key(name), *counts, **kw)

    def count_call(self, name, *counts) -> None:
        self.ledger.count_call(self._key(name), *counts)

    def totals(self) -> dict:
        suffix = "." + self.kind
        return {k: v for k, v in self.ledger.totals().items() if k.endswith(suffix)}

    def snapshot(self) -> dict:
        return self.totals()

    def delta(self, snapshot: dict) -> dict:
        out = {}
        for name, now in self.totals().items():
            before = snapshot.get(name, {})
            d = {k: v - before.get(k, 0) for k, v in now.items()}
            if any(d.values()):
                out[name] = d
        return out


def kind_ledger(ledger, kind: str, name: str | None = None):
    return None if ledger is None else KindLedger(ledger, kind, name)


__all__ = ["ReplicaGroups", "group_ranks", "KindLedger", "kind_ledger"]
