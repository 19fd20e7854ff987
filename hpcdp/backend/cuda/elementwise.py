"""Elementwise kernel families: unary maps, binary ops with NumPy broadcasting,
activation backward passes, fill, the causal mask and the dropout mask.

Each family is one ``@cuda.jit`` kernel with an integer op code (the branch is
uniform across a warp, so it costs nothing measurable against the memory
traffic). Grid-stride loops, so any size runs on any grid. All memory-bound:
the lab compares them against device-to-device copy bandwidth.
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np
from numba import cuda

from .. import philox as PX
from ..philox import make_group_writer
from ._util import NDIM, blocks, flat_threads, pad, prod

TPB = 256
MAX_BLOCKS = 65535

# unary op codes
NEG, EXP, LOG, SQRT, TANH, RELU, GELU, COPY, GELU_EXACT = range(9)
# binary op codes
ADD, SUB, MUL, DIV, RELU_BWD, GELU_BWD, RSUB, RDIV, MAXIMUM, EQ, GELU_EXACT_BWD = range(11)

GELU_C = math.sqrt(2.0 / math.pi)


def grid(n):
    tpb = flat_threads(n, TPB)
    return min(blocks(n, tpb), MAX_BLOCKS), tpb


@lru_cache(maxsize=None)
def _kernels(dtype):
    """The elementwise family for one float dtype. Constants are typed with the
    dtype (a bare ``0.5`` would promote float32 math to float64, and float64
    exp/tanh is several times slower on most GPUs)."""
    T = np.dtype(dtype).type
    Z, HALF, ONE = T(0), T(0.5), T(1)
    C0, C1, C3 = T(GELU_C), T(0.044715), T(3 * 0.044715)
    RSQRT2, INV_SQRT_2PI = T(1.0 / math.sqrt(2.0)), T(1.0 / math.sqrt(2.0 * math.pi))

    @cuda.jit(device=True)  # NVVM inlines small device functions at -O3
    def un(op, x):
        if op == NEG:
            return -x
        if op == EXP:
            return math.exp(x)
        if op == LOG:
            return math.log(x)
        if op == SQRT:
            return math.sqrt(x)
        if op == TANH:
            return math.tanh(x)
        if op == RELU:
            return x if x > Z else Z
        if op == GELU:
            return HALF * x * (ONE + math.tanh(C0 * (x + C1 * x * x * x)))
        if op == GELU_EXACT:
            return HALF * x * (ONE + math.erf(x * RSQRT2))
        return x

    @cuda.jit(device=True)  # NVVM inlines small device functions at -O3
    def bin(op, a, b):
        if op == ADD:
            return a + b
        if op == SUB:
            return a - b
        if op == MUL:
            return a * b
        if op == DIV:
            return a / b
        if op == RELU_BWD:  # a = x, b = gy
            return b if a > Z else Z
        if op == GELU_BWD:  # a = x, b = gy
            th = math.tanh(C0 * (a + C1 * a * a * a))
            du = C0 * (ONE + C3 * a * a)
            return b * (HALF * (ONE + th) + HALF * a * (ONE - th * th) * du)
        if op == RSUB:
            return b - a
        if op == RDIV:
            return b / a
        if op == EQ:
            return ONE if a == b else Z
        if op == GELU_EXACT_BWD:  # a = x, b = gy: Phi(x) + x phi(x)
            return b * (HALF * (ONE + math.erf(a * RSQRT2)) + a * INV_SQRT_2PI * math.exp(-HALF * a * a))
        return max(a, b)

    @cuda.jit
    def unary(op, x, out, n):
        i = cuda.grid(1)
        while i < n:
            out[i] = un(op, x[i])
            i += cuda.gridsize(1)

    @cuda.jit
    def binary_same(op, a, b, out, n):
        """a, b, out all the same shape (flat)."""
        i = cuda.grid(1)
        while i < n:
            out[i] = bin(op, a[i], b[i])
            i += cuda.gridsize(1)

    @cuda.jit
    def binary_scalar(op, a, s, out, n):
        """b is a scalar (typed by the launcher); RSUB/RDIV give s - a, s / a."""
        i = cuda.grid(1)
        while i < n:
            out[i] = bin(op, a[i], s)
            i += cuda.gridsize(1)

    @cuda.jit
    def binary_trailing(op, a, b, out, n, nb, b_first):
        """b broadcasts over a's leading dims (b.size == nb divides n): bias adds,
        LayerNorm weights. b_first swaps operand order (b op a)."""
        i = cuda.grid(1)
        while i < n:
            if b_first:
                out[i] = bin(op, b[i % nb], a[i])
            else:
                out[i] = bin(op, a[i], b[i % nb])
            i += cuda.gridsize(1)

    @cuda.jit
    def binary_strided(op, a, a_strides, b, b_strides, out, shape, n):
        """General broadcasting: out (contiguous, padded shape) from strided reads."""
        i = cuda.grid(1)
        while i < n:
            rem = i
            ai = 0
            bi = 0
            for d in range(NDIM - 1, -1, -1):
                c = rem % shape[d]
                rem = rem // shape[d]
                ai += c * a_strides[d]
                bi += c * b_strides[d]
            out[i] = bin(op, a[ai], b[bi])
            i += cuda.gridsize(1)

    @cuda.jit
    def fill(x, value, n):
        i = cuda.grid(1)
        while i < n:
            x[i] = value
            i += cuda.gridsize(1)

    @cuda.jit
    def iadd(dst, src, n, scale):
        """dst += scale * src (gradient accumulation)."""
        i = cuda.grid(1)
        while i < n:
            dst[i] += scale * src[i]
            i += cuda.gridsize(1)

    @cuda.jit
    def causal_fill(x, out, t1, t2, value, n):
        i = cuda.grid(1)
        while i < n:
            j = i % t2
            r = (i // t2) % t1
            out[i] = value if j > r else x[i]
            i += cuda.gridsize(1)

    return dict(unary=unary, binary_same=binary_same, binary_scalar=binary_scalar,
                binary_trailing=binary_trailing, binary_strided=binary_strided,
                fill=fill, iadd=iadd, causal_fill=causal_fill)


def K(dtype):
    return _kernels(np.dtype(dtype).str)


def _s(dtype, v):
    """A scalar typed like the array (so the kernel is compiled for that type)."""
    return np.dtype(dtype).type(v)


# The dropout mask: Philox4x32-10 from the same Python source the CPU backend
# compiles with numba.njit (hpcdp/backend/philox.py), so both draw the same mask
# bit for bit. One thread writes four elements of one sample's row.
_write_group = make_group_writer(cuda.jit(device=True))


@cuda.jit(cache=True)
def _dropout(out, samples, per, groups, step, layer, k0, k1, thr, keep, drop):
    """Counter-based: element j of row b depends only on (key, samples[b], j), so
    the mask is the same for any launch configuration and on any backend."""
    n = samples.size * groups
    t = cuda.grid(1)
    while t < n:
        b = t // groups
        g = t - b * groups
        _write_group(out, b * per, g, per, samples[b], step, layer, k0, k1, thr, keep, drop)
        t += cuda.gridsize(1)


# -- launchers -------------------------------------------------------------

def unary(op, x_flat, out_flat):
    n = x_flat.size
    if n:
        K(out_flat.dtype)["unary"][grid(n)](op, x_flat, out_flat, n)


def binary_same(op, a_flat, b_flat, out_flat):
    n = out_flat.size
    if n:
        K(out_flat.dtype)["binary_same"][grid(n)](op, a_flat, b_flat, out_flat, n)


def binary_scalar(op, a_flat, s, out_flat):
    n = out_flat.size
    if n:
        K(out_flat.dtype)["binary_scalar"][grid(n)](op, a_flat, _s(out_flat.dtype, s), out_flat, n)


def binary_trailing(op, a_flat, b_flat, out_flat, b_first=False):
    n = out_flat.size
    if n:
        K(out_flat.dtype)["binary_trailing"][grid(n)](op, a_flat, b_flat, out_flat, n,
                                                      b_flat.size, b_first)


def binary_strided(op, a_flat, a_strides, b_flat, b_strides, out_flat, shape):
    n = prod(shape)
    if n:
        K(out_flat.dtype)["binary_strided"][grid(n)](
            op, a_flat, pad(a_strides, 0), b_flat, pad(b_strides, 0), out_flat, pad(shape, 1), n)


def fill(x_flat, value):
    n = x_flat.size
    if n:
        K(x_flat.dtype)["fill"][grid(n)](x_flat, _s(x_flat.dtype, value), n)


def iadd(dst_flat, src_flat, scale=1.0):
    n = dst_flat.size
    if n:
        K(dst_flat.dtype)["iadd"][grid(n)](dst_flat, src_flat, n, _s(dst_flat.dtype, scale))


def causal_fill(x_flat, out_flat, t1, t2, value):
    n = out_flat.size
    if n:
        K(out_flat.dtype)["causal_fill"][grid(n)](x_flat, out_flat, t1, t2,
                                                  _s(out_flat.dtype, value), n)


def dropout(out_flat, p, seed, step, layer, samples_dev, per):
    """Fill ``out_flat`` (len(samples) rows of ``per``) with the mask of
    (seed, step, layer, samples); ``samples_dev`` is a uint64 device array."""
    n = out_flat.size
    if n:
        groups = (per + 3) // 4
        k0, k1 = PX.split_seed(seed)
        u = np.uint64
        scale = 1.0 / (1.0 - p)
        _dropout[grid(samples_dev.size * groups)](
            out_flat, samples_dev, per, groups, u(step), u(layer), u(k0), u(k1),
            u(PX.threshold(p)), _s(out_flat.dtype, scale), _s(out_flat.dtype, 0.0))
