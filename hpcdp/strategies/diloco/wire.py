"""What the outer gradients carry between replica groups (``outer_dtype``).

- ``"float32"``: the outer gradient's own bytes, summed by a ring allreduce.
- ``"bfloat16"``: comm's 16-bit wire (hpcdp.comm.engines.wire): 16-bit messages, float32 sums.
- ``"int8"``: 8-bit integers with one float32 scale per block of ``B`` values. The
  scale of a block is SHARED by every group: a first, small allreduce takes the
  maximum of the groups' absolute maxima of the block (``4/B`` bytes a value), so
  every group quantizes with the same step ``s = absmax / K`` and the integers of the
  ``M`` groups add EXACTLY in an int8 ring allreduce. To keep the sum of ``M`` values
  in ``[-127, 127]`` each group uses ``K = 127 // M`` levels a side (7 bits of
  resolution at M = 2, 6 at M = 3-4, 5 at M = 5-8; refused above 127 groups).

Why a shared scale and not one per group: with per-group scales the integers of two
groups cannot be added without decoding, so a ring would have to decode, add and
re-encode at every hop (a new wire inside comm's ring), and an all-gather of every
group's payload moves ``M - 1`` payloads per rank instead of the ring's
``2 (M - 1) / M``. With a shared scale the public allreduce does the work, the result
is exact integer arithmetic (the same bits on every group, in any ring order), and the
bytes are the ring's: ``2 (M - 1) / M x n x (1 + 4 / B)`` per rank.

Round-trip error bound (tests/unit/test_diloco.py): for every value ``x`` of a block
with shared absolute maximum ``a``, ``|dequantize(quantize(x)) - x| <= a / (2 K)``;
the mean of the ``M`` groups' decoded values is within the same bound of their true
mean.
"""

from __future__ import annotations

import numpy as np

WIRE_BYTES = {"float32": 4.0, "bfloat16": 2.0}


def levels(groups: int) -> int:
    """K: integer levels a side for one group's value so that M of them add within int8."""
    k = 127 // max(1, int(groups))
    if k < 1:
        raise ValueError(f"outer_dtype = \"int8\" adds the groups' integers exactly in 8 bits, which "
                         f"allows at most 127 groups; this run has {groups}: use outer_dtype = "
                         "\"bfloat16\" or fewer groups")
    return k


def n_blocks(n: int, block: int) -> int:
    return -(-int(n) // int(block))


def block_absmax(x: np.ndarray, block: int, out: np.ndarray | None = None) -> np.ndarray:
    """float32 absolute maximum of each block of ``block`` values (the last may be short)."""
    n = x.shape[0]
    nb = n_blocks(n, block)
    out = np.empty(nb, dtype=np.float32) if out is None else out
    full = (n // block) * block
    if full:
        np.max(np.abs(x[:full]).reshape(-1, block), axis=1, out=out[:full // block])
    if full < n:
        out[nb - 1] = np.max(np.abs(x[full:]))
    return out


def steps(absmax: np.ndarray, k: int) -> np.ndarray:
    """The quantization step of each block (float32; 1 where a block is all zeros)."""
    s = (absmax / np.float32(k)).astype(np.float32)
    s[s == 0] = 1.0
    return s


def quantize(x: np.ndarray, step: np.ndarray, block: int, k: int, out: np.ndarray | None = None) -> np.ndarray:
    """int8 ``round(x / step)`` per block, clipped to ``[-k, k]`` (NumPy rounds half to even)."""
    n = x.shape[0]
    out = np.empty(n, dtype=np.int8) if out is None else out
    per = np.repeat(step, block)[:n]
    q = np.rint(x / per)
    np.clip(q, -k, k, out=q)
    out[...] = q
    return out


def dequantize(q: np.ndarray, step: np.ndarray, block: int, out: np.ndarray | None = None,
               scale: float = 1.0) -> np.ndarray:
    """float32 ``q x step x scale`` per block (``scale``: 1/M turns a sum into a mean)."""
    n = q.shape[0]
    out = np.empty(n, dtype=np.float32) if out is None else out
    per = np.repeat((step * np.float32(scale)).astype(np.float32), block)[:n]
    np.multiply(q, per, out=out, casting="unsafe")
    return out


def wire_bytes_per_value(outer_dtype: str, block: int = 256) -> float:
    """Bytes one outer-gradient value costs on the wire (scales included)."""
    if outer_dtype == "int8":
        return 1.0 + 4.0 / block
    return WIRE_BYTES[outer_dtype]


__all__ = ["levels", "n_blocks", "block_absmax", "steps", "quantize", "dequantize", "wire_bytes_per_value"]
