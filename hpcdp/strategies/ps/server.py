"""One server: owns a shard of the flat buffer, applies updates as they complete.

The server keeps a receive posted for every remote worker's next header and gradient,
files each arriving gradient in its :class:`ServerClock`, and as soon as update t is
complete (all W gradients of step t in) it aggregates them in worker order, then

- server-side update: runs the optimizer on its parameter shard (optimizer state
  lives only here, sized to the shard) and sends the new shard to every worker;
- worker-side update: sends the aggregated gradient shard to every worker.

A colocated server shares its rank with a worker: that worker's gradient is handed
over in memory (``push_local``) and the result is delivered in memory (the saved
copy), so the server's link carries W - 1 gradients in and W - 1 results out.
The same code serves synchronous (k = 0) and asynchronous runs: the bound is
enforced by the workers; the server checks it on every gradient.
"""

from __future__ import annotations

import numpy as np

from hpcdp.failure.watch import note_step

from . import transport as tp
from .aggregate import check_result
from .checkpoint import SaveRequests
from .staleness import ServerClock, StalenessError, check_stale_lr, damp_stale


class ShardServer:
    def __init__(self, comm, index: int, offset: int, params: np.ndarray, *, workers, local_worker,
                 bound, aggregate, optimizer, ledger, timeout: float, stale_lr: str = "relative"):
        tp.check_count(params.size)
        self.comm, self.index, self.offset = comm, index, offset
        self.params = params                      # this server's shard (a private copy)
        self.size, self.dtype = params.size, params.dtype
        self.workers = tuple(workers)             # world rank of worker w
        self.local_worker = local_worker          # dp index of the colocated worker, or None
        self.remote = [w for w in range(len(self.workers)) if w != local_worker]
        self.clock = ServerClock(len(self.workers), bound)
        self.aggregate, self.optimizer = aggregate, optimizer
        self.ledger, self.timeout = ledger, timeout
        self.stale_lr = check_stale_lr(stale_lr)
        self.outbox = tp.Outbox()
        self.local_results: list = []            # (update, result) for the colocated worker
        self._hdr: dict = {}
        self._grad: dict = {}
        self.saves = SaveRequests(f"server {index}", self.remote)  # checkpoint requests (dedicated)
        self.on_poll = None  # a dedicated server's loop calls it now and then (e.g. to pass on a signal)
        for w in self.remote:
            self._post(w)

    # -- receiving --------------------------------------------------------
    def _post(self, w: int) -> None:
        self._post_header(w)
        gbuf = np.empty(self.size, dtype=self.dtype)
        self._grad[w] = (self.comm.Irecv(gbuf, source=self.workers[w], tag=tp.TAG_GRAD), gbuf)

    def _post_header(self, w: int) -> None:
        hbuf = np.empty(4, dtype=np.float64)
        self._hdr[w] = (self.comm.Irecv(hbuf, source=self.workers[w], tag=tp.TAG_HEADER), hbuf)

    def poll(self) -> bool:
        """Take every header that has arrived (and its gradient), apply complete
        updates. Returns True if anything happened.

        Drains each worker's stream, not one message per call: a server that fell
        behind (its rank descheduled, or busy in its own worker's forward/backward)
        catches up at its next poll instead of carrying the backlog forever, which
        would add the backlog to every worker's staleness."""
        progressed = False
        for w in list(self._hdr):
            while self._take(w):
                progressed = True
        self.outbox.poll()
        return self._apply_ready() or progressed

    def _take(self, w: int) -> bool:
        """File worker w's next message if it has fully arrived; True if one was taken."""
        if w not in self._hdr:
            return False
        req, hbuf = self._hdr[w]
        if not req.Test():
            return False
        kind, step, version, lr = hbuf
        if kind == tp.DONE:
            del self._hdr[w]                      # nothing more comes from w
            self.clock.finish(w, int(step))
            return True
        if kind == tp.SAVE:                       # no gradient follows; its receive stays posted
            self._post_header(w)
            # the last worker's request saves now, before any later update is applied
            # (update t + 1 needs that worker's next push, which follows its request)
            self.saves.add(w, int(step), int(version), bool(lr), applied=self.clock.version)
            return True
        note_step(int(step) + 1)                  # the push of training step t + 1: a server killed is named there
        greq, gbuf = self._grad[w]
        if not greq.Test():                       # the gradient follows its header; if the
            return False                          # sender has not progressed it yet, look later
        del self._grad[w]
        self._record("ps_push", recv=gbuf.nbytes)
        self.clock.push(w, int(step), int(version), (gbuf, lr))
        self._post(w)
        return True

    def push_local(self, step: int, version: int, grad: np.ndarray, lr: float) -> None:
        """The colocated worker's gradient (a private copy), no message."""
        self.clock.push(self.local_worker, step, version, (grad, lr))
        self._apply_ready()

    def finish_local(self, steps: int) -> None:
        self.clock.finish(self.local_worker, steps)

    # -- applying ---------------------------------------------------------
    def _apply_ready(self) -> bool:
        applied = False
        while self.clock.ready():
            update, payloads = self.clock.pop_ready()
            grads = [g for g, _ in payloads]
            # staleness-aware lr; pop_ready recorded this update's W gradients last
            damp_stale(grads, [a.staleness for a in self.clock.applied[-len(grads):]], self.stale_lr)
            agg = check_result(self.aggregate(grads), self.size, self.dtype,
                               where=f"server {self.index} update {update}")
            if self.optimizer is not None:
                # the lr the workers used for this step; restored after, since the
                # colocated worker shares this optimizer object and may be between
                # setting its lr and reading it (updates are applied from hooks too)
                saved, self.optimizer.lr = self.optimizer.lr, payloads[0][1]
                self.optimizer.step(self.params, agg)
                self.optimizer.lr = saved
                result = self.params.copy()       # the send owns a snapshot
            else:
                result = agg
            for w in self.remote:
                self.outbox.send(self.comm, result, self.workers[w], tp.TAG_REPLY)
                self._record("ps_pull", sent=result.nbytes)
            if self.local_worker is not None:
                self.local_results.append((update, result))
            applied = True
        return applied

    def _record(self, name, sent=0, recv=0):
        if self.ledger is not None:
            self.ledger.record(name, sent_bytes=sent, recv_bytes=recv,
                               sent_msgs=int(sent > 0), recv_msgs=int(recv > 0))

    # -- shutdown ---------------------------------------------------------
    @property
    def finished(self) -> bool:
        """Every worker said done (after its last gradient)."""
        return self.clock.all_done

    def serve_until_done(self) -> None:
        """Dedicated server loop: poll until every worker is done, then close."""
        def waiter():
            return tp.Waiter(self.timeout, f"workers of server {self.index}", missing=self.missing_workers)
        w = waiter()
        while not self.finished:
            if self.on_poll is not None:
                self.on_poll()
            if not self.poll():
                w.idle(self.describe_waiting)
            else:
                w = waiter()
        self.close()

    def missing_workers(self) -> list:
        """World ranks of the workers whose gradient of the next update (or whose done)
        has not arrived: the ones this server waits for."""
        c = self.clock
        return [self.workers[w] for w in range(len(self.workers))
                if c.done_at[w] is None and c.clock[w] <= c.version]

    def describe_waiting(self) -> str:
        c = self.clock
        return (f"server {self.index} at version {c.version}; worker clocks {c.clock}; "
                f"done {[d is not None for d in c.done_at]}")

    def close(self) -> None:
        """All workers done: check nothing was left behind, cancel the gradient
        receives that will never match."""
        if not self.finished:
            raise StalenessError(f"server {self.index} closed before all workers were done")
        self.clock.check_finished()
        tp.cancel_all([r for r, _ in self._grad.values()])
        self._grad.clear()
        # reply sends in flight complete in ParameterServer.close (finish_together)
