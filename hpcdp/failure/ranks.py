"""How failure messages write sets of ranks, how they are printed, and how a rank ends
the job once it has said why (MPI only there, imported when called)."""

from __future__ import annotations

import contextlib
import os

ABORT_S = 10.0  # MPI_Abort has this long to end the job before this rank ends itself
TOGETHER_S = 5.0  # end_together: how long a rank waits to hear that the reporter has said why


def fmt_ranks(ranks) -> str:
    """``[3]`` -> "rank 3"; ``[0, 1, 2, 5]`` -> "ranks 0-2, 5"."""
    ranks = sorted(set(int(r) for r in ranks))
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    parts, start = [], None
    for i, r in enumerate(ranks):
        if start is None:
            start = r
        if i + 1 == len(ranks) or ranks[i + 1] != r + 1:
            parts.append(str(start) if start == r else f"{start}-{r}")
            start = None
    return "ranks " + ", ".join(parts)


def say(line: str) -> None:
    """Write one line to stderr in ONE write call, flushed: lines of ranks that share a
    launcher's output stream stay whole (print() writes the newline separately, which
    interleaves when stderr is unbuffered)."""
    import sys
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


def drain_output(limit: float = 2.0) -> None:
    """Wait (up to ``limit`` seconds) until the launcher has read what this rank wrote to
    stdout and stderr. Called just before ``MPI_Abort`` or a forced exit: the launcher
    (hydra, srun) kills every rank on an abort and can drop lines still in the pipe, so
    without this the one line saying why the job failed was sometimes lost under load.
    Pipes: the bytes not yet read (``FIONREAD``); sockets: not yet sent (``TIOCOUTQ``);
    files and terminals: nothing to wait for."""
    import array
    import fcntl
    import stat
    import sys
    import termios
    import time

    deadline = time.monotonic() + limit
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
            fd = stream.fileno()
            mode = os.fstat(fd).st_mode
        except (OSError, ValueError, AttributeError):
            continue
        req = termios.FIONREAD if stat.S_ISFIFO(mode) else termios.TIOCOUTQ if stat.S_ISSOCK(mode) else None
        if req is None:
            continue
        left = array.array("i", [0])
        while time.monotonic() < deadline:
            try:
                fcntl.ioctl(fd, req, left)
            except OSError:
                break
            if left[0] <= 0:
                break
            time.sleep(0.005)


@contextlib.contextmanager
def exit_unless_done(limit: float, message: str, status: int, *, end_job: bool = False):
    """Bound a blocking C call: if the block has not finished after ``limit`` seconds, a
    timer thread prints ``message``, drains the output and ends this process with
    ``status`` (``os._exit``: no exit handlers, no MPI_Finalize that could hang too).
    ``end_job``: first ask the launcher to end every rank (:func:`abort_from_timer`),
    for a call after which the launcher may not count this rank's exit as a failure.
    The call must release the GIL (a ctypes call does) for the timer to run."""
    import threading

    def give_up():
        say(message)
        drain_output()
        if end_job:
            abort_from_timer(status)
        os._exit(status)

    timer = threading.Timer(limit, give_up)
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()


def c_function(name: str):
    """The C function ``name`` of the MPI library mpi4py was built for (ctypes releases
    the GIL during the call; mpi4py's Abort and Finalize hold it), or None."""
    import ctypes
    import sys

    mpi = sys.modules.get("mpi4py.MPI")
    try:
        return getattr(ctypes.CDLL(mpi.__file__), name)
    except (OSError, AttributeError, TypeError):
        return None


