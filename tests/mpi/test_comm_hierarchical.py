"""Hierarchical allreduce: equal to MPI's allreduce, ledger per link kind equal to the
formula, for every node layout the world size allows (HPCDP_RANKS_PER_NODE emulates
nodes on one machine: at 4 ranks 2x2, 1x4 and 4x1)."""

import re

import numpy as np
import pytest
from mpi4py import MPI

from hpcdp.comm import Ledger, TopologyError, allreduce, iallreduce
from hpcdp.config_error import ConfigError
from hpcdp.strategies.diloco.groups import ReplicaGroups
from hpcdp.comm.core.settings import RANKS_PER_NODE_ENV
from hpcdp.comm.hierarchical import expected_bytes, hierarchy
from hpcdp.comm.core.context import get_context
from hpcdp.comm.model.volume import ring_allreduce_bytes, ring_messages
from hpcdp.shard import shard_range

pytestmark = pytest.mark.mpi


def _layouts(N):
    return [d for d in range(1, N + 1) if N % d == 0]


@pytest.fixture(params=[1, 2, 3, 4, 6], ids=lambda p: f"{p}pernode")
def node_comm(request, comm, monkeypatch):
    """A fresh duplicate of COMM_WORLD whose nodes are blocks of ``param`` ranks."""
    per = request.param
    if per not in _layouts(comm.Get_size()):
        pytest.skip(f"{per} ranks per node does not divide {comm.Get_size()} ranks")
    monkeypatch.setenv(RANKS_PER_NODE_ENV, str(per))
    c = comm.Dup()
    yield c, per
    c.Free()


def _data(n, rank, dtype):
    # small integers: every summation order gives the same float result
    return ((np.arange(n) * 7 + 3 * rank) % 11 - 5).astype(dtype)


