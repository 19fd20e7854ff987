"""One writing job per checkpoint folder: a lock file naming the job, host and pid.

Two jobs saving into the same ``checkpoint.dir`` would race on the same
``step-*`` names (HDF5 refuses the second writer's file with a raw lock error at its
first save, or worse, one job's ``keep`` prunes the other's checkpoints). So rank 0
of a job that saves into an explicit ``checkpoint.dir`` takes
``<dir>/.hpcdp-writer.lock`` before anything else (data, run directory), created
atomically (``O_CREAT | O_EXCL``), holding one line::

    job <name> slurm <SLURM_JOB_ID or -> host <hostname> pid <pid> start <ticks> boot <boot id>

A lock already there is **stale**, and taken over, when its holder is gone:

- same host (and same boot): no process ``pid`` with that start time (``/proc``);
- the same Slurm job id as ours: an earlier attempt of this job (a requeue), gone;
- another host: its heartbeat (the file's mtime, touched every ``HEARTBEAT_S`` by a
  thread of the holder) is older than ``STALE_S``.

Otherwise the job refuses to start, with one line naming the holder and what to do.
The lock is removed when the run ends (also on failure); a killed job leaves it,
and the next job recognises it as stale by the rules above.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from pathlib import Path

from .errors import CheckpointError

LOCK_FILE = ".hpcdp-writer.lock"
HEARTBEAT_S = 60.0
STALE_S = 900.0  # a holder on another host silent this long is gone


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return "-"


def _start_ticks(pid: int) -> str:
    """The process's start time in clock ticks since boot (``/proc/<pid>/stat`` field
    22), so that a reused pid is not taken for the holder; "-" if unknown."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return "-"
    return stat.rpartition(")")[2].split()[19]


def _alive(pid: int, start: str) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # someone else's process: it exists
    return start in ("-", _start_ticks(pid))


def holder_line(job: str) -> str:
    pid = os.getpid()
    return (f"job {job} slurm {os.environ.get('SLURM_JOB_ID') or '-'} host {socket.gethostname()} "
            f"pid {pid} start {_start_ticks(pid)} boot {_boot_id()}\n")


def parse(line: str) -> dict:
    words = line.split()
    return dict(zip(words[0::2], words[1::2]))


def stale_reason(holder: dict, age_s: float) -> str | None:
    """Why the lock of ``holder`` (a :func:`parse`\\ d line) is stale, or None if its
    job may still be writing."""
    me = parse(holder_line("-"))
    if holder.get("host") == me["host"] and holder.get("boot") == me["boot"]:
        pid = int(holder.get("pid", "0") or 0)
        if pid == os.getpid():
            return "it is this process's own"
        if pid <= 0 or not _alive(pid, holder.get("start", "-")):
            return f"process {pid} on this host has ended"
        return None
    if holder.get("host") == me["host"]:
        return "the host has rebooted since"
    if me["slurm"] != "-" and holder.get("slurm") == me["slurm"]:
        return f"it is an earlier attempt of this Slurm job ({me['slurm']})"
    if age_s > STALE_S:
        return f"its heartbeat stopped {age_s / 60:.0f} min ago"
    return None


class DirLock:
    """The lock of one checkpoint folder, held by this process (rank 0)."""

    def __init__(self, path: Path, took_over: str | None):
        self.path, self.took_over = path, took_over
        self._stop = threading.Event()
        self._beat = threading.Thread(target=self._heartbeat, name="hpcdp-ckpt-lock", daemon=True)
        self._beat.start()

    def _heartbeat(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            try:
                os.utime(self.path)
            except OSError:
                return

    def release(self) -> None:
        """Remove the lock (idempotent; only if it is still ours)."""
        if self._stop.is_set():
            return
        self._stop.set()
        try:
            if parse(self.path.read_text()).get("pid") == str(os.getpid()):
                self.path.unlink()
        except OSError:
            pass


def acquire(root, job: str) -> DirLock:
    """Take the writer lock of checkpoint folder ``root`` for ``job`` (creating the
    folder), or raise one CheckpointError naming the live holder."""
    root = Path(root)
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise CheckpointError(f"checkpoint.dir = {str(root)!r}: cannot create it ({e.strerror})") from None
    path = root / LOCK_FILE
    took_over = None
    for _ in range(3):  # another job may take or drop it between our steps
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            try:
                text, age = path.read_text(), time.time() - path.stat().st_mtime
            except FileNotFoundError:
                continue
            holder = parse(text)
            reason = stale_reason(holder, age)
            if reason is None:
                raise CheckpointError(
                    f"checkpoint.dir = {str(root)!r} is in use by another job (job {holder.get('job', '?')}, "
                    f"host {holder.get('host', '?')}, pid {holder.get('pid', '?')}"
                    + (f", Slurm job {holder['slurm']}" if holder.get("slurm", "-") != "-" else "")
                    + f"): two jobs saving into one folder would overwrite each other's step-* checkpoints; "
                    f"give this job its own --set checkpoint.dir=..., or wait for that job to end (if it is "
                    f"gone, remove {path})")
            took_over = f"{text.strip()} ({reason})"
            try:
                path.unlink()
            except FileNotFoundError:
                pass
            continue
        except OSError as e:  # a folder this job cannot write (read-only, no permission)
            raise CheckpointError(f"checkpoint.dir = {str(root)!r}: cannot write in it ({e.strerror}): the "
                                  "run's checkpoints are saved there; choose a folder this job can "
                                  "write") from None
        with os.fdopen(fd, "w") as f:
            f.write(holder_line(job))
        return DirLock(path, took_over)
    raise CheckpointError(f"checkpoint.dir = {str(root)!r}: could not take its lock {path} (other jobs keep "
                          "taking it); give this job its own checkpoint.dir")


__all__ = ["LOCK_FILE", "DirLock", "acquire", "stale_reason", "holder_line", "parse", "STALE_S",
           "HEARTBEAT_S"]
