"""Reduction operators: ``"sum"``, ``"mean"``, ``"max"``, ``"min"`` or a callable.

A callable ``fn(a, b)`` must be elementwise, associative and commutative and
return an array of ``a``'s shape (e.g. ``numpy.maximum`` or
``lambda a, b: a * b``); the algorithms apply it in different orders, like MPI
does with a commutative user op. ``numpy.ufunc``s are called with ``out=`` (no
temporary). ``mean`` is ``sum`` followed by a division by the world size
(floor division for integer dtypes), applied once per element on the rank that
owns its chunk.
"""

from __future__ import annotations

import numpy as np
from mpi4py import MPI

_UFUNCS = {"sum": np.add, "max": np.maximum, "min": np.minimum, "mean": np.add}
_MPI_OPS = {"sum": MPI.SUM, "max": MPI.MAX, "min": MPI.MIN, "mean": MPI.SUM}


class Op:
    def __init__(self, name: str, fn, builtin: bool = False):
        self.name, self.fn, self.builtin = name, fn, builtin
        self.is_mean = builtin and name == "mean"

    def reduce(self, out, a, b) -> None:
        """``out[...] = a (op) b``; ``out`` may alias ``a`` or ``b``."""
        if not isinstance(out, np.ndarray):
            from hpcdp.comm.core.device import device_reduce
            device_reduce(self, out, a, b)
        elif isinstance(self.fn, np.ufunc):
            self.fn(a, b, out=out)
        else:
            result = self.fn(a, b)
            if np.shape(result) != out.shape:
                raise ValueError(f"reduction op {self.name!r} returned shape {np.shape(result)}, "
                                 f"expected {out.shape}: it must be elementwise")
            out[...] = result

    def finalize(self, arr, world_size: int) -> None:
        """Apply the post-reduction step (``mean``: divide by the world size)."""
        if not self.is_mean or world_size == 1:
            return
        if not isinstance(arr, np.ndarray):
            from hpcdp.comm.core.device import device_scale
            device_scale(arr, world_size)
        elif np.issubdtype(arr.dtype, np.integer):
            np.floor_divide(arr, world_size, out=arr)
        else:
            np.true_divide(arr, arr.dtype.type(world_size), out=arr)

    def mpi_op(self, dtype):
        """The matching MPI.Op (built-in, or a user op wrapping ``fn``)."""
        if self.builtin:
            return _MPI_OPS[self.name]
        return _user_mpi_op(self.fn, np.dtype(dtype))

    def __repr__(self) -> str:
        return f"Op({self.name})"


def mpi_datatype(dtype) -> MPI.Datatype:
    """The MPI datatype hpcdp hands MPI for a numpy dtype: mpi4py's table for its type
    code, except numpy's ``uint64`` ('L' on LP64), which mpi4py maps to
    MPI_UNSIGNED_LONG: Open MPI 4.1 (Debian's) compares that type's MAX / MIN as signed
    (a uint64 max over values above 2**63 comes back wrong), while MPI_UINT64_T, the
    same bits, is right on Open MPI and MPICH alike. Raises what mpi4py raises for a
    type this MPI lacks (Open MPI 4 has no float16)."""
    dt = np.dtype(dtype)
    if dt.kind == "u" and dt.itemsize == 8:
        return MPI.UINT64_T
    return MPI.Datatype.fromcode(dt.char)


_USER_OPS: dict = {}


def _user_mpi_op(fn, dtype):
    key = (fn, dtype.str)
    if key not in _USER_OPS:
        def apply(inbuf, inoutbuf, datatype, fn=fn, dtype=dtype):
            a = np.frombuffer(inbuf, dtype=dtype)
            b = np.frombuffer(inoutbuf, dtype=dtype)
            b[...] = fn(a, b)
        _USER_OPS[key] = MPI.Op.Create(apply, commute=True)
    return _USER_OPS[key]


def resolve(op) -> Op:
    if isinstance(op, Op):
        return op
    if isinstance(op, str):
        if op not in _UFUNCS:
            raise ValueError(f"op must be one of {sorted(_UFUNCS)} or a callable fn(a, b), got {op!r}")
        return _BUILTIN[op]
    if callable(op):
        return Op(getattr(op, "__name__", "custom"), op)
    raise TypeError(f"op must be one of {sorted(_UFUNCS)} or a callable fn(a, b), got {type(op).__name__}")


_BUILTIN = {name: Op(name, fn, builtin=True) for name, fn in _UFUNCS.items()}
