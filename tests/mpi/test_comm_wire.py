"""The 16-bit wire (hpcdp.comm.engines.wire) against a NumPy reference, bit for bit.

Every N from 1 to the world size runs on a sub-communicator of the first N ranks
(N = 5: ``mpiexec -n 5``). The reference follows the ring's order for chunk c: the
sum starts at rank c+1 and travels c+2, ..., c; every hop widens the 16-bit partial
sum exactly, adds the next rank's float32 contribution in float32 and narrows what it
forwards; allreduce and all-gather round the owner's result once more (every rank
gets the same bits), reduce-scatter returns the owner's float32 sum.
"""

import numpy as np
import pytest

from hpcdp.comm import Ledger, all_gather, allreduce, reduce_scatter
from hpcdp.comm.ring import expected_bytes
from hpcdp.comm.engines.wire import wire_format
from hpcdp.shard import shard_bounds, shard_range

pytestmark = pytest.mark.mpi

WIRES = ["float16", "bfloat16"]
LENGTHS = [1, 2, 7, 13, 1001]


def _rne16(x, wire):
    """An independent narrow -> widen in NumPy (uint32 arithmetic for bfloat16)."""
    x = np.asarray(x, np.float32)
    if wire == "float16":
        with np.errstate(over="ignore"):
            return x.astype(np.float16).astype(np.float32)
    b = x.view(np.uint32).astype(np.uint64)
    top = ((b + 0x7FFF + ((b >> 16) & 1)) >> 16).astype(np.uint32)
    top = np.where(np.isnan(x), (b >> 16).astype(np.uint32) | 0x40, top)
    return (top << 16).astype(np.uint32).view(np.float32)


def contributions(n, N, seed=7):
    rng = np.random.default_rng(seed + 1000 * N + n)
    scale = np.exp(rng.uniform(-3, 3, size=(N, n)))
    return (rng.standard_normal((N, n)) * scale).astype(np.float32)


def reference(xs, wire, *, final_round):
    N, n = xs.shape
    out = np.empty(n, np.float32)
    for c, (off, size) in enumerate(shard_bounds(n, N)):
        sl = slice(off, off + size)
        acc = xs[(c + 1) % N, sl].copy()
        for j in range(2, N + 1):
            with np.errstate(over="ignore"):  # the special-values test sums to inf
                acc = (_rne16(acc, wire) + xs[(c + j) % N, sl]).astype(np.float32)
        out[sl] = _rne16(acc, wire) if (final_round and N > 1) else acc
    return out


@pytest.fixture
def subcomms(comm):
    """{N: the communicator of ranks 0..N-1} (None on the ranks outside)."""
    out = {}
    for N in range(1, comm.Get_size() + 1):
        sub = comm.Split(0 if comm.Get_rank() < N else 1, comm.Get_rank())
        out[N] = sub if comm.Get_rank() < N else None
        if out[N] is None:
            sub.Free()
    yield out
    for sub in out.values():
        if sub is not None:
            sub.Free()


def _each_n(subcomms):
    return [(N, c) for N, c in subcomms.items() if c is not None]


@pytest.mark.parametrize("wire", WIRES)
@pytest.mark.parametrize("segment_bytes", [6, 1 << 20])
def test_ring_wire_equals_reference_bit_for_bit(subcomms, wire, segment_bytes):
    for N, c in _each_n(subcomms):
        r = c.Get_rank()
        for n in LENGTHS if segment_bytes > 6 else LENGTHS[:-1] + [101]:
            xs = contributions(n, N)
            x = xs[r].copy()
            ar = allreduce(x, comm=c, algorithm="ring", wire=wire, segment_bytes=segment_bytes)
            ref = reference(xs, wire, final_round=True)
            assert ar.dtype == np.float32
            assert np.array_equal(ar.view(np.uint32), ref.view(np.uint32)), (N, n, wire)
            off, size = shard_range(n, N, r)
            rs = reduce_scatter(xs[r], np.empty(size, np.float32), comm=c, algorithm="ring",
                                wire=wire, segment_bytes=segment_bytes)
            rs_ref = reference(xs, wire, final_round=False)[off:off + size]
            assert np.array_equal(rs.view(np.uint32), rs_ref.view(np.uint32)), (N, n, wire)
            inplace = xs[r].copy()
            got = reduce_scatter(inplace, comm=c, algorithm="auto", wire=wire, segment_bytes=segment_bytes)
            assert np.array_equal(got.view(np.uint32), rs_ref.view(np.uint32))
            full = all_gather(xs[r, off:off + size].copy(), np.empty(n, np.float32), comm=c,
                              wire=wire, segment_bytes=segment_bytes)
            ag_ref = np.concatenate([_rne16(xs[q, o:o + s], wire) if N > 1 else xs[q, o:o + s]
                                     for q, (o, s) in enumerate(shard_bounds(n, N))])
            assert np.array_equal(full.view(np.uint32), ag_ref.view(np.uint32)), (N, n, wire)


