"""Run directories are never shared, even by runs started in the same second."""

from __future__ import annotations

import multiprocessing as mp
import os
from types import SimpleNamespace

import pytest

from hpcdp.config_error import ConfigError
from hpcdp.rundir import new_run_dir

LAUNCHES, TRIALS = 6, 20


def _create(root, barrier, queue):
    from hpcdp.rundir import new_run_dir as make
    cfg = SimpleNamespace(out_dir="", name="same")
    paths = []
    for _ in range(TRIALS):
        barrier.wait()  # every launcher creates its directory at the same moment
        paths.append(make(cfg, root=root))
    queue.put(paths)


def test_concurrent_launches_with_one_name_get_distinct_directories(tmp_path):
    ctx = mp.get_context("spawn")  # no inherited MPI state
    barrier, queue = ctx.Barrier(LAUNCHES), ctx.Queue()
    procs = [ctx.Process(target=_create, args=(str(tmp_path), barrier, queue)) for _ in range(LAUNCHES)]
    for p in procs:
        p.start()
    paths = [p for _ in procs for p in queue.get(timeout=120)]
    for p in procs:
        p.join(timeout=60)
    assert len(paths) == LAUNCHES * TRIALS == len(set(paths))  # 13 of 20 trials collided before
    assert all(os.path.isfile(os.path.join(p, "metrics.jsonl")) for p in paths)


def test_out_dir_is_claimed_once(tmp_path):
    cfg = SimpleNamespace(out_dir=str(tmp_path / "run"), name="x")
    assert new_run_dir(cfg) == str(tmp_path / "run")
    with pytest.raises(ConfigError, match="already holds a run"):
        new_run_dir(cfg)
