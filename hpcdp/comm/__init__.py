"""hpcdp.comm: collectives on MPI (never imports autograd/nn), behind one front.

Everything a caller needs is here (module paths inside comm/ are internal):

- the collectives: ``allreduce``, ``reduce_scatter``, ``all_gather`` (ring, recursive
  doubling / halving, Bruck, hierarchical, MPI's own) and their ``i*`` forms,
  ``broadcast`` / ``ibroadcast``, ``barrier`` / ``ibarrier``; every one checks its
  arguments, asks the chooser (``plan``) and runs under a deadline that names the ranks
  that never arrived, with a byte ledger (``Ledger``) and a debug-mode fingerprint check;
- the chooser and its settings: ``plan``, ``prepare``, ``configure`` (the ``[comm]``
  section; environment variables override it), ``settings``, and per communicator
  ``set_debug``, ``set_timeout``, ``set_engine``, ``active_engine``, ``set_lean_path``;
- failure: the errors (``CommError`` and its kinds, ``MPIError`` with MPI's error
  class), ``abort(comm, reason)``, ``forget(comm)``;
- ``topology(comm)``: nodes and the node / cross-node sub-communicators.

See docs/collectives.md.
"""

from hpcdp.comm.collectives import (
    all_gather, allreduce, barrier, broadcast, iall_gather, iallreduce, ibarrier, ibroadcast,
    ireduce_scatter, reduce_scatter,
)
from hpcdp.comm.core.context import abort, forget, get_context, set_debug, set_timeout
from hpcdp.comm.core.errors import (CollectiveMismatch, CollectiveTimeout, CommAborted, CommError,
                                    MPIError)
from hpcdp.comm.core.ledger import Ledger
from hpcdp.comm.core.settings import configure, settings
from hpcdp.comm.engines.compiled.engine import active_engine, set_engine
from hpcdp.comm.engines.compiled.lean import set_lean_path
from hpcdp.comm.engines.device import cuda_aware, set_cuda_aware
from hpcdp.comm.ring import DEFAULT_SEGMENT_BYTES
from hpcdp.comm.select import Plan, plan, prepare
from hpcdp.comm.nodes import Topology, ranks_per_node, topology

__all__ = [
    "allreduce", "reduce_scatter", "all_gather",
    "iallreduce", "ireduce_scatter", "iall_gather",
    "broadcast", "ibroadcast", "barrier", "ibarrier",
    "Plan", "plan", "prepare", "configure", "settings",
    "Ledger", "CommError", "CollectiveTimeout", "CollectiveMismatch", "MPIError", "CommAborted",
    "abort", "forget", "Topology", "topology", "ranks_per_node",
    "get_context", "set_debug", "set_timeout", "set_engine", "active_engine", "set_lean_path",
    "cuda_aware", "set_cuda_aware", "DEFAULT_SEGMENT_BYTES",
]
