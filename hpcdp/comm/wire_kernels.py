"""bfloat16 <-> float32 for the 16-bit wire (hpcdp.comm.wire), compiled: one pass,
no temporaries. bfloat16 is the top 16 bits of a float32; narrowing rounds to
nearest even (a tie goes to the even word), keeps NaN a quiet NaN of the same sign
and rounds past the largest finite value to inf, as ml_dtypes, JAX and PyTorch do."""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True, nogil=True)
def bf16_narrow(bits, out):  # pragma: no cover - compiled
    """``out[i]`` = bfloat16 words of the float32 ``bits[i]`` (uint32), nearest even."""
    exp, man, quiet = np.uint64(0x7F800000), np.uint64(0x007FFFFF), np.uint64(0x0040)
    half, one, sh = np.uint64(0x7FFF), np.uint64(1), np.uint64(16)
    for i in range(bits.size):
        v = np.uint64(bits[i])  # unsigned constants throughout: numba widens uint64 op int64 to float
        if (v & exp) == exp and (v & man) != 0:
            out[i] = np.uint16((v >> sh) | quiet)      # NaN: keep sign, stay quiet
        else:
            out[i] = np.uint16((v + half + ((v >> sh) & one)) >> sh)


@njit(cache=True, nogil=True)
def bf16_widen(words, bits):  # pragma: no cover - compiled
    """``bits[i]`` (uint32 view of float32) = the bfloat16 word ``words[i]``, exactly."""
    for i in range(words.size):
        bits[i] = np.uint32(np.uint32(words[i]) << np.uint32(16))
