"""One writing job per checkpoint folder: a lock file naming the job, and a keeper.

Two jobs saving into one folder would replace each other's ``step-*`` checkpoints
and prune each other's. So rank 0 of every job that saves checkpoints takes
``<dir>/.hpcdp-writer.lock`` before anything else (the explicit ``checkpoint.dir``
before data and run directory; ``<run dir>/checkpoints`` as the run directory is
made), holding one line::

    job <name> slurm <id|-> restart <n> host <hostname> pid <pid> start <ticks> boot <boot id> token <hex>

**Atomic.** The line is written to a private file first and linked to the lock's
name (``link`` fails if the name exists: NFS and Lustre make it atomic), so a lock is
never seen empty. A lock judged stale is replaced, never unlinked: the one process
that creates ``<lock>.takeover-<token>`` (``O_EXCL``) may replace the lock holding
``token`` (``rename`` over it, after reading it again), so two restarts of a crashed
job cannot both take it, and nobody removes a lock someone else just made.

**The keeper.** A small process of its own session (``python -m hpcdp.io.lock``)
holds an ``flock`` on the lock for the job's life, touches it every ``HEARTBEAT_S``,
and removes it when rank 0 ends by any path (its pipe from rank 0 closes): an
exception on any rank, ``MPI_Abort``, SIGKILL or SIGINT of any rank (the launcher then
ends rank 0). Only a lost node (or a killed keeper) leaves the lock behind, and the
next job recognises it as stale:

- a live ``flock`` on it (a holder anywhere, where the file system shares flocks) means
  the holder lives: refused, whatever else the line says;
- same host (and same boot): no process ``pid`` with that start time (``/proc``);
- the same Slurm job id, an earlier restart (``SLURM_RESTART_COUNT``): a requeue;
- another host: its heartbeat (the lock's mtime) did not change for ``WATCH_S`` (the
  job watches it that long), or is older than ``STALE_S`` by this host's clock;
- a line hpcdp did not write (empty, garbled) older than ``EMPTY_S``.

Otherwise the job refuses to start, with one line naming the holder and what to do.
A holder whose lock was taken over (its heartbeat stalled) finds out at its next save
(:func:`check_held`) and stops instead of writing.
"""

from __future__ import annotations

import os
import select
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path


LOCK_FILE = ".hpcdp-writer.lock"
HEARTBEAT_S = 10.0  # the keeper touches the lock this often
WATCH_S = 30.0  # a lock of another host untouched this long (watched) is stale
STALE_S = 900.0  # ... or older than this by our clock (no watching)
EMPTY_S = 5.0  # a lock hpcdp did not write (empty, garbled) older than this is stale
STUCK_S = 60.0  # a takeover claim older than this: its maker died mid-takeover
_HELD: dict[str, "DirLock"] = {}  # folder -> this process's lock of it


def _error(message: str):
    from .errors import CheckpointError  # imported here: the keeper starts without NumPy
    return CheckpointError(message)


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


def _job_pid() -> int:
    """The pid that lives exactly as long as this rank: its watcher's where it has one
    (hpcdp.failure.watch; the launcher reaps it before it exits, while the rank's own
    process may still be dying when the next job starts), else this process's."""
    from hpcdp.failure.watch import job_pid
    return job_pid()


def holder_line(job: str, token: str = "-") -> str:
    pid = _job_pid()
    return (f"job {job} slurm {os.environ.get('SLURM_JOB_ID') or '-'} "
            f"restart {os.environ.get('SLURM_RESTART_COUNT') or '0'} host {socket.gethostname()} "
            f"pid {pid} start {_start_ticks(pid)} boot {_boot_id()} token {token}\n")


def parse(line: str) -> dict:
    words = line.split()
    return dict(zip(words[0::2], words[1::2]))


