"""Synchronous parameter server on integers (exact mode).

The protocol of hpcdp/strategies/ps/sync.py (same header, tags and order), with two
changes: a worker pushes its int64 gradient shard (this rank's micro-batches,
summed at the agreed scale) and, before it, the per-tensor exponents (``TAG_SCALE``,
one int64 each); the server checks that every worker sent the same exponents, sums
the integers (in worker order, though any order gives the same integers), decodes
its shard once and runs the optimizer on it (``update = "server"``) or returns the
decoded sum (``update = "worker"``). Replies are unchanged.

The synchronous parts are swapped in after ``ParameterServer.setup`` (on every
rank, servers included), so the strategy's step, serve and close drive them.
Bytes: the pushes carry int64 (2x float32); the exponents are
``8 x tensors`` bytes per server and step, recorded as ``exact_scale``.
"""

from __future__ import annotations

import numpy as np
from hpcdp.failure.deadline import wait
from hpcdp.strategies.ps import transport as tp
from hpcdp.strategies.ps.sync import SyncServerPart, SyncWorkerPart

from .reducers import _Reducer

TAG_SCALE = 111  # worker -> server: the exponents of this push (before TAG_GRAD)


class ExactServerPart(SyncServerPart):
    """Step 2 for one shard, on integers. Built from the part setup made."""

    def __init__(self, base: SyncServerPart, codec, shard_offset: int):
        self.__dict__.update(base.__dict__)  # comm, index, params, workers, optimizer, ledger...
        self.codec, self.lo = codec, int(shard_offset)
        self.sum = np.empty(self.size, dtype=np.int64)
        self.agg = np.empty(self.size, dtype=self.dtype)

    def serve_step(self, local_grad=None, lr=None) -> np.ndarray:
        """``local_grad``: the colocated worker's int64 shard (its exponents are the
        codec's, which that worker set), or None."""
        n_t = self.codec.n_tensors
        ints, scales, reqs = {}, {}, []
        for w in self.remote:
            ints[w] = np.empty(self.size, dtype=np.int64)
            scales[w] = np.empty(n_t, dtype=np.int64)
            reqs.append(self.comm.Irecv(scales[w], source=self.workers[w], tag=TAG_SCALE))
            reqs.append(self.comm.Irecv(ints[w], source=self.workers[w], tag=tp.TAG_GRAD))
        wait(reqs, self.timeout, f"the integer gradients of update {self.updates} (exact PS server "
             f"{self.index})", sources=[self.workers[w] for w in self.remote])
        if self.ledger is not None and self.remote:
            self.ledger.record("ps_push", recv_bytes=self.size * 8 * len(self.remote),
                               recv_msgs=len(self.remote))
            self.ledger.record("exact_scale", recv_bytes=n_t * 8 * len(self.remote),
                               recv_msgs=len(self.remote))
        if self.local_worker is not None:  # the colocated worker's shard; its scale is ours
            ints[self.local_worker], scales[self.local_worker] = local_grad, self.codec.exps
        order = sorted(ints)
        exps = scales[order[0]]
        for w in order[1:]:
            if not np.array_equal(scales[w], exps):
                raise RuntimeError(f"exact PS server {self.index}: workers {order[0]} and {w} pushed "
                                   f"gradients at different scales (update {self.updates}); the "
                                   "per-tensor maxima were not agreed")
        self.sum.fill(0)
        for w in order:
            self.sum += ints[w]  # integers: exact in any order
        self.codec.set_exponents(exps)
        self.codec.decode(self.sum, self.agg, lo=self.lo)
        return self.apply_and_reply(self.agg, lr)


class _IntPush:
    """What SyncWorkerPart.step reads from ``self.flat`` during one exact push: the
    parameters (replies are installed there) and, as the gradient, the int64 sum."""

    def __init__(self, flat, acc):
        self.data, self.grad = flat.data, acc


class ExactWorkerPart(SyncWorkerPart):
    """Steps 1 and 3 on a worker, pushing integers: the synchronous worker's own
    ``step`` (posting, pushing, installing replies) run with the int64 sum standing
    in for ``flat.grad``, after the exponents went to each remote server. ``pending``
    = (int64 sum over this rank's micro-batches, exponents), set by
    :class:`ServerSum` before each step."""

    def __init__(self, base: SyncWorkerPart, local_server):
        self.__dict__.update(base.__dict__)
        self.local_server = local_server
        self.pending = None

    def step(self, lr: float) -> None:
        acc, exps = self.pending
        remote = [s for s in range(len(self.shards)) if s != self.local_s]
        sends = [self.comm.Isend(exps, self.roles.servers[s], TAG_SCALE) for s in remote]
        flat, self.flat = self.flat, _IntPush(self.flat, acc)
        try:
            super().step(lr)  # pushes acc's shards; a colocated server gets its int shard
        finally:
            self.flat = flat
        wait(sends, self.timeout, f"the servers to take the exponents of step {self.steps - 1}",
             sources=[self.roles.servers[s] for s in remote])
        if self.ledger is not None and remote:
            # the base step counted the pushes at the parameters' itemsize; they were int64
            extra = sum(self.shards[s][1] for s in remote) * (8 - flat.data.dtype.itemsize)
            self.ledger.record("ps_push", sent_bytes=extra)
            self.ledger.record("exact_scale", sent_bytes=exps.nbytes * len(remote), sent_msgs=len(remote))
        self.pending = None


def make_exact(strategy, codec) -> None:
    """Swap the synchronous parts of a set-up ParameterServer for integer ones (every
    rank). Async mode and other aggregations are config errors before this."""
    server = strategy.server
    if server is not None:
        if not isinstance(server, SyncServerPart):
            raise RuntimeError("exact mode needs the synchronous parameter server (parallel.ps.mode = 'sync')")
        off, _ = strategy.roles.shard(strategy.flat.numel, server.index)
        strategy.server = ExactServerPart(server, codec, off)
    if strategy.worker is not None:
        strategy.worker = ExactWorkerPart(strategy.worker, strategy.server if strategy.worker.local_server
                                          is not None else None)


class ServerSum(_Reducer):
    """The reducer for ``ps``: the servers sum the integers and update."""

    def __init__(self, strategy, codec):
        if not isinstance(strategy.flat.data, np.ndarray):
            raise RuntimeError("parameter server: host buffers only")
        super().__init__(strategy, codec)
        make_exact(strategy, codec)

    def reduce_and_step(self, acc: np.ndarray) -> None:
        self.strategy.worker.pending = (acc, self.codec.exps)
        self.strategy.step()


__all__ = ["ExactServerPart", "ExactWorkerPart", "ServerSum", "make_exact", "TAG_SCALE"]
