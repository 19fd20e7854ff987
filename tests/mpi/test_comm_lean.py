"""The small-message path (hpcdp.comm.fast): one MPI non-blocking call + a deadline
poll. It must agree with MPI and with the general path for every buffer it takes,
hand every buffer it does not take to the general path (which explains errors),
and keep the request interface (test/wait/expire, ledger, sequence numbers)."""

import numpy as np
import pytest
from mpi4py import MPI

from hpcdp.comm import Ledger, all_gather, allreduce, iall_gather, iallreduce, ireduce_scatter, reduce_scatter
from hpcdp.comm import fast
from hpcdp.comm.context import get_context
from hpcdp.shard import shard_range

pytestmark = pytest.mark.mpi


def test_small_calls_take_the_lean_path(comm):
    """Below the crossover, "auto" and "native" give a FastRequest (one MPI call)."""
    N, r = comm.Get_size(), comm.Get_rank()
    x = np.full(5, float(r + 1))
    off, size = shard_range(5, N, r)
    reqs = [iallreduce(x.copy(), comm=comm), iallreduce(x, np.empty(5), comm=comm, algorithm="native"),
            ireduce_scatter(x, np.empty(size), comm=comm), iall_gather(x[off:off + size], np.empty(5), comm=comm)]
    kinds = {type(q).__name__ for q in reqs}
    assert kinds == ({"FastRequest"} if N > 1 else {"DoneRequest"})
    total = N * (N + 1) / 2
    np.testing.assert_array_equal(reqs[0].wait(), np.full(5, total))
    np.testing.assert_array_equal(reqs[1].wait(), np.full(5, total))
    np.testing.assert_array_equal(reqs[2].wait(), np.full(size, total))
    gathered = np.concatenate([np.full(shard_range(5, N, p)[1], p + 1.0) for p in range(N)])
    np.testing.assert_array_equal(reqs[3].wait(), gathered)


def test_lean_requests_progress_by_test_in_any_order(comm):
    """Several lean requests in flight, completed by test() newest first (as DDP's
    hooks do), with exact ledgers and one sequence number each."""
    N, r = comm.Get_size(), comm.Get_rank()
    ctx = get_context(comm)
    led = Ledger()
    bufs = [np.full(n, float(r + k), dtype=np.float32) for k, n in enumerate([1, 7, 100, 1000])]
    seq0 = ctx.seq
    reqs = [iallreduce(b, comm=comm, ledger=led) for b in bufs]
    assert ctx.seq == seq0 + len(bufs)
    pending = list(range(len(reqs)))
    while pending:
        pending = [i for i in pending[::-1] if not reqs[i].test()][::-1]
    for k, b in enumerate(bufs):
        np.testing.assert_array_equal(b, np.full(b.size, sum(p + k for p in range(N)), np.float32))
    t = led.totals()["allreduce"]
    S = sum(b.nbytes for b in bufs) if N > 1 else 0
    assert (t["sent_bytes"], t["recv_bytes"], t["calls"]) == (S, S, len(bufs))


