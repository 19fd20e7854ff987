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
    cfg = load_config(None, ["train.steps=2", f'run.out_dir="{out_dir}"'])
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
    from hpcdp.config import ConfigError
    from hpcdp.train import _on_root_then_bcast

    comm = MPI.COMM_WORLD

    def occupied_dir():
        d = tmp_path_factory.mktemp("taken")
        (d / "metrics.jsonl").write_text("")
        return str(d)

    taken = _on_root_then_bcast(comm, occupied_dir)  # rank 0's path, known to all
    cfg = load_config(None, ["train.steps=2", "parallel.strategy=ddp", f'run.out_dir="{taken}"'])
    with pytest.raises(ConfigError, match="already holds a run"):
        run_training(cfg, world=World.from_mpi(), out=io.StringIO())