@pytest.mark.parametrize("wire", WIRES)
def test_wire_mean_and_special_values(comm, wire):
    N, r = comm.Get_size(), comm.Get_rank()
    base = np.array([1.0, np.inf, 6.0e37, -0.0, 1 + 2 ** -9, 0.1], np.float32)
    got = allreduce(base * (r + 1), comm=comm, op="mean", wire=wire)
    if N > 1:
        xs = np.stack([base * (q + 1) for q in range(N)])
        # the reference's sum, divided in float32 before the last rounding
        acc = reference(xs, wire, final_round=False)  # one chunk per element at N <= 6
        assert np.array_equal(got, _rne16(acc / np.float32(N), wire), equal_nan=True)
    assert got[1] == np.inf


def test_wire_ledger_is_half_the_bytes(comm):
    N, r = comm.Get_size(), comm.Get_rank()
    for n in (0, 5, 1009, 24000):
        off, size = shard_range(n, N, r)
        for wire, itemsize in (("float32", 4), ("bfloat16", 2), ("float16", 2)):
            led = Ledger()
            allreduce(np.ones(n, np.float32), comm=comm, algorithm="ring", ledger=led, wire=wire,
                      segment_bytes=1000)
            reduce_scatter(np.ones(n, np.float32), comm=comm, ledger=led, algorithm="ring", wire=wire)
            all_gather(np.ones(size, np.float32), np.empty(n, np.float32), comm=comm, ledger=led,
                       algorithm="ring", wire=wire)
            t = led.totals()
            for name, phases in (("allreduce", ("rs", "ag")), ("reduce_scatter", ("rs",)),
                                 ("all_gather", ("ag",))):
                got = (t[name]["sent_bytes"], t[name]["recv_bytes"])
                assert got == expected_bytes(n, N, r, itemsize, phases), (wire, name, n)
                if itemsize == 2:
                    assert 2 * got[0] == expected_bytes(n, N, r, 4, phases)[0]


def test_wire_on_the_compiled_engine_runs_the_python_ring(comm):
    from hpcdp.comm import set_engine

    c = comm.Dup()
    try:
        set_engine(c, "compiled")
        N, r = c.Get_size(), c.Get_rank()
        xs = contributions(1001, N)
        got = allreduce(xs[r].copy(), comm=c, wire="bfloat16")
        assert np.array_equal(got, reference(xs, "bfloat16", final_round=True))
    finally:
        c.Free()


def test_wire_errors(comm):
    x = np.ones(8, np.float32)
    with pytest.raises(ValueError, match="cannot carry a bfloat16 wire"):
        allreduce(x, comm=comm, algorithm="native", wire="bfloat16")
    with pytest.raises(ValueError, match="cannot carry a float16 wire"):
        allreduce(x, comm=comm, algorithm="recursive", wire="float16")
    with pytest.raises(ValueError, match="cannot carry"):
        reduce_scatter(x, comm=comm, algorithm="native", wire="float16")
    with pytest.raises(TypeError, match="carries float32 buffers"):
        allreduce(np.ones(8), comm=comm, wire="bfloat16")
    with pytest.raises(ValueError, match="wire must be one of"):
        allreduce(x, comm=comm, wire="int8")
    assert wire_format("float32", np.float64) is None
