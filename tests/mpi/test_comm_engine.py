"""The compiled engine (hpcdp.comm.engines.compiled) against the Python ring, on real ranks.

Both engines run the same calls on the same data; results must be equal byte for
byte (every dtype, op, length class, in and out of place, pipelined segments and
whole chunks), and so must the ledgers. Also: the engine really runs (not the
fallback) on this MPI, the fallback when MPI cannot be bound, a rank that never
arrives named from compiled code, and progress while the calling thread sleeps.
"""

import contextlib
import logging
import os
import time

import numpy as np
import pytest

from hpcdp.comm import CollectiveTimeout, Ledger, all_gather, allreduce, iallreduce, \
    iall_gather, reduce_scatter
from hpcdp.comm import active_engine, set_engine
from hpcdp.comm.engines.compiled import binding, engine
from hpcdp.comm.engines.ready import AG, AR, RS, kept
from hpcdp.comm.engines.compiled.request import CompiledRingRequest
from hpcdp.comm.core.context import get_context
from hpcdp.shard import shard_range

pytestmark = pytest.mark.mpi

DTYPES = [np.float16, np.float32, np.float64, np.int8, np.uint8, np.int16, np.int32,
          np.int64, np.uint64]
OPS = ["sum", "mean", "max", "min"]


@contextlib.contextmanager
def progress_by(mode):
    """Run the block with the progress thread (``thread``) or without (``calls``),
    whatever HPCDP_COMM_PROGRESS=auto chose for this machine."""
    eng = engine.compiled_engine()
    was = eng.progress.enabled
    eng.progress.enabled = mode == "thread"
    try:
        yield eng
    finally:
        eng.progress.enabled = was


def lengths(N):
    return sorted({0, 1, max(N - 1, 1), N + 1, 13, 4099})


def data(n, rank, dtype, salt=0):
    rng = np.random.default_rng(1000 * rank + 7 * n + salt)
    if np.dtype(dtype).kind == "f":
        x = (rng.standard_normal(n) * 1e3).astype(dtype)
        if n > 5:
            x[3] = np.nan if rank == 1 else x[3]  # NaN from one rank: max/min propagate it
        return x
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max, size=n, dtype=dtype, endpoint=True)


def run_all(comm, eng, dtype, n, seg, fronts=None, back=True):
    """Every ring collective on ``eng``; returns (results, ledger totals). ``fronts``: a
    list that gets, for each call made twice in a row (the repeat: its ready call,
    hpcdp.comm.engines.ready), ``(name, entry kind, whether the entry ran)``; ``back``: set
    the engine back to Python at the end (which empties the ready calls)."""
    set_engine(comm, eng)
    rank, N = comm.Get_rank(), comm.Get_size()
    ledger = Ledger()
    out = {}
    kw = dict(comm=comm, algorithm="ring", ledger=ledger, segment_bytes=seg)

    def call(key, which, fn):
        out[key] = fn().tobytes()
        if fronts is not None:
            assert fn().tobytes() == out[key], key
            e = kept(get_context(comm), which, "ring", n)
            # a ready entry's first run takes its state from the plan and keeps it
            fronts.append((key, type(e).__name__, e is not None and e.state is not None))

    for op in OPS:
        x = data(n, rank, dtype)
        call(("ar", op), AR, lambda: allreduce(x.copy(), **kw, op=op))
        call(("ar-out", op), AR, lambda: allreduce(x, np.empty_like(x), **kw, op=op))
        off, size = shard_range(n, N, rank)
        call(("rs", op), RS, lambda: reduce_scatter(x.copy(), **kw, op=op))
        call(("rs-out", op), RS, lambda: reduce_scatter(x, np.empty(size, dtype), **kw, op=op))
    x = data(n, rank, dtype, salt=1)
    off, size = shard_range(n, N, rank)

    def gathered():
        full = np.zeros(n, dtype)
        full[off:off + size] = x[off:off + size]
        return all_gather(full, **kw)

    call("ag", AG, gathered)
    call("ag-out", AG, lambda: all_gather(x[off:off + size].copy(), np.zeros(n, dtype), **kw))
    if back:
        set_engine(comm, "python")
    return out, ledger.totals()


