"""Who serves, who works, and which shard of the flat buffer each server owns.

Layout rule (one place decides it):

- ``colocated = true``: every rank is a worker and ranks ``0 .. S-1`` are also the
  servers (a worker doubling as the server keeps its own gradient shard local, which
  saves one copy of traffic per server).
- ``colocated = false`` (dedicated servers): the last S ranks only serve, ranks
  ``0 .. N-S-1`` are the workers. Workers keep rank order, so rank 0 is always worker 0
  (the rank that logs).

Server ``s`` owns ``shard_range(numel, S, s)`` of the flat parameter/gradient buffer,
the same rule every other sharded part of hpcdp uses; with one dtype, balanced by
elements is balanced by bytes.
"""

from __future__ import annotations

from dataclasses import dataclass

from hpcdp.shard import shard_range


@dataclass(frozen=True)
class Roles:
    world_size: int
    servers: tuple       # world rank of server s, s = 0..S-1
    workers: tuple       # world rank of worker w (w = dp_rank), w = 0..W-1
    colocated: bool

    @property
    def num_servers(self) -> int:
        return len(self.servers)

    @property
    def num_workers(self) -> int:
        return len(self.workers)

    def server_index(self, rank: int) -> int | None:
        """Shard index this rank serves, or None."""
        return self.servers.index(rank) if rank in self.servers else None

    def worker_index(self, rank: int) -> int | None:
        """dp_rank of this rank, or None for a dedicated server."""
        return self.workers.index(rank) if rank in self.workers else None

    def shard(self, numel: int, server: int) -> tuple[int, int]:
        """``(offset, size)`` of the flat buffer owned by server index ``server``."""
        return shard_range(numel, self.num_servers, server)


def assign_roles(world_size: int, servers: int, colocated: bool) -> Roles:
    """Place S servers and the workers on ``world_size`` ranks; clear errors otherwise."""
    if isinstance(servers, bool) or not isinstance(servers, int) or servers < 1:
        raise ValueError(f"parallel.ps.servers: {servers!r} is not allowed; needs an integer >= 1")
    if servers > world_size:
        raise ValueError(f"parallel.ps.servers = {servers} but the job has only {world_size} "
                         f"rank(s): more servers than ranks; lower servers or launch more ranks")
    if colocated:
        return Roles(world_size, tuple(range(servers)), tuple(range(world_size)), True)
    if servers == world_size:
        raise ValueError(f"parallel.ps.servers = {servers} dedicated servers on {world_size} "
                         f"rank(s) leaves zero workers; lower servers, launch more ranks, or "
                         f"set parallel.ps.colocated = true")
    workers = world_size - servers
    return Roles(world_size, tuple(range(workers, world_size)), tuple(range(workers)), False)
