"""ZeRO stage 1: every rank keeps full parameters and gradients, but only its shard
of the optimizer state (AdamW's m and v, SGD's momentum).

Per step, like DDP until the gradients are final: micro-batches before the last
accumulate into the full ``flat.grad``; during the last backward each group (whole
units up to ``bucket_mb``, groups.py) is reduce-scattered IN PLACE on its view of
``flat.grad`` as soon as its gradients are final (the bucket engine, as DDP's
allreduce), so this rank's chunk of every group holds the summed gradient. The
optimizer then updates this rank's pieces of ``flat.data`` in place (one optimizer
step over the pieces, zero copies), and every group is all-gathered in place on
``flat.data``. Bytes: one reduce-scatter plus one all-gather per group, the same as
DDP's allreduce. Memory (fp32, AdamW): 4 Psi + 4 Psi + 8 Psi / N.
"""

from __future__ import annotations

import numpy as np

from hpcdp.strategies.buckets import bucket_cap_elements
from hpcdp.strategies.engine import BucketEngine
from hpcdp.strategies.zero.common import ZeroStrategy
from hpcdp.strategies.zero.groups import plan_groups


class ZeroStage1(ZeroStrategy):
    stage = 1
    full_storage = ("data", "grad")

    def setup(self, flat, optimizer, world) -> None:
        flat.materialize(("data", "grad"))
        cap = bucket_cap_elements(self.cfg.bucket_mb, np.dtype(flat.dtype).itemsize,
                                  "parallel.zero.bucket_mb")
        self._setup_common(flat, optimizer, world, plan_groups(flat, cap))
        self._views = [self._full_view(flat.grad, b) for b in range(len(self.plan.buckets))]
        self._wire()

    def _wire(self) -> None:
        """The bucket engine on the current communicators (setup, and rejoin after a repair)."""
        self.engine = BucketEngine(self.plan, self._launch, name="ZeRO-1")
        self.engine.attach(self.flat)

    def _launch(self, b: int):
        if self.grad_codec is not None and self._encode_at_launch:
            bk = self.plan.buckets[b]
            self._payload.fold(bk.offset, bk.size)  # this group of the last micro-batch
        return self._reduce_scatter(self._views[b])

    def set_grad_codec(self, codec) -> None:
        """As DDP's: one payload buffer, each micro-batch encoded alone, the groups'
        reduce-scatters carry the payload; after ``codec.finish()`` only this rank's
        chunk of every group is decoded (the update reads only those)."""
        from hpcdp.strategies.codec import FullGradPayload

        self.grad_codec = codec
        self._payload = FullGradPayload(self.flat, codec)
        self._views = [self._full_view(self._payload.payload, b) for b in range(len(self.plan.buckets))]
        self._encode_at_launch = False

    def zero_grad(self) -> None:
        self.flat.zero_grad()
        if self.grad_codec is not None:
            self._payload.zero()

    def begin_backward(self, last_micro: bool = True) -> None:
        # Full gradients: earlier micro-batches accumulate locally, as in DDP.
        overlap = self.cfg.overlap and self.dp_size > 1
        if self.grad_codec is not None:
            self._payload.begin_micro()
            overlap = overlap and self._payload.on_host
            self._encode_at_launch = last_micro and overlap
        if last_micro:
            self.engine.arm(overlap)

    def finish_gradients(self) -> bool | None:
        codec = self.grad_codec
        if codec is not None and not self._encode_at_launch:
            self._payload.fold()
        self.engine.flush()
        if codec is None:
            return None
        self._encode_at_launch = False
        ok = codec.finish()
        if ok:
            self._payload.decode_into_grad([self.mine[b] for b in self._groups_in_flat_order()])
        return ok

    def step(self) -> None:
        order = self._groups_in_flat_order()
        grads = [self._chunk_view(self._full_view(self.flat.grad, b), b) for b in order]
        params = [self._chunk_view(self._full_view(self.flat.data, b), b) for b in order]
        self._update(params, grads)
        self._gather_groups_in_place(self.flat.data)
        self._steps += 1


__all__ = ["ZeroStage1"]
