"""The Python engine: hpcdp's schedules run as Python requests.

It runs every registered algorithm that has a start (hpcdp.comm.algorithms: the ring's
``RingRequest``, recursive doubling, halving / doubling, Bruck, the two-level
collectives), takes any call (numpy or device buffers, any op, a 16-bit wire on the
ring) and is always available: the chooser's fallback when the engine asked for does
not take a call (hpcdp.comm.select). Its requests move when they are polled (``test``,
``wait``), so it does not progress on its own.
"""

from __future__ import annotations

import numpy as np

from hpcdp.comm.engines.base import Engine
from hpcdp.comm.engines.wire import wire_format
from hpcdp.shard import place_shard


def launch(ctx, alg, plan, call, ledger, timeout, bufs, segment_bytes, max_message_bytes,
           blocking, asked):
    """Start ``alg`` (its registered start) on checked buffers
    (hpcdp.comm.engines.registry); an all-gather's chunk is copied into place first."""
    if plan.collective == "all_gather":
        bufs = dict(bufs)
        chunk = bufs.pop("chunk")
        if chunk is not None:
            place_shard(bufs["full"], chunk, ctx.size, ctx.rank)
    if plan.wire != "float32":  # (only the ring carries one: hpcdp.comm.select)
        bufs = dict(bufs, wire=wire_format(plan.wire, np.float32))
    return alg.start(ctx, call, ledger, timeout, segment_bytes=segment_bytes,
                     max_message_bytes=max_message_bytes, **bufs)


ENGINE = Engine("python", runs=lambda alg: alg.start is not None, launch=launch)
