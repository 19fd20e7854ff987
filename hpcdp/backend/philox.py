"""Philox4x32-10: the counter-based generator behind every random stream (dropout).

A counter-based generator is a keyed bijection of a 128-bit counter: the random bits
of element i are a pure function of (key, counter(i)), so any thread, any rank and
any backend computes the same bits for the same element without carrying state.
Philox4x32-10 (Salmon, Moraes, Dror, Shaw: "Parallel random numbers: as easy as 1,
2, 3", SC 2011; the generator behind cuRAND's ``curand_Philox4x32_10``) maps a
counter of four 32-bit words under a 64-bit key to four 32-bit outputs in ten
rounds of two 32x32->64 multiplications. tests/unit/test_philox.py checks the
published known-answer vectors.

The functions below are written ONCE, as plain Python on ``np.uint64`` scalars, and
compiled twice: ``numba.njit`` for the CPU backend (hpcdp/backend/cpu_kernels.py)
and ``numba.cuda.jit(device=True)`` for the CUDA backend
(hpcdp/backend/cuda/elementwise.py). Every value stays below 2**64 (32-bit words in
64-bit containers, products of two 32-bit words), so there is no overflow to
define, and no Python ``int`` meets a ``uint64`` in arithmetic (numba would turn
that into float64): every constant is an ``np.uint64``.

How a dropout mask uses it (:func:`make_group_writer`): element j of sample s in layer L at
optimizer step t under model seed S is kept iff word ``j % 4`` of
``philox(counter = (j // 4, s, t, L), key = S)`` is ``>= threshold``, with
``threshold = round(p * 2**32)`` computed once on the host (an integer compare: no
float rounding can differ between backends). The key fields fill the counter
directly, so two different (sample, step, layer, group) never share a counter:
masks cannot collide, whatever the seeds.
"""

from __future__ import annotations

import numpy as np

M32 = np.uint64(0xFFFFFFFF)
S32 = np.uint64(32)
PHILOX_M0 = np.uint64(0xD2511F53)
PHILOX_M1 = np.uint64(0xCD9E8D57)
PHILOX_W0 = np.uint64(0x9E3779B9)
PHILOX_W1 = np.uint64(0xBB67AE85)

# Limits of the counter fields (each one 32-bit word).
MAX_WORD = 0xFFFFFFFF
MAX_SAMPLE_ELEMENTS = 4 * (MAX_WORD + 1)  # j // 4 must fit one word


def philox4x32_10(c0, c1, c2, c3, k0, k1):
    """Four 32-bit outputs of Philox4x32-10 for counter (c0..c3) and key (k0, k1),
    all ``np.uint64`` scalars holding 32-bit words."""
    for _ in range(10):
        p0 = PHILOX_M0 * c0                      # < 2**64: 32 x 32 bits
        p1 = PHILOX_M1 * c2
        hi0, lo0 = p0 >> S32, p0 & M32
        hi1, lo1 = p1 >> S32, p1 & M32
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
        k0 = (k0 + PHILOX_W0) & M32
        k1 = (k1 + PHILOX_W1) & M32
    return c0, c1, c2, c3


def make_group_writer(jit):
    """``write_group`` compiled with ``jit`` (``numba.njit`` or
    ``numba.cuda.jit(device=True)``): writes elements 4g .. 4g+3 of one sample's row
    of a flat mask, so one Philox call serves four elements."""
    philox = jit(philox4x32_10)

    def write_group(out, base, g, per, sample, step, layer, k0, k1, thr, keep, drop):
        r0, r1, r2, r3 = philox(np.uint64(g), np.uint64(sample), np.uint64(step),
                                np.uint64(layer), k0, k1)
        j = 4 * g
        o = base + j
        out[o] = keep if r0 >= thr else drop
        if j + 1 < per:
            out[o + 1] = keep if r1 >= thr else drop
        if j + 2 < per:
            out[o + 2] = keep if r2 >= thr else drop
        if j + 3 < per:
            out[o + 3] = keep if r3 >= thr else drop

    return jit(write_group)


def split_seed(seed: int) -> tuple[int, int]:
    """A 64-bit seed as the two key words (host side, Python ints)."""
    seed = int(seed) & 0xFFFFFFFFFFFFFFFF
    return seed & MAX_WORD, seed >> 32


def threshold(p: float) -> int:
    """The 32-bit integer below which an element is dropped: P(drop) = thr / 2**32."""
    if not 0.0 <= p < 1.0:
        raise ValueError(f"dropout p must be in [0, 1), got {p}")
    return min(int(round(float(p) * 4294967296.0)), MAX_WORD)


def check_key(shape, samples, step: int, layer: int) -> tuple[int, int]:
    """Validate a mask request on the host; returns (batch, elements per sample).

    ``samples`` holds the global index of each sample along axis 0 of ``shape``."""
    shape = tuple(int(s) for s in shape)
    if len(shape) < 1:
        raise ValueError("dropout mask: the input needs a leading batch axis (one sample per row)")
    batch = shape[0]
    per = 1
    for s in shape[1:]:
        per *= s
    n = len(samples)
    if n != batch:
        raise ValueError(f"dropout mask: {n} sample indices for a batch of {batch} (axis 0 of "
                         f"shape {shape}); the random key needs one global index per sample")
    if n and (int(np.min(samples)) < 0 or int(np.max(samples)) > MAX_WORD):
        raise ValueError(f"dropout mask: sample indices must be in [0, {MAX_WORD}]")
    if not 0 <= int(step) <= MAX_WORD:
        raise ValueError(f"dropout mask: step must be in [0, {MAX_WORD}], got {step}")
    if not 0 <= int(layer) <= MAX_WORD:
        raise ValueError(f"dropout mask: layer stream must be in [0, {MAX_WORD}], got {layer}")
    if per > MAX_SAMPLE_ELEMENTS:
        raise ValueError(f"dropout mask: {per} elements per sample exceed {MAX_SAMPLE_ELEMENTS}")
    return batch, per


__all__ = ["philox4x32_10", "make_group_writer", "split_seed", "threshold", "check_key", "M32", "MAX_WORD"]
