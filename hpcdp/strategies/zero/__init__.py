"""ZeRO data parallelism (``parallel.strategy = "zero"``): the model state partitioned
across the data-parallel ranks, so memory per rank falls as 1/N while the bytes
moved stay at (stages 1, 2) or near (stage 3: 1.5x) DDP's. See docs/zero.md.

- stage1.py: optimizer state sharded (4 Psi + 4 Psi + 8 Psi / N with fp32 + AdamW);
- stage2.py: also gradients (4 Psi + 12 Psi / N);
- stage3.py: also parameters, gathered unit by unit (16 Psi / N);
- common.py: what they share; groups.py: which ranges one collective runs on;
  hybrid.py: hybrid sharding (``shard = "node"``: sharded in the node, replicated
  across nodes);
  order.py: stage 3's check that every rank runs the same units.

Who owns what is :func:`hpcdp.ownership.owned_ranges` (each group sharded on its own
by the shard rule), the bytes are :func:`hpcdp.comm.model.volume.zero_step_bytes`.
Options: ``[parallel.zero]`` (:class:`hpcdp.config_parallel.ZeroConfig`).
"""

from __future__ import annotations

from hpcdp.config_parallel import ZeroConfig

from .order import UnitOrderMismatch
from .stage1 import ZeroStage1
from .stage2 import ZeroStage2
from .stage3 import ZeroStage3

STAGES = {1: ZeroStage1, 2: ZeroStage2, 3: ZeroStage3}


def make_zero(options: ZeroConfig | None = None, **kw):
    """The stage's strategy for ``options`` (default: stage 1)."""
    options = options if options is not None else ZeroConfig()
    return STAGES[options.stage](options, **kw)


def build(parallel_cfg, world=None, comm_cfg=None):
    """From a ParallelConfig (its ``[parallel.zero]`` options) and ``[comm]``."""
    opts = parallel_cfg.sub("zero") if hasattr(parallel_cfg, "sub") else None
    kw = {}
    if comm_cfg is not None:
        kw["timeout"] = getattr(comm_cfg, "timeout", None)
        kw["debug"] = bool(getattr(comm_cfg, "debug", False))
    return make_zero(opts, **kw)


__all__ = ["ZeroStage1", "ZeroStage2", "ZeroStage3", "STAGES", "make_zero", "build",
           "UnitOrderMismatch", "ZeroConfig"]
