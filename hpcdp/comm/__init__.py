"""hpcdp.comm: collectives on MPI point-to-point calls (never imports autograd/nn).

Ring reduce-scatter / all-gather / allreduce (pipelined), recursive doubling for
small messages, MPI's own collectives as a baseline, a byte ledger, timeouts on every collective that name the ranks that never
arrived (found lazily, once a deadline passed), and a debug-mode fingerprint check. See docs/collectives.md.
"""

from hpcdp.comm.collectives import (
    all_gather, allreduce, iall_gather, iallreduce, ireduce_scatter, reduce_scatter,
)
from hpcdp.comm.core.context import get_context, set_debug, set_timeout
from hpcdp.comm.engines.device import cuda_aware, set_cuda_aware
from hpcdp.comm.core.errors import CollectiveMismatch, CollectiveTimeout, CommError
from hpcdp.comm.core.ledger import Ledger
from hpcdp.comm.ring import DEFAULT_SEGMENT_BYTES

__all__ = [
    "allreduce", "reduce_scatter", "all_gather",
    "iallreduce", "ireduce_scatter", "iall_gather",
    "Ledger", "CollectiveTimeout", "CollectiveMismatch", "CommError",
    "get_context", "set_debug", "set_timeout", "cuda_aware", "set_cuda_aware",
    "DEFAULT_SEGMENT_BYTES",
]
