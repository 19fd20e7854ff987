"""Non-blocking ring allreduce: several requests in flight on one communicator,
progressed by test() in an interleaved order (as the DDP strategy does from
grad-ready hooks), never mixing their messages."""

import numpy as np
import pytest

from hpcdp.comm import Ledger, iallreduce, ireduce_scatter
from hpcdp.comm.ring import expected_bytes

pytestmark = pytest.mark.mpi


def test_concurrent_iallreduce(comm):
    N, r = comm.Get_size(), comm.Get_rank()
    sizes = [1, 17, 4096, 50001, 3]
    bufs = [np.full(n, float(r + 1 + k)) for k, n in enumerate(sizes)]
    led = Ledger()
    reqs = [iallreduce(b, comm=comm, algorithm="ring", ledger=led, segment_bytes=2048) for b in bufs]
    pending = list(range(len(reqs)))
    while pending:  # progress newest first, the opposite of the start order
        pending = [i for i in pending[::-1] if not reqs[i].test()][::-1]
    for k, (b, n) in enumerate(zip(bufs, sizes)):
        np.testing.assert_array_equal(b, np.full(n, sum(p + 1 + k for p in range(N))))
        assert reqs[k].wait() is b
    want = [sum(x) for x in zip(*(expected_bytes(n, N, r, 8) for n in sizes))]
    t = led.totals()["allreduce"]
    assert [t["sent_bytes"], t["recv_bytes"]] == want
    assert t["calls"] == len(sizes)


def test_mixed_algorithms_in_flight(comm):
    N, r = comm.Get_size(), comm.Get_rank()
    a = np.full(1000, float(r))
    b = np.full(999, float(r))
    c = np.full(10, float(r))
    a2 = a.copy()  # before the start: a buffer in flight is not to be read (the compiled
    # engine's progress thread may have reduced ``a`` already)
    reqs = [iallreduce(a, comm=comm, algorithm="ring"),
            ireduce_scatter(b, comm=comm),
            iallreduce(c, comm=comm, algorithm="recursive"),
            iallreduce(a2, comm=comm, algorithm="native")]
    out = [q.wait() for q in reversed(reqs)][::-1]
    s = N * (N - 1) / 2
    np.testing.assert_array_equal(a, s)
    assert (out[1] == s).all()
    np.testing.assert_array_equal(c, s)
    np.testing.assert_array_equal(out[3], s)


def test_few_step_scatter_gather_in_flight_together(comm):
    """Non-blocking recursive / Bruck / hierarchical reduce-scatters and all-gathers, many
    in flight and progressed newest first (ZeRO-3 prefetches all-gathers this way)."""
    from hpcdp.comm import iall_gather
    from hpcdp.shard import shard_range

    N, r = comm.Get_size(), comm.Get_rank()
    sizes = [7, 5000, 1, 123457]
    reqs, want = [], []
    for k, n in enumerate(sizes):
        for algo in ("recursive", "hierarchical"):
            buf = np.full(n, float(r + k))
            reqs.append(ireduce_scatter(buf, comm=comm, algorithm=algo))
            off, size = shard_range(n, N, r)
            want.append(np.full(size, float(sum(p + k for p in range(N)))))
        for algo in ("recursive", "bruck", "hierarchical"):
            off, size = shard_range(n, N, r)
            full = np.full(n, -1.0)
            full[off:off + size] = np.arange(off, off + size)
            reqs.append(iall_gather(full, comm=comm, algorithm=algo))
            want.append(np.arange(n, dtype=float))
    pending = list(range(len(reqs)))
    while pending:
        pending = [i for i in pending[::-1] if not reqs[i].test()][::-1]
    for q, w in zip(reqs, want):
        np.testing.assert_array_equal(q.wait(), w)
