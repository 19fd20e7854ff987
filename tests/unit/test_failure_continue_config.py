"""failure.on_rank_loss: "stop" (default) or "continue"; "continue" is refused with one
line for what it does not support, and where the MPI library has no ULFM at run time
(the MPICH of this venv: hpcdp.failure.ulfm.check_available on the real mpi4py)."""

import pytest

from hpcdp.config import load_config
from hpcdp.config_error import ConfigError

DDP = ["parallel.strategy=ddp", 'failure.on_rank_loss="continue"']


def test_default_is_stop_and_continue_is_taken_for_ddp():
    assert load_config(None, []).failure.on_rank_loss == "stop"
    cfg = load_config(None, DDP + ["failure.min_world=2"])
    assert (cfg.failure.on_rank_loss, cfg.failure.min_world) == ("continue", 2)
    # checkpoints and exact mode combine with it (tests/ulfm: test_ulfm_checkpoint.py, test_ulfm_exact.py)
    cfg = load_config(None, DDP + ["checkpoint.every=5", 'train.reproducible="exact"'])
    assert (cfg.checkpoint.every, cfg.train.reproducible) == (5, "exact")
    assert cfg.failure.batch == "keep"  # the global batch is kept after a repair unless told
    assert load_config(None, DDP + ['failure.batch="scale"']).failure.batch == "scale"
    # hybrid ZeRO: a node holds the whole sharded state, so a node can be lost (tests/ulfm/test_ulfm_hybrid.py)
    for stage in (1, 2, 3):
        cfg = load_config(None, ["parallel.strategy=zero", f"parallel.zero.stage={stage}", 'parallel.zero.shard="node"',
                                 'failure.on_rank_loss="continue"'])
        assert (cfg.parallel.strategy, cfg.failure.on_rank_loss) == ("zero", "continue")


@pytest.mark.parametrize("sets, words", [
    (['failure.on_rank_loss="keep"'], "failure.on_rank_loss: 'keep' is not allowed"),
    (["parallel.strategy=zero", 'failure.on_rank_loss="continue"'],
     "'zero' with shard = 'world' shards the state once over all ranks"),
    (["parallel.strategy=ps", 'failure.on_rank_loss="continue"'], "'ps' holds parts of the state once"),
    (["parallel.strategy=zero", 'parallel.zero.shard="node"', 'parallel.zero.comm_dtype="bfloat16"',
      'failure.on_rank_loss="continue"'], "does not yet combine with parallel.zero.comm_dtype"),
    (DDP + ['run.device="cuda"'], "does not yet combine with run.device = 'cuda'"),
    (DDP + ["failure.min_world=0"], "failure.min_world"),
    (["failure.min_world=2"], "failure.min_world"),  # read only with "continue"
    (DDP + ['failure.batch="shrink"'], "failure.batch: 'shrink' is not allowed; choose one of 'keep', 'scale'"),
    (DDP + ["failure.batch=2"], "failure.batch: expected a string, found 2"),
    (['failure.batch="scale"'], "failure.batch"),  # read only with "continue"
])
def test_what_continue_does_not_support_is_one_line(sets, words):
    with pytest.raises(ConfigError) as e:
        load_config(None, sets)
    assert words in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_an_mpi_without_ulfm_is_refused_in_one_line():
    from mpi4py import MPI

    from hpcdp.failure.ulfm import check_available

    with pytest.raises(ConfigError) as e:
        check_available(MPI)
    msg = str(e.value)
    assert "needs MPI's fault-tolerance interface (ULFM)" in msg and "mpirun --with-ft ulfm" in msg, msg
    assert MPI.Get_library_version().split(",")[0].splitlines()[0].strip() in msg, msg
