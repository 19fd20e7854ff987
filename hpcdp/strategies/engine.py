"""The bucket engine: one collective per bucket, launched as soon as the bucket's
gradients are final during backward, progressed between backward ops, drained at
the end. DDP and the ZeRO stages share it; the collective is a parameter.

- ``launch(b) -> request``: starts bucket ``b``'s collective (DDP: a ring
  allreduce on the bucket's view of ``flat.grad``; ZeRO: a reduce-scatter) and
  returns a request with ``test()`` / ``wait()``.
- ``on_done(b)`` (optional): called once when bucket ``b``'s request completed
  (ZeRO-2 moves its chunk into the gradient shard and frees the bucket there).

Hook arming: :meth:`attach` registers a grad-ready hook on every parameter. While
armed (:meth:`arm`), a hook marks its parameter ready; buckets whose parameters
are all ready start strictly in plan order (the same sequence of collectives on
every rank), and every hook call also advances (``test()``) every request in
flight, so ring steps run between backward ops on this single thread.

Timing, reset by :meth:`stats`: ``comm_s`` (wall time during which at least one
request was in flight, as observed at test() calls), ``comm_exposed_s`` (time
blocked in :meth:`flush` after backward ended), ``comm_hidden_s = comm_s -
exposed``, ``comm_cpu_s`` (time inside launch/test from the hooks: the CPU price of
overlapping on one thread, already part of backward time), ``buckets_in_backward``.
"""

from __future__ import annotations

import os
import time
from typing import Callable

from hpcdp.strategies.buckets import BucketPlan, ReadyTracker


class BucketEngine:
    def __init__(self, plan: BucketPlan, launch: Callable, *, on_done: Callable | None = None,
                 name: str = "bucket"):
        self.plan, self._launch_fn, self._on_done = plan, launch, on_done
        self.name = name
        self.tracker = ReadyTracker(plan)
        self.armed = False
        self._inflight: list = []   # (bucket index, request)
        self._handles: list = []
        self.launched = 0           # buckets launched since the last flush
        self._reset_timers()

    # -- wiring ------------------------------------------------------------------------
    def attach(self, flat) -> None:
        """A grad-ready hook on every parameter of ``flat`` (layout index order)."""
        self._handles = [flat.params[spec.name].register_grad_ready_hook(self._make_hook(i))
                         for i, spec in enumerate(flat.layout)]

    def _make_hook(self, index: int):
        def hook(_param):
            if self.armed:
                self.on_ready(index)
        return hook

    def arm(self, on: bool = True) -> None:
        """Start a backward in which buckets launch from the hooks (``on``) or not."""
        self.tracker.reset()
        self.armed = on

    # -- during backward -----------------------------------------------------------
    def on_ready(self, index: int) -> None:
        """Parameter ``index``'s gradient is final: launch what became ready, progress."""
        t0 = time.perf_counter()
        for b in self.tracker.mark_ready(index):
            self._launch(b)
            self._early += 1
        self.progress()
        self._cpu_s += time.perf_counter() - t0

    def _launch(self, b: int) -> None:
        req = self._launch_fn(b)
        if not self._inflight:
            self._busy_since = time.perf_counter()
        self._inflight.append((b, req))
        self.launched += 1

    def progress(self) -> None:
        """Advance every request in flight without blocking; finish completed ones."""
        if not self._inflight:
            return
        still = []
        for b, r in self._inflight:
            if r.test():
                if self._on_done is not None:
                    self._on_done(b)
            else:
                still.append((b, r))
        self._inflight = still
        if not still:
            self._comm_s += time.perf_counter() - self._busy_since
            self._busy_since = None

    def drain_to(self, k: int) -> None:
        """Poll until at most ``k`` requests are in flight (bounds the memory held by
        buckets whose collective has not finished yet)."""
        while len(self._inflight) > k:
            oldest = self._inflight[0][1]
            wait_progressing(oldest, self.progress)
            self.progress()

    def drain(self) -> None:
        """Block until every request in flight is done. A request that progresses on
        its own (``progresses_alone``: the compiled engine's progress thread) is
        waited on, oldest first: its ``wait()`` drives it to the end in compiled code
        and raises the diagnosis' CollectiveTimeout after its timeout. Otherwise poll
        every request in flight (busy-wait: the Python ring only moves inside test()
        calls; polling all of them, not waiting on the oldest, keeps every bucket's
        ring moving). If none completes for the request's timeout, the oldest
        request's expire() raises CollectiveTimeout naming the ranks that never
        arrived (the same on every rank) and the time waited."""
        deadline = None
        idle = 0
        while self._inflight:
            oldest = self._inflight[0][1]
            if getattr(oldest, "progresses_alone", False):
                oldest.wait()
                self.progress()
                idle, deadline = 0, None
                continue
            n = len(self._inflight)
            self.progress()
            if len(self._inflight) < n:
                idle, deadline = 0, None  # progress: the timeout counts from here
                continue
            idle += 1
            if idle % 64 == 0:
                os.sched_yield()  # oversubscribed ranks: let the peer run
                now = time.monotonic()
                if deadline is None:
                    deadline = now + float(getattr(self._inflight[0][1], "timeout", 300.0))
                elif now > deadline:
                    self._inflight[0][1].expire()  # raises, naming the ranks

    def flush(self) -> None:
        """Launch the buckets backward did not launch, then block until every bucket
        is done: the step's sync point (its time is the exposed communication).
        Checks that every bucket ran exactly once."""
        self.armed = False
        t0 = time.perf_counter()
        for b in self.tracker.remaining():
            self._launch(b)
        self.drain()
        self._exposed_s += time.perf_counter() - t0
        if self.launched != len(self.plan.buckets):
            raise RuntimeError(f"{self.name}: launched {self.launched} bucket collectives in this "
                               f"backward, expected {len(self.plan.buckets)}")
        self.launched = 0

    # -- figures and shutdown -------------------------------------------------------
    def _reset_timers(self) -> None:
        self._comm_s = 0.0          # union of in-flight intervals
        self._busy_since = None     # when the in-flight set last became non-empty
        self._exposed_s = 0.0
        self._cpu_s = 0.0
        self._early = 0             # buckets launched during backward (from hooks)

    def stats(self) -> dict:
        """This step's timing figures (see the module docstring); resets them."""
        comm_s = self._comm_s
        out = {
            "comm_s": comm_s,
            "comm_exposed_s": min(self._exposed_s, comm_s),
            "comm_hidden_s": max(comm_s - self._exposed_s, 0.0),
            "comm_cpu_s": self._cpu_s,
            "buckets": float(len(self.plan.buckets)),
            "buckets_in_backward": float(self._early),
        }
        self._reset_timers()
        return out

    def close(self) -> None:
        """Finish anything in flight (a step interrupted between backward and flush,
        so no rank leaves messages behind) and remove the hooks."""
        self.armed = False
        self.drain()
        for h in self._handles:
            h.remove()
        self._handles = []

    def abandon(self) -> None:
        """The job is failing: forget the requests in flight without waiting (their
        peers may be dead or stuck: draining would add a full timeout) and remove the
        hooks. close() is then a no-op."""
        self.armed = False
        self._inflight = []
        self._busy_since = None
        for h in self._handles:
            h.remove()
        self._handles = []


