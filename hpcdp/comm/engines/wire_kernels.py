"""bfloat16 <-> float32 for the 16-bit wire (hpcdp.comm.engines.wire), compiled: one pass,
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


@njit(cache=True, nogil=True)
def f16_narrow(bits, out):  # pragma: no cover - compiled
    """``out[i]`` = IEEE binary16 words of the float32 ``bits[i]`` (uint32), round to
    nearest even, overflow to inf, NaN as NumPy's cast. NumPy's own float32 -> float16
    cast runs in software on CPUs without F16C use (about 25 ns per element here)."""
    for i in range(bits.size):
        v = np.int64(bits[i])
        sign = (v >> 16) & 0x8000
        e = (v >> 23) & 0xFF
        man = v & 0x7FFFFF
        if e >= 143:                      # >= 2^16 (past 65520 rounds to inf), inf, NaN
            if e == 255 and man != 0:
                h = 0x7C00 | (man >> 13)
                if h == 0x7C00:
                    h = 0x7C01
            else:
                h = 0x7C00
        elif e >= 113:                    # a normal half: 10 bits kept, 13 rounded away
            h = ((e - 112) << 10) | (man >> 13)
            rem = man & 0x1FFF
            if rem > 0x1000 or (rem == 0x1000 and (h & 1) == 1):
                h += 1                    # a carry into the exponent is right (up to inf)
        elif e >= 102:                    # a subnormal half (units of 2^-24)
            full = man | 0x800000
            s = 126 - e
            h = full >> s
            rem = full & ((1 << s) - 1)
            half = 1 << (s - 1)
            if rem > half or (rem == half and (h & 1) == 1):
                h += 1
        else:                             # below 2^-25: rounds to zero
            h = 0
        out[i] = np.uint16(sign | h)


@njit(cache=True, nogil=True)
def f16_widen(words, bits):  # pragma: no cover - compiled
    """``bits[i]`` (uint32 view of float32) = the binary16 word ``words[i]``, exactly."""
    for i in range(words.size):
        w = np.int64(words[i])
        sign = (w & 0x8000) << 16
        e = (w >> 10) & 0x1F
        man = w & 0x3FF
        if e == 0:
            if man == 0:
                b = sign
            else:                         # subnormal: normalise
                e = 113
                while (man & 0x400) == 0:
                    man <<= 1
                    e -= 1
                b = sign | (e << 23) | ((man & 0x3FF) << 13)
        elif e == 31:
            b = sign | 0x7F800000 | (man << 13)
        else:
            b = sign | ((e + 112) << 23) | (man << 13)
        bits[i] = np.uint32(b)
