"""The compiled communication engine: hpcdp's ring with its inner loop in Numba code
(``nogil=True``) calling MPI's C functions, and a progress thread per process.

- binding.py: the MPI functions, bound from the library mpi4py loaded (ABI by handle size)
- kernels.py: the ring's state machine as one compiled function
- request.py: CompiledRingRequest, the request interface over it
- blocking.py: the blocking ring calls' ready entries (a cached plan per call signature)
- progress.py: the progress thread (sleeps, never busy-polls)
- engine.py: the process's bound engine and progress thread; the engine's record
  (hpcdp.comm.engines.registry): what it takes, its launch
- lean.py: MPI's own collective posted and tested from compiled code (the small-message
  tier), its ready calls

See docs/collectives.md, "The compiled engine".
"""
