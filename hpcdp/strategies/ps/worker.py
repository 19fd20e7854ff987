"""One worker: pushes its gradient shards, pulls results, keeps the staleness bound.

Per step t the worker sends one gradient shard to each server (non-blocking; a
colocated server gets it in memory) and, before it starts step t + 1, waits only as
long as the bound needs: every shard's version must be ``>= t + 1 - k``. Replies
arrive one per update and server, in update order, into a receive kept posted per
server. What "version" means depends on who runs the optimizer:

- server-side update: a reply is a parameter shard; the worker installs the newest
  one it has (older ones are superseded), so the shard's version is that reply's.
- worker-side update: a reply is an aggregated gradient shard; the worker applies
  them in update order with its own optimizer, one full-buffer step once all S shards
  of that update are in, so every shard shares one version (updates applied).

``close`` tells every server it is done, waits for the replies of all its updates
(no message lost), installs the final weights, serves its colocated shard until the
other workers are done too, then cancels the one receive per server still posted.
"""

from __future__ import annotations

from collections import deque

import numpy as np

from . import transport as tp
from .staleness import Recent, StalenessError


class Worker:
    def __init__(self, comm, index: int, flat, *, roles, bound, server_update: bool, optimizer,
                 local_server, ledger, timeout: float):
        self.comm, self.index, self.flat = comm, index, flat
        self.bound, self.server_update = bound, server_update
        self.optimizer, self.local_server = optimizer, local_server
        self.ledger, self.timeout = ledger, timeout
        numel = flat.data.shape[0]
        self.shards = [roles.shard(numel, s) for s in range(roles.num_servers)]
        self.server_ranks = roles.servers
        self.local_s = local_server.index if local_server is not None else None
        self.step_t = 0                                # next step to push
        self.version = [0] * roles.num_servers         # installed version per shard
        self.received = [0] * roles.num_servers        # replies received per shard
        self.newest: list = [None] * roles.num_servers # server-side: newest reply buffer
        self.queue = [deque() for _ in range(roles.num_servers)]  # worker-side replies
        self.lr_of_step: dict = {}                     # worker-side update: lr of each step not yet applied
        self.outbox = tp.Outbox()
        self._reply: dict = {}
        self.pushed_staleness = Recent()               # per step: max over shards of t - v (recent steps)
        self._scratch = np.empty_like(flat.data) if not server_update else None
        for s in range(roles.num_servers):
            if s != self.local_s:
                tp.check_count(self.shards[s][1])
                self._post(s)

    def _post(self, s: int) -> None:
        buf = np.empty(self.shards[s][1], dtype=self.flat.data.dtype)
        self._reply[s] = (self.comm.Irecv(buf, source=self.server_ranks[s], tag=tp.TAG_REPLY), buf)

    # -- one step ---------------------------------------------------------
    def push(self, lr: float) -> None:
        """Send this step's gradient shards (copies: the grad buffer is reused)."""
        t = self.step_t
        grad = self.flat.grad
        if not self.server_update:
            self.lr_of_step[t] = lr  # popped when update t is applied here
        self.pushed_staleness.append(max(t - v for v in self.version))
        for s, (off, size) in enumerate(self.shards):
            piece = np.array(grad[off:off + size], copy=True)
            if s == self.local_s:
                self.local_server.push_local(t, self.version[s], piece, lr)
                continue
            dest = self.server_ranks[s]
            self.outbox.send(self.comm, tp.header(tp.PUSH, t, self.version[s], lr), dest, tp.TAG_HEADER)
            self.outbox.send(self.comm, piece, dest, tp.TAG_GRAD)
            if self.ledger is not None:
                self.ledger.record("ps_push", sent_bytes=piece.nbytes, sent_msgs=1)
        self.step_t = t + 1

    def wait_for(self, min_version: int, what: str) -> None:
        """Poll (serving the colocated shard meanwhile) until every shard's installed
        version is ``>= min_version``; install the newest results available."""
        waiter = tp.Waiter(self.timeout, what, missing=lambda: self.missing_for(min_version))
        while True:
            progressed = self.poll()
            self._install()
            if min(self.version) >= min_version:
                return
            if not progressed:
                waiter.idle(lambda: f"shard versions {self.version}, need {min_version}")

    def missing_for(self, min_version: int) -> list:
        """World ranks this worker waits for to reach ``min_version``: remote servers whose
        reply is missing, and, for its own colocated shard, the workers behind."""
        ranks = [self.server_ranks[s] for s in range(len(self.shards))
                 if self.received[s] < min_version and s != self.local_s]
        if self.local_server is not None and self.received[self.local_s] < min_version:
            ranks += self.local_server.missing_workers()
        return sorted(set(ranks))

    def poll(self) -> bool:
        progressed = False
        if self.local_server is not None:
            progressed = self.local_server.poll()
            for update, result in self.local_server.local_results:
                self._take(self.local_s, update, result)
            self.local_server.local_results.clear()
        for s in list(self._reply):
            req, buf = self._reply[s]
            while req.Test():
                progressed = True
                if self.ledger is not None:
                    self.ledger.record("ps_pull", recv_bytes=buf.nbytes, recv_msgs=1)
                self._take(s, self.received[s], buf)
                self._post(s)
                req, buf = self._reply[s]
        self.outbox.poll()
        return progressed

    def _take(self, s: int, update: int, result) -> None:
        if update != self.received[s]:
            raise StalenessError(f"worker {self.index}: server {s} sent update {update}, "
                                 f"expected {self.received[s]}")
        self.received[s] += 1
        if self.server_update:
            self.newest[s] = result
        else:
            self.queue[s].append(result)

    def _install(self) -> None:
        data = self.flat.data
        if self.server_update:
            for s, (off, size) in enumerate(self.shards):
                if self.received[s] > self.version[s]:
                    data[off:off + size] = self.newest[s]
                    self.newest[s] = None
                    self.version[s] = self.received[s]
            return
        # worker-side: one optimizer step per update, once all shards of it are in
        while all(self.queue):
            u = self.version[0]
            for s, (off, size) in enumerate(self.shards):
                self._scratch[off:off + size] = self.queue[s].popleft()
            saved = self.optimizer.lr
            self.optimizer.lr = self.lr_of_step.pop(u)
            self.optimizer.step(data, self._scratch)
            self.optimizer.lr = saved
            self.version = [u + 1] * len(self.shards)

    def request_save(self, step: int, blocking: bool) -> None:
        """Ask every remote (dedicated) server for a checkpoint of ``step``, after the
        last push (the header stream keeps the order); call after ``wait_for(step_t)``."""
        for s in range(len(self.shards)):
            if s != self.local_s:
                self.outbox.send(self.comm, tp.header(tp.SAVE, step, self.step_t, float(blocking)),
                                 self.server_ranks[s], tp.TAG_HEADER)

    # -- shutdown ---------------------------------------------------------
    def close(self) -> None:
        steps = self.step_t
        for s in range(len(self.shards)):
            if s == self.local_s:
                self.local_server.finish_local(steps)
            else:
                self.outbox.send(self.comm, tp.header(tp.DONE, steps, 0, 0.0),
                                 self.server_ranks[s], tp.TAG_HEADER)
        # every reply of every update (none lost), then the final weights
        self.wait_for(steps, f"the last replies (update {steps - 1}) from every server")
        if self.local_server is not None:
            waiter = tp.Waiter(self.timeout, "the other workers to finish",
                               missing=self.local_server.missing_workers)
            while not self.local_server.finished:
                if not self.poll():
                    waiter.idle(self.local_server.describe_waiting)
            self.local_server.close()
        tp.cancel_all([r for r, _ in self._reply.values()])
        self._reply.clear()
        # gradient sends still in flight complete in ParameterServer.close (finish_together)
