"""How each strategy sums the step's integer gradients and applies the update.

``BucketSum`` (strategies ``none`` and ``ddp``): the flat buffer is cut into DDP's
bucket plan (one bucket for ``none``); each bucket's int64 sum lives in a payload
buffer followed by two counters (how many ranks found a tensor of the bucket
above the scale's band, and how many found one inside it: mode.py's acceptance
test). The DDP bucket engine (strategies/engine.py) runs an int64 ring allreduce
per payload, in plan order, either from the grad-ready hooks of the last
micro-batch's backward (the scale is known in advance: overlap as in fast mode)
or all at once after backward; then every bucket is decoded into ``flat.grad``.
Integer addition is associative and commutative, so the ring's order, N and the
bucket cuts do not change a bit. Bytes: twice the float32 allreduce (int64
elements) plus 16 bytes per bucket.

``ServerSum`` (``ps``, synchronous): the servers sum the integers (ps.py).

Any other strategy has no exact mode yet: a clear error at setup, before step 1.
"""

from __future__ import annotations

import numpy as np

from hpcdp.config_parallel import ConfigError

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


class BucketSum(_Reducer):
    """``none`` and ``ddp``: int64 payloads per bucket, summed by the bucket engine."""

    streaming = True

    def __init__(self, strategy, codec, comm):
        super().__init__(strategy, codec)
        from hpcdp import comm as hcomm
        from hpcdp.strategies.buckets import plan_buckets
        from hpcdp.strategies.engine import BucketEngine

        s, flat = strategy, self.flat
        plan = getattr(s, "plan", None) or plan_buckets(flat.layout, max(flat.numel, 1))
        self.plan = plan
        self.tensors = [np.array(b.params, dtype=np.int64) for b in plan.buckets]
        self.payload = [np.zeros(b.size + 2, dtype=np.int64) for b in plan.buckets]
        self.ints = [p[:b.size] for p, b in zip(self.payload, plan.buckets)]
        self.grads = [self.grad_host[b.offset:b.offset + b.size] for b in plan.buckets]
        single = comm is None or comm.Get_size() == 1
        algorithm = getattr(getattr(s, "cfg", None), "algorithm", "auto")
        timeout, ledger = getattr(s, "timeout", None), getattr(s, "ledger", None)

        def launch(b):
            self._seal(b)
            if single:
                return _Done()
            return hcomm.iallreduce(self.payload[b], comm=comm, op="sum", algorithm=algorithm,
                                    ledger=ledger, timeout=timeout)

        self.engine = BucketEngine(plan, launch, name="exact sum")
        self.engine.attach(flat)
        self.single = single

    # -- one pass of sums ------------------------------------------------------------
    def begin(self, guess_band: int, local_max: np.ndarray) -> None:
        """A new sum at the scale of band ``guess_band`` (the codec is set to it);
        ``local_max``: this rank's per-tensor max |g|, updated as passes run."""
        for p in self.payload:
            p.fill(0)
        self.guess, self.local_max = guess_band, local_max
        self.last_grad = None      # True during the pass whose buckets the hooks seal
        self.engine.arm(False)

    def encode_whole(self, g: np.ndarray) -> None:
        """Add one micro-batch's whole gradient (host array) into every bucket."""
        for b, bk in enumerate(self.plan.buckets):
            self.codec.encode_add(g[bk.offset:bk.offset + bk.size], self.ints[b], lo=bk.offset)

    @property
    def hooks_ok(self) -> bool:
        """Buckets can be sealed from the hooks (host gradients: a device gradient is
        staged to the host once, after backward)."""
        return self.on_host

    def arm(self) -> None:
        """The coming backward is this rank's last micro-batch: each bucket is sealed
        (max, encode, counters) and launched from the hooks as soon as it is final."""
        self.last_grad = True
        self.engine.arm(True)

    def _seal(self, b: int) -> None:
        bk, ts = self.plan.buckets[b], self.tensors[b]
        codec = self.codec
        if self.last_grad is not None:
            g = self.flat.grad
            for t in ts:  # whole tensors: all of them are final once the bucket is
                lo, n = int(codec.seg_off[t]), int(codec.seg_len[t])
                codec.absmax_into(g[lo:lo + n], self.local_max, lo=lo)
            codec.encode_add(g[bk.offset:bk.offset + bk.size], self.ints[b], lo=bk.offset)
        eq = quantized_exponent(self.local_max[ts])  # (a non-finite tensor counts as above)
        self.payload[b][bk.size] = int(np.any(eq > self.guess))
        self.payload[b][bk.size + 1] = int(np.any(eq == self.guess))

    def flush(self, check: bool = True) -> bool:
        """Launch what the hooks did not, wait for every bucket; True if the scale was
        right (then ``flat.grad`` holds the decoded sum): no rank found a tensor above
        its band, and some rank found one inside it. The counters are sums over ranks,
        so every rank decides alike. ``check=False``: the scale was agreed (decode)."""
        self.engine.flush()
        self.last_grad = None
        above = sum(int(p[-2]) for p in self.payload)
        inside = sum(int(p[-1]) for p in self.payload)
        if check and (above or not inside):
            return False
        for b, bk in enumerate(self.plan.buckets):
            self.codec.decode(self.ints[b], self.grads[b], lo=bk.offset)
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
    raise ConfigError(f"parallel.strategy: {name!r} has no exact mode yet (exact mode supports "
                      f"'none', 'ddp' and 'ps' with mode = 'sync'); use train.reproducible = 'fast'")


__all__ = ["build_reducer", "BucketSum"]