def _read(path: Path) -> tuple[str, os.stat_result] | None:
    """The lock's text and status, opened afresh (an NFS client revalidates on open);
    None if there is none."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        st = os.fstat(fd)
        data = os.read(fd, 4096)
    finally:
        os.close(fd)
    return data.decode("utf-8", "replace"), st


def _key(text: str, st) -> str:
    """What names this lock among all locks ever made: its token (an older or a
    damaged lock: its inode)."""
    token = parse(text).get("token", "-")
    return token if len(token) >= 16 and token.isalnum() else f"ino{st.st_ino}"


def _flocked(path: Path) -> bool:
    """True if a process (on any host whose file system shares flocks) holds an flock
    on the lock: its holder lives. False where that cannot be told."""
    import fcntl
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return False  # no flocks here (ENOLCK...): the line decides
    finally:
        os.close(fd)  # drops our shared flock too
    return False


def _say(line: str) -> None:
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


def stale_reason(holder: dict, age_s: float, path: Path | None = None, watch_s: float | None = None) -> str | None:
    """Why the lock of ``holder`` (a :func:`parse`\\ d line, last touched ``age_s``
    ago) is stale, or None if its job may still be writing. A lock of another host
    (``path`` given) is watched up to ``watch_s`` (default ``WATCH_S``) seconds."""
    me = parse(holder_line("-"))
    if "host" not in holder or "pid" not in holder:
        return (f"it holds no line hpcdp writes (written {age_s:.0f} s ago)" if age_s > EMPTY_S else None)
    if holder.get("host") == me["host"] and holder.get("boot") == me["boot"]:
        pid = int(holder.get("pid", "0") or 0) if holder.get("pid", "").isdigit() else 0
        if pid == _job_pid():
            return "it is this process's own"
        if pid <= 0 or not _alive(pid, holder.get("start", "-")):
            return f"process {pid} on this host has ended"
        return None
    if holder.get("host") == me["host"]:
        return "the host has rebooted since"
    if me["slurm"] != "-" and holder.get("slurm") == me["slurm"]:
        theirs = holder.get("restart", "0")
        if not theirs.isdigit() or int(theirs) < int(me["restart"]):
            return f"it is an earlier attempt of this Slurm job ({me['slurm']}, restart {theirs})"
    if age_s > STALE_S:
        return f"its heartbeat stopped {age_s / 60:.0f} min ago"
    if path is None:
        return None
    watch_s = WATCH_S if watch_s is None else watch_s
    first = _read(path)
    if first is None:
        return None  # gone meanwhile: take it afresh
    _say(f"hpcdp: {path}: held by job {holder.get('job', '?')} on host {holder.get('host')}, pid "
         f"{holder.get('pid')}; watching its heartbeat for up to {watch_s:.0f} s")
    deadline = time.monotonic() + watch_s
    while time.monotonic() < deadline:
        time.sleep(min(1.0, watch_s / 10))
        now = _read(path)
        if now is None or now[1].st_mtime_ns != first[1].st_mtime_ns or _key(*now) != _key(*first):
            return None  # alive (or replaced): judge it again
    return f"its heartbeat stopped (not touched for {watch_s:.0f} s)"


def _claim(path: Path, key: str) -> Path | None:
    """The right to replace the lock named ``key``: the claim file, or None if another
    process holds it (a claim older than ``STUCK_S`` is removed: its maker died)."""
    claim = path.with_name(f"{LOCK_FILE}.takeover-{key}")
    try:
        os.close(os.open(claim, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
        return claim
    except FileExistsError:
        try:
            if time.time() - claim.stat().st_mtime > STUCK_S:
                claim.unlink()
        except OSError:
            pass
        return None


def _private(root: Path, line: str) -> Path:
    tmp = root / f"{LOCK_FILE}.new-{uuid.uuid4().hex}"
    with open(tmp, "w") as f:
        f.write(line)
        f.flush()
        os.fsync(f.fileno())
    return tmp


def _place(tmp: Path, path: Path) -> bool:
    """Make ``tmp`` the lock if there is none (atomic); False if there is one."""
    try:
        os.link(tmp, path)
        return True
    except FileExistsError:
        # over NFS a retransmitted link() can report EEXIST for its own success: our
        # private file then has two names (the check open(2)'s O_EXCL note advises)
        try:
            return os.stat(tmp).st_nlink == 2
        except OSError:
            return False
    except OSError:  # no hard links here: O_EXCL, then the line (a moment empty: EMPTY_S)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            return False
        with os.fdopen(fd, "w") as f:
            f.write(tmp.read_text())
        return True


def _take_over(path: Path, key: str, tmp: Path) -> bool:
    """Replace the lock named ``key`` by ``tmp``, if this process wins its claim and
    the lock is still that one. False: judge again."""
    claim = _claim(path, key)
    if claim is None:
        time.sleep(0.05)  # another process is taking it over: see what it did
        return False
    try:
        now = _read(path)
        if now is None or _key(*now) != key:
            return False  # released or replaced meanwhile
        os.rename(tmp, path)
        return True
    finally:
        try:
            claim.unlink()
        except OSError:
            pass


def _refusal(root: Path, path: Path, holder: dict):
    return _error(
        f"checkpoint.dir = {str(root)!r} is in use by another job (job {holder.get('job', '?')}, "
        f"host {holder.get('host', '?')}, pid {holder.get('pid', '?')}"
        + (f", Slurm job {holder['slurm']}" if holder.get("slurm", "-") != "-" else "")
        + f"): two jobs saving into one folder would overwrite each other's step-* checkpoints; "
        f"give this job its own --set checkpoint.dir=..., or wait for that job to end (if it is "
        f"gone, remove {path})")


def release_lock(path, token: str) -> bool:
    """Remove the lock at ``path`` if it is still the one named ``token`` (under the
    takeover claim, so nobody's new lock is removed). True if removed."""
    path = Path(path)
    claim = _claim(path, token)
    if claim is None:
        return False  # someone is taking it over: it is theirs
    try:
        now = _read(path)
        if now is not None and _key(*now) == token:
            path.unlink()
            return True
        return False
    finally:
        try:
            claim.unlink()
        except OSError:
            pass


class DirLock:
    """The lock of one checkpoint folder, held by this process (rank 0) and kept by
    its keeper process."""

    def __init__(self, root: Path, path: Path, token: str, took_over: str | None, keeper=True):
        self.root, self.path, self.token, self.took_over = root, path, token, took_over
        self.released = False
        self._keeper = None
        if keeper:
            try:
                self._keeper = subprocess.Popen(
                    [sys.executable, "-m", "hpcdp.io.lock", str(path), token], stdin=subprocess.PIPE,
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
            except OSError:
                self._keeper = None  # no keeper: the lock is removed by release() only
        _HELD[str(root.resolve())] = self

    def held(self) -> bool:
        now = _read(self.path)
        return now is not None and _key(*now) == self.token

    def release(self) -> None:
        """Remove the lock (idempotent; only if it is still ours) and end the keeper."""
        if self.released:
            return
        self.released = True
        _HELD.pop(str(self.root.resolve()), None)
        try:
            release_lock(self.path, self.token)
        except OSError:
            pass
        if self._keeper is not None:
            try:
                self._keeper.stdin.write(b"released\n")  # then EOF: the keeper ends, touching nothing
                self._keeper.stdin.close()
                self._keeper.wait(timeout=2)
            except (OSError, subprocess.TimeoutExpired):
                pass  # it ends by itself as soon as it reads the pipe
            self._keeper = None


def check_held(root) -> None:
    """Before a save commits into ``root``: if this process took the folder's lock, it
    must still be its own (else a job that judged our heartbeat stopped has taken the
    folder over, and this job must not write into it)."""
    lock = _HELD.get(str(Path(root).resolve()))
    if lock is None or lock.held():
        return
    now = _read(lock.path)
    who = parse(now[0]) if now else {}
    raise _error(
        f"checkpoint.dir = {str(lock.root)!r}: this job's lock was taken over"
        + (f" by job {who.get('job', '?')} (host {who.get('host', '?')}, pid {who.get('pid', '?')})" if who else
           " (it is gone)")
        + "; this job stops without saving so that the two do not overwrite each other's checkpoints "
        "(was its heartbeat stopped, e.g. the job suspended?); resume from the folder's newest checkpoint "
        "once that job has ended")


def acquire(root, job: str, *, keeper: bool = True) -> DirLock:
    """Take the writer lock of checkpoint folder ``root`` for ``job`` (creating the
    folder), or raise one CheckpointError naming the live holder."""
    root = Path(root)
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise _error(f"checkpoint.dir = {str(root)!r}: cannot create it ({e.strerror})") from None
    path = root / LOCK_FILE
    token = uuid.uuid4().hex
    try:
        tmp = _private(root, holder_line(job, token))
    except OSError as e:
        raise _error(f"checkpoint.dir = {str(root)!r}: cannot write in it ({e.strerror}): the run's "
                     "checkpoints are saved there; choose a folder this job can write") from None
    try:
        deadline = time.monotonic() + max(4 * STUCK_S, 2 * WATCH_S)
        while time.monotonic() < deadline:
            if _place(tmp, path):
                return DirLock(root, path, token, None, keeper)
            now = _read(path)
            if now is None:
                continue  # released meanwhile
            text, st = now
            holder = parse(text)
            if _flocked(path):
                raise _refusal(root, path, holder)
            reason = stale_reason(holder, time.time() - st.st_mtime, path)
            if reason is None:
                if "host" not in holder and time.time() - st.st_mtime <= EMPTY_S:
                    time.sleep(0.2)  # being written by an older hpcdp: look again
                    continue
                again = _read(path)
                if again is None or _key(*again) != _key(text, st):
                    continue  # released or replaced while we watched: judge again
                raise _refusal(root, path, holder)
            if _take_over(path, _key(text, st), tmp):
                return DirLock(root, path, token, f"{text.strip() or '(an empty lock file)'} ({reason})",
                               keeper)
        raise _error(f"checkpoint.dir = {str(root)!r}: could not take its lock {path} (other jobs keep "
                     "taking it); give this job its own checkpoint.dir")
    finally:
        try:
            tmp.unlink()
        except OSError:
            pass


def _keep(path: Path, token: str) -> None:
    """The keeper (its own session): flock the lock, touch it every ``HEARTBEAT_S``,
    remove it when the pipe from rank 0 closes (rank 0 ended, by any path)."""
    import fcntl
    fd = None
    try:
        fd = os.open(path, os.O_RDWR)
        for _ in range(50):  # a contender's shared probe lasts microseconds
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                time.sleep(0.02)
    except OSError:
        pass  # no flocks here: the heartbeat and the line tell
    while True:
        ready, _, _ = select.select([0], [], [], HEARTBEAT_S)
        if ready:
            if os.read(0, 64):
                return  # rank 0 released it: nothing more to do (our flock goes with us)
            break  # the pipe closed without a word: rank 0 ended some other way
        try:
            now = _read(path)
            if now is None or _key(*now) != token:
                break  # released or taken over: nothing to keep
            os.utime(path)
        except OSError:
            pass
    try:
        release_lock(path, token)
    except OSError:
        pass
    if fd is not None:
        os.close(fd)


__all__ = ["LOCK_FILE", "DirLock", "acquire", "stale_reason", "holder_line", "parse", "check_held",
           "release_lock", "STALE_S", "HEARTBEAT_S", "WATCH_S", "EMPTY_S"]


if __name__ == "__main__":
    _keep(Path(sys.argv[1]), sys.argv[2])