@pytest.mark.parametrize("n", [0, 1, 3, 10, 1001, 65536 + 7])
def test_equals_mpi_allreduce(node_comm, n):
    c, per = node_comm
    N, r = c.Get_size(), c.Get_rank()
    x = _data(n, r, np.float64)
    want = np.empty_like(x)
    c.Allreduce(x, want, op=MPI.SUM)
    out = np.empty_like(x)
    got = allreduce(x, out, comm=c, algorithm="hierarchical", segment_bytes=4096)
    assert got is out
    np.testing.assert_array_equal(out, want)
    np.testing.assert_array_equal(x, _data(n, r, np.float64))  # sendbuf untouched
    y = _data(n, r, np.float32)  # in place, another dtype
    allreduce(y, comm=c, algorithm="hierarchical")
    np.testing.assert_array_equal(y, want.astype(np.float32))
    h = hierarchy(get_context(c))
    assert (h.nodes, h.per_node) == (N // per, per)
    assert (h.node, h.local_rank) == (r // per, r % per)


def test_ops_mean_max_and_integers(node_comm):
    c, _ = node_comm
    N, r = c.Get_size(), c.Get_rank()
    x = np.arange(37, dtype=np.float64) + r
    allreduce(x, comm=c, algorithm="hierarchical", op="mean")
    np.testing.assert_allclose(x, np.arange(37) + (N - 1) / 2, rtol=1e-15)
    m = np.full(5, float(r))
    allreduce(m, comm=c, algorithm="hierarchical", op="max")
    np.testing.assert_array_equal(m, np.full(5, N - 1.0))
    k = np.arange(9, dtype=np.int64) * (r + 1)
    allreduce(k, comm=c, algorithm="hierarchical", op=lambda a, b: a + b)
    np.testing.assert_array_equal(k, np.arange(9) * N * (N + 1) // 2)


@pytest.mark.parametrize("n", [1, 10, 1001, 4096])
def test_ledger_per_link_kind_equals_formula(node_comm, n):
    c, per = node_comm
    N, r = c.Get_size(), c.Get_rank()
    led = Ledger()
    allreduce(np.ones(n, np.float32), comm=c, algorithm="hierarchical", ledger=led,
              segment_bytes=1000)
    t = led.totals()
    if N == 1:  # one rank: nothing to send, recorded like every algorithm's
        assert t == {"allreduce": {"calls": 1, "sent_bytes": 0, "recv_bytes": 0,
                                   "sent_msgs": 0, "recv_msgs": 0}}
        return
    want = expected_bytes(n, N // per, per, r // per, r % per, 4)
    assert (t["allreduce.intra"]["sent_bytes"], t["allreduce.intra"]["recv_bytes"]) == want["intra"]
    assert (t["allreduce.inter"]["sent_bytes"], t["allreduce.inter"]["recv_bytes"]) == want["inter"]
    assert t["allreduce.intra"]["calls"] == t["allreduce.inter"]["calls"] == 1
    L, M = per, N // per  # messages: the pipelined ring's count on each sub-communicator
    chunk = shard_range(n, L, r % per)[1]
    msgs = {"intra": ring_messages(n, L, r % per, 4, 1000), "inter": ring_messages(chunk, M, r // per, 4, 1000)}
    for kind in ("intra", "inter"):
        assert (t[f"allreduce.{kind}"]["sent_msgs"], t[f"allreduce.{kind}"]["recv_msgs"]) == msgs[kind]
    flat = ring_allreduce_bytes(n, N, r, 4)
    if per == 1:  # one rank per node: all of it is the flat ring, between nodes
        assert want["inter"] == flat and want["intra"] == (0, 0)
    if per == N:  # one node: all of it is the flat ring, inside the node
        assert want["intra"] == flat and want["inter"] == (0, 0)
    if n % N == 0 and 1 < per < N:  # even division: the closed forms of the docstring
        S, M = 4 * n, N // per
        assert want["intra"] == (2 * (per - 1) * S // per,) * 2
        assert want["inter"] == (2 * (M - 1) * S // (M * per),) * 2


def test_many_in_flight_finish_in_any_order(node_comm):
    """DDP keeps several bucket allreduces in flight and polls them in any order: the
    phases must still start in the same order on every rank (tickets)."""
    c, _ = node_comm
    N, r = c.Get_size(), c.Get_rank()
    bufs = [np.full(n, float(r + 1)) for n in (5000, 3, 70000, 1, 20000)]
    reqs = [iallreduce(b, comm=c, algorithm="hierarchical", segment_bytes=8192) for b in bufs]
    order = [4, 2, 0, 3, 1] if r % 2 else [0, 1, 2, 3, 4]  # ranks wait in different orders
    for i in order:
        reqs[i].wait()
    for b in bufs:
        np.testing.assert_array_equal(b, np.full(b.size, N * (N + 1) / 2))


SLOW_NETWORK = """
name = "slow-network"
gamma_s_per_byte = 1e-10
call_s = {ring = 0.0}
msg_s = 0.0
ctrl_msg_s = 0.0
flops_per_s = 1e9
optimizer_s_per_param = 0.0
ranks_per_node = 2
nics_per_node = 2
intra = {alpha_s = 1e-6, beta_s_per_byte = 1e-10}
inter = {alpha_s = 1e-3, beta_s_per_byte = 1e-8}
"""


def test_auto_with_a_profile_follows_the_model(comm, monkeypatch, tmp_path):
    """auto + HPCDP_PROFILE: the cost model picks per message size. On a profile with a
    slow network, a 4 MiB allreduce over 2 nodes of 2 ranks goes hierarchical (it sends
    a quarter of the bytes across nodes) and an 8-byte one recursive doubling (one
    inter-node round instead of two)."""
    N = comm.Get_size()
    if N != 4:
        pytest.skip("the expected choices are for 2 nodes x 2 ranks")
    from hpcdp.comm.model.cost import fastest_allreduce, load_profile
    path = tmp_path / "slow.toml"  # every rank writes the same profile
    path.write_text(SLOW_NETWORK)
    monkeypatch.setenv(RANKS_PER_NODE_ENV, "2")
    monkeypatch.setenv("HPCDP_PROFILE", str(path))
    from hpcdp.comm.auto import forget
    from hpcdp.comm.model.volume import recursive_bytes
    forget()  # the lean path's bound is read again: 0 for allreduces with a profile
    c = comm.Dup()
    try:
        for n, want in ((1 << 20, "hierarchical"), (2, "recursive")):
            assert fastest_allreduce(4 * n, load_profile(str(path)), 2, 2) == want
            led = Ledger()
            x = np.ones(n, np.float32)
            allreduce(x, comm=c, ledger=led)
            np.testing.assert_array_equal(x, np.full(n, N, np.float32))
            names = set(led.totals())
            assert names == ({"allreduce.intra", "allreduce.inter"} if want == "hierarchical"
                             else {"allreduce"}), (n, names)
            if want == "recursive":  # not MPI's own (the lean path records n bytes each way)
                t = led.totals()["allreduce"]
                assert (t["sent_bytes"], t["recv_bytes"]) == recursive_bytes(4 * n, N, comm.Get_rank())
    finally:
        c.Free()
        forget()  # later tests read the environment without the profile


def test_bad_ranks_per_node_is_a_clear_error(comm, monkeypatch):
    N = comm.Get_size()
    if N < 2:
        pytest.skip("needs 2 ranks")
    bad = N + 1
    monkeypatch.setenv(RANKS_PER_NODE_ENV, str(bad))
    c = comm.Dup()
    try:
        with pytest.raises(TopologyError, match=f"{RANKS_PER_NODE_ENV}={bad} does not divide") as caught:
            allreduce(np.ones(4), comm=c, algorithm="hierarchical", timeout=20)
        e = caught.value  # a ValueError whose fields let a caller word its own error
        assert isinstance(e, ValueError)
        assert (e.ranks, e.ranks_per_node, e.smallest, e.largest) == (N, bad, 0, 0)
        assert e.reason == f"{RANKS_PER_NODE_ENV}={bad} does not divide the {N} ranks into whole nodes"
        g = comm.Dup()  # DiLoCo's node groups word theirs from the fields
        try:
            with pytest.raises(ConfigError, match=re.escape(
                    f'parallel.diloco.groups = "node" needs the same number of ranks on every node '
                    f'({e.reason}): place ranks evenly')):
                ReplicaGroups(g, "node", 20)
        finally:
            g.Free()
        monkeypatch.setenv(RANKS_PER_NODE_ENV, "two")
        d = comm.Dup()
        with pytest.raises(ValueError, match="whole number"):
            allreduce(np.ones(4), comm=d, algorithm="hierarchical", timeout=20)
        d.Free()
        monkeypatch.delenv(RANKS_PER_NODE_ENV)  # (a bad value is refused wherever it is read)
        allreduce(np.ones(4), comm=c, algorithm="ring", timeout=20)  # still usable
    finally:
        c.Free()


def test_ddp_with_hierarchical_buckets_equals_one_rank(comm, monkeypatch):
    """DDP's bucket allreduces as hierarchical ones (many in flight, started from the
    backward hooks) train exactly like one rank; the step's gradient bytes are the
    formula's, summed over buckets and link kinds."""
    from test_ddp import MLP, SPLIT_ELEMS, assert_close, ddp, reference, train

    from hpcdp.world import World
    N = comm.Get_size()
    per = 2 if N % 2 == 0 else 1
    monkeypatch.setenv(RANKS_PER_NODE_ENV, str(per))
    world = World.from_mpi(comm.Dup())
    try:
        strategy = ddp(bucket_mb=SPLIT_ELEMS * 8 / 2**20, algorithm="hierarchical")
        got, stats, _ = train(MLP, strategy, world)
        assert_close(got, reference(MLP), 1e-12)
        r = world.rank
        want = sum(sum(expected_bytes(b.size, N // per, per, r // per, r % per, 8)[k][0]
                       for k in ("intra", "inter")) for b in strategy.plan.buckets)
        assert all(s["grad_bytes_sent"] == want for s in stats) or N == 1
    finally:
        world.comm.Free()
