"""Agreement on real ranks: an error on one rank becomes the same JobError on every
rank, naming that rank; skewed fingerprints name the ranks; the checkpoints' wording of
the same helper raises the lowest failing rank's message; waits with a deadline name
the rank that never sent."""

from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI

from hpcdp.config_error import ConfigError
from hpcdp.failure.agreement import JobError, agree, on_root, stage
from hpcdp.failure.deadline import DeadlineExceeded, wait
from hpcdp.io.errors import AGREEMENT, CheckpointError

COMM = MPI.COMM_WORLD
RANK, SIZE = COMM.Get_rank(), COMM.Get_size()


@pytest.mark.mpi(min_size=2)
def test_an_error_on_the_last_rank_stops_every_rank_with_its_cause():
    last = SIZE - 1
    with pytest.raises(JobError) as e:
        with stage(COMM, "data", timeout=60):
            if RANK == last:
                raise ConfigError("data.path: file not found: 'x.npz'")
    assert str(e.value) == f"rank {last}: data.path: file not found: 'x.npz'"
    assert e.value.failed == {last: "data.path: file not found: 'x.npz'"}
    assert isinstance(e.value.__cause__, ConfigError) == (RANK == last)


@pytest.mark.mpi(min_size=2)
def test_the_same_error_everywhere_reads_as_one_and_different_ones_are_grouped():
    with pytest.raises(JobError, match=r"^train\.global_batch: too small$"):
        agree(COMM, ValueError("train.global_batch: too small"), what="x", timeout=60)
    err = MemoryError() if RANK == 0 else (ValueError("bad") if RANK == 1 else None)
    with pytest.raises(JobError) as e:
        agree(COMM, err, what="x", timeout=60)
    assert str(e.value) == "rank 0: out of memory (MemoryError); rank 1: bad"


@pytest.mark.mpi(min_size=2)
def test_skewed_fingerprints_are_named_and_equal_ones_pass():
    assert agree(COMM, None, what="config", timeout=60, fingerprint="steps = 30") == []
    with pytest.raises(JobError, match=r"config differs across ranks: .*rank 1: steps = 40"):
        agree(COMM, None, what="config", timeout=60, fingerprint="steps = 40" if RANK == 1 else "steps = 30")


@pytest.mark.mpi(min_size=2)
def test_on_root_shares_the_result_or_the_roots_error():
    assert on_root(COMM, lambda: "runs/x-1", what="run dir", timeout=60) == "runs/x-1"

    def fails():
        raise OSError("run.out_dir: read-only file system")
    with pytest.raises(JobError, match=r"^rank 0: run\.out_dir: read-only file system$"):
        on_root(COMM, fails, what="run dir", timeout=60)


@pytest.mark.mpi(min_size=2)
def test_a_wait_past_its_deadline_names_the_rank_that_never_sent():
    buf = np.zeros(1)
    if RANK == 0:
        req = COMM.Irecv(buf, source=1, tag=4242)  # rank 1 sends only after rank 0 gave up
        with pytest.raises(DeadlineExceeded, match=r"rank 0 waited .*for the test message: still waiting "
                                                   r"for rank 1 ") as e:
            wait([req], 0.5, "the test message", sources=[1])
        assert e.value.missing == [1]
        COMM.Barrier()
        req.Wait()  # now it comes
    else:
        COMM.Barrier()
        if RANK == 1:
            COMM.Send(np.ones(1), dest=0, tag=4242)
    COMM.Barrier()


@pytest.mark.mpi(min_size=3)
def test_a_wait_past_its_deadline_names_every_rank_still_owed():
    """The metrics flush's wait (rank 0 receives from every worker): the last rank's
    message came in time, every other worker's is named, not only the first."""
    peers = list(range(1, SIZE))
    bufs = np.zeros(SIZE)
    late = peers[:-1]
    if RANK == 0:
        reqs = [COMM.Irecv(bufs[p:p + 1], source=p, tag=4243) for p in peers]
        reqs[-1].Wait()
        with pytest.raises(DeadlineExceeded) as e:
            wait(reqs, 0.5, "the rows", sources=peers)
        assert e.value.missing == late
        want = "rank 1" if len(late) == 1 else f"ranks 1-{late[-1]}"
        assert f"for the rows: still waiting for {want} " in str(e.value)
        COMM.Barrier()
        MPI.Request.Waitall(reqs)
    else:
        if RANK == SIZE - 1:
            COMM.Send(np.ones(1), dest=0, tag=4243)
        COMM.Barrier()
        if RANK != SIZE - 1:
            COMM.Send(np.ones(1), dest=0, tag=4243)
    COMM.Barrier()


@pytest.mark.mpi(min_size=2)
def test_broadcast_with_deadline_copies_the_root():
    from hpcdp.comm import Ledger, broadcast

    buf = np.full(5, float(RANK))
    ledger = Ledger()
    assert broadcast(buf, comm=COMM, root=1, timeout=60, ledger=ledger) is buf
    assert np.array_equal(buf, np.ones(5))
    e = ledger.totals()["broadcast"]
    assert (e["sent_bytes"], e["recv_bytes"]) == ((40, 0) if RANK == 1 else (0, 40))


@pytest.mark.mpi(min_size=2)
def test_the_checkpoint_wording_raises_the_lowest_failing_ranks_message_everywhere():
    """hpcdp.io's agreement is the same helper (hpcdp.failure.agreement) with its own
    wording: a CheckpointError carrying the lowest failing rank's message, on the
    communicator given, every rank's texts and rows gathered through hpcdp.comm."""
    with pytest.raises(CheckpointError) as e:
        AGREEMENT.all_ok(COMM, lambda: (_ for _ in ()).throw(OSError(f"rank-{RANK}.h5: gone"))
                         if RANK >= 1 else None, timeout=60)
    assert str(e.value) == "rank-1.h5: gone (reported by rank 1)"
    assert e.value.failed == {r: f"rank-{r}.h5: gone" for r in range(1, SIZE)}
    assert isinstance(e.value.__cause__, OSError) == (RANK >= 1)
    assert AGREEMENT.all_ok(COMM, lambda: RANK * 2, timeout=60) == RANK * 2
    # on_root: the root's value shared, or kept on the root only (share=False)
    assert AGREEMENT.on_root(COMM, lambda: "step-00000004", timeout=60) == "step-00000004"
    kept = AGREEMENT.on_root(COMM, lambda: 7, timeout=60, share=False)
    assert kept == (7 if RANK == 0 else None)
    with pytest.raises(CheckpointError, match=r"^RuntimeError: no marker \(reported by rank 0\)$"):
        AGREEMENT.on_root(COMM, lambda: (_ for _ in ()).throw(RuntimeError("no marker")), timeout=60)
