"""hpcdp.comm's failure hooks on real ranks: an MPI error inside a collective is an
MPIError carrying MPI's error class (never an abort), ``abort(comm)`` ends the
collective a rank waits in at once on every path that waits (MPI's own call from
Python and from compiled code, the Python ring, the compiled ring, a request the
progress thread holds), ``forget(comm)`` drops everything so the next collective sets
up afresh, and ``topology(comm)`` is the one node layout. Also the front's broadcast
and barrier, and the ``[comm]`` algorithm key really steering "auto"."""

import threading
import time

import numpy as np
import pytest
from mpi4py import MPI

from hpcdp.comm import (CommAborted, Ledger, MPIError, abort, all_gather, allreduce, barrier,
                        configure, forget, get_context, iallreduce, plan, set_engine, settings,
                        topology)
from hpcdp.comm.model import volume as V
from hpcdp.config import CommConfig

pytestmark = pytest.mark.mpi


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("path", ["auto", "auto-mpi4py", "ring-python", "ring-compiled"])
def test_an_mpi_error_is_an_mpierror_and_fails_the_communicator(comm, path):
    from hpcdp.comm import set_lean_path

    sub = comm.Dup()
    kw = {"algorithm": "auto" if path.startswith("auto") else "ring"}
    if path == "auto-mpi4py":
        set_lean_path(sub, "mpi4py")
    if path.startswith("ring"):
        set_engine(sub, path.split("-")[1])
    x = np.ones(8)
    allreduce(x, comm=sub, **kw)  # warm: the signature's ready call / plan exists
    allreduce(x, comm=sub, **kw)
    ctx = get_context(sub)
    ctx.data.Free()  # hpcdp's duplicate gone behind its back: every MPI call on it errs
    with pytest.raises(MPIError) as e:
        allreduce(x, comm=sub, **kw)
    assert e.value.error_class == MPI.ERR_COMM, str(e.value)
    assert e.value.error_name == "MPI_ERR_COMM" and e.value.collective == "allreduce"
    assert not e.value.proc_failed and not e.value.revoked
    with pytest.raises(MPIError) as again:  # the communicator stays failed, at once
        allreduce(x, comm=sub, algorithm="native")
    assert again.value is e.value
    forget(sub)  # a fresh start on the same communicator (collective: every rank forgets)
    assert get_context(sub) is not ctx
    assert np.array_equal(allreduce(np.ones(3), comm=sub, **kw), np.full(3, sub.Get_size()))
    forget(sub)
    sub.Free()


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("path", ["lean-compiled", "lean-mpi4py", "ring-python", "ring-compiled",
                                  "request-compiled"])
def test_abort_ends_the_collective_this_rank_waits_in(comm, path):
    """Rank 0 waits in a collective the others never call; another thread aborts the
    communicator after 0.3 s: the wait ends with CommAborted within a second (the
    deadline is 60 s), and later calls fail at once."""
    from hpcdp.comm import set_lean_path

    sub = comm.Dup()
    kind, how = path.split("-")
    if kind == "lean":
        set_lean_path(sub, how)
    else:
        set_engine(sub, how)
    algorithm = "auto" if kind == "lean" else "ring"
    x = np.ones(4)
    for _ in range(2):  # warm: the same signature's fast path and compiled code exist
        allreduce(x, comm=sub, algorithm=algorithm)
    if sub.Get_rank() == 0:
        timer = threading.Timer(0.3, abort, (sub, "the test gave up"))
        start = time.monotonic()
        timer.start()
        with pytest.raises(CommAborted, match="the test gave up"):
            if kind == "request":
                iallreduce(x, comm=sub, algorithm=algorithm, timeout=60).wait()
            else:
                allreduce(x, comm=sub, algorithm=algorithm, timeout=60)
        waited = time.monotonic() - start
        assert 0.25 < waited < 5, waited
        timer.join()
        with pytest.raises(CommAborted):
            allreduce(x, comm=sub)
    else:
        abort(sub, "rank 0 is on its own")  # local: nothing sent
        with pytest.raises(CommAborted):
            allreduce(x, comm=sub)
    comm.Barrier()
    forget(sub)
    sub.Free()


