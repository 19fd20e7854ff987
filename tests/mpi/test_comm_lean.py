"""The small-message path (hpcdp.comm.fast): one MPI non-blocking call + a deadline
poll. It must agree with MPI and with the general path for every buffer it takes,
hand every buffer it does not take to the general path (which explains errors),
and keep the request interface (test/wait/expire, ledger, sequence numbers)."""

import numpy as np
import pytest
from mpi4py import MPI

from hpcdp.comm import Ledger, all_gather, allreduce, iall_gather, iallreduce, ireduce_scatter, reduce_scatter
from hpcdp.comm.engines.compiled import lean
from hpcdp.comm.engines import mpi as mpi_engine
from hpcdp.comm.core.context import get_context
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
    from hpcdp.comm.select import lean_bound
    bound = lean_bound(get_context(comm), "allreduce", "auto")
    big = np.ones(bound // 4, dtype=np.float32)
    req = iallreduce(big, comm=comm)
    assert not isinstance(req, mpi_engine.FastRequest)
    np.testing.assert_array_equal(req.wait(), np.full(big.size, N, np.float32))
    big[...] = 1
    req = iallreduce(big, comm=comm, algorithm="native")
    assert isinstance(req, mpi_engine.FastRequest)
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
        assert isinstance(req, mpi_engine.FastRequest)
        req.wait()
    try:
        monkeypatch.setenv("HPCDP_PROFILE", "example-cluster")
        forget()
        req = iall_gather(x[comm.Get_rank():comm.Get_rank() + 1], np.empty(N, np.uint64), comm=comm)
        assert not isinstance(req, mpi_engine.FastRequest)
        np.testing.assert_array_equal(req.wait(), np.ones(N, np.uint64))
    finally:
        monkeypatch.undo()
        forget()
    req = iall_gather(x[comm.Get_rank():comm.Get_rank() + 1], np.empty(N, np.uint64), comm=comm)
    assert isinstance(req, mpi_engine.FastRequest)
    req.wait()


# -- the compiled lean path (hpcdp.comm.engines.compiled.lean) ---------------------------

_MPI_OPS = {"sum": MPI.SUM, "mean": MPI.SUM, "max": MPI.MAX, "min": MPI.MIN}


def _values(n, rank, dtype):
    rng = np.random.default_rng(31 * rank + n)
    if np.dtype(dtype).kind == "f":
        return (rng.standard_normal(n) * 100).astype(dtype)
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max, size=n, dtype=dtype, endpoint=True)


def _mean_of(x, N):  # what the lean path's mean is: numpy's division of MPI's sum
    return np.floor_divide(x, N) if x.dtype.kind in "iu" else np.true_divide(x, x.dtype.type(N))


def _compiled(comm, collective, op, dtype):
    dtype = np.dtype(dtype)
    sig = get_context(comm).plans.get(("sig", collective, op, "auto", dtype, dtype.char))
    return sig is not None and sig[4] is not None


