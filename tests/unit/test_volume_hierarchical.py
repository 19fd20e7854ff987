"""hpcdp.comm.model.volume: message counts of the pipelined ring, and the hierarchical
allreduce's bytes per link kind (closed forms, conservation)."""

import pytest

from hpcdp.comm.model import volume as V
from hpcdp.shard import shard_range


@pytest.mark.parametrize("N", [2, 3, 4, 7])
def test_ring_messages_closed_form(N):
    n, item = 1000 * N, 4  # chunks of 1000 elements = 4000 bytes
    for r in range(N):
        assert V.ring_messages(n, N, r, item, 1 << 20) == (2 * (N - 1),) * 2  # one segment each
        assert V.ring_messages(n, N, r, item, 1000) == (2 * (N - 1) * 4,) * 2  # 4 segments
        assert V.ring_messages(n, N, r, item, 1000, ("rs",)) == ((N - 1) * 4,) * 2
    assert V.ring_messages(0, N, 0, item, 64) == (0, 0)
    assert V.ring_messages(10, 1, 0, item, 64) == (0, 0)


@pytest.mark.parametrize("n", [1, 5, 13, 1001])
@pytest.mark.parametrize("N", [2, 3, 5])
def test_ring_messages_uneven_conserved(n, N):
    for phases in (("rs",), ("ag",), ("rs", "ag")):
        got = [V.ring_messages(n, N, r, 8, 24, phases) for r in range(N)]
        assert sum(s for s, _ in got) == sum(r for _, r in got)
        segs = sum(-(-shard_range(n, N, c)[1] // 3) for c in range(N))
        assert sum(s for s, _ in got) == (N - 1) * segs * len(phases)


@pytest.mark.parametrize("nodes,per", [(1, 4), (2, 2), (4, 1), (3, 2), (2, 3)])
@pytest.mark.parametrize("n", [1, 7, 96, 1001])
def test_hierarchical_bytes(nodes, per, n):
    N, item = nodes * per, 4
    tot = {"intra": [0, 0], "inter": [0, 0]}
    for node in range(nodes):
        for local in range(per):
            b = V.hierarchical_bytes(n, nodes, per, node, local, item)
            for kind in tot:
                tot[kind][0] += b[kind][0]
                tot[kind][1] += b[kind][1]
    # every byte sent is received, per kind; intra: each node runs a ring allreduce of n,
    # inter: each local rank's chunk is ring-allreduced over the nodes
    assert tot["intra"][0] == tot["intra"][1] == nodes * 2 * (per - 1) * n * item
    assert tot["inter"][0] == tot["inter"][1] == 2 * (nodes - 1) * n * item
    if per == 1:
        assert all(V.hierarchical_bytes(n, nodes, 1, m, 0, item)["inter"] ==
                   V.ring_allreduce_bytes(n, N, m, item) for m in range(nodes))


def test_collective_bytes_sends_hierarchical_to_its_own_formula():
    from hpcdp.comm.select import collective_bytes

    with pytest.raises(ValueError, match="hierarchical_bytes"):
        collective_bytes("allreduce", "hierarchical", 64, 4, 0, 4)
    assert collective_bytes("allreduce", "ring", 64, 4, 0, 4) == (384, 384)  # 2(N-1)/N * 256 B