def test_the_engine_binds_this_mpi(comm):
    set_engine(comm, "compiled")
    assert active_engine(comm) == "compiled", binding.why()
    set_engine(comm, "python")


# every dtype with 256-byte segments (pipelining, many messages per chunk); whole chunks
# (one message per step) for three
CASES = [(d, 256) for d in DTYPES] + [(d, None) for d in (np.float32, np.float64, np.int64)]


@pytest.mark.parametrize("dtype,seg", CASES,
                         ids=[f"{np.dtype(d).name}-{'seg256' if s else 'whole'}" for d, s in CASES])
def test_bitwise_equal_to_the_python_ring(comm, dtype, seg):
    ctx = get_context(comm)
    for n in lengths(comm.Get_size()):
        ref, ref_ledger = run_all(comm, "python", dtype, n, seg)
        ctx.compiled_plans.clear()  # (its cap of 256 plans must not drop this n's plans)
        ctx.forget_ready()
        # the request path (compiling); the engine keeps a ready entry per signature
        got, got_ledger = run_all(comm, "compiled", dtype, n, seg, back=False)
        fronts = []
        # each call twice in a row: the repeat runs on its ready entry
        again, again_ledger = run_all(comm, "compiled", dtype, n, seg, fronts)
        bad = [k for k in ref if ref[k] != got[k] or ref[k] != again[k]]
        assert not bad, f"n={n}: {bad} differ"
        twice = {k: {f: 2 * v for f, v in d.items()} for k, d in ref_ledger.items()}
        assert got_ledger == ref_ledger and again_ledger == twice, f"n={n}"
        if n and comm.Get_size() > 1:  # every repeated call of the second run ran its entry
            assert len(fronts) == 4 * 4 + 2, fronts  # 4 ops x (ar, ar-out, rs, rs-out) + 2 ag
            missed = [f for f in fronts if f[1:] != ("Entry", True)]
            assert not missed, missed


@pytest.mark.mpi(min_size=2)
def test_the_blocking_front_keeps_debug_mode_and_the_engine_choice(comm):
    from hpcdp.comm import CollectiveMismatch, set_debug

    sub = comm.Dup()
    set_engine(sub, "compiled")
    N, r = sub.Get_size(), sub.Get_rank()
    fronts = get_context(sub).ready_calls[AR].setdefault("ring", {})
    for n in (10, 11):  # both signatures warm on every rank: the front would take them
        for _ in range(2):
            allreduce(np.ones(n), comm=sub, algorithm="ring")
    assert len(fronts) == 2
    set_debug(sub, True)
    try:
        with pytest.raises(CollectiveMismatch) as err:
            allreduce(np.ones(11 if r == N - 1 else 10), comm=sub, algorithm="ring", timeout=10)
        assert "length=10" in str(err.value) and "length=11" in str(err.value)
    finally:
        set_debug(sub, False)
    set_engine(sub, "python")  # the front follows set_engine: the Python ring runs
    x = np.arange(10.0) + r
    assert np.array_equal(allreduce(x.copy(), comm=sub, algorithm="ring"),
                          np.arange(10.0) * N + N * (N - 1) / 2)


def test_compiled_requests_run_for_the_compiled_dtypes(comm):
    if comm.Get_size() == 1:
        pytest.skip("one rank: no ring runs")
    set_engine(comm, "compiled")
    try:
        req = iallreduce(np.ones(1000, np.float32), comm=comm, algorithm="ring")
        assert isinstance(req, CompiledRingRequest)
        assert np.array_equal(req.wait(), np.full(1000, comm.Get_size(), np.float32))
        half = iallreduce(np.ones(10, np.float16), comm=comm, algorithm="ring")
        assert isinstance(half, CompiledRingRequest)  # float16: computed on its bits
        half.wait()
        custom = iallreduce(np.ones(10), comm=comm, algorithm="ring", op=lambda a, b: a + b)
        assert not isinstance(custom, CompiledRingRequest)  # a callable op: the Python ring
        custom.wait()
    finally:
        set_engine(comm, "python")


