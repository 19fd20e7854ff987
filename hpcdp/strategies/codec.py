"""The gradient codec: the seam's one hook for what the gradient collectives carry.

A strategy reduces gradients in the run's dtype unless a codec is installed with
:meth:`hpcdp.strategies.base.Strategy.set_grad_codec` (after ``setup``, before step
1). A codec says what travels (``payload_dtype``), turns gradients into payload
before a bucket's collective is launched (``encode``) and payload back into
gradients when the collective is done (``decode``); the parameter server sums the
workers' payloads through it (``aggregate``). Exact mode (hpcdp/exact/codec.py,
int64 fixed point) is one; a 16-bit or compressed gradient wire would be another.
This is the role Megatron's gradient-buffer reduction dtype and FSDP2's
``reduce_dtype`` play; here the codec also owns the moment that decides whether a
pass set's payloads are usable (``finish``).

The protocol (duck-typed; :class:`GradCodec` documents it)::

    codec.begin_step(global_samples)   # hpcdp.step.train_step, once per step
    # every pass set (train_step runs the step's micro-batches again while
    # finish_gradients() returns False):
    codec.encode(grad, payload, lo)    # payload += code(grad) for flat[lo:lo+len]
    ok = codec.finish()                # after the pass set: usable? (may run a
                                       # collective of its own among the workers)
    codec.decode(payload, out, lo)     # out = the summed gradient (ok only)
    codec.header_size / header() / aggregate(...)   # the parameter server's wire
    codec.sum_squares(pieces, comm, numel)           # optional: the clipping norm of
                                                     # a sharded gradient (ZeRO)

What a strategy does with one installed (each in its own file):

- a full gradient buffer (none, ddp, zero stage 1, ps workers): each micro-batch's
  gradient is encoded on its own and added into one payload buffer
  (:class:`FullGradPayload`): the earlier micro-batches' whole gradient when the
  next one begins, the last one bucket by bucket from the grad-ready hooks, just
  before the bucket's collective (or whole, after backward, without overlap). The
  collectives carry the payload; after ``finish`` it is decoded into ``flat.grad``
  (zero 1: only this rank's chunk of every group);
- ZeRO stages 2 and 3: each group's buffer is encoded into a payload-typed group
  buffer before its reduce-scatter, and this rank's chunk is added into a payload
  shard; after ``finish`` the shard is decoded into the gradient shard;
- the parameter server: workers push payload shards with the codec's header in
  front; a server sums them with ``codec.aggregate`` instead of its aggregation.

Integer payloads make every sum exact in any order, which is why the micro-batches
are encoded one by one: a float accumulation over a rank's micro-batches would
depend on which micro-batches a rank holds.
"""

from __future__ import annotations

import numpy as np


class GradCodec:
    """The protocol a codec implements (see the module docstring); not a base class
    anyone must inherit, a place where each method's contract is written once."""

    payload_dtype = np.dtype(np.float32)
    header_size = 0   # payload elements in front of each parameter-server push

    def begin_step(self, global_samples: int) -> None:
        """A new step of ``global_samples`` samples begins (before its first pass set)."""

    def encode(self, grad: np.ndarray, payload: np.ndarray, lo: int = 0) -> None:
        """``payload += code(grad)``; ``grad`` is ``flat[lo:lo + len(grad)]`` (host)."""
        raise NotImplementedError

    def finish(self) -> bool:
        """After a pass set's collectives: True if the payloads can be decoded; False
        asks for the step's micro-batches again (every worker decides alike)."""
        return True

    def decode(self, payload: np.ndarray, out: np.ndarray, lo: int = 0) -> None:
        """``out`` = the gradient that ``payload`` (a sum of encodes) stands for."""
        raise NotImplementedError

    def header(self) -> np.ndarray:
        """What a parameter-server push carries in front of its payload shard."""
        return np.empty(0, dtype=self.payload_dtype)

    def aggregate(self, pushes, lo: int, dtype) -> np.ndarray:
        """A server's sum of the workers' pushes (``header + payload`` each, in worker
        order) of the shard starting at flat offset ``lo``, as a ``dtype`` gradient."""
        raise NotImplementedError


class FullGradPayload:
    """The payload of a strategy with a full gradient buffer: one payload-typed array
    of ``flat.numel`` elements into which each micro-batch's gradient is encoded.

    ``begin_micro()`` before each micro-batch's backward (the previous one is folded
    in and ``flat.grad`` zeroed, so every gradient is encoded alone);
    ``fold(off, size)`` encodes a range of the current micro-batch's gradient (a
    bucket, from its launch) or all of it; ``decode_into_grad(ranges)`` writes the
    decoded sum into ``flat.grad`` (a device gradient goes through one host copy).
    """

    def __init__(self, flat, codec):
        self.flat, self.codec = flat, codec
        self.payload = np.zeros(flat.numel, dtype=codec.payload_dtype)
        self.on_host = isinstance(flat.grad, np.ndarray)
        self.grad_host = flat.grad if self.on_host else np.empty(flat.numel, dtype=flat.dtype)
        self.micro = 0

    def view(self, off: int, size: int) -> np.ndarray:
        return self.payload[off:off + size]

    def zero(self) -> None:
        self.payload.fill(0)
        self.micro = 0

    def begin_micro(self) -> None:
        if self.micro:
            self.fold()
            self.flat.zero_grad()
        self.micro += 1

    def _grad(self) -> np.ndarray:
        g = self.flat.grad
        return g if self.on_host else self.flat.backend.to_numpy(g)

    def fold(self, off: int = 0, size: int | None = None) -> None:
        g = self._grad()
        size = self.flat.numel - off if size is None else size
        self.codec.encode(g[off:off + size], self.payload[off:off + size], lo=off)

    def decode_into_grad(self, ranges=None) -> None:
        """Decode ``ranges`` (flat ``(offset, size)`` pieces; default: everything)."""
        for off, size in ranges if ranges is not None else [(0, self.flat.numel)]:
            if size:
                self.codec.decode(self.payload[off:off + size], self.grad_host[off:off + size], lo=off)
        if not self.on_host:
            be = self.flat.backend
            be.copy_(self.flat.grad, be.asarray(self.grad_host, self.flat.dtype))


__all__ = ["GradCodec", "FullGradPayload"]
