"""DiLoCo: replica groups that train alone for ``H`` steps, then average their
parameter change and apply it with an outer optimizer (docs/diloco.md).

With ``M`` replica groups of ``L`` ranks (groups.py), every group is a data-parallel
job of its own: the inner strategy (none, DDP or ZeRO 1-2, unchanged, on the group's
communicator) reduces gradients inside the group and the inner optimizer (``[optim]``)
updates the group's replica every step. Each group trains on its own part of every
global batch (``M`` groups see the batch DDP would see), so the loss weights are
scaled by ``global / group samples`` (:meth:`DiLoCo.loss_scale`).

The outer loop, per fragment (fragments.py; one fragment = the whole model unless
``fragments = P``), with ``theta`` the outer parameters (equal in every group):

    delta   = theta - replica                       # the OUTER GRADIENT: old minus new
    delta   = mean over the M groups of delta       # exchange.py, across groups
    theta  -= outer_lr * nesterov(delta)            # hpcdp.optim.SGD, PyTorch semantics
    replica = mixing * replica + (1 - mixing) * theta

The sign: the outer gradient points from the new parameters back to the old ones, so
an SGD step with lr 1 and no momentum moves ``theta`` exactly onto the groups' mean
(``theta - (theta - mean) = mean``): with ``H = 1`` and an SGD inner optimizer it is
DDP's step (tests/mpi/test_diloco.py). A sign error (``replica - theta``) would move
the model away from where the groups went.

Who holds what: rank ``l`` of a group holds chunk ``l`` (``shard_range(size, L, l)``)
of every fragment's ``theta`` and outer momentum, exchanges that chunk with the ranks
of index ``l`` in the other groups (``cross_comm``), and the group all-gathers the new
``theta`` of the fragment (``group_comm``, intra-group links) before the mix. So each
rank of a group carries ``1/L`` of the outer bytes, and the outer state costs ``2/L``
of the model per rank (``theta`` and the momentum).

Timing: ``overlap = tau`` starts a fragment's exchange ``tau`` inner steps before it
lands; :meth:`_poll` advances it from every moment of the seam (grad-ready hooks,
zero_grad, begin_backward, step), and the compiled engine's progress thread moves a
float32 ring on its own. What is left when it must land is waited for
(``outer_exposed_s`` in the step figures).
"""

from __future__ import annotations

import hashlib
import time

import numpy as np

from hpcdp.config_error import ConfigError
from hpcdp.config_parallel import DDPConfig, DiLoCoConfig, ZeroConfig
from hpcdp.shard import shard_range
from hpcdp.strategies.base import SingleRank, Strategy

from .checkpoint import DiLoCoCheckpoint
from .exchange import OuterExchange
from .fragments import Schedule, plan_fragments
from .groups import ReplicaGroups, group_ranks, kind_ledger


class ReplicaMismatch(RuntimeError):
    """The groups' outer parameters differ (raised on every rank)."""


def make_inner(kind: str, ddp: DDPConfig | None, zero: ZeroConfig | None, *, timeout, debug) -> Strategy:
    if kind == "none":
        return SingleRank()
    if kind == "ddp":
        from hpcdp.strategies.ddp import DDP
        return DDP(ddp, timeout=timeout, debug=debug)
    zero = zero if zero is not None else ZeroConfig()
    if zero.stage == 3:
        raise ConfigError("parallel.diloco.inner = \"zero\" with parallel.zero.stage = 3: the outer step "
                          "reads and writes the group's full parameters, which ZeRO-3 never holds; use "
                          "parallel.zero.stage = 1 or 2 (the optimizer state and gradients stay sharded)")
    if zero.shard != "world":
        raise ConfigError("parallel.zero.shard = \"node\" inside parallel.diloco: the replica group is "
                          "already the sharding group; leave parallel.zero.shard = \"world\"")
    from hpcdp.strategies.zero import make_zero
    return make_zero(zero, timeout=timeout, debug=debug)


class _Chunk:
    """This rank's part of one fragment's outer state."""

    def __init__(self, fragment, offset: int, size: int, theta: np.ndarray, opt):
        self.fragment, self.offset, self.size = fragment, offset, size
        self.theta, self.opt = theta, opt
        self.delta = np.empty_like(theta)


