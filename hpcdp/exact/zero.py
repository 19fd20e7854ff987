"""ZeRO stages 1-3 in exact mode: the reduce-scatters carry int64.

- Stage 1 keeps a full gradient buffer, like DDP: its groups go through
  ``reducers.BucketSum`` with an int64 reduce-scatter per group instead of an
  allreduce; each rank decodes only its own chunk of every group into ``flat.grad``,
  and stage 1's own ``step`` (update of its pieces, all-gather of the parameters)
  follows. The acceptance counters travel in a two-element allreduce started with
  the last group.
- Stages 2 and 3 hold no full gradient: each micro-batch's group buffer is reduced
  as soon as it is final, as in fast mode. Here the group's gradient is first folded
  into this rank's per-tensor max and encoded to an int64 group buffer at the step's
  scale (the float buffer is released at once), and the int64 buffer is
  reduce-scattered; this rank's chunk is added into an int64 gradient shard (Psi / N
  x 8 bytes). After the last micro-batch the shard is decoded into the float
  gradient shard, and the stage's own ``step`` follows. These are the stage classes
  with the engine's launch and on-done replaced (``exact_strategy`` builds them in
  place of the plain ones before setup); every other moment (gathers, binds,
  unit-order checks, prefetch) is the stage's own.

With no full gradient there is nothing to keep for the agreed path: on the first
step, and after a missed guess, the passes run once to measure the per-tensor
maxima (group buffers folded and released, nothing reduced), the MAX is agreed,
and the passes run again at that scale (mode.py). Recomputation is deterministic,
so this costs time, not bits.
"""

from __future__ import annotations

import numpy as np

from hpcdp.strategies.zero.stage2 import ZeroStage2
from hpcdp.strategies.zero.stage3 import ZeroStage3

from .reducers import _Done


class _ExactShards:
    """What stages 2 and 3 do differently in exact mode (a mixin before the stage)."""

    exact = None   # set by ShardSum.begin for a pass set: (codec, local_max, maxima_only)
    encode = True  # False during filler passes: reduce zeros, fold nothing

    def _host(self, buf):
        return buf if isinstance(buf, np.ndarray) else self.backend.to_numpy(buf)

    def _reduce_grads(self, b: int):
        self._bind_grad_buffer(b)
        codec, local_max, maxima_only = self.exact
        bk = self.plan.buckets[b]
        if self.encode:
            g = self._host(self._gbuf[b])
            codec.absmax_into(g, local_max, lo=bk.offset)
        ints = None
        if not maxima_only:
            ints = np.zeros(bk.size, dtype=np.int64)
            if self.encode:
                codec.encode_add(g, ints, lo=bk.offset)
        self.flat.release(bk.offset, bk.size, grad=True)  # the float buffer goes now
        self._gbuf[b] = None
        if ints is None:
            return _Done()
        self._ipay[b] = ints
        return self._reduce_scatter(ints)

    def _grads_reduced(self, b: int) -> None:
        ints = self._ipay[b]
        if ints is not None:
            mine = self._shard_of(self.ishard, b)
            mine += self._chunk_view(ints, b)  # integers: exact in any order
            self._ipay[b] = None

    def exact_setup(self) -> None:
        self.ishard = np.zeros(self.shard_numel, dtype=np.int64)
        self._ipay = [None] * len(self.plan.buckets)


class ExactZeroStage2(_ExactShards, ZeroStage2):
    pass


class ExactZeroStage3(_ExactShards, ZeroStage3):
    pass


_EXACT = {ZeroStage2: ExactZeroStage2, ZeroStage3: ExactZeroStage3}


def exact_strategy(strategy):
    """The strategy exact mode runs: for ZeRO stages 2 and 3 the same stage with
    exact reductions (built from the same options, before setup); others as given."""
    cls = _EXACT.get(type(strategy))
    if cls is None:
        return strategy
    return cls(strategy.cfg, timeout=strategy.timeout, debug=strategy.debug)


class ShardSum:
    """The reducer for ZeRO stages 2 and 3 (mode.py drives the passes)."""

    streaming = True
    shards = True

    def __init__(self, strategy, codec, comm):
        if not isinstance(strategy, _ExactShards):
            raise RuntimeError("exact mode: the ZeRO strategy was built without exact reductions "
                               "(hpcdp.exact.zero.exact_strategy runs before setup)")
        self.strategy, self.codec, self.comm = strategy, codec, comm
        strategy.exact_setup()

    def begin(self, local_max: np.ndarray, maxima_only: bool) -> None:
        s = self.strategy
        s.ishard.fill(0)
        s.exact = (self.codec, local_max, maxima_only)
        s.encode = True

    def pass_kind(self, real: bool) -> None:
        """A filler pass still reduces (every rank runs the same collectives) but
        contributes nothing."""
        self.strategy.encode = real

    def decode_and_step(self) -> None:
        s = self.strategy
        for b in s.mine:
            lo, n = s.mine[b]
            if not n:
                continue
            ints = s._shard_of(s.ishard, b)
            target = s._shard_of(s.gshard, b)
            if isinstance(target, np.ndarray):
                self.codec.decode(ints, target, lo=lo)
            else:
                host = np.empty(n, dtype=s.flat.dtype)
                self.codec.decode(ints, host, lo=lo)
                s.backend.copy_(target, s.backend.asarray(host, s.flat.dtype))
        s.exact = None
        s.step()

    def stats(self) -> dict:
        return {}


__all__ = ["exact_strategy", "ShardSum", "ExactZeroStage2", "ExactZeroStage3"]
