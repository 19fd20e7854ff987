"""ZeRO stage 2: full parameters, but only this rank's shard of the gradients and of
the optimizer state. No full-size gradient buffer exists.

Gradient storage is bound per group (whole units up to ``bucket_mb``): at the
pre-backward moment of a group's first unit to run backward (a hook on that unit's
output), a zeroed group-sized buffer is allocated (memory tag "working") and bound
as the ``.grad`` of the group's parameters. When every parameter of the group is
final, the bucket engine reduce-scatters the buffer in place, overlapped with the
rest of backward; on completion this rank's chunk is added into its gradient shard
(tag "grads", ``Psi / N`` elements) and the buffer is released.

Gradient accumulation: there is no full buffer to accumulate micro-batches in, so
EVERY micro-batch's backward reduce-scatters its groups and the shard accumulates
the reduced chunks. Cost: ``accum`` reduce-scatters per step instead of one (the
gradient bytes grow with the number of micro-batches: (accum + 1)(N-1)/N Psi per
step instead of 2(N-1)/N Psi), for the same memory as one micro-batch.

After the update of this rank's pieces of ``flat.data`` (gradients from the shard),
every group is all-gathered in place. Memory (fp32, AdamW): 4 Psi + 12 Psi / N plus
the group buffers in flight.
"""

from __future__ import annotations

import numpy as np

from hpcdp.strategies.buckets import bucket_cap_elements
from hpcdp.strategies.engine import BucketEngine
from hpcdp.strategies.zero.common import ZeroStrategy
from hpcdp.strategies.zero.groups import plan_groups


class ZeroStage2(ZeroStrategy):
    stage = 2
    full_storage = ("data",)

    def setup(self, flat, optimizer, world) -> None:
        flat.materialize(("data",))
        flat.drop_full_grad()
        self.flat = flat
        self._require_units()
        cap = bucket_cap_elements(self.cfg.bucket_mb, np.dtype(flat.dtype).itemsize,
                                  "parallel.zero.bucket_mb")
        self._setup_common(flat, optimizer, world, plan_groups(flat, cap))
        be = self.backend
        self.gshard = be.alloc((self.shard_numel,), flat.dtype, "grads", zero=True)
        # unit -> its group; a hook on each unit's output binds the group's storage
        self._group_of = {}
        for u in flat.units:
            self._group_of[u.index] = next(b.index for b in self.plan.buckets
                                           if b.offset <= u.offset < b.offset + b.size)
        self._wire()

    def _wire(self) -> None:
        """The bucket engine and the units' hooks, nothing in flight (setup, and rejoin
        after a repair)."""
        flat = self.flat
        for b, buf in enumerate(getattr(self, "_gbuf", ())):  # a repair: the failed step's buffers go
            if buf is not None:
                bk = self.plan.buckets[b]
                flat.release(bk.offset, bk.size, grad=True)
        self._gbuf = [None] * len(self.plan.buckets)   # group gradient buffers in flight
        if self.grad_codec is not None:
            self._gpay = [None] * len(self.plan.buckets)
        self.engine = BucketEngine(self.plan, self._reduce_grads, on_done=self._grads_reduced,
                                   name="ZeRO-2")
        self.engine.attach(flat)
        self._handles = [u.module.register_forward_hook(self._make_post_forward(u.index))
                         for u in flat.units]
        self._micro = 0

    def _make_post_forward(self, unit: int):
        def post_forward(_module, _args, out):
            if getattr(out, "requires_grad", False):
                out.register_pre_backward_hook(lambda _t: self._bind_grad_buffer(self._group_of[unit]))
        return post_forward

    def zero_grad(self) -> None:
        self.backend.fill_(self.gshard, 0.0)
        self._codec_zero()
        self._micro = 0

    def begin_backward(self, last_micro: bool = True) -> None:
        # Every micro-batch reduces (no full buffer to accumulate in): finish the
        # previous micro-batch's reduce-scatters before this one's backward.
        if self._micro:
            self.engine.flush()
        self._micro += 1
        # Armed on one rank too: a group's buffer is released as soon as it is final.
        self.engine.arm(self.cfg.overlap)

    def finish_gradients(self) -> bool | None:
        self.engine.flush()
        self._micro = 0
        return self._codec_finish()

    def step(self) -> None:
        order = self._groups_in_flat_order()
        grads = [self._shard_of(self.gshard, b) for b in order]
        params = [self._chunk_view(self._full_view(self.flat.data, b), b) for b in order]
        self._update(params, grads)
        self._gather_groups_in_place(self.flat.data)
        self._steps += 1



__all__ = ["ZeroStage2"]
