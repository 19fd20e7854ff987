"""Exact mode's gradient codec: int64 fixed point at one agreed scale.

It plugs into the strategy seam's one hook (``Strategy.set_grad_codec``, protocol
in hpcdp/strategies/codec.py): every strategy encodes each micro-batch's gradient
with :meth:`IntegerCodec.encode` before a bucket's collective, the collectives
carry int64, and :meth:`IntegerCodec.decode` converts the sum back once
(fixed.py: why integers, the scale, the precision).

The scale depends on the max |g| over every micro-batch of the global batch, which
no rank knows before its backward passes are done. :meth:`finish` runs after each
pass set (the step's micro-batches, run by hpcdp.step.train_step) and decides,
alike on every worker:

- **guessed** (every step after the first): the pass set was encoded at the
  previous step's band. It is right iff no worker saw a tensor above that band and
  some worker saw one inside it (a two-element integer allreduce among the
  workers); then the payloads are decoded. The band changes only when the
  gradient's largest element crosses a 2**8 band edge, so this is the usual case:
  one pass set, one tiny collective more than fast mode.
- **measured** (the first step) or a **wrong guess**: the per-tensor maxima are
  agreed (a MAX allreduce of n_tensors float64, exact in any order), the scale is
  set from them, and finish returns False: train_step runs the step's micro-batches
  again at that scale (recomputation is deterministic: same weights, data and
  dropout keys), and the next finish accepts. This costs time, never bits: the
  scale is always the one of this step's agreed max (an accepted guess equals it),
  so a resumed run needs no extra state.

The clipping norm (``optim.clip_grad_norm`` under ZeRO, where each rank holds a
shard of the gradient): :meth:`sum_squares` puts every element's square on one
fixed-point grid and sums int64 over the shards and ranks, so the norm, and with it
the clipped update, is the same bits for any rank count.

The parameter server's wire: a push carries the per-tensor exponents in front of
the payload shard (:meth:`header`); a server checks that every worker used the
same ones, sums the integers and decodes once (:meth:`aggregate`).
"""

from __future__ import annotations

import math
import time

import numpy as np

from .fixed import Codec, band, exponents_of, quantized_exponent


