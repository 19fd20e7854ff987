"""The end of a multi-rank command, bounded like everything before it.

A rank that has finished still has two ways to wait forever: ``MPI_Finalize`` (it
waits for every rank, and mpi4py calls it at interpreter exit, where nothing in
Python can interrupt it) and a rank that never gets there. So the CLI ends a run with

1. a barrier with a deadline (``Ibarrier`` polled): every rank finished the command,
   or this rank raises :class:`~hpcdp.failure.deadline.DeadlineExceeded` naming the
   ranks that did not, and the failure policy ends the job (``MPI_Abort``);
2. ``MPI_Finalize`` called here through ctypes (which releases the GIL; mpi4py's
   ``Finalize`` holds it, so no Python thread could run) under a timer thread that,
   if the call has not returned after ``min(FINALIZE_S, comm.timeout)`` seconds,
   prints why and ends this process with status 1. mpi4py sees MPI finalized and
   does not call it again at exit.

Cost: one barrier per run (microseconds to milliseconds).
"""

from __future__ import annotations

import sys

from .ranks import c_function, exit_unless_done, say

FINALIZE_S = 60.0  # every rank passed the barrier: MPI_Finalize has no reason to take longer
# After a repair (failure.on_rank_loss = "continue"): Open MPI's MPI_Finalize under ULFM
# sometimes never returned on the survivors (1 of 7 measured kills; the run had completed)
REPAIRED_FINALIZE_S = 10.0
_timeout = 300.0  # the run's comm.timeout, set by the training command (expect_peers_within)
_survivors = None  # after a repair (failure.on_rank_loss = "continue"): the ranks left


def expect_peers_within(seconds: float) -> None:
    """The deadline of the final barrier: how long this rank waits for the others to
    finish the command (the run's ``comm.timeout``)."""
    global _timeout
    _timeout = float(seconds)


def finish_with(comm) -> None:
    """After a repair: the final barrier runs on ``comm`` (the survivors), not on
    COMM_WORLD, which holds the lost ranks."""
    global _survivors
    _survivors = comm


def finish() -> None:
    """Every rank finished (or this rank raises, naming the ones that did not); then
    ``MPI_Finalize`` with a watchdog. Nothing to do on one rank or without MPI."""
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is None or not mpi.Is_initialized() or mpi.Is_finalized():
        return
    comm = mpi.COMM_WORLD if _survivors is None else _survivors
    if comm.Get_size() == 1:
        return
    from .deadline import wait
    from .inject import Faults

    rank = comm.Get_rank()
    faults = Faults(rank)
    sys.stdout.flush()
    sys.stderr.flush()
    faults.fire_at_end("stop-at-end")
    wait([comm.Ibarrier()], _timeout, "every rank to finish the run")
    faults.fire_at_end("stop-in-finalize")
    sys.stdout.flush()
    if _survivors is not None:
        limit = min(REPAIRED_FINALIZE_S, _timeout)
        _finalize(mpi, limit, f"hpcdp: note: rank {rank}: MPI_Finalize did not return within {limit:g}s "
                  "after a repair (the MPI library still waits for the lost rank); the run completed "
                  "and its files are written: ending this rank with status 0", status=0)
        return
    limit = min(FINALIZE_S, _timeout)
    _finalize(mpi, limit, f"hpcdp: error: rank {rank}: MPI_Finalize did not return within {limit:g}s "
              "although every rank had finished the run (the MPI library or its launcher is "
              "stuck); ending the job through MPI_Abort (a non-zero status). The run itself "
              "completed: its files are written.")


def _finalize(mpi, limit: float, message: str, status: int = 1) -> None:
    """``MPI_Finalize`` through ctypes, which releases the GIL during the call (mpi4py's
    ``Finalize`` holds it), so a timer thread can end the rank if the call hangs."""
    c_finalize = c_function("MPI_Finalize")
    # status 1: the job is stuck, and the launcher may not count this exit as a failure
    with exit_unless_done(limit, message, status, end_job=status != 0):
        if c_finalize is None:
            mpi.Finalize()  # holds the GIL: a hang here is bounded by the launcher only
        elif c_finalize() != 0:
            say("hpcdp: warning: MPI_Finalize returned an error after the run finished")


__all__ = ["FINALIZE_S", "expect_peers_within", "finish", "finish_with"]
