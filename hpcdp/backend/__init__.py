"""Backends: ``cpu`` (NumPy/BLAS + numba.njit) and ``cuda`` (numba.cuda kernels)."""

from __future__ import annotations

from .base import Backend

_INSTANCES: dict[str, Backend] = {}


def get_backend(name: str = "cpu") -> Backend:
    """Return the (cached, stateless) backend called ``name``."""
    if name not in ("cpu", "cuda"):
        raise ValueError(f"unknown device {name!r}: choose 'cpu' or 'cuda'")
    if name not in _INSTANCES:
        if name == "cpu":
            from .cpu import CPUBackend
            _INSTANCES[name] = CPUBackend()
        else:
            from .cuda import CUDABackend  # raises a clear error without a GPU
            _INSTANCES[name] = CUDABackend()
    return _INSTANCES[name]


__all__ = ["Backend", "get_backend"]
