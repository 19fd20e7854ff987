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

Token streams (:class:`WindowSampler`): sample ``j`` of the global batch of step
``s`` is the window starting at ``hash(seed, s, j) mod n_windows`` (SplitMix64),
so any rank computes any sample's window alone, in O(1) memory, and the same
``shard_range`` slicing gives every rank count the same global batch.
"""

from __future__ import annotations

import numpy as np

from hpcdp.shard import shard_range

from .dataset import DataError


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
        self._cached = (-1, None)  # (epoch, permutation): one attribute, safe for a prefetch thread

    def permutation(self, epoch: int) -> np.ndarray:
        """The sample order of ``epoch`` (cached for the current epoch)."""
        cached = self._cached
        if cached[0] != epoch:
            cached = (epoch, np.random.default_rng([self.seed, epoch, 0x5A3B1E]).permutation(self.n))
            self._cached = cached
        return cached[1]

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

    # -- what hpcdp.data.rescale needs (a global batch that changes at a step) --------
    @property
    def epoch_samples(self) -> int:
        """Samples one epoch holds (the permutation's length)."""
        return self.n

    def start(self, step: int) -> tuple[int, int]:
        """(epoch, first sample's offset in the epoch's order) of 0-based ``step``."""
        epoch, b = self.position(step)
        return epoch, b * self.global_batch

    def batch_at(self, step: int, epoch: int, offset: int, size: int) -> np.ndarray:
        """The ``size`` samples from ``offset`` of ``epoch``'s order (fewer at its end)."""
        return self.permutation(epoch)[offset:offset + size]

    def with_batch(self, global_batch: int) -> "GlobalSampler":
        """The same data order cut into global batches of ``global_batch``."""
        return GlobalSampler(self.n, global_batch, self.seed, self.last_batch)

    def steps_for_epochs(self, epochs: int) -> int:
        return epochs * self.batches_per_epoch


def micro_batches(local: np.ndarray, accum: int) -> list[np.ndarray]:
    """Cut this rank's slice into ``accum`` contiguous micro-batches (shard rule).

    Micro-batches may be empty when the slice is shorter than ``accum``.
    """
    out = []
    for m in range(accum):
        off, size = shard_range(len(local), accum, m)
        out.append(local[off:off + size])
    return out


_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def _splitmix64(z: np.ndarray) -> np.ndarray:
    """SplitMix64's finalizer on uint64 arrays (wrapping arithmetic): a well-mixed hash."""
    with np.errstate(over="ignore"):
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def window_starts(seed: int, step: int, j: np.ndarray, n_windows: int) -> np.ndarray:
    """Start of the window of global sample ``j`` (array) in step ``step``: a pure function."""
    with np.errstate(over="ignore"):
        key = _splitmix64(np.array([seed], dtype=np.uint64) * _GOLDEN + np.uint64(step))
        h = _splitmix64(key ^ (np.asarray(j, dtype=np.uint64) * _GOLDEN + np.uint64(0x5A3B1E)))
    return (h % np.uint64(n_windows)).astype(np.int64)


class WindowSampler:
    """Random windows of a token stream; the GlobalSampler interface (indices = window starts).

    An "epoch" is ``n_tokens // (global_batch * T)`` steps (at least 1): as many
    tokens as the stream holds, drawn with replacement.
    """

    def __init__(self, n_windows: int, global_batch: int, seed: int, tokens_per_window: int):
        if n_windows < 1:
            raise DataError("the token stream is shorter than one window")
        if global_batch < 1:
            raise ValueError(f"train.global_batch: must be >= 1, got {global_batch}")
        self.n, self.global_batch, self.seed = n_windows, global_batch, seed
        self.last_batch, self.tokens_per_window = "drop", tokens_per_window
        n_tokens = n_windows + tokens_per_window
        self.batches_per_epoch = max(1, n_tokens // (global_batch * tokens_per_window))

    def position(self, step: int) -> tuple[int, int]:
        return divmod(step, self.batches_per_epoch)

    def global_indices(self, step: int) -> np.ndarray:
        return window_starts(self.seed, step, np.arange(self.global_batch), self.n)

    def local_indices(self, step: int, dp_size: int = 1, dp_rank: int = 0) -> tuple[np.ndarray, int]:
        off, size = shard_range(self.global_batch, dp_size, dp_rank)
        return window_starts(self.seed, step, np.arange(off, off + size), self.n), self.global_batch

    # -- what hpcdp.data.rescale needs: windows are keyed by step and position in the batch
    @property
    def epoch_samples(self) -> int:
        return self.batches_per_epoch * self.global_batch

    def start(self, step: int) -> tuple[int, int]:
        epoch, b = self.position(step)
        return epoch, b * self.global_batch

    def batch_at(self, step: int, epoch: int, offset: int, size: int) -> np.ndarray:
        return window_starts(self.seed, step, np.arange(size), self.n)

    def with_batch(self, global_batch: int) -> "WindowSampler":
        return WindowSampler(self.n, global_batch, self.seed, self.tokens_per_window)

    def steps_for_epochs(self, epochs: int) -> int:
        return epochs * self.batches_per_epoch


def make_sampler(ds, global_batch: int, seed: int, last_batch: str = "drop"):
    """The sampler a dataset asks for: windows of a token stream, else a permutation of samples."""
    if ds.info.get("sampling") == "windows":
        return WindowSampler(ds.n_train, global_batch, seed, ds.x_train.shape[1])
    return GlobalSampler(ds.n_train, global_batch, seed, last_batch)
