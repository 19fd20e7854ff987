"""The ``[comm]`` settings of this process, with their environment overrides.

One place reads them: the chooser (hpcdp.comm.select), the engines, the topology and
every communicator's context ask :func:`settings`. Their source is the ``[comm]`` section
of the run's config (hpcdp.config.CommConfig, handed over by :func:`configure`: train.py
does it before it builds a strategy) or, for a library user who never configures, its
defaults. An environment variable may override one value (table below): the override
is logged once per process, so a run's log says which knobs did not come from its
config. Every rank must see the same values (the same config file; an override set on
every rank), since several of them decide which messages a collective sends.

========================  ================================  ===============================
``[comm]`` key            environment override              what it decides
========================  ================================  ===============================
engine                    HPCDP_COMM_ENGINE                 who runs hpcdp's ring
lean                      HPCDP_COMM_LEAN                   MPI's own small blocking calls
progress                  HPCDP_COMM_PROGRESS               who progresses compiled requests
profile                   HPCDP_PROFILE                     auto asks the cost model
ranks_per_node            HPCDP_RANKS_PER_NODE              the nodes of the topology
<c>_crossover             HPCDP_<C>_CROSSOVER               auto's bound for MPI's own call
cuda_aware                HPCDP_CUDA_AWARE                  device buffers straight to MPI
debug                     HPCDP_DEBUG                       the fingerprint check
timeout                   HPCDP_COMM_TIMEOUT                a collective's default deadline
algorithm, allreduce,     (none)                            what ``algorithm="auto"`` runs
reduce_scatter, all_gather
========================  ================================  ===============================

:func:`generation` counts how often the settings changed (:func:`configure`,
:func:`reload`): decisions cached on a communicator (hpcdp.comm.select) are made again
when it moves, so no rank keeps a choice made under older settings.

Imports no MPI: the cost model's tools and the config tests read it without MPI.
"""

from __future__ import annotations

import dataclasses
import logging
import os

from hpcdp.config import COMM_ENGINES, CommConfig

log = logging.getLogger("hpcdp.comm")

COLLECTIVES = ("allreduce", "reduce_scatter", "all_gather")
LEAN_PATHS = ("compiled", "mpi4py")
PROGRESS_MODES = ("auto", "thread", "calls")
CUDA_AWARE = ("auto", "true", "false")
RANKS_PER_NODE_ENV = "HPCDP_RANKS_PER_NODE"


@dataclasses.dataclass(frozen=True)
class Settings:
    """The values in force (module docstring). ``algorithms``: collective -> the
    algorithm "auto" runs by config ("auto": the size rule / the cost model);
    ``crossover``: collective -> bytes (None: the measured table's)."""

    algorithms: dict
    engine: str = "compiled"
    lean: str = "compiled"
    progress: str = "auto"
    profile: str = ""
    ranks_per_node: int = 0
    crossover: dict = dataclasses.field(default_factory=dict)
    cuda_aware: str = "auto"
    debug: bool = False
    timeout: float = 300.0
    overridden: tuple = ()  # the [comm] keys an environment variable set

    def algorithm(self, collective: str) -> str:
        return self.algorithms.get(collective, "auto")


def _truthy(raw: str) -> bool:
    return raw.strip().lower() not in ("", "0", "false", "no", "off")


def _choice(var, raw, allowed):
    value = raw.strip().lower()
    if value not in allowed:
        raise ValueError(f"{var} must be one of {allowed}, got {raw!r}")
    return value


def _whole(var, raw, lo):
    try:
        value = int(raw)
    except ValueError:
        value = lo - 1
    if value < lo:
        raise ValueError(f"{var} must be a whole number >= {lo}, got {raw!r}")
    return value


def _bytes(var, raw):
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"{var} must be an integer byte count, got {raw!r}") from None


def _seconds(var, raw):
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{var} must be a number of seconds, got {raw!r}") from None
    if not value > 0:
        raise ValueError(f"{var} must be > 0 seconds, got {raw!r}")
    return value


