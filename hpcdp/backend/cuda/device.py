"""Which GPU this process uses, and the clear error when there is none.

``select_device(local_rank)`` picks GPU ``local_rank % n_gpus`` (ranks on one node
share GPUs round-robin; the node-local rank comes from ``World.local_rank``, i.e.
MPI's shared-memory communicator) and installs hpcdp's caching allocator before
the CUDA context exists. Under ``NUMBA_ENABLE_CUDASIM=1`` the simulator stands
in for one GPU (no allocator: the simulator's arrays are host arrays).
"""

from __future__ import annotations

import os

from numba import cuda

from .pool import make_memory_manager

_state = {"device": None, "emm": None}


def simulated() -> bool:
    return os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0")


def _unavailable_reason() -> str | None:
    try:
        if not cuda.is_available():
            return "numba.cuda.is_available() is False: no driver or no device"
        if len(cuda.gpus) == 0:
            return "no CUDA devices are visible (check CUDA_VISIBLE_DEVICES)"
    except Exception as e:  # driver load errors come in many types
        return f"{type(e).__name__}: {e}"
    return None


def require_gpu() -> None:
    reason = _unavailable_reason()
    if reason is not None:
        raise RuntimeError(
            f"device='cuda' requested but no CUDA GPU is available ({reason}); "
            "use device='cpu' or run on a GPU node")


def gpu_count() -> int:
    require_gpu()
    return len(cuda.gpus)


def install_allocator() -> bool:
    """Route numba's device allocations through the caching pool. Must run before
    the CUDA context is created; returns False if it is too late (or simulated),
    in which case numba's own allocator stays in use."""
    if simulated() or os.environ.get("HPCDP_CUDA_POOL", "1") == "0":
        return False
    if _state["emm"] is not None:
        return True
    from numba.cuda.cudadrv import driver as drv

    try:
        if int(drv.driver.cuCtxGetCurrent()) != 0:
            return False  # a context exists already: its allocator is fixed
    except Exception:
        return False
    emm = make_memory_manager()
    cuda.set_memory_manager(emm)
    _state["emm"] = emm
    return True


LOCAL_RANK_VARS = ("MPI_LOCALRANKID", "OMPI_COMM_WORLD_LOCAL_RANK", "PMI_LOCAL_RANK",
                   "MV2_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID")


def local_rank_from_env() -> int:
    """The node-local rank the MPI launcher (MPICH/Hydra, Open MPI, MVAPICH) or
    srun exported, 0 when none did. The training command passes
    ``World.local_rank`` explicitly; this is the fallback for a backend built
    before that call."""
    for var in LOCAL_RANK_VARS:
        v = os.environ.get(var)
        if v is not None and v.strip().isdigit():
            return int(v)
    return 0


def select_device(local_rank: int = 0) -> int:
    """Bind this process to GPU ``local_rank % n_gpus``; returns the device id."""
    if local_rank < 0:
        raise ValueError(f"select_device: local_rank must be >= 0, got {local_rank}")
    n = gpu_count()
    dev = int(local_rank) % n
    if _state["device"] is None:
        install_allocator()
        cuda.select_device(dev)
        _state["device"] = dev
    elif _state["device"] != dev:
        raise RuntimeError(
            f"select_device({local_rank}): this process already uses GPU {_state['device']}; "
            "a process binds to one GPU")
    return dev


def pool_stats() -> dict | None:
    """Hits/misses/bytes of the caching allocator, or None when it is not in use."""
    emm = _state["emm"]
    if emm is None or emm.cache is None:
        return None
    return emm.cache.stats()