@pytest.mark.parametrize("dtype", sorted(mpi_engine._TYPES), ids=lambda c: np.dtype(c).name)
def test_compiled_lean_path_is_bitwise_mpi4pys_collective(comm, dtype):
    """Every dtype the lean path takes, every op, in and out of place, lengths N divides
    and not: the compiled calls give the bits of the same MPI collective called through
    mpi4py, and the ledger today's figures; the compiled path really ran."""
    N, r = comm.Get_size(), comm.Get_rank()
    dtype = np.dtype(dtype)
    T = mpi_engine.mpi_type(dtype)  # (uint64: MPI_UINT64_T, hpcdp.comm.core.ops.mpi_datatype)
    for n in sorted({1, N, N + 1, 2 * N + 3, 37}):
        bounds = [shard_range(n, N, p) for p in range(N)]
        counts, displs = [s for _, s in bounds], [o for o, _ in bounds]
        off, size = bounds[r]
        x = _values(n, r, dtype).view(dtype)  # (the type code itself: numpy returns "l" for "q")
        for op in ("sum", "mean", "max", "min"):
            # the same MPI collective through mpi4py (Open MPI 4.1's blocking Reduce_scatter
            # and its non-blocking one can differ on an overflowing int8 sum: one saturates)
            want = np.empty_like(x)
            comm.Iallreduce([x, T], [want, T], _MPI_OPS[op]).Wait()
            want_rs = np.empty(size, dtype)
            if n % N == 0:
                comm.Ireduce_scatter_block([x, T], [want_rs, T], _MPI_OPS[op]).Wait()
            else:
                comm.Ireduce_scatter([x, T], [want_rs, T], counts, _MPI_OPS[op]).Wait()
            if op == "mean":
                want, want_rs = _mean_of(want, N), _mean_of(want_rs, N)
            led = Ledger()
            got = allreduce(x, np.empty_like(x), comm=comm, op=op, ledger=led)
            y = x.copy()
            got_in = allreduce(y, comm=comm, op=op, ledger=led)
            rs = reduce_scatter(x, np.empty(size, dtype), comm=comm, op=op, ledger=led)
            z = x.copy()
            rs_in = reduce_scatter(z, comm=comm, op=op, ledger=led)
            assert got.tobytes() == want.tobytes() and got_in is y and y.tobytes() == want.tobytes()
            assert rs.tobytes() == want_rs.tobytes() and rs_in.tobytes() == want_rs.tobytes()
            assert rs_in.size == size
            if size:  # the chunk at its position in the buffer
                assert np.shares_memory(rs_in, z) and rs_in.ctypes.data == z[off:].ctypes.data
            t = led.totals()
            if N > 1:
                assert t["allreduce"] == dict(calls=2, sent_bytes=2 * x.nbytes,
                                              recv_bytes=2 * x.nbytes, sent_msgs=2, recv_msgs=2)
                assert t["reduce_scatter"] == dict(calls=2, sent_bytes=2 * x.nbytes,
                                                   recv_bytes=2 * size * dtype.itemsize,
                                                   sent_msgs=2, recv_msgs=2)
                assert _compiled(comm, "allreduce", op, dtype)
                assert _compiled(comm, "reduce_scatter", op, dtype)
        want_ag = np.empty(n, dtype)
        if n % N == 0:
            comm.Iallgather([x[off:off + size], T], [want_ag, T]).Wait()
        else:
            comm.Iallgatherv([x[off:off + size], T], [want_ag, counts, displs, T]).Wait()
        led = Ledger()
        ag = all_gather(x[off:off + size].copy(), np.zeros(n, dtype), comm=comm, ledger=led)
        full = np.zeros(n, dtype)
        full[off:off + size] = x[off:off + size]
        ag_in = all_gather(full, comm=comm, ledger=led)
        assert ag.tobytes() == want_ag.tobytes() and ag_in is full
        assert full.tobytes() == want_ag.tobytes()
        if N > 1:
            assert led.totals()["all_gather"] == dict(
                calls=2, sent_bytes=2 * size * dtype.itemsize, recv_bytes=2 * x.nbytes,
                sent_msgs=2, recv_msgs=2)
            assert _compiled(comm, "all_gather", "", dtype)


@pytest.mark.parametrize("code", ["L", "Q"])
def test_uint64_max_and_min_above_2_63_on_every_path(comm, code):
    """numpy's uint64 ('L' on LP64, mpi4py: MPI_UNSIGNED_LONG, which Open MPI 4.1 compares
    as signed) and 'Q': max / min of values above 2**63 are right through the compiled
    lean path, the mpi4py lean path, MPI's collective on the general path and the ring."""
    from hpcdp.comm.engines.compiled import lean
    N, r = comm.Get_size(), comm.Get_rank()
    dtype = np.dtype(code)

    def values(p):  # ranks on both sides of 2**63 at each position (a signed compare errs)
        return np.array([2**63 + p if p % 2 else p, 2**64 - 1 - p if p % 2 == 0 else 7 + p,
                         (p * 0x9E3779B97F4A7C15) % 2**64], dtype=dtype)
    x = values(r)
    every = np.stack([values(p) for p in range(N)])
    want_max, want_min = every.max(axis=0), every.min(axis=0)
    sub = comm.Dup()
    try:
        for path in ("compiled", "mpi4py"):
            lean.set_lean_path(sub, path)
            for kw in ({}, {"algorithm": "native", "max_message_bytes": 1 << 20},
                       {"algorithm": "ring"}):
                got = allreduce(x, np.empty_like(x), comm=sub, op="max", **kw)
                assert got.tobytes() == want_max.tobytes(), (path, kw, got)
                got = allreduce(x, np.empty_like(x), comm=sub, op="min", **kw)
                assert got.tobytes() == want_min.tobytes(), (path, kw, got)
            off, size = shard_range(3, N, r)
            got = reduce_scatter(x, np.empty(size, dtype), comm=sub, op="max")
            assert got.tobytes() == want_max[off:off + size].tobytes()
            req = iallreduce(x, np.empty_like(x), comm=sub, op="min")  # the non-blocking lean call
            assert req.wait().tobytes() == want_min.tobytes()
    finally:
        sub.Free()


