"""One fragment's outer exchange between the replica groups: a request.

This rank holds chunk ``l`` of the fragment's outer gradient (``delta = theta_outer -
theta_replica``, float32, its own copy); the exchange leaves the MEAN over the ``M``
groups in that buffer. It runs on ``cross_comm`` (one rank per group) through comm's
public non-blocking allreduce and never blocks on its own: :meth:`test` advances it
(the strategy calls it from every moment of the step, and the compiled engine's
progress thread moves float32 rings by itself), :meth:`wait` finishes it.

- float32 / bfloat16: one ring allreduce (sum; bfloat16: comm's 16-bit wire), then
  ``/ M``. Ledger: ``outer.inter``.
- int8 (hpcdp.strategies.diloco.wire): phase 1, a ring allreduce (max) of the
  blocks' absolute maxima (``outer_scale.inter``); phase 2, the shared-scale integers
  summed by a ring allreduce of int8 (``outer.inter``); decoded with ``1/M``.

Bytes per rank of a chunk of ``c`` values (ring, ``M`` groups):
``2 (M - 1) / M x c x b`` with ``b`` = 4, 2 or 1 byte(s), plus for int8
``2 (M - 1) / M x 4 ceil(c / B)`` for the scales (exactly :func:`outer_bytes`; the ring
sends ``shard_range`` chunks, so for ``c`` not divisible by ``M`` the figure is the
ring's exact one from hpcdp.comm.model.volume).
"""

from __future__ import annotations

import time

import numpy as np

from . import wire as W
from .groups import kind_ledger


class OuterExchange:
    def __init__(self, delta: np.ndarray, *, comm, groups: int, outer_dtype: str, block: int,
                 ledger, timeout):
        from hpcdp import comm as hcomm

        self.delta, self.comm, self.M = delta, comm, int(groups)
        self.dtype, self.block, self.timeout = outer_dtype, int(block), timeout
        self._hcomm = hcomm
        self._led_data = kind_ledger(ledger, "inter", "outer")
        self._led_scale = kind_ledger(ledger, "inter", "outer_scale")
        self.started = time.perf_counter()
        self.finished = False
        self.phase = 0
        if outer_dtype == "int8":
            self.k = W.levels(self.M)
            self.absmax = W.block_absmax(delta, self.block)
            self.req = hcomm.iallreduce(self.absmax, comm=comm, op="max", algorithm="ring",
                                        ledger=self._led_scale, timeout=timeout)
        else:
            wire = None if outer_dtype == "float32" else outer_dtype
            self.req = hcomm.iallreduce(delta, comm=comm, op="sum", algorithm="ring",
                                        ledger=self._led_data, timeout=timeout, wire=wire)

    @property
    def progresses_alone(self) -> bool:
        return bool(getattr(self.req, "progresses_alone", False))

    def test(self) -> bool:
        """Advance without blocking; True once the mean is in ``delta``."""
        if self.finished:
            return True
        if not self.req.test():
            return False
        self._next()
        return self.finished

    def _next(self) -> None:
        if self.dtype == "int8" and self.phase == 0:
            self.phase = 1
            self.step = W.steps(self.absmax, self.k)
            self.q = W.quantize(self.delta, self.step, self.block, self.k)
            self.req = self._hcomm.iallreduce(self.q, comm=self.comm, op="sum", algorithm="ring",
                                              ledger=self._led_data, timeout=self.timeout)
            return
        if self.dtype == "int8":
            W.dequantize(self.q, self.step, self.block, out=self.delta, scale=1.0 / self.M)
        elif self.M > 1:
            self.delta *= self.delta.dtype.type(1.0 / self.M)  # in the run's dtype (1/3 is not a float32)
        self.finished = True
        self.done_at = time.perf_counter()

    def wait(self) -> np.ndarray:
        """Block until done (each phase's wait raises comm's CollectiveTimeout naming
        the groups' ranks that never arrived)."""
        while not self.finished:
            self.req.wait()
            self._next()
        return self.delta

    def expire(self):
        self.req.expire()


def outer_bytes(chunk: int, groups: int, index: int, outer_dtype: str, block: int = 256) -> dict:
    """``{"outer": (sent, recv), "outer_scale": (sent, recv)}``: this rank's bytes (number
    ``index`` of ``groups`` on the cross communicator) for one exchange of a chunk of
    ``chunk`` values (the ring's exact figures, hpcdp.comm.model.volume.ring_bytes)."""
    from hpcdp.comm.model.volume import ring_bytes

    if outer_dtype == "int8":
        data = ring_bytes(chunk, groups, index, 1, ("rs", "ag"))
        scale = ring_bytes(W.n_blocks(chunk, block), groups, index, 4, ("rs", "ag"))
        return {"outer": data, "outer_scale": scale}
    return {"outer": ring_bytes(chunk, groups, index, int(W.WIRE_BYTES[outer_dtype]), ("rs", "ag")),
            "outer_scale": (0, 0)}


__all__ = ["OuterExchange", "outer_bytes"]
