"""What the three ZeRO stages share: the communicator, the group plan and this rank's
shard of every group, the collectives with the ledger, step figures, the checks of
bad input, and a full-parameter gather for tests and exports. Each stage is its own
class in its own file (stage1.py, stage2.py, stage3.py); this base holds no stage
flags, only shared pieces.

Shard bookkeeping: for group b (``plan.buckets[b]``, a flat range) this rank owns the
global range ``self.mine[b] = (offset, size)`` (the shard rule applied to the group),
and its shard buffers (gradients at stages 2-3, parameters at stage 3, the optimizer
state at every stage) hold the owned ranges concatenated in flat order: group b's
piece starts at ``self.local[b]``. That layout is :func:`hpcdp.ownership.owned_ranges`.
"""

from __future__ import annotations

import time

import numpy as np

from hpcdp.config_error import ConfigError
from hpcdp.config_parallel import ZeroConfig
from hpcdp.io.protocol import ShardedCheckpoint
from hpcdp.ownership import group_shard, owned_ranges
from hpcdp.strategies.base import Strategy
from hpcdp.strategies.engine import ledger_bytes
from hpcdp.strategies.zero.groups import group_ranges
from hpcdp.strategies.zero.hybrid import link_kind_bytes, node_groups, shard_layout, state_ranks


