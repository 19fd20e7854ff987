"""DDP bad input on real MPI ranks: differing replicas, divergence, unsplittable batch.

Every error must be raised on EVERY rank (no rank left waiting) and name the ranks.
"""

from __future__ import annotations

import os
import shutil
import tempfile

import numpy as np
import pytest

pytestmark = pytest.mark.mpi

MLP = {"kind": "mlp", "sizes": [6, 10, 4]}


def _world():
    from hpcdp.world import World
    return World.from_mpi()


def _setup(init="verify", check_every=0, seed_of_rank=lambda r: 0):
    from hpcdp.nn import build_model
    from hpcdp.optim import SGD
    from hpcdp.strategies.ddp import DDP, DDPConfig

    world = _world()
    model = build_model(MLP, dtype="float64", seed=seed_of_rank(world.rank))
    strat = DDP(DDPConfig(init=init, check_every=check_every), timeout=60.0)
    strat.setup(model.flat, SGD(lr=0.1, dtype="float64"), world)
    return world, model, strat


def _step(model, strat, rng):
    """One train_step on 4 random samples per rank (each rank its own: a global batch
    of 4 * N)."""
    from hpcdp.autograd import Tensor
    from hpcdp.step import LocalBatch, train_step

    x, y = rng.normal(size=(4, 6)), rng.integers(0, 4, size=4)
    batch = LocalBatch([np.arange(4)], 4 * strat.dp_size, filler=np.arange(1))
    train_step(model, strat, batch, lambda idx: (Tensor(x[idx]), Tensor(y[idx])))
    strat.step_stats()


def test_parameters_differing_at_start_are_an_error_naming_the_ranks():
    from hpcdp.strategies.ddp import ReplicaMismatch

    world = _world()
    if world.size == 1:
        pytest.skip("needs several ranks")
    bad = world.size - 1  # the last rank built its model from another seed
    with pytest.raises(ReplicaMismatch) as e:
        _setup(seed_of_rank=lambda r: 99 if r == bad else 0)
    msg = str(e.value)
    assert "before step 1" in msg and f"rank {bad}:" in msg
    assert ("rank 0:" if bad == 1 else f"ranks {', '.join(map(str, range(bad)))}:") in msg
    assert "parallel.ddp.init" in msg  # says how to fix it


def test_broadcast_init_copies_rank_zero_parameters():
    world, model, strat = _setup(init="broadcast", seed_of_rank=lambda r: r)
    every = np.empty((world.size, model.flat.numel))
    world.comm.Allgather(np.asarray(model.flat.data), every)
    from hpcdp.nn import build_model
    rank0 = np.asarray(build_model(MLP, dtype="float64", seed=0).flat.data)
    assert all(np.array_equal(every[r], rank0) for r in range(world.size))
    strat.close()


def test_divergence_is_caught_by_the_periodic_replica_check():
    from hpcdp.strategies.ddp import ReplicaMismatch

    world, model, strat = _setup(check_every=2)
    if world.size == 1:
        pytest.skip("needs several ranks")
    rng = np.random.default_rng(world.rank)
    _step(model, strat, rng)
    _step(model, strat, rng)  # step 2: checked, identical
    if world.rank == 1:
        model.flat.data[3] += 1e-9  # one rank drifts by a hair
    _step(model, strat, rng)  # step 3: not checked
    with pytest.raises(ReplicaMismatch, match=r"after step 4: .*rank 1: "):
        _step(model, strat, rng)
    strat.close()


def test_global_batch_that_cannot_be_split_over_the_ranks():
    """hpcdp train with DDP: a global batch smaller than ranks x micro-batches is a clear
    ConfigError on every rank, before the first step."""
    from hpcdp.config_error import ConfigError
    from hpcdp.config import config_from_dict
    from hpcdp.train import run_training

    world = _world()
    if world.size == 1:
        pytest.skip("needs several ranks")
    # one folder for all ranks: rank 0's process id names it
    pid = np.array([os.getpid()], dtype=np.int64)
    world.comm.Bcast(pid, root=0)
    tmp = os.path.join(tempfile.gettempdir(), f"hpcdp-ddp-test-{pid[0]}")
    out = os.path.join(tmp, "run")
    cfg = config_from_dict({
        "run": {"out_dir": out, "dtype": "float64"},
        "model": {"kind": "mlp", "sizes": [8, 8, 3]},
        "data": {"kind": "synthetic_classification", "n_samples": 64, "n_features": 8,
                 "n_classes": 3},
        "train": {"steps": 2, "global_batch": world.size - 1 or 1, "grad_accum": 1},
        "parallel": {"strategy": "ddp"},
    })
    try:
        with pytest.raises(ConfigError, match=rf"train.global_batch: .*cannot feed {world.size} ranks"):
            run_training(cfg, world=world)
    finally:
        world.comm.Barrier()
        if world.rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)
