"""Buffers on the GPU: straight into MPI when it is CUDA-aware, else staged.

A device array is anything with ``__cuda_array_interface__`` (numba.cuda
``DeviceNDArray``, or other libraries' arrays, wrapped with
``numba.cuda.as_cuda_array``).

- CUDA-aware MPI: device pointers go straight into the MPI calls; the ring's
  reductions run as small numba.cuda kernels on the device (``device_reduce``).
- Otherwise: the collective is staged. The device buffer is copied into a
  reusable host buffer (from the communicator's pool, so no fresh allocation per
  call), the host collective runs, and the result is copied back when the request
  completes. Cost: one device->host and one host->device copy of the buffer.

Detection is automatic and overridable: ``HPCDP_CUDA_AWARE=1|0`` or
:func:`set_cuda_aware`; otherwise mpi4py's ``MPI.Query_cuda_support()`` where the
library offers it (Open MPI), else False (MPICH's PyPI wheel is not CUDA-aware).
"""

from __future__ import annotations


import numpy as np
from mpi4py import MPI

from hpcdp.comm.core.context import get_context


def is_device_array(x) -> bool:
    """``__cuda_array_interface__``, or a numba device array (the CUDA simulator's
    arrays have no interface but the same methods)."""
    if x is None or isinstance(x, np.ndarray):
        return False
    return hasattr(x, "__cuda_array_interface__") or (
        hasattr(x, "copy_to_host") and hasattr(x, "copy_to_device"))


def detect_cuda_aware() -> bool:
    from hpcdp.comm.core.settings import settings
    said = settings().cuda_aware  # [comm] cuda_aware, HPCDP_CUDA_AWARE overriding it
    if said != "auto":
        return said == "true"
    query = getattr(MPI, "Query_cuda_support", None)
    if query is not None:
        try:
            return bool(query())
        except Exception:  # noqa: BLE001 - a library without the query: assume not aware
            return False
    return False


def cuda_aware(comm) -> bool:
    ctx = get_context(comm)
    if ctx.cuda_aware is None:
        ctx.cuda_aware = detect_cuda_aware()
    return ctx.cuda_aware


def set_cuda_aware(comm, enabled: bool) -> None:
    """Force the CUDA-aware path on or off for ``comm`` (all ranks alike)."""
    get_context(comm).cuda_aware = bool(enabled)


def _as_numba(x):
    from numba import cuda
    return x if hasattr(x, "copy_to_host") else cuda.as_cuda_array(x)


class StagedRequest:
    """A host collective on staged copies; copies the result back on completion."""

    def __init__(self, inner, copy_back, result):
        self.inner, self._copy_back, self.result = inner, copy_back, result
        self.done = False

    def test(self) -> bool:
        if not self.done and self.inner.test():
            self._copy_back()
            self.done = True
        return self.done

    def expire(self):
        self.inner.expire()

    def wait(self, timeout=None):
        if not self.done:
            self.inner.wait(timeout)
            self._copy_back()
            self.done = True
        return self.result


def maybe_stage(fn, sendbuf, recvbuf, comm, kwargs):
    """None for host buffers or CUDA-aware MPI; else a :class:`StagedRequest`."""
    if not (is_device_array(sendbuf) or is_device_array(recvbuf)):
        return None
    if cuda_aware(comm):
        return None
    ctx = get_context(comm)
    d_send = _as_numba(sendbuf)
    h_send = _host(ctx, d_send)
    d_send.copy_to_host(h_send)
    in_place = recvbuf is None or recvbuf is sendbuf
    if in_place:
        inner = fn(h_send, None, comm=comm, **kwargs)
        result_host, target = inner.result, d_send
    else:
        d_recv = _as_numba(recvbuf)
        h_recv = _host(ctx, d_recv)
        inner = fn(h_send, h_recv, comm=comm, **kwargs)
        result_host, target = h_recv, d_recv

    def copy_back():
        if in_place and result_host.size != h_send.size:  # in-place reduce-scatter: the chunk
            off = result_host.ctypes.data - h_send.ctypes.data
            lo = off // h_send.dtype.itemsize
            target[lo:lo + result_host.size].copy_to_device(result_host)
        else:
            target.copy_to_device(h_send if in_place else h_recv)
        ctx.pool.put(h_send.base if h_send.base is not None else h_send)
        if not in_place:
            ctx.pool.put(h_recv.base if h_recv.base is not None else h_recv)

    if in_place and result_host.size != h_send.size:
        off = (result_host.ctypes.data - h_send.ctypes.data) // h_send.dtype.itemsize
        result = target[off:off + result_host.size]
    else:
        result = sendbuf if in_place else recvbuf
    return StagedRequest(inner, copy_back, result)


def _host(ctx, d):
    dtype = np.dtype(d.dtype)
    raw = ctx.pool.get(d.size * dtype.itemsize)
    return raw[:d.size * dtype.itemsize].view(dtype)


# -- CUDA-aware path: reductions on the device --------------------------------

_KERNELS: dict = {}
cuda = None  # numba.cuda, imported on first device reduction (kernels use it as a global)


def _kernel(name):
    global cuda
    if name not in _KERNELS:
        from numba import cuda

        if name == "sum":
            def k(out, a, b):
                i = cuda.grid(1)
                if i < out.size:
                    out[i] = a[i] + b[i]
        elif name == "max":
            def k(out, a, b):
                i = cuda.grid(1)
                if i < out.size:
                    out[i] = a[i] if a[i] > b[i] else b[i]
        elif name == "min":
            def k(out, a, b):
                i = cuda.grid(1)
                if i < out.size:
                    out[i] = a[i] if a[i] < b[i] else b[i]
        else:  # "scale": integer floor division or float true division by n
            def k(out, n, is_int):
                i = cuda.grid(1)
                if i < out.size:
                    out[i] = out[i] // n if is_int else out[i] / n
        _KERNELS[name] = cuda.jit(k)
    return _KERNELS[name]


def device_reduce(op, out, a, b) -> None:
    from numba import cuda
    if out.size == 0:
        return
    name = "sum" if op.name == "mean" and op.builtin else op.name
    if op.builtin:
        threads = 256
        _kernel(name)[(out.size + threads - 1) // threads, threads](out, a, b)
        cuda.synchronize()  # MPI reads the result next: it must be complete
    else:
        result = op.fn(a, b)
        out.copy_to_device(result)


def device_scale(arr, n: int) -> None:
    from numba import cuda
    if arr.size == 0:
        return
    threads = 256
    is_int = np.issubdtype(np.dtype(arr.dtype), np.integer)
    _kernel("scale")[(arr.size + threads - 1) // threads, threads](arr, n, is_int)
    cuda.synchronize()


def device_scratch(ctx, n: int, dtype):
    from numba import cuda
    return cuda.device_array(max(n, 0), dtype=dtype)
