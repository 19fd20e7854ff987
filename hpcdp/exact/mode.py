"""The exact step: fixed micro-batches, their gradients kept, one agreed scale, an
integer sum, one decode.

Per step, on every worker (``ExactMode.train_step``, called by
:func:`hpcdp.step.train_step` when ``train.reproducible = "exact"``)::

    for each pass (this rank's micro-batches, then fillers: batches.py)
        forward + backward of the micro-batch alone (weight m_j / G)
        keep its gradient (a copy), fold its per-tensor max |g| into a local max
    MAX-allreduce the per-tensor maxima over the workers    (n_tensors float64: exact)
    exponents from the global max (fixed.py); acc = sum_j rint(g_j * 2**e)   (int64)
    the strategy's reducer sums acc over the workers, decodes, runs the optimizer

Why keep the gradients: the scale must be known before converting, and it depends
on every micro-batch of the global batch. Keeping them costs memory, k x Psi
x itemsize for k micro-batches on this rank (plus Psi x 8 for the int64 sum);
nothing has to be recomputed, nothing depends on earlier steps, so a run resumed
from a checkpoint needs no extra state. The price in time: the gradient's
communication cannot start during backward (the scale is not known yet), so it is
exposed: measured in docs/results.md.

Strategy hooks stay disarmed during exact backwards (``begin_backward(last_micro=
False)``), so no float collective ever starts; ``finish_gradients`` is not called.
"""

from __future__ import annotations

import math
import time

import numpy as np

from hpcdp.step import LocalBatch, StepResult, micro_pass

from .batches import plan_micro_batches
from .fixed import Codec, exponents
from .reducers import build_reducer


class ExactMode:
    def __init__(self, cfg_train, strategy, world, flat):
        from hpcdp import comm as hcomm

        self.micro = int(cfg_train.exact_micro_batch)
        self.strategy, self.world, self.flat = strategy, world, flat
        self.ledger = getattr(world, "ledger", None)
        self._hcomm = hcomm
        self.codec = Codec(flat.layout)
        self.acc = np.zeros(flat.numel, dtype=np.int64)
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
        self.reducer = build_reducer(strategy, self.codec, self.acc, self.worker_comm)
        self._stats: dict = {}

    @classmethod
    def setup(cls, cfg, strategy, world, flat):
        """The run's exact mode (after ``strategy.setup``, on every rank), or None in
        fast mode."""
        if cfg.train.reproducible != "exact":
            return None
        return cls(cfg.train, strategy, world, flat)

    def describe(self) -> str:
        return (f"reproducible = exact: micro-batches of {self.micro} samples, gradients summed in "
                f"int64 fixed point (per-tensor scale); weights are bit-identical for any rank count")

    # -- the batch ---------------------------------------------------------------
    def local_batch(self, sampler, step0: int) -> LocalBatch:
        """This rank's whole micro-batches of 0-based step ``step0`` (batches.py)."""
        g = sampler.global_indices(step0)
        micro, _ = plan_micro_batches(g, self.micro, self.strategy.dp_size, self.strategy.dp_rank)
        return LocalBatch(micro, len(g), filler=g[:1], step=step0)

    # -- the step -------------------------------------------------------------------
    def _keep(self, i: int, grad_host: np.ndarray) -> np.ndarray:
        while len(self._kept) <= i:
            self._kept.append(np.empty_like(grad_host))
        np.copyto(self._kept[i], grad_host)
        return self._kept[i]

    def train_step(self, model, strategy, batch: LocalBatch, fetch, *, after_backward=None,
                   checks=None) -> StepResult:
        flat, codec = self.flat, self.codec
        total = math.ceil(batch.global_samples / self.micro)
        gmax = np.zeros(codec.n_tensors, dtype=np.float64)
        kept, loss_part = [], 0.0
        t0 = time.perf_counter()
        for m, idx in enumerate(batch.micro):
            strategy.zero_grad()                        # each micro-batch's gradient alone
            strategy.begin_backward(last_micro=False)   # hooks disarmed: no float collective
            loss_part += micro_pass(model, batch, idx, fetch)
            if after_backward is not None:
                after_backward(m)
            if len(idx) == 0:
                continue                                # a filler pass: not part of the sum
            g = flat.grad if isinstance(flat.grad, np.ndarray) else flat.backend.to_numpy(flat.grad)
            codec.absmax_into(g, gmax)
            last = m == len(batch.micro) - 1            # nothing zeroes flat.grad after it
            kept.append(g if last and g is flat.grad else self._keep(len(kept), g))
        if checks is not None:  # the non-finite loss check, the fault hook (hpcdp.failure)
            checks.after_backward(loss_part, flat)
        t1 = time.perf_counter()
        if self.worker_comm.Get_size() > 1:             # a sync point (n_tensors x 8 bytes)
            self._hcomm.allreduce(gmax, comm=self.worker_comm, op="max", ledger=self.ledger)
        codec.set_exponents(exponents(gmax, total))
        self.acc.fill(0)
        for g in kept:
            codec.encode_add(g, self.acc)
        t2 = time.perf_counter()
        self.reducer.reduce_and_step(self.acc)
        t3 = time.perf_counter()
        self._stats = {"exact_backward_s": t1 - t0, "exact_scale_s": t2 - t1,
                       "exact_reduce_step_s": t3 - t2, "exact_micro_batches": float(len(kept))}
        return StepResult(loss=loss_part, samples=batch.samples)

    def step_stats(self) -> dict:
        """This step's figures (merged over the strategy's in metrics.jsonl)."""
        out = {**self._stats, **self.reducer.stats()}
        self._stats = {}
        return out

    def close(self) -> None:
        if self._own_comm and self.worker_comm is not None:
            self.worker_comm.Free()
            self.worker_comm = None
            self._own_comm = False


__all__ = ["ExactMode"]