class ZeroStrategy(ShardedCheckpoint, Strategy):
    # Checkpoints (hpcdp.io.protocol.ShardedCheckpoint): each rank writes and fills
    # its owned_ranges of the optimizer state (and at stage 3 of the parameters,
    # param_shard()); stages 1-2 write their replica's shard_range slice. No gathers.
    name = "zero"
    stage = 0
    # Full buffers FlatParams must hold when setup starts (train.py builds only these).
    full_storage: tuple = ("data", "grad")

    def __init__(self, options: ZeroConfig | None = None, *, timeout: float | None = None,
                 debug: bool = False):
        self.cfg = options if options is not None else ZeroConfig(stage=self.stage)
        self.timeout, self.debug = timeout, debug
        self.flat = None
        self.engine = None
        self.comm = None
        self._steps = 0

    # -- setup pieces ------------------------------------------------------------------
    def _setup_common(self, flat, optimizer, world, plan) -> None:
        from hpcdp import comm as hcomm

        self.hcomm = hcomm
        self.flat, self.optimizer, self.world = flat, optimizer, world
        self.backend = flat.backend
        self.ledger = world.ledger
        self.dp_rank, self.dp_size = world.rank, world.size
        self.is_worker = True
        # Own communicator: ZeRO's collectives never match anyone else's messages, and
        # a run stopped by a unit-order error leaves nothing behind on COMM_WORLD.
        self.comm = world.comm.Dup() if world.comm is not None else None
        if self.debug and self.comm is not None:
            hcomm.set_debug(self.comm, True)
        self.plan = plan
        # The sharding group (hybrid.py): the world, or this rank's node.
        self.groups = node_groups(self.cfg, self.comm, self.timeout)
        self.shard_size, self.shard_rank = shard_layout(self.groups, world)
        self.mine, self.local, pos = {}, {}, 0
        for off, size in group_ranges(plan):
            b = next(bk.index for bk in plan.buckets if bk.offset == off)
            self.mine[b] = group_shard((off, size), self.shard_size, self.shard_rank)
            self.local[b] = pos
            pos += self.mine[b][1]
        self.shard_numel = pos
        # Weight-decay groups: the optimizer's arrays are the owned ranges, concatenated
        # in this (flat) order; it applies its slice of the groups (hpcdp.optim.decay).
        optimizer.set_slice([self.mine[b] for b in sorted(self.mine, key=lambda b: self.local[b])])
        self._snap = self.ledger.snapshot() if self.ledger is not None else None
        if self.comm is not None:  # the node layout now, while no collective is in flight
            hcomm.prepare(self.comm, algorithm=self.cfg.algorithm, timeout=self.timeout)

    def _require_units(self) -> None:
        """Stages 2 and 3 bind storage at a unit's pre-backward (and 3 at its
        forward): the model must split into units that have modules."""
        units = self.flat.units
        if not units or any(u.module is None for u in units):
            why = self.flat.units_error or "its units have no modules to hook"
            raise ConfigError(f"parallel.zero.stage = {self.stage} needs a model that splits into "
                              f"units (blocks with their own forward): this one cannot ({why}); "
                              "use parallel.zero.stage = 1, or a model with unit_modules()")

    def _shard_of(self, array, b):
        """This rank's piece of group b in a shard buffer (a view)."""
        lo = self.local[b]
        return array[lo:lo + self.mine[b][1]]

    def _full_view(self, array, b):
        """Group b's view of a full flat buffer."""
        bk = self.plan.buckets[b]
        return array[bk.offset:bk.offset + bk.size]

    def _chunk_view(self, group_buf, b):
        """This rank's chunk inside a group-sized buffer (the reduce-scatter result)."""
        off, size = self.mine[b]
        lo = off - self.plan.buckets[b].offset
        return group_buf[lo:lo + size]

    def _groups_in_flat_order(self):
        return sorted(self.mine, key=lambda b: self.mine[b][0])

    # -- collectives -----------------------------------------------------------------
    # comm_dtype (hpcdp.comm.engines.wire): gradient reduce-scatters carry it at every stage;
    # parameter all-gathers only where the gathered copy is a working copy (stage 3's
    # units), never where it is the replica's master (stages 1, 2 after the update).
    params_on_wire = False

    def _reduce_scatter(self, buf):
        """In place: this rank's chunk of ``buf`` (a group) is summed over ranks."""
        if self.groups is not None:
            return self.groups.reduce_scatter(buf, ledger=self.ledger, algorithm=self.cfg.algorithm,
                                              timeout=self.timeout, wire=self.cfg.comm_dtype)
        return self.hcomm.ireduce_scatter(buf, comm=self.comm, op="sum", ledger=self.ledger,
                                          algorithm=self.cfg.algorithm, timeout=self.timeout,
                                          wire=self.cfg.comm_dtype)

    def _all_gather(self, buf):
        """In place: ``buf`` (a group, this rank's chunk in position) gets every chunk."""
        if self.groups is not None:
            return self.groups.all_gather(buf, ledger=self.ledger, algorithm=self.cfg.algorithm,
                                          timeout=self.timeout,
                                          wire=self.cfg.comm_dtype if self.params_on_wire else None)
        return self.hcomm.iall_gather(buf, comm=self.comm, ledger=self.ledger,
                                      algorithm=self.cfg.algorithm, timeout=self.timeout,
                                      wire=self.cfg.comm_dtype if self.params_on_wire else None)

    def _gather_groups_in_place(self, full) -> None:
        """All-gather every group of the full buffer ``full`` (stages 1/2 after the
        update): launched together, then drained."""
        from hpcdp.strategies.engine import wait_progressing

        t0 = time.perf_counter()
        reqs = [self._all_gather(self._full_view(full, b)) for b in range(len(self.plan.buckets))]
        for r in reqs:
            wait_progressing(r, lambda: [q.test() for q in reqs])
        self.gather_wait_s += time.perf_counter() - t0

    # -- sharded gradients (stages 2 and 3) ----------------------------------------------
    # self._gbuf[b]: group b's gradient buffer during backward (tag "working"), or None;
    # self.gshard: this rank's reduced gradient, its owned pieces concatenated.
    def _bind_grad_buffer(self, b: int) -> None:
        """Group b's gradient storage for this backward: zeroed and bound to its
        parameters, once. At most one earlier group's reduce-scatter may still hold
        its buffer (bounds the working set)."""
        if self._gbuf[b] is None:
            self.engine.drain_to(1)
            bk = self.plan.buckets[b]
            self._gbuf[b] = self.backend.alloc((bk.size,), self.flat.dtype, "working", zero=True)
            self.flat.bind(bk.offset, bk.size, grad=self._gbuf[b])

    def _reduce_grads(self, b: int):
        """The engine's launch: reduce-scatter group b's buffer in place (zeros if the
        group got no gradient in this backward). With a gradient codec the buffer is
        encoded into a payload-typed group buffer first and released at once; that
        buffer is reduce-scattered."""
        self._bind_grad_buffer(b)
        if self.grad_codec is None:
            return self._reduce_scatter(self._gbuf[b])
        bk = self.plan.buckets[b]
        g = self._gbuf[b]
        payload = np.zeros(bk.size, dtype=self.grad_codec.payload_dtype)
        self.grad_codec.encode(g if isinstance(g, np.ndarray) else self.backend.to_numpy(g), payload,
                               lo=bk.offset)
        self.flat.release(bk.offset, bk.size, grad=True)  # the float buffer goes now
        self._gbuf[b], self._gpay[b] = None, payload
        return self._reduce_scatter(payload)

    def _grads_reduced(self, b: int) -> None:
        """The engine's on_done: add this rank's chunk into its shard, free the buffer."""
        if self.grad_codec is not None:  # payloads add exactly in any order (integers)
            self._shard_of(self.pshard_payload, b)[...] += self._chunk_view(self._gpay[b], b)
            self._gpay[b] = None
            return
        self.backend.add_(self._shard_of(self.gshard, b), self._chunk_view(self._gbuf[b], b))
        bk = self.plan.buckets[b]
        self.flat.release(bk.offset, bk.size, grad=True)
        self._gbuf[b] = None

    # -- the gradient codec (hpcdp/strategies/codec.py) ----------------------------------
    def set_grad_codec(self, codec) -> None:
        """Stages 2 and 3: each micro-batch's group buffers are encoded before their
        reduce-scatter; this rank's chunks add into a payload shard (``Psi / N``
        payload elements), decoded into the gradient shard after ``codec.finish()``.
        (Stage 1 keeps a full gradient: its own override.)"""
        self.grad_codec = codec
        self.pshard_payload = np.zeros(self.shard_numel, dtype=codec.payload_dtype)
        self._gpay = [None] * len(self.plan.buckets)

    def _codec_zero(self) -> None:
        if self.grad_codec is not None:
            self.pshard_payload.fill(0)

    def _codec_finish(self) -> bool | None:
        """After the last micro-batch's reduce-scatters (stages 2, 3): the codec's
        verdict, and the payload shard decoded into the gradient shard if usable."""
        codec = self.grad_codec
        if codec is None:
            return None
        ok = codec.finish()
        if ok:
            for b in self.mine:
                lo, n = self.mine[b]
                if not n:
                    continue
                ints, target = self._shard_of(self.pshard_payload, b), self._shard_of(self.gshard, b)
                if isinstance(target, np.ndarray):
                    codec.decode(ints, target, lo=lo)
                else:
                    host = np.empty(n, dtype=self.flat.dtype)
                    codec.decode(ints, host, lo=lo)
                    self.backend.copy_(target, self.backend.asarray(host, self.flat.dtype))
        return ok

    def _update(self, params, grads) -> None:
        """One optimizer update of this rank's pieces, decided alike on every rank.

        Each rank holds a different shard of the reduced gradient, so its squared norm
        is summed over the ranks first (one 8-byte allreduce, a sync point; one pass
        over the shard). The global norm drives ``optim.clip_grad_norm``, and a
        non-finite one is made visible to the non-finite guard (which wraps
        ``optimizer.step``, ``train.on_nonfinite``) on EVERY rank by writing NaN into
        this rank's first gradient element: then all ranks stop, or all skip the
        update, although only one rank's shard held the bad value. The pieces go
        through ``optimizer.step`` as one update (``more=``: one step count).
        With a gradient codec that offers ``sum_squares`` (exact mode) and clipping
        on, the codec computes the global squared norm instead (a fixed-point sum,
        the same bits for any rank count)."""
        import math

        from hpcdp.optim.clip import allreduce_sum, clip_factor, sum_squares

        be = self.backend
        max_norm = getattr(self.optimizer, "clip_grad_norm", 0.0)
        exact_norm = getattr(self.grad_codec, "sum_squares", None) if max_norm else None
        if exact_norm is not None:  # the codec's norm: the same for any split over ranks
            host = [g if isinstance(g, np.ndarray) else be.to_numpy(g) for g in grads]
            ss = exact_norm(host, self.shard_comm if self.shard_size > 1 else None, self.flat.numel)
        else:
            ss = sum_squares(be, grads)
            if self.shard_size > 1:
                ss = allreduce_sum(self.shard_comm, self.timeout)(ss)
        norm = math.sqrt(ss) if ss >= 0 else float("nan")
        if max_norm:
            self.grad_norm = norm
            c = clip_factor(norm, max_norm) if math.isfinite(norm) else 1.0
            if c < 1.0:
                for g in grads:
                    if int(g.shape[0]):
                        be.copy_(g, be.mul(g, c))
        pieces = [(p, g) for p, g in zip(params, grads) if int(g.shape[0])]
        if not math.isfinite(norm):
            if not pieces:  # this rank owns nothing: a one-element probe carries the NaN
                probe = be.alloc((1,), self.flat.dtype, "working")
                pieces = [(probe, probe)]
            be.fill_(pieces[0][1][0:1], float("nan"))
        if pieces:
            (p0, g0), more = pieces[0], pieces[1:]
            self.optimizer.step(p0, g0, more=more)

    # -- the seam ---------------------------------------------------------------------
    def owned_ranges(self, kind: str) -> list[tuple[int, int]]:
        return owned_ranges(kind, self.stage, group_ranges(self.plan), self.shard_size, self.shard_rank)

    @property
    def shard_comm(self):
        """The communicator over which the state is sharded (the world or the node)."""
        return self.groups.node_comm if self.groups is not None else self.comm

    def checkpoint_replica(self) -> tuple[int, int]:
        """(this rank's replica, replicas) of its shard: hybrid's node index and node
        count (each replica writes its part of the shard), else (0, 1)."""
        return (self.groups.node, self.groups.nodes) if self.groups is not None else (0, 1)

    def state_ranks(self, world) -> int:
        """Ranks the state is sharded over, known before setup (memcheck)."""
        return state_ranks(self.cfg, world)

    # Seconds this step spent blocked on parameter all-gathers (stages 1, 2: after the
    # update; stage 3: before a unit's forward or backward, minus what prefetch hid).
    gather_wait_s = 0.0

    def step_stats(self) -> dict:
        out = self.engine.stats()
        # hybrid sharding and the hierarchical collectives: bytes per link kind
        if self.ledger is not None and (self.groups is not None or self.cfg.algorithm == "hierarchical"):
            out.update(link_kind_bytes(self.ledger.delta(self._snap)))
        figures, self._snap = ledger_bytes(self.ledger, self._snap, ("reduce_scatter",))
        out.update(figures)
        out.update(self.clip_stats())
        out["gather_wait_s"], self.gather_wait_s = self.gather_wait_s, 0.0
        return out

    def gather_full_params(self):
        """Every parameter as one host array (a collective; a transient full copy,
        for tests and exports, never used in training)."""
        data = self.flat.data
        return np.array(self.backend.to_numpy(data), copy=True)

    def close(self) -> None:
        for h in getattr(self, "_handles", ()):
            h.remove()
        self._handles = []
        if getattr(self, "_abandoned", False):
            return  # peers may be gone: free nothing collectively
        if self.engine is not None:
            self.engine.close()
            self.engine = None  # it holds bound methods of self: no cycle left behind
        if getattr(self, "groups", None) is not None:
            self.groups.free()
            self.groups = None
        if self.comm is not None:
            self.comm.Free()
            self.comm = None

    def abandon(self) -> None:
        """The job is failing: drop the collectives in flight without waiting for any
        peer (dead or stuck), remove the hooks; close() is then a no-op."""
        self._abandoned = True
        if self.engine is not None:
            self.engine.abandon()
        for h in getattr(self, "_handles", ()):
            h.remove()
        self._handles = []

    # -- failure.on_rank_loss = "continue" (hpcdp.failure.lasting), hybrid sharding only ----
    def comms(self) -> list:
        """ZeRO's own communicator (the node and cross-node channels derive from it)."""
        return [self.comm] if self.comm is not None else []

    def failure_domain(self) -> tuple | None:
        """Hybrid sharding: ``(node, local rank, ranks per node)``: a node holds one whole
        copy of the sharded state, so a node is lost (or kept) as a whole."""
        if self.groups is None:
            return None
        return (self.groups.node, self.groups.local_rank, self.groups.per_node)

    def replica_arrays(self) -> list:
        """This rank's parameter shard, which the same local rank of every node holds
        alike: its chunks of ``flat.data`` (stages 1, 2; stage 3 overrides)."""
        return [self._chunk_view(self._full_view(self.flat.data, b), b) for b in self._groups_in_flat_order()]

    def rejoin(self, world) -> None:
        """After a repair (hpcdp.failure.ulfm with this strategy's failure_domain): the
        surviving nodes' ``world`` replaces the old one. Whole nodes were lost, so every
        rank keeps its local rank and its shard (the repair made each shard equal across
        its replicas); the communicator, the node and cross-node channels and the engine
        are built afresh (collective over ``world``); stages 1-2 then all-gather the full
        parameters from the shards over each node."""
        if self.groups is None:
            raise RuntimeError('internal: ZeRO rejoins only with parallel.zero.shard = "node"')
        from mpi4py import MPI

        before = (self.shard_size, self.shard_rank)
        self.abandon()
        self.world, self.dp_rank, self.dp_size = world, world.rank, world.size
        self.comm = world.comm.Dup()
        self.comm.Set_errhandler(MPI.ERRORS_RETURN)
        if self.debug:
            self.hcomm.set_debug(self.comm, True)
        self.groups = node_groups(self.cfg, self.comm, self.timeout)
        self.shard_size, self.shard_rank = shard_layout(self.groups, world)
        if (self.shard_size, self.shard_rank) != before:
            raise RuntimeError(f"internal: after the repair this rank's shard is {self.shard_rank} of "
                               f"{self.shard_size}, was {before[1]} of {before[0]}")
        self.hcomm.prepare(self.comm, algorithm=self.cfg.algorithm, timeout=self.timeout)
        self._abandoned = False
        self._wire()
        if self.stage < 3:
            self._gather_groups_in_place(self.flat.data)


__all__ = ["ZeroStrategy"]
