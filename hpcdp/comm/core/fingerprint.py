"""Fingerprints: what identifies one collective call, as seven int64s (sequence number,
collective, dtype, length, root, algorithm, op), and their names for messages.

Normally nothing is sent ahead of a collective; a deadline that passes starts the
lazy missing-rank diagnosis (hpcdp.comm.core.diagnose), which exchanges fingerprints
then; in debug mode (hpcdp.comm.core.debug) every call exchanges them first.
"""

from __future__ import annotations

import zlib

import numpy as np

FIELDS = ("seq", "collective", "dtype", "length", "root", "algorithm", "op")
_NAMES: dict[int, str] = {}


_CODES: dict[str, int] = {}


def code(text: str) -> int:
    """A stable integer for a name (collective, dtype, algorithm, op)."""
    value = _CODES.get(text)
    if value is None:
        value = _CODES[text] = zlib.crc32(text.encode())
        _NAMES[value] = text
    return value


# Names a peer's fingerprint may carry: registered up front, so a rank can read a
# code it never produced itself (another rank's collective, dtype or algorithm).
for _text in ("allreduce", "reduce_scatter", "all_gather", "broadcast", "barrier", "ps_push", "ps_pull", "ps_allreduce",
              "ring", "recursive", "native", "auto", "ps", "", "sum", "mean", "max", "min"):
    code(_text)
for _t in "bBhHiIlLqQefdgFD?":
    code(np.dtype(_t).str)


def describe(fp) -> str:
    parts = []
    for field, value in zip(FIELDS, (int(v) for v in fp)):
        if field in ("collective", "dtype", "algorithm", "op"):
            value = _NAMES.get(value, value)
        parts.append(f"{field}={value}")
    return "(" + ", ".join(parts) + ")"


def fingerprint(seq, name, dtype, length, root=-1, algorithm="", op="") -> np.ndarray:
    return np.array([seq, code(name), code(np.dtype(dtype).str), length, root,
                     code(str(algorithm)), code(str(op))], dtype=np.int64)


__all__ = ["FIELDS", "code", "describe", "fingerprint"]
