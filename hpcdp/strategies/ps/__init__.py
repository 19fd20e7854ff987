"""Parameter-server data parallelism (``parallel.strategy = "ps"``).

Workers compute gradients on their slice of the global batch and push them to the
servers; each server owns one shard of the flat buffer (``shard_range``), aggregates
(sum by default, user-defined allowed) and either applies the optimizer itself
(``update = "server"``: optimizer state only on servers) or returns the aggregated
gradient (``update = "worker"``). Workers pull the results.

- ``mode = "sync"``: a step completes when every worker's gradient is aggregated
  (sync.py: the blocking reference).
- ``mode = "async"``: non-blocking pushes and pulls with staleness bound
  ``staleness = k`` (worker.py, server.py; definitions in staleness.py and
  docs/parameter-server.md): k = 0 reproduces sync exactly, ``"none"`` never waits.

Options (``[parallel.ps]``): ``servers`` (S), ``colocated`` (servers are also
workers, or the last S ranks serve only), ``mode``, ``staleness``, ``update``,
``aggregate`` ("sum", "mean" or "module:function"), ``stale_lr`` (async only:
staleness-aware learning rate, shares ``1 / max(1, staleness)``: "relative" (default,
normalized over each update), "inverse" (absolute) or "none"; staleness.py).
"""

from hpcdp.config_parallel import PSConfig

from .strategy import ParameterServer, build

__all__ = ["PSConfig", "ParameterServer", "build"]
