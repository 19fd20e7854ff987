"""Flat optimizer state shared by SGD and AdamW: named 1-D buffers sized to the
parameter array the optimizer updates.

``size`` given: the buffers are allocated now and every ``step`` must pass arrays of
that size. ``size=None``: they are allocated (zeros) by the first ``step``, sized to
the array it gets, which lets a sharding strategy give the optimizer only its shard
without train.py knowing the shard size.
"""

from __future__ import annotations


class FlatState:
    kind = "abstract"

    def __init__(self, names, size, dtype, backend):
        self.names, self.dtype, self.backend = tuple(names), dtype, backend
        self.size = None
        self.state: dict = {}
        self.steps = 0  # optimizer steps taken (AdamW's bias correction uses it)
        if size is not None:
            self._allocate(int(size))

    def _allocate(self, size: int) -> None:
        self.size = size
        self.state = {n: self.backend.zeros((size,), self.dtype) for n in self.names}

    def _ensure_state(self, param, grad) -> None:
        n = param.shape[0] if len(param.shape) == 1 else None
        if n is None or grad.shape != param.shape:
            raise ValueError(f"{type(self).__name__}.step: needs 1-D param and grad of the same size, "
                             f"got {param.shape} and {grad.shape}")
        if self.size is None:
            self._allocate(n)
        elif n != self.size:
            raise ValueError(f"{type(self).__name__}.step: state holds {self.size} elements, "
                             f"got an array of {n}")

    def state_arrays(self) -> dict:
        """Name -> state buffer (empty until sized)."""
        return dict(self.state)

    @property
    def nbytes(self) -> int:
        return sum(int(a.nbytes) for a in self.state.values())