def wait_progressing(req, progress) -> None:
    """Block until ``req`` completes, calling ``progress()`` (other requests in flight,
    e.g. the engine's) while polling, so nothing in flight starves on this single
    thread. If ``req`` makes no progress for its timeout, its wait() raises
    CollectiveTimeout naming the ranks that never arrived.

    A request that progresses on its own (``progresses_alone``: the compiled
    engine's progress thread advances it and everything in flight before it) is
    waited on instead: its wait() drives it in compiled code, with no test() loop
    competing with the progress thread for the request and the GIL."""
    if getattr(req, "progresses_alone", False):
        req.wait()
        progress()
        return
    polls, deadline = 0, None
    while not req.test():
        progress()
        polls += 1
        if polls % 64 == 0:
            os.sched_yield()  # oversubscribed ranks: let the peer run
            now = time.monotonic()
            if deadline is None:
                deadline = now + float(getattr(req, "timeout", 300.0) or 300.0)
            elif now > deadline:
                req.wait(timeout=1e-3)  # raises, naming the ranks


def ledger_bytes(ledger, snap, grad_prefixes=("allreduce",)) -> tuple[dict, object]:
    """Bytes moved since ``snap`` (a ledger snapshot): ``bytes_sent/recv`` over every
    collective, ``grad_bytes_sent/recv`` over those whose name starts with one of
    ``grad_prefixes``. Returns (figures, new snapshot)."""
    sent = recv = gsent = grecv = 0
    delta = ledger.delta(snap) if ledger is not None else {}
    for name, d in delta.items():
        sent += d["sent_bytes"]
        recv += d["recv_bytes"]
        if name.startswith(tuple(grad_prefixes)):
            gsent += d["sent_bytes"]
            grecv += d["recv_bytes"]
    return ({"bytes_sent": float(sent), "bytes_recv": float(recv),
             "grad_bytes_sent": float(gsent), "grad_bytes_recv": float(grecv)},
            ledger.snapshot() if ledger is not None else None)


__all__ = ["BucketEngine", "ledger_bytes", "wait_progressing"]
