"""Role layout, shard ownership and the user aggregation probe (pure, no MPI)."""

import numpy as np
import pytest

from hpcdp.shard import shard_range
from hpcdp.strategies.ps.aggregate import agg_mean, agg_sum, probe, resolve_aggregate
from hpcdp.strategies.ps.roles import assign_roles


def test_colocated_servers_are_the_first_ranks_and_everyone_works():
    r = assign_roles(4, 2, colocated=True)
    assert r.servers == (0, 1) and r.workers == (0, 1, 2, 3)
    assert r.server_index(1) == 1 and r.server_index(2) is None
    assert r.worker_index(3) == 3


def test_dedicated_servers_are_the_last_ranks():
    r = assign_roles(5, 2, colocated=False)
    assert r.servers == (3, 4) and r.workers == (0, 1, 2)
    assert r.worker_index(3) is None and r.server_index(4) == 1
    assert r.num_workers == 3 and r.num_servers == 2


def test_shards_follow_the_one_rule():
    r = assign_roles(4, 3, colocated=True)
    assert [r.shard(10, s) for s in range(3)] == [shard_range(10, 3, s) for s in range(3)]


@pytest.mark.parametrize("size, servers, colocated, msg", [
    (2, 3, True, "more servers than ranks"),
    (2, 3, False, "more servers than ranks"),
    (2, 2, False, "zero workers"),
    (2, 0, True, "integer >= 1"),
    (2, -1, False, "integer >= 1"),
])
def test_bad_roles_are_clear_errors(size, servers, colocated, msg):
    with pytest.raises(ValueError, match=msg):
        assign_roles(size, servers, colocated)


def test_builtin_aggregations():
    g = [np.arange(3.0), np.ones(3), np.full(3, 2.0)]
    np.testing.assert_array_equal(agg_sum(g), [3.0, 4.0, 5.0])
    np.testing.assert_array_equal(agg_mean(g), [1.0, 4 / 3, 5 / 3])
    assert g[0][0] == 0.0  # inputs untouched
    assert resolve_aggregate("sum") is agg_sum


def _wrong_shape(grads):
    return np.stack(grads)


def test_module_function_spec_and_wrong_shape_probe():
    fn = resolve_aggregate(f"{__name__}:_wrong_shape")
    with pytest.raises(ValueError, match=r"returned shape \(2, 5\).*must return one gradient"):
        probe(fn, 2, 5, np.float64)
    probe(resolve_aggregate("mean"), 3, 5, np.float32)  # fine


def test_probe_reports_a_raising_aggregation():
    def boom(grads):
        raise KeyError("nope")
    with pytest.raises(ValueError, match="raised KeyError"):
        probe(boom, 2, 4, np.float64)


@pytest.mark.parametrize("spec, msg", [("median", "module:function"), ("no_such_mod_xyz:f", "cannot import"),
                                       ("numpy:no_such_fn", "no callable"), (3, "not an aggregation")])
def test_bad_aggregation_specs(spec, msg):
    with pytest.raises(ValueError, match=msg):
        resolve_aggregate(spec)


EVIL = """
import pathlib
pathlib.Path(__file__).with_name("IMPORTED").write_text("ran")
def f(grads):
    return grads[0]
"""


def test_aggregate_from_the_current_directory_is_refused_without_importing_it(tmp_path, monkeypatch):
    import sys

    (tmp_path / "evil_agg_q.py").write_text(EVIL)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))  # what `python -m` does with the current directory
    monkeypatch.delenv("PYTHONPATH", raising=False)
    with pytest.raises(ValueError, match=r"module 'evil_agg_q' would be imported from .*current or script "
                                         r"directory.*PYTHONPATH"):
        resolve_aggregate("evil_agg_q:f")
    assert not (tmp_path / "IMPORTED").exists() and "evil_agg_q" not in sys.modules
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))  # named explicitly: the user's choice
    assert callable(resolve_aggregate("evil_agg_q:f"))
    assert (tmp_path / "IMPORTED").exists()
    assert callable(resolve_aggregate("hpcdp.strategies.ps.aggregate:agg_mean"))  # hpcdp's own
    assert callable(resolve_aggregate("numpy:sum"))                               # installed


def test_hpcdp_train_does_not_run_a_planted_module(tmp_path):
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    (tmp_path / "evil_agg_q.py").write_text(EVIL)
    env = {**os.environ, "PYTHONPATH": str(root), "OMP_NUM_THREADS": "1", "NUMBA_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "hpcdp.cli", "train", "--set", "parallel.strategy=ps",
                           "--set", "parallel.ps.aggregate=evil_agg_q:f", "--set", "train.steps=2"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 2, proc.stderr
    assert "hpcdp: error: parallel.ps.aggregate: module 'evil_agg_q' would be imported from" in proc.stderr
    assert not (tmp_path / "IMPORTED").exists()


def test_a_dedicated_servers_save_requests_save_once_all_workers_agree():
    """SaveRequests (hpcdp/strategies/ps/checkpoint.py): the last worker's SAVE of a
    step boundary runs the checkpointer once; different steps, a server that applied
    other updates than were pushed, or no checkpointer: one clear error."""
    import pytest

    from hpcdp.io.errors import CheckpointError
    from hpcdp.strategies.ps.checkpoint import SaveRequests

    calls = []
    req = SaveRequests("server 0", [0, 1, 2])
    req.on_save = lambda step, wait: calls.append((step, wait))
    req.add(0, 10, 10, False, applied=10)
    req.add(2, 10, 10, True, applied=10)
    assert calls == []
    req.add(1, 10, 10, False, applied=10)
    assert calls == [(10, True)]          # any worker's wait flag makes it a blocking save
    req.add(0, 20, 20, False, applied=20)
    req.add(1, 20, 20, False, applied=20)
    req.add(2, 20, 20, False, applied=20)
    assert calls == [(10, True), (20, False)]
    req.add(0, 30, 30, False, applied=30)
    req.add(1, 31, 31, False, applied=30)
    with pytest.raises(CheckpointError, match=r"server 0: the workers asked for checkpoints of different steps \[30, 31\]"):
        req.add(2, 30, 30, False, applied=30)
    for w in (0, 1):
        req.add(w, 40, 40, False, applied=39)
    with pytest.raises(CheckpointError, match="asked for after 40 updates, but this server applied 39"):
        req.add(2, 40, 40, False, applied=39)
    lone = SaveRequests("sync PS server 1", [0])
    with pytest.raises(CheckpointError, match="this server rank has no checkpointer"):
        lone.add(0, 5, 5, False, applied=5)
