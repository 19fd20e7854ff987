"""Multi-rank training without a strategy stops with a clear error on every rank (no hang)."""

import io

import numpy as np
import pytest
from mpi4py import MPI

from hpcdp.config import load_config
from hpcdp.train import run_training
from hpcdp.world import World


@pytest.mark.mpi(min_size=2)
def test_strategy_none_on_several_ranks_raises_the_same_clear_error_everywhere(tmp_path_factory):
    comm = MPI.COMM_WORLD
    out_dir = tmp_path_factory.mktemp("none") / "run"
    cfg = load_config(None, ["train.steps=2", "parallel.strategy=none", f'run.out_dir="{out_dir}"'])
    with pytest.raises(ValueError) as err:
        run_training(cfg, world=World.from_mpi(), out=io.StringIO())
    msg = str(err.value)
    assert f"multi-rank training ({comm.Get_size()} ranks) needs a strategy" in msg
    assert "parallel.strategy" in msg
    assert not out_dir.exists()  # fails before anything is written
    # every rank got here (no rank is stuck in a collective): all ranks agree
    arrived = np.zeros(1, dtype=np.int64)
    comm.Allreduce(np.ones(1, dtype=np.int64), arrived)
    assert arrived[0] == comm.Get_size()


@pytest.mark.mpi(min_size=2)
def test_an_error_found_on_rank_0_only_stops_every_rank(tmp_path_factory):
    """The run directory is checked on rank 0 alone; its error must reach all ranks."""
    pytest.importorskip("hpcdp.strategies.ddp")
    from hpcdp.config_error import ConfigError
    from hpcdp.failure.agreement import on_root

    comm = MPI.COMM_WORLD

    def occupied_dir():
        d = tmp_path_factory.mktemp("taken")
        (d / "metrics.jsonl").write_text("")
        return str(d)

    taken = on_root(comm, occupied_dir, what="test", timeout=60)  # rank 0's path, known to all
    cfg = load_config(None, ["train.steps=2", "parallel.strategy=ddp", f'run.out_dir="{taken}"'])
    with pytest.raises(ConfigError, match="already holds a run"):
        run_training(cfg, world=World.from_mpi(), out=io.StringIO())


@pytest.mark.mpi(min_size=2)
def test_step_figures_of_every_rank_reach_rank_0_in_rank_order():
    from hpcdp.metrics import StepGather

    comm = MPI.COMM_WORLD
    r, n = comm.Get_rank(), comm.Get_size()
    g = StepGather(comm)
    for step in range(3):
        got = g.gather(0.25 * (r + 1), 10 + r, 0.5 * r, {"bytes_sent": 1000 * r + step, "comm_s": 0.125 * r})
        if r == 0:
            loss, ranks = got
            assert loss == pytest.approx(0.25 * n * (n + 1) / 2)
            assert ranks["samples"] == [10 + k for k in range(n)]
            assert ranks["bytes_sent"] == [1000 * k + step for k in range(n)]
            assert ranks["comm_s"] == [0.125 * k for k in range(n)]
            assert ranks["step_time_s"] == [0.5 * k for k in range(n)]
        else:
            assert got is None


@pytest.mark.mpi(min_size=2)
def test_step_stats_keys_that_differ_between_ranks_fail_on_every_rank():
    from hpcdp.metrics import StepGather

    comm = MPI.COMM_WORLD
    stats = {"a": 1.0} if comm.Get_rank() == 0 else {"b": 1.0}
    with pytest.raises(RuntimeError, match="step_stats\\(\\) keys differ between ranks"):
        StepGather(comm).gather(0.0, 1, 0.0, stats)


@pytest.mark.mpi(min_size=2)
def test_scale_needs_a_global_batch_that_is_a_multiple_of_the_ranks(tmp_path_factory):
    """failure.batch = "scale" keeps each rank's batch after a repair: refused at setup, on
    every rank, with the two nearest batches that fit (before ULFM is even asked for)."""
    n = MPI.COMM_WORLD.Get_size()
    out = MPI.COMM_WORLD.bcast(str(tmp_path_factory.mktemp("scale")) if MPI.COMM_WORLD.Get_rank() == 0 else None)
    cfg = load_config(None, ["train.steps=2", "parallel.strategy=ddp", f"train.global_batch={4 * n + 1}",
                             'failure.on_rank_loss="continue"', 'failure.batch="scale"', f'run.out_dir="{out}"'])
    with pytest.raises(Exception, match=rf"failure.batch: 'scale' keeps each rank's batch after a lost rank, so "
                                        rf"the global batch of {4 * n + 1} samples must be a multiple of the {n} "
                                        rf"ranks: set train.global_batch = {4 * n} or {5 * n}"):
        run_training(cfg, world=World.from_mpi(), out=io.StringIO())
