"""optim.clip_grad_norm: the global L2 norm over all ranks, for every strategy.

N-rank training with clipping equals one-rank training with clipping on the same
global batch (float64), for none, ddp, zero stages 1-3 and the synchronous
parameter server (one server, and one per rank: the servers sum their shards'
squared norms); every rank reports the same norm.
"""

from __future__ import annotations

import numpy as np
import pytest
from test_ddp import GPT, _self_world, _world, assert_close, ddp, train

pytestmark = pytest.mark.mpi

CLIP = 0.05  # well below the gradient norm of these models: every step clips


def _clipping(strategy):
    """Wrap strategy.setup so the optimizer it gets clips (train() builds it)."""
    setup = strategy.setup

    def with_clip(flat, optimizer, world):
        optimizer.clip_grad_norm = CLIP
        setup(flat, optimizer, world)
    strategy.setup = with_clip
    return strategy


def _reference(**kw):
    from hpcdp.strategies.base import SingleRank
    return train(GPT, _clipping(SingleRank()), _self_world(), **kw)


def _zero(stage):
    from hpcdp.config_parallel import ZeroConfig
    from hpcdp.strategies.zero import make_zero
    return make_zero(ZeroConfig(stage=stage, bucket_mb=1e-4), timeout=60.0)


@pytest.mark.parametrize("name", ["ddp", "zero1", "zero2", "zero3"])
def test_clipped_training_equals_one_rank(name):
    kw = dict(optim="adamw", batches=(8, 8, 8), accum=2)
    strat = ddp(bucket_mb=1e-4) if name == "ddp" else _zero(int(name[-1]))
    got, stats, _ = train(GPT, _clipping(strat), _world(), **kw)
    want, want_stats, _ = _reference(**kw)
    assert_close(got, want, 1e-12)
    norms = [s["grad_norm"] for s in stats]
    ref_norms = [s["grad_norm"] for s in want_stats]
    np.testing.assert_allclose(norms, ref_norms, rtol=1e-12)
    assert all(n > CLIP for n in norms)  # clipping was active
    every = np.empty(_world().size)
    _world().comm.Allgather(np.array([norms[-1]]), every)
    assert np.all(every == every[0])  # one norm, the same on every rank


@pytest.mark.parametrize("servers", ["one", "all"])
def test_clipped_sync_parameter_server_equals_one_rank(servers):
    from mpi4py import MPI
    from test_ps_support import data, global_indices, lr_of, make_model

    from hpcdp.autograd import Tensor
    from hpcdp.optim import SGD
    from hpcdp.shard import shard_range
    from hpcdp.step import LocalBatch, train_step
    from hpcdp.strategies.base import SingleRank
    from hpcdp.strategies.ps import ParameterServer, PSConfig
    from hpcdp.world import World

    world = _world()
    x, y = data()

    def run(strategy, w, steps=4, gb=12):
        model = make_model()
        opt = SGD(None, lr=0.1, momentum=0.9, dtype="float64")
        opt.clip_grad_norm = 0.02
        strategy.setup(model.flat, opt, w)
        try:
            for t in range(steps):
                idx = global_indices(t, gb)
                off, size = shard_range(gb, strategy.dp_size, strategy.dp_rank)
                opt.lr = lr_of(t)
                train_step(model, strategy, LocalBatch([idx[off:off + size]], gb, idx[:1]),
                           lambda i: (Tensor(x[i]), Tensor(y[i])))
        finally:
            strategy.close()
        return model.flat.data.copy()

    n_servers = 1 if servers == "one" else world.size
    got = run(ParameterServer(PSConfig(servers=n_servers, colocated=True, mode="sync")), world)
    want = run(SingleRank(), World(comm=MPI.COMM_SELF, rank=0, size=1))
    assert_close(got, want, 1e-12)
