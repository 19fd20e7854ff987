"""The numba.cuda backend: hpcdp's own GPU kernels (no borrowed framework).

``CUDABackend()`` raises a clear error without a usable GPU (set
``NUMBA_ENABLE_CUDASIM=1`` to run the kernels in numba's simulator instead).
``select_device(local_rank)`` binds a process to GPU ``local_rank % n_gpus``;
the training command calls it with the node-local rank before building models.
"""

from .backend import CUDABackend
from .device import gpu_count, pool_stats, require_gpu, select_device, simulated

__all__ = ["CUDABackend", "select_device", "gpu_count", "pool_stats", "require_gpu", "simulated"]