def test_the_mpi4py_lean_path_stays_selectable(comm, monkeypatch):
    """set_lean_path(comm, "mpi4py") runs today's mpi4py path (same results, no compiled
    entry); HPCDP_COMM_LEAN chooses the default and a wrong value says what to set."""
    from hpcdp.comm.core.settings import settings
    from hpcdp.comm.engines.compiled import lean

    N, r = comm.Get_size(), comm.Get_rank()
    sub = comm.Dup()
    lean.set_lean_path(sub, "mpi4py")
    x = np.arange(10, dtype=np.float32) + r
    want = allreduce(x, np.empty_like(x), comm=comm)
    assert allreduce(x, np.empty_like(x), comm=sub).tobytes() == want.tobytes()
    assert not _compiled(sub, "allreduce", "sum", np.float32)
    lean.set_lean_path(sub, "compiled")
    assert allreduce(x, np.empty_like(x), comm=sub).tobytes() == want.tobytes()
    assert _compiled(sub, "allreduce", "sum", np.float32) == (N > 1)
    with pytest.raises(ValueError, match="lean path must be one of"):
        lean.set_lean_path(sub, "c")
    monkeypatch.setenv("HPCDP_COMM_LEAN", "fortran")
    with pytest.raises(ValueError, match="HPCDP_COMM_LEAN must be one of"):
        settings().lean
    monkeypatch.setenv("HPCDP_COMM_LEAN", "mpi4py")
    assert settings().lean == "mpi4py"
    sub.Free()


def test_compiled_lean_fallback_when_mpi_cannot_be_bound(comm, monkeypatch, caplog):
    """An MPI the binding refuses: the mpi4py path runs, one log line says so."""
    import logging

    from hpcdp.comm.engines.compiled import binding, lean

    def unknown_abi():
        raise binding.Unbindable("unknown MPI ABI: handle sizes [2] bytes")

    lean.forget()
    monkeypatch.setattr(binding, "load", unknown_abi)
    sub = comm.Dup()
    try:
        with caplog.at_level(logging.WARNING, logger="hpcdp.comm"):
            x = np.arange(10, dtype=np.float64) + comm.Get_rank()
            a = allreduce(x, np.empty_like(x), comm=sub)
            b = reduce_scatter(x.copy(), comm=sub, op="max")
        lines = [m.getMessage() for m in caplog.records if "lean" in m.getMessage()]
        if comm.Get_size() > 1:
            assert lines == ["hpcdp.comm: the compiled lean path cannot bind this MPI (unknown "
                             "MPI ABI: handle sizes [2] bytes); small collectives run through "
                             "mpi4py"]
        assert not _compiled(sub, "allreduce", "sum", np.float64)
        assert not _compiled(sub, "reduce_scatter", "max", np.float64)
    finally:
        monkeypatch.undo()
        lean.forget()
    assert a.tobytes() == allreduce(x, np.empty_like(x), comm=sub).tobytes()
    assert b.tobytes() == reduce_scatter(x.copy(), comm=sub, op="max").tobytes()
    sub.Free()


