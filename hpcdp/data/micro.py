"""Micro-batches of one step: which samples each micro-batch of this rank holds, and
:class:`LocalBatch`, the record of them that :func:`hpcdp.step.train_step` runs.

Two ways to cut, one place (:func:`rank_micro_batches`):

- fast mode (``train.grad_accum = k``): this rank's slice of the global batch (the
  shard rule) is cut into ``k`` contiguous micro-batches (:func:`micro_batches`);
- exact mode (``train.reproducible = "exact"``): the fixed micro-batch plan below.

The fixed plan. The global batch (the sampler's order, independent of N) is cut
into micro-batches of ``train.exact_micro_batch`` samples by position: micro-batch
j holds positions ``[j*m, (j+1)*m)``, whatever N is. A rank takes whole
micro-batches, a contiguous run of them by the one shard rule: rank r gets
micro-batches ``shard_range(M, N, r)``. Rule when N does not divide M: the first
``M % N`` ranks take one micro-batch more; when M < N some ranks hold none. Either
way the result is the same bits (integer sums do not care who held what); only the
time differs.

Every rank runs the same number of passes, ``ceil(M / N)``: a rank with fewer real
micro-batches runs filler passes first (an empty micro-batch, which train_step runs
on one sample with weight 0: its gradient is zero), so its last pass is a real one.
A strategy that communicates inside forward or backward (ZeRO-3 gathers) then meets
every rank; the fillers cost nothing on the critical path, since the fuller ranks
run as many real passes.

A short last batch (``train.last_batch = "keep"``) is cut the same way; its last
micro-batch is shorter, the same on any N.

The default size (:func:`hpcdp.config.choose_micro_batch`): when ``train.exact_micro_batch`` is
0, the config picks one from the global batch alone (so every rank count and a
restart on another one use the same micro-batches); ``hpcdp check-exact`` passes
the rank counts it will run so that each of them holds at least one micro-batch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from hpcdp.shard import shard_range

from .sampler import micro_batches


@dataclass
class LocalBatch:
    """This rank's part of one global batch.

    ``micro``: index arrays (into the dataset), one per micro-batch, in order; any
    may be empty. ``global_samples``: samples in the global batch (all ranks).
    ``filler``: indices of one sample that an empty micro-batch runs with weight 0.
    ``weights``: each micro-batch's share of the global mean loss, when it is not
    ``len(idx) / global_samples`` (padded sequences: counted tokens over the global
    batch's, hpcdp.nn.padding).
    ``step``: the 0-based optimizer step; with the dataset indices it keys every
    random draw (dropout) of the step (hpcdp/nn/streams.py).
    """

    micro: Sequence[np.ndarray]
    global_samples: int
    filler: np.ndarray
    weights: Sequence[float] | None = None
    step: int = 0

    @property
    def samples(self) -> int:
        return int(sum(len(idx) for idx in self.micro))


def plan_micro_batches(global_idx: np.ndarray, micro: int, dp_size: int, dp_rank: int):
    """``(micro-batches of this rank, after empty fillers up to the common pass
    count; M = micro-batches in the global batch)``."""
    if micro < 1:
        raise ValueError(f"train.exact_micro_batch: must be >= 1, got {micro}")
    n = len(global_idx)
    total = math.ceil(n / micro)
    off, count = shard_range(total, dp_size, dp_rank)
    passes = shard_range(total, dp_size, 0)[1]  # rank 0 holds the most
    mine = [global_idx[j * micro:(j + 1) * micro] for j in range(off, off + count)]
    fillers = [global_idx[:0]] * (passes - count)
    return fillers + mine, total


def rank_micro_batches(sampler, step: int, dp_size: int, dp_rank: int, *, accum: int = 1,
                       exact_micro: int = 0) -> tuple[list[np.ndarray], int]:
    """``(this rank's micro-batches of 0-based step, samples in the global batch)``:
    the fixed plan when ``exact_micro`` > 0, else ``accum`` cuts of the rank's slice."""
    if exact_micro:
        g = sampler.global_indices(step)
        parts, _ = plan_micro_batches(g, exact_micro, dp_size, dp_rank)
        return parts, len(g)
    local, global_n = sampler.local_indices(step, dp_size, dp_rank)
    return micro_batches(local, accum), global_n


__all__ = ["LocalBatch", "plan_micro_batches", "rank_micro_batches"]
