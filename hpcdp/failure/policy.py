"""The job's failure policy, applied by ``hpcdp train``: how a failure on any rank ends
the job on every rank, within seconds, with one line saying which rank failed and why.

- Agreed failures (:class:`~hpcdp.failure.agreement.JobError`, before training: config,
  data, memory, strategy setup, run directory): every rank raised the same error,
  so every rank exits with status 2 together; rank 0 prints the one line. A failing
  rank whose cause was a bug (not bad input) prints its own traceback once.
- Everything else (mid-training: an exception on one rank, a timeout waiting for a
  stuck or dead peer, SIGINT / SIGTERM / SIGUSR1, a non-finite loss): the ranks
  cannot agree (a peer may be dead or stuck), so the rank that fails prints its
  cause (and, for a bug, its traceback) once and calls ``MPI_Abort`` on
  ``COMM_WORLD``: the launcher (mpiexec, srun) then ends every rank within seconds
  and the job's exit status is non-zero (1; 128 + signal number for a signal).
  Under ULFM (``failure.on_rank_loss = "continue"``) MPI_Abort ends only the calling
  rank: when the survivors of a lost rank cannot go on, they all hold the same error
  and end together instead (one line, from the lowest of them).
  ``sys.exit`` from inside the run counts as a failure too: one rank leaving early
  would leave the others waiting.
- One rank (no launcher): the same lines, exit status 2 for bad input, 1 otherwise,
  130 for Ctrl-C.

``HPCDP_TRACEBACK=1`` prints the traceback of every failure.
"""

from __future__ import annotations

import os
import sys
import time
import traceback

from .agreement import USER_ERRORS, JobError, cause
from .ranks import abort_job, end_together, say
from .shutdown import finish
from .signals import Interrupted, handling_signals

USAGE_ERROR = 2
FAILED = 1
REPORTER_GRACE_S = 5.0  # report_failure: how long a non-reporting rank waits for the abort


def note_step(e: BaseException, step: int) -> None:
    """Record on the exception the training step at which it left the loop; a step
    noted before is kept (e.g. the one the survivors of a lost rank agreed on:
    hpcdp.failure.lasting.RankLossEnds)."""
    if step_of(e) is not None:
        return
    try:
        e._hpcdp_step = int(step)
    except (AttributeError, TypeError):
        pass


def step_of(e: BaseException):
    return getattr(e, "_hpcdp_step", None)


def _world():
    """(rank, size) of COMM_WORLD if MPI is running, else (0, 1)."""
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized():
        return mpi.COMM_WORLD.Get_rank(), mpi.COMM_WORLD.Get_size()
    return 0, 1


def _clear(e: BaseException) -> bool:
    """Does the message say everything (no traceback needed)?"""
    from .nonfinite import NonFiniteError

    known = USER_ERRORS + (NonFiniteError, KeyboardInterrupt)
    comm_errors = sys.modules.get("hpcdp.comm.core.errors")
    if comm_errors is not None:
        known += (comm_errors.CommError,)
    return isinstance(e, known)


def describe(e: BaseException) -> str:
    """What went wrong, in words (the part of the line after "rank R of N at step S: ")."""
    if isinstance(e, SystemExit):
        return (f"the rank exited (sys.exit({e.code!r})) before the run finished; "
                "the other ranks would wait for it")
    if isinstance(e, Interrupted):
        return str(e)
    if isinstance(e, KeyboardInterrupt):
        return "interrupted (KeyboardInterrupt)"
    if _clear(e) and not isinstance(e, MemoryError):
        return str(e) or type(e).__name__  # the message says it all (timeouts, non-finite...)
    return cause(e)


def _exit_status(e: BaseException, size: int) -> int:
    if isinstance(e, Interrupted) or isinstance(getattr(e, "exit_status", None), int):
        return e.exit_status  # e.g. a save that failed during the run: 1, not bad input
    if isinstance(e, KeyboardInterrupt):
        return 130
    if size == 1 and isinstance(e, USER_ERRORS):
        return USAGE_ERROR
    return FAILED


def reporter(e: BaseException):
    """The rank that reports a collective timeout the diagnosis ran on several ranks
    (the lowest that answered it: every one of them holds the same missing ranks), or
    None for any other failure (each failing rank reports its own)."""
    arrived = getattr(e, "arrived", None)
    return min(arrived) if arrived else None


