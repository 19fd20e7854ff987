"""The byte ledger equals the analytic formulas exactly."""

import numpy as np
import pytest

from hpcdp.comm import Ledger, all_gather, allreduce, reduce_scatter
from hpcdp.comm.schedules.recursive import expected_bytes as rd_bytes
from hpcdp.comm.select import collective_bytes
from hpcdp.comm.ring import expected_bytes
from hpcdp.shard import shard_range

pytestmark = pytest.mark.mpi


def _one(ledger, name):
    t = ledger.totals()[name]
    return t["sent_bytes"], t["recv_bytes"]


@pytest.mark.parametrize("n", [0, 1, 5, 12, 1009, 24 * 1000])
def test_ring_ledger(comm, n):
    N, r = comm.Get_size(), comm.Get_rank()
    x = np.ones(n, dtype=np.float32)
    S = 4 * n
    led = Ledger()
    allreduce(x, comm=comm, algorithm="ring", ledger=led, segment_bytes=1000)
    assert _one(led, "allreduce") == expected_bytes(n, N, r, 4)
    if n % N == 0:
        assert _one(led, "allreduce") == (2 * (N - 1) * S // N,) * 2
    off, size = shard_range(n, N, r)
    led.reset()
    reduce_scatter(x, np.empty(size, np.float32), comm=comm, ledger=led, algorithm="ring")
    all_gather(np.ones(size, np.float32), np.empty(n, np.float32), comm=comm, ledger=led,
               algorithm="ring")
    assert _one(led, "reduce_scatter") == expected_bytes(n, N, r, 4, ("rs",))
    assert _one(led, "all_gather") == expected_bytes(n, N, r, 4, ("ag",))
    if n % N == 0:
        assert _one(led, "reduce_scatter") == ((N - 1) * S // N,) * 2
        assert _one(led, "all_gather") == ((N - 1) * S // N,) * 2
    assert led.totals()["all_gather"]["calls"] == 1


@pytest.mark.parametrize("algorithm", ["native", "auto"])
@pytest.mark.parametrize("n", [0, 1, 5, 1009, 300 * 1024])
def test_native_and_auto_ledger(comm, algorithm, n):
    """MPI's own collectives (and auto, whichever it picks) record the bytes handed to
    MPI, as hpcdp.comm.select.collective_bytes says, in place or not."""
    N, r = comm.Get_size(), comm.Get_rank()
    off, size = shard_range(n, N, r)
    led = Ledger()
    x = np.ones(n, dtype=np.float32)
    allreduce(x, np.empty_like(x), comm=comm, algorithm=algorithm, ledger=led)
    allreduce(x.copy(), comm=comm, algorithm=algorithm, ledger=led)
    reduce_scatter(x, np.empty(size, np.float32), comm=comm, algorithm=algorithm, ledger=led)
    reduce_scatter(x.copy(), comm=comm, algorithm=algorithm, ledger=led)
    all_gather(np.ones(size, np.float32), np.empty(n, np.float32), comm=comm,
               algorithm=algorithm, ledger=led)
    all_gather(np.ones(n, np.float32), comm=comm, algorithm=algorithm, ledger=led)
    for name in ("allreduce", "reduce_scatter", "all_gather"):
        want = collective_bytes(name, algorithm, n, N, r, 4)
        assert _one(led, name) == (2 * want[0], 2 * want[1]), name
        assert led.totals()[name]["calls"] == 2


def test_recursive_doubling_ledger(comm):
    N, r = comm.Get_size(), comm.Get_rank()
    led = Ledger()
    allreduce(np.ones(100), comm=comm, algorithm="recursive", ledger=led)
    assert _one(led, "allreduce") == (rd_bytes(800, N, r) if N > 1 else (0, 0))


@pytest.mark.parametrize("n", [0, 1, 5, 12, 1009, 24 * 1000])
def test_few_step_ledger_equals_the_formula(comm, n, monkeypatch):
    """Recursive halving / doubling and Bruck record their formula's bytes exactly; the
    hierarchical ones per link kind (``.intra`` / ``.inter``), on 2 emulated nodes where
    the world is even."""
    from hpcdp.comm.model.volume import hier_shard_bytes

    N, r = comm.Get_size(), comm.Get_rank()
    off, size = shard_range(n, N, r)
    for name, algo in (("reduce_scatter", "recursive"), ("all_gather", "recursive"),
                       ("all_gather", "bruck")):
        led = Ledger()
        if name == "reduce_scatter":
            reduce_scatter(np.ones(n, np.float32), comm=comm, algorithm=algo, ledger=led)
        else:
            all_gather(np.ones(n, np.float32), comm=comm, algorithm=algo, ledger=led)
        assert _one(led, name) == collective_bytes(name, algo, n, N, r, 4), (name, algo)
        if n % N == 0 and N & (N - 1) == 0:  # the ring's volume in log2 N steps
            assert _one(led, name) == ((N - 1) * 4 * n // N,) * 2
    per = N // 2 if N % 2 == 0 else N
    monkeypatch.setenv("HPCDP_RANKS_PER_NODE", str(per))
    sub = comm.Dup()
    try:
        led = Ledger()
        reduce_scatter(np.ones(n, np.float64), comm=sub, algorithm="hierarchical", ledger=led)
        all_gather(np.ones(n, np.float64), comm=sub, algorithm="hierarchical", ledger=led)
        totals = led.totals()
        for name in ("reduce_scatter", "all_gather"):
            want = hier_shard_bytes(name, n, N // per, per, r // per, r % per, 8)
            for kind in ("intra", "inter"):
                t = totals.get(f"{name}.{kind}", {"sent_bytes": 0, "recv_bytes": 0})
                assert (t["sent_bytes"], t["recv_bytes"]) == want[kind], (name, kind)
    finally:
        sub.Free()
