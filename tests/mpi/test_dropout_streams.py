"""Fast mode with dropout on real ranks: each sample draws its own mask, so the ranks
draw different masks for their different samples (the old defect: every rank drew
the same pattern, keyed by seed, layer and call count), and N-rank DDP with
dropout follows the one-rank run (float64 tolerance), which it could not before.

Run under ``mpiexec -n 1|2|3|4 python -m pytest --with-mpi``.
"""

from __future__ import annotations

import numpy as np
import pytest

from hpcdp.shard import shard_range

pytestmark = pytest.mark.mpi

GPT = {"kind": "gpt", "vocab_size": 11, "block_size": 6, "n_layer": 2, "n_head": 2,
       "n_embd": 8, "tied_head": True, "dropout": 0.3}


def _world():
    from hpcdp.world import World
    return World.from_mpi()


def test_ranks_draw_different_masks_for_their_samples():
    from mpi4py import MPI

    from hpcdp.autograd import Tensor
    from hpcdp.nn import build_model

    world = _world()
    model = build_model(GPT, seed=5)
    model.train()
    off, size = shard_range(4 * world.size, world.size, world.rank)
    mine = np.arange(off, off + size)          # every rank: 4 samples of its own
    model.streams.set(7, mine)
    mask = model.drop(Tensor(np.ones((size, 6, 8)))).data  # the embedding dropout's mask
    every = np.empty((world.size, size, 6, 8))
    world.comm.Allgather(np.ascontiguousarray(mask), every)
    rows = {every[r, i].tobytes() for r in range(world.size) for i in range(size)}
    assert len(rows) == 4 * world.size          # no two samples share a pattern
    # and a sample's mask is the one a single rank draws for it in the whole batch
    model.streams.set(7, np.arange(4 * world.size))
    whole = model.drop(Tensor(np.ones((4 * world.size, 6, 8)))).data
    np.testing.assert_array_equal(whole.reshape(world.size, size, 6, 8), every)
    assert MPI.COMM_WORLD.Get_size() == world.size


def _train(strategy, world, steps=3, gb=8, accum=1):
    from hpcdp.autograd import Tensor
    from hpcdp.data.sampler import micro_batches
    from hpcdp.nn import build_model
    from hpcdp.optim import AdamW
    from hpcdp.step import LocalBatch, train_step

    model = build_model(GPT, dtype="float64", seed=7)
    strategy.setup(model.flat, AdamW(lr=0.01, betas=(0.9, 0.99), weight_decay=0.1, dtype="float64"),
                   world)
    rng = np.random.default_rng(3)
    X = rng.integers(0, 11, size=(steps * gb, 6))
    Y = rng.integers(0, 11, size=(steps * gb, 6))
    for step in range(steps):
        off, size = shard_range(gb, strategy.dp_size, strategy.dp_rank)
        local = np.arange(step * gb + off, step * gb + off + size)
        batch = LocalBatch(micro_batches(local, accum), gb, filler=local[:1], step=step)
        train_step(model, strategy, batch, lambda i: (Tensor(X[i]), Tensor(Y[i])))
    strategy.close()
    return np.array(model.flat.data)


@pytest.mark.parametrize("accum", [1, 2])
def test_ddp_with_dropout_equals_one_rank(accum):
    from mpi4py import MPI

    from hpcdp.strategies.base import SingleRank
    from hpcdp.strategies.ddp import DDP, DDPConfig
    from hpcdp.world import World

    got = _train(DDP(DDPConfig(bucket_mb=16 * 8 / 2**20), timeout=60.0), _world(), accum=accum)
    want = _train(SingleRank(), World(comm=MPI.COMM_SELF, rank=0, size=1))
    err = np.max(np.abs(got - want)) / np.max(np.abs(want))
    assert err <= 1e-12, f"relative difference {err:.3g}"
