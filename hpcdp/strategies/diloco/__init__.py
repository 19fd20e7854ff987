"""DiLoCo (``parallel.strategy = "diloco"``): replica groups that take ``sync_every``
inner steps alone and then average their parameter change through an outer SGD with
Nesterov momentum; streamed in fragments with the exchange overlapping inner steps
(Streaming DiLoCo). See docs/diloco.md.

- strategy.py: the strategy (inner strategy per group, the outer loop);
- groups.py: replica groups and their communicators, the link-kind ledger view;
- fragments.py: fragments of whole units and their staggered schedule (pure);
- exchange.py: one fragment's outer exchange across groups (a request);
- wire.py: the outer gradients on the wire (float32, bfloat16, int8 with shared scales);
- checkpoint.py: outer state and every replica's state in global coordinates.

Options: ``[parallel.diloco]`` (:class:`hpcdp.config_parallel.DiLoCoConfig`); the
inner strategy's own table (``[parallel.ddp]`` or ``[parallel.zero]``) applies inside
a group.
"""

from __future__ import annotations

from hpcdp.config_parallel import DiLoCoConfig

from .strategy import DiLoCo, ReplicaMismatch


def build(parallel_cfg, world=None, comm_cfg=None) -> DiLoCo:
    """From a ParallelConfig (``[parallel.diloco]`` and the inner strategy's table) and
    the ``[comm]`` section (timeout, debug)."""
    sub = parallel_cfg.sub if hasattr(parallel_cfg, "sub") else (lambda _n=None: None)
    kw = {}
    if comm_cfg is not None:
        kw["timeout"] = getattr(comm_cfg, "timeout", None)
        kw["debug"] = bool(getattr(comm_cfg, "debug", False))
    return DiLoCo(sub("diloco"), ddp=sub("ddp"), zero=sub("zero"), **kw)


__all__ = ["DiLoCo", "DiLoCoConfig", "ReplicaMismatch", "build"]
