"""How failure messages write sets of ranks, how they are printed, and how a rank ends
the job once it has said why (MPI only there, imported when called)."""

from __future__ import annotations

import os


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


def abort_job(status: int) -> None:
    """End every rank of the job (``MPI_Abort`` on COMM_WORLD) once the launcher has
    read what this rank printed (:func:`drain_output`). Does not return."""
    from mpi4py import MPI

    drain_output()
    MPI.COMM_WORLD.Abort(status)
