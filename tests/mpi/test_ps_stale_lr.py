"""Staleness-aware learning rate on the server: each applied gradient enters the
aggregation scaled by its rule's factor of its recorded staleness (closed form:
worker w's step-t gradient is known everywhere), and grad-ready hooks let a
colocated server apply updates during its worker's backward."""

import time

import numpy as np
import pytest
from mpi4py import MPI

from hpcdp.strategies.ps import ParameterServer, PSConfig
from hpcdp.strategies.ps.staleness import stale_factors
from test_ps_support import world

STEPS, N = 8, 5


def grad_of(w, t):
    return np.arange(N, dtype=np.float64) + 100.0 * w + 1000.0 * t


class Recorder:
    """An aggregation (sum) that keeps a copy of its inputs, per call."""

    def __init__(self):
        self.calls = []

    def __call__(self, grads):
        self.calls.append([g.copy() for g in grads])
        out = grads[0].copy()
        for g in grads[1:]:
            out += g
        return out


@pytest.mark.mpi(min_size=2)
@pytest.mark.timeout(120)
@pytest.mark.parametrize("rule", ["relative", "inverse", "none"])
def test_each_gradient_enters_with_its_staleness_factor(rule):
    from hpcdp.nn.params import FlatParams
    from hpcdp.optim import SGD

    flat = FlatParams.from_arrays([("p", np.zeros(N))], dtype="float64")
    rec = Recorder()
    ps = ParameterServer(PSConfig(mode="async", staleness="none", update="worker", stale_lr=rule), aggregate=rec)
    ps.setup(flat, SGD(None, lr=0.01, dtype="float64"), world())
    try:
        for t in range(STEPS):
            if ps.dp_rank == 1 and t < 3:
                time.sleep(0.05)  # worker 1 is late: worker 0 runs ahead on old weights
            flat.grad[:] = grad_of(ps.dp_rank, t)
            ps.step()
    finally:
        ps.close()
    if ps.server is None:
        return
    W = ps.dp_size
    applied = ps.applied
    assert len(rec.calls) == STEPS + 1  # the setup probe, then one call per update
    damped = 0
    for u, inputs in enumerate(rec.calls[1:]):
        stale = [a.staleness for a in applied[u * W:(u + 1) * W]]
        assert [a.update for a in applied[u * W:(u + 1) * W]] == [u] * W
        factors = stale_factors(stale, rule) or [1.0] * W
        for w in range(W):
            np.testing.assert_allclose(inputs[w], grad_of(w, u) * factors[w], rtol=1e-15)
        damped += any(f != 1.0 for f in factors)
    max_stale = max(a.staleness for a in applied)
    assert max_stale >= 2  # the straggler made worker 0's gradients stale
    assert damped > 0 if rule != "none" else damped == 0


@pytest.mark.mpi(min_size=2)
@pytest.mark.timeout(120)
def test_colocated_server_applies_an_update_during_its_workers_backward():
    """Rank 0 serves; it pushes step 0 first, then worker 1 pushes step 0 and says so
    on another communicator. Rank 0's next backward alone (hooks, no step()) must
    apply update 0."""
    from hpcdp.autograd import Tensor
    from test_ps_support import data, make_model, make_optimizer

    w = world()
    side = w.comm.Dup()
    model = make_model()
    ps = ParameterServer(PSConfig(mode="async", staleness="none"))
    ps.setup(model.flat, make_optimizer(), w)
    x, y = data()
    try:
        def backward():
            model.flat.zero_grad()
            ps.begin_backward(True)
            model.loss(Tensor(x[:4]), Tensor(y[:4])).backward()

        if w.rank == 0:
            backward()
            ps.step()                             # update 0 waits for the others' step 0
            side.Barrier()                        # let them push
            side.Barrier()                        # they have pushed
            assert ps.server.clock.version == 0
            backward()                            # the hooks poll: update 0 is applied
            assert ps.server.clock.version == 1, "no update applied during backward"
            assert ps.hook_polls >= len(model.flat.layout)
        else:
            side.Barrier()
            backward()
            ps.step()
            while len(ps.worker.outbox):          # the push has left this rank
                ps.worker.outbox.poll()
            side.Barrier()
        side.Barrier()
    finally:
        ps.close()
        side.Free()
