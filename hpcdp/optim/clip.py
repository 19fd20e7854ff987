"""Gradient-norm clipping (``optim.clip_grad_norm``): the global L2 norm over all ranks.

PyTorch's ``clip_grad_norm_`` rule: with ``norm`` the L2 norm of the whole reduced
gradient (every parameter, as summed over ranks), every element is multiplied by
``min(1, max_norm / (norm + 1e-6))`` before the optimizer step.

Each strategy knows where the reduced gradient lives: a replica (none, ddp) holds
all of it, so its local norm is the global one and no communication is needed; a
ZeRO rank holds its shard, so the squared norms of the shards are summed over the
data-parallel ranks (one 8-byte allreduce); a parameter server's servers hold
shards of the aggregate (sum over servers), and worker-side updates see all of it.
:func:`clip_` takes that sum as the ``reduce`` callable.
"""

from __future__ import annotations

import math

EPS = 1e-6


def sum_squares(backend, pieces) -> float:
    """Sum of squares of the 1-D arrays ``pieces`` (a host float)."""
    import numpy as np

    total = 0.0
    for g in pieces:
        if not int(g.shape[0]):
            continue
        if isinstance(g, np.ndarray):
            total += float(np.dot(g, g))  # BLAS, no temporary
        else:
            total += float(backend.to_numpy(backend.sum(backend.mul(g, g))))
    return total


def clip_factor(norm: float, max_norm: float) -> float:
    return min(1.0, max_norm / (norm + EPS))


def clip_(backend, pieces, max_norm: float, reduce=None) -> float:
    """Scale the gradient ``pieces`` in place so their global L2 norm is at most
    ``max_norm``; ``reduce(local_sum_of_squares) -> global`` sums over the ranks that
    hold the other pieces (None: these are all of them). Returns the norm before
    clipping (the same on every rank)."""
    ss = sum_squares(backend, pieces)
    if reduce is not None:
        ss = reduce(ss)
    norm = math.sqrt(ss)
    c = clip_factor(norm, max_norm)
    if c < 1.0:
        import numpy as np
        for g in pieces:
            if isinstance(g, np.ndarray):
                np.multiply(g, g.dtype.type(c), out=g)
            elif int(g.shape[0]):
                backend.copy_(g, backend.mul(g, c))
    return norm


def allreduce_sum(comm, timeout: float | None = None):
    """``reduce`` for :func:`clip_` over a communicator (8 bytes, a sync point): an hpcdp
    allreduce, under its deadline, its failure policy and MPI's own algorithm (auto)."""
    import numpy as np

    from hpcdp.comm import allreduce

    def reduce(x: float) -> float:
        buf = np.array([x], dtype=np.float64)
        allreduce(buf, comm=comm, op="sum", timeout=timeout)
        return float(buf[0])
    return reduce


class ClipBeforeStep:
    """An optimizer proxy that clips the gradient it is handed before stepping: for
    code that calls ``optimizer.step(param, grad)`` itself (the parameter server's
    servers and workers). ``last_norm`` keeps the norm of the last step."""

    def __init__(self, optimizer, max_norm: float, reduce=None):
        object.__setattr__(self, "_opt", optimizer)
        object.__setattr__(self, "_max", float(max_norm))
        object.__setattr__(self, "_reduce", reduce)
        object.__setattr__(self, "last_norm", float("nan"))

    def step(self, param, grad) -> None:
        object.__setattr__(self, "last_norm", clip_(self._opt.backend, [grad], self._max, self._reduce))
        self._opt.step(param, grad)

    def __getattr__(self, name):
        return getattr(self._opt, name)

    def __setattr__(self, name, value):  # lr set per step goes to the optimizer
        setattr(self._opt, name, value)


__all__ = ["clip_", "clip_factor", "sum_squares", "allreduce_sum", "ClipBeforeStep", "EPS"]