class IntegerCodec:
    """The exact gradient codec of one model layout (see the module docstring).

    ``micro``: samples per fixed micro-batch (the headroom of a step with M
    micro-batches is ceil(log2 M) bits); ``comm``: the workers' communicator (None
    on one worker, or on a dedicated server); ``ledger``: where its collectives are
    counted."""

    payload_dtype = np.dtype(np.int64)

    def __init__(self, layout, micro: int, comm=None, ledger=None):
        from hpcdp import comm as hcomm

        self._hcomm = hcomm
        self.fixed = Codec(layout)
        self.micro, self.comm, self.ledger = int(micro), comm, ledger
        self.header_size = self.fixed.n_tensors
        self.guess = None              # the scale band of the last agreed max
        self.guesses = self.misses = 0
        self._mode = None              # this pass set: "guess", "measure" or "agreed"
        self._stats: dict = {}

    # -- the step -----------------------------------------------------------------
    def begin_step(self, global_samples: int) -> None:
        self.total = math.ceil(global_samples / self.micro)   # M, micro-batches of the step
        self._t0 = time.perf_counter()
        if self.guess is not None:
            self.guesses += 1
            self._mode = "guess"
            zeros = np.zeros(self.fixed.n_tensors, dtype=np.int64)
            self.fixed.set_exponents(exponents_of(zeros, self.total, at=self.guess))
        else:
            self._mode = "measure"
        self.local_max = np.zeros(self.fixed.n_tensors)

    def encode(self, grad: np.ndarray, payload: np.ndarray, lo: int = 0) -> None:
        """Fold ``grad`` (flat[lo:lo+len]) into this worker's per-tensor max and, at a
        known scale, add its integers into ``payload``."""
        self.fixed.absmax_into(grad, self.local_max, lo=lo)
        if self._mode != "measure":
            self.fixed.encode_add(grad, payload, lo=lo)

    def finish(self) -> bool:
        mode = self._mode
        if mode == "agreed":
            return self._accept()
        if mode == "guess":
            eq = quantized_exponent(self.local_max)  # (a non-finite tensor counts as above)
            verdict = np.array([np.any(eq > self.guess), np.any(eq == self.guess)], dtype=np.int64)
            if self._many():
                self._hcomm.allreduce(verdict, comm=self.comm, op="sum", ledger=self.ledger)
            if not verdict[0] and verdict[1]:
                return self._accept()
            self.misses += 1
        # measured, or a wrong guess: agree on the maxima; the passes run again at that scale
        global_max = self.local_max.copy()
        if self._many():  # a sync point
            self._hcomm.allreduce(global_max, comm=self.comm, op="max", ledger=self.ledger)
        eq = quantized_exponent(global_max)
        self.guess = band(eq)                        # the next step's guess
        self.fixed.set_exponents(exponents_of(eq, self.total))
        self._mode = "agreed"
        self.local_max = np.zeros(self.fixed.n_tensors)
        return False

    def _many(self) -> bool:
        return self.comm is not None and self.comm.Get_size() > 1

    def _accept(self) -> bool:
        self._mode = None
        self._stats.update(exact_step_s=time.perf_counter() - self._t0,
                           exact_guess_misses=float(self.misses), exact_guesses=float(self.guesses))
        return True

    def decode(self, payload: np.ndarray, out: np.ndarray, lo: int = 0) -> None:
        self.fixed.decode(payload, out, lo=lo)

    # -- the parameter server's wire ------------------------------------------------
    def header(self) -> np.ndarray:
        """The per-tensor exponents of this step's payload (one int64 each)."""
        return self.fixed.exps.copy()

    def aggregate(self, pushes, lo: int, dtype) -> np.ndarray:
        """Sum the workers' pushes (exponents, then int64 shard) of the shard at flat
        offset ``lo``; every worker must have used the same exponents."""
        h = self.header_size
        exps = pushes[0][:h]
        for w, p in enumerate(pushes[1:], start=1):
            if not np.array_equal(p[:h], exps):
                raise ValueError(f"workers 0 and {w} pushed gradients at different scales; the "
                                 "per-tensor maxima were not agreed")
        total = np.zeros(len(pushes[0]) - h, dtype=np.int64)
        for p in pushes:
            total += p[h:]  # integers: exact in any order
        self.fixed.set_exponents(exps)
        out = np.empty(total.size, dtype=dtype)
        self.fixed.decode(total, out, lo=lo)
        return out

    # -- the clipping norm ------------------------------------------------------------
    def sum_squares(self, pieces, comm=None, numel: int | None = None) -> float:
        """The squared L2 norm of the decoded gradient, whatever shards ``pieces``
        (this rank's, host arrays) and the other ranks of ``comm`` hold: every square
        on one fixed-point grid (fixed.norm_scale), int64 sums in any order, one
        conversion back. NaN if any element is not finite."""
        from .fixed import norm_scale, square_sum

        s = norm_scale(self.fixed.exps, numel if numel is not None else int(self.fixed.seg_len.sum()))
        acc = np.zeros(2, dtype=np.int64)   # (sum of squares, non-finite elements seen)
        for g in pieces:
            if g.size:
                total, finite = square_sum(np.ascontiguousarray(g), s)
                acc[0] += total
                acc[1] += not finite
        if comm is not None and comm.Get_size() > 1:
            self._hcomm.allreduce(acc, comm=comm, op="sum", ledger=self.ledger)
        return float("nan") if acc[1] else math.ldexp(float(acc[0]), -s)

    def step_stats(self) -> dict:
        out, self._stats = self._stats, {}
        return out

    def nonfinite(self) -> list[str]:
        return self.fixed.nonfinite()


__all__ = ["IntegerCodec"]
