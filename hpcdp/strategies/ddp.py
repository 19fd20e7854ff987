"""Distributed data parallel: full replicas, gradients summed by ring allreduce.

Every rank holds the whole model, computes gradients on its slice of the global batch
(the loss is pre-scaled by ``local_samples / global_samples``, so the SUM over ranks is
the gradient of the global mean loss, also for a short last batch), and the gradient
buffer is allreduced (op = sum) so every replica applies the same update.

Three ways to move the gradients (for comparison, see docs/ddp.md):

- ``bucketing = "size"``, ``overlap = true`` (default): the flat grad buffer is cut into
  buckets of ``bucket_mb`` MiB from its end (reverse order of use, see buckets.py). During
  the LAST micro-batch's backward, the grad-ready hook of each parameter marks it ready;
  a bucket's non-blocking ring allreduce starts as soon as all its parameters are ready
  (buckets start in plan order on every rank), and every hook call also advances
  (``test()``) all allreduces in flight, so the ring steps run between backward ops.
- ``bucketing = "per_param"``: one allreduce per parameter (no bucketing).
- ``overlap = false``: nothing starts during backward; all buckets start when backward
  has ended (``finish_gradients``), i.e. communication is fully exposed.

Each bucket is reduced IN PLACE on its view of ``flat.grad``: no copies.

Per-step figures (``step_stats``): bytes sent / received (ledger delta), ``comm_s``
(wall time during which at least one allreduce was in flight, as observed at test()
calls), ``comm_exposed_s`` (time blocked in ``finish_gradients`` after backward ended),
``comm_hidden_s = comm_s - comm_exposed_s`` (in flight while backward still ran) and
``comm_cpu_s`` (time spent inside launch/test calls from the hooks: the CPU price of
overlapping on a single thread, already part of backward time).
"""

from __future__ import annotations

import hashlib
import os
import time
from dataclasses import dataclass

import numpy as np

from hpcdp.config import ConfigError, register_parallel_config
from hpcdp.strategies.base import Strategy
from hpcdp.strategies.buckets import (
    MIB, ReadyTracker, bucket_cap_elements, plan_buckets,
)


# hpcdp.comm.auto's names; repeated here so parsing a config does not initialise MPI.
ALLREDUCE_ALGORITHMS = ("ring", "auto", "recursive", "native")


@register_parallel_config("ddp")
@dataclass
class DDPConfig:
    """``[parallel.ddp]`` options."""

    bucket_mb: float = 25.0       # MiB per gradient bucket (like the common frameworks)
    bucketing: str = "size"       # "size": buckets of bucket_mb; "per_param": one per parameter
    overlap: bool = True          # start allreduces during backward (false: after it)
    init: str = "verify"          # before step 1: "verify" replicas are identical, or
    #                               "broadcast" rank 0's parameters (then verify)
    check_every: int = 0          # compare a parameter hash across ranks every K steps (0: off)
    algorithm: str = "ring"       # allreduce algorithm of hpcdp.comm ("ring", "auto", ...)

    def __post_init__(self):
        s = "parallel.ddp"
        if self.algorithm not in ALLREDUCE_ALGORITHMS:
            raise ConfigError(f"{s}.algorithm: {self.algorithm!r} is not allowed; choose one of "
                              + ", ".join(repr(a) for a in ALLREDUCE_ALGORITHMS))
        if not self.bucket_mb > 0:
            raise ConfigError(
                f"{s}.bucket_mb: {self.bucket_mb!r} is out of range; a bucket must be > 0 MiB "
                f"(use {s}.bucketing = \"per_param\" for one bucket per parameter)")
        if self.bucketing not in ("size", "per_param"):
            raise ConfigError(f"{s}.bucketing: {self.bucketing!r} is not allowed; choose one of "
                              "'size', 'per_param'")
        if self.init not in ("verify", "broadcast"):
            raise ConfigError(f"{s}.init: {self.init!r} is not allowed; choose one of "
                              "'verify', 'broadcast'")
        if self.check_every < 0:
            raise ConfigError(f"{s}.check_every: {self.check_every} is out of range; allowed "
                              "[0, inf) (0 switches the replica check off)")


class ReplicaMismatch(RuntimeError):
    """Parameters differ across ranks (raised on every rank, naming the groups)."""


def _fmt_ranks(ranks) -> str:
    return "rank " + str(ranks[0]) if len(ranks) == 1 else "ranks " + ", ".join(map(str, ranks))