@pytest.mark.mpi(min_size=2)
def test_an_mpi_error_in_the_compiled_lean_path_is_an_mpierror(comm):
    """An MPI call that fails inside compiled code raises what mpi4py's path raises:
    hpcdp.comm.MPIError with MPI's error class, on every rank (an invalid op: the check is
    local); the communicator is failed from then on, until hpcdp.comm.forget."""
    from hpcdp.comm import MPIError, forget
    from hpcdp.comm.engines.compiled import lean

    sub = comm.Dup()
    x = np.ones(4, np.float32)
    for _ in range(2):  # the first call sets the context up (the general path)
        allreduce(x, np.empty_like(x), comm=sub)
    e = get_context(sub).plans[("sig", "allreduce", "sum", "auto", np.dtype(np.float32), "f")][4]
    good = e.H[lean.H_OP]
    e.H[lean.H_OP] = lean.binding().handle(MPI.OP_NULL)
    with pytest.raises(MPIError) as err:
        allreduce(x, np.empty_like(x), comm=sub)
    assert err.value.error_class == MPI.ERR_OP and err.value.error_name == "MPI_ERR_OP"
    e.H[lean.H_OP] = good
    with pytest.raises(MPIError):  # failed until forgotten
        allreduce(x, np.empty_like(x), comm=sub)
    forget(sub)
    np.testing.assert_array_equal(allreduce(x, np.empty_like(x), comm=sub), np.full(4, comm.Get_size()))
    forget(sub)
    sub.Free()


@pytest.mark.mpi(min_size=2)
def test_a_rank_missing_from_a_compiled_lean_call_is_named(comm):
    """A rank that never calls (allreduce, reduce-scatter, all-gather in turn, each on its
    own communicator): rank 0's deadline passes in the compiled wait loop, the other
    waiting ranks join its diagnosis from theirs (a peer's status message), and every
    one names the missing rank within its timeout."""
    import time

    from hpcdp.comm import CollectiveTimeout
    from hpcdp.comm.core.diagnose import grace_s

    rank, N = comm.Get_rank(), comm.Get_size()
    x = np.ones(12, np.float32)
    calls = {"allreduce": lambda c, t=None: allreduce(x, np.empty_like(x), comm=c, timeout=t),
             "reduce_scatter": lambda c, t=None: reduce_scatter(x, comm=c, timeout=t),
             "all_gather": lambda c, t=None: all_gather(x, comm=c, timeout=t)}
    subs = {}
    for name, call in calls.items():
        subs[name] = sub = comm.Dup()  # a timeout marks its communicator failed
        for _ in range(2):  # every rank arrives; the signature's compiled entry is ready
            call(sub)
        assert _compiled(sub, name, "" if name == "all_gather" else "sum", np.float32)
    waiting = comm.Split(int(rank == N - 1), rank)
    if rank != N - 1:  # the last rank never makes the next calls
        for name, call in calls.items():
            # (a limit of 9 s: a joining rank waits a grace of 1 s for answers, as rank 0
            # does, so both have concluded before the next collective starts)
            limit = 1.0 if rank == 0 else 9.0
            waiting.Barrier()
            start = time.monotonic()
            with pytest.raises(CollectiveTimeout) as e:
                call(subs[name], limit)
            assert e.value.missing == [N - 1], (name, str(e.value))
            assert f"ranks [{N - 1}] never arrived" in str(e.value)
            assert time.monotonic() - start < limit + 2 * grace_s(limit) + 1  # and the answers' grace
            if rank != 0:
                assert "another rank's deadline passed first" in str(e.value)
    waiting.Free()
    comm.Barrier()


# -- ready calls (hpcdp.comm.engines.compiled.lean.LeanCall): a repeated blocking call's checks done once --

def _ready(comm, which, buf, op="sum"):
    return lean._ready(comm, which, buf, op, "auto")


