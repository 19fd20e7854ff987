"""Embedding lookup and its deterministic backward.

Forward: out[i, :] = table[ids[i], :], one thread per output element.

Backward (dense (V, D) gradient, repeated ids accumulate) without floating-point
atomics, so the result is bit-identical run to run:
1. count occurrences per vocab row (integer atomics only),
2. exclusive scan of the counts -> bucket starts (one thread; O(V), microseconds),
3. scatter positions into buckets (integer atomics: order inside a bucket is
   arbitrary here),
4. sort each bucket by position (one thread per bucket, insertion sort: O(b^2) per
   bucket of b repeats; fine for token batches, where the grid covers all rows),
5. one block per vocab row sums gy rows of its bucket in position order: the
   same order every run, and rows with no occurrence are written as zeros.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
from numba import cuda

from ._util import blocks, flat_threads

TPB = 256


@cuda.jit(cache=True)
def _lookup(table, ids, out, n, D):
    i = cuda.grid(1)
    while i < n * D:
        r = i // D
        out[i] = table[ids[r] * D + i % D]
        i += cuda.gridsize(1)


@cuda.jit(cache=True)
def _count(ids, counts, n):
    i = cuda.grid(1)
    if i < n:
        cuda.atomic.add(counts, ids[i], 1)


@cuda.jit(cache=True)
def _scan(counts, starts, cursor, V):
    if cuda.grid(1) == 0:
        acc = 0
        for v in range(V):
            starts[v] = acc
            cursor[v] = acc
            acc += counts[v]
        starts[V] = acc


@cuda.jit(cache=True)
def _scatter(ids, cursor, positions, n):
    i = cuda.grid(1)
    if i < n:
        slot = cuda.atomic.add(cursor, ids[i], 1)
        positions[slot] = i


@cuda.jit(cache=True)
def _sort_buckets(starts, positions, V):
    v = cuda.grid(1)
    if v < V:
        lo = starts[v]
        hi = starts[v + 1]
        for a in range(lo + 1, hi):
            key = positions[a]
            b = a - 1
            while b >= lo and positions[b] > key:
                positions[b + 1] = positions[b]
                b -= 1
            positions[b + 1] = key


@lru_cache(maxsize=None)
def _gather_sum(dtype):
    Z = np.dtype(dtype).type(0)

    @cuda.jit
    def gather_sum(gy, starts, positions, grad, D):
        v = cuda.blockIdx.x
        lo = starts[v]
        hi = starts[v + 1]
        d = cuda.threadIdx.x
        while d < D:
            acc = Z
            for s in range(lo, hi):
                acc += gy[positions[s] * D + d]
            grad[v * D + d] = acc
            d += cuda.blockDim.x
    return gather_sum


def lookup(table_flat, ids_flat, out_flat, D):
    n = ids_flat.size
    if n * D:
        tpb = flat_threads(n * D, TPB)
        _lookup[min(blocks(n * D, tpb), 65535), tpb](table_flat, ids_flat, out_flat, n, D)


def backward(gy_flat, ids_flat, grad_flat, V, D, scratch):
    """grad (V*D,) = sum of gy rows per id. ``scratch(shape, dtype)`` gives device
    arrays (zeroed where noted) from the backend's allocator."""
    n = ids_flat.size
    tn, tv = flat_threads(n, TPB), flat_threads(V, TPB)
    counts = scratch((V,), np.int64, zero=True)
    starts = scratch((V + 1,), np.int64)
    cursor = scratch((V,), np.int64)
    positions = scratch((max(n, 1),), np.int64)
    if n:
        _count[blocks(n, tn), tn](ids_flat, counts, n)
    _scan[1, 1](counts, starts, cursor, V)
    if n:
        _scatter[blocks(n, tn), tn](ids_flat, cursor, positions, n)
    _sort_buckets[blocks(V, tv), tv](starts, positions, V)
    tpb = 32
    while tpb < D and tpb < 256:
        tpb *= 2
    _gather_sum(np.dtype(grad_flat.dtype).str)[V, tpb](gy_flat, starts, positions, grad_flat, D)
