"""The parameter-server strategy: roles, setup, the step and shutdown (the package
docstring, hpcdp/strategies/ps/__init__.py, describes the modes and options)."""

from __future__ import annotations

import time

import numpy as np

from hpcdp.config_error import ConfigError
from hpcdp.config_parallel import PSConfig
from hpcdp.strategies.base import Strategy

from . import checkpoint as ckpt
from . import transport as tp
from .aggregate import probe, resolve_aggregate
from .roles import assign_roles
from .server import ShardServer
from .staleness import StalenessBound
from .sync import SyncServerPart, SyncWorkerPart
from .worker import Worker


class ParameterServer(Strategy):
    """See the package docstring. Built from its options object, like DDP and ZeRO::

        ParameterServer(PSConfig(servers=2, colocated=False, mode="async", staleness=1))

    ``aggregate``: a callable that replaces ``options.aggregate`` (tests, custom
    rules); ``timeout``: seconds a PS message may wait for its peer."""

    name = "ps"

    def __init__(self, options: PSConfig | None = None, *, aggregate=None, timeout: float = 300.0):
        cfg = self.cfg = options if options is not None else PSConfig()
        self.timeout = float(timeout)
        self.bound = StalenessBound(cfg.k if cfg.mode == "async" else 0)
        self.aggregate = resolve_aggregate(cfg.aggregate if aggregate is None else aggregate)
        self.server = self.worker = None
        self.closed = False
        self._stats_prev = None

    # -- setup ------------------------------------------------------------
    def setup(self, flat, optimizer, world) -> None:
        from hpcdp.failure.agreement import agree
        from hpcdp.comm import broadcast
        from hpcdp.failure.deadline import idup

        cfg = self.cfg
        self.flat, self.optimizer, self.ledger = flat, optimizer, getattr(world, "ledger", None)
        numel = flat.data.shape[0]
        dtype = np.dtype(flat.data.dtype)
        # Local checks first, then every rank agrees before the first message: an error
        # on one rank (e.g. its aggregation misbehaves) stops all of them now.
        error = None
        try:
            self.roles = roles = assign_roles(world.size, cfg.servers, cfg.colocated)
            if not isinstance(flat.data, np.ndarray):
                raise ValueError("parallel.strategy = 'ps' runs on host (numpy) buffers; set run.device = 'cpu'")
            # Probe the aggregation with every server's shard size, before any step (a
            # wrong shape is an error here, not mid-run).
            for s in range(roles.num_servers):
                probe(self.aggregate, roles.num_workers, roles.shard(numel, s)[1], dtype)
        except ValueError as e:
            error = e
        agree(world.comm, error, what="parameter-server setup", timeout=self.timeout)
        rank = world.rank
        s_idx, w_idx = roles.server_index(rank), roles.worker_index(rank)
        self.is_worker = w_idx is not None
        self.dp_rank, self.dp_size = (w_idx or 0), roles.num_workers
        # PS traffic never matches anyone else's messages
        self.comm = idup(world.comm, self.timeout, "the parameter server's communicator")
        # Identical start: rank 0's parameters everywhere (setup traffic, not a step's).
        broadcast(flat.data, comm=world.comm, root=0, timeout=self.timeout)
        server_update = cfg.update == "server"
        optimizer = self._stepper = self._clipping(optimizer, world, s_idx)
        local_w = w_idx if (s_idx is not None and self.is_worker) else None
        if s_idx is not None:
            off, size = roles.shard(numel, s_idx)
            params = np.array(flat.data[off:off + size], copy=True)
            opt = optimizer if server_update else None
            if opt is not None:  # the server steps its shard: weight decay on the shard's slice
                opt.set_slice([(off, size)])
            if cfg.mode == "sync":
                self.server = SyncServerPart(self.comm, s_idx, params, workers=roles.workers, local_worker=local_w,
                                             aggregate=self.aggregate, optimizer=opt, ledger=self.ledger,
                                             timeout=self.timeout)
            else:
                self.server = ShardServer(self.comm, s_idx, off, params, workers=roles.workers,
                                          local_worker=local_w, bound=self.bound, aggregate=self.aggregate,
                                          optimizer=opt, ledger=self.ledger, timeout=self.timeout,
                                          stale_lr=cfg.stale_lr)
        if self.is_worker:
            if cfg.mode == "sync":
                self.worker = SyncWorkerPart(self.comm, w_idx, flat, roles=roles, server_update=server_update,
                                             optimizer=optimizer, local_server=self.server, ledger=self.ledger,
                                             timeout=self.timeout)
            else:
                self.worker = Worker(self.comm, w_idx, flat, roles=roles, bound=self.bound,
                                     server_update=server_update, optimizer=optimizer,
                                     local_server=self.server, ledger=self.ledger, timeout=self.timeout)
        self._wait_s = 0.0
        # Async: progress PS traffic from the grad-ready hooks too, so a colocated
        # server applies updates (and every worker takes replies) during backward,
        # not only inside step(). Cost: a few MPI_Test calls per parameter per backward.
        self._hooks = []
        self.hook_polls = 0
        if cfg.mode == "async" and self.is_worker and world.size > 1:
            self._hooks = [flat.params[spec.name].register_grad_ready_hook(self._on_grad_ready)
                           for spec in flat.layout]

    def _clipping(self, optimizer, world, s_idx):
        """``optim.clip_grad_norm``: the optimizer wrapped to clip the aggregated
        gradient to its global L2 norm first. Worker-side updates and a single
        server see the whole aggregate; S synchronous servers sum their shards'
        squared norms over a servers-only communicator (they apply update t
        together); asynchronous servers apply updates independently, so there a
        global norm would mean synchronising them: refused."""
        from hpcdp.optim.clip import ClipBeforeStep, allreduce_sum

        max_norm = getattr(optimizer, "clip_grad_norm", 0.0)
        if not max_norm:
            return optimizer
        cfg = self.cfg
        if cfg.update == "worker" or self.roles.num_servers == 1:
            return ClipBeforeStep(optimizer, max_norm)
        if cfg.mode == "async":
            raise ConfigError(
                "optim.clip_grad_norm: asynchronous parameter servers apply their shards' updates "
                f"independently, so the global gradient norm over {self.roles.num_servers} servers is "
                "not defined; use parallel.ps.servers = 1, parallel.ps.update = \"worker\" or mode \"sync\"")
        from mpi4py import MPI
        servers = self.comm.Split(0 if s_idx is not None else MPI.UNDEFINED, world.rank)
        self._server_comm = servers if s_idx is not None else None
        return ClipBeforeStep(optimizer, max_norm, allreduce_sum(servers) if s_idx is not None else None)

    def _on_grad_ready(self, _param) -> None:
        # poll() files arrivals, applies complete updates on the colocated shard and
        # takes replies; it never writes flat.data (replies are installed in step()).
        if not self.closed:
            self.worker.poll()
            self.hook_polls += 1

    # -- the gradient codec (hpcdp/strategies/codec.py) -------------------
    def set_grad_codec(self, codec) -> None:
        """Synchronous mode only (every rank, servers included): workers encode each
        micro-batch's gradient into one payload and push payload shards behind the
        codec's header; servers sum them with ``codec.aggregate``."""
        if self.cfg.mode != "sync":
            raise NotImplementedError("the asynchronous parameter server cannot carry a gradient codec "
                                      "(which updates a gradient meets depends on timing)")
        if not isinstance(self.flat.data, np.ndarray):
            raise NotImplementedError("the parameter server runs on host buffers only")
        from hpcdp.strategies.codec import FullGradPayload

        self.grad_codec = codec
        if self.server is not None:
            self.server.codec = codec
            self.server.offset = self.roles.shard(self.flat.numel, self.server.index)[0]
        if self.worker is not None:
            self._payload = FullGradPayload(self.flat, codec)
            self.worker.codec, self.worker.payload = codec, self._payload.payload

    def zero_grad(self) -> None:
        self.flat.zero_grad()
        if self.grad_codec is not None:
            self._payload.zero()

    def begin_backward(self, last_micro: bool = True) -> None:
        if self.grad_codec is not None:
            self._payload.begin_micro()

    # -- the step ---------------------------------------------------------
    def finish_gradients(self) -> bool | None:
        """Nothing to wait for: pushes go out in step(), after the lr is known. (A
        codec: the last micro-batch is encoded, and the codec decides whether the
        pass set is usable before anything is pushed.)"""
        if self.grad_codec is None:
            return None
        self._payload.fold()
        return self.grad_codec.finish()

    def step(self) -> None:
        t0 = time.perf_counter()
        lr = float(getattr(self.optimizer, "lr", 0.0))
        if self.cfg.mode == "sync":
            self.worker.step(lr)
        else:
            self.worker.push(lr)
            nxt = self.worker.step_t
            self.worker.wait_for(self.bound.min_version(nxt),
                                 f"shard versions >= {self.bound.min_version(nxt)} before step {nxt}")
        self._wait_s = time.perf_counter() - t0

    def step_stats(self) -> dict:
        out = {"ps_time_s": self._wait_s}
        if getattr(self.optimizer, "clip_grad_norm", 0.0):
            out["grad_norm"] = float(getattr(self._stepper, "last_norm", float("nan")))
        if self.cfg.mode == "async":
            out["ps_staleness"] = self.worker.pushed_staleness[-1]
        if self.ledger is not None:
            tot = self.ledger.totals()
            now = {f"{n}_{d}_bytes": tot.get(n, {}).get(f"{d}_bytes", 0)
                   for n in ("ps_push", "ps_pull") for d in ("sent", "recv")}
            prev = self._stats_prev or {k: 0 for k in now}
            out.update({k: now[k] - prev[k] for k in now})
            self._stats_prev = now
        return out

    # -- roles and shutdown ----------------------------------------------
    def serve(self, on_save=None, on_poll=None) -> None:
        """Dedicated server: serve until every worker said done. ``on_save(step,
        wait)``: the run's checkpointer, called when every worker asks for a
        checkpoint (checkpoint.py); None: a request is an error. ``on_poll()``:
        called between updates (async: every pass of the poll loop), e.g. to pass a
        stop signal that reached this rank on to the workers."""
        if self.is_worker:
            raise RuntimeError("serve() is for dedicated server ranks; this rank is a worker")
        self.server.saves.on_save = on_save
        self.server.on_poll = on_poll
        self.server.serve_until_done()

    def finish_updates(self) -> None:
        """The final weights: async workers collect every outstanding reply. After it a
        worker's parameters are local; evaluation needs no server."""
        self.close()

    def close(self) -> None:
        """Idempotent. Workers say done and collect every reply (async: the final
        weights); colocated servers serve until all workers are done."""
        if self.closed or (self.worker is None and self.server is None):
            return
        self.closed = True
        for h in getattr(self, "_hooks", ()):
            h.remove()
        self._hooks = []
        if self.worker is not None:
            self.worker.close()
        if self.cfg.mode == "async" and self.server is not None and not self.server.finished:
            self.server.close()  # raises: a dedicated server closed before its workers
        if self.cfg.mode == "async":
            boxes = [p.outbox for p in (self.worker, self.server) if p is not None]
            tp.finish_together(self.comm, boxes, self.timeout)
        if getattr(self, "_server_comm", None) is not None:
            self._server_comm.Free()
        self.comm.Free()

    def abandon(self) -> None:
        """The job is failing: stop serving from hooks and wait for no peer (no done
        messages, no draining); close() is then a no-op."""
        self.closed = True
        for h in getattr(self, "_hooks", ()):
            h.remove()
        self._hooks = []

    # -- checkpoints: the protocol of hpcdp.io.protocol, written in checkpoint.py --
    def checkpoint_check(self) -> None:
        ckpt.check(self)

    def checkpoint_begin(self, step: int, wait: bool) -> None:
        ckpt.begin(self, step, wait)

    def checkpoint_pieces(self):
        return ckpt.pieces(self)

    def checkpoint_targets(self):
        return ckpt.targets(self)

    def checkpoint_restored(self) -> None:
        ckpt.restored(self)

    def checkpoint_scalars(self) -> dict:
        return ckpt.scalars(self)

    @property
    def applied(self):
        """Async: this rank's server's record of each applied gradient (Applied; the
        most recent ``staleness.HISTORY`` .. twice that, so long runs stay bounded)."""
        return self.server.clock.applied if isinstance(self.server, ShardServer) else []


def build(parallel_cfg, world=None, comm_cfg=None) -> ParameterServer:
    cfg = parallel_cfg.sub("ps") or PSConfig()
    timeout = getattr(comm_cfg, "timeout", 300.0) if comm_cfg is not None else 300.0
    try:
        return ParameterServer(cfg, timeout=timeout)
    except ValueError as e:
        raise ConfigError(str(e)) from None


__all__ = ["PSConfig", "ParameterServer", "build"]
