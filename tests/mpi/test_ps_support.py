"""Helpers for the parameter-server MPI tests (no tests here): a tiny float64 MLP
trained by the step sequence of hpcdp.strategies.base, and its one-rank reference."""

import numpy as np

from hpcdp.shard import shard_range

N_SAMPLES, N_FEATURES, N_CLASSES = 40, 6, 3


def data(seed=3):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((N_SAMPLES, N_FEATURES))
    y = rng.integers(0, N_CLASSES, N_SAMPLES)
    return x, y


def make_model(seed=0):
    from hpcdp.nn import MLP
    return MLP([N_FEATURES, 7, N_CLASSES], seed=seed, dtype="float64", device="cpu")


def make_optimizer(kind="sgd"):
    from hpcdp.optim import SGD, AdamW
    if kind == "adamw":
        return AdamW(None, lr=0.01, weight_decay=0.01, dtype="float64")
    return SGD(None, lr=0.1, momentum=0.9, dtype="float64")


def global_indices(step, global_batch):
    # the sampler's order does not depend on the world size
    return (np.arange(global_batch) + step * global_batch) % N_SAMPLES


def lr_of(step):
    return 0.1 / (1 + 0.1 * step)  # a schedule: servers must use the workers' lr per step


def train(strategy, world, steps=5, global_batch=12, optim="sgd", sleep=None):
    """hpcdp.step.train_step under ``strategy``; returns (final flat data, model) on
    workers, (None, None) on dedicated servers. ``sleep(dp_rank, step)`` -> seconds
    slept after backward (stragglers)."""
    import time

    from hpcdp.autograd import Tensor
    from hpcdp.step import LocalBatch, train_step
    x, y = data()
    model = make_model()
    opt = make_optimizer(optim)
    strategy.setup(model.flat, opt, world)
    if not strategy.is_worker:
        try:
            strategy.serve()
        finally:
            strategy.close()
        return None, None
    try:
        for t in range(steps):
            idx = global_indices(t, global_batch)
            off, size = shard_range(global_batch, strategy.dp_size, strategy.dp_rank)
            opt.lr = lr_of(t) if optim == "sgd" else opt.lr
            after = None if sleep is None else (lambda m, t=t: time.sleep(sleep(strategy.dp_rank, t)))
            train_step(model, strategy, LocalBatch([idx[off:off + size]], global_batch, idx[:1]),
                       lambda i: (Tensor(x[i]), Tensor(y[i])), after_backward=after)
    finally:
        strategy.close()
    return model.flat.data.copy(), model


def reference(steps=5, global_batch=12, optim="sgd"):
    """One rank, the whole global batch, no strategy (SingleRank)."""
    from mpi4py import MPI

    from hpcdp.autograd import Tensor
    from hpcdp.step import LocalBatch, train_step
    from hpcdp.strategies.base import SingleRank
    from hpcdp.world import World
    x, y = data()
    model = make_model()
    opt = make_optimizer(optim)
    single = SingleRank()
    single.setup(model.flat, opt, World(comm=MPI.COMM_SELF, rank=0, size=1))
    for t in range(steps):
        idx = global_indices(t, global_batch)
        opt.lr = lr_of(t) if optim == "sgd" else opt.lr
        train_step(model, single, LocalBatch([idx], global_batch, idx[:1]),
                   lambda i: (Tensor(x[i]), Tensor(y[i])))
    return model.flat.data.copy()


def world():
    from hpcdp.world import World
    return World.from_mpi()


def same_on_all(comm, arr, ranks):
    """Every rank in ``ranks`` holds a bit-identical ``arr``."""
    from mpi4py import MPI
    mine = arr if arr is not None else np.zeros(0)
    sizes = comm.allgather(mine.size)
    n = max(sizes)
    buf = np.full(n, np.nan)
    buf[:mine.size] = mine
    allb = np.empty((comm.Get_size(), n))
    comm.Allgather(buf, allb)
    rows = [allb[r] for r in ranks]
    return all(np.array_equal(rows[0], r) for r in rows[1:])
