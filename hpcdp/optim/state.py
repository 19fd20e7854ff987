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

Weight-decay groups (:mod:`.decay`): ``set_decay_ranges(ranges)`` limits weight decay
to those (offset, size) ranges of the full flat buffer (default: decay everything);
``set_slice(pieces)`` says which ranges of the full buffer the arrays given to a
step hold, concatenated (default: the whole buffer; a ZeRO rank: its owned ranges,
a PS server: its shard). A step then runs the update once per run of decayed /
undecayed elements (``decay_runs``), with weight_decay or 0: elementwise updates, so
the result is exactly that of two parameter groups.
"""

from __future__ import annotations

from .decay import local_runs


class FlatState:
    kind = "abstract"
    clip_grad_norm = 0.0

    def __init__(self, names, size, dtype, backend):
        self.names, self.dtype, self.backend = tuple(names), dtype, backend
        self.size = None
        self.state: dict = {}
        self.steps = 0  # optimizer steps taken (AdamW's bias correction uses it)
        self.decay_ranges = None  # None: every element decays
        self.slice = None  # None: the arrays are the whole flat buffer
        self._runs = None
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
        total = self._check_pieces(pieces)
        self.steps += 1
        runs = self.decay_runs(total)  # (lo, hi, weight_decay) over the pieces concatenated
        lo = 0
        for param, grad in pieces:
            n = int(param.shape[0])
            for a, b, wd in runs:  # the runs that fall in this piece [lo, lo + n)
                s, e = max(a, lo), min(b, lo + n)
                if s < e:
                    self._update(param[s - lo:e - lo], grad[s - lo:e - lo],
                                 {k: v[s:e] for k, v in self.state.items()}, wd)
            lo += n

    def _update(self, param, grad, state, weight_decay) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def set_decay_ranges(self, ranges) -> None:
        """Weight decay only on these (offset, size) ranges of the full flat buffer
        (sorted, disjoint; e.g. ``decay_ranges(flat.layout, rules)``); None: everywhere."""
        self.decay_ranges = None if ranges is None else [(int(o), int(s)) for o, s in ranges]
        self._runs = None

    def set_slice(self, pieces) -> None:
        """The arrays given to ``step`` hold these (offset, size) ranges of the full
        flat buffer, concatenated in this order: a PS shard's one range, a ZeRO rank's
        owned ranges. None: the whole buffer."""
        self.slice = None if pieces is None else [(int(o), int(s)) for o, s in pieces]
        self._runs = None

    def decay_runs(self, n: int) -> list[tuple[int, int, float]]:
        """(lo, hi, weight_decay) runs covering a local array of ``n`` elements."""
        if self.decay_ranges is None or self.weight_decay == 0.0:
            return [(0, n, self.weight_decay)]
        if self.slice is not None and n and not sum(size for _, size in self.slice):
            return [(0, n, 0.0)]  # a rank that owns nothing (ZeRO's one-element NaN probe)
        if self._runs is None or self._runs[0] != n:
            pieces = self.slice if self.slice is not None else [(0, n)]
            runs = local_runs(self.decay_ranges, pieces, n)
            self._runs = (n, [(lo, hi, on) for lo, hi, on in runs])
        return [(lo, hi, self.weight_decay if on else 0.0) for lo, hi, on in self._runs[1]]

    def ensure_size(self, size: int) -> None:
        """Allocate the state (zeros) for ``size`` elements now, as the first step
        would (a checkpoint restore fills it before any step)."""
        if self.size is None:
            self._allocate(int(size))
        elif self.size != int(size):
            raise ValueError(f"{type(self).__name__}: state holds {self.size} elements, asked for {size}")

    def state_arrays(self) -> dict:
        """Name -> state buffer (empty until sized)."""
        return dict(self.state)

    @property
    def nbytes(self) -> int:
        return sum(int(a.nbytes) for a in self.state.values())
