"""Helpers for the parameter-server MPI tests (no tests here): a tiny float64 MLP
trained by the step sequence of hpcdp.strategies.base, and its one-rank reference."""

import time

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
    """Run the strategy's step sequence; returns (final flat data, model) on workers,
    (None, None) on dedicated servers. ``sleep(dp_rank, step)`` -> seconds (stragglers)."""
    from hpcdp.autograd import Tensor
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
            local = idx[off:off + size]
            opt.lr = lr_of(t) if optim == "sgd" else opt.lr
            model.flat.zero_grad()
            strategy.begin_backward(last_micro=True)
            if size:
                loss = model.loss(Tensor(x[local]), Tensor(y[local])) * (size / global_batch)
                loss.backward()
            if sleep is not None:
                time.sleep(sleep(strategy.dp_rank, t))
            strategy.finish_gradients()
            strategy.step()
    finally:
        strategy.close()
    return model.flat.data.copy(), model


def reference(steps=5, global_batch=12, optim="sgd"):
    """One rank, the whole global batch, plain optimizer."""
    from hpcdp.autograd import Tensor
    x, y = data()
    model = make_model()
    opt = make_optimizer(optim)
    for t in range(steps):
        idx = global_indices(t, global_batch)
        opt.lr = lr_of(t) if optim == "sgd" else opt.lr
        model.flat.zero_grad()
        model.loss(Tensor(x[idx]), Tensor(y[idx])).backward()
        opt.step(model.flat.data, model.flat.grad)
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
