"""A global batch that changes at a step (``failure.batch = "scale"``): the sampler of
the steps from then on, and the schedule a checkpoint records to rebuild it.

The rule. A change at 0-based step ``at`` to a global batch ``G'``: the steps before
``at`` keep their samples; step ``at`` starts where it would have started (the first
sample of the step in flight when a rank was lost: it was not committed), and the
samples of that epoch not yet taken are cut into consecutive batches of ``G'``. The
epoch ends where its order ends: with ``train.last_batch = "drop"`` a rest shorter than
``G'`` is skipped, with ``"keep"`` it is the epoch's short last batch. The epochs after
it are cut into batches of ``G'`` from their start. So within an epoch no sample is
taken twice, and none is skipped except that last rest (as for any global batch).
Token streams (windows drawn by step and position, hpcdp.data.sampler.WindowSampler)
draw the first ``G'`` windows of each step; their nominal epoch is counted the same way.

With ``train.epochs`` the run's step count follows from the changed batches
(:meth:`steps_for_epochs`): the epochs are still all trained. Changes chain (one per
repair); :func:`schedule` lists them as ``[[0, G0], [at1, G1], ...]``, and
:func:`from_schedule` rebuilds the sampler from a base one (a checkpoint's
``batch_schedule``).
"""

from __future__ import annotations

import json

import numpy as np

from hpcdp.shard import shard_range


class RescaledSampler:
    """``before``'s batches up to 0-based step ``at``, batches of ``global_batch`` from there."""

    def __init__(self, before, at: int, global_batch: int):
        if global_batch < 1:
            raise ValueError(f"global batch must be >= 1, got {global_batch}")
        self.before, self.at, self.global_batch = before, int(at), int(global_batch)
        self.fresh = before.with_batch(global_batch)  # the epochs after the change
        self.n, self.seed, self.last_batch = before.n, before.seed, before.last_batch
        self.batches_per_epoch = self.fresh.batches_per_epoch
        self.epoch0, self.offset0 = before.start(self.at)
        rest = before.epoch_samples - self.offset0
        full, short = divmod(rest, self.global_batch)
        self.rest_batches = full + (1 if short and self.last_batch == "keep" else 0)  # of epoch0, from at

    @property
    def epoch_samples(self) -> int:
        return self.fresh.epoch_samples

    def start(self, step: int) -> tuple[int, int]:
        if step < self.at:
            return self.before.start(step)
        i = step - self.at
        if i < self.rest_batches:
            return self.epoch0, self.offset0 + i * self.global_batch
        e, b = divmod(i - self.rest_batches, self.fresh.batches_per_epoch)
        return self.epoch0 + 1 + e, b * self.global_batch

    def position(self, step: int) -> tuple[int, int]:
        """(epoch, batch within the epoch) of 0-based ``step``; after the change the
        batches of the change's epoch are counted from its first (as if all had been of
        the new size: the checkpoint's ``next_batch`` is informative, ``batch_schedule``
        is what a resume uses)."""
        if step < self.at:
            return self.before.position(step)
        epoch, offset = self.start(step)
        return epoch, -(-offset // self.global_batch)

    def global_indices(self, step: int) -> np.ndarray:
        if step < self.at:
            return self.before.global_indices(step)
        epoch, offset = self.start(step)
        return self.fresh.batch_at(step, epoch, offset, self.global_batch)

    def local_indices(self, step: int, dp_size: int = 1, dp_rank: int = 0) -> tuple[np.ndarray, int]:
        g = self.global_indices(step)
        off, size = shard_range(len(g), dp_size, dp_rank)
        return g[off:off + size], len(g)

    def batch_at(self, step: int, epoch: int, offset: int, size: int) -> np.ndarray:
        return self.fresh.batch_at(step, epoch, offset, size)

    def with_batch(self, global_batch: int):
        return self.fresh.with_batch(global_batch)

    def steps_for_epochs(self, epochs: int) -> int:
        if epochs <= self.epoch0:
            return self.before.steps_for_epochs(epochs)
        return self.at + self.rest_batches + (epochs - self.epoch0 - 1) * self.fresh.batches_per_epoch


def rescaled(sampler, at: int, global_batch: int):
    """``sampler`` with its global batch changed at 0-based step ``at`` (itself if unchanged)."""
    if int(global_batch) == sampler.global_batch:
        return sampler
    return RescaledSampler(sampler, at, global_batch)


def schedule(sampler) -> list[list[int]]:
    """``[[0, G0], [at, G], ...]``: the global batch from each step on."""
    out = []
    while isinstance(sampler, RescaledSampler):
        out.append([sampler.at, sampler.global_batch])
        sampler = sampler.before
    return [[0, sampler.global_batch]] + out[::-1]


def schedule_text(sampler) -> str:
    return json.dumps(schedule(sampler))


def parse_schedule(text) -> list[list[int]]:
    """A checkpoint's ``batch_schedule`` (JSON ``[[0, G0], [at, G], ...]``), checked."""
    rows = json.loads(text)
    ok = (isinstance(rows, list) and rows and all(isinstance(r, list) and len(r) == 2 and
                                                  all(isinstance(v, int) and v >= 0 for v in r) for r in rows)
          and rows[0][0] == 0 and all(a[0] < b[0] for a, b in zip(rows, rows[1:])) and all(r[1] >= 1 for r in rows))
    if not ok:
        raise ValueError(f"batch_schedule {text!r} is not [[0, batch], [step, batch], ...] with steps rising")
    return rows


def from_schedule(base, rows) -> object:
    """``base`` (a sampler of any global batch) cut as ``rows`` say."""
    sampler = base.with_batch(rows[0][1]) if rows[0][1] != base.global_batch else base
    for at, g in rows[1:]:
        sampler = rescaled(sampler, at, g)
    return sampler


__all__ = ["RescaledSampler", "rescaled", "schedule", "schedule_text", "parse_schedule", "from_schedule"]