class DDP(Strategy):
    name = "ddp"

    def __init__(self, options: DDPConfig | None = None, *, timeout: float | None = None,
                 debug: bool = False):
        self.cfg = options if options is not None else DDPConfig()
        self.timeout = timeout      # seconds a collective may wait for peers (None: comm's)
        self.debug = debug          # comm's fingerprint check before every collective
        self.flat = None
        self._handles = []

    # -- setup ---------------------------------------------------------------------
    def setup(self, flat, optimizer, world) -> None:
        from hpcdp import comm as hcomm

        self._hcomm = hcomm
        self.flat, self.optimizer, self.world = flat, optimizer, world
        self.comm = world.comm
        self.ledger = world.ledger
        self.dp_rank, self.dp_size = world.rank, world.size
        self.is_worker = True

        itemsize = np.dtype(flat.dtype).itemsize
        cap = None if self.cfg.bucketing == "per_param" else bucket_cap_elements(
            self.cfg.bucket_mb, itemsize)
        self.plan = plan_buckets(flat.layout, cap)
        self.tracker = ReadyTracker(self.plan)
        # In-place views of the grad buffer, one per bucket: the allreduce works on these.
        self._views = [flat.grad[b.offset:b.offset + b.size] for b in self.plan.buckets]

        if world.size > 1:
            if self.debug:
                hcomm.set_debug(self.comm, True)
            if self.cfg.init == "broadcast":
                self._broadcast_params()
            self.check_replicas("before step 1")

        self._handles = [flat.params[spec.name].register_grad_ready_hook(self._make_hook(i))
                         for i, spec in enumerate(flat.layout)]

        self._armed = False
        self._inflight: list = []       # (bucket index, request)
        self.launched = 0
        self._steps = 0
        self._reset_timers()
        self._snap = self.ledger.snapshot() if self.ledger is not None else None

    def _make_hook(self, index: int):
        def hook(_param):
            if self._armed:
                self._on_ready(index)
        return hook

    def _reset_timers(self) -> None:
        self._comm_s = 0.0          # union of in-flight intervals
        self._busy_since = None     # when the in-flight set last became non-empty
        self._exposed_s = 0.0
        self._cpu_s = 0.0
        self._early = 0             # buckets launched during backward (from hooks)

    # -- backward --------------------------------------------------------------------
    def begin_backward(self, last_micro: bool = True) -> None:
        # Micro-batches before the last only accumulate into flat.grad: no communication.
        if last_micro:
            self.tracker.reset()
            self._armed = self.cfg.overlap and self.world.size > 1

    def _on_ready(self, index: int) -> None:
        t0 = time.perf_counter()
        for b in self.tracker.mark_ready(index):
            self._launch(b)
            self._early += 1
        self._progress()
        self._cpu_s += time.perf_counter() - t0

    def _launch(self, b: int) -> None:
        req = self._hcomm.iallreduce(self._views[b], comm=self.comm, op="sum",
                                     algorithm=self.cfg.algorithm, ledger=self.ledger,
                                     timeout=self.timeout)
        if not self._inflight:
            self._busy_since = time.perf_counter()
        self._inflight.append((b, req))
        self.launched += 1

    def _progress(self) -> None:
        """Advance every allreduce in flight without blocking; drop finished ones."""
        if not self._inflight:
            return
        self._inflight = [(b, r) for b, r in self._inflight if not r.test()]
        if not self._inflight:
            self._comm_s += time.perf_counter() - self._busy_since
            self._busy_since = None

    def _drain(self) -> None:
        """Poll every allreduce in flight until all are done (busy-wait: the ring only
        moves inside test() calls). Polling all of them, not waiting on the oldest,
        keeps every bucket's ring moving. If no bucket completes for comm's timeout,
        the oldest request's wait() raises CollectiveTimeout naming the ranks that
        never arrived."""
        deadline = None
        idle = 0
        while self._inflight:
            n = len(self._inflight)
            self._progress()
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
                    self._inflight[0][1].wait(timeout=1e-3)  # raises, naming the ranks

    def finish_gradients(self) -> None:
        """Start the buckets backward did not start, then block until all are reduced.

        This is the step's sync point: the time spent here is the exposed communication.
        """
        self._armed = False
        if self.world.size == 1:
            return
        t0 = time.perf_counter()
        for b in self.tracker.remaining():
            self._launch(b)
        self._drain()
        self._exposed_s += time.perf_counter() - t0
        if self.launched != len(self.plan.buckets):
            raise RuntimeError(f"DDP launched {self.launched} bucket allreduces in this step, "
                               f"expected {len(self.plan.buckets)}")
        self.launched = 0

    # -- optimizer ------------------------------------------------------------------
    def step(self) -> None:
        self.optimizer.step(self.flat.data, self.flat.grad)
        self._steps += 1
        k = self.cfg.check_every
        if k and self._steps % k == 0:
            self.check_replicas(f"after step {self._steps}")

    def step_stats(self) -> dict:
        comm_s = self._comm_s
        out = {
            "comm_s": comm_s,
            "comm_exposed_s": min(self._exposed_s, comm_s),
            "comm_hidden_s": max(comm_s - self._exposed_s, 0.0),
            "comm_cpu_s": self._cpu_s,
            "buckets": float(len(self.plan.buckets)),
            "buckets_in_backward": float(self._early),
        }
        sent = recv = gsent = grecv = 0
        if self.ledger is not None:
            delta = self.ledger.delta(self._snap)
            self._snap = self.ledger.snapshot()
            for name, d in delta.items():
                sent += d["sent_bytes"]
                recv += d["recv_bytes"]
                if name.startswith("allreduce"):
                    gsent += d["sent_bytes"]
                    grecv += d["recv_bytes"]
        out.update(bytes_sent=float(sent), bytes_recv=float(recv),
                   grad_bytes_sent=float(gsent), grad_bytes_recv=float(grecv))
        self._reset_timers()
        return out

    def close(self) -> None:
        """Finish anything still in flight (a step interrupted between backward and
        finish_gradients) so no rank leaves messages behind."""
        self._armed = False
        self._drain()
        for h in self._handles:
            h.remove()
        self._handles = []

    def _broadcast_params(self) -> None:
        """Copy rank 0's parameters to every rank (MPI_Bcast: one call at setup, not
        a per-step cost). Recorded in the ledger as the bytes handed to MPI."""
        data = self.flat.data
        host = data if isinstance(data, np.ndarray) else self.flat.backend.to_numpy(data)
        self.comm.Bcast(host, root=0)
        if host is not data:
            self.flat.backend.copy_(data, self.flat.backend.asarray(host, self.flat.dtype))
        if self.ledger is not None:
            root = self.world.rank == 0
            self.ledger.record("broadcast", sent_bytes=host.nbytes if root else 0,
                               recv_bytes=0 if root else host.nbytes,
                               sent_msgs=int(root), recv_msgs=int(not root), calls=1)

    # -- replica check ---------------------------------------------------------------
    def param_hash(self) -> int:
        """64-bit digest of this rank's parameter bytes (a full pass over the model)."""
        data = self.flat.data
        host = data if isinstance(data, np.ndarray) else self.flat.backend.to_numpy(data)
        return int.from_bytes(hashlib.blake2b(np.ascontiguousarray(host).view(np.uint8),
                                              digest_size=8).digest(), "little")

    def check_replicas(self, when: str) -> None:
        """Compare (numel, hash) across ranks; raise ReplicaMismatch on EVERY rank if any
        differ, naming the groups of ranks that agree. A sync point (small allgather)."""
        if self.world.size == 1:
            return
        mine = np.array([self.flat.numel, self.param_hash()], dtype=np.uint64)
        every = np.zeros((self.world.size, 2), dtype=np.uint64)
        self.comm.Allgather(mine, every)
        groups: dict[tuple, list[int]] = {}
        for r in range(self.world.size):
            groups.setdefault((int(every[r, 0]), int(every[r, 1])), []).append(r)
        if len(groups) == 1:
            return
        parts = [f"{_fmt_ranks(rs)}: {n} parameters, hash {h:016x}"
                 for (n, h), rs in sorted(groups.items(), key=lambda kv: kv[1][0])]
        hint = ("build the model from the same seed on every rank, or set "
                "parallel.ddp.init = \"broadcast\" to copy rank 0's parameters"
                if when == "before step 1" else
                "the replicas diverged: some rank applied a different update")
        raise ReplicaMismatch(f"DDP replica check {when}: parameters differ across ranks ("
                              + "; ".join(parts) + f"); {hint}")


def expected_step_bytes(plan, world_size: int, rank: int, itemsize: int) -> tuple[int, int]:
    """Gradient bytes (sent, received) of one DDP step on ``rank`` with ring allreduce:
    the sum over buckets of :func:`hpcdp.comm.volume.ring_allreduce_bytes`."""
    from hpcdp.comm.volume import ring_allreduce_bytes

    sent = recv = 0
    for b in plan.buckets:
        s, r = ring_allreduce_bytes(b.size, world_size, rank, itemsize)
        sent, recv = sent + s, recv + r
    return sent, recv


def build(parallel_cfg, world=None, comm_cfg=None) -> DDP:
    """Construct from a ParallelConfig (its ``[parallel.ddp]`` options) and the
    ``[comm]`` section (timeout, debug)."""
    opts = parallel_cfg.sub("ddp") if hasattr(parallel_cfg, "sub") else None
    kw = {}
    if comm_cfg is not None:
        kw["timeout"] = getattr(comm_cfg, "timeout", None)
        kw["debug"] = bool(getattr(comm_cfg, "debug", False))
    return DDP(opts, **kw)


__all__ = ["DDP", "DDPConfig", "ReplicaMismatch", "build", "expected_step_bytes", "MIB"]
