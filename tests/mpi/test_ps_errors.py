"""Bad input is a clear error on every rank before any training traffic."""

import numpy as np
import pytest
from mpi4py import MPI

from hpcdp.strategies.ps import ParameterServer, PSConfig
from test_ps_support import make_model, make_optimizer, world

SIZE = MPI.COMM_WORLD.Get_size()


def stacked(grads):
    return np.stack(grads)  # (W, n): the wrong shape


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("kwargs, msg", [
    (dict(servers=SIZE + 1), "more servers than ranks"),
    (dict(servers=SIZE, colocated=False), "zero workers"),
    (dict(aggregate=stacked), r"returned shape \(\d+, \d+\)"),
    (dict(aggregate="mean", servers=2, update="worker"), None),
])
def test_setup_errors_before_training(kwargs, msg):
    fn = kwargs.pop("aggregate") if callable(kwargs.get("aggregate")) else None
    ps = ParameterServer(PSConfig(mode="async", staleness=1, **kwargs), aggregate=fn)
    model = make_model()
    if msg is None:  # a good config, for contrast: setup works and closes cleanly
        ps.setup(model.flat, make_optimizer(), world())
        ps.close() if ps.is_worker else (ps.serve(), ps.close())
        return
    with pytest.raises(ValueError, match=msg):
        ps.setup(model.flat, make_optimizer(), world())
    MPI.COMM_WORLD.Barrier()  # every rank raised (none is left waiting for a peer)


@pytest.mark.mpi(min_size=2)
def test_negative_k_rejected():
    with pytest.raises(ValueError, match="negative"):
        ParameterServer(PSConfig(mode="async", staleness=-1))
