"""Synchronous parameter server: a step completes when every worker's gradient is in.

The plain blocking protocol, kept apart from the asynchronous engine (worker.py,
server.py) on purpose: it is the reference the asynchronous engine with k = 0 must
reproduce bit for bit. Per step, on every rank:

1. a worker sends (header, gradient shard) to each remote server (non-blocking);
2. a server receives the W gradients of its shard (its own colocated one in memory),
   aggregates them in worker order, runs the optimizer on its shard (server-side
   update) and sends the result (new parameters, or the aggregated gradient for
   worker-side update) to every remote worker;
3. a worker receives one result per server and installs it (or applies the
   aggregated gradient with its own optimizer).

A dedicated server runs step 2 in a loop until every worker sends DONE.

With a gradient codec (``codec``, set by ``ParameterServer.set_grad_codec``; exact
mode's integers) a push is ``codec.header()`` followed by the worker's payload shard
(the codec's dtype), and the server sums the W pushes with ``codec.aggregate``
instead of its aggregation; replies are unchanged.

Every wait polls with a deadline (``timeout``, comm.timeout in ``hpcdp train``) and
names the ranks whose message never came (:func:`hpcdp.failure.deadline.wait`).
"""

from __future__ import annotations

import numpy as np

from hpcdp.failure.deadline import wait

from . import transport as tp
from .aggregate import check_result
from .checkpoint import SaveRequests


NAMES = {tp.PUSH: "a gradient", tp.DONE: "done", tp.SAVE: "a checkpoint request"}


class SyncServerPart:
    """Step 2 for one shard."""

    def __init__(self, comm, index, params, *, workers, local_worker, aggregate, optimizer, ledger,
                 timeout: float = 300.0):
        self.comm, self.index, self.params, self.timeout = comm, index, params, timeout
        self.size, self.dtype = params.size, params.dtype
        self.workers, self.local_worker = tuple(workers), local_worker
        self.remote = [w for w in range(len(self.workers)) if w != local_worker]
        self.aggregate, self.optimizer, self.ledger = aggregate, optimizer, ledger
        self.updates = 0
        self.codec, self.offset = None, 0   # a gradient codec, and this shard's flat offset
        self.saves = SaveRequests(f"sync PS server {index}", self.remote)  # checkpoints (dedicated)
        self.on_poll = None  # a dedicated server's loop calls it after each update (e.g. to pass on a signal)

    def receive_headers(self) -> tuple[bool, float]:
        """Blocking: one header per remote worker. Returns (all done?, lr). A step
        boundary where every worker asks for a checkpoint (SAVE) saves and waits for
        the next headers."""
        while True:
            done, lr, heads = self._headers()
            if heads is None:
                return done, lr
            for w, h in heads.items():
                self.saves.add(w, int(h[1]), int(h[2]), bool(h[3]), applied=self.updates)

    def _headers(self):
        kinds, lr = set(), 0.0
        heads = {w: np.empty(4, dtype=np.float64) for w in self.remote}
        ranks = [self.workers[w] for w in self.remote]
        wait([self.comm.Irecv(heads[w], source=self.workers[w], tag=tp.TAG_HEADER) for w in self.remote],
             self.timeout, f"the workers' step {self.updates} (sync PS server {self.index})", sources=ranks)
        for w in self.remote:
            h = heads[w]
            kinds.add(h[0])
            if h[0] == tp.DONE and int(h[1]) != self.updates:
                raise RuntimeError(f"sync PS server {self.index}: worker {w} finished after "
                                   f"{int(h[1])} steps, the server applied {self.updates}")
            lr = h[3]
        if len(kinds) > 1:
            raise RuntimeError(f"sync PS server {self.index}: at update {self.updates} the workers sent "
                               f"different messages ({' / '.join(NAMES[k] for k in sorted(kinds))}): they ran "
                               "different numbers of steps or saved at different steps")
        if kinds == {tp.SAVE}:
            return False, lr, heads
        return kinds == {tp.DONE}, lr, None

    def serve_step(self, local_grad=None, lr=None) -> np.ndarray:
        """Receive, aggregate, update, send; returns the result for the local worker."""
        codec = self.codec
        dtype, n = (self.dtype, self.size) if codec is None else (codec.payload_dtype,
                                                                  codec.header_size + self.size)
        grads: list = [None] * len(self.workers)
        reqs = []
        for w in self.remote:
            grads[w] = np.empty(n, dtype=dtype)
            reqs.append(self.comm.Irecv(grads[w], source=self.workers[w], tag=tp.TAG_GRAD))
        ranks = [self.workers[w] for w in self.remote]
        wait(reqs, self.timeout, f"the gradients of update {self.updates} (sync PS server {self.index})",
             sources=ranks)
        if self.ledger is not None and self.remote:
            self.ledger.record("ps_push", recv_bytes=n * np.dtype(dtype).itemsize * len(self.remote),
                               recv_msgs=len(self.remote))
        if self.local_worker is not None:
            grads[self.local_worker] = local_grad
        if codec is not None:  # the codec's sum (exact mode: integers, decoded once)
            try:
                agg = codec.aggregate(grads, self.offset, self.dtype)
            except ValueError as e:
                raise RuntimeError(f"sync PS server {self.index}, update {self.updates}: {e}") from None
        else:
            agg = check_result(self.aggregate(grads), self.size, self.dtype,
                               where=f"server {self.index} update {self.updates}")
        return self.apply_and_reply(agg, lr)

    def apply_and_reply(self, agg, lr) -> np.ndarray:
        """Update the shard with the aggregated gradient (or pass it on), reply to the
        remote workers; returns the result for the local worker."""
        if self.optimizer is not None:
            self.optimizer.lr = lr
            self.optimizer.step(self.params, agg)
            result = self.params
        else:
            result = agg
        # Blocking sends: a worker posts its receives before waiting on anything.
        sends = [self.comm.Isend(result, dest=self.workers[w], tag=tp.TAG_REPLY) for w in self.remote]
        wait(sends, self.timeout, f"the workers to take update {self.updates}",
             sources=[self.workers[w] for w in self.remote])
        if self.ledger is not None and self.remote:
            self.ledger.record("ps_pull", sent_bytes=result.nbytes * len(self.remote),
                               sent_msgs=len(self.remote))
        self.updates += 1
        return result

    def serve_until_done(self) -> None:
        while True:
            if self.on_poll is not None:
                self.on_poll()
            done, lr = self.receive_headers()
            if done:
                return
            self.serve_step(lr=lr)


