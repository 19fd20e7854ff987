"""How each strategy sums the step's integer gradients and applies the update.

``BucketSum`` (strategies ``none`` and ``ddp``): the flat buffer is cut into DDP's
bucket plan (one bucket for ``none``); each bucket's int64 sum lives in a payload
buffer; the last one launched (the buffer's first bucket) carries two counters in
front of its sums (how many ranks found a tensor above the scale's band, and how
many found one inside it: mode.py's acceptance test). The DDP bucket engine (strategies/engine.py) runs an int64 ring allreduce
per payload, in plan order, either from the grad-ready hooks of the last
micro-batch's backward (the scale is known in advance: overlap as in fast mode)
or all at once after backward; then every bucket is decoded into ``flat.grad``.
Integer addition is associative and commutative, so the ring's order, N and the
bucket cuts do not change a bit. Bytes: twice the float32 allreduce (int64
elements) plus 16 bytes of counters.

``ServerSum`` (``ps``, synchronous): the servers sum the integers (ps.py).

``ShardSum`` (ZeRO stages 2 and 3): zero.py.

Any other strategy has no exact mode yet: a clear error at setup, before step 1.
"""

from __future__ import annotations

import numpy as np

from hpcdp.config_error import ConfigError

from .fixed import quantized_exponent


class _Done:
    """A request that is already complete (one rank: nothing to sum)."""

    timeout = 0.0

    def test(self) -> bool:
        return True

    def wait(self, timeout=None) -> None:
        return None


class _Reducer:
    """Shared: the host staging of ``flat.grad`` (device runs decode on the host and
    copy the gradient over once per step)."""

    streaming = False
    shards = False

    def __init__(self, strategy, codec):
        self.strategy, self.codec = strategy, codec
        flat = strategy.flat
        self.flat, self.be = flat, flat.backend
        self.on_host = isinstance(flat.grad, np.ndarray)
        self.grad_host = flat.grad if self.on_host else np.empty(flat.numel, dtype=flat.dtype)

    def _to_device(self) -> None:
        if not self.on_host:
            self.be.copy_(self.flat.grad, self.be.asarray(self.grad_host, self.flat.dtype))

    def stats(self) -> dict:
        return {}


class _Both:
    """Two requests completing together (a group's reduce-scatter and the counters)."""

    def __init__(self, a, b):
        self.a, self.b = a, b
        self.timeout = getattr(a, "timeout", None)

    def test(self) -> bool:
        return bool(self.a.test()) & bool(self.b.test())

    def wait(self, timeout=None) -> None:
        self.a.wait(timeout)
        self.b.wait(timeout)


