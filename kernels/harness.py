"""Lab plumbing: poisoned outputs, validation against float64, GPU timing and
the ceilings (vendor BLAS, device-to-device copy bandwidth).

Validation per run: fresh random inputs (new seed each call), every output
filled with NaN before the kernel runs (an element the kernel does not write
stays NaN and fails), relative error ``max|out - ref| / max|ref|`` against the
float64 reference in ``kernels/reference.py``.
"""

from __future__ import annotations

import math
import statistics
import time

import numpy as np
from numba import cuda

from hpcdp.backend.cuda import simulated


def poisoned(shape, dtype=np.float32):
    a = cuda.device_array(shape, dtype=dtype)
    host = np.full(shape, np.nan if np.dtype(dtype).kind == "f" else -1, dtype=dtype)
    a.copy_to_device(host)
    return a


def time_ms(fn, reps=20, warmup=3) -> float:
    """Median milliseconds of ``fn()`` (CUDA events around each call)."""
    for _ in range(warmup):
        fn()
    cuda.synchronize()
    times = []
    for _ in range(reps):
        if simulated():
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
            continue
        start, stop = cuda.event(), cuda.event()
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(cuda.event_elapsed_time(start, stop))
    return statistics.median(times)


def copy_bandwidth_gbs(nbytes=1 << 28, reps=20) -> float:
    """Device-to-device copy bandwidth (read + write counted): the ceiling for
    memory-bound kernels."""
    n = nbytes // 4
    src = cuda.device_array(n, dtype=np.float32)
    dst = cuda.device_array(n, dtype=np.float32)
    ms = time_ms(lambda: dst.copy_to_device(src), reps=reps)
    return 2 * n * 4 / (ms * 1e-3) / 1e9


def vendor_gemm_tflops(n: int, reps=10):
    """FP32 GEMM rate of the vendor BLAS reached through CuPy (cuBLAS) or
    PyTorch, measured now; (None, reason) when neither is installed."""
    try:
        import cupy as cp
        a = cp.random.standard_normal((n, n), dtype=cp.float32)
        b = cp.random.standard_normal((n, n), dtype=cp.float32)
        c = cp.matmul(a, b)
        cp.cuda.Device().synchronize()
        start, stop = cp.cuda.Event(), cp.cuda.Event()
        times = []
        for _ in range(reps):
            start.record()
            cp.matmul(a, b, out=c)
            stop.record()
            stop.synchronize()
            times.append(cp.cuda.get_elapsed_time(start, stop))
        return 2 * n ** 3 / (statistics.median(times) * 1e-3) / 1e12, "cupy.matmul (cuBLAS)"
    except ImportError:
        pass
    try:
        import torch
        if not torch.cuda.is_available():
            return None, "torch without CUDA"
        torch.backends.cuda.matmul.allow_tf32 = False  # plain FP32, like our kernel
        a = torch.randn(n, n, device="cuda")
        b = torch.randn(n, n, device="cuda")
        torch.matmul(a, b)
        torch.cuda.synchronize()
        times = []
        for _ in range(reps):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            torch.matmul(a, b)
            e.record()
            e.synchronize()
            times.append(s.elapsed_time(e))
        return 2 * n ** 3 / (statistics.median(times) * 1e-3) / 1e12, "torch.matmul (cuBLAS)"
    except ImportError:
        return None, "n/a (neither CuPy nor PyTorch installed)"


def fmt(x, spec=".3g"):
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "n/a"
    return format(x, spec)
