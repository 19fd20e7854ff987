"""hpcdp.comm.model.volume: the byte formulas, checked against closed forms and each other."""

import pytest

from hpcdp.comm.model import volume as V


@pytest.mark.parametrize("N", [1, 2, 3, 4, 5, 8])
def test_ring_divisible_closed_form(N):
    n, item = 24 * N, 4
    S = n * item
    for r in range(N):
        assert V.ring_allreduce_bytes(n, N, r, item) == (2 * (N - 1) * S // N,) * 2
        assert V.reduce_scatter_bytes(n, N, r, item) == ((N - 1) * S // N,) * 2
        assert V.all_gather_bytes(n, N, r, item) == ((N - 1) * S // N,) * 2


@pytest.mark.parametrize("n", [0, 1, 2, 7, 13, 1001])
@pytest.mark.parametrize("N", [2, 3, 4, 7])
def test_ring_uneven_conserves_bytes(n, N):
    """Every byte sent is received by someone: totals match per phase."""
    for phases in (("rs",), ("ag",), ("rs", "ag")):
        sent = sum(V.ring_bytes(n, N, r, 8, phases)[0] for r in range(N))
        recv = sum(V.ring_bytes(n, N, r, 8, phases)[1] for r in range(N))
        assert sent == recv == 8 * (N - 1) * n * len(phases)


@pytest.mark.parametrize("N", [1, 2, 3, 4, 5, 6, 7, 8])
def test_recursive_conserves_bytes(N):
    sent = sum(V.recursive_bytes(100, N, r)[0] for r in range(N))
    recv = sum(V.recursive_bytes(100, N, r)[1] for r in range(N))
    assert sent == recv


def test_ps_push_pull_one_server():
    n, W = 10, 4
    # server 0 is also a worker: receives 3 workers' whole buffers
    assert V.ps_push_bytes(n, 0, [0], range(W), 4) == (0, 3 * n * 4)
    assert V.ps_push_bytes(n, 2, [0], range(W), 4) == (n * 4, 0)
    assert V.ps_pull_bytes(n, 0, [0], range(W), 4) == (3 * n * 4, 0)
    # two servers: each carries its shard (5 elements) from the others
    assert V.ps_push_bytes(n, 1, [0, 1], range(W), 4) == (5 * 4, 3 * 5 * 4)


@pytest.mark.parametrize("N", [1, 2, 3, 4])
def test_zero_stage_volumes(N):
    units = [17, 64, 5]
    for r in range(N):
        ddp = [sum(x) for x in zip(*(V.ring_allreduce_bytes(u, N, r, 4) for u in units))]
        assert list(V.zero_step_bytes(1, units, N, r, 4)) == ddp
        assert list(V.zero_step_bytes(2, units, N, r, 4)) == ddp
        s3 = V.zero_step_bytes(3, units, N, r, 4)
        ag = [sum(x) for x in zip(*(V.all_gather_bytes(u, N, r, 4) for u in units))]
        assert list(s3) == [d + a for d, a in zip(ddp, ag)]
    with pytest.raises(ValueError):
        V.zero_step_bytes(4, units, 2, 0, 4)


def test_few_step_formulas_conserve_bytes_and_match_the_ring_at_powers_of_two():
    """Every byte one rank sends another receives (sums over ranks agree) for recursive
    halving / doubling, Bruck and the hierarchical reduce-scatter / all-gather; at N = 2^k
    with N | n each rank moves the ring's (N-1)/N S each way."""
    from hpcdp.comm.model import volume as V

    for N in range(1, 10):
        for n in (0, 1, N - 1, N + 1, 97, 4096):
            for f in (V.halving_reduce_scatter_bytes, V.doubling_all_gather_bytes,
                      V.bruck_all_gather_bytes):
                counts = [f(n, N, r, 4) for r in range(N)]
                assert sum(s for s, _ in counts) == sum(r for _, r in counts), (f.__name__, N, n)
                if N & (N - 1) == 0 and n % N == 0:
                    assert set(counts) <= {((N - 1) * 4 * n // N,) * 2}, (f.__name__, N, n)
    for M, L in ((2, 2), (3, 2), (2, 3), (4, 1), (1, 4)):
        for n in (0, 5, 1001):
            for coll in ("reduce_scatter", "all_gather"):
                per = [V.hier_shard_bytes(coll, n, M, L, r // L, r % L, 8) for r in range(M * L)]
                for kind in ("intra", "inter"):
                    assert sum(p[kind][0] for p in per) == sum(p[kind][1] for p in per)
