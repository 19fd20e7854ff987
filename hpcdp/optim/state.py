"""Flat optimizer state shared by SGD and AdamW: named 1-D buffers sized to the
parameter array the optimizer updates.

``size`` given: the buffers are allocated now and every ``step`` must pass arrays of
that size. ``size=None``: they are allocated (zeros, memory tag "optim") by the first
``step``, sized to the array(s) it gets, which lets a sharding strategy give the
optimizer only its shard without train.py knowing the shard size.

A ZeRO rank owns one range per collective group (hpcdp.ownership), so its shard is
several pieces of the flat buffer: ``step_pieces([(param, grad), ...])`` updates
them as ONE optimizer step (one step count, AdamW's bias correction once), with the
state laid out as the pieces concatenated in the order given. ``step(param, grad)``
is the one-piece case.

``clip_grad_norm`` (0: off) is read by the strategies: they compute the global L2
norm of the reduced gradient over all ranks (``hpcdp.optim.clip``) and scale the
gradient before ``step``.
"""

from __future__ import annotations


class FlatState:
    kind = "abstract"
    clip_grad_norm = 0.0

    def __init__(self, names, size, dtype, backend):
        self.names, self.dtype, self.backend = tuple(names), dtype, backend
        self.size = None
        self.state: dict = {}
        self.steps = 0  # optimizer steps taken (AdamW's bias correction uses it)
        if size is not None:
            self._allocate(int(size))

    def _allocate(self, size: int) -> None:
        self.size = size
        self.state = {n: self.backend.alloc((size,), self.dtype, "optim", zero=True)
                      for n in self.names}

    def _check_pieces(self, pieces) -> int:
        n = 0
        for param, grad in pieces:
            if len(param.shape) != 1 or tuple(grad.shape) != tuple(param.shape):
                raise ValueError(f"{type(self).__name__}.step: needs 1-D param and grad of the same "
                                 f"size, got {param.shape} and {grad.shape}")
            n += int(param.shape[0])
        if self.size is None:
            self._allocate(n)
        elif n != self.size:
            raise ValueError(f"{type(self).__name__}.step: state holds {self.size} elements, "
                             f"got an array of {n}")
        return n

    def step(self, param, grad, more=()) -> None:
        """In place: one update of ``param`` (1-D) with ``grad`` (1-D, same size), and of
        the further ``(param, grad)`` pieces in ``more`` in the same step."""
        self.step_pieces([(param, grad), *more])

    def step_pieces(self, pieces) -> None:
        """In place: one update of several ``(param, grad)`` pieces (1-D each); the
        state is the pieces concatenated in the order given."""
        self._check_pieces(pieces)
        self.steps += 1
        lo = 0
        for param, grad in pieces:
            n = int(param.shape[0])
            if n:
                self._update(param, grad, {k: v[lo:lo + n] for k, v in self.state.items()})
            lo += n

    def _update(self, param, grad, state) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def state_arrays(self) -> dict:
        """Name -> state buffer (empty until sized)."""
        return dict(self.state)

    @property
    def nbytes(self) -> int:
        return sum(int(a.nbytes) for a in self.state.values())
