"""The 16-bit wire: float32 buffers that travel as float16 or bfloat16.

``wire="float16"`` or ``wire="bfloat16"`` on a ring collective (hpcdp.comm.collectives,
``comm_dtype`` in ``[parallel.ddp]`` / ``[parallel.zero]``) halves the bytes on the
wire while every buffer the caller sees stays float32. Conversion happens per
segment in the ring (hpcdp.comm.ring.RingRequest), and rounding to 16 bits happens in
exactly these places:

1. reduce-scatter, step 0: a rank's own float32 contribution is narrowed when it is
   sent;
2. reduce-scatter, every later step: the received 16-bit partial sum is widened
   (exactly) to float32 and added to the rank's own float32 contribution in float32;
   that float32 sum is narrowed when it is forwarded. So a chunk's sum is rounded to
   16 bits N-1 times (once per hop), never accumulated in 16 bits;
3. the owner's last addition stays float32: a reduce-scatter returns the float32
   sum (one rounding per hop before it, none after);
4. all-gather (and the all-gather phase of allreduce): the owner narrows its chunk
   once and also replaces its own copy by the rounded value, so every rank ends with
   the same bits (DDP's replicas stay identical; ZeRO-3's gathered parameters are the
   same 16-bit values on every rank, like FSDP's ``param_dtype``). Receivers widen
   exactly.

A mean (``op="mean"``) divides the float32 sum before step 4. Master weights and
optimizer state never pass through here: they stay float32 on their owner.

Formats: float16 is IEEE binary16 (NumPy's float16; the same bits as NumPy's cast:
round to nearest even, overflow to inf, subnormals kept), bfloat16 travels as raw
uint16 words (the top half of a float32: round to nearest even, NaN kept quiet,
overflow to inf; widening is a 16-bit shift). Both are converted by compiled functions
(hpcdp.comm.engines.wire_kernels, imported on first use). No new dependency (ml_dtypes would
give a bfloat16 dtype, but only its cast is needed): numba is hpcdp's compiler
already, it converts in one pass without the temporaries a uint32 formula in NumPy
allocates per segment, and NumPy's own float16 cast runs in software here, 2.5x slower
than the kernel.

Only the ring accumulates in float32 between hops; MPI's own collectives ("native")
would sum 16-bit values in 16 bits, and the recursive / hierarchical allreduces are
not built for it yet: the chooser (hpcdp.comm.select.wire_algorithm) maps "auto" to
the ring and refuses the others with one line.
"""

from __future__ import annotations

import numpy as np

WIRE_DTYPES = ("float32", "float16", "bfloat16")
"""The names ``comm_dtype`` takes ("float32": no conversion, today's bytes)."""
class Wire:
    """One 16-bit wire format: ``dtype`` is what the ring's messages hold."""

    itemsize = 2

    def __init__(self, name: str):
        self.name = name
        self.dtype = np.dtype(np.float16 if name == "float16" else np.uint16)

    def narrow(self, x: np.ndarray, out: np.ndarray) -> None:
        """``out`` (wire words) = ``x`` (float32) rounded to nearest even."""
        self._kernels()[0](x.view(np.uint32), out.view(np.uint16))

    def widen(self, w: np.ndarray, out: np.ndarray) -> None:
        """``out`` (float32) = the wire words ``w``, exactly."""
        self._kernels()[1](w.view(np.uint16), out.view(np.uint32))

    def _kernels(self):
        k = self.__dict__.get("kernels")
        if k is None:  # numba is imported on the first 16-bit call, not with hpcdp.comm
            from hpcdp.comm.engines import wire_kernels as K
            k = self.kernels = ((K.f16_narrow, K.f16_widen) if self.name == "float16"
                                else (K.bf16_narrow, K.bf16_widen))
        return k

    def round_trip(self, x: np.ndarray, scratch: np.ndarray) -> None:
        """``x`` (float32) replaced by its 16-bit value; ``scratch``: wire words, ``len(x)``."""
        self.narrow(x, scratch)
        self.widen(scratch, x)

    def __repr__(self) -> str:
        return f"Wire({self.name!r})"


_WIRES = {name: Wire(name) for name in WIRE_DTYPES[1:]}


def wire_format(wire, dtype, what: str = "collective") -> Wire | None:
    """The :class:`Wire` for ``wire`` ("float16" / "bfloat16"), or None (no conversion:
    None or "float32"). A 16-bit wire carries float32 buffers only."""
    if wire is None or wire == "float32":
        return None
    w = _WIRES.get(wire)
    if w is None:
        raise ValueError(f"{what}: wire must be one of {WIRE_DTYPES}, got {wire!r}")
    if np.dtype(dtype) != np.float32:
        raise TypeError(f"{what}: a {wire} wire carries float32 buffers (float32 sums, 16-bit "
                        f"messages); got dtype {np.dtype(dtype)}: use wire='float32' or float32 buffers")
    return w


__all__ = ["Wire", "wire_format", "WIRE_DTYPES"]