# (key of Settings, environment variable, parser, [comm] key for the log)
_OVERRIDES = [
    ("engine", "HPCDP_COMM_ENGINE", lambda v, r: _choice(v, r, COMM_ENGINES), "engine"),
    ("lean", "HPCDP_COMM_LEAN", lambda v, r: _choice(v, r, LEAN_PATHS), "lean"),
    ("progress", "HPCDP_COMM_PROGRESS", lambda v, r: _choice(v, r, PROGRESS_MODES), "progress"),
    ("profile", "HPCDP_PROFILE", lambda v, r: r.strip(), "profile"),
    ("ranks_per_node", RANKS_PER_NODE_ENV, lambda v, r: _whole(v, r, 1), "ranks_per_node"),
    ("cuda_aware", "HPCDP_CUDA_AWARE",
     lambda v, r: "true" if _truthy(r) else "false", "cuda_aware"),
    ("debug", "HPCDP_DEBUG", lambda v, r: _truthy(r), "debug"),
    ("timeout", "HPCDP_COMM_TIMEOUT", _seconds, "timeout"),
]

_STATE: dict = {"config": None, "settings": None, "generation": 0, "told": set()}


def _build(cfg) -> Settings:
    base = cfg if cfg is not None else CommConfig()
    algorithms = {}
    for c in COLLECTIVES:
        own = getattr(base, c, "") or ""
        algorithms[c] = own or base.algorithm
    values = dict(engine=base.engine, lean=base.lean, progress=base.progress,
                  profile=base.profile, ranks_per_node=base.ranks_per_node,
                  cuda_aware=base.cuda_aware, debug=bool(base.debug),
                  timeout=float(base.timeout))
    # bytes, or None: the measured table's (a config's 0; the variable may say 0: always the ring)
    crossover = {c: int(getattr(base, f"{c}_crossover", 0) or 0) or None for c in COLLECTIVES}
    overridden = []
    for key, var, parse, cfg_key in _OVERRIDES:
        raw = os.environ.get(var)
        if raw is None or raw.strip() == "":
            continue
        value = parse(var, raw)
        if value != values[key]:
            _tell(var, raw, cfg_key, values[key])
        values[key] = value
        overridden.append(cfg_key)
    for c in COLLECTIVES:
        var = f"HPCDP_{c.upper()}_CROSSOVER"
        raw = os.environ.get(var)
        if raw is None or raw.strip() == "":
            continue
        value = _bytes(var, raw)
        if value != crossover[c]:
            _tell(var, raw, f"{c}_crossover", crossover[c])
        crossover[c] = value
        overridden.append(f"{c}_crossover")
    return Settings(algorithms=algorithms, crossover=crossover, overridden=tuple(overridden),
                    **values)


def _tell(var, raw, key, was) -> None:
    told = _STATE["told"]
    if (var, raw) in told:
        return
    told.add((var, raw))
    log.info("hpcdp.comm: %s=%s overrides [comm] %s = %r", var, raw.strip(), key, was)


def settings() -> Settings:
    """The settings in force: the configured ``[comm]`` (or its defaults) with the
    environment's overrides, read on first use and after :func:`reload`."""
    s = _STATE["settings"]
    if s is None:
        s = _STATE["settings"] = _build(_STATE["config"])
    return s


def configure(comm_cfg=None) -> Settings:
    """Take ``comm_cfg`` (hpcdp.config.CommConfig; None: the defaults) as this process's
    ``[comm]``: every decision made from then on follows it (module docstring)."""
    _STATE["config"] = comm_cfg
    return reload()


def reload() -> Settings:
    """Read the environment again (tests that change it) and drop every cached decision
    (:func:`generation` moves)."""
    invalidate()
    return settings()


def invalidate(defaults: bool = False) -> None:
    """Like :func:`reload`, reading the environment only when next asked; ``defaults``:
    forget the configured ``[comm]`` too (a test harness between tests)."""
    if defaults:
        _STATE["config"] = None
    _STATE["settings"] = None
    _STATE["generation"] += 1


def once(key) -> bool:
    """True the first time ``key`` is asked for in this process: a line logged once
    (e.g. the chooser's notes)."""
    told = _STATE["told"]
    if key in told:
        return False
    told.add(key)
    return True


def generation() -> int:
    """How many times the settings changed: caches of decisions compare it."""
    return _STATE["generation"]


__all__ = ["Settings", "settings", "configure", "reload", "invalidate", "generation", "once", "COLLECTIVES",
           "RANKS_PER_NODE_ENV",
           "LEAN_PATHS", "PROGRESS_MODES"]