def abort_from_timer(status: int) -> None:
    """From a timer thread while the main thread is stuck inside MPI (MPI_Finalize): ask
    the launcher to end every rank (the C ``MPI_Abort``: MPICH sends its PMI abort) and
    end this process. Hydra ends the others when a rank's exit breaks its PMI connection,
    but not when the rank got past its PMI finalize: then a rank stuck outside MPI would
    hold the job until the launcher's own limit. If the abort does not end this process
    within ``ABORT_S`` seconds (the call can wait on the stuck main thread), it ends
    itself with ``status``."""
    import ctypes
    import threading

    from mpi4py import MPI

    fallback = threading.Timer(ABORT_S, os._exit, args=(status,))
    fallback.daemon = True
    fallback.start()
    # this rank has said why (and drained it); what MPI says of an abort from inside its
    # finalize ("Invalid communicator": the abort still ends the job) is noise
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    c_abort = c_function("MPI_Abort")
    handle = getattr(MPI.COMM_WORLD, "handle", None)
    if c_abort is not None and handle is not None:
        comm_t = ctypes.c_int if MPI._sizeof(MPI.Comm) == ctypes.sizeof(ctypes.c_int) else ctypes.c_void_p
        c_abort(comm_t(handle), ctypes.c_int(status))
    os._exit(status)


def abort_job(status: int) -> None:
    """End every rank of the job (``MPI_Abort`` on COMM_WORLD) once the launcher has
    read what this rank printed (:func:`drain_output`). Does not return.

    MPICH's MPI_Abort only asks the launcher (through its PMI connection) to end the job:
    it may return before the launcher's kill arrives, and a rank whose node has lost its
    link to mpiexec then waits forever (returning would exit through MPI_Finalize, which
    blocks reading the same connection). So this rank waits for the kill under
    :func:`exit_unless_done`: after ``ABORT_S`` seconds it ends itself with ``status``
    (``os._exit``); the launcher, or the node's cleanup, ends the rest."""
    import ctypes
    import time

    from mpi4py import MPI

    drain_output()
    rank = MPI.COMM_WORLD.Get_rank()
    c_abort = c_function("MPI_Abort")
    handle = getattr(MPI.COMM_WORLD, "handle", None)
    with exit_unless_done(ABORT_S, f"hpcdp: error: rank {rank}: MPI_Abort did not end the job within "
                          f"{ABORT_S:g}s (the launcher cannot be reached from this rank's node: a "
                          f"lost link or node); ending this rank with status {status}", status):
        if c_abort is not None and handle is not None:
            comm_t = ctypes.c_int if MPI._sizeof(MPI.Comm) == ctypes.sizeof(ctypes.c_int) else ctypes.c_void_p
            c_abort(comm_t(handle), ctypes.c_int(status))  # releases the GIL: the timer can run
        else:
            MPI.COMM_WORLD.Abort(status)
        while True:  # asked; the launcher's kill (or the timer) ends this process
            time.sleep(1.0)


def end_together(comm, line: str, status: int, limit: float = TOGETHER_S, reporter: int = 0) -> None:
    """End this rank with ``status`` (``os._exit``) together with every other rank of
    ``comm``, which all hold the same failure and are the job's only live ranks (the
    survivors of a lost rank that cannot train on: hpcdp.failure.lasting.RankLossEnds; or
    every rank, after one failed in continue mode: hpcdp.failure.ulfm.Ending).
    ``comm``'s rank ``reporter`` (default 0) prints ``line`` and drains it; then a
    barrier on ``comm`` (polled, up to ``limit`` seconds) and every rank exits: one line,
    every rank gone, the launcher's status ``status``. A rank whose barrier fails or does not complete (the
    reporter was lost too) prints ``line`` itself first. Does not return.

    Why not MPI_Abort: ``mpirun --with-ft ulfm`` runs the job as recoverable, and Open
    MPI's runtime (PRRTE) then treats a rank that calls MPI_Abort as one more lost rank:
    it ends that rank alone (measured with 6 ranks, Open MPI 5.0.11: the other ranks ran on,
    and their MPI_Finalize then never returned)."""
    import time

    from mpi4py import MPI

    reports = comm.Get_rank() == reporter
    if reports:
        say(line)
        drain_output()
    heard = False
    try:
        req = comm.Ibarrier()
        deadline = time.monotonic() + limit
        while not (heard := req.Test()) and time.monotonic() < deadline:
            time.sleep(0.001)
    except MPI.Exception:
        pass  # a rank of ``comm`` was lost as well
    if not (heard or reports):
        say(line)
        drain_output()
    os._exit(status)
