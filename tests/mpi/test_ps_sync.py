"""Synchronous PS equals one-rank training (and DDP) with the same global batch."""

import numpy as np
import pytest
from mpi4py import MPI

from hpcdp.strategies.ps import ParameterServer, PSConfig
from test_ps_support import reference, same_on_all, train, world

SIZE = MPI.COMM_WORLD.Get_size()

LAYOUTS = [  # (servers, colocated, update)
    (1, True, "server"), (1, False, "server"), (1, True, "worker"),
    (2, True, "server"), (2, False, "worker"), (SIZE, True, "server"), (SIZE - 1, False, "server"),
]


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("servers, colocated, update", LAYOUTS)
@pytest.mark.parametrize("optim", ["sgd", "adamw"])
def test_sync_ps_equals_one_rank(servers, colocated, update, optim):
    if servers > SIZE or servers < 1 or (not colocated and servers >= SIZE):
        pytest.skip(f"layout needs more ranks than {SIZE}")
    w = world()
    ps = ParameterServer(PSConfig(servers=servers, colocated=colocated, mode="sync", update=update))
    got, _ = train(ps, w, optim=optim)
    workers = list(ps.roles.workers)
    assert ps.dp_size == len(workers)
    if got is not None:
        np.testing.assert_allclose(got, reference(optim=optim), rtol=1e-12, atol=1e-14)
    assert same_on_all(w.comm, got, workers)  # replicas identical, bit for bit


@pytest.mark.mpi(min_size=2)
def test_sync_ps_equals_ddp():
    ddp_mod = pytest.importorskip("hpcdp.strategies.ddp")
    w = world()
    ps_data, _ = train(ParameterServer(PSConfig(servers=1, colocated=True)), w)
    ddp_data, _ = train(ddp_mod.DDP(), world())
    np.testing.assert_allclose(ps_data, ddp_data, rtol=1e-12, atol=1e-14)
