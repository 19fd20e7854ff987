"""Debug mode: a mismatched collective raises CollectiveMismatch on every rank,
naming the disagreeing ranks and both fingerprints, within seconds."""

import numpy as np
import pytest

from hpcdp.comm import CollectiveMismatch, all_gather, allreduce, set_debug

pytestmark = pytest.mark.mpi


@pytest.fixture
def debug(comm):
    set_debug(comm, True)
    yield
    set_debug(comm, False)


def test_length_mismatch(comm, debug):
    N, r = comm.Get_size(), comm.Get_rank()
    if N < 2:
        pytest.skip("a mismatch needs two ranks")
    n = 11 if r == N - 1 else 10
    with pytest.raises(CollectiveMismatch) as err:
        allreduce(np.zeros(n), comm=comm, timeout=10)
    msg = str(err.value)
    assert f"ranks [{N - 1}] disagree" in msg or N == 2
    assert "length=10" in msg and "length=11" in msg
    assert N - 1 in err.value.disagreeing
    allreduce(np.zeros(4), comm=comm, timeout=10)  # the communicator is still usable


def test_different_collective(comm, debug):
    N, r = comm.Get_size(), comm.Get_rank()
    if N < 2:
        pytest.skip("a mismatch needs two ranks")
    buf = np.zeros(8)
    with pytest.raises(CollectiveMismatch) as err:
        if r == 0:
            all_gather(buf, comm=comm, timeout=10)
        else:
            allreduce(buf, comm=comm, timeout=10)
    msg = str(err.value)
    assert "collective=all_gather" in msg and "collective=allreduce" in msg
    assert 0 in err.value.disagreeing
