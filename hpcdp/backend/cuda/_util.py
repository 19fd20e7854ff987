"""Small host-side helpers shared by the cuda kernel families.

Conventions: every array the cuda backend hands out is C-contiguous, so a kernel
can take it as a flat 1-D view (``x.reshape(-1)`` is free) and do its own index
math. Strided/broadcast access is described by padded shape and element-stride
tuples of length ``NDIM`` (leading dims of size 1), passed by value to the kernel.
"""

from __future__ import annotations

import math

import numba
import numpy as np
from numba import cuda  # noqa: F401  (module-level import keeps the simulator happy)

NDIM = 6  # most dims a strided/broadcast kernel handles; more is a clear error
FLOAT_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


def is_device_array(x) -> bool:
    """A numba device array (real or simulated), not a host ndarray."""
    return hasattr(x, "copy_to_host") and not isinstance(x, np.ndarray)


def nbtype(dtype):
    return numba.from_dtype(np.dtype(dtype))


def contig_strides(shape) -> tuple[int, ...]:
    """Element strides of a C-contiguous array of ``shape``."""
    strides, acc = [], 1
    for n in reversed(shape):
        strides.append(acc)
        acc *= int(n)
    return tuple(reversed(strides))


def pad(seq, fill, what="array") -> tuple[int, ...]:
    seq = tuple(int(s) for s in seq)
    if len(seq) > NDIM:
        raise ValueError(f"cuda backend: {what} has {len(seq)} dims; at most {NDIM} are supported")
    return (fill,) * (NDIM - len(seq)) + seq


def broadcast_strides(shape, out_shape) -> tuple[int, ...]:
    """Element strides that read a contiguous ``shape`` array broadcast to ``out_shape``."""
    shape = (1,) * (len(out_shape) - len(shape)) + tuple(shape)
    strides = contig_strides(shape)
    return tuple(0 if n == 1 and m != 1 else s for n, m, s in zip(shape, out_shape, strides))


def prod(shape) -> int:
    return int(math.prod(int(s) for s in shape))


def blocks(n: int, tpb: int) -> int:
    return max(1, (int(n) + tpb - 1) // tpb)


def flat_threads(n: int, tpb: int = 256) -> int:
    """Threads per block for a flat grid-stride kernel: ``tpb``, or fewer (a
    multiple of 32) when the whole array is smaller than one block (no idle
    threads; the simulator's cost is per thread)."""
    return min(tpb, max(32, (int(n) + 31) // 32 * 32))


def row_threads(n: int) -> int:
    """Threads per block for a one-block-per-row kernel: a power of two in [32, 256]
    (the shared-memory tree needs a power of two; 256 keeps enough blocks resident)."""
    t = 32
    while t < n and t < 256:
        t *= 2
    return t


def normalize_axes(axis, ndim: int) -> tuple[int, ...]:
    if axis is None:
        return tuple(range(ndim))
    if isinstance(axis, (int, np.integer)):
        axis = (int(axis),)
    out = []
    for a in axis:
        a = int(a)
        if not -ndim <= a < max(ndim, 1):
            raise ValueError(f"axis {a} is out of range for an array with {ndim} dims")
        out.append(a % ndim if ndim else 0)
    if len(set(out)) != len(out):
        raise ValueError(f"repeated axis in {axis}")
    return tuple(sorted(out))
