"""ZeRO stage 3: parameters, gradients and optimizer state all sharded. Between steps
a rank holds only its shard of each unit (``Psi / N`` parameters, gradients and
optimizer state: 16 Psi / N bytes with fp32 and AdamW).

A unit (``flat.units``: a block, or the root unit of embeddings, final LayerNorm and
head) is gathered when it is needed and released after use, FSDP2-style:

- pre-forward hook: all-gather the unit (its shard copied into a unit-sized buffer,
  tag "working", then an in-place ring all-gather) and bind its parameters to it;
  start the gathers of the next ``prefetch`` units in the recorded forward order;
- post-forward hook: release the unit's parameters, and hook its output tensor;
- pre-backward hook (on that output, before any of the unit's backward ops): gather
  the unit again, bind a zeroed unit-sized gradient buffer, prefetch the next units
  in backward order;
- when every parameter of the unit has its final gradient: release the parameters;
  the bucket engine reduce-scatters the gradient buffer in place (launch order fixed
  from the end of the buffer, the same on every rank) and on completion adds this
  rank's chunk into its gradient shard and releases the buffer.

So a full parameter exists only for the units in flight. Working set (elements):
the root unit stays gathered for the whole forward (its forward brackets the
blocks') and, with its gradient buffer, for the whole backward (the tied ``wte`` is
final last); plus the current block's parameters and gradients, up to ``prefetch``
prefetched blocks' parameters, and the gradient buffer of at most one earlier block
whose reduce-scatter is still in flight (a unit's backward waits for older ones
first): ``2 root + (1 + prefetch) block + 2 block`` at most. Bytes per step (accum = 1): two
all-gathers and one reduce-scatter per unit, 3 (N-1)/N Psi. Every micro-batch
gathers and reduces again (accumulation multiplies all three).

Prefetch follows the order recorded on the first step (which runs without prefetch,
and where every unit moment is agreed across ranks: order.py); ``prefetch = 0``
gathers each unit only when it is needed. With the Python ring a prefetched gather
advances only when the code polls it (at the next hook); with the compiled engine
the progress thread advances it while compute runs (hpcdp.comm.engines.compiled.progress).
``step_stats`` reports ``gather_s`` (the unit gathers' in-flight time) beside
``gather_wait_s`` (the time blocked on them); docs/zero.md.
"""

from __future__ import annotations

import time

import numpy as np

from hpcdp.strategies.engine import BucketEngine, wait_progressing
from hpcdp.strategies.zero.common import ZeroStrategy
from hpcdp.strategies.zero.groups import plan_unit_groups
from hpcdp.strategies.zero.order import BACKWARD, END, FORWARD, UnitOrderMismatch, agree


