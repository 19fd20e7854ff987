"""Parameter-server push/pull: closed form, several servers, dedicated servers,
non-blocking requests."""

import numpy as np
import pytest

from hpcdp.comm import ips_allreduce, ips_pull, ips_push, ps_allreduce, ps_pull, ps_push
from hpcdp.shard import shard_range

pytestmark = pytest.mark.mpi


def contribution(n, r):
    return (np.arange(n) % 5 + r + 1).astype(np.float64)


def total(n, workers):
    return sum(contribution(n, w) for w in workers) if workers else np.zeros(n)


@pytest.mark.parametrize("n", [0, 1, 7, 1001])
@pytest.mark.parametrize("nservers", [1, 2])
def test_ps_allreduce_closed_form(comm, n, nservers):
    N, r = comm.Get_size(), comm.Get_rank()
    servers = list(range(min(nservers, N)))
    x = contribution(n, r)
    ps_allreduce(x, comm=comm, servers=servers)
    np.testing.assert_array_equal(x, total(n, range(N)))
    y = contribution(n, r)
    ps_allreduce(y, comm=comm, servers=servers[::-1], op="max")
    np.testing.assert_array_equal(y, contribution(n, N - 1))


def test_push_pull_with_dedicated_server(comm):
    N, r = comm.Get_size(), comm.Get_rank()
    if N < 2:
        pytest.skip("a dedicated server needs a second rank")
    workers = list(range(1, N))
    n = 101
    x = contribution(n, r) if r else np.zeros(n)
    shard = ps_push(x, comm=comm, servers=[0], workers=workers, op="mean")
    if r == 0:
        np.testing.assert_allclose(shard, total(n, workers) / len(workers))
        shard *= 2.0  # the server "applies an update"
    else:
        assert shard is None
    ps_pull(x, comm=comm, servers=[0], workers=workers, shard=shard)
    if r:
        np.testing.assert_allclose(x, 2.0 * total(n, workers) / len(workers))


def test_nonblocking_push_pull(comm):
    N, r = comm.Get_size(), comm.Get_rank()
    servers = [N - 1]
    n = 5000
    x = contribution(n, r)
    req = ips_push(x, comm=comm, servers=servers)
    while not req.test():
        pass
    shard = req.result
    req = ips_pull(x, comm=comm, servers=servers, shard=shard)
    assert req.wait() is not None
    np.testing.assert_array_equal(x, total(n, range(N)))
    reqs = [ips_allreduce(contribution(n, r) * k, comm=comm, servers=servers) for k in (1, 2, 3)]
    for k, q in zip((1, 2, 3), reversed(reqs)):  # wait in another order than started
        pass
    results = [q.wait() for q in reversed(reqs)][::-1]
    for k, got in zip((1, 2, 3), results):
        np.testing.assert_array_equal(got, k * total(n, range(N)))


def test_ps_bad_roles(comm):
    N = comm.Get_size()
    with pytest.raises(ValueError, match="outside the communicator"):
        ps_allreduce(np.zeros(4), comm=comm, servers=[N])
    with pytest.raises(ValueError, match="duplicates"):
        ps_allreduce(np.zeros(4), comm=comm, servers=[0, 0])
    off, size = shard_range(4, 1, 0)
    assert size == 4