def test_fallback_when_mpi_cannot_be_bound(comm, monkeypatch, caplog):
    from hpcdp.comm.engines.compiled import binding

    def unknown_abi():
        raise binding.Unbindable("unknown MPI ABI: handle sizes [2] bytes")

    engine.forget()
    monkeypatch.setattr(binding, "load", unknown_abi)
    try:
        set_engine(comm, "compiled")
        with caplog.at_level(logging.WARNING, logger="hpcdp.comm"):
            x = np.arange(50, dtype=np.float64) + comm.Get_rank()
            a = allreduce(x.copy(), comm=comm, algorithm="ring")
            b = allreduce(x.copy(), comm=comm, algorithm="ring")
        assert active_engine(comm) == "python"
        lines = [r.getMessage() for r in caplog.records if r.name == "hpcdp.comm"]
        assert lines == ["hpcdp.comm: the compiled engine cannot bind this MPI (unknown MPI ABI: "
                         "handle sizes [2] bytes); collectives run on the Python ring"]
        set_engine(comm, "python")
        assert a.tobytes() == b.tobytes() == allreduce(x.copy(), comm=comm,
                                                       algorithm="ring").tobytes()
    finally:
        monkeypatch.undo()
        engine.forget()
        set_engine(comm, "python")


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("path", ["first call", "repeated call"])
def test_a_rank_that_never_arrives_is_named_from_compiled_code(comm, path):
    sub = comm.Dup()  # the timeout marks its communicator failed: keep COMM_WORLD usable
    rank, N = sub.Get_rank(), sub.Get_size()
    set_engine(sub, "compiled")
    allreduce(np.ones(4), comm=sub, algorithm="ring")  # everyone arrives here
    if path == "repeated call":  # the missed call's signature is warm: the blocking front
        allreduce(np.ones(1 << 16), comm=sub, algorithm="ring")  # compiles: the request path
        allreduce(np.ones(1 << 16), comm=sub, algorithm="ring")  # its ready entry
        assert (1 << 16) in get_context(sub).ready_calls[AR]["ring"]
    if rank == N - 1:
        time.sleep(4)  # never calls the next one
    else:
        # rank 0's deadline passes first; the others (N >= 3) join its diagnosis
        # from their compiled wait loop (a peer's status message), long before theirs
        limit = 1.0 if rank == 0 else 60.0
        start = time.monotonic()
        with pytest.raises(CollectiveTimeout) as e:
            allreduce(np.ones(1 << 16), comm=sub, algorithm="ring", timeout=limit)
        assert e.value.missing == [N - 1], str(e.value)
        assert f"ranks [{N - 1}] never arrived" in str(e.value)
        assert time.monotonic() - start < 30
        if rank != 0:
            assert "another rank's deadline passed first" in str(e.value)
    comm.Barrier()


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("how", ["time.sleep", "nogil kernel"])
def test_done_when_the_caller_wakes_without_a_poll(comm, how):
    """Started, then the caller sleeps: the progress thread completes it; no test() or
    wait() is called before ``done`` is read. Both shapes run once before (blocking):
    their code is compiled (or loaded from Numba's cache) outside the sleep, which
    must overlap on every rank (with an empty cache each rank compiles at its own pace,
    so one rank's sleep could end before its peer had started)."""
    set_engine(comm, "compiled")
    N = comm.Get_size()
    try:
        with progress_by("thread"):
            x = np.full(1 << 18, 1.0, np.float32)  # 1 MiB: several rendezvous messages
            full = np.zeros(1 << 16, np.float64)
            allreduce(x.copy(), comm=comm, algorithm="ring", segment_bytes=1 << 16)
            all_gather(full.copy(), comm=comm, algorithm="ring")
            off, size = shard_range(full.size, N, comm.Get_rank())
            full[off:off + size] = comm.Get_rank()
            comm.Barrier()
            reqs = [iallreduce(x, comm=comm, algorithm="ring", segment_bytes=1 << 16),
                    iall_gather(full, comm=comm, algorithm="ring")]
            _sleep_then_check(how, reqs, x, full, N)
    finally:
        set_engine(comm, "python")


