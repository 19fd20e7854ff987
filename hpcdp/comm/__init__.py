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
  class), ``abort(comm, reason)``, ``forget(comm)``, ``default_timeout()`` (``[comm]
  timeout``), ``grace_s(timeout)`` (how long a diagnosis waits for its peers' answers);
- ``topology(comm)``: nodes and the node / cross-node sub-communicators
  (``TopologyError`` when nodes differ in size); ``two_level(comm)``: channels of one's
  own on them, whose ``TwoLevel.ireduce_scatter`` / ``iall_gather`` run the two-level
  request the hierarchical allreduce runs (hybrid ZeRO's reduction).

See docs/collectives.md.
"""

import importlib

# name -> the module that defines it (imported on first use: ``import hpcdp.comm`` alone,
# or ``import hpcdp.comm.model.cost``, loads no collective and no mpi4py)
_HOME = {
    **dict.fromkeys(["all_gather", "allreduce", "barrier", "broadcast", "iall_gather", "iallreduce", "ibarrier", "ibroadcast", "ireduce_scatter", "reduce_scatter"], "hpcdp.comm.collectives"),
    **dict.fromkeys(["abort", "default_timeout", "forget", "get_context", "set_debug", "set_timeout"],
                    "hpcdp.comm.core.context"),
    **dict.fromkeys(["grace_s"], "hpcdp.comm.core.diagnose"),
    **dict.fromkeys(["CollectiveMismatch", "CollectiveTimeout", "CommAborted", "CommError", "MPIError"], "hpcdp.comm.core.errors"),
    **dict.fromkeys(["Ledger"], "hpcdp.comm.core.ledger"),
    **dict.fromkeys(["configure", "settings"], "hpcdp.comm.core.settings"),
    **dict.fromkeys(["active_engine", "set_engine"], "hpcdp.comm.engines.registry"),
    **dict.fromkeys(["set_lean_path"], "hpcdp.comm.engines.compiled.lean"),
    **dict.fromkeys(["cuda_aware", "set_cuda_aware"], "hpcdp.comm.core.device"),
    **dict.fromkeys(["DEFAULT_SEGMENT_BYTES"], "hpcdp.comm.ring"),
    **dict.fromkeys(["Plan", "plan", "prepare"], "hpcdp.comm.select"),
    **dict.fromkeys(["Topology", "TopologyError", "ranks_per_node", "topology"], "hpcdp.comm.nodes"),
    **dict.fromkeys(["TwoLevel", "two_level"], "hpcdp.comm.hierarchical"),
}
# homes whose requests run their phases on the front: it is loaded first (it installs them)
_FRONT_FIRST = {"hpcdp.comm.hierarchical"}


__all__ = [
    "allreduce", "reduce_scatter", "all_gather",
    "iallreduce", "ireduce_scatter", "iall_gather",
    "broadcast", "ibroadcast", "barrier", "ibarrier",
    "Plan", "plan", "prepare", "configure", "settings",
    "Ledger", "CommError", "CollectiveTimeout", "CollectiveMismatch", "MPIError", "CommAborted",
    "abort", "forget", "Topology", "TopologyError", "topology", "ranks_per_node",
    "TwoLevel", "two_level",
    "get_context", "set_debug", "set_timeout", "default_timeout", "grace_s", "set_engine", "active_engine", "set_lean_path",
    "cuda_aware", "set_cuda_aware", "DEFAULT_SEGMENT_BYTES",
]


def __getattr__(name: str):
    home = _HOME.get(name)
    if home is None:  # a module of the package (``hpcdp.comm.auto``), as after an import of it
        if not name.startswith("__"):
            try:
                return importlib.import_module(f"{__name__}.{name}")
            except ModuleNotFoundError as exc:
                if exc.name != f"{__name__}.{name}":
                    raise
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    if home in _FRONT_FIRST:
        importlib.import_module(f"{__name__}.collectives")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value  # looked up once
    return value


def __dir__():
    return sorted(set(globals()) | set(_HOME))