@pytest.mark.mpi(min_size=2)
def test_ready_calls_give_mpis_bits_and_the_same_ledger(comm):
    """From its second run a blocking call's signature has a ready call; the repeated
    calls (in and out of place, the three collectives, an uneven length) give the bits of
    mpi4py's collective, one sequence number each and the full front's ledger figures."""
    N, r = comm.Get_size(), comm.Get_rank()
    ctx = get_context(comm)
    for n in (8, 2 * N + 1):
        x = (np.arange(n, dtype=np.float32) * (r + 1.5)).astype(np.float32)
        off, size = shard_range(n, N, r)
        full_led, ready_led = Ledger(), Ledger()
        for led in (full_led, ready_led, ready_led):  # the first run keeps the ready calls
            allreduce(x, np.empty_like(x), comm=comm, ledger=led)
            allreduce(x.copy(), comm=comm, ledger=led)
            reduce_scatter(x, np.empty(size, np.float32), comm=comm, ledger=led)
            reduce_scatter(x.copy(), comm=comm, ledger=led)
            all_gather(x[off:off + size].copy(), np.empty_like(x), comm=comm, ledger=led)
        assert _ready(comm, lean.AR, x) is not None and _ready(comm, lean.RS, x) is not None
        assert _ready(comm, lean.AG, x, "") is not None
        ref = np.empty_like(x)
        comm.Allreduce(x, ref)
        chunk = np.empty(size, np.float32)
        comm.Reduce_scatter(x, chunk, [shard_range(n, N, p)[1] for p in range(N)])
        seq = ctx.seq
        assert allreduce(x, np.empty_like(x), comm=comm).tobytes() == ref.tobytes()
        assert allreduce(x.copy(), comm=comm).tobytes() == ref.tobytes()
        assert reduce_scatter(x, np.empty(size, np.float32), comm=comm).tobytes() == chunk.tobytes()
        y = x.copy()
        got = reduce_scatter(y, comm=comm)
        assert got.tobytes() == chunk.tobytes() and np.shares_memory(got, y[off:off + size])
        g = np.empty_like(x)
        assert all_gather(x[off:off + size].copy(), g, comm=comm) is g
        h = x.copy()
        assert all_gather(h, comm=comm) is h
        assert ctx.seq == seq + 6
        a, b = full_led.totals(), ready_led.totals()
        for name in ("allreduce", "reduce_scatter", "all_gather"):
            assert {k: 2 * v for k, v in a[name].items()} == b[name], name


@pytest.mark.mpi(min_size=2)
def test_ready_calls_are_dropped_or_passed_when_they_must(comm):
    """A ready call serves only its own signature: another dtype or op at the same length,
    a set_lean_path, a new auto generation, debug mode and a failed communicator all take
    the full front (which gives the right answer or its error)."""
    from hpcdp.comm import auto
    from hpcdp.comm.engines.compiled.lean import set_lean_path
    from hpcdp.comm.core.context import set_debug

    N, r = comm.Get_size(), comm.Get_rank()
    sub = comm.Dup()
    ctx = get_context(sub)
    x = np.full(6, r + 1.0)
    for _ in range(2):
        allreduce(x, np.empty_like(x), comm=sub)
    rec = _ready(sub, lean.AR, x)
    assert rec is not None and rec.dtype is x.dtype
    assert _ready(sub, lean.AR, x, "max") is None  # another op
    assert allreduce(x, np.empty_like(x), comm=sub, op="max")[0] == N
    xi = np.full(6, r + 1, np.int64)  # another dtype, same length
    assert _ready(sub, lean.AR, xi) is None
    assert allreduce(xi, np.empty_like(xi), comm=sub)[0] == N * (N + 1) // 2
    assert _ready(sub, lean.AR, x[::-1]) is None  # not contiguous: the flags say so
    ro = np.empty_like(x)
    ro.flags.writeable = False
    for _ in range(2):
        allreduce(x, np.empty_like(x), comm=sub)
    with pytest.raises(ValueError, match="read-only"):
        allreduce(x, ro, comm=sub)
    with pytest.raises(ValueError, match="elements"):
        allreduce(x, np.empty(5), comm=sub)
    assert allreduce(x, np.empty_like(x), comm=sub)[0] == N * (N + 1) / 2
    set_lean_path(sub, "mpi4py")
    assert not any(ctx.ready_calls)
    assert allreduce(x, np.empty_like(x), comm=sub)[0] == N * (N + 1) / 2
    assert not any(ctx.ready_calls)  # the mpi4py path keeps none
    set_lean_path(sub, "compiled")
    for _ in range(2):
        allreduce(x, np.empty_like(x), comm=sub)
    assert _ready(sub, lean.AR, x) is not None
    auto.forget()
    assert _ready(sub, lean.AR, x) is None  # auto decides again (every rank alike)
    for _ in range(2):
        allreduce(x, np.empty_like(x), comm=sub)
    assert _ready(sub, lean.AR, x) is not None
    set_debug(sub, True)
    assert _ready(sub, lean.AR, x) is None
    assert allreduce(x, np.empty_like(x), comm=sub)[0] == N * (N + 1) / 2
    set_debug(sub, False)
    assert _ready(sub, lean.AR, x) is not None
    boom = RuntimeError("this communicator failed")
    ctx.failed = boom
    assert _ready(sub, lean.AR, x) is None
    with pytest.raises(RuntimeError, match="this communicator failed"):
        allreduce(x, np.empty_like(x), comm=sub)
    ctx.failed = None
    sub.Free()
