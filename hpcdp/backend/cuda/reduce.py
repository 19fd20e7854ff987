"""Reductions (sum, max) as shared-memory trees, deterministic for a given shape.

Every reduction is brought to the form ``(outer, K, inner) -> (outer, inner)``
over a C-contiguous array (reduced axes contiguous; the backend transposes first
when they are not):
- ``inner == 1`` (rows, e.g. axis=-1): one block per row, threads stride over K,
  then a tree in shared memory.
- ``inner > 1`` (columns, e.g. bias gradients over the batch): a block of 32 x 8
  threads per 32 columns; x is coalesced over columns, y strides over K, tree
  over y.
- one output (full sum of a big array): two passes (partials per block, then one
  block) so the work spreads over the whole GPU.
The reduction order depends only on the shape and the launch configuration,
never on timing: same inputs give bit-identical results.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
from numba import cuda

from ._util import nbtype, row_threads

SUM, MAX = 0, 1
SMEM = 1024
COLS_X, COLS_Y = 32, 8
TWO_PASS_MIN = 65536  # a full reduction this long spreads over PARTIAL_BLOCKS blocks
PARTIAL_BLOCKS = 256


@cuda.jit(device=True)  # NVVM inlines small device functions at -O3
def _combine(op, a, b):
    if op == SUM:
        return a + b
    return max(a, b)


@cuda.jit(device=True)
def block_reduce(op, sm, val):
    """Tree-reduce ``val`` over the (power-of-two, 1-D) block; every thread gets
    the result. Two barriers per level."""
    tid = cuda.threadIdx.x
    sm[tid] = val
    cuda.syncthreads()
    s = cuda.blockDim.x // 2
    while s > 0:
        if tid < s:
            sm[tid] = _combine(op, sm[tid], sm[tid + s])
        cuda.syncthreads()
        s //= 2
    r = sm[0]
    cuda.syncthreads()
    return r


@lru_cache(maxsize=None)
def _kernels(dtype):
    t = nbtype(dtype)

    @cuda.jit
    def rows(op, x, out, K, init):
        sm = cuda.shared.array(SMEM, t)
        r = cuda.blockIdx.x
        base = r * K
        acc = init
        j = cuda.threadIdx.x
        while j < K:
            acc = _combine(op, acc, x[base + j])
            j += cuda.blockDim.x
        acc = block_reduce(op, sm, acc)
        if cuda.threadIdx.x == 0:
            out[r] = acc

    @cuda.jit
    def cols(op, x, out, K, inner, init):
        sm = cuda.shared.array((COLS_Y, COLS_X), t)
        tx = cuda.threadIdx.x
        ty = cuda.threadIdx.y
        c = cuda.blockIdx.x * COLS_X + tx
        o = cuda.blockIdx.y
        acc = init
        if c < inner:
            k = ty
            while k < K:
                acc = _combine(op, acc, x[(o * K + k) * inner + c])
                k += COLS_Y
        sm[ty, tx] = acc
        cuda.syncthreads()
        s = COLS_Y // 2
        while s > 0:
            if ty < s:
                sm[ty, tx] = _combine(op, sm[ty, tx], sm[ty + s, tx])
            cuda.syncthreads()
            s //= 2
        if ty == 0 and c < inner:
            out[o * inner + c] = sm[0, tx]

    @cuda.jit
    def partials(op, x, out, n, init):
        sm = cuda.shared.array(SMEM, t)
        acc = init
        i = cuda.grid(1)
        while i < n:
            acc = _combine(op, acc, x[i])
            i += cuda.gridsize(1)
        acc = block_reduce(op, sm, acc)
        if cuda.threadIdx.x == 0:
            out[cuda.blockIdx.x] = acc

    return rows, cols, partials


def reduce3(op, x_flat, out_flat, outer, K, inner, dtype, empty):
    """out[o, i] = op over k of x[o, k, i]; ``empty(shape, dtype)`` allocates scratch."""
    rows, cols, partials = _kernels(np.dtype(dtype).str)
    init = np.dtype(dtype).type(0.0 if op == SUM else -np.inf)
    if outer * inner == 0:
        return
    if inner == 1 and outer == 1 and K > TWO_PASS_MIN:
        nblk, tpb = PARTIAL_BLOCKS, 256
        part = empty((nblk,), dtype)
        partials[nblk, tpb](op, x_flat, part, K, init)
        rows[1, tpb](op, part, out_flat, nblk, init)
    elif inner == 1:
        rows[outer, row_threads(K)](op, x_flat, out_flat, K, init)
    else:
        cols[((inner + COLS_X - 1) // COLS_X, outer), (COLS_X, COLS_Y)](
            op, x_flat, out_flat, K, inner, init)