class DiLoCo(DiLoCoCheckpoint, Strategy):
    name = "diloco"

    def __init__(self, options: DiLoCoConfig | None = None, *, ddp: DDPConfig | None = None,
                 zero: ZeroConfig | None = None, timeout: float | None = None, debug: bool = False):
        self.cfg = options if options is not None else DiLoCoConfig()
        self.timeout, self.debug = timeout, debug
        self.inner = make_inner(self.cfg.inner, ddp, zero, timeout=timeout, debug=debug)
        self.full_storage = self.inner.full_storage
        self.stage = self.inner.stage
        self.groups = None
        self.pending = None
        self._hooks: list = []
        self.flat = None

    # -- sizes known before setup (train.py's memory check) -------------------------
    def state_ranks(self, world) -> int:
        return group_ranks(self.cfg.groups, world)

    # -- setup -------------------------------------------------------------------------
    def setup(self, flat, optimizer, world) -> None:
        from hpcdp.world import World

        cfg = self.cfg
        self.flat, self.optimizer, self.world = flat, optimizer, world
        self.comm, self.ledger = world.comm, world.ledger
        if cfg.outer_dtype != "float32" and np.dtype(flat.dtype) != np.float32:
            raise ConfigError(f"parallel.diloco.outer_dtype = {cfg.outer_dtype!r} carries float32 outer "
                              f"gradients; run.dtype is {np.dtype(flat.dtype).name!r}: set run.dtype = "
                              "\"float32\" or parallel.diloco.outer_dtype = \"float32\"")
        self.groups = g = ReplicaGroups(world.comm, cfg.groups, self.timeout)
        self.M, self.L, self.g, self.l = g.count, g.size, g.index, g.local_rank
        if cfg.inner == "none" and self.L > 1:
            raise ConfigError(f"parallel.diloco.inner = \"none\" trains one rank per group, but the groups "
                              f"have {self.L} ranks ({g.describe()}): set parallel.diloco.inner = \"ddp\" "
                              f"(or \"zero\"), or parallel.diloco.groups = {world.size}")
        if cfg.outer_dtype == "int8":
            from .wire import levels
            try:
                levels(self.M)
            except ValueError as e:
                raise ConfigError(f"parallel.diloco.outer_dtype: {e}") from None
        inner_world = World(comm=g.group_comm, rank=self.l, size=self.L, local_rank=world.local_rank,
                            local_size=world.local_size, device=world.device,
                            ledger=kind_ledger(world.ledger, "intra"))
        self.inner.setup(flat, optimizer, inner_world)
        self.dp_rank, self.dp_size = world.rank, world.size
        self.is_worker = True
        # The world ranks of this group (the loss scale's group share of a batch).
        from hpcdp import comm as hcomm
        ranks = np.zeros(self.L, dtype=np.int64)
        ranks[self.l] = world.rank
        if self.L > 1:
            hcomm.all_gather(ranks, comm=g.group_comm, timeout=self.timeout)
        self.group_world_ranks = [int(r) for r in ranks]
        # Fragments and this rank's chunk of each.
        units = flat.units
        if cfg.fragments > 1 and units is None:
            raise ConfigError(f"parallel.diloco.fragments = {cfg.fragments} cuts the model at unit "
                              f"boundaries, but this model has no units ({flat.units_error})")
        try:
            self.fragments = plan_fragments(units, flat.numel, cfg.fragments)
        except ValueError as e:
            raise ConfigError(str(e)) from None
        self.schedule = Schedule(cfg.sync_every, cfg.fragments, cfg.overlap)
        self.chunks = [self._make_chunk(f) for f in self.fragments]
        self._gather_buf = None
        self.t = 0
        self._last_landed = [0] * len(self.fragments)
        self._check_groups_identical("before step 1")
        self._hooks = [flat.params[s.name].register_grad_ready_hook(lambda _p: self._poll())
                       for s in flat.layout]
        self._reset_figures()
        self._snap = world.ledger.snapshot() if world.ledger is not None else None

    def _make_chunk(self, fragment) -> _Chunk:
        from hpcdp.optim import SGD

        co, cs = shard_range(fragment.size, self.L, self.l)
        off = fragment.offset + co
        theta = np.array(self._host(off, cs), dtype=np.dtype(self.flat.dtype), copy=True)
        c = self.cfg
        opt = SGD(cs, lr=c.outer_lr, momentum=c.outer_momentum, nesterov=c.outer_nesterov,
                  dtype=np.dtype(self.flat.dtype).name, device="cpu")
        return _Chunk(fragment, off, cs, theta, opt)

    def layout_line(self) -> str:
        """One log line (train.py prints it after the model line)."""
        c = self.cfg
        outer = (f"outer SGD lr {c.outer_lr:g}" + (f", momentum {c.outer_momentum:g}" if c.outer_momentum else "")
                 + (" (Nesterov)" if c.outer_nesterov else ""))
        stream = (f"; {c.fragments} fragments synced in turn (every {c.sync_every // c.fragments} steps), "
                  f"overlap {c.overlap}, mixing {c.mixing:g}" if c.fragments > 1 or c.overlap else "")
        return (f"DiLoCo: {self.groups.describe()}, {c.inner} inside a group; sync every {c.sync_every} "
                f"steps, {outer}, outer gradients as {c.outer_dtype}{stream}")

    # -- host access to the replica's parameters -------------------------------------
    def _host(self, off: int, size: int) -> np.ndarray:
        data = self.flat.data
        if isinstance(data, np.ndarray):
            return data[off:off + size]
        return np.asarray(self.flat.backend.to_numpy(data[off:off + size]))

    def _put(self, off: int, values: np.ndarray) -> None:
        data = self.flat.data
        if isinstance(data, np.ndarray):
            data[off:off + values.shape[0]] = values
        else:
            be = self.flat.backend
            be.copy_(data[off:off + values.shape[0]], be.asarray(values, np.dtype(values.dtype).name))

    # -- the seam's moments ----------------------------------------------------------
    def loss_scale(self, batch) -> float:
        """``global / group`` share of this step's batch: the group's gradient sum is the
        gradient of the group's mean loss (each group is a data-parallel job of its own).
        Without padding the share follows from the shard rule (no communication); with
        per-micro-batch weights (padded sequences) the group sums its ranks' weights."""
        if self.M == 1:
            return 1.0
        if batch.weights is None:
            n, N = int(batch.global_samples), self.world.size
            group = sum(shard_range(n, N, r)[1] for r in self.group_world_ranks)
            return n / group if group else 1.0
        share = np.array([float(sum(batch.weights))], dtype=np.float64)
        if self.L > 1:
            from hpcdp import comm as hcomm
            hcomm.allreduce(share, comm=self.groups.group_comm, op="sum", timeout=self.timeout)
        return 1.0 / share[0] if share[0] > 0 else 1.0

    def zero_grad(self) -> None:
        self._poll()
        self.inner.zero_grad()

    def begin_backward(self, last_micro: bool = True) -> None:
        self._poll()
        self.inner.begin_backward(last_micro)

    def finish_gradients(self) -> bool | None:
        return self.inner.finish_gradients()

    def step(self) -> None:
        self.inner.step()
        self.t += 1
        self._outer(self.t)

    def set_grad_codec(self, codec) -> None:
        raise NotImplementedError("parallel.strategy = \"diloco\" carries no gradient codec (exact mode is "
                                  "refused for it: docs/diloco.md)")

    # -- the outer loop ----------------------------------------------------------------
    def _outer(self, t: int) -> None:
        q = self.schedule.sent_at(t)
        if q is not None:
            self._send(q)
        p = self.schedule.lands_at(t)
        if p is not None and self.pending is not None and self.pending[0] == p:
            self._land()

    def _poll(self) -> None:
        if self.pending is not None:
            t0 = time.perf_counter()
            self.pending[1].test()
            self._poll_s += time.perf_counter() - t0

    def _send(self, p: int) -> None:
        if self.pending is not None:  # cannot happen with overlap < sync_every / fragments
            self._land()
        c = self.chunks[p]
        np.subtract(c.theta, self._host(c.offset, c.size), out=c.delta)  # old - new: the outer gradient
        ex = OuterExchange(c.delta, comm=self.groups.cross_comm, groups=self.M,
                           outer_dtype=self.cfg.outer_dtype, block=self.cfg.outer_block,
                           ledger=self.ledger, timeout=self.timeout)
        self.pending = (p, ex, self.t)
        self._sends += 1

    def _land(self) -> None:
        p, ex, _sent = self.pending
        t0 = time.perf_counter()
        ex.wait()
        t1 = time.perf_counter()
        self._exposed_s += t1 - t0
        self._inflight_s += (getattr(ex, "done_at", t1)) - ex.started
        self.pending = None
        c = self.chunks[p]
        c.opt.step(c.theta, c.delta)               # theta -= outer_lr * nesterov(mean delta)
        self._apply(p)
        self._last_landed[p] = self.t
        self._lands += 1
        self._land_s += time.perf_counter() - t1
        k = self.cfg.check_every
        if k and p == len(self.chunks) - 1 and (self.t // self.cfg.sync_every) % k == 0:
            self._check_groups_identical(f"after inner step {self.t}")

    def _apply(self, p: int, mixing: float | None = None) -> None:
        """The group's new outer values of fragment ``p`` (its chunks all-gathered in the
        group) mixed into the replica."""
        c, f = self.chunks[p], self.fragments[p]
        alpha = self.cfg.mixing if mixing is None else mixing
        if self.L > 1:
            buf = self._fragment_buffer(f.size)
            co = c.offset - f.offset
            buf[co:co + c.size] = c.theta
            from hpcdp import comm as hcomm
            hcomm.all_gather(buf, comm=self.groups.group_comm, algorithm="ring", timeout=self.timeout,
                             ledger=kind_ledger(self.ledger, "intra", "outer_gather"))
            new, off = buf, f.offset
        else:
            new, off = c.theta, c.offset
        if alpha:
            new = alpha * self._host(off, new.shape[0]) + (1.0 - alpha) * new
            new = new.astype(np.dtype(self.flat.dtype), copy=False)
        self._put(off, new)

    def _fragment_buffer(self, n: int) -> np.ndarray:
        if self._gather_buf is None or self._gather_buf.shape[0] < n:
            self._gather_buf = np.empty(max(f.size for f in self.fragments), dtype=np.dtype(self.flat.dtype))
        return self._gather_buf[:n]

    def finish_updates(self) -> None:
        """After the last step: land the exchange in flight, then a last outer step of
        every fragment trained since it last landed (blocking; mixing 0), so every
        group ends with the same parameters, the outer ones, holding all groups' work."""
        if self.flat is None:
            return
        if self.pending is not None:
            self._land()
        for p, c in enumerate(self.chunks):
            if self._last_landed[p] == self.t:
                continue
            np.subtract(c.theta, self._host(c.offset, c.size), out=c.delta)
            OuterExchange(c.delta, comm=self.groups.cross_comm, groups=self.M,
                          outer_dtype=self.cfg.outer_dtype, block=self.cfg.outer_block,
                          ledger=self.ledger, timeout=self.timeout).wait()
            c.opt.step(c.theta, c.delta)
            self._apply(p, mixing=0.0)
            self._last_landed[p] = self.t

    # -- replicas ------------------------------------------------------------------------
    def outer_hash(self) -> int:
        h = hashlib.blake2b(digest_size=8)
        for c in self.chunks:
            h.update(np.ascontiguousarray(c.theta).view(np.uint8))
        return int.from_bytes(h.digest(), "little")

    def _check_groups_identical(self, when: str) -> None:
        """The groups' outer parameters (each rank's chunks) compared across groups; at
        setup the replicas themselves. A sync point (small all-gather on cross_comm)."""
        if self.M == 1:
            return
        every = np.zeros(self.M, dtype=np.uint64)
        if when == "before step 1":
            data = self._host(0, self.flat.numel)
            every[self.g] = int.from_bytes(hashlib.blake2b(np.ascontiguousarray(data).view(np.uint8),
                                                           digest_size=8).digest(), "little")
        else:
            every[self.g] = self.outer_hash()
        from hpcdp import comm as hcomm
        hcomm.all_gather(every, comm=self.groups.cross_comm, timeout=self.timeout)
        if len(set(int(v) for v in every)) == 1:
            return
        hint = ("build the model from the same seed on every rank" if when == "before step 1" else
                "the groups applied different outer updates")
        raise ReplicaMismatch(f"DiLoCo replica check {when}: the {self.M} groups' parameters differ "
                              f"(hashes {[f'{int(v):016x}' for v in every]}); {hint}")

    # -- figures ---------------------------------------------------------------------
    def _reset_figures(self) -> None:
        self._exposed_s = self._inflight_s = self._poll_s = self._land_s = 0.0
        self._sends = self._lands = 0

    def step_stats(self) -> dict:
        out = self.inner.step_stats()
        delta = self.ledger.delta(self._snap) if self.ledger is not None else {}
        self._snap = self.ledger.snapshot() if self.ledger is not None else None
        sums = {"intra_bytes_sent": 0.0, "inter_bytes_sent": 0.0, "outer_bytes_sent": 0.0}
        for name, d in delta.items():
            kind = name.rpartition(".")[2]
            if kind in ("intra", "inter"):
                sums[f"{kind}_bytes_sent"] += float(d["sent_bytes"])
            if name.startswith(("outer.", "outer_scale.")):
                sums["outer_bytes_sent"] += float(d["sent_bytes"])
        out.update(sums)
        out.update({"outer_exposed_s": self._exposed_s, "outer_inflight_s": self._inflight_s,
                    "outer_poll_s": self._poll_s, "outer_apply_s": self._land_s,
                    "outer_sends": float(self._sends), "outer_lands": float(self._lands)})
        self._reset_figures()
        return out

    # -- shutdown --------------------------------------------------------------------
    def close(self) -> None:
        if self.pending is not None:
            self.pending[1].wait()
            self.pending = None
        for h in self._hooks:
            h.remove()
        self._hooks = []
        self.inner.close()
        if self.groups is not None:
            self.groups.free()
            self.groups = None

    def abandon(self) -> None:
        self.pending = None
        for h in self._hooks:
            h.remove()
        self._hooks = []
        self.inner.abandon()


__all__ = ["DiLoCo", "ReplicaMismatch", "make_inner"]
