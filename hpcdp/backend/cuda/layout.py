"""Layout kernels: one strided copy moves data for transpose, getitem (basic
slicing), setitem_add, concatenate, broadcast materialisation and dtype casts.

``strided_copy`` walks the elements of a (padded, ``NDIM``-dim) iteration shape and
copies ``src[s_off + idx . s_strides]`` to ``dst[d_off + idx . d_strides]`` (mode 0)
or adds it (mode 1). Basic slicing never maps two iteration indices to the same
destination element, so the add needs no atomics and is deterministic. Cost: one
read + one write per element plus NDIM integer divisions for the index.
"""

from __future__ import annotations

import numpy as np
from numba import cuda

from ._util import NDIM, blocks, contig_strides, flat_threads, pad, prod

TPB = 256


@cuda.jit(cache=True)
def _strided_copy(src, s_off, s_strides, dst, d_off, d_strides, shape, n, mode):
    i = cuda.grid(1)
    stride = cuda.gridsize(1)
    while i < n:
        rem = i
        si = s_off
        di = d_off
        for d in range(NDIM - 1, -1, -1):
            c = rem % shape[d]
            rem = rem // shape[d]
            si += c * s_strides[d]
            di += c * d_strides[d]
        if mode == 0:
            dst[di] = src[si]
        else:
            dst[di] += src[si]
        i += stride


def strided_copy(src_flat, s_off, s_strides, dst_flat, d_off, d_strides, shape, add=False):
    """Launch the copy over ``shape`` (unpadded); strides are in elements."""
    n = prod(shape)
    if n == 0:
        return
    tpb = flat_threads(n, TPB)
    _strided_copy[min(blocks(n, tpb), 65535), tpb](
        src_flat, int(s_off), pad(s_strides, 0, "stride"), dst_flat, int(d_off),
        pad(d_strides, 0, "stride"), pad(shape, 1, "shape"), n, 1 if add else 0)


def parse_basic_index(shape, index):
    """(offset, out_shape, strides) of ``x[index]`` for a C-contiguous ``x`` of
    ``shape``: ints, slices (any step), Ellipsis and None. Anything else (arrays,
    booleans) is advanced indexing, which the cuda backend does not implement."""
    if not isinstance(index, tuple):
        index = (index,)
    n_ell = sum(1 for ix in index if ix is Ellipsis)
    if n_ell > 1:
        raise IndexError("an index can only have a single ellipsis ('...')")
    n_real = sum(1 for ix in index if ix is not None and ix is not Ellipsis)
    if n_real > len(shape):
        raise IndexError(f"too many indices ({n_real}) for an array of shape {tuple(shape)}")
    if n_ell:
        k = index.index(Ellipsis)
        index = index[:k] + (slice(None),) * (len(shape) - n_real) + index[k + 1:]
    else:
        index = index + (slice(None),) * (len(shape) - n_real)
    strides = contig_strides(shape)
    offset, out_shape, out_strides, d = 0, [], [], 0
    for ix in index:
        if ix is None:
            out_shape.append(1)
            out_strides.append(0)
            continue
        n = int(shape[d])
        if isinstance(ix, slice):
            start, stop, step = ix.indices(n)
            length = len(range(start, stop, step))
            offset += start * strides[d] if length else 0
            out_shape.append(length)
            out_strides.append(step * strides[d])
        elif isinstance(ix, (int, np.integer)) and not isinstance(ix, bool):
            i = int(ix)
            if not -n <= i < n:
                raise IndexError(f"index {i} is out of bounds for axis {d} with size {n}")
            offset += (i % n) * strides[d]
        else:
            raise IndexError(
                f"cuda backend getitem supports ints, slices, None and '...', got {type(ix).__name__}")
        d += 1
    return offset, tuple(out_shape), tuple(out_strides)
