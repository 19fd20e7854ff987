"""Integer fixed point: gradients summed exactly, in any order, on any rank count.

Floating-point addition is not associative, so a sum reduced in a different order
(another rank count, another ring position) gives other bits. Integer addition is
associative. Exact mode therefore converts each micro-batch's gradient to int64 fixed point at
one power-of-two scale that every rank agrees on, sums integers (locally, through
the ring or on a server: any order gives the same integers) and converts back once.

The scale. ``max`` is the largest |g| of any finite tensor over every micro-batch
of the global batch (a MAX reduction per tensor, exact in any order). With
``max < 2**E`` (``frexp``), ``E_q`` = E rounded up to a multiple of 8 (the band),
and M micro-batches in the global batch, ``c = ceil(log2 M)``, every element of the
gradient is converted at one power-of-two scale::

    e = 62 - c - E_q        q = rint(g * 2**e)  (|q| <= 2**(62 - c))

so the sum of all M terms stays within 2**62 < 2**63: no partial sum in any order
can overflow. Back: ``g_sum = float(Q) * 2**-e``, rounded once to the gradient's
dtype. One scale for the whole gradient, in bands of 8 bits, because then the
previous step's scale is right for most steps (mode.py: one collective instead of
two); per-tensor scales cross band edges far more often (with ~30 tensors, in most
steps one of them does).

Precision kept and lost. The grid has 62 - c - (E_q - E) >= 55 - c bits below the
largest element. A float32 element (24-bit significand) down to about
``max * 2**-(31 - c)`` (2**-25 for M <= 64) lies on the grid and is converted with
no rounding at all, so those elements are summed exactly and the sum is rounded
once (to float64, then to float32). A smaller element is rounded to the grid:
absolute error at most ``2**-(e + 1) <= max * 2**-(55 - c)``. For a tensor whose own
largest gradient is ``r * max``, that error is ``2**-(55 - c) / r`` of its max:
below float32's own rounding of that tensor's sum (2**-24) as long as r > 2**-(31-c),
i.e. unless the tensor's gradients are 2**25 times smaller than the model's largest.
Fast mode rounds after every addition instead.

Non-finite gradients: if any element of tensor t is NaN or +-inf on any rank, its
agreed max is inf and the whole summed tensor is NaN (as a float sum would
propagate), on every rank alike; the other tensors are scaled by the finite ones.

Kernels are serial numba loops over (tensor segment) x (element) and work on any
range ``[lo, lo + len)`` of the flat buffer, so a shard or a bucket is converted
exactly as the same elements of the whole buffer (each element's result depends
only on its own value and its tensor's exponent).
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

FRACTION_BITS = 62                       # |any partial sum| < 2**62
QUANTUM = 8                              # exponents move in steps of 8 bits (see below)
NONFINITE = np.int64(np.iinfo(np.int64).min)  # exponent marker: the tensor's sum is NaN
ZERO_EQ = np.int64(-(1 << 40))           # quantized exponent of an all-zero tensor
INF_EQ = np.int64(1 << 40)               # ... of a tensor holding NaN or inf
LIMIT = float(2 ** FRACTION_BITS)        # encode clamps here (a scale guessed too fine)


def headroom_bits(n_micro: int) -> int:
    """``c = ceil(log2 M)``: bits kept free so M terms cannot overflow."""
    if n_micro < 1:
        raise ValueError(f"headroom_bits: needs >= 1 micro-batch, got {n_micro}")
    return (int(n_micro) - 1).bit_length()


def quantized_exponent(max_abs: np.ndarray) -> np.ndarray:
    """Per tensor ``E_q = QUANTUM * ceil(E / QUANTUM)`` with ``max < 2**E`` (frexp):
    the scale band. ZERO_EQ / INF_EQ mark an all-zero and a non-finite tensor."""
    out = np.empty(len(max_abs), dtype=np.int64)
    _quantized_exponent(np.ascontiguousarray(max_abs, dtype=np.float64), out)
    return out


@njit(cache=True)
def _quantized_exponent(m, out):
    for t in range(m.size):
        v = m[t]
        if not np.isfinite(v):
            out[t] = INF_EQ
        elif v == 0.0:
            out[t] = ZERO_EQ
        else:
            e = np.int64(math.frexp(v)[1])
            out[t] = -((-e) // QUANTUM) * QUANTUM


def band(eq: np.ndarray) -> np.int64:
    """The one scale band of the whole gradient: the largest quantized exponent of a
    finite tensor (ZERO_EQ if every tensor is zero or non-finite)."""
    eq = np.asarray(eq, dtype=np.int64)
    finite = eq[eq != INF_EQ]
    return np.int64(finite.max()) if finite.size else ZERO_EQ


def exponents_of(eq: np.ndarray, n_micro: int, at: int | None = None) -> np.ndarray:
    """Per-tensor exponents: every finite tensor gets ``e = 62 - c - band`` (``at``:
    that band; default ``band(eq)``), 0 if the band is ZERO_EQ; a non-finite tensor
    gets NONFINITE."""
    eq = np.asarray(eq, dtype=np.int64)
    b = band(eq) if at is None else np.int64(at)
    e = 0 if b == ZERO_EQ else FRACTION_BITS - headroom_bits(n_micro) - int(b)
    out = np.full(len(eq), e, dtype=np.int64)
    out[eq == INF_EQ] = NONFINITE
    return out


def exponents(global_max: np.ndarray, n_micro: int) -> np.ndarray:
    """Per-tensor exponents from the agreed per-tensor max |g| (module docstring)."""
    return exponents_of(quantized_exponent(global_max), n_micro)


def scale_factors(exps: np.ndarray, sign: int) -> tuple[np.ndarray, np.ndarray]:
    """2**(sign*e) as two float64 factors (e up to ~1200 for float64 gradients would
    overflow one factor; each half stays representable). Multiplying by them is
    exact up to over/underflow, which the exponent choice rules out for kept bits."""
    e = np.where(exps == NONFINITE, 0, exps) * int(sign)
    half = e // 2
    return np.ldexp(1.0, (e - half).astype(np.int64)), np.ldexp(1.0, half.astype(np.int64))


@njit(cache=True)
def absmax_into(g, lo, seg_off, seg_len, out):
    """out[t] = max(out[t], max |g| over tensor t's elements in [lo, lo + len(g));
    NaN or inf makes it inf."""
    hi = lo + g.size
    for t in range(seg_off.size):
        a = max(seg_off[t], lo)
        b = min(seg_off[t] + seg_len[t], hi)
        m = out[t]
        for i in range(a, b):
            v = abs(np.float64(g[i - lo]))
            if not v <= m:          # larger, or NaN
                m = v if v == v else np.inf
        out[t] = m


@njit(cache=True)
def absmax_tensors(g, seg_off, seg_len, which, out):
    """out[t] = max(out[t], max |g| over tensor t) for t in ``which``; g is the whole
    flat buffer. NaN or inf makes it inf."""
    for k in range(which.size):
        t = which[k]
        m = out[t]
        for i in range(seg_off[t], seg_off[t] + seg_len[t]):
            v = abs(np.float64(g[i]))
            if not v <= m:
                m = v if v == v else np.inf
        out[t] = m


@njit(cache=True)
def encode_add(g, lo, seg_off, seg_len, exps, s1, s2, acc):
    """acc[i] += rint(g[i] * 2**e_t) for the elements of ``g`` = flat[lo:lo+len]."""
    hi = lo + g.size
    for t in range(seg_off.size):
        if exps[t] == NONFINITE:
            continue
        a = max(seg_off[t], lo)
        b = min(seg_off[t] + seg_len[t], hi)
        f1, f2 = s1[t], s2[t]
        for i in range(a, b):
            v = np.rint((np.float64(g[i - lo]) * f1) * f2)
            v = min(max(v, -LIMIT), LIMIT)   # only a scale guessed too fine gets here
            acc[i - lo] += np.int64(v)


@njit(cache=True)
def decode(acc, lo, seg_off, seg_len, exps, s1, s2, out):
    """out[i] = acc[i] * 2**-e_t (one rounding to float64, one to out's dtype); NaN
    for a tensor marked NONFINITE."""
    hi = lo + acc.size
    for t in range(seg_off.size):
        a = max(seg_off[t], lo)
        b = min(seg_off[t] + seg_len[t], hi)
        if exps[t] == NONFINITE:
            for i in range(a, b):
                out[i - lo] = np.nan
            continue
        f1, f2 = s1[t], s2[t]
        for i in range(a, b):
            out[i - lo] = (np.float64(acc[i - lo]) * f1) * f2


@njit(cache=True)
def square_sum(g, s):
    """``(sum of rint(g[i]**2 * 2**s) as int64, all finite?)``: each square on one
    fixed-point grid, so sums over any split of the elements agree exactly."""
    total = np.int64(0)
    for i in range(g.size):
        v = np.float64(g[i])
        if not np.isfinite(v):
            return total, False
        total += np.int64(np.rint(math.ldexp(v * v, s)))
    return total, True


def norm_scale(exps: np.ndarray, numel: int) -> int:
    """The grid of the squared norm: a decoded sum at exponent e is below
    ``2**(62 - e)``, its square below ``2**(124 - 2e)``; with ``h = ceil(log2
    numel)`` bits of headroom every square is at most ``2**(62 - h)`` and their sum
    stays below 2**62 at ``s = 2e - 62 - h`` (e: the largest finite exponent)."""
    finite = exps[exps != NONFINITE]
    e = int(finite.max()) if finite.size else 0
    return 2 * e - FRACTION_BITS - max(int(numel) - 1, 0).bit_length()


class Codec:
    """The per-tensor segments of one flat layout and this step's exponents."""

    def __init__(self, layout):
        self.seg_off = np.array([s.offset for s in layout], dtype=np.int64)
        self.seg_len = np.array([s.size for s in layout], dtype=np.int64)
        self.names = [s.name for s in layout]
        self.exps = None
        self.set_exponents(np.zeros(len(layout), dtype=np.int64))

    @property
    def n_tensors(self) -> int:
        return len(self.seg_off)

    def set_exponents(self, exps) -> None:
        exps = np.ascontiguousarray(exps, dtype=np.int64)
        if getattr(self, "exps", None) is not None and np.array_equal(exps, self.exps):
            return  # the same scale as the last step: keep the factors
        self.exps = exps
        self._enc = scale_factors(self.exps, +1)
        self._dec = scale_factors(self.exps, -1)

    def absmax_into(self, g, out, lo: int = 0) -> None:
        absmax_into(g, lo, self.seg_off, self.seg_len, out)

    def absmax_tensors(self, g, which, out) -> None:
        absmax_tensors(g, self.seg_off, self.seg_len, which, out)

    def encode_add(self, g, acc, lo: int = 0) -> None:
        encode_add(g, lo, self.seg_off, self.seg_len, self.exps, *self._enc, acc)

    def decode(self, acc, out, lo: int = 0) -> None:
        decode(acc, lo, self.seg_off, self.seg_len, self.exps, *self._dec, out)

    def nonfinite(self) -> list[str]:
        return [n for n, e in zip(self.names, self.exps) if e == NONFINITE]


__all__ = ["Codec", "square_sum", "norm_scale", "band", "exponents", "exponents_of", "quantized_exponent", "headroom_bits",
           "FRACTION_BITS", "NONFINITE", "QUANTUM"]
