"""World: who am I, how many are we, where do my tensors live.

Passed explicitly to everything that communicates; hpcdp keeps no module-level
communicator. ``World.from_mpi()`` wraps ``MPI.COMM_WORLD`` (a single process
without ``mpiexec`` is a world of size 1).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class World:
    comm: Any  # mpi4py.MPI.Comm
    rank: int
    size: int
    local_rank: int = 0
    local_size: int = 1
    device: str = "cpu"
    ledger: Any = field(default=None, repr=False)  # hpcdp.comm.core.ledger.Ledger

    @classmethod
    def from_mpi(cls, comm=None, device: str = "cpu") -> "World":
        from mpi4py import MPI

        comm = MPI.COMM_WORLD if comm is None else comm
        local = comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.Get_rank())
        try:
            local_rank, local_size = local.Get_rank(), local.Get_size()
        finally:
            local.Free()
        world = cls(comm=comm, rank=comm.Get_rank(), size=comm.Get_size(),
                    local_rank=local_rank, local_size=local_size, device=device)
        try:
            from hpcdp.comm import Ledger
            world.ledger = Ledger()
        except ImportError:  # comm package not built yet
            world.ledger = None
        return world

    @property
    def is_root(self) -> bool:
        return self.rank == 0