class BucketSum(_Reducer):
    """``none``, ``ddp`` and ZeRO stage 1: int64 payloads per bucket (group), summed
    by the bucket engine: an allreduce, or with ``scatter`` (ZeRO-1) a reduce-scatter,
    after which each rank decodes only its own chunk of every group."""

    streaming = True
    shards = False

    def __init__(self, strategy, codec, comm, *, scatter: bool = False):
        super().__init__(strategy, codec)
        from hpcdp import comm as hcomm
        from hpcdp.strategies.buckets import plan_buckets
        from hpcdp.strategies.engine import BucketEngine

        s, flat = strategy, self.flat
        plan = getattr(s, "plan", None) or plan_buckets(flat.layout, max(flat.numel, 1))
        if plan.buckets[-1].offset != 0:
            raise RuntimeError("exact mode: the bucket plan must launch the buffer's first bucket last")
        self.plan, self.scatter = plan, scatter
        self.tensors = [np.array(b.params, dtype=np.int64) for b in plan.buckets]
        # One int64 array: 2 counters, then the sums in flat order. The first bucket
        # (offset 0) is launched last and carries the counters in front of its sums
        # (a reduce-scatter leaves them on one rank only: then they go in a
        # two-element allreduce of their own, started with that bucket).
        self.acc = np.zeros(2 + flat.numel, dtype=np.int64)
        self.ints_all = self.acc[2:]
        self.counters = np.zeros(2, dtype=np.int64) if scatter else self.acc[:2]
        self.ints = [self.ints_all[b.offset:b.offset + b.size] for b in plan.buckets]
        self.payload = ([self.acc[(0 if b.offset == 0 else 2 + b.offset):2 + b.offset + b.size]
                         for b in plan.buckets] if not scatter else self.ints)
        single = comm is None or comm.Get_size() == 1
        algorithm = getattr(getattr(s, "cfg", None), "algorithm", "auto")
        timeout, ledger = getattr(s, "timeout", None), getattr(s, "ledger", None)
        last = len(plan.buckets) - 1

        def launch(b):
            self._seal(b)
            if single:
                return _Done()
            if not scatter:
                return hcomm.iallreduce(self.payload[b], comm=comm, op="sum", algorithm=algorithm,
                                        ledger=ledger, timeout=timeout)
            req = s._reduce_scatter(self.ints[b])
            if b == last:
                req = _Both(req, hcomm.iallreduce(self.counters, comm=comm, op="sum",
                                                  ledger=ledger, timeout=timeout))
            return req

        self.engine = BucketEngine(plan, launch, name="exact sum")
        self.engine.attach(flat)
        self.single = single

    # -- one pass of sums ------------------------------------------------------------
    def begin(self, guess_band: int, local_max: np.ndarray) -> None:
        """A new sum at the scale of band ``guess_band`` (the codec is set to it);
        ``local_max``: this rank's per-tensor max |g|, updated as passes run."""
        self.acc.fill(0)
        self.counters.fill(0)
        self.guess, self.local_max = guess_band, local_max
        self.last_grad = None      # True during the pass whose buckets the hooks seal
        self.engine.arm(False)

    def encode_whole(self, g: np.ndarray) -> None:
        """Add one micro-batch's whole gradient (host array) into every bucket."""
        self.codec.encode_add(g, self.ints_all)

    @property
    def hooks_ok(self) -> bool:
        """Buckets are sealed from the hooks when there is communication to overlap
        and the gradient is on the host (a device gradient is staged to the host
        once, after backward)."""
        return self.on_host and not self.single

    def arm(self) -> None:
        """The coming backward is this rank's last micro-batch: each bucket is sealed
        (max, encode, counters) and launched from the hooks as soon as it is final."""
        self.last_grad = True
        self.engine.arm(True)

    def _seal(self, b: int) -> None:
        bk, codec = self.plan.buckets[b], self.codec
        if self.last_grad is not None:  # whole tensors: all of them are final once the bucket is
            codec.absmax_tensors(self.flat.grad, self.tensors[b], self.local_max)
            codec.encode_add(self.flat.grad[bk.offset:bk.offset + bk.size], self.ints[b], lo=bk.offset)
        if b == len(self.plan.buckets) - 1:  # the last bucket: every tensor is final
            eq = quantized_exponent(self.local_max)  # (a non-finite tensor counts as above)
            self.counters[0] = int(np.any(eq > self.guess))
            self.counters[1] = int(np.any(eq == self.guess))

    def flush(self, check: bool = True) -> bool:
        """Launch what the hooks did not, wait for every bucket; True if the scale was
        right (then ``flat.grad`` holds the decoded sum): no rank found a tensor above
        its band, and some rank found one inside it. The counters are sums over ranks,
        so every rank decides alike. ``check=False``: the scale was agreed (decode)."""
        self.engine.flush()
        self.last_grad = None
        above, inside = int(self.counters[0]), int(self.counters[1])
        if check and (above or not inside):
            return False
        if not self.scatter:
            self.codec.decode(self.ints_all, self.grad_host)
        else:  # ZeRO-1: this rank's chunk of every group; the step reads only those
            s = self.strategy
            for b, bk in enumerate(self.plan.buckets):
                lo = s.mine[b][0]
                self.codec.decode(s._chunk_view(self.ints[b], b),
                                  s._chunk_view(self.grad_host[bk.offset:bk.offset + bk.size], b), lo=lo)
        self._to_device()
        return True

    def stats(self) -> dict:
        return {} if self.single else self.engine.stats()

    def close(self) -> None:
        self.engine.close()


def build_reducer(strategy, codec, worker_comm):
    """The reducer for ``strategy`` (by its name); a clear error if it has no exact mode."""
    name = getattr(strategy, "name", type(strategy).__name__)
    if name == "none":
        return BucketSum(strategy, codec, None)
    if name == "ddp":
        return BucketSum(strategy, codec, strategy.comm if strategy.world.size > 1 else None)
    if name == "ps":
        from .ps import ServerSum
        return ServerSum(strategy, codec)
    if name == "zero":
        comm = strategy.comm if strategy.dp_size > 1 else None
        if strategy.stage == 1:
            return BucketSum(strategy, codec, comm, scatter=True)
        from .zero import ShardSum
        return ShardSum(strategy, codec, comm)
    raise ConfigError(f"parallel.strategy: {name!r} has no exact mode yet (exact mode supports "
                      f"'none', 'ddp', 'zero' and 'ps' with mode = 'sync'); use "
                      "train.reproducible = 'fast'")


__all__ = ["build_reducer", "BucketSum"]
