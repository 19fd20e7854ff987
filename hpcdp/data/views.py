"""What ``Dataset.x_train`` and friends are for on-disk data: array-like views that
read on indexing.

- :class:`RowView`: samples of a :class:`~hpcdp.data.arrays.DiskArray` through an
  optional index map (the train/test split: sample ``i`` is file row ``rows[i]``),
  flattened and cast on read. ``view[idx]`` equals ``in_memory_array[idx]``.
- :class:`Windows` and :class:`WindowView`: windows of ``T + 1`` tokens of a token
  stream at given start positions; ``x`` is a window's first ``T`` tokens, ``y``
  its last ``T``. The x and y views share one reader that keeps the last read, so
  reading ``x[sel]`` then ``y[sel]`` reads the windows once.

Both hold only their index map (8 bytes per sample, none for a stream's training
windows), never samples.
"""

from __future__ import annotations

import threading

import numpy as np

from .dataset import DataError
from .arrays import DiskArray


def _positions(sel, n: int) -> np.ndarray | slice:
    if isinstance(sel, slice):
        return sel
    if isinstance(sel, (int, np.integer)):
        raise TypeError("index an on-disk view with an array of indices or a slice, not a single int")
    pos = np.asarray(sel, dtype=np.int64).reshape(-1)
    if len(pos) and (pos.min() < -n or pos.max() >= n):
        bad = int(pos[(pos < -n) | (pos >= n)][0])
        raise IndexError(f"sample index {bad} is out of range for {n} samples")
    return np.where(pos < 0, pos + n, pos)


class RowView:
    """Samples ``rows`` of ``array`` (None: all rows), reshaped to ``(n,) + shape`` and cast to ``dtype``."""

    def __init__(self, array: DiskArray, rows: np.ndarray | None, dtype, flatten: bool = False):
        self.array, self.rows, self.dtype = array, rows, np.dtype(dtype)
        n = len(array) if rows is None else len(rows)
        inner = array.row_shape
        self.shape = (n, int(np.prod(inner, dtype=np.int64))) if flatten else (n,) + inner

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, sel) -> np.ndarray:
        pos = _positions(sel, len(self))
        raw = self.array.read(pos if self.rows is None else self.rows[pos])
        return raw.reshape((len(raw),) + self.shape[1:]).astype(self.dtype, copy=False)

    def __array__(self, dtype=None, copy=None):
        whole = self[:]
        return whole if dtype is None else whole.astype(dtype)


class Windows:
    """Windows of ``T + 1`` tokens of ``tokens`` starting at ``starts`` (None: every start)."""

    def __init__(self, tokens: DiskArray, T: int, vocab_size: int, starts: np.ndarray | None = None):
        self.tokens, self.T, self.vocab_size, self.starts = tokens, int(T), int(vocab_size), starts
        self.n = len(tokens) - self.T if starts is None else len(starts)
        self._last = (None, None)  # (key, (x, y)): x[sel] then y[sel] reads once
        self._lock = threading.Lock()

    def pairs(self, sel) -> tuple[np.ndarray, np.ndarray]:
        """(x, y) int64 arrays (len, T) of the selected windows."""
        pos = _positions(sel, self.n)
        key = (pos.start, pos.stop, pos.step) if isinstance(pos, slice) else pos.tobytes()
        with self._lock:
            if self._last[0] == key:
                return self._last[1]
        if isinstance(pos, slice):
            pos = np.arange(*pos.indices(self.n))
        starts = pos if self.starts is None else self.starts[pos]
        w = self.tokens.read_windows(starts, self.T + 1)
        if w.size and int(w.max()) >= self.vocab_size:
            raise DataError(f"{self.tokens.where}: token id {int(w.max())} is outside the corpus "
                            f"vocabulary of {self.vocab_size}: the corpus file is damaged; "
                            "prepare it again (hpcdp data prepare)")
        w = w.astype(np.int64)
        pair = (w[:, :-1], w[:, 1:])
        with self._lock:
            self._last = (key, pair)
        return pair


class WindowView:
    """The x (``part = 0``) or y (``part = 1``) half of :class:`Windows`, array-like."""

    dtype = np.dtype(np.int64)

    def __init__(self, windows: Windows, part: int):
        self.windows, self.part = windows, part
        self.shape = (windows.n, windows.T)

    @property
    def ndim(self) -> int:
        return 2

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, sel) -> np.ndarray:
        return self.windows.pairs(sel)[self.part]

    def __array__(self, dtype=None, copy=None):
        whole = self[:]
        return whole if dtype is None else whole.astype(dtype)