class ZeroStage3(ZeroStrategy):
    stage = 3
    full_storage = ()
    params_on_wire = True  # a unit's gather is a working copy: comm_dtype applies (common.py)

    def setup(self, flat, optimizer, world) -> None:
        self.flat = flat
        self._require_units()
        self._setup_common(flat, optimizer, world, plan_unit_groups(flat))
        be, dtype = self.backend, flat.dtype
        buckets = self.plan.buckets
        self._g = {u.index: next(b.index for b in buckets if b.offset == u.offset)
                   for u in flat.units if u.size}
        self._names = [u.name for u in flat.units]
        # This rank's parameter shard: cut from a full buffer if the model was built
        # with one (then dropped), else made from the init recipes, piece by piece.
        self.pshard = be.alloc((self.shard_numel,), dtype, "params")
        for b, (off, size) in self.mine.items():
            if size:
                src = flat.data[off:off + size] if flat.data is not None else flat.init_values(off, size)
                be.copy_(self._shard_of(self.pshard, b), src)
        flat.drop_full_data()
        flat.drop_full_grad()
        self.gshard = be.alloc((self.shard_numel,), dtype, "grads", zero=True)
        self._params_of = [len(b.params) for b in buckets]
        self._group_of_param = {}
        for b in buckets:
            for i in b.params:
                self._group_of_param[i] = b.index
        self._events: list = []
        self._next_fwd = self._next_bwd = None   # prefetch maps, built after step 1
        self._wire()

    def _wire(self) -> None:
        """The bucket engine and the hooks, nothing gathered or in flight (setup, and
        rejoin after a repair: the failed step's unit buffers are released)."""
        flat, buckets = self.flat, self.plan.buckets
        for b, bk in enumerate(buckets):
            if getattr(self, "_pbuf", None) and self._pbuf[b] is not None:
                flat.release(bk.offset, bk.size, data=True)
            if getattr(self, "_gbuf", None) and self._gbuf[b] is not None:
                flat.release(bk.offset, bk.size, grad=True)
        n = len(buckets)
        self._pbuf, self._preq, self._gbuf = [None] * n, [None] * n, [None] * n
        if self.grad_codec is not None:
            self._gpay = [None] * n
        self.engine = BucketEngine(self.plan, self._reduce_grads, on_done=self._grads_reduced,
                                   name="ZeRO-3")
        self.engine.attach(flat)
        self._handles = [flat.params[s.name].register_grad_ready_hook(self._make_ready(i))
                         for i, s in enumerate(flat.layout)]
        for u in flat.units:
            if u.size:
                self._handles.append(u.module.register_forward_pre_hook(self._make_pre_forward(u.index)))
                self._handles.append(u.module.register_forward_hook(self._make_post_forward(u.index)))
        self._left = list(self._params_of)
        self._micro = 0
        self._checking, self._moment, self._broken = False, 0, False
        self._spans: list = []  # this step's unit all-gathers, (start, completion): gather_s

    def replica_arrays(self) -> list:
        return [self.pshard]

    # -- gathering ---------------------------------------------------------------------
    def _launch_gather(self, b: int) -> None:
        bk = self.plan.buckets[b]
        buf = self.backend.alloc((bk.size,), self.flat.dtype, "working")
        self.backend.copy_(self._chunk_view(buf, b), self._shard_of(self.pshard, b))
        self._pbuf[b], self._preq[b] = buf, self._all_gather(buf)

    def _poll(self) -> None:
        """Advance every request in flight: reduce-scatters and prefetched gathers."""
        self.engine.progress()
        for b, req in enumerate(self._preq):
            if req is not None and req.test():
                self._bind_params(b)

    def _bind_params(self, b: int) -> None:
        bk = self.plan.buckets[b]
        req = self._preq[b]
        if getattr(req, "done_at", None) is not None:  # spans only: no buffer kept alive
            self._spans.append((req.started, req.done_at))
        self._preq[b] = None
        self.flat.bind(bk.offset, bk.size, data=self._pbuf[b])

    def _gather(self, b: int) -> None:
        """Unit b gathered and bound when this returns (launched now if no prefetch did)."""
        if self._pbuf[b] is None:
            self._launch_gather(b)
        req = self._preq[b]
        if req is not None:
            t0 = time.perf_counter()
            wait_progressing(req, self._poll)
            self.gather_wait_s += time.perf_counter() - t0
            if self._preq[b] is not None:
                self._bind_params(b)

    def _release_params(self, b: int) -> None:
        if self._pbuf[b] is not None and self._preq[b] is None:
            bk = self.plan.buckets[b]
            self.flat.release(bk.offset, bk.size, data=True)
            self._pbuf[b] = None

    def _prefetch(self, nxt, unit: int) -> None:
        if nxt is None or not self.cfg.prefetch:
            return
        for v in nxt.get(unit, ()):
            b = self._g[v]
            if self._pbuf[b] is None:
                self._launch_gather(b)

    # -- moments -------------------------------------------------------------------------
    def _moment_at(self, kind: int, unit: int) -> None:
        """On checked steps, agree on this moment across ranks (order.py); on step 1
        also record it (the prefetch order)."""
        if self._checking:
            try:
                agree(self.hcomm, self.comm, self.timeout, self._moment, kind, unit,
                      self._names, self._steps + 1)
            except UnitOrderMismatch:
                self._broken = True
                raise
            self._moment += 1
        if self._steps == 0:
            self._events.append((kind, unit))

    def _make_pre_forward(self, unit: int):
        def pre_forward(_module, _args):
            self._moment_at(FORWARD, unit)
            self._gather(self._g[unit])
            self._prefetch(self._next_fwd, unit)
        return pre_forward

    def _make_post_forward(self, unit: int):
        def post_forward(_module, _args, out):
            if getattr(out, "requires_grad", False):
                out.register_pre_backward_hook(lambda _t: self._pre_backward(unit))
            self._release_params(self._g[unit])
        return post_forward

    def _pre_backward(self, unit: int) -> None:
        b = self._g[unit]
        self._moment_at(BACKWARD, unit)
        self._gather(b)
        self._bind_grad_buffer(b)
        self._prefetch(self._next_bwd, unit)

    def _make_ready(self, index: int):
        b = self._group_of_param[index]

        def ready(_param):
            self._left[b] -= 1
            if self._left[b] == 0:  # the unit's backward is over: its parameters go
                self._release_params(b)
        return ready

    # -- the step ----------------------------------------------------------------------
    def zero_grad(self) -> None:
        self._spans = []  # (gathers between steps, e.g. evaluation's, are not the step's)
        self.backend.fill_(self.gshard, 0.0)
        self._codec_zero()
        self._micro = 0
        self._checking = self._steps == 0 or self.debug
        self._moment = 0

    def begin_backward(self, last_micro: bool = True) -> None:
        if self._micro:
            self.engine.flush()  # the previous micro-batch's reduce-scatters
        self._micro += 1
        self._left = list(self._params_of)
        self.engine.arm(self.cfg.overlap)

    def finish_gradients(self) -> bool | None:
        if self._checking:  # before the flush: a rank that ran fewer units stops here
            self._moment_at(END, -1)
            self._checking = False
        self.engine.flush()
        for b in range(len(self.plan.buckets)):  # a unit still gathered (no backward)
            if self._preq[b] is not None:
                self._gather(b)
            self._release_params(b)
        if self._steps == 0 and self._next_fwd is None:
            self._build_prefetch_maps()
        self._micro = 0
        return self._codec_finish()

    def _build_prefetch_maps(self) -> None:
        kinds = [k for k, _ in self._events]
        first_b = kinds.index(BACKWARD) if BACKWARD in kinds else len(kinds)
        fwd = [u for k, u in self._events[:first_b] if k == FORWARD]
        rest = self._events[first_b:]
        nxt_f = next((i for i, (k, _) in enumerate(rest) if k == FORWARD), len(rest))
        bwd = [u for k, u in rest[:nxt_f] if k == BACKWARD]
        d = self.cfg.prefetch

        def after(order):
            out = {}
            for i, u in enumerate(order):
                out.setdefault(u, order[i + 1:i + 1 + d])
            return out
        self._next_fwd, self._next_bwd = after(fwd), after(bwd)
        self._events = []

    def step_stats(self) -> dict:
        """The common figures plus ``gather_s``: the wall time during which at least
        one unit all-gather was in flight (the union of the requests' [start,
        completion] intervals), against ``gather_wait_s``, the time the training
        thread was blocked on them: ``1 - gather_wait_s / gather_s`` of the gathers
        was hidden behind compute."""
        out = super().step_stats()
        out["gather_s"] = inflight_union(self._spans)
        self._spans = []
        return out

    def step(self) -> None:
        self._update([self.pshard], [self.gshard])
        self._steps += 1

    def param_shard(self):
        """This rank's parameters: its owned ranges concatenated (checkpoints)."""
        return self.pshard

    def gather_full_params(self):
        """Every parameter as one host array: each unit gathered into a transient
        buffer (not tracked, not in the ledger), for tests and exports."""
        out = np.empty(self.flat.numel, dtype=self.flat.dtype)
        for b, bk in enumerate(self.plan.buckets):
            buf = self.backend.empty((bk.size,), self.flat.dtype)
            self.backend.copy_(self._chunk_view(buf, b), self._shard_of(self.pshard, b))
            self.hcomm.all_gather(buf, comm=self.shard_comm, timeout=self.timeout)
            out[bk.offset:bk.offset + bk.size] = self.backend.to_numpy(buf)
        return out

    def close(self) -> None:
        if self._broken:  # ranks disagreed on the units: nothing in flight is waited on
            self.abandon()
            if self.comm is not None:  # every rank raised UnitOrderMismatch and closes alike
                self.comm.Free()
                self.comm = None
            if self.groups is not None:
                self.groups.free()
                self.groups = None
            return
        for b, req in enumerate(getattr(self, "_preq", ())):
            if req is not None and not getattr(self, "_abandoned", False):
                wait_progressing(req, self._poll)
        super().close()


def inflight_union(spans) -> float:
    """Seconds during which at least one of the ``(start, end)`` intervals was open
    (a request's [started, done_at] on time.monotonic's clock)."""
    total, end = 0.0, float("-inf")
    for a, z in sorted(spans):
        if z > end:
            total += z - max(a, end)
            end = z
    return total


__all__ = ["ZeroStage3", "inflight_union"]
