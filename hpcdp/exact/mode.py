"""The exact step: fixed micro-batches, one agreed scale, an integer sum, one decode.

The scale depends on the max |g| over every micro-batch of the global batch
(fixed.py), which no rank knows before its backward passes are done. Two
ways to get it, with the SAME result bit for bit (the scale is always the one of
this step's agreed max, never one left from earlier steps, so a resumed run needs
no extra state):

- **guessed** (none, ddp, zero; every step after the first): use the previous step's
  scale band. It changes only when the gradient's largest element crosses a 2**8
  band edge, so it is usually right. Each micro-batch is encoded as soon as its
  backward ends, the last one bucket by bucket from the grad-ready hooks, and each
  bucket's int64 allreduce starts right away, overlapped with the rest of backward
  (as fast mode's float allreduce). Two counters ride along in the last bucket's
  payload: how many ranks saw a tensor above the guessed band, and how many saw
  one inside it. The guess was right iff no rank was above and some rank was
  inside: every rank sees the same sums and takes the same decision. One
  collective per bucket, no extra sync point; memory: the int64 payloads (Psi x 8
  bytes). ZeRO 2-3 reduce each micro-batch from their own hooks (zero.py) and
  agree on the counters in a two-element allreduce after the last one.
- **agreed** (the first step, ps always, and a step whose guess was wrong): run
  the passes keeping each micro-batch's gradient (k x Psi x itemsize for the k
  micro-batches on this rank), MAX-allreduce the per-tensor maxima (n_tensors
  float64: exact in any order), encode, sum, decode. ZeRO 2-3 keep nothing: a
  first set of passes measures the maxima, a second one sums. When it follows a
  wrong guess, the passes are run again: recomputation is deterministic (same
  weights, data and dropout keys), so this costs time, never bits.

With full gradients (none, ddp, zero 1, ps) the strategy's own hooks stay disarmed
during exact backwards (``begin_backward(last_micro=False)``), so no float
collective ever starts, and ``finish_gradients`` is not called.
Every rank runs the same number of passes: fillers (empty micro-batches, run on
one sample with weight 0) come first, so the last pass is a real micro-batch.
"""

from __future__ import annotations

import math
import time

import numpy as np

from hpcdp.data.micro import rank_micro_batches
from hpcdp.step import LocalBatch, StepResult, micro_pass

from .fixed import Codec, band, exponents_of, quantized_exponent
from .reducers import build_reducer


