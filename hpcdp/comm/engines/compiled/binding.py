"""The few MPI C functions the compiled engine calls, bound from the MPI library
mpi4py has loaded.

Why not the numba-mpi package: it binds MPI_COMM_WORLD only (sub-communicators are
its open issue #64 and draft PR #76), finds ``libmpi`` by name (``find_library``),
which can load a second MPI beside the one mpi4py runs on, and is GPL-licensed
(hpcdp is MIT). hpcdp needs a dozen functions, so they are bound here.

The library: ``ctypes.CDLL(mpi4py.MPI.__file__)`` is the extension module mpi4py
already loaded; ``dlsym`` on it searches its dependencies, so the symbols are the
ones of the very MPI that mpi4py initialised (the MPICH wheel, Debian's Open MPI,
a site MPI), never another one.

The ABI: handles (communicator, datatype, op, request) are ints in MPICH and its
derivatives and pointers in Open MPI. The C argument type is chosen by the
handle's size as mpi4py reports it (``MPI._sizeof``), never by the vendor's name:
the engine keeps handles in an array of that width (int32 or int64), so compiled
code passes them at the right width; values come from mpi4py's ``.handle``.
Buffers and out-pointers are passed as 64-bit integers (``array.ctypes.data``:
the same register as a pointer on the x86-64 and AArch64 ABIs). Statuses are never ignored by a
vendor-specific constant: the engine passes a scratch array of
``MPI._sizeof(MPI.Status)`` bytes per request instead.

:func:`load` returns a :class:`Binding` or raises :class:`Unbindable` with the
reason (hpcdp.comm.engines.compiled.engine then falls back to the Python ring and says so
once in the log).
"""

from __future__ import annotations

import ctypes

import numpy as np


class Unbindable(RuntimeError):
    """This MPI's C functions cannot be called from compiled code."""


_NP_INT = {4: np.int32, 8: np.int64}


class Binding:
    """Addresses of the C functions the engine calls (hpcdp.comm.engines.compiled.ccall) and
    the ABI facts it needs."""

    def __init__(self, lib, handle_size: int, status_size: int, request_null: int,
                 undefined: int, any_source: int, multiple: bool, in_place: int = 0):
        libc = ctypes.CDLL(None)

        def address(where, name):
            return int(ctypes.cast(getattr(where, name), ctypes.c_void_p).value)

        self.isend = address(lib, "MPI_Isend")
        self.irecv = address(lib, "MPI_Irecv")
        self.testsome = address(lib, "MPI_Testsome")
        self.iprobe = address(lib, "MPI_Iprobe")
        self.clock_gettime = address(libc, "clock_gettime")
        self.usleep = address(libc, "usleep")
        self.sched_yield = address(libc, "sched_yield")
        # MPI's own non-blocking collectives and MPI_Test: the lean path
        # (hpcdp.comm.engines.compiled.lean) posts one and tests it from compiled code
        self.iallreduce = address(lib, "MPI_Iallreduce")
        self.ireduce_scatter_block = address(lib, "MPI_Ireduce_scatter_block")
        self.ireduce_scatter = address(lib, "MPI_Ireduce_scatter")
        self.iallgather = address(lib, "MPI_Iallgather")
        self.iallgatherv = address(lib, "MPI_Iallgatherv")
        self.test = address(lib, "MPI_Test")
        self.handle_size, self.status_size = handle_size, status_size
        self.handle_dtype = _NP_INT[handle_size]
        self.request_null = as_signed(request_null, handle_size)
        self.undefined, self.any_source = undefined, any_source
        self.multiple = multiple
        # MPI_IN_PLACE as a pointer value (mpi4py's, never a vendor constant: MPICH's is
        # (void *) -1, Open MPI's (void *) 1)
        self.in_place = as_signed(in_place, 8)

    def handle(self, obj) -> int:
        """The C value of an mpi4py handle (Comm, Datatype), as the bound type takes it."""
        return as_signed(int(obj.handle), self.handle_size)


def as_signed(value: int, size: int) -> int:
    """``value`` as the signed C integer of ``size`` bytes with the same bits (mpi4py may
    report a 4-byte MPICH handle sign-extended to 64 bits, a pointer as unsigned)."""
    bits = 8 * size
    value &= (1 << bits) - 1
    return value - (1 << bits) if value >= 1 << (bits - 1) else value


def _libc_fn(libc, name, argtypes, restype):
    f = getattr(libc, name)
    f.argtypes, f.restype = argtypes, restype
    return f


def load() -> Binding:
    """Bind this process's MPI (module docstring); :class:`Unbindable` if it cannot."""
    try:
        from mpi4py import MPI
    except ImportError as exc:  # pragma: no cover - mpi4py is a dependency
        raise Unbindable(f"mpi4py does not import: {exc}") from None
    try:
        sizes = {MPI._sizeof(t) for t in (MPI.Comm, MPI.Datatype, MPI.Request, MPI.Op)}
        status_size = int(MPI._sizeof(MPI.Status))
    except (AttributeError, TypeError) as exc:
        raise Unbindable(f"mpi4py {getattr(MPI, '__version__', '')} does not report handle sizes "
                         f"({exc})") from None
    if len(sizes) != 1 or next(iter(sizes)) not in _NP_INT:
        raise Unbindable(f"unknown MPI ABI: handle sizes {sorted(sizes)} bytes "
                         "(the engine knows 4-byte and 8-byte handles)")
    handle_size = sizes.pop()
    try:
        lib = ctypes.CDLL(MPI.__file__)
        binding = Binding(lib, handle_size, status_size,
                          request_null=int(MPI.REQUEST_NULL.handle), undefined=int(MPI.UNDEFINED),
                          any_source=int(MPI.ANY_SOURCE),
                          multiple=MPI.Query_thread() == MPI.THREAD_MULTIPLE,
                          in_place=int(MPI.IN_PLACE))
    except (OSError, AttributeError, TypeError) as exc:
        raise Unbindable(f"the MPI library mpi4py loaded has no usable C symbols ({exc})") from None
    return binding


# this process's binding: "binding" the Binding, or the Unbindable's message; "told":
# who (the ring engine, the lean path) logged that it cannot bind
_LOADED: dict = {"told": set()}


def bound() -> Binding:
    """:func:`load`, once per process: the compiled engine and the lean path share one
    binding (one ``dlopen`` / ``dlsym`` pass); :class:`Unbindable` with the same reason on
    every call when this MPI cannot be bound. :func:`forget` loads again."""
    if "binding" not in _LOADED:
        try:
            _LOADED["binding"] = load()
        except Unbindable as exc:
            _LOADED["binding"] = str(exc)
    hit = _LOADED["binding"]
    if isinstance(hit, str):
        raise Unbindable(hit)
    return hit


def bound_or_none(who: str, log, line: str):
    """:func:`bound`, or None when this MPI cannot be bound: then ``line`` (a format with
    one ``%s``, the reason) goes to ``log`` once per process for ``who``."""
    try:
        return bound()
    except Unbindable as exc:
        if who not in _LOADED["told"]:
            _LOADED["told"].add(who)
            log.warning(line, exc)
        return None


def why() -> str | None:
    """Why this MPI cannot be bound, or None (bound, or not tried yet)."""
    hit = _LOADED.get("binding")
    return hit if isinstance(hit, str) else None


def forget() -> None:
    """Load again on the next :func:`bound` (tests: after changing what :func:`load` sees)."""
    _LOADED.clear()
    _LOADED["told"] = set()
