"""The ledger equals the PS byte formulas exactly, per rank, for sync and async.

Phi_s = bytes of server s's shard, W workers, T steps. Per step a server receives
and sends (W - 1) * Phi_s if it doubles as a worker (its own shard stays local),
else W * Phi_s; a worker sends and receives Phi_s to/from every server it is not.
With one server Phi_0 = Phi (the whole model); with K servers each carries 1/K.
"""

import pytest
from mpi4py import MPI

from hpcdp.strategies.ps import ParameterServer, PSConfig
from test_ps_support import train, world

SIZE = MPI.COMM_WORLD.Get_size()
T = 4


def expected(ps, numel, itemsize, rank):
    roles = ps.roles
    W = roles.num_workers
    phi = [roles.shard(numel, s)[1] * itemsize for s in range(roles.num_servers)]
    s_idx, w_idx = roles.server_index(rank), roles.worker_index(rank)
    push_sent = push_recv = 0
    if s_idx is not None:
        push_recv = T * (W - (w_idx is not None)) * phi[s_idx]
    if w_idx is not None:
        push_sent = T * sum(p for s, p in enumerate(phi) if s != s_idx)
    # pulls mirror pushes: what a server received it sends back, per worker
    return {"ps_push": (push_sent, push_recv), "ps_pull": (push_recv, push_sent)}


@pytest.mark.mpi(min_size=2)
@pytest.mark.timeout(120)
@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("servers, colocated", [(1, True), (1, False), (2, True), (SIZE, True),
                                                (SIZE - 1, False)])
def test_ledger_equals_formula(mode, servers, colocated):
    w = world()
    ps = ParameterServer(PSConfig(servers=servers, colocated=colocated, mode=mode, staleness=1))
    _, model = train(ps, w, steps=T)
    from test_ps_support import make_model
    numel = make_model().flat.numel
    want = expected(ps, numel, 8, w.rank)
    tot = w.ledger.totals()
    for name, (sent, recv) in want.items():
        got = tot.get(name, {"sent_bytes": 0, "recv_bytes": 0})
        assert (got["sent_bytes"], got["recv_bytes"]) == (sent, recv), (name, w.rank)


@pytest.mark.mpi(min_size=3)
@pytest.mark.timeout(120)
def test_one_server_formula_in_words():
    """The issue's statement, literally: one dedicated server moves W * Phi each way per
    step, each worker Phi each way; K = 2 servers each carry half (to one element)."""
    w = world()
    ps = ParameterServer(PSConfig(servers=1, colocated=False, mode="sync"))
    train(ps, w, steps=1)
    from test_ps_support import make_model
    phi = make_model().flat.numel * 8
    tot = w.ledger.totals()
    W = SIZE - 1
    if w.rank == SIZE - 1:
        assert tot["ps_push"]["recv_bytes"] == W * phi and tot["ps_pull"]["sent_bytes"] == W * phi
    else:
        assert tot["ps_push"]["sent_bytes"] == phi and tot["ps_pull"]["recv_bytes"] == phi
