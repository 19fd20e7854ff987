"""The global deterministic sampler: which samples form each global batch, and which
of them this rank takes.

The order of samples depends only on (seed, epoch): epoch e is the permutation
``default_rng([seed, e, ...]).permutation(n)`` cut into consecutive global batches.
The number of ranks plays no part in it. Each data-parallel rank then takes its
contiguous slice of the global batch with :func:`hpcdp.shard.shard_range`, so the
slices of ranks 0..N-1, concatenated, are the global batch for every N.

Short last batch of an epoch (``n % global_batch`` samples): ``"drop"`` (default)
skips it; ``"keep"`` uses it, and the caller weights each rank's loss by
``local_samples / global_samples`` with the actual (smaller) global count.
"""

from __future__ import annotations

import numpy as np

from hpcdp.shard import shard_range

from . import DataError


class GlobalSampler:
    def __init__(self, n: int, global_batch: int, seed: int, last_batch: str = "drop"):
        if last_batch not in ("drop", "keep"):
            raise ValueError(f"train.last_batch: {last_batch!r} is not allowed; choose one of 'drop', 'keep'")
        if n < 1:
            raise DataError("the training set is empty")
        if global_batch < 1:
            raise ValueError(f"train.global_batch: must be >= 1, got {global_batch}")
        self.n, self.global_batch, self.seed, self.last_batch = n, global_batch, seed, last_batch
        full, rest = divmod(n, global_batch)
        self.batches_per_epoch = full + (1 if rest and last_batch == "keep" else 0)
        if self.batches_per_epoch == 0:
            raise DataError(f"train.global_batch = {global_batch} is larger than the {n} training samples "
                            "and train.last_batch = 'drop' leaves no batch: lower train.global_batch or "
                            "set train.last_batch = 'keep'")
        self._epoch, self._perm = -1, None

    def permutation(self, epoch: int) -> np.ndarray:
        """The sample order of ``epoch`` (cached for the current epoch)."""
        if epoch != self._epoch:
            self._perm = np.random.default_rng([self.seed, epoch, 0x5A3B1E]).permutation(self.n)
            self._epoch = epoch
        return self._perm

    def position(self, step: int) -> tuple[int, int]:
        """(epoch, batch within epoch) of 0-based optimizer step ``step``."""
        return divmod(step, self.batches_per_epoch)

    def global_indices(self, step: int) -> np.ndarray:
        """Sample indices of the global batch of 0-based step ``step`` (length <= global_batch)."""
        epoch, b = self.position(step)
        start = b * self.global_batch
        return self.permutation(epoch)[start:start + self.global_batch]

    def local_indices(self, step: int, dp_size: int = 1, dp_rank: int = 0) -> tuple[np.ndarray, int]:
        """(this rank's sample indices, global batch size actually used) for ``step``."""
        g = self.global_indices(step)
        off, size = shard_range(len(g), dp_size, dp_rank)
        return g[off:off + size], len(g)


def micro_batches(local: np.ndarray, accum: int) -> list[np.ndarray]:
    """Cut this rank's slice into ``accum`` contiguous micro-batches (shard rule).

    Micro-batches may be empty when the slice is shorter than ``accum``.
    """
    out = []
    for m in range(accum):
        off, size = shard_range(len(local), accum, m)
        out.append(local[off:off + size])
    return out