def test_forget_drops_the_context_and_what_it_derived(comm):
    sub = comm.Dup()
    configure(CommConfig(ranks_per_node=1))
    t = topology(sub)
    ctx = get_context(sub)
    assert ctx.topology is t and len(ctx.derived) == 2  # the node and cross communicators
    forget(sub)
    assert t.local == MPI.COMM_NULL and t.cross == MPI.COMM_NULL  # freed
    fresh = get_context(sub)
    assert fresh is not ctx and fresh.topology is None and fresh.seq == 0
    forget(sub)
    sub.Free()


@pytest.mark.parametrize("per", [1, 2])
def test_topology_is_the_node_layout(comm, per):
    N, rank = comm.Get_size(), comm.Get_rank()
    if N % per:
        pytest.skip(f"{per} ranks per node do not divide {N}")
    sub = comm.Dup()
    configure(CommConfig(ranks_per_node=per))
    t = topology(sub)
    assert (t.nodes, t.per_node) == (N // per, per)
    assert (t.node, t.local_rank) == divmod(rank, per)
    assert t.table == tuple(tuple(m * per + l for l in range(per)) for m in range(N // per))
    assert t.rank_of(t.node, t.local_rank) == rank
    assert (t.local.Get_size(), t.cross.Get_size()) == (per, N // per)
    assert t.source == f"[comm] ranks_per_node = {per}"
    assert topology(sub) is t  # built once
    # the sub-communicators carry hpcdp collectives (errors returned, never fatal)
    assert allreduce(np.ones(2), comm=t.local)[0] == per
    assert t.cross.Get_errhandler() == MPI.ERRORS_RETURN
    forget(sub)
    sub.Free()


def test_the_comm_algorithm_key_steers_auto(comm):
    """[comm] allreduce = "recursive": an "auto" allreduce runs recursive doubling (its
    ledger figures, not MPI's own one message each way); an explicit name still wins."""
    N, rank = comm.Get_size(), comm.Get_rank()
    configure(CommConfig(allreduce="recursive"))
    assert settings().algorithm("allreduce") == "recursive"
    assert settings().algorithm("all_gather") == "auto"
    sub = comm.Dup()
    assert plan("allreduce", 64, comm=sub).algorithm == "recursive"
    ledger = Ledger()
    x = np.arange(16, dtype=np.float64) + rank
    allreduce(x, comm=sub, ledger=ledger)
    assert np.array_equal(x, N * np.arange(16) + N * (N - 1) / 2)
    e = ledger.totals().get("allreduce", {"sent_bytes": 0, "recv_bytes": 0})
    assert (e["sent_bytes"], e["recv_bytes"]) == V.recursive_allreduce_bytes(16, N, rank, 8)
    ledger.reset()
    allreduce(x, comm=sub, ledger=ledger, algorithm="native")
    if N > 1:
        assert ledger.totals()["allreduce"]["sent_msgs"] == 1
    forget(sub)
    sub.Free()


def test_barrier_and_broadcast_go_through_the_front(comm):
    N, rank = comm.Get_size(), comm.Get_rank()
    sub = comm.Dup()
    barrier(comm=sub)
    from hpcdp.comm import broadcast
    buf = np.full(3, rank, dtype=np.int64)
    broadcast(buf, comm=sub, root=N - 1)
    assert np.array_equal(buf, np.full(3, N - 1))
    assert get_context(sub).seq == 2  # each took a sequence number (same on every rank)
    with pytest.raises(ValueError, match=f"root {N} is not a rank"):
        broadcast(buf, comm=sub, root=N)
    full = np.zeros(N, dtype=np.int64)
    full[rank] = rank
    all_gather(full, comm=sub)
    assert list(full) == list(range(N))
    forget(sub)
    sub.Free()
