"""GEMM variants, from naive to the backend's kernel.

v1 naive:      one thread per C element, A and B straight from global memory.
v2 shared:     16x16 shared-memory tiles, one element per thread (loads reused
               16x, but one FMA per two shared-memory reads).
v3 reg 64x64:  the backend's 64x64x16 tile, 4x4 accumulators per thread.
v4 reg 128x128: the backend's 128x128x8 tile, 8x8 per thread (the default for
               large matrices: 4x the arithmetic per shared-memory read of v2).
All take flat float32 device arrays for C = A @ B with A (M, K), B (K, N).
"""

from __future__ import annotations

import numpy as np
from numba import cuda, float32

from hpcdp.backend.cuda import gemm

T2 = 16


@cuda.jit
def _naive(a, b, c, M, N, K):
    col, row = cuda.grid(2)
    if row < M and col < N:
        acc = float32(0)
        for k in range(K):
            acc += a[row * K + k] * b[k * N + col]
        c[row * N + col] = acc


@cuda.jit
def _shared(a, b, c, M, N, K):
    As = cuda.shared.array((T2, T2), float32)
    Bs = cuda.shared.array((T2, T2), float32)
    tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
    col = cuda.blockIdx.x * T2 + tx
    row = cuda.blockIdx.y * T2 + ty
    acc = float32(0)
    for k0 in range(0, K, T2):
        As[ty, tx] = a[row * K + k0 + tx] if row < M and k0 + tx < K else float32(0)
        Bs[ty, tx] = b[(k0 + ty) * N + col] if col < N and k0 + ty < K else float32(0)
        cuda.syncthreads()
        for kk in range(T2):
            acc += As[ty, kk] * Bs[kk, tx]
        cuda.syncthreads()
    if row < M and col < N:
        c[row * N + col] = acc


def v1_naive(a, b, c, M, N, K):
    _naive[((N + 15) // 16, (M + 15) // 16), (16, 16)](a, b, c, M, N, K)


def v2_shared(a, b, c, M, N, K):
    _shared[((N + T2 - 1) // T2, (M + T2 - 1) // T2), (T2, T2)](a, b, c, M, N, K)


def _backend(config):
    def run(a, b, c, M, N, K):
        gemm.launch(a, b, c, M, N, K, False, False, (0, 0, 0), (0, 0, 0), (1, 1, 1),
                    config=gemm.CONFIGS[config])
    return run


VARIANTS = {
    "v1_naive": v1_naive,
    "v2_shared16": v2_shared,
    "v3_reg64x64": _backend("64x64"),
    "v4_reg128x128": _backend("128x128"),
}


def inputs(rng, M, N, K):
    return (rng.standard_normal((M, K)).astype(np.float32),
            rng.standard_normal((K, N)).astype(np.float32))
