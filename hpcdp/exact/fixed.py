"""Integer fixed point: gradients summed exactly, in any order, on any rank count.

Floating-point addition is not associative, so a sum reduced in a different order
(another rank count, another ring position) gives other bits. Integer addition is
associative. Exact mode therefore converts each micro-batch's gradient to int64
fixed point with one power-of-two scale per parameter tensor that every rank agrees
on, sums integers (locally, through the ring or on a server: any order gives the
same integers) and converts back once.

The scale. For tensor t, ``max_t`` is the largest |g| over every micro-batch of the
global batch (a MAX reduction, exact in any order). With ``max_t < 2**E``
(``frexp``) and M micro-batches in the global batch, ``c = ceil(log2 M)``::

    e_t = 62 - c - E        q = rint(g * 2**e_t)  (|q| <= 2**(62 - c))

so the sum of all M terms stays within 2**62 < 2**63: no partial sum in any order
can overflow. Back: ``g_sum = float(Q) * 2**-e_t``, rounded once to the gradient's
dtype.

Precision kept and lost. A float32 gradient element within 2**(38 - c) of its
tensor's max is converted with no rounding at all (24-bit significand, 62 - c bits
of grid), so for M <= 64 every element down to 2**-32 of the tensor's largest one
is summed exactly, and the sum is rounded once (to float64, then to float32). An
element smaller than that is rounded to the grid: absolute error at most
``2**-(e_t + 1) <= max_t * 2**-(61 - c)``, far below float32's own rounding of a
sum of that tensor. Fast mode rounds after every addition instead.

Non-finite gradients: if any element of tensor t is NaN or +-inf on any rank, the
agreed max is inf and the whole summed tensor is NaN (as a float sum would
propagate), on every rank alike.

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
NONFINITE = np.int64(np.iinfo(np.int64).min)  # exponent marker: the tensor's sum is NaN


def headroom_bits(n_micro: int) -> int:
    """``c = ceil(log2 M)``: bits kept free so M terms cannot overflow."""
    if n_micro < 1:
        raise ValueError(f"headroom_bits: needs >= 1 micro-batch, got {n_micro}")
    return (int(n_micro) - 1).bit_length()


def exponents(global_max: np.ndarray, n_micro: int) -> np.ndarray:
    """Per-tensor exponents e_t from the agreed per-tensor max |g| (module docstring)."""
    c = headroom_bits(n_micro)
    out = np.zeros(len(global_max), dtype=np.int64)
    for t, m in enumerate(np.asarray(global_max, dtype=np.float64)):
        if not math.isfinite(m):
            out[t] = NONFINITE
        elif m > 0.0:
            out[t] = FRACTION_BITS - c - math.frexp(m)[1]
    return out


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
            acc[i - lo] += np.int64(np.rint((np.float64(g[i - lo]) * f1) * f2))


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


class Codec:
    """The per-tensor segments of one flat layout and this step's exponents."""

    def __init__(self, layout):
        self.seg_off = np.array([s.offset for s in layout], dtype=np.int64)
        self.seg_len = np.array([s.size for s in layout], dtype=np.int64)
        self.names = [s.name for s in layout]
        self.set_exponents(np.zeros(len(layout), dtype=np.int64))

    @property
    def n_tensors(self) -> int:
        return len(self.seg_off)

    def set_exponents(self, exps) -> None:
        self.exps = np.ascontiguousarray(exps, dtype=np.int64)
        self._enc = scale_factors(self.exps, +1)
        self._dec = scale_factors(self.exps, -1)

    def absmax_into(self, g, out, lo: int = 0) -> None:
        absmax_into(g, lo, self.seg_off, self.seg_len, out)

    def encode_add(self, g, acc, lo: int = 0) -> None:
        encode_add(g, lo, self.seg_off, self.seg_len, self.exps, *self._enc, acc)

    def decode(self, acc, out, lo: int = 0) -> None:
        decode(acc, lo, self.seg_off, self.seg_len, self.exps, *self._dec, out)

    def nonfinite(self) -> list[str]:
        return [n for n, e in zip(self.names, self.exps) if e == NONFINITE]


__all__ = ["Codec", "exponents", "headroom_bits", "FRACTION_BITS", "NONFINITE"]
