"""A new engine is one module plus one registration (hpcdp.comm.engines.registry).

This file is that module: an engine that runs the ring through the Python engine's
launch and counts its calls. Registered, a communicator can ask for it; the chooser
names it in its plans where it runs the algorithm and takes the call, falls back where
it does not, and the front launches every collective the plan names on it (blocking,
non-blocking, each collective). Unregistered, nothing names it any more.
"""

import numpy as np
import pytest

from hpcdp.comm import (all_gather, allreduce, iallreduce, plan, reduce_scatter,
                        set_engine)
from hpcdp.comm.engines import python as python_engine
from hpcdp.comm.engines import registry
from hpcdp.comm.engines.base import Engine
from hpcdp.shard import shard_range

pytestmark = pytest.mark.mpi

LAUNCHED = []


def launch(ctx, alg, plan, call, ledger, timeout, bufs, segment_bytes, max_message_bytes,
           blocking, asked):
    LAUNCHED.append((plan.collective, alg.name, blocking))
    return python_engine.launch(ctx, alg, plan, call, ledger, timeout, bufs, segment_bytes,
                                max_message_bytes, blocking, asked)


COUNTING = Engine("counting", runs=lambda alg: alg.name == "ring", launch=launch,
                  takes=lambda dtype, op, host, wire: dtype.kind == "f" and wire is None)


@pytest.fixture
def counting(comm):
    sub = comm.Dup()
    registry.register(COUNTING)
    LAUNCHED.clear()
    try:
        set_engine(sub, "counting")
        yield sub
    finally:
        registry.unregister("counting")
        sub.Free()


def test_the_chooser_names_a_registered_engine_where_it_takes_the_call(counting):
    sub = counting
    if sub.Get_size() == 1:
        assert plan("allreduce", 800, comm=sub, algorithm="ring").engine == "counting"
        return
    assert plan("allreduce", 800, comm=sub, algorithm="ring").engine == "counting"
    assert plan("all_gather", 800, comm=sub, algorithm="ring").engine == "counting"
    # where it does not take the call or run the algorithm, the registered fallbacks
    assert plan("allreduce", 800, comm=sub, dtype="int64", algorithm="ring").engine == "python"
    assert plan("allreduce", 800, comm=sub, algorithm="ring", wire="bfloat16").engine == "python"
    assert plan("allreduce", 800, comm=sub, algorithm="native").engine == "mpi"
    assert plan("allreduce", 800, comm=sub, algorithm="recursive").engine == "python"


def test_the_front_launches_every_collective_on_it(counting):
    sub = counting
    N, r = sub.Get_size(), sub.Get_rank()
    if N == 1:
        pytest.skip("one rank: a collective on one rank launches nothing")
    n = 1000
    x = np.arange(n, dtype=np.float64) + r
    want = np.arange(n, dtype=np.float64) * N + N * (N - 1) / 2
    assert np.array_equal(allreduce(x.copy(), comm=sub, algorithm="ring"), want)
    assert np.array_equal(allreduce(x.copy(), comm=sub, algorithm="ring"), want)  # no ready call
    assert np.array_equal(iallreduce(x.copy(), comm=sub, algorithm="ring").wait(), want)
    off, size = shard_range(n, N, r)
    assert np.array_equal(reduce_scatter(x.copy(), np.empty(size), comm=sub, algorithm="ring"),
                          want[off:off + size])
    chunk = np.arange(off, off + size, dtype=np.float64)
    assert np.array_equal(all_gather(chunk, np.zeros(n), comm=sub, algorithm="ring"),
                          np.arange(n, dtype=np.float64))
    allreduce(np.ones(n, np.int64), comm=sub, algorithm="ring")  # not taken: the Python engine
    assert LAUNCHED == [("allreduce", "ring", True), ("allreduce", "ring", True),
                        ("allreduce", "ring", False), ("reduce_scatter", "ring", True),
                        ("all_gather", "ring", True)]


def test_an_unregistered_engine_cannot_be_asked_for(comm):
    with pytest.raises(ValueError, match="engine must be one of \\('python', 'compiled'\\)"):
        set_engine(comm, "counting")
    registry.register(COUNTING)
    registry.unregister("counting")
    with pytest.raises(ValueError, match="got 'counting'"):
        set_engine(comm, "counting")