def _sleep_then_check(how, reqs, x, full, N):
    if how == "time.sleep":
        time.sleep(2.0)
    else:
        engine.compiled_engine().sleep_us(2_000_000)
    assert [r.done for r in reqs] == [True, True]
    assert np.array_equal(x, np.full(x.size, N, np.float32))
    want = np.concatenate([np.full(shard_range(full.size, N, p)[1], p, np.float64)
                           for p in range(N)])
    assert np.array_equal(full, want)


@pytest.mark.mpi(min_size=2)
def test_states_are_reused_and_buckets_progress_alone(comm):
    """Repeated calls of one shape reuse one plan's state (reset in compiled code, same
    results every time); non-blocking requests progress alone (so DDP's drain waits on
    the oldest), and auto picks the compiled ring for overlapped buckets."""
    from hpcdp.comm.select import overlap_algorithm
    from hpcdp.comm.core.context import get_context

    set_engine(comm, "compiled")
    N = comm.Get_size()
    try:
        assert overlap_algorithm(comm, "auto") == "ring"
        assert overlap_algorithm(comm, "native") == "native"
        ledger = Ledger()
        for i in range(5):
            x = np.full(1000, float(i + comm.Get_rank()), np.float64)
            allreduce(x, comm=comm, algorithm="ring", ledger=ledger, segment_bytes=1024)
            assert np.array_equal(x, np.full(1000, float(N * i + N * (N - 1) // 2)))
        plans = [p for k, p in get_context(comm).compiled_plans.items() if k[0] == 1000
                 and k[4] == "d"]
        # one state in all: the first call's (the request path) went back to the plan,
        # the blocking front's entry took it for the repeated calls and keeps it
        held = [e.state for e in get_context(comm).ready_calls[AR]["ring"].values() if
                e.plan is plans[0]]
        assert len(plans) == 1 and not plans[0].free and len(held) == 1 and held[0] is not None
        with progress_by("thread"):
            reqs = [iallreduce(np.ones(1 << 16, np.float32), comm=comm, algorithm="ring",
                               ledger=ledger) for _ in range(3)]
            assert all(r.progresses_alone or r.done for r in reqs)
            for r in reqs:
                r.wait()
        assert ledger.totals()["allreduce"]["calls"] == 8
    finally:
        set_engine(comm, "python")
    assert overlap_algorithm(comm, "auto") == "auto"


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("mode", ["thread", "calls"])
def test_who_advances_a_nonblocking_request(comm, mode):
    """With the progress thread, a launch and the caller's test() make no compiled call
    on the calling thread (the thread posts and advances; test() reads its counters:
    no GIL hand-off per hook); with
    HPCDP_COMM_PROGRESS=calls there is no thread and the caller's test() calls drive
    it. Same result either way."""
    import threading

    eng = engine.compiled_engine()
    calls = {"caller": 0, "other": 0}
    caller = threading.current_thread()
    real = eng.advance

    def counted(*args):
        calls["caller" if threading.current_thread() is caller else "other"] += 1
        return real(*args)

    set_engine(comm, "compiled")
    was = eng.progress.enabled
    eng.progress.enabled = mode == "thread"
    try:
        x = np.full(1 << 18, 1.0, np.float32)
        iallreduce(x.copy(), comm=comm, algorithm="ring", segment_bytes=1 << 16).wait()
        eng.advance = counted  # the plan is warm: a launch makes no compiled call now
        comm.Barrier()
        req = iallreduce(x, comm=comm, algorithm="ring", segment_bytes=1 << 16)
        assert req.progresses_alone == (mode == "thread")
        deadline = time.monotonic() + 30
        while not req.test():
            assert time.monotonic() < deadline
        assert np.array_equal(x, np.full(x.size, comm.Get_size(), np.float32))
        if mode == "thread":  # (the thread's own passes: progress.background_advance)
            assert calls["caller"] == 0
        else:
            assert calls["caller"] >= 1 and calls["other"] == 0
    finally:
        eng.advance = real
        eng.progress.enabled = was
        set_engine(comm, "python")


@pytest.mark.mpi(min_size=2)
def test_a_wait_asked_before_the_threads_first_pass_takes_the_request_over(comm):
    """wait() sets ST_STOP, then takes the lock. If the progress thread had already
    picked the request up, its first pass resets the state from the plan's template:
    that reset must keep ST_STOP, so the pass hands the request over after its posts
    (PROGRESS) instead of keeping it to the end or its deadline while wait() blocks.
    Here rank 0 makes that first pass itself, with ST_STOP set, while its peers wait
    at a barrier (so the collective cannot complete within the pass)."""
    from hpcdp.comm.collectives import blocking_call
    from hpcdp.comm.engines.compiled import kernels as K

    set_engine(comm, "compiled")
    try:
        x = np.ones(1 << 10, np.float32)
        allreduce(x.copy(), comm=comm, algorithm="ring")  # the plan is warm
        iallreduce(x.copy(), comm=comm, algorithm="ring").wait()
        code = K.PROGRESS
        if comm.Get_rank() == 0:
            # a launch whose first pass is still to come (as a warm launch's for the thread)
            req = blocking_call(iallreduce, x, comm=comm, algorithm="ring")
            req.st[K.ST_STOP] = 1  # wait()'s request, before that pass
            with req.lock:
                code = req.background_pass(time.monotonic() + 3.0)
            comm.Barrier()
            req.wait()
        else:
            comm.Barrier()
            iallreduce(x, comm=comm, algorithm="ring").wait()
        assert np.array_equal(x, np.full(x.size, comm.Get_size(), np.float32))
        assert code == K.PROGRESS, code  # not TIMEOUT (-1): the pass ran to its deadline
    finally:
        set_engine(comm, "python")


@pytest.mark.mpi(min_size=2)
def test_the_default_progress_mode_follows_the_spare_cores(comm, monkeypatch, caplog):
    """HPCDP_COMM_PROGRESS unset is ``auto``: without a spare core (as many ranks as
    CPUs, this machine and CI) no progress thread, a request advances in test();
    the decision is logged; explicit modes are kept."""
    from hpcdp.comm.engines.compiled import progress as prog

    monkeypatch.delenv("HPCDP_COMM_PROGRESS", raising=False)
    mask, node = len(os.sched_getaffinity(0)), os.cpu_count()
    ranks = prog.local_ranks(world_size=comm.Get_size())[0]
    eng = engine.compiled_engine()
    with caplog.at_level(logging.INFO, logger="hpcdp.comm"):
        fresh = prog.ProgressThread(eng.binding.usleep)
    assert "compiled collectives progress by" in caplog.text and f"{ranks} ranks" in caplog.text
    if mask == node:  # not bound to CPUs (mpiexec's default)
        assert fresh.mode == ("thread" if node >= 2 * ranks else "calls"), (mask, node, ranks)
    assert fresh.enabled == (fresh.mode == "thread")
    monkeypatch.setenv("HPCDP_COMM_PROGRESS", "thread")
    assert prog.ProgressThread(eng.binding.usleep).enabled
    monkeypatch.setenv("HPCDP_COMM_PROGRESS", "calls")
    assert not prog.ProgressThread(eng.binding.usleep).enabled
    set_engine(comm, "compiled")
    was = eng.progress
    eng.progress = fresh
    try:
        x = np.ones(1 << 12, np.float32)
        iallreduce(x.copy(), comm=comm, algorithm="ring").wait()  # warm
        req = iallreduce(x, comm=comm, algorithm="ring")
        assert req.progresses_alone == (fresh.mode == "thread")
        req.wait()
        assert np.array_equal(x, np.full(x.size, comm.Get_size(), np.float32))
    finally:
        eng.progress = was
        set_engine(comm, "python")