class ExactMode:
    def __init__(self, cfg_train, strategy, world, flat):
        from hpcdp import comm as hcomm

        self.micro = int(cfg_train.exact_micro_batch)
        self.chosen = bool(getattr(cfg_train, "exact_micro_chosen", False))
        self.strategy, self.world, self.flat = strategy, world, flat
        self.ledger = getattr(world, "ledger", None)
        self._hcomm = hcomm
        self.codec = Codec(flat.layout)
        self._kept: list = []          # reused host buffers, one per kept micro-batch
        # The workers' communicator: the MAX of the maxima runs among them only (a
        # dedicated parameter server never runs a step). Collective over the world.
        self.worker_comm = world.comm
        self._own_comm = False
        if world.size > 1:
            from mpi4py import MPI
            sub = world.comm.Split(0 if strategy.is_worker else MPI.UNDEFINED, world.rank)
            self.worker_comm = sub if strategy.is_worker else None  # a server gets COMM_NULL
            self._own_comm = strategy.is_worker
        self.reducer = build_reducer(strategy, self.codec, self.worker_comm)
        self.acc = None if self.reducer.streaming else np.zeros(flat.numel, dtype=np.int64)
        self.guess = None              # the scale band of the last agreed max
        self.guesses = self.misses = 0
        self._stats: dict = {}

    def describe(self) -> str:
        how = (" (train.exact_micro_batch unset: chosen from the global batch; set it to choose)"
               if self.chosen else "")
        return (f"reproducible = exact: micro-batches of {self.micro} samples{how}, gradients summed in "
                f"int64 fixed point at one agreed scale; weights are bit-identical for any rank count")

    # -- the batch ---------------------------------------------------------------
    def local_batch(self, sampler, step0: int) -> LocalBatch:
        """This rank's whole micro-batches of 0-based step ``step0`` (hpcdp.data.micro)."""
        s = self.strategy
        micro, n = rank_micro_batches(sampler, step0, s.dp_size, s.dp_rank, exact_micro=self.micro)
        return LocalBatch(micro, n, filler=sampler.global_indices(step0)[:1], step=step0)

    # -- the step -------------------------------------------------------------------
    def train_step(self, model, strategy, batch: LocalBatch, fetch, *, after_backward=None,
                   checks=None) -> StepResult:
        total = math.ceil(batch.global_samples / self.micro)
        t0 = time.perf_counter()
        result = None
        if self.reducer.shards:  # ZeRO 2-3: no full gradient (zero.py)
            result = self._shard_step(model, strategy, batch, fetch, total, after_backward, checks)
        elif self.guess is not None and self.reducer.streaming:
            self.guesses += 1
            result = self._guessed(model, strategy, batch, fetch, total, after_backward, checks)
            self.misses += result is None
        if result is None:
            result = self._agreed(model, strategy, batch, fetch, total, after_backward, checks)
        self._stats.update(exact_step_s=time.perf_counter() - t0,
                           exact_guess_misses=float(self.misses), exact_guesses=float(self.guesses))
        return result

    def _passes(self, model, strategy, batch, fetch, after_backward, after_pass, before_last=None,
                checks=None):
        """Every pass of this rank (fillers first); ``after_pass(g)`` gets each real
        micro-batch's gradient as a host array; ``before_last()`` runs before the
        last real one's backward. Returns this rank's loss share."""
        flat, loss = self.flat, 0.0
        last = len(batch.micro) - 1
        for m, idx in enumerate(batch.micro):
            strategy.zero_grad()                        # each micro-batch's gradient alone
            strategy.begin_backward(last_micro=False)   # hooks disarmed: no float collective
            if m == last and len(idx) and before_last is not None:
                before_last()
            loss += micro_pass(model, batch, m, fetch, checks)
            if after_backward is not None:
                after_backward(m)
            if len(idx):
                g = flat.grad if isinstance(flat.grad, np.ndarray) else flat.backend.to_numpy(flat.grad)
                after_pass(g, m == last)
        return loss

    def _guessed(self, model, strategy, batch, fetch, total, after_backward, checks):
        codec, red = self.codec, self.reducer
        codec.set_exponents(exponents_of(np.zeros(codec.n_tensors, dtype=np.int64), total, at=self.guess))
        local_max = np.zeros(codec.n_tensors)
        red.begin(self.guess, local_max)
        hooked = red.hooks_ok

        def after_pass(g, is_last):
            if is_last and hooked:
                return                        # the hooks sealed every bucket of this one
            codec.absmax_into(g, local_max)
            red.encode_whole(g)

        loss = self._passes(model, strategy, batch, fetch, after_backward, after_pass,
                            before_last=red.arm if hooked else None, checks=checks)
        if not red.flush():                   # a wrong guess: every rank saw the same sums
            return None
        if checks is not None:  # the non-finite loss check, the fault hook (hpcdp.failure)
            checks.after_backward(loss, self.flat)
        strategy.step()
        return StepResult(loss=loss, samples=batch.samples)

    def _keep(self, i: int, g: np.ndarray) -> np.ndarray:
        while len(self._kept) <= i:
            self._kept.append(np.empty_like(g))
        np.copyto(self._kept[i], g)
        return self._kept[i]

    def _agreed(self, model, strategy, batch, fetch, total, after_backward, checks):
        codec, red, flat = self.codec, self.reducer, self.flat
        local_max = np.zeros(codec.n_tensors)
        kept = []

        def after_pass(g, is_last):
            codec.absmax_into(g, local_max)
            kept.append(g if is_last and g is flat.grad else self._keep(len(kept), g))

        loss = self._passes(model, strategy, batch, fetch, after_backward, after_pass, checks=checks)
        if checks is not None:
            checks.after_backward(loss, flat)
        eq = quantized_exponent(self._agree_max(local_max))
        self.guess = band(eq)                 # the next step's guess
        codec.set_exponents(exponents_of(eq, total))
        if red.streaming:
            red.begin(self.guess, local_max)
            for g in kept:
                red.encode_whole(g)
            red.flush(check=False)
            strategy.step()
        else:
            self.acc.fill(0)
            for g in kept:
                codec.encode_add(g, self.acc)
            red.reduce_and_step(self.acc)
        return StepResult(loss=loss, samples=batch.samples)

    # -- ZeRO stages 2 and 3: the stage's own hooks reduce each micro-batch (zero.py) ----
    def _shard_passes(self, model, strategy, batch, fetch, after_backward, checks, local_max,
                      maxima_only):
        red, loss, last = self.reducer, 0.0, len(batch.micro) - 1
        strategy.zero_grad()
        red.begin(local_max, maxima_only)
        for m, idx in enumerate(batch.micro):
            red.pass_kind(real=len(idx) > 0)
            strategy.begin_backward(last_micro=(m == last))
            loss += micro_pass(model, batch, m, fetch, checks)
            if after_backward is not None:
                after_backward(m)
        strategy.finish_gradients()
        return loss

    def _agree_max(self, local_max):
        global_max = local_max.copy()
        if self.worker_comm is not None and self.worker_comm.Get_size() > 1:  # a sync point
            self._hcomm.allreduce(global_max, comm=self.worker_comm, op="max", ledger=self.ledger)
        return global_max

    def _shard_step(self, model, strategy, batch, fetch, total, after_backward, checks):
        codec, n = self.codec, self.codec.n_tensors
        args = (model, strategy, batch, fetch, after_backward, checks)
        if self.guess is not None:
            self.guesses += 1
            codec.set_exponents(exponents_of(np.zeros(n, dtype=np.int64), total, at=self.guess))
            local_max = np.zeros(n)
            loss = self._shard_passes(*args, local_max, False)
            eq = quantized_exponent(local_max)
            verdict = np.array([np.any(eq > self.guess), np.any(eq == self.guess)], dtype=np.int64)
            if self.worker_comm is not None and self.worker_comm.Get_size() > 1:
                self._hcomm.allreduce(verdict, comm=self.worker_comm, op="sum", ledger=self.ledger)
            if not verdict[0] and verdict[1]:
                return self._shard_finish(loss, batch, checks)
            self.misses += 1
        local_max = np.zeros(n)               # the agreed path: measure the maxima first
        self._shard_passes(*args, local_max, True)
        eq = quantized_exponent(self._agree_max(local_max))
        self.guess = band(eq)
        codec.set_exponents(exponents_of(eq, total))
        loss = self._shard_passes(*args, np.zeros(n), False)
        return self._shard_finish(loss, batch, checks)

    def _shard_finish(self, loss, batch, checks):
        if checks is not None:
            checks.after_backward(loss, self.flat)
        self.reducer.decode_and_step()
        return StepResult(loss=loss, samples=batch.samples)

    def step_stats(self) -> dict:
        """This step's figures (merged over the strategy's in metrics.jsonl)."""
        out = {**self._stats, **self.reducer.stats()}
        self._stats = {}
        return out

    def close(self) -> None:
        close = getattr(self.reducer, "close", None)
        if close is not None:
            close()
        if self._own_comm and self.worker_comm is not None:
            self.worker_comm.Free()
            self.worker_comm = None
            self._own_comm = False


__all__ = ["ExactMode"]
