"""How each strategy sums the step's integer gradients and applies the update.

A reducer gets this rank's int64 sum over its micro-batches (``acc``, the whole
flat buffer, already at the agreed scale) and must leave every replica with the
same update, for any N:

- ``none`` (one rank): decode ``acc`` into ``flat.grad``, run the optimizer.
- ``ddp``: the DDP bucket engine (strategies/engine.py) with an int64 ring
  allreduce as its collective, one per bucket of DDP's own plan; as each bucket
  completes, its integers are decoded into that bucket's view of ``flat.grad``
  (overlapping the decode with the other buckets' ring steps). Then DDP's own
  ``step()`` (optimizer, replica check). Integer addition is associative and
  commutative, so the ring's order, N and the bucket cuts do not matter. Bytes:
  2x the float32 allreduce (int64 elements).
- ``ps`` (synchronous): integers pushed to the servers and summed there (ps.py).

Any other strategy has no exact mode yet: a clear error at setup, before step 1.
"""

from __future__ import annotations


import numpy as np

from hpcdp.config_parallel import ConfigError


class _Reducer:
    """Shared: the host staging of ``flat.grad`` (device runs decode on the host and
    copy the gradient over once per step)."""

    def __init__(self, strategy, codec):
        self.strategy, self.codec = strategy, codec
        flat = strategy.flat
        self.flat, self.be = flat, flat.backend
        self.on_host = isinstance(flat.grad, np.ndarray)
        self.grad_host = flat.grad if self.on_host else np.empty(flat.numel, dtype=flat.dtype)
        self._stats: dict = {}

    def _to_device(self) -> None:
        if not self.on_host:
            self.be.copy_(self.flat.grad, self.be.asarray(self.grad_host, self.flat.dtype))

    def stats(self) -> dict:
        out, self._stats = self._stats, {}
        return out


class LocalSum(_Reducer):
    """One rank: nothing to sum across ranks."""

    def reduce_and_step(self, acc: np.ndarray) -> None:
        self.codec.decode(acc, self.grad_host)
        self._to_device()
        self.strategy.step()


class RingSum(_Reducer):
    """DDP: int64 ring allreduce per bucket through the bucket engine."""

    def __init__(self, strategy, codec, acc):
        super().__init__(strategy, codec)
        from hpcdp import comm as hcomm
        from hpcdp.strategies.engine import BucketEngine

        s = strategy
        buckets = s.plan.buckets
        views = [acc[b.offset:b.offset + b.size] for b in buckets]
        grads = [self.grad_host[b.offset:b.offset + b.size] for b in buckets]

        def launch(b):
            return hcomm.iallreduce(views[b], comm=s.comm, op="sum", algorithm=s.cfg.algorithm,
                                    ledger=s.ledger, timeout=s.timeout)

        def on_done(b):  # this bucket's integers are final: decode while others move
            codec.decode(views[b], grads[b], lo=buckets[b].offset)

        self.engine = BucketEngine(s.plan, launch, on_done=on_done, name="DDP (exact)")
        self.single = s.world.size == 1

    def reduce_and_step(self, acc: np.ndarray) -> None:
        if self.single:
            self.codec.decode(acc, self.grad_host)
        else:
            self.engine.arm(False)  # no hooks: every bucket starts from flush
            self.engine.flush()     # all buckets in plan order; blocks until every one is decoded
        self._to_device()
        self.strategy.step()

    def stats(self) -> dict:
        return {} if self.single else self.engine.stats()


def build_reducer(strategy, codec, acc, worker_comm):
    """The reducer for ``strategy`` (by its name); a clear error if it has no exact mode."""
    name = getattr(strategy, "name", type(strategy).__name__)
    if name == "none":
        return LocalSum(strategy, codec)
    if name == "ddp":
        return RingSum(strategy, codec, acc)
    if name == "ps":
        from .ps import ServerSum
        return ServerSum(strategy, codec)
    raise ConfigError(f"parallel.strategy: {name!r} has no exact mode yet (exact mode supports "
                      f"'none', 'ddp' and 'ps' with mode = 'sync'); use train.reproducible = 'fast'")


__all__ = ["build_reducer", "LocalSum", "RingSum"]