class SyncWorkerPart:
    """Steps 1 and 3 on a worker (with step 2 for its colocated shard in between)."""

    def __init__(self, comm, index, flat, *, roles, server_update, optimizer, local_server, ledger,
                 timeout: float = 300.0):
        self.comm, self.index, self.flat, self.timeout = comm, index, flat, timeout
        self.roles, self.server_update = roles, server_update
        self.optimizer, self.local_server, self.ledger = optimizer, local_server, ledger
        numel = flat.data.shape[0]
        self.shards = [roles.shard(numel, s) for s in range(roles.num_servers)]
        self.local_s = local_server.index if local_server is not None else None
        self.steps = 0
        self._agg = np.empty_like(flat.data) if not server_update else None
        self.codec = self.payload = None  # a gradient codec and this step's payload (set_grad_codec)

    def _push_of(self, s: int) -> np.ndarray:
        """What goes to server ``s``: the gradient shard, or the codec's header and payload shard."""
        off, size = self.shards[s]
        if self.codec is None:
            return self.flat.grad[off:off + size]
        return np.concatenate([self.codec.header(), self.payload[off:off + size]])

    def step(self, lr: float) -> None:
        data = self.flat.data
        dtype = data.dtype
        # post the result receives first, then push (no ordering deadlock)
        recvs, bufs, remote = [], {}, []
        for s, (off, size) in enumerate(self.shards):
            if s == self.local_s:
                continue
            bufs[s] = np.empty(size, dtype=dtype)
            recvs.append(self.comm.Irecv(bufs[s], source=self.roles.servers[s], tag=tp.TAG_REPLY))
            remote.append(self.roles.servers[s])
        sends = []
        for s, (off, size) in enumerate(self.shards):
            if s == self.local_s:
                continue
            dest = self.roles.servers[s]
            sends.append(self.comm.Isend(tp.header(tp.PUSH, self.steps, self.steps, lr), dest, tp.TAG_HEADER))
            push = self._push_of(s)
            sends.append(self.comm.Isend(push, dest, tp.TAG_GRAD))
            if self.ledger is not None:
                self.ledger.record("ps_push", sent_bytes=push.nbytes, sent_msgs=1)
        if self.local_server is not None:
            self.local_server.receive_headers()
            bufs[self.local_s] = self.local_server.serve_step(np.array(self._push_of(self.local_s)), lr)
        wait(recvs, self.timeout, f"the servers' results of step {self.steps}", sources=remote)
        wait(sends, self.timeout, f"the servers to take step {self.steps}'s gradients",
             sources=[r for r in remote for _ in range(2)])
        if self.ledger is not None:
            for s in bufs:
                if s != self.local_s:
                    self.ledger.record("ps_pull", recv_bytes=bufs[s].nbytes, recv_msgs=1)
        target = data if self.server_update else self._agg
        for s, (off, size) in enumerate(self.shards):
            target[off:off + size] = bufs[s]
        if not self.server_update:
            self.optimizer.step(data, self._agg)
        self.steps += 1

    def request_save(self, step: int, blocking: bool) -> None:
        """Ask every remote (dedicated) server for a checkpoint of ``step``
        (``blocking``: a synchronous save, e.g. on a stop signal)."""
        dests = [self.roles.servers[s] for s in range(len(self.shards)) if s != self.local_s]
        sends = [self.comm.Isend(tp.header(tp.SAVE, step, self.steps, float(blocking)), d, tp.TAG_HEADER)
                 for d in dests]
        wait(sends, self.timeout, f"the servers to take the checkpoint request of step {step}", sources=dests)

    def close(self) -> None:
        dests = [self.roles.servers[s] for s in range(len(self.shards)) if s != self.local_s]
        sends = [self.comm.Isend(tp.header(tp.DONE, self.steps, 0, 0.0), d, tp.TAG_HEADER) for d in dests]
        if self.local_server is not None:
            done, _ = self.local_server.receive_headers()
            if not done and self.local_server.remote:
                raise RuntimeError("sync PS: a worker pushed after this colocated server's worker finished")
        wait(sends, self.timeout, "the servers to take this worker's done", sources=dests)