@pytest.mark.parametrize("op", ["sum", "mean", "max", "min"])
def test_lean_multidimensional_and_ops_match_mpi(comm, op):
    N, r = comm.Get_size(), comm.Get_rank()
    x = (np.arange(24, dtype=np.float64).reshape(2, 3, 4) * (r + 1)) % 11
    ref = np.empty_like(x)
    comm.Allreduce(x, ref, op={"sum": MPI.SUM, "mean": MPI.SUM, "max": MPI.MAX, "min": MPI.MIN}[op])
    if op == "mean":
        ref /= N
    got = allreduce(x, np.empty_like(x), comm=comm, op=op)
    assert got.shape == (2, 3, 4)
    np.testing.assert_array_equal(got, ref)
    y = x.copy()
    assert allreduce(y, comm=comm, op=op) is y
    np.testing.assert_array_equal(y, ref)
    z = np.full(7, r + 1, dtype=np.int32)  # integer mean: floor division, in place
    allreduce(z, comm=comm, op=op)
    want = {"sum": N * (N + 1) // 2, "mean": (N * (N + 1) // 2) // N, "max": N, "min": 1}[op]
    np.testing.assert_array_equal(z, np.full(7, want, dtype=np.int32))


def test_lean_reduce_scatter_and_all_gather_uneven(comm):
    """Lengths that N does not divide take MPI's v-variants; in place keeps the chunk
    at its shard_range position; all_gather in place fills the rest."""
    N, r = comm.Get_size(), comm.Get_rank()
    for n in (N + 1, 13, 1001):
        x = np.arange(n, dtype=np.float32) + r
        off, size = shard_range(n, N, r)
        want = (N * np.arange(n) + N * (N - 1) / 2).astype(np.float32)[off:off + size]
        np.testing.assert_array_equal(reduce_scatter(x, np.empty(size, np.float32), comm=comm), want)
        y = x.copy()
        chunk = reduce_scatter(y, comm=comm)
        np.testing.assert_array_equal(chunk, want)
        assert np.shares_memory(chunk, y) and (chunk.size == 0 or chunk.ctypes.data == y[off:].ctypes.data)
        full = np.full(n, -1, np.float32)
        full[off:off + size] = chunk
        all_gather(full, comm=comm)
        np.testing.assert_array_equal(full, (N * np.arange(n) + N * (N - 1) / 2).astype(np.float32))


def test_buffers_the_lean_path_refuses_get_clear_errors(comm):
    """Read-only results, strided or Fortran-ordered buffers, wrong dtypes and sizes go
    to the general path, which names what to fix (and nothing is sent)."""
    ctx = get_context(comm)
    seq = ctx.seq
    ro = np.zeros(4)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        allreduce(np.zeros(4), ro, comm=comm)
    with pytest.raises(ValueError, match="read-only"):
        allreduce(ro, comm=comm)
    with pytest.raises(ValueError, match="C-contiguous"):
        allreduce(np.zeros(8)[::2], comm=comm)
    with pytest.raises(ValueError, match="C-contiguous"):
        allreduce(np.zeros((3, 4), order="F"), comm=comm)
    with pytest.raises(TypeError, match="dtype"):
        allreduce(np.zeros(4), np.zeros(4, np.float32), comm=comm)
    with pytest.raises(ValueError, match="must match"):
        allreduce(np.zeros(4), np.zeros(5), comm=comm)
    with pytest.raises(TypeError, match="numeric"):
        allreduce(np.zeros(4, dtype=bool), comm=comm)
    with pytest.raises(ValueError, match="shard_range"):
        all_gather(np.zeros(99), np.zeros(4), comm=comm)
    assert ctx.seq == seq  # refused before taking a sequence number


def test_lean_path_follows_the_crossover(comm):
    """At and above auto's crossover the call is not the lean one; "native" stays lean."""
    N = comm.Get_size()
    if N == 1:
        pytest.skip("one rank: every call is done at once")
    from hpcdp.comm.auto import native_below
    bound = native_below("allreduce", N)
    big = np.ones(bound // 4, dtype=np.float32)
    req = iallreduce(big, comm=comm)
    assert not isinstance(req, fast.FastRequest)
    np.testing.assert_array_equal(req.wait(), np.full(big.size, N, np.float32))
    big[...] = 1
    req = iallreduce(big, comm=comm, algorithm="native")
    assert isinstance(req, fast.FastRequest)
    np.testing.assert_array_equal(req.wait(), np.full(big.size, N, np.float32))


def test_byte_swapped_dtypes_are_summed_right(comm):
    """MPI reads native byte order only: auto runs the ring for a byte-swapped dtype (the
    result is exact), an explicit "native" says what to do instead of summing garbage."""
    N, r = comm.Get_size(), comm.Get_rank()
    swapped = np.dtype(np.float64).newbyteorder()
    x = (np.arange(10) + r).astype(swapped)
    want = (N * np.arange(10) + N * (N - 1) / 2).astype(np.float64)
    np.testing.assert_array_equal(allreduce(x, np.empty_like(x), comm=comm), want)
    off, size = shard_range(10, N, r)
    np.testing.assert_array_equal(reduce_scatter(x, np.empty(size, swapped), comm=comm),
                                  want[off:off + size])
    full = np.zeros(10, swapped)
    full[off:off + size] = want[off:off + size]
    np.testing.assert_array_equal(all_gather(full, comm=comm), want)
    if N > 1:
        with pytest.raises(ValueError, match="native byte order"):
            allreduce(x, np.empty_like(x), comm=comm, algorithm="native")


def test_a_profile_set_later_reaches_every_cached_communicator(comm, monkeypatch):
    """A communicator that took the lean path before HPCDP_PROFILE was set must not keep
    taking it after auto.forget(): with a profile every auto collective follows the cost
    model. A stale per-communicator bound once sent one rank to MPI's own all-gather while
    another ran the model's recursive doubling (a hang, named by the deadline)."""
    N = comm.Get_size()
    if N == 1:
        pytest.skip("one rank: every call is done at once")
    from hpcdp.comm.auto import forget

    x = np.ones(N, dtype=np.uint64)
    for _ in range(2):  # the second call finds the communicator cached and caches its bound
        req = iall_gather(x[comm.Get_rank():comm.Get_rank() + 1], np.empty(N, np.uint64), comm=comm)
        assert isinstance(req, fast.FastRequest)
        req.wait()
    try:
        monkeypatch.setenv("HPCDP_PROFILE", "example-cluster")
        forget()
        req = iall_gather(x[comm.Get_rank():comm.Get_rank() + 1], np.empty(N, np.uint64), comm=comm)
        assert not isinstance(req, fast.FastRequest)
        np.testing.assert_array_equal(req.wait(), np.ones(N, np.uint64))
    finally:
        monkeypatch.undo()
        forget()
    req = iall_gather(x[comm.Get_rank():comm.Get_rank() + 1], np.empty(N, np.uint64), comm=comm)
    assert isinstance(req, fast.FastRequest)
    req.wait()
