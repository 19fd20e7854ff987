"""A rank killed outright is named: ``rank 1 of 4 lost at step 57: ...``.

SIGKILL (the kernel's out-of-memory killer, ``kill -9``, a node's cleanup) ends a
process without running any of its code, and the launcher (hydra, srun) kills every
other rank of the job at once, so neither the rank nor its peers can say what
happened: the job ended with the launcher's block (``BAD TERMINATION ... EXIT CODE:
9``) and nothing from hpcdp. So ``hpcdp train`` under a launcher with several ranks
runs as two processes per rank (:func:`watch`, called by the ``hpcdp`` command before
anything is imported): the process the launcher started forks the rank's real process
and only waits for it. The rank writes its current step into a 16-byte shared page
(:func:`note_step`, from the training loop's per-step checks). When the rank exits,
the watcher exits with its status; when a signal kills it, the watcher prints one line
naming the rank, the step and the signal, and then ends itself by the same signal, so
the launcher sees what it saw before and ends the other ranks (with
``failure.on_rank_loss = "continue"`` the line says the others go on instead:
:func:`note_survivors_go_on`).

- The watcher forwards the signals a launcher or a user sends to the rank's pid
  (SIGINT, SIGTERM, SIGUSR1, SIGUSR2, SIGHUP) to the rank.
- The rank dies with its watcher (``PR_SET_PDEATHSIG``): when the launcher kills the
  job (another rank's ``MPI_Abort``), it kills the watchers, and the ranks follow
  without a line (they were not lost: the failing rank has said why).
- ``HPCDP_WATCH=0`` runs the rank as one process (no line for a killed rank).

Cost: one fork at start, a sleeping process of about 10 MiB per rank, an 8-byte store
per step.
"""

from __future__ import annotations

import os
import signal
import struct
import sys

ENV = "HPCDP_WATCH"
FORWARD = ("SIGINT", "SIGTERM", "SIGUSR1", "SIGUSR2", "SIGHUP")
_cell = None  # the shared page (in the rank's process), or None


def note_step(step: int) -> None:
    """The rank is at ``step`` (the watcher names it if the rank is killed)."""
    if _cell is not None:
        struct.pack_into("q", _cell, 0, int(step))


def note_survivors_go_on() -> None:
    """This job repairs around a lost rank (``failure.on_rank_loss = "continue"``): the
    watcher's line then says the survivors go on, not that the launcher ends them."""
    if _cell is not None:
        struct.pack_into("q", _cell, 8, 1)


def job_pid() -> int:
    """The watcher's pid in a watched rank (it outlives the rank's process by nothing:
    what a lock holder should record), else this process's."""
    return os.getppid() if _cell is not None else os.getpid()


def enabled() -> bool:
    """A watcher for this rank: not under Slurm (``SLURM_PROCID`` set: srun, or hydra's
    proxies that srun started), whose own lines name a killed task. (The garbled PMI
    requests once blamed on the second process were Slurm's pmi2 plugin cutting a PMI-1
    request at 1024 bytes: tests/slurm/test_slurm_pmi.py.)"""
    return os.environ.get(ENV, "1") != "0" and hasattr(os, "fork") and "SLURM_PROCID" not in os.environ


def _die_with_parent(parent: int) -> None:
    import ctypes
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # the watcher died before prctl took effect
        os._exit(1)


def lost_line(rank: int, size: int, step: int, sig: int, survivors_go_on: bool = False) -> str:
    name = signal.Signals(sig).name if sig in signal.Signals._value2member_map_ else f"signal {sig}"
    when = f"at step {step}" if step > 0 else "before its first step"
    why = ("the kernel's out-of-memory killer (see dmesg), a kill -9 or a cleanup of its node"
           if sig == signal.SIGKILL else "a crash or a signal sent to it")
    if survivors_go_on:  # not the job's error: the survivors repair and say so
        return (f"hpcdp: rank {rank} of {size} lost {when}: its process was killed by {name} ({why}); "
                f'the other ranks repair the job and go on (failure.on_rank_loss = "continue")')
    return (f"hpcdp: error: rank {rank} of {size} lost {when}: its process was killed by {name} ({why}); "
            f"the launcher ends the other ranks")


def watch(rank: int, size: int) -> None:
    """Fork the rank's process. Returns in the rank (which then runs the command);
    in the watcher, waits for the rank and exits as it did (never returns)."""
    import mmap

    cell = mmap.mmap(-1, 16)  # the step, the continue flag; MAP_SHARED | MAP_ANONYMOUS: both processes see it
    parent = os.getpid()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        global _cell
        _cell = cell
        _die_with_parent(parent)
        return
    for name in FORWARD:
        sig = getattr(signal, name, None)
        if sig is not None:
            signal.signal(sig, lambda s, _f: _forward(pid, s))
    while True:
        try:
            _, status = os.waitpid(pid, 0)
            break
        except ChildProcessError:
            os._exit(1)
        except InterruptedError:
            continue
    if os.WIFEXITED(status):
        os._exit(os.WEXITSTATUS(status))
    sig = os.WTERMSIG(status)
    from .ranks import drain_output, say
    step, go_on = struct.unpack_from("qq", cell, 0)
    say(lost_line(rank, size, step, sig, survivors_go_on=bool(go_on)))
    drain_output()
    for name in FORWARD:
        if getattr(signal, name, None) is not None:
            signal.signal(getattr(signal, name), signal.SIG_DFL)
    try:
        signal.signal(sig, signal.SIG_DFL)
    except (OSError, ValueError):  # SIGKILL / SIGSTOP cannot be set (and need not be)
        pass
    os.kill(os.getpid(), sig)  # the launcher sees the rank's own end
    os._exit(128 + sig)


def _forward(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


__all__ = ["watch", "note_step", "note_survivors_go_on", "job_pid", "enabled", "lost_line", "ENV"]
