"""Closed-form tests of every collective, op, dtype, in/out of place, on N ranks.

Rank r contributes x_r[i] = (i % 7) + r + 1, so the sum is N*(i % 7) + N(N+1)/2,
the max (i % 7) + N and the min (i % 7) + 1: small integers, exact in float16.
Every result is also compared with MPI's own Allreduce/Reduce_scatter/Allgatherv
on the same data.
"""

import numpy as np
import pytest
from mpi4py import MPI

from hpcdp.comm import all_gather, allreduce, reduce_scatter
from hpcdp.shard import shard_bounds, shard_range

pytestmark = pytest.mark.mpi

DTYPES = [np.float16, np.float32, np.float64, np.int32, np.int64]
OPS = ["sum", "mean", "max", "min", "custom"]
MPI_OPS = {"sum": MPI.SUM, "mean": MPI.SUM, "max": MPI.MAX, "min": MPI.MIN, "custom": MPI.SUM}


def _custom(a, b):  # a plain Python callable (not a ufunc): the generic op path
    return a + b


def lengths(N):
    return sorted({0, 1, max(N - 1, 0), N + 1, 13, 65537})


def contribution(n, rank, dtype):
    return ((np.arange(n) % 7) + rank + 1).astype(dtype)


def expected(n, N, op, dtype):
    base = np.arange(n) % 7
    if op in ("sum", "custom"):
        return (N * base + N * (N + 1) // 2).astype(dtype)
    if op == "mean":
        total = (N * base + N * (N + 1) // 2)
        if np.issubdtype(dtype, np.integer):
            return (total // N).astype(dtype)
        return (total.astype(dtype) / dtype(N)).astype(dtype)
    if op == "max":
        return (base + N).astype(dtype)
    return (base + 1).astype(dtype)


def mpi_reference(comm, x, op):
    ref = np.empty_like(x)
    comm.Allreduce(x, ref, op=MPI_OPS[op])
    if op == "mean":
        N = comm.Get_size()
        ref = ref // N if np.issubdtype(x.dtype, np.integer) else (ref / x.dtype.type(N)).astype(x.dtype)
    return ref


def _op(op):
    return _custom if op == "custom" else op


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("algorithm", ["ring", "recursive", "native", "auto"])
def test_allreduce_closed_form(comm, algorithm, dtype):
    N, r = comm.Get_size(), comm.Get_rank()
    for n in lengths(N):
        x = contribution(n, r, dtype)
        for op in OPS:
            want = expected(n, N, op, dtype)
            ref = mpi_reference(comm, x, op)
            np.testing.assert_array_equal(ref, want)
            out = np.full(n, -1, dtype=dtype)
            got = allreduce(x, out, comm=comm, op=_op(op), algorithm=algorithm, segment_bytes=4096)
            assert got is out
            np.testing.assert_array_equal(out, want, err_msg=f"out-of-place n={n} op={op}")
            np.testing.assert_array_equal(x, contribution(n, r, dtype))  # input untouched
            y = x.copy()
            allreduce(y, comm=comm, op=_op(op), algorithm=algorithm, segment_bytes=4096)
            np.testing.assert_array_equal(y, want, err_msg=f"in place n={n} op={op}")


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("algorithm", ["ring", "native", "auto", "recursive", "hierarchical"])
def test_reduce_scatter_closed_form(comm, algorithm, dtype):
    N, r = comm.Get_size(), comm.Get_rank()
    for n in lengths(N):
        off, size = shard_range(n, N, r)
        x = contribution(n, r, dtype)
        counts = [s for _, s in shard_bounds(n, N)]
        for op in OPS:
            want = expected(n, N, op, dtype)[off:off + size]
            ref = np.empty(size, dtype=dtype)
            comm.Reduce_scatter(x, ref, counts, op=MPI_OPS[op])
            if op == "mean":
                ref = ref // N if np.issubdtype(dtype, np.integer) else (ref / dtype(N)).astype(dtype)
            np.testing.assert_array_equal(ref, want)
            out = np.full(size, -1, dtype=dtype)
            reduce_scatter(x, out, comm=comm, op=_op(op), algorithm=algorithm, segment_bytes=4096)
            np.testing.assert_array_equal(out, want, err_msg=f"out-of-place n={n} op={op}")
            y = x.copy()
            chunk = reduce_scatter(y, comm=comm, op=_op(op), algorithm=algorithm, segment_bytes=4096)
            np.testing.assert_array_equal(chunk, want, err_msg=f"in place n={n} op={op}")
            np.testing.assert_array_equal(y[off:off + size], want)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("algorithm", ["ring", "native", "auto", "recursive", "bruck", "hierarchical"])
def test_all_gather_closed_form(comm, algorithm, dtype):
    N, r = comm.Get_size(), comm.Get_rank()
    for n in lengths(N):
        bounds = shard_bounds(n, N)
        off, size = bounds[r]
        want = ((np.arange(n) * 3 + 1) % 1000).astype(dtype)  # exact in every dtype, float16 too
        chunk = want[off:off + size].copy()
        ref = np.empty(n, dtype=dtype)
        comm.Allgatherv(chunk, [ref, [s for _, s in bounds], [o for o, _ in bounds], MPI.Datatype.fromcode(ref.dtype.char)])
        np.testing.assert_array_equal(ref, want)
        out = np.full(n, -1, dtype=dtype)
        all_gather(chunk, out, comm=comm, algorithm=algorithm, segment_bytes=4096)
        np.testing.assert_array_equal(out, want, err_msg=f"out-of-place n={n}")
        full = np.full(n, -1, dtype=dtype)
        full[off:off + size] = chunk
        all_gather(full, comm=comm, algorithm=algorithm, segment_bytes=4096)
        np.testing.assert_array_equal(full, want, err_msg=f"in place n={n}")


@pytest.mark.parametrize("segment_bytes", [8, 1000, None])
def test_ring_segmentation_and_message_split(comm, segment_bytes):
    """Tiny segments (many pipelined messages) and a lowered per-message limit
    (the code path that keeps >2 GiB messages below MPI's int count) agree."""
    N, r = comm.Get_size(), comm.Get_rank()
    n = 10007
    x = contribution(n, r, np.float64)
    want = expected(n, N, "sum", np.float64)
    got = allreduce(x, np.empty_like(x), comm=comm, algorithm="ring",
                    segment_bytes=segment_bytes, max_message_bytes=256)
    np.testing.assert_array_equal(got, want)
    for algorithm in ("recursive", "native"):
        got = allreduce(x, np.empty_like(x), comm=comm, algorithm=algorithm, max_message_bytes=256)
        np.testing.assert_array_equal(got, want)


def test_results_identical_on_every_rank(comm):
    """Random float data: every rank holds bitwise the same result."""
    r = comm.Get_rank()
    x = np.random.default_rng(r).standard_normal(4099).astype(np.float32)
    for algorithm in ("ring", "recursive"):
        got = allreduce(x, np.empty_like(x), comm=comm, algorithm=algorithm, segment_bytes=512)
        everyone = np.empty((comm.Get_size(), x.size), dtype=np.float32)
        comm.Allgather(got, everyone)
        assert (everyone == got).all(), algorithm
        np.testing.assert_allclose(got, mpi_reference(comm, x, "sum"), rtol=1e-5, atol=1e-5)


def test_multidimensional_buffers_are_flat(comm):
    N, r = comm.Get_size(), comm.Get_rank()
    x = contribution(24, r, np.float32).reshape(4, 6)
    got = allreduce(x, comm=comm)
    assert got.shape == (4, 6)
    np.testing.assert_array_equal(got.ravel(), expected(24, N, "sum", np.float32))


def test_bad_input_errors(comm):
    with pytest.raises(ValueError, match="C-contiguous"):
        allreduce(np.zeros((4, 4))[:, 0], comm=comm)
    with pytest.raises(ValueError, match="op must be one of"):
        allreduce(np.zeros(4), comm=comm, op="prod")
    with pytest.raises(ValueError, match="algorithm must be one of"):
        allreduce(np.zeros(4), comm=comm, algorithm="tree")
    with pytest.raises(ValueError, match="shard_range"):
        reduce_scatter(np.zeros(10), np.zeros(11), comm=comm)
    with pytest.raises(TypeError, match="comm="):
        allreduce(np.zeros(4), comm=None)


@pytest.mark.parametrize("per_node", [1, 2])
def test_few_step_scatter_gather_bitwise_like_the_ring(comm, per_node, monkeypatch):
    """Recursive halving / doubling, Bruck and the hierarchical reduce-scatter / all-gather
    leave every rank with the ring's chunk: integer results bit-for-bit the ring's, float
    results MPI's within rounding (another addition order), and a 1 MiB message limit
    cuts their messages. ``HPCDP_RANKS_PER_NODE`` makes 2+ emulated nodes (where it
    divides the world), so the hierarchical one crosses nodes."""
    N, r = comm.Get_size(), comm.Get_rank()
    if N % per_node:
        pytest.skip(f"{per_node} ranks per node do not divide {N}")
    monkeypatch.setenv("HPCDP_RANKS_PER_NODE", str(per_node))
    sub = comm.Dup()  # a fresh hierarchy, built under this node size
    try:
        rng = np.random.default_rng(7 + r)
        for n in (0, 3, 1001, 300_000):
            off, size = shard_range(n, N, r)
            ints = rng.integers(-1000, 1000, n).astype(np.int64)
            ring = reduce_scatter(ints, np.empty(size, np.int64), comm=sub, algorithm="ring")
            floats = rng.standard_normal(n).astype(np.float32)
            ref = np.empty(size, np.float32)
            sub.Reduce_scatter(floats, ref, [s for _, s in shard_bounds(n, N)], op=MPI.SUM)
            for algo in ("recursive", "hierarchical"):
                got = reduce_scatter(ints, np.empty(size, np.int64), comm=sub, algorithm=algo,
                                     max_message_bytes=1 << 20)
                np.testing.assert_array_equal(got, ring, err_msg=f"{algo} n={n}")
                f = reduce_scatter(floats.copy(), comm=sub, algorithm=algo)
                np.testing.assert_allclose(f, ref, rtol=1e-5, atol=1e-5 * N, err_msg=f"{algo} n={n}")
            whole = all_gather(ints[off:off + size].copy(), np.empty(n, np.int64), comm=sub,
                               algorithm="ring")
            for algo in ("recursive", "bruck", "hierarchical"):
                got = all_gather(ints[off:off + size].copy(), np.empty(n, np.int64), comm=sub,
                                 algorithm=algo, max_message_bytes=1 << 20)
                np.testing.assert_array_equal(got, whole, err_msg=f"{algo} n={n}")
    finally:
        sub.Free()


def test_the_front_runs_the_choosers_plan_cached_per_signature(comm):
    """The front asks the chooser once per call signature: the plan it ran is the one
    hpcdp.comm.plan answers, kept on the context until set_engine (or new settings)."""
    from hpcdp.comm import get_context, iallreduce, plan, set_engine

    sub = comm.Dup()
    N = sub.Get_size()
    try:
        x = np.ones(1000, np.float32)
        for engine in ("python", "compiled"):
            set_engine(sub, engine)
            req = iallreduce(x.copy(), comm=sub, algorithm="ring", max_message_bytes=1 << 20)
            assert np.array_equal(req.wait(), np.full(x.size, N, np.float32))
            p = plan("allreduce", x.nbytes, comm=sub, algorithm="ring")
            ran = [v for k, v in get_context(sub).plans.items()
                   if isinstance(k, tuple) and k[:3] == ("allreduce", "ring", x.nbytes)]
            assert ran and all(r.algorithm == "ring" for r in ran)
            assert {r.engine for r in ran} == {p.engine}
            if N > 1:  # (one rank: nothing to run)
                assert (type(req).__name__ == "CompiledRingRequest") == (p.engine == "compiled")
        set_engine(sub, "python")
        assert not get_context(sub).plans  # the engine changed: every plan is made again
        with pytest.raises(ValueError, match="cannot carry a float16 wire"):
            allreduce(x.copy(), comm=sub, algorithm="native", wire="float16")
    finally:
        sub.Free()