def print_cause(e: BaseException) -> None:
    """This rank's traceback of ``e`` when its message does not say everything (a bug),
    or always with ``HPCDP_TRACEBACK=1``."""
    if os.environ.get("HPCDP_TRACEBACK") or not _clear(e):
        traceback.print_exception(e)


def failure_line(e: BaseException) -> tuple[str, int]:
    """The one line that reports ``e`` on this rank (``hpcdp: error: rank R of N at step S:
    ...``) and the job's exit status. An error that carries its ``line`` (the agreed end
    of a continue-mode job, hpcdp.failure.ulfm.Ending: the line of the rank that failed)
    and ``exit_status`` gives those."""
    rank, size = _world()
    if isinstance(getattr(e, "line", None), str):
        return e.line, _exit_status(e, size)
    step = step_of(e)
    where = f"rank {rank} of {size}" if size > 1 else ""
    if step is not None:
        where += (" " if where else "") + f"at step {step}"
    return f"hpcdp: error: {where + ': ' if where else ''}{describe(e)}", _exit_status(e, size)


def report_failure(e: BaseException) -> int:
    """Print this rank's failure once; with several ranks, end the job (MPI_Abort).
    Returns the exit status (one rank only: MPI_Abort does not return).

    A collective timeout that several ranks diagnosed together is one failure: the
    lowest rank that answered the diagnosis prints it and aborts; the others wait
    REPORTER_GRACE_S for that abort to end them and only then print and abort
    themselves (so a lost node gives one line, and a reporter that died still
    leaves a line and an end).

    A failure that every live rank holds on a communicator of exactly them (``ending_comm``:
    the survivors of a lost rank that cannot train on, under ULFM, where MPI_Abort ends
    only the calling rank; or every live rank after one failed in continue mode) ends them
    together: that communicator's rank 0 (or its ``ending_reporter``) prints the line and
    every rank exits with the status (hpcdp.failure.ranks.end_together). A rank left alone
    on it (every peer lost, as a node whose link was cut sees it) says why and aborts as
    before, so the job's status stays the one of the ranks that went on."""
    rank, size = _world()
    together = getattr(e, "ending_comm", None) if size > 1 else None
    if together is not None and together.Get_size() < 2:
        # alone: every peer looks lost, as on the far side of a cut link; the abort ends
        # this rank only and leaves the launcher's status to the ranks that went on
        together = None
    first = reporter(e)
    if together is None and size > 1 and first is not None and first != rank:
        time.sleep(REPORTER_GRACE_S)
    print_cause(e)
    line, status = failure_line(e)
    if together is not None:  # every live rank holds it (RankLossEnds, ulfm.Ending): one line
        end_together(together, line, status, reporter=getattr(e, "ending_reporter", 0))
    say(line)
    if size > 1:
        abort_job(status)
    return status


def report_agreed(e: JobError) -> int:
    """Every rank holds the same error: rank 0 prints it; all exit with status 2."""
    rank, _ = _world()
    if os.environ.get("HPCDP_TRACEBACK"):
        traceback.print_exception(e)
    elif e.__cause__ is not None and not isinstance(e.__cause__, USER_ERRORS):
        traceback.print_exception(e.__cause__)  # a bug on this rank: its traceback, once
    if rank == 0:
        say(f"hpcdp: error: {e}")
    return USAGE_ERROR


def run_job(fn) -> int:
    """Run ``fn()`` (the whole command) under the policy above; returns the exit status."""
    with handling_signals():
        try:
            fn()
            status = 0
        except JobError as e:
            status = report_agreed(e)  # every rank holds it: all of them end here together
        except BaseException as e:  # noqa: BLE001 - every way out of a run is reported
            if isinstance(e, SystemExit) and _world()[1] == 1:
                raise
            return report_failure(e)
        try:
            finish()  # every rank got here (or the ones that did not are named), then MPI_Finalize
        except BaseException as e:  # noqa: BLE001
            return report_failure(e)
        return status


__all__ = ["run_job", "report_failure", "failure_line", "print_cause", "describe", "report_agreed",
           "note_step", "step_of", "reporter"]
