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
``comm_dtype = "float16" | "bfloat16"``: the allreduce's messages are 16-bit, the
sums float32 (hpcdp.comm.engines.wire); every replica gets the same rounded gradient.

The hooks, launch-when-ready, progress and drain are the bucket engine
(engine.py), shared with ZeRO; DDP gives it the collective (``iallreduce``).

Per-step figures (``step_stats``): bytes sent / received (ledger delta) and the
engine's timing: ``comm_s`` (wall time during which at least one allreduce was in
flight), ``comm_exposed_s`` (time blocked in ``finish_gradients`` after backward
ended), ``comm_hidden_s`` (in flight while backward still ran) and ``comm_cpu_s``
(time inside launch/test calls from the hooks, already part of backward time).
"""

from __future__ import annotations

import hashlib

import numpy as np

from hpcdp.config_parallel import DDPConfig
from hpcdp.io.protocol import ReplicatedCheckpoint
from hpcdp.strategies.base import Strategy
from hpcdp.strategies.buckets import MIB, bucket_cap_elements, plan_buckets
from hpcdp.strategies.engine import BucketEngine, ledger_bytes


class ReplicaMismatch(RuntimeError):
    """Parameters differ across ranks (raised on every rank, naming the groups)."""


def _fmt_ranks(ranks) -> str:
    return "rank " + str(ranks[0]) if len(ranks) == 1 else "ranks " + ", ".join(map(str, ranks))


class DDP(ReplicatedCheckpoint, Strategy):
    name = "ddp"

    def __init__(self, options: DDPConfig | None = None, *, timeout: float | None = None,
                 debug: bool = False):
        self.cfg = options if options is not None else DDPConfig()
        self.timeout = timeout      # seconds a collective may wait for peers (None: comm's)
        self.debug = debug          # comm's fingerprint check before every collective
        self.flat = None
        self.engine = None

    def setup(self, flat, optimizer, world) -> None:
        from hpcdp import comm as hcomm

        self.flat, self.optimizer, self.world = flat, optimizer, world
        self.comm, self.ledger = world.comm, world.ledger
        self.dp_rank, self.dp_size = world.rank, world.size
        self.is_worker = True
        cap = None if self.cfg.bucketing == "per_param" else bucket_cap_elements(
            self.cfg.bucket_mb, np.dtype(flat.dtype).itemsize)
        self.plan = plan_buckets(flat.layout, cap)
        # In-place views of the grad buffer, one per bucket: the allreduce works on these
        # (with a gradient codec: on views of its payload, set_grad_codec).
        self._views = [flat.grad[b.offset:b.offset + b.size] for b in self.plan.buckets]
        self._hcomm = hcomm
        self.engine = BucketEngine(self.plan, self._launch, name="DDP")
        if world.size > 1:
            if self.debug:
                hcomm.set_debug(self.comm, True)
            if self.cfg.init == "broadcast":
                self._broadcast_params()
            self.check_replicas("before step 1")
        self.engine.attach(flat)
        self._steps = 0
        self._snap = self.ledger.snapshot() if self.ledger is not None else None

    def _launch(self, b: int):
        if self.grad_codec is not None:  # this bucket's part of the last micro-batch, encoded now
            bk = self.plan.buckets[b]
            if self._encode_at_launch:
                self._payload.fold(bk.offset, bk.size)
        # overlap: the buckets run while backward computes ("auto" then takes an algorithm
        # that progresses on its own: the compiled ring; hpcdp.comm.select)
        return self._hcomm.iallreduce(self._views[b], comm=self.comm, op="sum", algorithm=self.cfg.algorithm,
                                      ledger=self.ledger, timeout=self.timeout, wire=self.cfg.comm_dtype,
                                      overlap=True)

    # -- the gradient codec (hpcdp/strategies/codec.py) ------------------------------
    def set_grad_codec(self, codec) -> None:
        """Each micro-batch's gradient is encoded on its own into one payload buffer;
        the bucket allreduces carry the payload (the last micro-batch's buckets are
        encoded at their launch, from the grad-ready hooks when the gradient is on
        the host), and after ``codec.finish()`` it is decoded into ``flat.grad``."""
        from hpcdp.strategies.codec import FullGradPayload

        self.grad_codec = codec
        self._payload = FullGradPayload(self.flat, codec)
        self._views = [self._payload.view(b.offset, b.size) for b in self.plan.buckets]
        self._encode_at_launch = False

    def zero_grad(self) -> None:
        self.flat.zero_grad()
        if self.grad_codec is not None:
            self._payload.zero()

    @property
    def launched(self) -> int:
        """Buckets launched in the current backward (tests watch it)."""
        return self.engine.launched if self.engine is not None else 0

    def begin_backward(self, last_micro: bool = True) -> None:
        # Micro-batches before the last only accumulate into flat.grad: no communication.
        # (A codec: each micro-batch's gradient is encoded alone, the previous one now.)
        overlap = self.cfg.overlap and self.world.size > 1
        if self.grad_codec is not None:
            self._payload.begin_micro()
            overlap = overlap and self._payload.on_host
            self._encode_at_launch = last_micro and overlap
        if last_micro:
            self.engine.arm(overlap)

    def finish_gradients(self) -> bool | None:
        """Start the buckets backward did not start, then block until all are reduced.
        This is the step's sync point: the time spent here is the exposed communication.
        With a codec: False if it rejected this pass set (train_step runs it again)."""
        codec = self.grad_codec
        if codec is not None and not self._encode_at_launch:
            self._payload.fold()  # the last micro-batch, whole: its buckets were not hooked
        if self.world.size == 1:
            self.engine.armed = False
        else:
            self.engine.flush()
        if codec is None:
            return None
        self._encode_at_launch = False
        ok = codec.finish()
        if ok:
            self._payload.decode_into_grad()
        return ok

    def step(self) -> None:
        self.clip_gradients([self.flat.grad])  # a replica holds the whole reduced gradient
        self.optimizer.step(self.flat.data, self.flat.grad)
        self._steps += 1
        k = self.cfg.check_every
        if k and self._steps % k == 0:
            self.check_replicas(f"after step {self._steps}")

    def step_stats(self) -> dict:
        out = self.engine.stats()
        figures, self._snap = ledger_bytes(self.ledger, self._snap, ("allreduce",))
        out.update(figures)
        out.update(self.clip_stats())
        return out

    def close(self) -> None:
        """Finish anything still in flight (a step interrupted between backward and
        finish_gradients) so no rank leaves messages behind."""
        if self.engine is not None:
            self.engine.close()
            self.engine = None  # it holds a closure over self: no cycle left behind

    def abandon(self) -> None:
        """The job is failing: drop the allreduces in flight without waiting for peers
        (they may be dead or stuck), remove the hooks. close() is then a no-op."""
        if self.engine is not None:
            self.engine.abandon()

    def rejoin(self, world) -> None:
        """After a repair (failure.on_rank_loss = "continue", hpcdp.failure.ulfm): the
        survivors' world replaces the old one; the requests in flight are dropped and
        the bucket engine starts afresh on the new communicator. The caller has already
        made every replica equal."""
        self.abandon()
        self.world, self.comm = world, world.comm
        self.dp_rank, self.dp_size = world.rank, world.size
        self.engine = BucketEngine(self.plan, self._launch, name="DDP")
        self.engine.attach(self.flat)

    def _broadcast_params(self) -> None:
        """Copy rank 0's parameters to every rank (hpcdp.comm.broadcast: MPI's Ibcast with
        a deadline; one call at setup, not a per-step cost). The ledger records the bytes
        handed to MPI (``broadcast``)."""
        data = self.flat.data
        host = data if isinstance(data, np.ndarray) else self.flat.backend.to_numpy(data)
        self._hcomm.broadcast(host, comm=self.comm, root=0, ledger=self.ledger,
                              timeout=self._timeout())
        if host is not data:
            self.flat.backend.copy_(data, self.flat.backend.asarray(host, self.flat.dtype))

    def _timeout(self) -> float:
        from hpcdp.comm import get_context
        return get_context(self.comm).timeout if self.timeout is None else self.timeout

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
        every = np.zeros((self.world.size, 2), dtype=np.uint64)
        every[self.world.rank] = (self.flat.numel, self.param_hash())
        from hpcdp.comm import all_gather
        all_gather(every.reshape(-1), comm=self.comm, timeout=self._timeout())  # in place
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


def build(parallel_cfg, world=None, comm_cfg=None) -> DDP:
    """Construct from a ParallelConfig (its ``[parallel.ddp]`` options) and the
    ``[comm]`` section (timeout, debug)."""
    opts = parallel_cfg.sub("ddp") if hasattr(parallel_cfg, "sub") else None
    kw = {}
    if comm_cfg is not None:
        kw["timeout"] = getattr(comm_cfg, "timeout", None)
        kw["debug"] = bool(getattr(comm_cfg, "debug", False))
    return DDP(opts, **kw)


__all__ = ["DDP", "DDPConfig", "ReplicaMismatch", "build", "MIB"]
