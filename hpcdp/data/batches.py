"""This rank's samples of every step, read ahead: what the training loop asks the data for.

``BatchSource.get(step)`` returns a :class:`Batch`: ``local``, the
:class:`~hpcdp.step.LocalBatch` that :func:`hpcdp.step.train_step` runs (index arrays
of the ``train.grad_accum`` micro-batches of this rank's slice of the global batch,
and the one-sample filler an empty micro-batch uses), and ``fetch(indices) ->
(x, y)``, which serves those samples from arrays already read. The sampler decides
the samples (:mod:`.sampler`), the shard rule cuts the slice
(:func:`~hpcdp.data.sampler.micro_batches`); the whole slice and the filler are read
at once (one sorted, coalesced read for on-disk data).

On-disk data is prefetched (``data.prefetch``, :mod:`.prefetch`): the next step's
samples are read while this step computes. ``Batch.wait_s`` is how long ``get``
waited for data: the whole read without prefetch, the part not hidden with it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from .micro import LocalBatch, rank_micro_batches
from .prefetch import Prefetcher
from .sampler import make_sampler


@dataclass
class Batch:
    local: LocalBatch  # what train_step runs: micro-batch indices, global count, filler
    indices: np.ndarray  # the samples read: every micro-batch's, then the filler
    x: np.ndarray
    y: np.ndarray
    wait_s: float = 0.0  # seconds get() waited for the data

    @property
    def n_local(self) -> int:
        return self.local.samples

    @property
    def n_global(self) -> int:
        return self.local.global_samples

    def fetch(self, idx) -> tuple[np.ndarray, np.ndarray]:
        """``(x, y)`` of samples ``idx`` (a micro-batch or the filler), from the arrays read."""
        idx = np.asarray(idx, dtype=np.int64)
        order = np.argsort(self.indices, kind="stable")
        pos = np.minimum(np.searchsorted(self.indices[order], idx), len(order) - 1)
        rows = order[pos]
        if not np.array_equal(self.indices[rows], idx):
            raise KeyError(f"samples {idx[self.indices[rows] != idx][:5].tolist()} were not read for this step")
        return self.x[rows], self.y[rows]


def read_pairs(ds, idx: np.ndarray, split: str = "train") -> tuple[np.ndarray, np.ndarray]:
    """``(x[idx], y[idx])`` of a split; a token corpus reads each window once for both."""
    x, y = (ds.x_train, ds.y_train) if split == "train" else (ds.x_test, ds.y_test)
    windows = getattr(x, "windows", None)
    if windows is not None:
        return windows.pairs(idx)
    return x[idx], y[idx]


class BatchSource:
    def __init__(self, ds, data_cfg, train_cfg, dp_size: int = 1, dp_rank: int = 0, sampler=None):
        """``sampler``: the run's own (a global batch changed at a step: hpcdp.data.rescale);
        None: the config's."""
        self.ds, self.dp_size, self.dp_rank = ds, dp_size, dp_rank
        self.accum = train_cfg.grad_accum
        exact = getattr(train_cfg, "reproducible", "fast") == "exact"
        self.exact_micro = train_cfg.exact_micro_batch if exact else 0
        self.sampler = sampler if sampler is not None else make_sampler(
            ds, train_cfg.global_batch, data_cfg.seed, train_cfg.last_batch)
        self.batches_per_epoch = self.sampler.batches_per_epoch
        self.total = train_cfg.steps or self.sampler.steps_for_epochs(train_cfg.epochs)
        on_disk = ds.info.get("storage") == "disk"
        self._prefetch = Prefetcher(self._read) if data_cfg.prefetch and on_disk else None

    def _read(self, step: int) -> Batch:
        parts, global_n = rank_micro_batches(self.sampler, step, self.dp_size, self.dp_rank,
                                             accum=self.accum, exact_micro=self.exact_micro)
        filler = self.sampler.global_indices(step)[:1]
        indices = np.concatenate(parts + [filler])
        x, y = read_pairs(self.ds, indices)
        return Batch(LocalBatch(parts, global_n, filler, step=step), indices, x, y)

    def get(self, step: int) -> Batch:
        """The batch of 0-based ``step`` (and, with prefetch, start reading ``step + 1``)."""
        t0 = time.perf_counter()
        if self._prefetch is None:
            batch = self._read(step)
        else:
            batch = self._prefetch.get(step, step + 1 if step + 1 < self.total else None)
        batch.wait_s = time.perf_counter() - t0
        return batch

    def position(self, step: int) -> tuple[int, int]:
        """(epoch, batch within the epoch) of 0-based ``step``."""
        return self.sampler.position(step)

    def close(self) -> None:
        if self._prefetch is not None:
            self._prefetch.close()
