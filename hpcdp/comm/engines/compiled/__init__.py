"""The compiled communication engine: hpcdp's ring with its inner loop in Numba code
(``nogil=True``) calling MPI's C functions, and a progress thread per process.

- binding.py: the MPI functions, bound from the library mpi4py loaded (ABI by handle size)
- kernels.py: the ring's state machine as one compiled function
- request.py: CompiledRingRequest, the request interface over it
- blocking.py: the blocking ring calls' fast front (a cached plan per call signature)
- progress.py: the progress thread (sleeps, never busy-polls)
- engine.py: the engine asked for (``[comm] engine``, ``set_engine``), the binding's fallback;
  ring_request launches the ring on the engine the chooser's plan names

See docs/collectives.md, "The compiled engine".
"""

from hpcdp.comm.engines.compiled.engine import (ENGINES, active_engine, ring_request,
                                         set_engine)

__all__ = ["ENGINES", "active_engine", "ring_request", "set_engine"]
